# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's programs as modules for tests: lab/control (controllers, the stand-in device plugin, GFD,
NFD) through `load`, and a script such as lab/lab.py or lab/go/gobuild.py through `script`. In the
lab's image they sit in one folder with the module_utils they import by bare
name (kube, gpu_labels, nvml); SEARCH_PATH is that folder's content here, and this is the one place tests
put it on the import path."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import importlib
import importlib.util
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
SEARCH_PATH = [os.path.join(ROOT, 'lab', 'control'), os.path.join(ROOT, 'plugins', 'module_utils')]


def load(name):
    """lab/control/<name>.py, imported with the image's search path (restored afterwards)."""
    sys.path[:0] = SEARCH_PATH
    try:
        return importlib.import_module(name)
    finally:
        del sys.path[:len(SEARCH_PATH)]


def script(relative_path, name):
    """A program of the lab (a path under the repository root) loaded as module `name`; no import path changes."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, relative_path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def environment():
    """The environment of a child process that imports them as the image does (PYTHONPATH)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(SEARCH_PATH))
