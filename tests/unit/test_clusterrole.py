# -*- coding: utf-8 -*-
"""roles/gpuready/files/clusterrole.yml covers every object the roles apply: each kind their templates
render (with MPS and a RuntimeClass, so that every template branch is on) may be read, created, patched and
deleted, and the roles that NFD and GFD get may be granted (escalate, bind). The default Molecule scenario
runs the playbooks under it; this test names the missing rule before a run would."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

import pytest
import yaml

import manifest_render

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTERROLE = os.path.join(ROOT, 'roles', 'gpuready', 'files', 'clusterrole.yml')
TEMPLATES = [('device_plugin', 'namespace.yml.j2'), ('device_plugin', 'runtime-class.yml.j2'),
             ('device_plugin', 'device-plugin.yml.j2'), ('feature_discovery', 'prerequisites.yml.j2'),
             ('feature_discovery', 'nfd.yml.j2'), ('feature_discovery', 'gfd.yml.j2')]
SETTINGS = {'gpuready_set_as_default': False,
            'gpuready_sharing': {'strategy': 'mps', 'resources': [{'name': 'nvidia.com/gpu', 'replicas': 2}]}}


def _rules():
    with open(CLUSTERROLE) as handle:
        role = yaml.safe_load(handle)
    assert role['kind'] == 'ClusterRole' and role['metadata']['name'] == 'gpuready-nvidia'
    return role['rules']


def _allows(rules, verb, group, resource, name=None):
    return any(verb in rule['verbs'] and group in rule['apiGroups'] and resource in rule['resources']
               and (not rule.get('resourceNames') or name in rule['resourceNames']) for rule in rules)


def _objects():
    return [obj for role, template in TEMPLATES for obj in manifest_render.render(role, template, SETTINGS)]


def _plural(kind):
    return kind.lower() + ('es' if kind.endswith('s') else 's')


def test_every_rendered_kind_can_be_applied_and_removed():
    rules = _rules()
    objects = _objects()
    kinds = set((obj['apiVersion'].rpartition('/')[0], obj['kind']) for obj in objects)
    assert ('apps', 'DaemonSet') in kinds and ('rbac.authorization.k8s.io', 'ClusterRole') in kinds
    missing = ['%s %s %s' % (verb, group or 'core', _plural(kind)) for group, kind in sorted(kinds)
               for verb in ('get', 'list', 'create', 'patch', 'delete') if not _allows(rules, verb, group, _plural(kind))]
    assert missing == []


def test_the_roles_granted_to_nfd_and_gfd_may_be_bound():
    rules = _rules()
    granted = [obj for obj in _objects() if obj['kind'] in ('ClusterRole', 'Role')]
    assert len(granted) >= 3
    missing = ['%s %s %s' % (verb, obj['kind'], obj['metadata']['name']) for obj in granted for verb in ('escalate', 'bind')
               if not _allows(rules, verb, 'rbac.authorization.k8s.io', _plural(obj['kind']), obj['metadata']['name'])]
    assert missing == []


@pytest.mark.parametrize('verb, group, resource', [
    ('watch', '', 'nodes'), ('list', 'apps', 'daemonsets'), ('list', 'nvidia.com', 'clusterpolicies'),
    ('get', '', 'pods/log'), ('create', '', 'pods')])
def test_what_preflight_and_validation_read(verb, group, resource):
    assert _allows(_rules(), verb, group, resource)


def test_nothing_beyond_the_collection():
    rules = _rules()
    assert not any('*' in rule['verbs'] or '*' in rule['resources'] or '*' in rule['apiGroups'] for rule in rules)
    assert not _allows(rules, 'get', '', 'secrets')
