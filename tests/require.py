# -*- coding: utf-8 -*-
"""What a test does when something it needs is missing, decided in one place.

`make test` (tools/test-env.sh) sets GPUREADY_REQUIRE_REAL=1: there a missing daemon, tool, library or
privilege fails the test, so CI cannot go green by skipping it. A hand run without that variable
skips. Tests never call pytest.skip or importorskip themselves (tests/unit/test_missing_means_failure.py).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import importlib
import os

import pytest


def missing(why, required=None):
    """Fail when required (default: GPUREADY_REQUIRE_REAL=1), else skip, saying why."""
    if required is None:
        required = os.environ.get("GPUREADY_REQUIRE_REAL") == "1"
    if required:
        pytest.fail("required under `make test`: %s" % why, pytrace=False)
    pytest.skip(why)


def module(name):
    """importlib.import_module(name), or missing() naming the import error."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        missing("cannot import %s: %s" % (name, exc))
        raise  # not reached: missing() always raises


def root():
    if os.geteuid() != 0:
        missing("needs root (uid 0), runs as uid %d" % os.geteuid())
