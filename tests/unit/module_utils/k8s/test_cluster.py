# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""k8s/cluster.py over stand-in client methods: which reads read_cluster makes, what a 404 means for an
object and for an API, and that any other refusal fails naming the request. The same against a real
kube-apiserver, with kubernetes.core.k8s_info as the oracle: tests/integration/test_k8s_gpu_cluster_info.py."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json

import pytest
from kubernetes.client.exceptions import ApiException

from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s import cluster
from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s.api import ApiError

OURS = {'app.kubernetes.io/managed-by': 'gpuready.nvidia'}
FOREIGN_PLUGIN = {'metadata': {'name': 'nvidia-device-plugin-daemonset', 'namespace': 'kube-system'},
                  'spec': {'selector': {'matchLabels': {'name': 'nvidia-device-plugin-ds'}},
                           'template': {'spec': {'containers': [{'image': 'nvcr.io/nvidia/k8s-device-plugin:v0.20.0'}]}}}}
OUR_PLUGIN = dict(FOREIGN_PLUGIN, metadata={'name': 'nvidia-device-plugin', 'namespace': 'gpu', 'labels': OURS})
MANAGED = [{'manager': 'gpuready.nvidia', 'operation': 'Apply'}]


class _Response(object):
    def __init__(self, body):
        self.data = json.dumps(body).encode()

    def release_conn(self):
        pass


DAEMONSETS = '/apis/apps/v1/daemonsets'
POLICIES = '/apis/nvidia.com/v1/clusterpolicies'
NODE_FEATURES = '/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/gpu/nodefeatures'


class _Client(object):
    """A stand-in of api.RawClient: paths maps an API path to what a GET returns (404 where missing);
    refuse, a path answered 403; asked records (path, query parameters)."""

    def __init__(self, paths=None, refuse=None):
        self.paths = {DAEMONSETS: {'metadata': {}, 'items': [FOREIGN_PLUGIN, OUR_PLUGIN]},
                      POLICIES: {'metadata': {}, 'items': []}, NODE_FEATURES: {'metadata': {}, 'items': []}}
        self.paths.update(paths or {})
        self.refuse = refuse
        self.asked = []

    def get(self, path, **params):
        self.asked.append((path, dict((k, v) for k, v in params.items() if k in ('limit', '_continue'))))
        if path == self.refuse:
            raise ApiException(status=403, reason='Forbidden')
        if self.paths.get(path) is None:
            raise ApiException(status=404, reason='Not Found')
        return _Response(self.paths[path])


def _read(client, nfd_existing=None, nfd_namespace='nfd', objects=()):
    return cluster.read_cluster(client, 'gpu', nfd_namespace, 'nvidia', nfd_existing, objects)


def _paths(client):
    return [path for path, _params in client.asked]


def test_what_is_found_and_what_is_missing():
    client = _Client({
        '/api/v1/namespaces/gpu': {'metadata': {'name': 'gpu', 'labels': OURS, 'managedFields': MANAGED}},
        '/apis/node.k8s.io/v1/runtimeclasses/nvidia': {'metadata': {'name': 'nvidia'}, 'handler': 'nvidia'},
        POLICIES: {'metadata': {}, 'items': [
            {'metadata': {'name': 'cluster-policy'}, 'spec': {'devicePlugin': {'enabled': True}}},
            {'metadata': {'name': 'off'}, 'spec': {'devicePlugin': {'enabled': False}}}]}})
    found = _read(client)
    # ours is left out; a ClusterPolicy counts only with its device plugin enabled
    assert found['found'] == [
        {'component': 'device-plugin', 'kind': 'DaemonSet', 'namespace': 'kube-system',
         'name': 'nvidia-device-plugin-daemonset', 'selector': ['name=nvidia-device-plugin-ds']},
        {'component': 'gpu-operator', 'kind': 'ClusterPolicy', 'namespace': None, 'name': 'cluster-policy', 'selector': []}]
    # managedFields are dropped, the rest is as read
    assert found['namespace'] == {'metadata': {'name': 'gpu', 'labels': OURS}}
    assert found['runtime_class'] == {'metadata': {'name': 'nvidia'}, 'handler': 'nvidia'}
    assert found['nfd_namespace'] is None and found['node_feature_crd'] is None
    assert found['node_feature_api'] is True and found['nfd_existing'] is None
    # no existing NFD asked for: no Deployment or DaemonSet read by name; the NodeFeature API asked with one item
    assert sorted(_paths(client)) == sorted([
        DAEMONSETS, POLICIES, NODE_FEATURES, '/api/v1/namespaces/gpu', '/api/v1/namespaces/nfd',
        '/apis/node.k8s.io/v1/runtimeclasses/nvidia',
        '/apis/apiextensions.k8s.io/v1/customresourcedefinitions/nodefeatures.nfd.k8s-sigs.io'])
    assert (NODE_FEATURES, {'limit': 1}) in client.asked


def test_apis_not_served_are_empty_not_errors():
    found = _read(_Client({POLICIES: None, NODE_FEATURES: None}))
    assert found['found'][0]['component'] == 'device-plugin' and len(found['found']) == 1
    assert found['node_feature_api'] is False


def test_the_existing_nfd_is_read_only_when_asked():
    client = _Client({'/apis/apps/v1/namespaces/nfd/deployments/nfd-master': {'metadata': {'name': 'nfd-master'}}})
    found = _read(client, {'namespace': 'nfd', 'master': 'nfd-master', 'worker': 'nfd-worker'})
    assert '/apis/apps/v1/namespaces/nfd/daemonsets/nfd-worker' in _paths(client)
    assert found['nfd_existing'] == {'master': {'metadata': {'name': 'nfd-master'}}, 'worker': None}


def test_one_namespace_for_both_is_read_once():
    client = _Client({'/api/v1/namespaces/gpu': {'metadata': {'name': 'gpu'}}})
    found = _read(client, nfd_namespace='gpu')
    assert found['namespace'] == found['nfd_namespace'] == {'metadata': {'name': 'gpu'}}
    assert _paths(client).count('/api/v1/namespaces/gpu') == 1


@pytest.mark.parametrize('refused, message', [
    (DAEMONSETS, 'listing DaemonSets in all namespaces: forbidden'),
    (POLICIES, 'listing GPU Operator ClusterPolicies: forbidden'),
    (NODE_FEATURES, 'listing NodeFeatures in namespace gpu: forbidden'),
    ('/api/v1/namespaces/gpu', 'reading Namespace gpu: forbidden'),
])
def test_a_refusal_other_than_404_fails_naming_the_request(refused, message):
    with pytest.raises(ApiError, match=message):
        _read(_Client(refuse=refused))


# --- what is applied already ---------------------------------------------------------------------

TEMPLATES = [('device_plugin', 'namespace.yml.j2'), ('device_plugin', 'runtime-class.yml.j2'),
             ('device_plugin', 'device-plugin.yml.j2'), ('feature_discovery', 'prerequisites.yml.j2'),
             ('feature_discovery', 'nfd.yml.j2'), ('feature_discovery', 'gfd.yml.j2')]
# every template branch on: MPS, a RuntimeClass, NFD in a namespace of its own
BRANCHES = {'gpuready_set_as_default': False,
            'gpuready_sharing': {'strategy': 'mps', 'resources': [{'name': 'nvidia.com/gpu', 'replicas': 2}]}}
RUNTIME_CLASS = {'apiVersion': 'node.k8s.io/v1', 'kind': 'RuntimeClass',
                 'metadata': {'name': 'nvidia', 'labels': OURS}, 'handler': 'nvidia'}
CONFIG = {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'cfg', 'namespace': 'gpu', 'labels': OURS},
          'data': {'config.yaml': 'version: v1\n'}}


def _live(obj, **metadata):
    """obj as the API server returns it after our apply: fingerprinted, with fields it adds."""
    live = cluster.fingerprinted(obj)
    live['metadata'].update(dict({'uid': 'u1', 'resourceVersion': '7', 'managedFields': MANAGED}, **metadata))
    return live


def test_every_kind_the_templates_render_can_be_read():
    import manifest_render
    kinds = set(obj['kind'] for role, template in TEMPLATES for obj in manifest_render.render(role, template, BRANCHES))
    assert kinds == set(cluster.RENDERED_KINDS)


def test_the_fingerprint_follows_the_object_not_its_annotation_or_key_order():
    marked = cluster.fingerprinted(RUNTIME_CLASS)
    digest = marked['metadata']['annotations'][cluster.FINGERPRINT_ANNOTATION]
    assert len(digest) == 64 and 'annotations' not in RUNTIME_CLASS['metadata']
    assert cluster.fingerprint(marked) == digest == cluster.fingerprint(dict(reversed(list(RUNTIME_CLASS.items()))))
    assert cluster.fingerprint(dict(RUNTIME_CLASS, handler='runc')) != digest
    # other annotations stay and count
    annotated = dict(RUNTIME_CLASS, metadata=dict(RUNTIME_CLASS['metadata'], annotations={'a': 'b'}))
    assert cluster.fingerprinted(annotated)['metadata']['annotations']['a'] == 'b'
    assert cluster.fingerprint(annotated) != digest


@pytest.mark.parametrize('live, rendered, held', [
    ({'a': 1, 'b': 2}, {'a': 1}, True),
    ({'a': 1}, {'a': 2}, False),
    ({}, {'a': 1}, False),
    ({'a': '1'}, {'a': 1}, False),          # no conversion: the apply would send what is rendered
    ({'a': True}, {'a': 1}, False),
    ({'l': [{'x': 1, 'y': 2}]}, {'l': [{'x': 1}]}, True),
    ({'l': [{'x': 1}, {'x': 2}]}, {'l': [{'x': 1}]}, False),   # an item added by someone else: apply
    ({'l': [1, 2]}, {'l': [2, 1]}, False),
    ({}, {'empty': {}, 'none': [], 'null': None}, True),        # what the API server drops
    ({'v': {'emptyDir': {}}}, {'v': {'emptyDir': {}}}, True),
    ({'v': 'x'}, {'v': {}}, False),
])
def test_holds(live, rendered, held):
    assert cluster.holds(live, rendered) is held


def test_to_apply_leaves_out_the_current_and_fingerprints_the_rest():
    current = [cluster.object_key(RUNTIME_CLASS)]
    assert current == ['node.k8s.io/v1 RuntimeClass nvidia']
    assert cluster.object_key(CONFIG) == 'v1 ConfigMap gpu/cfg'
    assert cluster.to_apply([RUNTIME_CLASS, CONFIG], current) == [cluster.fingerprinted(CONFIG)]
    assert cluster.to_apply([RUNTIME_CLASS], None) == [cluster.fingerprinted(RUNTIME_CLASS)]


RUNTIME_CLASS_PATH = '/apis/node.k8s.io/v1/runtimeclasses/nvidia'
CONFIG_PATH = '/api/v1/namespaces/gpu/configmaps/cfg'


def test_current_objects_are_those_the_live_ones_hold_with_the_fingerprint():
    changed = dict(CONFIG, data={'config.yaml': 'version: v1\nflags: {}\n'})
    unmarked = dict(RUNTIME_CLASS)
    cases = [
        ([_live(RUNTIME_CLASS), _live(CONFIG)], ['node.k8s.io/v1 RuntimeClass nvidia', 'v1 ConfigMap gpu/cfg']),
        ([_live(RUNTIME_CLASS), _live(changed)], ['node.k8s.io/v1 RuntimeClass nvidia']),   # the template changed
        ([unmarked, _live(CONFIG)], ['v1 ConfigMap gpu/cfg']),       # applied before fingerprints (or by others)
        ([_live(dict(RUNTIME_CLASS, handler='runc'))], []),          # another writer changed a field we set
        ([], []),                                                    # missing
    ]
    for live, current in cases:
        paths = dict(zip((RUNTIME_CLASS_PATH, CONFIG_PATH), [None, None]))
        paths.update((RUNTIME_CLASS_PATH if obj['kind'] == 'RuntimeClass' else CONFIG_PATH, obj) for obj in live)
        client = _Client(paths)
        assert _read(client, objects=[RUNTIME_CLASS, CONFIG])['current'] == current, live
        assert RUNTIME_CLASS_PATH in _paths(client) and CONFIG_PATH in _paths(client)


def test_kinds_not_rendered_and_objects_without_a_namespace_are_never_current():
    client = _Client()
    service = {'apiVersion': 'v1', 'kind': 'Service', 'metadata': {'name': 's', 'namespace': 'gpu'}}
    config = dict(CONFIG, metadata={'name': 'cfg'})
    assert _read(client, objects=[service, config])['current'] == []
    assert not [path for path in _paths(client) if 'services' in path or 'configmaps' in path]


def test_crds_are_never_current_and_carry_no_fingerprint():
    crd = {'apiVersion': 'apiextensions.k8s.io/v1', 'kind': 'CustomResourceDefinition',
           'metadata': {'name': 'nodefeatures.nfd.k8s-sigs.io'}, 'spec': {'group': 'nfd.k8s-sigs.io'}}
    path = '/apis/apiextensions.k8s.io/v1/customresourcedefinitions/nodefeatures.nfd.k8s-sigs.io'
    client = _Client({path: crd})
    assert _read(client, objects=[crd])['current'] == []
    assert cluster.fingerprinted(crd) == crd
