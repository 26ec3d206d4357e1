# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""k8s_gpu_cluster_info through ansible-playbook against a real kube-apiserver, as an identity bound only to
the shipped ClusterRole, with kubernetes.core.k8s_info reading the same objects in the same play as the
oracle: each object it returns is k8s_info's (less managedFields), a missing one and an API that is not
served read as k8s_info says, a foreign device plugin is found and ours is not."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


import pytest
import yaml

from cluster_api import install_nfd_crds, shipped_rules
from playbook import run_tasks

OURS = {'app.kubernetes.io/managed-by': 'gpuready.nvidia'}


def _daemonset(namespace, name, labels=None):
    return {'apiVersion': 'apps/v1', 'kind': 'DaemonSet',
            'metadata': {'name': name, 'namespace': namespace, 'labels': labels or {}},
            'spec': {'selector': {'matchLabels': {'name': 'nvidia-device-plugin-ds'}},
                     'template': {'metadata': {'labels': {'name': 'nvidia-device-plugin-ds'}}, 'spec': {'containers': [
                         {'name': 'nvidia-device-plugin-ctr', 'image': 'nvcr.io/nvidia/k8s-device-plugin:v0.20.0'}]}}}}


@pytest.fixture(scope='module')
def reader(k8s_api):
    """An identity bound to roles/gpuready/files/clusterrole.yml, and the objects it reads."""
    identity = k8s_api.add_identity('cluster-info')
    k8s_api.bind_cluster_role('gpuready-nvidia-cluster-info-test', shipped_rules(), [identity.subject])
    for namespace, labels in (('ci-gpu', OURS), ('ci-foreign', {})):
        k8s_api.create({'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': namespace, 'labels': labels}})
    k8s_api.create({'apiVersion': 'node.k8s.io/v1', 'kind': 'RuntimeClass', 'metadata': {'name': 'ci-nvidia'},
                    'handler': 'nvidia'})
    k8s_api.create(_daemonset('ci-foreign', 'nvidia-device-plugin-daemonset'))
    k8s_api.create(_daemonset('ci-gpu', 'ci-ours', OURS))
    install_nfd_crds(k8s_api.client)
    return identity


def _oracle(register, kind, api_version, **where):
    return {'name': register, 'kubernetes.core.k8s_info': dict(where, kind=kind, api_version=api_version),
            'register': register}


def test_what_it_returns_is_what_k8s_info_reads(tmp_path, k8s_api, reader):
    auth = {'kubeconfig': reader.kubeconfig}
    tasks = [
        {'name': 'ours', 'gpuready.nvidia.k8s_gpu_cluster_info': dict(
            auth, namespace='ci-gpu', nfd_namespace='ci-nfd-missing', runtime_class='ci-nvidia',
            nfd_existing={'namespace': 'ci-nfd-missing'}), 'register': 'ours'},
        {'name': 'oracles', 'module_defaults': {'kubernetes.core.k8s_info': auth}, 'block': [
            _oracle('namespace', 'Namespace', 'v1', name='ci-gpu'),
            _oracle('nfd_namespace', 'Namespace', 'v1', name='ci-nfd-missing'),
            _oracle('runtime_class', 'RuntimeClass', 'node.k8s.io/v1', name='ci-nvidia'),
            _oracle('crd', 'CustomResourceDefinition', 'apiextensions.k8s.io/v1', name='nodefeatures.nfd.k8s-sigs.io'),
            _oracle('node_features', 'NodeFeature', 'nfd.k8s-sigs.io/v1alpha1', namespace='ci-gpu'),
            _oracle('policies', 'ClusterPolicy', 'nvidia.com/v1'),
            _oracle('master', 'Deployment', 'apps/v1', namespace='ci-nfd-missing', name='nfd-master'),
        ]},
    ]
    k8s_api.clear_requests()
    proc, results = run_tasks(str(tmp_path), tasks)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ours = results['ours']
    assert ours['changed'] is False

    def read(register):
        resources = results[register]['resources']
        assert len(resources) <= 1
        if not resources:
            return None
        metadata = dict(resources[0]['metadata'])
        metadata.pop('managedFields', None)
        return dict(resources[0], metadata=metadata)

    assert ours['namespace'] == read('namespace') and ours['namespace']['metadata']['labels'][
        'app.kubernetes.io/managed-by'] == 'gpuready.nvidia'
    assert ours['runtime_class'] == read('runtime_class') and ours['runtime_class']['handler'] == 'nvidia'
    assert ours['node_feature_crd'] == read('crd') and ours['node_feature_crd'] is not None
    assert ours['nfd_namespace'] is None and read('nfd_namespace') is None
    assert ours['nfd_existing'] == {'master': None, 'worker': None} and read('master') is None
    # the NFD CRDs are installed and the GPU Operator's are not: k8s_info's api_found says the same
    assert ours['node_feature_api'] is True and results['node_features']['api_found'] is True
    assert results['policies']['api_found'] is False
    assert not [found for found in ours['found'] if found['component'] == 'gpu-operator']
    # the foreign plugin is found with the selector its pods carry; ours (our label) is not
    assert {'component': 'device-plugin', 'kind': 'DaemonSet', 'namespace': 'ci-foreign',
            'name': 'nvidia-device-plugin-daemonset', 'selector': ['name=nvidia-device-plugin-ds']} in ours['found']
    assert 'ci-ours' not in [found['name'] for found in ours['found']]
    # every read is allowed by the shipped ClusterRole (a 404 is a missing object or an API not served)
    requests = [r for r in k8s_api.requests() if r.get('user') == reader.username]
    assert requests and all(r['code'] < 400 or r['code'] == 404 for r in requests), requests


def test_bad_credentials_fail_naming_the_request(tmp_path, k8s_api, reader):
    kubeconfig = tmp_path / 'kubeconfig'
    with open(reader.kubeconfig) as handle:
        config = yaml.safe_load(handle)
    for user in config['users']:
        user['user'] = {'token': 'not-a-token'}
    kubeconfig.write_text(yaml.safe_dump(config))
    proc, results = run_tasks(str(tmp_path), [{'name': 'ours', 'gpuready.nvidia.k8s_gpu_cluster_info': {
        'kubeconfig': str(kubeconfig)}, 'register': 'ours', 'ignore_errors': True}])
    assert results['ours']['failed'] is True, proc.stdout
    assert 'listing DaemonSets in all namespaces' in results['ours']['msg']
    assert '401' in results['ours']['msg'] and 'not-a-token' not in results['ours']['msg']


CONFIG = {'apiVersion': 'v1', 'kind': 'ConfigMap',
          'metadata': {'name': 'ci-config', 'namespace': 'ci-gpu', 'labels': OURS}, 'data': {'config.yaml': 'version: v1\n'}}
RUNTIME_CLASS = {'apiVersion': 'node.k8s.io/v1', 'kind': 'RuntimeClass',
                 'metadata': {'name': 'ci-current', 'labels': OURS}, 'handler': 'nvidia'}
KEYS = ['v1 ConfigMap ci-gpu/ci-config', 'node.k8s.io/v1 RuntimeClass ci-current']


def _current_then_dry_run(tmp_path, reader, objects, apply=False):
    """k8s_gpu_cluster_info's current for objects, then kubernetes.core.k8s's server-side apply (our field manager)
    of each in check mode: the oracle of whether applying it would change anything. With apply, to_apply's
    objects are applied for real first."""
    auth = {'kubeconfig': reader.kubeconfig}
    ssa = {'apply': True, 'server_side_apply': {'field_manager': 'gpuready.nvidia', 'force_conflicts': True}}
    tasks = [{'name': 'before', 'gpuready.nvidia.k8s_gpu_cluster_info': dict(auth, objects=objects), 'register': 'before'}]
    if apply:
        tasks.append({'name': 'apply', 'kubernetes.core.k8s': dict(auth, definition='{{ item }}', **ssa),
                      'vars': {'objects': objects}, 'loop': '{{ objects | gpuready.nvidia.to_apply(before.current) }}'})
    tasks += [
        {'name': 'after', 'gpuready.nvidia.k8s_gpu_cluster_info': dict(auth, objects=objects), 'register': 'after'},
        {'name': 'dry_run', 'kubernetes.core.k8s': dict(auth, definition='{{ item }}', **ssa), 'check_mode': True,
         'vars': {'objects': objects}, 'loop': '{{ objects | gpuready.nvidia.to_apply }}',
         'register': 'dry_run'},
    ]
    tmp_path.mkdir()
    proc, results = run_tasks(str(tmp_path), tasks)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return results['before']['current'], results['after']['current'], [r['changed'] for r in results['dry_run']['results']]


def test_current_is_what_a_server_side_apply_would_not_change(tmp_path, k8s_api, reader):
    # nothing applied yet: nothing current, and the apply would create both
    before, after, changes = _current_then_dry_run(tmp_path / 'first', reader, [CONFIG, RUNTIME_CLASS], apply=True)
    assert before == [] and after == KEYS and changes == [False, False]
    # another writer changes a field we set: that object is no longer current, and the apply would change it back
    k8s_api.patch('v1', 'ConfigMap', 'ci-config', {'data': {'config.yaml': 'version: v2\n'}}, namespace='ci-gpu')
    _before, after, changes = _current_then_dry_run(tmp_path / 'edited', reader, [CONFIG, RUNTIME_CLASS])
    assert after == KEYS[1:] and changes == [True, False]
    # the template no longer renders a label: the live object still holds every rendered field, but not the
    # fingerprint, and the apply would take the label off
    dropped = dict(RUNTIME_CLASS, metadata={'name': 'ci-current'})
    _before, after, changes = _current_then_dry_run(tmp_path / 'dropped', reader, [dropped])
    assert after == [] and changes == [True]
