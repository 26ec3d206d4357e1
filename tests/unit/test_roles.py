# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every role's shape: its argument spec documents exactly its defaults (same names, same default
values), its variables carry the role's prefix, it runs its preflight before anything else and
depends on the collection-wide settings."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

import pytest
import yaml

ROLES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'roles')
ROLES = sorted(name for name in os.listdir(ROLES_DIR) if os.path.isdir(os.path.join(ROLES_DIR, name)))


def _load(role, *parts):
    path = os.path.join(ROLES_DIR, role, *parts)
    if not os.path.exists(path):
        return None
    with open(path) as handle:
        return yaml.safe_load(handle)


def test_there_are_roles():
    assert 'gpuready' in ROLES and 'containerd_runtime' in ROLES


@pytest.mark.parametrize('role', ROLES)
def test_argument_spec_matches_defaults(role):
    defaults = _load(role, 'defaults', 'main.yml') or {}
    options = _load(role, 'meta', 'argument_specs.yml')['argument_specs']['main']['options']
    assert sorted(options) == sorted(defaults)
    for name, value in defaults.items():
        spec = options[name]
        assert spec.get('description'), name
        if value is None:
            assert 'default' not in spec or spec['default'] is None, name
        else:
            assert spec.get('default') == value, name


@pytest.mark.parametrize('role', ROLES)
def test_variables_carry_the_role_prefix(role):
    prefix = role + '_'
    assert [name for name in (_load(role, 'defaults', 'main.yml') or {}) if not name.startswith(prefix)] == []


@pytest.mark.parametrize('role', [r for r in ROLES if r != 'gpuready'])
def test_preflight_first_and_settings_dependency(role):
    tasks = _load(role, 'tasks', 'main.yml')
    includes = [i for i, task in enumerate(tasks) if task.get('ansible.builtin.include_tasks') == 'preflight.yml']
    assert includes, 'tasks/main.yml does not include preflight.yml'
    changing = [i for i, task in enumerate(tasks[:includes[0]]) if 'ansible.builtin.set_fact' not in task]
    assert changing == [], 'only set_fact may come before the preflight'
    assert os.path.exists(os.path.join(ROLES_DIR, role, 'tasks', 'preflight.yml'))
    assert {'role': 'gpuready.nvidia.gpuready'} in _load(role, 'meta', 'main.yml')['dependencies']
    assert os.path.exists(os.path.join(ROLES_DIR, role, 'README.md'))


def _registered(tasks):
    for task in tasks or []:
        if 'register' in task:
            yield task['register']
        for key in ('block', 'rescue', 'always'):
            yield from _registered(task.get(key))


@pytest.mark.parametrize('role', ROLES)
def test_no_task_registers_over_a_role_variable(role):
    """A registered result outranks role defaults: `register: containerd_runtime_state` once hid the
    role's containerd_runtime_state (present/absent) from every later task."""
    defaults = set(_load(role, 'defaults', 'main.yml') or {})
    tasks_dir = os.path.join(ROLES_DIR, role, 'tasks')
    for name in sorted(os.listdir(tasks_dir)) if os.path.isdir(tasks_dir) else []:
        clashes = defaults.intersection(_registered(_load(role, 'tasks', name)))
        assert not clashes, '%s/tasks/%s registers %s' % (role, name, sorted(clashes))


def _oldest_ansible():
    """The version in meta/runtime.yml's requires_ansible (">=2.19.0" -> "2.19.0")."""
    with open(os.path.join(ROLES_DIR, '..', 'meta', 'runtime.yml')) as handle:
        requires = yaml.safe_load(handle)['requires_ansible']
    assert requires.startswith('>='), requires
    return requires[2:].split(',')[0].strip()


@pytest.mark.parametrize('role', ROLES)
def test_min_ansible_version_is_requires_ansible(role):
    assert _load(role, 'meta', 'main.yml')['galaxy_info']['min_ansible_version'] == _oldest_ansible()
