# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""doctor_evidence.py over stand-in client methods (the same against a real kube-apiserver, through the
module: tests/integration/test_k8s_gpu_doctor.py): what is read, for which objects, and that a
refusal becomes a DoctorError naming the request."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json

import pytest
from kubernetes.client.exceptions import ApiException

from ansible_collections.gpuready.nvidia.plugins.module_utils import doctor_evidence

PLUGIN = {'metadata': {'name': 'nvidia-device-plugin', 'namespace': 'gpu'},
          'spec': {'template': {'spec': {'containers': [{'image': 'nvcr.io/nvidia/k8s-device-plugin:v0.20.0'}]}}}}
PLUGIN_POD = {'metadata': {'name': 'nvidia-device-plugin-x1', 'namespace': 'gpu'},
              'spec': dict(PLUGIN['spec']['template']['spec'], nodeName='n1'),
              'status': {'phase': 'Running', 'containerStatuses': [{'restartCount': 2}]}}
WORKLOAD = {'metadata': {'name': 'train', 'namespace': 'default'},
            'spec': {'containers': [{'image': 'cuda', 'resources': {'limits': {'nvidia.com/gpu': '1'}}}]},
            'status': {'phase': 'Pending'}}
PENDING_CPU = {'metadata': {'name': 'web', 'namespace': 'default'}, 'spec': {'containers': [{'image': 'nginx'}]},
               'status': {'phase': 'Pending'}}


def _on(pod, node, name=None):
    return dict(pod, metadata=dict(pod['metadata'], name=name or pod['metadata']['name']),
                spec=dict(pod['spec'], nodeName=node), status={'phase': 'Running'})


class _Response(object):
    def __init__(self, body):
        self.data = body if isinstance(body, bytes) else json.dumps(body).encode()

    def release_conn(self):
        pass


def _lister(items):
    def list_func(**kwargs):
        return _Response({'metadata': {'resourceVersion': '1'}, 'items': items(kwargs) if callable(items) else items})
    return list_func


class _Core(object):
    def __init__(self, refuse_logs=False):
        self.logs = []
        self.lists = []
        self.refuse_logs = refuse_logs

    def read_namespace(self, name, **kwargs):
        return _Response({'metadata': {'name': name, 'labels': {}}})

    def list_node(self, **kwargs):
        self.lists.append(('nodes', kwargs))
        return _lister([{'metadata': {'name': name}} for name in ('n1', 'n2', 'n3')])(**kwargs)

    def list_namespaced_event(self, namespace, **kwargs):
        return _lister([{'reason': 'FailedCreate', 'type': 'Warning', 'message': kwargs['field_selector']}])(**kwargs)

    def list_pod_for_all_namespaces(self, **kwargs):
        self.lists.append(('pods', kwargs))
        return _lister([PLUGIN_POD, WORKLOAD, PENDING_CPU, _on(WORKLOAD, 'n1'), _on(WORKLOAD, 'n3', 'elsewhere')])(**kwargs)

    def read_namespaced_pod_log(self, name, namespace, **kwargs):
        self.logs.append((name, kwargs['previous']))
        if self.refuse_logs:
            raise ApiException(status=403, reason='Forbidden')
        return _Response(b'log of %s' % name.encode())


class _Apps(object):
    list_daemon_set_for_all_namespaces = staticmethod(_lister([PLUGIN]))
    list_deployment_for_all_namespaces = staticmethod(_lister([]))


class _NodeApi(object):
    list_runtime_class = staticmethod(_lister([{'metadata': {'name': 'nvidia'}, 'handler': 'nvidia'}]))


def test_the_evidence_of_the_cluster_and_each_node():
    core = _Core()
    found = doctor_evidence.api_evidence(core, _Apps(), _NodeApi(), ['n1', 'gone'])
    assert [ds['metadata']['name'] for ds in found['daemonsets']] == ['nvidia-device-plugin']
    assert found['namespaces'] == {'gpu': {'metadata': {'name': 'gpu', 'labels': {}}}}
    assert found['events']['gpu/nvidia-device-plugin'][0]['message'] == 'involvedObject.name=nvidia-device-plugin'
    assert [p['metadata']['name'] for p in found['unscheduled_gpu_pods']] == ['train']
    plugin_pod, workload = found['nodes']['n1']['pods']
    assert found['nodes']['n1']['node'] == {'metadata': {'name': 'n1'}}
    # a node the API does not know has no Node object and no pods; pods on other nodes are left out
    assert found['nodes']['gone'] == {'node': None, 'pods': []}
    assert sorted(found['nodes']) == ['gone', 'n1']
    # one LIST of Nodes and one of pods, unfiltered, whatever the number of nodes
    assert [kind for kind, _kwargs in core.lists] == ['nodes', 'pods']
    assert not any('field_selector' in kwargs for _kind, kwargs in core.lists)
    # the plugin restarted: its previous log is read too; the GPU workload's log once
    assert plugin_pod['log'] == 'log of nvidia-device-plugin-x1' and plugin_pod['previous_log']
    assert workload['log'] == 'log of train' and workload['previous_log'] == ''
    assert core.logs == [('nvidia-device-plugin-x1', False), ('nvidia-device-plugin-x1', True), ('train', False)]


def test_a_refused_read_is_a_doctor_error_naming_it():
    with pytest.raises(doctor_evidence.DoctorError, match='reading the log of pod gpu/nvidia-device-plugin-x1: forbidden'):
        doctor_evidence.api_evidence(_Core(refuse_logs=True), _Apps(), _NodeApi(), ['n1'])
