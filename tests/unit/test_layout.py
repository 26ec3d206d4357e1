# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where tests live and how they import: tests/unit/module_utils mirrors plugins/module_utils (one test
file per file), tests import helpers only from tests/ by name, and none touches the import path (the lab's
programs load from their paths: tests/lab_scripts.py)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re

TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
MODULE_UTILS = os.path.join(TESTS, '..', 'plugins', 'module_utils')


def _python_files(top):
    for folder, _dirs, files in os.walk(top):
        for name in sorted(files):
            if name.endswith('.py'):
                yield os.path.relpath(os.path.join(folder, name), top)


def test_every_module_utils_file_has_its_test_file():
    missing = [path for path in _python_files(MODULE_UTILS) if os.path.basename(path) != '__init__.py'
               and not os.path.exists(os.path.join(TESTS, 'unit', 'module_utils', os.path.dirname(path),
                                                   'test_' + os.path.basename(path)))]
    assert missing == []


def _sources():
    for path in _python_files(TESTS):
        with open(os.path.join(TESTS, path), encoding='utf-8') as handle:
            yield path, handle.read()


def test_nothing_changes_the_import_path():
    edits = [path for path, text in _sources() if re.search(r'\bsys\.path\s*(\[|\.(insert|append|remove|extend)|=)', text)]
    assert edits == []


def test_no_test_module_imports_another():
    imports = re.compile(r'^\s*(from|import)\s+(tests\b|\.*test_)', re.M)
    assert [path for path, text in _sources() if imports.search(text)] == []
