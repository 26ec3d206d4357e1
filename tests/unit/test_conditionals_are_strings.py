# -*- coding: utf-8 -*-
"""Every conditional in the roles, playbooks and Molecule scenarios is a string. An unquoted `: ` inside a
`that:` or `when:` item makes YAML read it as a mapping, which ansible-lint accepts and ansible-core 2.19
refuses only when the task runs."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import glob
import os

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEYS = ('that', 'when', 'failed_when', 'changed_when', 'until')
FILES = sorted(path for folder in ('roles', 'playbooks', 'molecule')
               for path in glob.glob(os.path.join(ROOT, folder, '**', '*.yml'), recursive=True)
               if '/templates/' not in path)


def _not_strings(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key in KEYS:
                for item in value if isinstance(value, list) else [value]:
                    if not isinstance(item, (str, bool)):
                        yield '%s: %r' % (key, item)
            yield from _not_strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from _not_strings(item)


def test_files_found():
    assert any(path.endswith('molecule/default/verify.yml') for path in FILES)


@pytest.mark.parametrize('path', FILES, ids=lambda p: os.path.relpath(p, ROOT))
def test_conditionals_are_strings(path):
    with open(path) as handle:
        docs = list(yaml.safe_load_all(handle))
    assert list(_not_strings(docs)) == []
