# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""k8s/workloads.py: the one classifier of GPU workloads fed every DaemonSet shape the device_plugin
preflight and the doctor must tell apart (upstream static manifests, the Helm chart's DaemonSets,
the GPU Operator's, ours, unrelated ones), the ownership rule, and the scheduling rules."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy
import os

import pytest
import yaml

import manifest_render

from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s import workloads as wl

FIXTURES = os.path.join(manifest_render.COLLECTION_ROOT, 'tests', 'fixtures', 'manifests')
PLUGIN_IMAGE = 'nvcr.io/nvidia/k8s-device-plugin:v0.20.0'
NFD_IMAGE = 'registry.k8s.io/nfd/node-feature-discovery:v0.17.3'


def _fixture(name, kind='DaemonSet'):
    with open(os.path.join(FIXTURES, name)) as handle:
        docs = [doc for doc in yaml.safe_load_all(handle) if doc]
    return [item for doc in docs for item in (doc.get('items') or [doc]) if item['kind'] == kind]


def _container(image, command=None, args=None, name='c'):
    container = {'name': name, 'image': image}
    if command is not None:
        container['command'] = command
    if args is not None:
        container['args'] = args
    return container


def _daemonset(name, containers, labels=None, init=None, namespace='nvidia'):
    """A DaemonSet as k8s_info returns it: labels on the object and its pod template."""
    spec = {'containers': containers}
    if init:
        spec['initContainers'] = init
    return {'apiVersion': 'apps/v1', 'kind': 'DaemonSet',
            'metadata': {'name': name, 'namespace': namespace, 'labels': dict(labels or {})},
            'spec': {'selector': {'matchLabels': dict(labels or {'name': name})},
                     'template': {'metadata': {'labels': dict(labels or {})}, 'spec': spec}}}


def _helm(app, containers, init=None):
    """A DaemonSet of the nvidia-device-plugin Helm chart (release nvdp): every one carries the
    chart's name in app.kubernetes.io/name, the MPS daemon too."""
    labels = {'app.kubernetes.io/name': 'nvidia-device-plugin', 'app.kubernetes.io/instance': 'nvdp',
              'app.kubernetes.io/managed-by': 'Helm'}
    return _daemonset('nvdp-%s' % app, containers, labels, init)


CONFIG_MANAGER = _container(PLUGIN_IMAGE, ['config-manager'], name='config-manager')
OPERATOR_INIT = _container(PLUGIN_IMAGE, ['sh', '-c'], ['until [ -f /run/nvidia/validations/toolkit-ready ]; '
                                                        'do sleep 5; done'], name='toolkit-validation')

# (what it is, the DaemonSet): every shape the preflight and the doctor must tell apart
SHAPES = [
    ('upstream static plugin manifest (no command: the image entrypoint)',
     wl.DEVICE_PLUGIN, _fixture('nvidia-device-plugin-v0.20.0.yml')[0]),
    ('upstream static GFD manifest (plugin image, GFD command)', wl.GFD, _fixture('gpu-feature-discovery-v0.20.0.yml')[0]),
    ('upstream NFD worker', wl.NFD_WORKER, _fixture('nfd-v0.17.3.yml')[0]),
    ('Helm chart plugin with the config-manager sidecar',
     wl.DEVICE_PLUGIN, _helm('nvidia-device-plugin', [CONFIG_MANAGER, _container(PLUGIN_IMAGE, ['nvidia-device-plugin'])],
                             init=[CONFIG_MANAGER])),
    ('Helm chart GFD (named after the chart, running GFD)',
     wl.GFD, _helm('gpu-feature-discovery', [CONFIG_MANAGER, _container(PLUGIN_IMAGE, ['gpu-feature-discovery'])])),
    ('Helm chart MPS control daemon (named after the plugin chart, running the MPS daemon)',
     wl.MPS_CONTROL_DAEMON, _helm('nvidia-device-plugin-mps-control-daemon',
                                  [CONFIG_MANAGER, _container(PLUGIN_IMAGE, ['mps-control-daemon'])],
                                  init=[_container(PLUGIN_IMAGE, ['mps-control-daemon', 'mount-shm'])])),
    ('GPU Operator plugin (a shell wrapper: the name says)',
     wl.DEVICE_PLUGIN, _daemonset('nvidia-device-plugin-daemonset',
                                  [_container(PLUGIN_IMAGE, ['/bin/sh', '-c'], ['/bin/entrypoint.sh']), CONFIG_MANAGER],
                                  {'app': 'nvidia-device-plugin-daemonset'}, [OPERATOR_INIT])),
    ('GPU Operator GFD (plugin image without a command: the name says)',
     wl.GFD, _daemonset('gpu-feature-discovery', [_container(PLUGIN_IMAGE)], {'app': 'gpu-feature-discovery'},
                        [OPERATOR_INIT])),
    ('standalone GFD image (v0.8)', wl.GFD, _daemonset('gfd', [_container('nvcr.io/nvidia/gpu-feature-discovery:v0.8.2')])),
    ('renamed plugin on a mirror, known by its command',
     wl.DEVICE_PLUGIN, _daemonset('x', [_container('mirror.local/nvidia/k8s-device-plugin@sha256:abc',
                                                   ['nvidia-device-plugin'])])),
    ('renamed GFD on the plugin image, known by its command',
     wl.GFD, _daemonset('y', [_container(PLUGIN_IMAGE, ['/usr/bin/gpu-feature-discovery'])])),
    ('plugin started through a shell', wl.DEVICE_PLUGIN,
     _daemonset('z', [_container('mirror.local/gpu:1', ['sh', '-c'], ['exec nvidia-device-plugin --fail-on-init-error'])])),
    ('plugin with flags only (args, no command)', wl.DEVICE_PLUGIN,
     _daemonset('w', [_container(PLUGIN_IMAGE, args=['--fail-on-init-error=false'])])),
    ('NFD master as a DaemonSet', wl.NFD_MASTER, _daemonset('features', [_container(NFD_IMAGE, ['nfd-master'])])),
    ('an old NFD worker pointed at its master', wl.NFD_WORKER,
     _daemonset('nfd-w', [_container(NFD_IMAGE, ['nfd-worker'], ['-server=nfd-master:8080'])])),
    ('NFD garbage collector', wl.NFD, _daemonset('nfd-gc', [_container(NFD_IMAGE, ['nfd-gc'])])),
    ('unrelated: kube-proxy', None, _daemonset('kube-proxy', [_container('registry.k8s.io/kube-proxy:v1.31.0',
                                                                         ['kube-proxy'])])),
    ('unrelated: dcgm-exporter, an NVIDIA image of another name', None,
     _daemonset('gpu-exporter', [_container('nvcr.io/nvidia/k8s/dcgm-exporter:3.3', ['dcgm-exporter'])],
                {'app': 'dcgm-exporter'})),
    ('unrelated: the plugin image running something else', None,
     _daemonset('debug', [_container(PLUGIN_IMAGE, ['sleep', 'infinity'])])),
]


@pytest.mark.parametrize('what, component, daemonset', SHAPES, ids=[shape[0] for shape in SHAPES])
def test_the_classifier_tells_every_shape_apart(what, component, daemonset):
    assert wl.classify(daemonset) == component, what


def test_our_rendered_daemonsets_classify_as_what_they_run():
    ours = manifest_render.render('device_plugin', 'device-plugin.yml.j2',
                                  {'gpuready_sharing': {'strategy': 'mps', 'resources': [{'name': 'nvidia.com/gpu',
                                                                                          'replicas': 2}]}})
    ours += manifest_render.render('feature_discovery', 'gfd.yml.j2') + manifest_render.render('feature_discovery',
                                                                                               'nfd.yml.j2')
    found = sorted((obj['kind'], wl.classify(obj)) for obj in ours if obj['kind'] in ('DaemonSet', 'Deployment'))
    assert found == [('DaemonSet', wl.DEVICE_PLUGIN), ('DaemonSet', wl.GFD), ('DaemonSet', wl.MPS_CONTROL_DAEMON),
                     ('DaemonSet', wl.NFD_WORKER), ('Deployment', wl.NFD_MASTER)]
    assert all(wl.owned(obj) for obj in ours)


def test_a_pod_is_classified_by_its_own_spec():
    daemonset = _fixture('nvidia-device-plugin-v0.20.0.yml')[0]
    pod = {'metadata': {'name': 'nvidia-device-plugin-daemonset-x1', 'labels': {'name': 'nvidia-device-plugin-ds'}},
           'spec': copy.deepcopy(daemonset['spec']['template']['spec'])}
    assert wl.classify(pod) == wl.DEVICE_PLUGIN
    workload = {'metadata': {'name': 'train'}, 'spec': {'containers': [{'image': 'cuda', 'resources': {
        'limits': {'nvidia.com/gpu': '2'}, 'requests': {'nvidia.com/gpu': '1'}}}]}}
    assert wl.classify(workload) is None
    assert wl.gpu_requests(workload) == {'nvidia.com/gpu': 2}


def test_the_lab_style_static_manifest_counts_as_a_device_plugin():
    # The upstream static DaemonSet has no command: the image says what it is
    container = {'image': PLUGIN_IMAGE, 'name': 'nvidia-device-plugin-ctr'}
    assert wl.container_component(container) == wl.DEVICE_PLUGIN
    assert wl.container_component(dict(container, command=['gpu-feature-discovery'])) == wl.GFD
    assert wl.container_component(dict(container, command=['mps-control-daemon'])) == wl.MPS_CONTROL_DAEMON
    assert wl.container_component(dict(container, command=['config-manager'])) is None


# --- what the preflight reports (gpu_components) ---------------------------------------------------


def _components(daemonsets, policies=()):
    found = wl.gpu_components({'resources': list(daemonsets)}, {'resources': list(policies)})
    return [(f['component'], f['kind'], f['namespace'], f['name']) for f in found]


def test_gpu_components_names_each_foreign_component_with_its_selector():
    found = wl.gpu_components({'resources': [shape[2] for shape in SHAPES]}, {'resources': [], 'api_found': False})
    assert [f['component'] for f in found] == [
        'device-plugin', 'gpu-feature-discovery', 'node-feature-discovery', 'device-plugin', 'gpu-feature-discovery',
        'mps-control-daemon', 'device-plugin', 'gpu-feature-discovery', 'gpu-feature-discovery', 'device-plugin',
        'gpu-feature-discovery', 'device-plugin', 'device-plugin', 'node-feature-discovery', 'node-feature-discovery',
        'node-feature-discovery']
    assert found[0] == {'component': 'device-plugin', 'kind': 'DaemonSet', 'namespace': 'kube-system',
                        'name': 'nvidia-device-plugin-daemonset', 'selector': ['name=nvidia-device-plugin-ds']}


def test_gpu_components_never_counts_ours_and_takes_plain_lists():
    ours = _daemonset('nvidia-device-plugin', [_container(PLUGIN_IMAGE, ['nvidia-device-plugin'])],
                      dict(wl.OWNED_LABELS))
    assert _components([ours]) == []
    assert wl.gpu_components([ours, SHAPES[0][2]]) == wl.gpu_components({'resources': [SHAPES[0][2]]})
    assert wl.gpu_components(None, None) == []


@pytest.mark.parametrize('enabled, counted', [(None, True), (True, True), ('true', True), (False, False),
                                              ('false', False), ('no', False)])
def test_a_cluster_policy_counts_while_it_deploys_the_plugin(enabled, counted):
    spec = {} if enabled is None else {'devicePlugin': {'enabled': enabled}}
    policy = {'apiVersion': 'nvidia.com/v1', 'kind': 'ClusterPolicy', 'metadata': {'name': 'cluster-policy'},
              'spec': spec}
    assert _components([], [policy]) == ([('gpu-operator', 'ClusterPolicy', None, 'cluster-policy')] if counted else [])


# --- ownership ---------------------------------------------------------------------------------------


def test_ours_is_the_managed_by_label_and_nothing_else():
    assert wl.owned({'metadata': {'labels': {'app.kubernetes.io/managed-by': 'gpuready.nvidia'}}})
    assert not wl.owned({'metadata': {'labels': {'app.kubernetes.io/managed-by': 'Helm'}}})
    assert not wl.owned({'metadata': {'labels': None}})
    assert not wl.owned({'metadata': {}})
    assert not wl.owned(None)
    assert not wl.owned({'metadata': {'labels': {'app.kubernetes.io/part-of': 'gpuready.nvidia'}}})


def test_owner_daemonset_reads_the_owner_reference():
    assert wl.owner_daemonset({'metadata': {'ownerReferences': [{'kind': 'Node', 'name': 'n'},
                                                                {'kind': 'DaemonSet', 'name': 'ds'}]}}) == 'ds'
    assert wl.owner_daemonset({'metadata': {}}) is None


# --- scheduling rules --------------------------------------------------------------------------------


def test_the_daemonset_controller_tolerates_node_conditions_on_its_own():
    node = {'metadata': {'labels': {}}, 'spec': {'taints': [{'key': 'node.kubernetes.io/not-ready',
                                                             'effect': 'NoExecute'}]}}
    assert wl.placement_problem({}, node) is None


def _node(labels=None, taints=None):
    return {'metadata': {'labels': labels or {}}, 'spec': {'taints': taints or []}}


def test_a_node_selector_must_match():
    assert wl.placement_problem({'nodeSelector': {'gpu': 'yes'}}, _node({'gpu': 'no'})) == (
        'affinity', 'nodeSelector gpu=yes; the node has gpu=no')
    assert wl.placement_problem({'nodeSelector': {'gpu': 'yes'}}, _node()) == (
        'affinity', 'nodeSelector gpu=yes; the node has no label gpu')
    assert wl.placement_problem({'nodeSelector': {'gpu': 'yes'}}, _node({'gpu': 'yes'})) is None


def _affinity(*terms):
    return {'affinity': {'nodeAffinity': {'requiredDuringSchedulingIgnoredDuringExecution': {
        'nodeSelectorTerms': [{'matchExpressions': list(term)} for term in terms]}}}}


@pytest.mark.parametrize('requirement, labels, fits', [
    ({'key': 'a', 'operator': 'In', 'values': ['1', '2']}, {'a': '2'}, True),
    ({'key': 'a', 'operator': 'In', 'values': ['1']}, {'a': '2'}, False),
    ({'key': 'a', 'operator': 'NotIn', 'values': ['1']}, {}, True),
    ({'key': 'a', 'operator': 'NotIn', 'values': ['1']}, {'a': '1'}, False),
    ({'key': 'a', 'operator': 'Exists'}, {'a': ''}, True),
    ({'key': 'a', 'operator': 'Exists'}, {}, False),
    ({'key': 'a', 'operator': 'DoesNotExist'}, {}, True),
    ({'key': 'a', 'operator': 'DoesNotExist'}, {'a': 'x'}, False),
    ({'key': 'a', 'operator': 'Gt', 'values': ['3']}, {'a': '4'}, True),
    ({'key': 'a', 'operator': 'Gt', 'values': ['3']}, {'a': 'x'}, False),
    ({'key': 'a', 'operator': 'Lt', 'values': ['3']}, {'a': '2'}, True),
    ({'key': 'a', 'operator': 'Lt', 'values': ['3']}, {}, False),
    ({'key': 'a', 'operator': 'Unknown'}, {'a': '1'}, False),
])
def test_each_node_affinity_operator(requirement, labels, fits):
    assert (wl.placement_problem(_affinity([requirement]), _node(labels)) is None) is fits


def test_affinity_terms_are_ored_and_the_refusal_names_the_gpu_labels():
    spec = _affinity([{'key': 'feature.node.kubernetes.io/pci-10de.present', 'operator': 'In', 'values': ['true']}],
                     [{'key': 'nvidia.com/gpu.present', 'operator': 'In', 'values': ['true']}])
    assert wl.placement_problem(spec, _node({'nvidia.com/gpu.present': 'true'})) is None
    kind, why = wl.placement_problem(spec, _node({'nvidia.com/gpu.present': 'false', 'zone': 'a'}))
    assert kind == 'affinity'
    assert why == ("required node affinity (feature.node.kubernetes.io/pci-10de.present In ['true']) or "
                   "(nvidia.com/gpu.present In ['true']); the node's GPU labels: nvidia.com/gpu.present=false")


@pytest.mark.parametrize('toleration, tolerated', [
    ({'key': 'nvidia.com/gpu', 'operator': 'Exists', 'effect': 'NoSchedule'}, True),
    ({'key': 'nvidia.com/gpu', 'operator': 'Exists'}, True),
    ({'operator': 'Exists'}, True),
    ({'key': 'nvidia.com/gpu', 'operator': 'Equal', 'value': 'present', 'effect': 'NoSchedule'}, True),
    ({'key': 'nvidia.com/gpu', 'operator': 'Equal', 'value': 'other'}, False),
    ({'key': 'nvidia.com/gpu', 'operator': 'Exists', 'effect': 'NoExecute'}, False),
    ({'key': 'other', 'operator': 'Exists'}, False),
])
def test_a_taint_needs_a_matching_toleration(toleration, tolerated):
    taint = {'key': 'nvidia.com/gpu', 'value': 'present', 'effect': 'NoSchedule'}
    assert wl.tolerates(toleration, taint) is tolerated
    problem = wl.placement_problem({'tolerations': [toleration]}, _node(taints=[taint]))
    assert (problem is None) is tolerated
    if not tolerated:
        assert problem[0] == 'taint' and problem[1].startswith('taint nvidia.com/gpu=present:NoSchedule is not tolerated')


def test_prefer_no_schedule_taints_do_not_keep_pods_away():
    assert wl.placement_problem({}, _node(taints=[{'key': 'x', 'effect': 'PreferNoSchedule'}])) is None
