# -*- coding: utf-8 -*-
"""Shared by every test layer. pytest puts this folder on sys.path, so tests import the helpers
beside it (containerd_cases, playbook) by name."""

import os

from hypothesis import settings

# CI replays the same examples every run (a red CI must be reproducible); by hand they vary.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI") == "true":
    settings.load_profile("ci")
