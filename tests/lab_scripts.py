# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's programs as modules for tests: a script such as lab/lab.py or lab/go/gobuild.py, loaded from
its path without changing the import path."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import importlib.util
import os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')


def script(relative_path, name):
    """A program of the lab (a path under the repository root) loaded as module `name`."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, relative_path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
