# -*- coding: utf-8 -*-
"""Shared by every test layer. pytest puts this folder on sys.path, so tests import the helpers
beside it (containerd_cases, playbook) by name."""

import os

from hypothesis import settings

# Property tests take their example count from the profile: a small one inside `make test`, 1,500
# in `make soak` (GPUREADY_HYPOTHESIS_PROFILE=soak). CI replays the same examples every run (a red CI
# must be reproducible); by hand they vary.
settings.register_profile("test", max_examples=120, deadline=None)
settings.register_profile("ci", parent=settings.get_profile("test"), derandomize=True)
settings.register_profile("soak", max_examples=1500, deadline=None)
settings.load_profile(os.environ.get("GPUREADY_HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") == "true" else "test"))
