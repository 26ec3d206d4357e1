# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""tests/api_fault_proxy.py in front of the real kube-apiserver (the k8s_api fixture): what it forwards reaches
the server unchanged (its description of each request equals the server's audit log), watches stream through
it, and each fault does what it says: a status answered by the proxy alone, a dropped connection, a slow
answer, and a write between a client's GET and its PATCH that makes the real server answer 409."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

import pytest

from api_fault_proxy import describe

NAMESPACE = 'proxy-test'


@pytest.fixture(scope='module')
def user(k8s_api):
    """A ServiceAccount bound to cluster-admin (a ClusterRole every real cluster has), through the proxy."""
    identity = k8s_api.add_identity('proxy-user')
    k8s_api.create({'apiVersion': 'rbac.authorization.k8s.io/v1', 'kind': 'ClusterRoleBinding',
                    'metadata': {'name': 'proxy-user-admin'},
                    'roleRef': {'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'ClusterRole', 'name': 'cluster-admin'},
                    'subjects': [identity.subject]})
    k8s_api.create({'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': NAMESPACE}})
    return identity


@pytest.fixture
def core(k8s_api, user):  # pylint: disable=redefined-outer-name
    from kubernetes import client, config
    k8s_api.clear_faults()
    k8s_api.clear_requests()
    yield client.CoreV1Api(config.new_client_from_config(user.kubeconfig))
    k8s_api.clear_faults()


FIELDS = ('verb', 'group', 'resource', 'subresource', 'namespace', 'name')


def test_forwarded_requests_are_described_as_the_real_server_logs_them(k8s_api, core):
    from kubernetes import client
    config_map = {'metadata': {'name': 'cm-1'}, 'data': {'a': '1'}}
    calls = [
        ('POST', '/api/v1/namespaces/%s/configmaps' % NAMESPACE,
         lambda: core.create_namespaced_config_map(NAMESPACE, config_map)),
        ('GET', '/api/v1/namespaces/%s/configmaps/cm-1' % NAMESPACE,
         lambda: core.read_namespaced_config_map('cm-1', NAMESPACE)),
        ('GET', '/api/v1/namespaces/%s/configmaps?labelSelector=a%%3Db' % NAMESPACE,
         lambda: core.list_namespaced_config_map(NAMESPACE, label_selector='a=b')),
        ('PATCH', '/api/v1/namespaces/%s/configmaps/cm-1' % NAMESPACE,
         lambda: core.patch_namespaced_config_map('cm-1', NAMESPACE, {'data': {'a': '2'}})),
        ('GET', '/api/v1/namespaces/%s' % NAMESPACE, lambda: core.read_namespace(NAMESPACE)),
        ('GET', '/api/v1/namespaces/%s/status' % NAMESPACE, lambda: core.read_namespace_status(NAMESPACE)),
        ('GET', '/api/v1/nodes?watch=true&timeoutSeconds=1', lambda: core.list_node(watch=True, timeout_seconds=1, _preload_content=False).read()),
        ('GET', '/apis/rbac.authorization.k8s.io/v1/clusterroles/cluster-admin',
         lambda: client.RbacAuthorizationV1Api(core.api_client).read_cluster_role('cluster-admin')),
        ('DELETE', '/api/v1/namespaces/%s/configmaps/cm-1' % NAMESPACE,
         lambda: core.delete_namespaced_config_map('cm-1', NAMESPACE)),
    ]
    for _method, _path, call in calls:
        call()
    logged = [dict((f, r[f] or None) for f in FIELDS) for r in k8s_api.requests()]
    described = [dict((f, describe(method, path)[f] or None) for f in FIELDS) for method, path, _call in calls]
    # The name of an object being created is in the body, which the proxy does not read.
    assert logged[0].pop('name') == 'cm-1' and described[0].pop('name') is None
    assert logged == described


def test_a_watch_streams_through_the_proxy(k8s_api, core):
    from kubernetes import watch
    name = 'proxy-watch'
    k8s_api.create({'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': name, 'namespace': NAMESPACE}})
    listed = core.list_namespaced_config_map(NAMESPACE, field_selector='metadata.name=' + name)
    stream = watch.Watch().stream(core.list_namespaced_config_map, NAMESPACE, field_selector='metadata.name=' + name,
                                  resource_version=listed.metadata.resource_version, timeout_seconds=30)
    k8s_api.patch('v1', 'ConfigMap', name, {'data': {'seen': 'yes'}}, namespace=NAMESPACE)
    event = next(stream)
    assert (event['type'], event['object'].data) == ('MODIFIED', {'seen': 'yes'})


def test_an_injected_status_is_answered_by_the_proxy_alone(k8s_api, user, core):  # pylint: disable=redefined-outer-name
    from kubernetes.client import ApiException
    fault = k8s_api.inject(verb='get', resource='namespaces', name=NAMESPACE, status=503, count=1)
    with pytest.raises(ApiException) as raised:
        core.read_namespace(NAMESPACE)
    assert raised.value.status == 503
    assert '"reason":"ServiceUnavailable"' in raised.value.body.replace(' ', '')
    assert core.read_namespace(NAMESPACE).metadata.name == NAMESPACE  # count=1: the next one is forwarded
    assert fault.hits == 1
    asked = k8s_api.requests()
    assert [(r['verb'], r['code'], r['user']) for r in asked] == [('get', 503, user.username), ('get', 200, user.username)]
    # Only the forwarded one reached the server.
    assert [r['code'] for r in k8s_api.plane.requests() if r['time'] >= asked[0]['time']
            and r['resource'] == 'namespaces' and r['name'] == NAMESPACE] == [200]


def test_a_dropped_connection_and_a_slow_answer(k8s_api, core):
    import urllib3
    # Every try dropped: urllib3 tries a dropped GET again itself, then gives up.
    dropped = k8s_api.inject(verb='get', resource='namespaces', name=NAMESPACE, drop=True, count=None)
    with pytest.raises(urllib3.exceptions.HTTPError):
        core.read_namespace(NAMESPACE, _request_timeout=10)
    k8s_api.clear_faults()
    k8s_api.inject(verb='get', resource='namespaces', name=NAMESPACE, delay=1.5, count=1)
    started = time.monotonic()
    assert core.read_namespace(NAMESPACE).metadata.name == NAMESPACE
    assert time.monotonic() - started >= 1.5
    assert dropped.hits >= 1
    assert [r['code'] for r in k8s_api.requests() if r['resource'] == 'namespaces'] == [None] * dropped.hits + [200]


def test_a_write_between_get_and_patch_gets_the_real_conflict(k8s_api, core):
    from kubernetes.client import ApiException
    name = 'proxy-race'
    k8s_api.create({'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': name, 'namespace': NAMESPACE},
                    'data': {'a': '1'}})
    k8s_api.inject(verb='get', resource='configmaps', name=name, count=1, modify={'data': {'b': 'meanwhile'}})
    read = core.read_namespaced_config_map(name, NAMESPACE)
    assert read.data == {'a': '1'}  # what the server had when the client asked
    with pytest.raises(ApiException) as raised:
        stale = {'metadata': {'resourceVersion': read.metadata.resource_version}, 'data': {'a': '2'}}
        core.patch_namespaced_config_map(name, NAMESPACE, stale)
    assert raised.value.status == 409 and 'the object has been modified' in raised.value.body
    assert k8s_api.get('v1', 'ConfigMap', name, namespace=NAMESPACE)['data'] == {'a': '1', 'b': 'meanwhile'}
