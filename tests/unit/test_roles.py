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
    if 'module_defaults' in tasks[0]:
        tasks = tasks[0]['block']  # the role's tasks, given the Kubernetes credentials once
    includes = [i for i, task in enumerate(tasks) if task.get('ansible.builtin.include_tasks') == 'preflight.yml']
    assert includes, 'tasks/main.yml does not include preflight.yml'
    changing = [i for i, task in enumerate(tasks[:includes[0]]) if 'ansible.builtin.set_fact' not in task]
    assert changing == [], 'only set_fact may come before the preflight'
    assert os.path.exists(os.path.join(ROLES_DIR, role, 'tasks', 'preflight.yml'))
    assert {'role': 'gpuready.nvidia.gpuready'} in _load(role, 'meta', 'main.yml')['dependencies']
    assert os.path.exists(os.path.join(ROLES_DIR, role, 'README.md'))


AUTH_OPTIONS = {'kubeconfig', 'context', 'host', 'api_key', 'ca_cert', 'validate_certs'}
AUTH_DEFAULTS = {'group/gpuready.nvidia.k8s': '{{ gpuready_k8s_auth }}'}
INCLUDES = ('ansible.builtin.include_tasks', 'ansible.builtin.import_tasks')
ROLE_INCLUDES = ('ansible.builtin.include_role', 'ansible.builtin.import_role')


def _api_tasks(role, name, defaults=(), folder='tasks'):
    """(file, task name, module, options, the module_defaults in force) for every task of the role's
    <folder>/<name>, and of the task files it includes, that calls a Kubernetes module."""
    for task in _load(role, folder, name) or []:
        yield from _api_tasks_in(role, name, task, list(defaults))


def _api_tasks_in(role, name, task, defaults):
    if 'module_defaults' in task:
        defaults = defaults + [task['module_defaults']]
    for key in ('block', 'rescue', 'always'):
        for sub in task.get(key) or []:
            yield from _api_tasks_in(role, name, sub, defaults)
    for include in INCLUDES:
        if include in task:
            yield from _api_tasks(role, task[include], defaults)
    for include in ROLE_INCLUDES:
        # A shared task file (roles/gpuready remove_rendered.yml) runs with the caller's credentials; a role's
        # main.yml gives its own and is checked as that role's entry point
        options = task.get(include) or {}
        if options.get('name', '').startswith('gpuready.nvidia.') and 'tasks_from' in options:
            yield from _api_tasks(options['name'].split('.')[-1], options['tasks_from'], defaults)
    for module, options in task.items():
        if module.startswith('kubernetes.core.') or module.startswith('gpuready.nvidia.k8s_'):
            yield name, task.get('name'), module, options or {}, defaults


PLAYBOOKS_DIR = os.path.join(ROLES_DIR, '..', 'playbooks')


def _tasks_from(role, tasks=None):
    """The task files of the role that the playbooks run alone (include_role/import_role tasks_from)."""
    if tasks is None:
        tasks = []
        for name in sorted(os.listdir(PLAYBOOKS_DIR)):
            if name.endswith('.yml'):
                with open(os.path.join(PLAYBOOKS_DIR, name)) as handle:
                    for play in yaml.safe_load(handle) or []:
                        tasks += play.get('tasks') or []
    for task in tasks:
        for key in ('block', 'rescue', 'always'):
            yield from _tasks_from(role, task.get(key) or [])
        for include in ROLE_INCLUDES:
            options = task.get(include) or {}
            if options.get('name') == 'gpuready.nvidia.' + role and 'tasks_from' in options:
                yield options['tasks_from']


def test_the_playbooks_run_role_task_files_alone():
    """The check below follows these entry points too: credentials given in main.yml do not reach them."""
    assert list(_tasks_from('device_plugin')) == ['preflight.yml']


def test_site_skips_only_a_preflight_an_earlier_play_ran():
    """A role that site.yml tells to skip its preflight (<role>_preflight: false) gets its preflight facts from
    an earlier play that ran tasks_from preflight.yml under the same condition."""
    with open(os.path.join(PLAYBOOKS_DIR, 'site.yml')) as handle:
        plays = yaml.safe_load(handle)
    skipped = []
    for index, play in enumerate(plays):
        for entry in play.get('roles') or []:
            role = entry['role'].split('.')[-1]
            if (entry.get('vars') or {}).get(role + '_preflight') is not False:
                continue
            skipped.append(role)
            earlier = [task for before in plays[:index] for task in before.get('tasks') or []
                       if (task.get('ansible.builtin.include_role') or {}) == {
                           'name': 'gpuready.nvidia.' + role, 'tasks_from': 'preflight.yml'}]
            assert [task.get('when') for task in earlier] == [entry.get('when')], role
            main = _load(role, 'tasks', 'main.yml')
            assert main[0]['ansible.builtin.include_tasks'] == 'preflight.yml'
            assert main[0]['when'] == role + '_preflight | bool'
    assert skipped == ['feature_discovery', 'device_plugin']


def _role_api_tasks(role):
    """Every Kubernetes task reached from the role's entry points: tasks/main.yml, the task files the
    playbooks run alone, and handlers/main.yml."""
    yield from _api_tasks(role, 'main.yml')
    for name in _tasks_from(role):
        yield from _api_tasks(role, name)
    yield from _api_tasks(role, 'main.yml', folder='handlers')


API_ROLES = ['containerd_runtime', 'device_plugin', 'doctor', 'feature_discovery', 'node_labels', 'validate']


@pytest.mark.parametrize('role', API_ROLES)
def test_kubernetes_credentials_are_given_once_per_role(role):
    """Every Kubernetes task of the role gets gpuready_k8s_auth through the one module_defaults entry of
    the action group gpuready.nvidia.k8s (meta/runtime.yml), and none names a credential option itself."""
    calls = list(_role_api_tasks(role))
    assert calls, 'no Kubernetes task found from %s/tasks or handlers' % role
    for where, task, module, options, defaults in calls:
        assert AUTH_OPTIONS.isdisjoint(options), (where, task, sorted(AUTH_OPTIONS.intersection(options)))
        assert defaults == [AUTH_DEFAULTS], (where, task, module, defaults)


def test_the_action_group_holds_every_kubernetes_module_the_roles_call():
    with open(os.path.join(ROLES_DIR, '..', 'meta', 'runtime.yml')) as handle:
        group = yaml.safe_load(handle)['action_groups']['k8s']
    ours = set('gpuready.nvidia.' + name for name in group if isinstance(name, str))
    extended = [entry['metadata']['extend_group'] for entry in group if isinstance(entry, dict)]
    assert extended == [['kubernetes.core.k8s']]
    called = set(module for role in API_ROLES for _f, _t, module, _o, _d in _role_api_tasks(role))
    assert set(m for m in called if m.startswith('gpuready.nvidia.')) <= ours
    # kubernetes.core's own group `k8s` lists these (its meta/runtime.yml)
    assert set(m for m in called if m.startswith('kubernetes.core.')) <= {'kubernetes.core.k8s', 'kubernetes.core.k8s_info'}


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
