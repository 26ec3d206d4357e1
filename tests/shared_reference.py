# -*- coding: utf-8 -*-
"""Our copies of the case files in ../shared/reference must stay byte-identical to it."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import os

import require


def assert_same_as_shared(local_path, reference_name):
    """Fails in CI, where ../shared always lies beside the clone, when it is missing; elsewhere skips
    (tools/test-env.sh sets GPUREADY_SHARED_DIR only where it exists): a user's clone has our copy and
    nothing to compare it with."""
    shared = os.environ.get("GPUREADY_SHARED_DIR")
    if not shared:
        require.missing("../shared is not beside this checkout", required=os.environ.get("CI") == "true")
    with open(os.path.join(shared, "reference", reference_name), "rb") as theirs, open(local_path, "rb") as ours:
        assert hashlib.sha256(theirs.read()).hexdigest() == hashlib.sha256(ours.read()).hexdigest()
