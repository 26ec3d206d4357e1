# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Security defaults. TLS: the API server's certificate is verified unless a user turns it off. The
rendered manifests (tests/manifest_render.py), in every setting that changes a pod: each namespace we
create is labelled with the least permissive Pod Security Standard that admits every pod we put in it,
and only the containers that need it run privileged, each with the reason in a comment above it in the
template."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re

import pytest
import yaml

import manifest_render
from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s import auth

TEMPLATES = [('device_plugin', 'namespace.yml.j2'), ('device_plugin', 'device-plugin.yml.j2'),
             ('feature_discovery', 'prerequisites.yml.j2'), ('feature_discovery', 'nfd.yml.j2'),
             ('feature_discovery', 'gfd.yml.j2')]
MPS = {'strategy': 'mps', 'resources': [{'name': 'nvidia.com/gpu', 'replicas': 2}]}
SETTINGS = {
    'default': {},
    'runtime class': {'gpuready_set_as_default': False},
    'mps': {'gpuready_sharing': MPS},
    'mig mixed': {'gpuready_mig_strategy': 'mixed'},
}
LEVELS = ('restricted', 'baseline', 'privileged')
# Pod Security Standards, baseline: capabilities a container may add
BASELINE_CAPABILITIES = {'AUDIT_WRITE', 'CHOWN', 'DAC_OVERRIDE', 'FOWNER', 'FSETID', 'KILL', 'MKNOD',
                         'NET_BIND_SERVICE', 'SETFCAP', 'SETGID', 'SETPCAP', 'SETUID', 'SYS_CHROOT'}
RESTRICTED_VOLUMES = {'configMap', 'csi', 'downwardAPI', 'emptyDir', 'ephemeral', 'persistentVolumeClaim',
                      'projected', 'secret'}
# The containers that run privileged, and why (the same reason is a comment in the template)
PRIVILEGED = {'gpu-feature-discovery', 'mps-control-daemon-mounts', 'mps-control-daemon-ctr'}


def test_tls_is_verified_by_default():
    with open(os.path.join(manifest_render.ROLES_DIR, 'gpuready', 'defaults', 'main.yml')) as handle:
        assert yaml.safe_load(handle)['gpuready_k8s_validate_certs'] is True
    assert 'default' not in auth.AUTH_ARG_SPEC['validate_certs']  # unset: the kubeconfig decides, else verify
    client = auth.api_client({'host': 'https://127.0.0.1:9', 'api_key': 'not-a-real-token'})
    assert client.configuration.verify_ssl is True


def _objects(settings):
    return [obj for role, template in TEMPLATES for obj in manifest_render.render(role, template, settings)]


def _pod_specs(objects):
    """(namespace, workload name, pod spec) of every workload."""
    return [(obj['metadata'].get('namespace'), obj['metadata']['name'], obj['spec']['template']['spec'])
            for obj in objects if obj['kind'] in ('DaemonSet', 'Deployment')]


def _containers(spec):
    return spec.get('initContainers', []) + spec['containers']


def _needs_baseline_exemption(spec):
    """What the baseline standard forbids in this pod (so it needs privileged), as text."""
    found = ['%s %s' % (key, spec[key]) for key in ('hostNetwork', 'hostPID', 'hostIPC') if spec.get(key)]
    found += ['hostPath volume %s' % v['name'] for v in spec.get('volumes', []) if 'hostPath' in v]
    for container in _containers(spec):
        context = container.get('securityContext') or {}
        if context.get('privileged'):
            found.append('%s privileged' % container['name'])
        extra = set(context.get('capabilities', {}).get('add', [])) - BASELINE_CAPABILITIES
        if extra:
            found.append('%s adds %s' % (container['name'], sorted(extra)))
        found += ['%s hostPort' % container['name'] for port in container.get('ports', []) if port.get('hostPort')]
    return found


def _breaks_restricted(spec):
    found = ['volume %s' % v['name'] for v in spec.get('volumes', []) if not set(v) - {'name'} <= RESTRICTED_VOLUMES]
    pod_context = spec.get('securityContext') or {}
    for container in _containers(spec):
        context = container.get('securityContext') or {}
        if context.get('allowPrivilegeEscalation') is not False:
            found.append('%s may escalate' % container['name'])
        if not (context.get('runAsNonRoot') or pod_context.get('runAsNonRoot')):
            found.append('%s may run as root' % container['name'])
        if 'ALL' not in context.get('capabilities', {}).get('drop', []):
            found.append('%s keeps capabilities' % container['name'])
    return found


def _least_level(specs):
    if any(_needs_baseline_exemption(spec) for spec in specs):
        return 'privileged'
    if any(_breaks_restricted(spec) for spec in specs):
        return 'baseline'
    return 'restricted'


@pytest.mark.parametrize('settings', sorted(SETTINGS), ids=sorted(SETTINGS))
def test_each_namespace_is_as_permissive_as_its_pods_need_and_no_more(settings):
    objects = _objects(SETTINGS[settings])
    namespaces = dict((obj['metadata']['name'], obj['metadata'].get('labels', {}))
                      for obj in objects if obj['kind'] == 'Namespace')
    assert namespaces, 'no namespace rendered'
    pods = _pod_specs(objects)
    for name, labels in namespaces.items():
        specs = [spec for namespace, dummy, spec in pods if namespace == name]
        assert specs, 'namespace %s holds none of our pods' % name
        assert labels.get('pod-security.kubernetes.io/enforce') == _least_level(specs), (name, [
            _needs_baseline_exemption(spec) for spec in specs])
    # every pod is in a namespace we label
    assert set(namespace for namespace, dummy, spec in pods) <= set(namespaces)


@pytest.mark.parametrize('settings', sorted(SETTINGS), ids=sorted(SETTINGS))
def test_only_the_containers_that_need_it_run_privileged(settings):
    privileged = set(container['name'] for dummy, dummy2, spec in _pod_specs(_objects(SETTINGS[settings]))
                     for container in _containers(spec) if (container.get('securityContext') or {}).get('privileged'))
    assert privileged <= PRIVILEGED
    assert 'gpu-feature-discovery' in privileged
    assert ('mps-control-daemon-ctr' in privileged) == (settings == 'mps')


def test_the_device_plugin_drops_every_capability_without_mig():
    for settings in ('default', 'runtime class', 'mps'):
        plugin = [spec for dummy, name, spec in _pod_specs(_objects(SETTINGS[settings])) if name == 'nvidia-device-plugin']
        context = plugin[0]['containers'][0]['securityContext']
        assert context == {'allowPrivilegeEscalation': False, 'capabilities': {'drop': ['ALL']}}, settings
    mig = [spec for dummy, name, spec in _pod_specs(_objects(SETTINGS['mig mixed'])) if name == 'nvidia-device-plugin']
    assert mig[0]['containers'][0]['securityContext'] == {'capabilities': {'add': ['SYS_ADMIN']}}


@pytest.mark.parametrize('role, template', [('feature_discovery', 'gfd.yml.j2'), ('device_plugin', 'device-plugin.yml.j2')])
def test_each_privileged_line_says_why(role, template):
    with open(os.path.join(manifest_render.ROLES_DIR, role, 'templates', template)) as handle:
        lines = handle.read().splitlines()
    privileged = [number for number, line in enumerate(lines) if re.match(r'\s*privileged: true\b', line)]
    assert privileged
    for number in privileged:
        # a comment within the four lines above (the securityContext line sits between)
        assert any(line.strip().startswith('#') for line in lines[max(0, number - 4):number]), (template, number + 1)
