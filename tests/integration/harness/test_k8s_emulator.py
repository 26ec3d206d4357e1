# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Kubernetes API emulator (tests/k8s_emulator) against real clients: the official ``kubernetes``
Python client over HTTPS with the generated kubeconfigs, raw HTTPS for what clients hide, and
``ansible-playbook`` running kubernetes.core.k8s / k8s_info.

One emulator for the module (started with 1,000 Node objects for pagination); every test makes
its own objects with its own names, and faults are cleared after each test.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import http.client
import http.server
import json
import os
import ssl
import threading
import time

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import dynamic, watch
from kubernetes.client.rest import ApiException

from k8s_emulator import Emulator
from k8s_emulator.client import https_request
from k8s_emulator.pki import CertificateAuthority
from playbook import run_tasks

BENCH_NODES = 1000


@pytest.fixture(scope='module')
def emu(k8s_api):
    """The run's shared emulator (conftest), with 1,000 API-only nodes of our own."""
    k8s_api.add_nodes(BENCH_NODES, prefix='node-', labels={'emulator.test/bench': 'yes'})
    return k8s_api


@pytest.fixture(autouse=True)
def _no_leftover_faults(request):
    yield
    if 'emu' in request.fixturenames:
        request.getfixturevalue('emu').clear_faults()


def api_client(kubeconfig):
    return k8s_config.new_client_from_config(config_file=kubeconfig)


@pytest.fixture(scope='module')
def admin(emu):
    return api_client(emu.kubeconfig('admin'))


@pytest.fixture(scope='module')
def core(admin):
    return k8s.CoreV1Api(admin)


@pytest.fixture(scope='module')
def apps(admin):
    return k8s.AppsV1Api(admin)


def status_of(exc):
    """The Status object an ApiException carries."""
    return json.loads(exc.body)


def raw_response(emu, method, path, token=None, body=None, content_type='application/json', context=None, host=None,
                 decode=True):
    """One HTTPS request without a Kubernetes client: (status, response, decoded JSON or text)."""
    port = int(emu.url.rsplit(':', 1)[1])
    response, payload = https_request(host or '127.0.0.1', port, context or emu.ssl_context(), method, path,
                                      token=token, body=body, content_type=content_type)
    if decode and response.getheader('Content-Type', '').startswith('application/json'):
        return response.status, response, json.loads(payload.decode('utf-8'))
    return response.status, response, payload.decode('utf-8')


def raw(emu, method, path, **kwargs):
    """(status, decoded body) of raw_response."""
    answer = raw_response(emu, method, path, **kwargs)
    return answer[0], answer[2]


def admin_token(emu):
    with open(emu.kubeconfig('admin')) as handle:
        return json.load(handle)['users'][0]['user']['token']


def node(name, labels=None, status=None):
    body = {'apiVersion': 'v1', 'kind': 'Node', 'metadata': {'name': name, 'labels': labels or {}}}
    if status is not None:
        body['status'] = status
    return body


def namespace(emu, name):
    if not emu.exists('v1', 'Namespace', name):
        emu.create({'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': name}})
    return name


def daemonset(name, ns, image='registry.example/plugin:1'):
    return {'apiVersion': 'apps/v1', 'kind': 'DaemonSet', 'metadata': {'name': name, 'namespace': ns},
            'spec': {'selector': {'matchLabels': {'app': name}},
                     'template': {'metadata': {'labels': {'app': name}},
                                  'spec': {'containers': [
                                      {'name': 'plugin', 'image': image, 'env': [{'name': 'A', 'value': '1'}]},
                                      {'name': 'sidecar', 'image': 'registry.example/sidecar:1'}]}}}}


# -- transport and authentication -------------------------------------------------------------


def test_tls_is_verified_with_the_generated_ca_and_fails_with_another(emu, tmp_path):
    code, body = raw(emu, 'GET', '/version')
    assert code == 200 and body['gitVersion'] == 'v1.31.0'
    # The server certificate names localhost too.
    assert raw(emu, 'GET', '/version', host='localhost')[0] == 200
    other_ca = CertificateAuthority.create(str(tmp_path))
    with pytest.raises(ssl.SSLCertVerificationError):
        raw(emu, 'GET', '/version', context=ssl.create_default_context(cafile=other_ca.cert_path))
    # The official client with a kubeconfig that trusts the other CA refuses to talk.
    with open(emu.kubeconfig('admin')) as handle:
        config = json.load(handle)
    config['clusters'][0]['cluster']['certificate-authority'] = other_ca.cert_path
    wrong = tmp_path / 'wrong-ca.kubeconfig'
    wrong.write_text(json.dumps(config))
    with pytest.raises(Exception) as failure:
        k8s.VersionApi(api_client(str(wrong))).get_code()
    assert 'CERTIFICATE_VERIFY_FAILED' in str(failure.value)


def test_version_is_public_everything_else_needs_credentials(emu, admin):
    assert k8s.VersionApi(admin).get_code().git_version == 'v1.31.0'
    for path in ('/api/v1', '/apis', '/api/v1/nodes'):
        code, body = raw(emu, 'GET', path)
        assert (code, body['kind'], body['reason']) == (401, 'Status', 'Unauthorized'), path


def test_bearer_token_auth_and_a_wrong_token_is_401_without_echo(emu):
    ops = emu.add_identity('token-user', groups=['system:masters'])
    assert ops.token and os.path.exists(ops.token_file) and ops.cert is None
    core = k8s.CoreV1Api(api_client(ops.kubeconfig))
    emu.clear_requests()
    core.read_namespace('default')
    assert [(r['verb'], r['resource'], r['name'], r['user']) for r in emu.requests()] == [
        ('get', 'namespaces', 'default', 'token-user')]
    bad_token = 'not-' + ops.token
    code, body = raw(emu, 'GET', '/api/v1/namespaces/default', token=bad_token)
    assert (code, body['reason'], body['message']) == (401, 'Unauthorized', 'Unauthorized')
    assert bad_token not in json.dumps(body)


def test_client_certificate_auth_takes_user_and_groups_from_the_certificate(emu):
    crb = {'apiVersion': 'rbac.authorization.k8s.io/v1', 'kind': 'ClusterRoleBinding',
           'metadata': {'name': 'cert-readers'},
           'roleRef': {'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'ClusterRole', 'name': 'cluster-admin'},
           'subjects': [{'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'Group', 'name': 'gpu-operators'}]}
    emu.create(crb)
    alice = emu.add_identity('alice', groups=['gpu-operators'], token=False, client_cert=True)
    assert alice.token is None and os.path.exists(alice.cert) and os.path.exists(alice.key)
    with open(alice.kubeconfig) as handle:
        assert 'token' not in handle.read()
    emu.clear_requests()
    k8s.CoreV1Api(api_client(alice.kubeconfig)).list_namespace()
    assert [(r['verb'], r['resource'], r['user']) for r in emu.requests()] == [('list', 'namespaces', 'alice')]
    # Without the group binding the same certificate is just a user without rights.
    bob = emu.add_identity('bob', groups=['nobody'], token=False, client_cert=True)
    with pytest.raises(ApiException) as denied:
        k8s.CoreV1Api(api_client(bob.kubeconfig)).list_namespace()
    assert denied.value.status == 403


# -- authorization ----------------------------------------------------------------------------


def test_rbac_allows_exactly_what_the_cluster_role_grants(emu, core):
    emu.create({'apiVersion': 'rbac.authorization.k8s.io/v1', 'kind': 'ClusterRole',
                'metadata': {'name': 'node-labeler'},
                'rules': [{'apiGroups': [''], 'resources': ['nodes'], 'verbs': ['get', 'list', 'patch']}]})
    emu.create({'apiVersion': 'rbac.authorization.k8s.io/v1', 'kind': 'ClusterRoleBinding',
                'metadata': {'name': 'node-labeler'},
                'roleRef': {'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'ClusterRole', 'name': 'node-labeler'},
                'subjects': [{'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'User', 'name': 'labeler'}]})
    core.create_node(node('rbac-n1'))
    labeler = k8s.CoreV1Api(api_client(emu.add_identity('labeler').kubeconfig))

    assert labeler.read_node('rbac-n1').metadata.name == 'rbac-n1'
    assert labeler.list_node(label_selector='kubernetes.io/hostname=node-00007').items[0].metadata.name == 'node-00007'
    patched = labeler.patch_node('rbac-n1', {'metadata': {'labels': {'nvidia.com/gpu.present': 'true'}}})
    assert patched.metadata.labels['nvidia.com/gpu.present'] == 'true'

    denials = [
        (lambda: labeler.delete_node('rbac-n1'),
         'nodes "rbac-n1" is forbidden: User "labeler" cannot delete resource "nodes" in API group "" at the '
         'cluster scope'),
        (lambda: labeler.patch_node_status('rbac-n1', {'status': {'capacity': {'nvidia.com/gpu': '1'}}}),
         'nodes "rbac-n1" is forbidden: User "labeler" cannot patch resource "nodes/status" in API group "" at '
         'the cluster scope'),
        (lambda: labeler.list_namespaced_pod('default'),
         'pods is forbidden: User "labeler" cannot list resource "pods" in API group "" in the namespace "default"'),
        (lambda: k8s.AppsV1Api(labeler.api_client).list_daemon_set_for_all_namespaces(),
         'daemonsets.apps is forbidden: User "labeler" cannot list resource "daemonsets" in API group "apps" at '
         'the cluster scope'),
    ]
    for call, message in denials:
        with pytest.raises(ApiException) as denied:
            call()
        status = status_of(denied.value)
        assert (denied.value.status, status['reason'], status['message']) == (403, 'Forbidden', message)
    assert core.read_node('rbac-n1').metadata.name == 'rbac-n1'  # the denied delete did nothing

    # `kubectl auth can-i`: a SelfSubjectAccessReview answered by the same authorizer.
    def can_i(verb, subresource=None):
        return k8s.AuthorizationV1Api(labeler.api_client).create_self_subject_access_review({'spec': {
            'resourceAttributes': {'verb': verb, 'resource': 'nodes', 'subresource': subresource,
                                   'name': 'rbac-n1'}}}).status

    allowed = can_i('patch')
    assert allowed.allowed and 'ClusterRoleBinding "node-labeler"' in allowed.reason
    assert not can_i('delete').allowed and not can_i('patch', 'status').allowed


def test_rbac_role_binding_grants_only_in_its_namespace(emu, core):
    for ns in ('team-a', 'team-b'):
        namespace(emu, ns)
        core.create_namespaced_config_map(ns, {'metadata': {'name': 'settings'}})
    emu.create({'apiVersion': 'rbac.authorization.k8s.io/v1', 'kind': 'Role',
                'metadata': {'name': 'cm-reader', 'namespace': 'team-a'},
                'rules': [{'apiGroups': [''], 'resources': ['configmaps'], 'verbs': ['get'],
                           'resourceNames': ['settings']}]})
    emu.create({'apiVersion': 'rbac.authorization.k8s.io/v1', 'kind': 'RoleBinding',
                'metadata': {'name': 'cm-reader', 'namespace': 'team-a'},
                'roleRef': {'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'Role', 'name': 'cm-reader'},
                'subjects': [{'kind': 'ServiceAccount', 'name': 'reader', 'namespace': 'team-a'}]})
    reader = k8s.CoreV1Api(api_client(emu.add_identity('system:serviceaccount:team-a:reader').kubeconfig))
    assert reader.read_namespaced_config_map('settings', 'team-a').metadata.name == 'settings'
    user = 'system:serviceaccount:team-a:reader'
    for call, message in (
            (lambda: reader.read_namespaced_config_map('settings', 'team-b'),
             'configmaps "settings" is forbidden: User "%s" cannot get resource "configmaps" in API group "" in the '
             'namespace "team-b"' % user),
            (lambda: reader.list_namespaced_config_map('team-a'),  # resourceNames never grant a list
             'configmaps is forbidden: User "%s" cannot list resource "configmaps" in API group "" in the namespace '
             '"team-a"' % user)):
        with pytest.raises(ApiException) as denied:
            call()
        assert (denied.value.status, status_of(denied.value)['message']) == (403, message)


# -- reads and writes -------------------------------------------------------------------------


def test_discovery_is_enough_for_the_dynamic_client(admin):
    dyn = dynamic.DynamicClient(admin)
    nodes = dyn.resources.get(api_version='v1', kind='Node')
    assert nodes.namespaced is False and set(nodes.subresources) == {'status'}
    pods = dyn.resources.get(api_version='v1', kind='Pod')
    assert {'status', 'log'} <= set(pods.subresources)
    ds = dyn.resources.get(api_version='apps/v1', kind='DaemonSet')
    assert ds.namespaced and 'ds' in ds.short_names
    assert dyn.resources.get(api_version='nfd.k8s-sigs.io/v1alpha1', kind='NodeFeature').namespaced
    listed = nodes.get(label_selector='kubernetes.io/hostname=node-00003')
    assert listed.kind == 'NodeList' and [i.metadata.name for i in listed.items] == ['node-00003']


def test_crud_conflicts_and_validation(emu, core):
    ns = namespace(emu, 'crud')
    created = core.create_namespaced_config_map(ns, {'metadata': {'name': 'cm', 'labels': {'a': '1'}},
                                                     'data': {'k': 'v'}})
    meta = created.metadata
    assert meta.uid and meta.resource_version and meta.creation_timestamp and meta.namespace == ns

    with pytest.raises(ApiException) as exists:
        core.create_namespaced_config_map(ns, {'metadata': {'name': 'cm'}})
    assert (exists.value.status, status_of(exists.value)['reason'],
            status_of(exists.value)['message']) == (409, 'AlreadyExists', 'configmaps "cm" already exists')

    created.data = {'k': 'v2'}
    updated = core.replace_namespaced_config_map('cm', ns, created)
    assert int(updated.metadata.resource_version) > int(meta.resource_version)
    assert updated.metadata.uid == meta.uid and updated.data == {'k': 'v2'}
    created.data = {'k': 'stale'}  # still carries the first resourceVersion
    with pytest.raises(ApiException) as stale:
        core.replace_namespaced_config_map('cm', ns, created)
    assert (stale.value.status, status_of(stale.value)['reason'], status_of(stale.value)['message']) == (
        409, 'Conflict', 'Operation cannot be fulfilled on configmaps "cm": the object has been modified; please '
                         'apply your changes to the latest version and try again')

    # A write that changes nothing keeps the resourceVersion (no new revision).
    same = core.patch_namespaced_config_map('cm', ns, {'data': {'k': 'v2'}})
    assert same.metadata.resource_version == updated.metadata.resource_version

    dry = core.create_namespaced_config_map(ns, {'metadata': {'name': 'dry'}}, dry_run='All')
    assert dry.metadata.name == 'dry' and not emu.exists('v1', 'ConfigMap', 'dry', ns)

    generated = core.create_namespaced_config_map(ns, {'metadata': {'generateName': 'gen-'}})
    assert generated.metadata.name.startswith('gen-') and len(generated.metadata.name) == 9

    with pytest.raises(ApiException) as missing_ns:
        core.create_namespaced_config_map('no-such-ns', {'metadata': {'name': 'x'}})
    assert (missing_ns.value.status, status_of(missing_ns.value)['message']) == (404, 'namespaces "no-such-ns" not found')

    for bad in ({'name': 'Bad_Name'}, {'name': 'ok', 'labels': {'bad key!': 'v'}},
                {'name': 'ok', 'labels': {'k': 'bad value!'}}, {'name': 'ok', 'labels': {'k': 'x' * 64}}):
        with pytest.raises(ApiException) as invalid:
            core.create_namespaced_config_map(ns, {'metadata': bad})
        status = status_of(invalid.value)
        assert (invalid.value.status, status['reason']) == (422, 'Invalid'), bad
        assert status['details']['causes'][0]['field'] in ('metadata.name', 'metadata.labels')

    core.delete_namespaced_config_map('cm', ns)
    for call in (lambda: core.read_namespaced_config_map('cm', ns), lambda: core.delete_namespaced_config_map('cm', ns)):
        with pytest.raises(ApiException) as gone:
            call()
        assert (gone.value.status, status_of(gone.value)['message']) == (404, 'configmaps "cm" not found')


def test_all_namespaces_list_and_namespace_deletion_takes_its_objects(emu, core):
    for ns in ('multi-a', 'multi-b'):
        namespace(emu, ns)
        core.create_namespaced_pod(ns, {'metadata': {'name': 'p', 'labels': {'suite': 'multi'}},
                                        'spec': {'containers': [{'name': 'c', 'image': 'busybox'}]}})
    pods = core.list_pod_for_all_namespaces(label_selector='suite=multi').items
    assert [(p.metadata.namespace, p.metadata.name) for p in pods] == [('multi-a', 'p'), ('multi-b', 'p')]
    core.delete_namespace('multi-a')
    assert [p.metadata.namespace for p in core.list_pod_for_all_namespaces(label_selector='suite=multi').items] == [
        'multi-b']


def test_merge_strategic_and_json_patch(emu, core, apps):
    ns = namespace(emu, 'patching')
    apps.create_namespaced_daemon_set(ns, daemonset('plugin', ns))

    # Strategic merge: containers merge by name, env by name; other lists are replaced.
    result = apps.patch_namespaced_daemon_set('plugin', ns, {'spec': {'template': {'spec': {
        'containers': [{'name': 'plugin', 'image': 'registry.example/plugin:2', 'env': [{'name': 'B', 'value': '2'}]}],
        'tolerations': [{'operator': 'Exists'}]}}}})
    containers = result.spec.template.spec.containers
    assert [(c.name, c.image) for c in containers] == [('plugin', 'registry.example/plugin:2'),
                                                       ('sidecar', 'registry.example/sidecar:1')]
    assert [e.name for e in containers[0].env] == ['A', 'B']
    assert result.metadata.generation == 2
    assert emu.requests()[-1]['content_type'] == 'application/strategic-merge-patch+json'
    result = apps.patch_namespaced_daemon_set('plugin', ns, {'spec': {'template': {'spec': {
        'containers': [{'name': 'sidecar', '$patch': 'delete'}]}}}})
    assert [c.name for c in result.spec.template.spec.containers] == ['plugin']

    # Merge patch (RFC 7386): lists are replaced, null removes.
    emu.create(node('patch-n1', labels={'keep': 'yes', 'drop': 'yes'}))
    merged = core.patch_node('patch-n1', {'metadata': {'labels': {'drop': None, 'new': 'yes'}}},
                             _content_type='application/merge-patch+json')
    mine = dict((k, v) for k, v in merged.metadata.labels.items() if k in ('keep', 'drop', 'new'))
    assert mine == {'keep': 'yes', 'new': 'yes'}
    replaced = apps.patch_namespaced_daemon_set('plugin', ns, {'spec': {'template': {'spec': {
        'containers': [{'name': 'only', 'image': 'x'}]}}}}, _content_type='application/merge-patch+json')
    assert [c.name for c in replaced.spec.template.spec.containers] == ['only']

    # JSON patch, and a failed test operation is 422.
    patched = core.patch_node('patch-n1', [{'op': 'add', 'path': '/metadata/labels/json', 'value': 'yes'},
                                           {'op': 'test', 'path': '/metadata/labels/keep', 'value': 'yes'}])
    assert patched.metadata.labels['json'] == 'yes'
    with pytest.raises(ApiException) as failed:
        core.patch_node('patch-n1', [{'op': 'test', 'path': '/metadata/labels/keep', 'value': 'no'},
                                     {'op': 'remove', 'path': '/metadata/labels/keep'}])
    assert failed.value.status == 422 and core.read_node('patch-n1').metadata.labels['keep'] == 'yes'

    # A resourceVersion in a patch is a precondition.
    stale = merged.metadata.resource_version
    with pytest.raises(ApiException) as conflict:
        core.patch_node('patch-n1', {'metadata': {'resourceVersion': stale, 'labels': {'x': 'y'}}},
                        _content_type='application/merge-patch+json')
    assert (conflict.value.status, status_of(conflict.value)['reason']) == (409, 'Conflict')

    # Custom resources take merge and JSON patches; strategic merge is 415 as on a real cluster.
    feature = {'apiVersion': 'nfd.k8s-sigs.io/v1alpha1', 'kind': 'NodeFeature',
               'metadata': {'name': 'patch-n1', 'namespace': ns}, 'spec': {'labels': {'a': '1'}}}
    emu.create(feature)
    custom = k8s.CustomObjectsApi(core.api_client)
    out = custom.patch_namespaced_custom_object('nfd.k8s-sigs.io', 'v1alpha1', ns, 'nodefeatures', 'patch-n1',
                                                {'spec': {'labels': {'b': '2'}}})
    assert out['spec']['labels'] == {'a': '1', 'b': '2'} and out['metadata']['generation'] == 2
    code, body = raw(emu, 'PATCH', '/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/%s/nodefeatures/patch-n1' % ns,
                     token=admin_token(emu), body={'spec': {}}, content_type='application/strategic-merge-patch+json')
    assert (code, body['reason']) == (415, 'UnsupportedMediaType')


def test_label_and_field_selectors(emu, core):
    emu.create(node('sel-a', {'suite': 'sel', 'gpu': 'a100', 'zone': 'z1'}))
    emu.create(node('sel-b', {'suite': 'sel', 'gpu': 'h100', 'zone': 'z2'}))
    emu.create(node('sel-c', {'suite': 'sel', 'zone': 'z1'}))

    def names(selector):
        return [n.metadata.name for n in core.list_node(label_selector='suite=sel,' + selector).items]

    assert names('gpu=a100') == ['sel-a']
    assert names('gpu==h100') == ['sel-b']
    assert names('gpu!=a100') == ['sel-b', 'sel-c']
    assert names('gpu in (a100, h100)') == ['sel-a', 'sel-b']
    assert names('gpu notin (a100)') == ['sel-b', 'sel-c']
    assert names('gpu') == ['sel-a', 'sel-b']
    assert names('!gpu') == ['sel-c']
    assert names('zone=z1,gpu') == ['sel-a']
    assert [n.metadata.name for n in core.list_node(field_selector='metadata.name=sel-b').items] == ['sel-b']
    with pytest.raises(ApiException) as bad:
        core.list_node(label_selector='gpu in (a100')
    assert bad.value.status == 400

    ns = namespace(emu, 'fields')
    for name, node_name in (('on-a', 'sel-a'), ('on-b', 'sel-b')):
        core.create_namespaced_pod(ns, {'metadata': {'name': name},
                                        'spec': {'nodeName': node_name,
                                                 'containers': [{'name': 'c', 'image': 'busybox'}]}})
    core.patch_namespaced_pod_status('on-b', ns, {'status': {'phase': 'Running'}})
    assert [p.metadata.name for p in core.list_namespaced_pod(ns, field_selector='spec.nodeName=sel-a').items] == [
        'on-a']
    assert [p.metadata.name for p in core.list_namespaced_pod(ns, field_selector='status.phase!=Running').items] == [
        'on-a']
    assert [p.metadata.name for p in core.list_pod_for_all_namespaces(
        field_selector='metadata.namespace=%s,status.phase==Running' % ns).items] == ['on-b']
    with pytest.raises(ApiException) as unsupported:
        core.list_node(field_selector='spec.podCIDR=x')
    assert (unsupported.value.status, status_of(unsupported.value)['message']) == (
        400, 'field label not supported: spec.podCIDR')


def test_pagination_over_1000_nodes(emu, core):
    selector = 'emulator.test/bench=yes'  # this module's nodes only
    names, token, remaining = [], None, []
    while True:
        page = core.list_node(limit=300, _continue=token, label_selector=selector)
        names.extend(n.metadata.name for n in page.items)
        token = page.metadata._continue
        if not token:
            break
    assert names == ['node-%05d' % i for i in range(BENCH_NODES)]

    page = core.list_node(limit=400)
    while page.metadata._continue:
        remaining.append(page.metadata.remaining_item_count)
        page = core.list_node(limit=400, _continue=page.metadata._continue)
    assert remaining and remaining[0] > remaining[-1] > 0
    code, body = raw(emu, 'GET', '/api/v1/nodes?limit=10&continue=garbage', token=admin_token(emu))
    assert (code, body['reason']) == (400, 'BadRequest')

    # The raw paged list over HTTPS (speed is measured in bench/, not asserted here).
    port = int(emu.url.rsplit(':', 1)[1])
    conn = http.client.HTTPSConnection('127.0.0.1', port, context=emu.ssl_context())
    headers = {'Authorization': 'Bearer %s' % admin_token(emu)}
    seen, token = 0, ''
    while True:
        conn.request('GET', '/api/v1/nodes?limit=250' + ('&continue=' + token if token else ''), headers=headers)
        body = json.loads(conn.getresponse().read())
        seen += len(body['items'])
        token = body['metadata'].get('continue')
        if not token:
            break
    conn.close()
    assert body['kind'] == 'NodeList' and 'kind' not in body['items'][0]  # built-in list items carry no kind
    assert seen >= BENCH_NODES


def test_watch_from_a_resource_version_sees_added_modified_deleted(emu, core):
    ns = namespace(emu, 'watching')
    start = core.list_namespaced_config_map(ns).metadata.resource_version
    core.create_namespaced_config_map(ns, {'metadata': {'name': 'w', 'labels': {'w': '1'}}})
    core.patch_namespaced_config_map('w', ns, {'data': {'k': 'v'}})
    core.patch_namespaced_config_map('w', ns, {'metadata': {'labels': {'w': None}}})  # leaves the selector
    core.delete_namespaced_config_map('w', ns)
    core.create_namespaced_config_map('default', {'metadata': {'name': 'elsewhere', 'labels': {'w': '1'}}})

    def events(**kwargs):
        seen, stream = [], watch.Watch()
        for event in stream.stream(core.list_namespaced_config_map, ns, resource_version=start, timeout_seconds=5,
                                   **kwargs):
            seen.append((event['type'], event['object'].metadata.name, event['object'].data))
            if event['type'] == 'DELETED':
                stream.stop()
        return seen

    assert events() == [('ADDED', 'w', None), ('MODIFIED', 'w', {'k': 'v'}), ('MODIFIED', 'w', {'k': 'v'}),
                        ('DELETED', 'w', {'k': 'v'})]
    # With a label selector, leaving the selection is a DELETED event.
    assert events(label_selector='w=1') == [('ADDED', 'w', None), ('MODIFIED', 'w', {'k': 'v'}),
                                            ('DELETED', 'w', {'k': 'v'})]
    # The event stream itself: chunked JSON lines, objects with kind, and timeoutSeconds ends it.
    started = time.monotonic()
    path = '/api/v1/namespaces/%s/configmaps?watch=1&resourceVersion=%s&timeoutSeconds=1' % (ns, start)
    code, response, text = raw_response(emu, 'GET', path, token=admin_token(emu), decode=False)
    assert code == 200 and response.getheader('Transfer-Encoding') == 'chunked'
    lines = [json.loads(line) for line in text.splitlines()]
    assert [e['type'] for e in lines] == ['ADDED', 'MODIFIED', 'MODIFIED', 'DELETED']
    assert lines[0]['object']['kind'] == 'ConfigMap' and time.monotonic() - started >= 1  # held open until the timeout


def test_status_subresource_semantics(emu, core, apps):
    created = core.create_node(node('status-n1', status={'capacity': {'cpu': '4'}}))
    assert created.status.capacity == {'cpu': '4'}  # nodes keep status on create
    # A write to the main resource keeps the stored status ...
    body = core.read_node('status-n1')
    body.status.capacity = {'cpu': '99'}
    body.metadata.labels = {'main': 'write'}
    out = core.replace_node('status-n1', body)
    assert out.status.capacity == {'cpu': '4'} and out.metadata.labels == {'main': 'write'}
    # ... and a write to /status changes nothing but status.
    out = core.patch_node_status('status-n1', {'metadata': {'labels': {'ignored': 'yes'}},
                                               'status': {'capacity': {'nvidia.com/gpu': '8'}}})
    assert out.status.capacity == {'cpu': '4', 'nvidia.com/gpu': '8'} and out.metadata.labels == {'main': 'write'}

    ns = namespace(emu, 'status')
    spec = daemonset('ds', ns)
    spec['status'] = {'numberReady': 5, 'desiredNumberScheduled': 5, 'currentNumberScheduled': 5,
                      'numberMisscheduled': 0}
    ds = apps.create_namespaced_daemon_set(ns, spec)
    assert ds.status.number_ready == 0 and ds.metadata.generation == 1  # status is the controller's
    ds = apps.patch_namespaced_daemon_set_status('ds', ns, {'status': {'numberReady': 3, 'observedGeneration': 1}})
    assert ds.status.number_ready == 3 and ds.metadata.generation == 1
    ds = apps.patch_namespaced_daemon_set('ds', ns, {'status': {'numberReady': 9}, 'metadata': {'labels': {'l': '1'}}})
    assert ds.status.number_ready == 3 and ds.metadata.labels == {'l': '1'} and ds.metadata.generation == 1
    ds = apps.patch_namespaced_daemon_set('ds', ns, {'spec': {'template': {'spec': {'containers': [
        {'name': 'plugin', 'image': 'registry.example/plugin:3'}]}}}})
    assert ds.metadata.generation == 2
    pod = core.create_namespaced_pod(ns, {'metadata': {'name': 'p'},
                                          'spec': {'containers': [{'name': 'c', 'image': 'busybox'}]}})
    assert (pod.status.phase, pod.status.qos_class) == ('Pending', 'BestEffort')


def test_pod_log_comes_from_the_control_api(emu, core):
    ns = namespace(emu, 'logs')
    core.create_namespaced_pod(ns, {'metadata': {'name': 'plugin'},
                                    'spec': {'containers': [{'name': 'c', 'image': 'busybox'}]}})
    emu.set_pod_log(ns, 'plugin', 'line 1\nline 2\nline 3\n')
    assert core.read_namespaced_pod_log('plugin', ns) == 'line 1\nline 2\nline 3\n'
    assert core.read_namespaced_pod_log('plugin', ns, tail_lines=1) == 'line 3\n'
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_pod_log('nope', ns)
    assert missing.value.status == 404


class FakeKubelet:
    """A kubelet stand-in: plain HTTP on 127.0.0.1, records the paths asked for, answers `reply`."""

    def __init__(self):
        kubelet = self
        self.paths = []
        self.reply = (200, '')

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # pylint: disable=invalid-name
                kubelet.paths.append(self.path)
                code, text = kubelet.reply
                data = text.encode('utf-8')
                self.send_response(code)
                self.send_header('Content-Type', 'text/plain')
                self.send_header('Content-Length', str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format, *args):  # pylint: disable=redefined-builtin
                pass

        self.server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


@pytest.fixture
def kubelet():
    stand_in = FakeKubelet()
    yield stand_in
    stand_in.stop()


def test_pod_log_is_proxied_to_the_kubelet_of_the_pods_node(emu, core, kubelet):
    ns = namespace(emu, 'kubelet-logs')
    emu.create(node('kubelet-n1', status={'addresses': [{'type': 'Hostname', 'address': 'kubelet-n1'},
                                                        {'type': 'InternalIP', 'address': '127.0.0.1'}],
                                          'daemonEndpoints': {'kubeletEndpoint': {'Port': kubelet.port}}}))
    emu.create(node('kubelet-n2'))  # publishes no kubelet port
    for name, node_name, containers in (('one', 'kubelet-n1', ['c']), ('two', 'kubelet-n1', ['a', 'b']),
                                        ('stored', 'kubelet-n2', ['c'])):
        core.create_namespaced_pod(ns, {'metadata': {'name': name}, 'spec': {
            'nodeName': node_name, 'initContainers': [{'name': 'init', 'image': 'busybox'}],
            'containers': [{'name': c, 'image': 'busybox'} for c in containers]}})
    emu.set_pod_log(ns, 'one', 'not what the kubelet says\n')

    kubelet.reply = (200, 'from the kubelet 1\nfrom the kubelet 2\n')
    assert core.read_namespaced_pod_log('one', ns) == 'from the kubelet 1\nfrom the kubelet 2\n'
    core.read_namespaced_pod_log('one', ns, tail_lines=5, previous=True, timestamps=False)
    assert core.read_namespaced_pod_log('two', ns, container='b') == 'from the kubelet 1\nfrom the kubelet 2\n'
    assert kubelet.paths == ['/containerLogs/%s/one/c' % ns, '/containerLogs/%s/one/c?tailLines=5&previous=true' % ns,
                             '/containerLogs/%s/two/b' % ns]

    kubelet.reply = (400, 'previous terminated container "c" in pod "one" not found\n')
    failures = [
        (lambda: core.read_namespaced_pod_log('one', ns, previous=True),
         (400, 'BadRequest', 'previous terminated container "c" in pod "one" not found')),
        (lambda: core.read_namespaced_pod_log('two', ns),
         (400, 'BadRequest', 'a container name must be specified for pod two, choose one of: [init a b]')),
        (lambda: core.read_namespaced_pod_log('two', ns, container='nope'),
         (400, 'BadRequest', 'container nope is not valid for pod two')),
        (lambda: core.read_namespaced_pod_log('ghost', ns), (404, 'NotFound', 'pods "ghost" not found')),
    ]
    for call, expected in failures:
        with pytest.raises(ApiException) as failed:
            call()
        status = status_of(failed.value)
        assert (failed.value.status, status['reason'], status['message']) == expected
    assert len(kubelet.paths) == 4  # only the first failure reached the kubelet

    kubelet.stop()
    with pytest.raises(ApiException) as down:
        core.read_namespaced_pod_log('one', ns)
    status = status_of(down.value)
    assert (down.value.status, status['reason'], status['message']) == (
        500, 'InternalError', 'Get "http://127.0.0.1:%d/containerLogs/%s/one/c": dial tcp 127.0.0.1:%d: connect: '
                              'connection refused' % (kubelet.port, ns, kubelet.port))

    # Without a kubelet port on its node, a pod's log is still what the control API set.
    emu.set_pod_log(ns, 'stored', 'stored 1\nstored 2\n')
    assert core.read_namespaced_pod_log('stored', ns, tail_lines=1) == 'stored 2\n'


def test_pod_binding_assigns_the_node_once_and_needs_rbac(emu, core):
    ns = namespace(emu, 'binding')
    for name in ('unbound', 'second', 'third'):
        core.create_namespaced_pod(ns, {'metadata': {'name': name},
                                        'spec': {'containers': [{'name': 'c', 'image': 'busybox'}]}})
    start = core.list_namespaced_pod(ns).metadata.resource_version

    def binding(name, node_name='bind-n1'):
        return {'apiVersion': 'v1', 'kind': 'Binding', 'metadata': {'name': name},
                'target': {'apiVersion': 'v1', 'kind': 'Node', 'name': node_name}}

    # The official client cannot read the Success Status as a V1Binding, so schedulers skip decoding.
    answer = core.create_namespaced_pod_binding('unbound', ns, binding('unbound'), _preload_content=False)
    assert (answer.status, json.loads(answer.data)) == (201, {'kind': 'Status', 'apiVersion': 'v1', 'metadata': {},
                                                              'status': 'Success', 'code': 201})
    pod = core.read_namespaced_pod('unbound', ns)
    assert pod.spec.node_name == 'bind-n1' and int(pod.metadata.resource_version) > int(start)
    assert [(c.type, c.status) for c in pod.status.conditions] == [('PodScheduled', 'True')]
    stream = watch.Watch()
    for event in stream.stream(core.list_namespaced_pod, ns, resource_version=start, timeout_seconds=5):
        assert (event['type'], event['object'].metadata.name, event['object'].spec.node_name) == (
            'MODIFIED', 'unbound', 'bind-n1')
        stream.stop()

    failures = [
        (lambda: core.create_namespaced_pod_binding('unbound', ns, binding('unbound', 'bind-n2')),
         (409, 'Conflict', 'Operation cannot be fulfilled on pods "unbound": pod unbound is already assigned to node '
                           '"bind-n1"')),
        (lambda: core.create_namespaced_pod_binding('ghost', ns, binding('ghost')),
         (404, 'NotFound', 'pods "ghost" not found')),
        (lambda: core.create_namespaced_pod_binding('third', ns, dict(binding('third'), target={'kind': 'Node'})),
         (422, 'Invalid', 'Binding "third" is invalid: target.name: Required value')),
    ]
    for call, expected in failures:
        with pytest.raises(ApiException) as failed:
            call()
        status = status_of(failed.value)
        assert (failed.value.status, status['reason'], status['message']) == expected
    assert core.read_namespaced_pod('unbound', ns).spec.node_name == 'bind-n1'
    assert core.read_namespaced_pod('third', ns).spec.node_name is None

    binder = k8s.CoreV1Api(api_client(emu.add_identity('test-binder').kubeconfig))
    with pytest.raises(ApiException) as denied:
        binder.create_namespaced_pod_binding('second', ns, binding('second'))
    assert (denied.value.status, status_of(denied.value)['message']) == (
        403, 'pods "second" is forbidden: User "test-binder" cannot create resource "pods/binding" in API group "" '
             'in the namespace "binding"')
    emu.create({'apiVersion': 'rbac.authorization.k8s.io/v1', 'kind': 'ClusterRole',
                'metadata': {'name': 'test-binder'},
                'rules': [{'apiGroups': [''], 'resources': ['pods/binding'], 'verbs': ['create']}]})
    emu.create({'apiVersion': 'rbac.authorization.k8s.io/v1', 'kind': 'ClusterRoleBinding',
                'metadata': {'name': 'test-binder'},
                'roleRef': {'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'ClusterRole', 'name': 'test-binder'},
                'subjects': [{'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'User', 'name': 'test-binder'}]})
    assert binder.create_namespaced_pod_binding('second', ns, binding('second', 'bind-n2'),
                                                _preload_content=False).status == 201
    assert core.read_namespaced_pod('second', ns).spec.node_name == 'bind-n2'

    code, discovery = raw(emu, 'GET', '/api/v1', token=admin_token(emu))
    entry = next(r for r in discovery['resources'] if r['name'] == 'pods/binding')
    assert code == 200 and (entry['kind'], entry['verbs'], entry['namespaced']) == ('Binding', ['create'], True)


def test_token_request_tokens_authenticate_as_the_service_account(emu, core):
    ns = namespace(emu, 'sa-tokens')
    account = core.create_namespaced_service_account(ns, {'metadata': {'name': 'agent'}})
    core.create_namespaced_config_map(ns, {'metadata': {'name': 'agent-settings'}})
    emu.create({'apiVersion': 'rbac.authorization.k8s.io/v1', 'kind': 'Role',
                'metadata': {'name': 'agent', 'namespace': ns},
                'rules': [{'apiGroups': [''], 'resources': ['configmaps'], 'verbs': ['get']}]})
    emu.create({'apiVersion': 'rbac.authorization.k8s.io/v1', 'kind': 'RoleBinding',
                'metadata': {'name': 'agent', 'namespace': ns},
                'roleRef': {'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'Role', 'name': 'agent'},
                'subjects': [{'kind': 'ServiceAccount', 'name': 'agent', 'namespace': ns}]})
    core.create_namespaced_pod(ns, {'metadata': {'name': 'agent-pod'}, 'spec': {
        'serviceAccountName': 'agent', 'containers': [{'name': 'c', 'image': 'busybox'}]}})
    pod_uid = core.read_namespaced_pod('agent-pod', ns).metadata.uid

    before = time.time()
    first = core.create_namespaced_service_account_token('agent', ns, {
        'apiVersion': 'authentication.k8s.io/v1', 'kind': 'TokenRequest',
        'spec': {'audiences': ['https://kubernetes.default.svc.cluster.local'], 'expirationSeconds': 7200}})
    second = core.create_namespaced_service_account_token('agent', ns, {'spec': {}})
    bound = core.create_namespaced_service_account_token('agent', ns, {'spec': {'boundObjectRef': {
        'apiVersion': 'v1', 'kind': 'Pod', 'name': 'agent-pod', 'uid': pod_uid}}})
    assert (first.metadata.name, first.metadata.namespace, first.spec.expiration_seconds) == ('agent', ns, 7200)
    assert second.spec.expiration_seconds == 3600 and second.spec.audiences
    assert before + 7200 - 5 <= first.status.expiration_timestamp.timestamp() <= time.time() + 7200 + 5
    tokens = [t.status.token for t in (first, second, bound)]
    assert len(set(tokens)) == 3

    user = 'system:serviceaccount:%s:agent' % ns
    for token in tokens:  # all valid at once
        code, cm = raw(emu, 'GET', '/api/v1/namespaces/%s/configmaps/agent-settings' % ns, token=token)
        assert (code, cm['metadata']['name']) == (200, 'agent-settings')
        code, review = raw(emu, 'POST', '/apis/authentication.k8s.io/v1/selfsubjectreviews', token=token,
                           body={'apiVersion': 'authentication.k8s.io/v1', 'kind': 'SelfSubjectReview'})
        info = review['status']['userInfo']
        assert (code, info['username'], info['uid'], info['groups']) == (
            201, user, account.metadata.uid,
            ['system:serviceaccounts', 'system:serviceaccounts:%s' % ns, 'system:authenticated'])
    assert info['extra']['authentication.kubernetes.io/pod-name'] == ['agent-pod']  # the bound token's
    # The official client with a token: RBAC still applies to the service account.
    config = k8s.Configuration(host=emu.url, api_key={'authorization': tokens[0]},
                               api_key_prefix={'authorization': 'Bearer'})
    config.ssl_ca_cert = emu.ca_cert
    as_agent = k8s.CoreV1Api(k8s.ApiClient(config))
    assert as_agent.read_namespaced_config_map('agent-settings', ns).metadata.name == 'agent-settings'
    with pytest.raises(ApiException) as denied:
        as_agent.list_namespaced_config_map(ns)
    assert (denied.value.status, status_of(denied.value)['message']) == (
        403, 'configmaps is forbidden: User "%s" cannot list resource "configmaps" in API group "" in the namespace '
             '"%s"' % (user, ns))

    failures = [
        (lambda: core.create_namespaced_service_account_token('ghost', ns, {'spec': {}}),
         (404, 'NotFound', 'serviceaccounts "ghost" not found')),
        (lambda: core.create_namespaced_service_account_token('agent', ns, {'spec': {'expirationSeconds': 60}}),
         (422, 'Invalid', 'TokenRequest.authentication.k8s.io "" is invalid: spec.expirationSeconds: Invalid value: '
                          '60: may not specify a duration less than 10 minutes')),
        (lambda: k8s.CoreV1Api(api_client(emu.add_identity('test-no-tokens').kubeconfig))
         .create_namespaced_service_account_token('agent', ns, {'spec': {}}),
         (403, 'Forbidden', 'serviceaccounts "agent" is forbidden: User "test-no-tokens" cannot create resource '
                            '"serviceaccounts/token" in API group "" in the namespace "%s"' % ns)),
    ]
    for call, expected in failures:
        with pytest.raises(ApiException) as failed:
            call()
        status = status_of(failed.value)
        assert (failed.value.status, status['reason'], status['message']) == expected

    code, discovery = raw(emu, 'GET', '/api/v1', token=tokens[0])  # discovery: open to every user
    entry = next(r for r in discovery['resources'] if r['name'] == 'serviceaccounts/token')
    assert code == 200 and (entry['group'], entry['kind'], entry['verbs']) == (
        'authentication.k8s.io', 'TokenRequest', ['create'])

    # A bound token ends with its pod; all of them end with the service account.
    core.delete_namespaced_pod('agent-pod', ns)
    path = '/api/v1/namespaces/%s/configmaps/agent-settings' % ns
    assert [raw(emu, 'GET', path, token=t)[0] for t in tokens] == [200, 200, 401]
    core.delete_namespaced_service_account('agent', ns)
    assert [raw(emu, 'GET', path, token=t)[0] for t in tokens] == [401, 401, 401]
    core.create_namespaced_service_account(ns, {'metadata': {'name': 'agent'}})  # a new uid: still 401
    assert raw(emu, 'GET', path, token=tokens[0])[0] == 401


def test_server_side_apply_is_create_or_merge(emu, admin):
    dyn = dynamic.DynamicClient(admin)
    cms = dyn.resources.get(api_version='v1', kind='ConfigMap')
    body = {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'ssa', 'namespace': 'default'},
            'data': {'a': '1'}}
    assert cms.server_side_apply(body=body, name='ssa', namespace='default', field_manager='t').data.a == '1'
    body['data'] = {'b': '2'}
    assert dict(cms.server_side_apply(body=body, name='ssa', namespace='default', field_manager='t').data) == {
        'a': '1', 'b': '2'}
    code, status = raw(emu, 'PATCH', '/api/v1/namespaces/default/configmaps/ssa', token=admin_token(emu),
                       body=body, content_type='application/apply-patch+yaml')
    assert (code, status['reason']) == (422, 'Invalid') and 'fieldManager' in status['message']


def test_concurrent_writers_are_serialised(emu):
    emu.create(node('busy'))
    before = int(emu.get('v1', 'Node', 'busy')['metadata']['resourceVersion'])
    errors = []

    def writer(index):
        api = k8s.CoreV1Api(api_client(emu.kubeconfig('admin')))
        try:
            for step in range(5):
                api.patch_node('busy', {'metadata': {'labels': {'w%d-%d' % (index, step): 'x'}}})
        except Exception as exc:  # pylint: disable=broad-except
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    after = emu.get('v1', 'Node', 'busy')['metadata']
    assert len([k for k in after['labels'] if k.startswith('w')]) == 30
    assert int(after['resourceVersion']) >= before + 30


def test_start_failure_reports_the_emulator_output(emu, tmp_path):
    taken = int(emu.url.rsplit(':', 1)[1])
    with pytest.raises(RuntimeError) as failed:
        Emulator.start(str(tmp_path), port=taken, timeout=30)
    assert 'did not start' in str(failed.value) and 'Address already in use' in str(failed.value)


# -- the request log and fault injection ------------------------------------------------------


def test_request_log_counts_api_calls_but_not_control_calls(emu, core):
    emu.create(node('log-n1'))
    emu.clear_requests()
    core.read_node('log-n1')
    core.read_node('log-n1')
    core.patch_node('log-n1', {'metadata': {'labels': {'a': 'b'}}})
    emu.get('v1', 'Node', 'log-n1')  # control call: not logged
    emu.patch('v1', 'Node', 'log-n1', {'metadata': {'labels': {'c': 'd'}}})
    entries = emu.requests()
    assert emu.counts(entries) == {('get', 'nodes'): 2, ('patch', 'nodes'): 1}
    assert entries[-1]['content_type'] == 'application/strategic-merge-patch+json'
    assert {(e['user'], e['code'], e['name'], e['namespace']) for e in entries} == {('admin', 200, 'log-n1', None)}
    assert emu.requests(clear=True) == entries and emu.requests() == []


def test_fault_503_burst_then_success(emu, core):
    emu.create(node('burst'))
    emu.clear_requests()
    rule = emu.inject(verb='get', resource='nodes', name='burst', status=503, count=2)
    for attempt in (1, 2):
        with pytest.raises(ApiException) as unavailable:
            core.read_node('burst')
        status = status_of(unavailable.value)
        assert (unavailable.value.status, status['kind'], status['reason']) == (503, 'Status', 'ServiceUnavailable'), \
            attempt
    assert core.read_node('burst').metadata.name == 'burst'
    assert [r['code'] for r in emu.requests(clear=True)] == [503, 503, 200]
    assert [(f['id'], f['remaining'], f['hits']) for f in emu.faults()] == [(rule, 0, 2)]
    # With Retry-After, urllib3 (under the official client) retries by itself, as against a real server.
    emu.inject(verb='get', resource='nodes', name='burst', status=503, count=2, retry_after=0)
    assert core.read_node('burst').metadata.name == 'burst'
    assert [r['code'] for r in emu.requests()] == [503, 503, 200]


def test_fault_409_once_only_hits_the_matching_request(emu, core):
    emu.create(node('once'))
    emu.inject(verb='patch', resource='nodes', name='once', status=409)
    core.read_node('once')  # a get does not match
    with pytest.raises(ApiException) as conflict:
        core.patch_node('once', {'metadata': {'labels': {'a': 'b'}}})
    assert status_of(conflict.value)['message'].startswith('Operation cannot be fulfilled on nodes "once"')
    assert core.patch_node('once', {'metadata': {'labels': {'a': 'b'}}}).metadata.labels['a'] == 'b'


def test_fault_delay(emu, core):
    emu.create(node('slow'))
    emu.inject(verb='get', resource='nodes', name='slow', delay=0.4, count=1)
    started = time.monotonic()
    core.read_node('slow')
    assert time.monotonic() - started >= 0.4
    assert [rule['remaining'] for rule in emu.faults()] == [0]  # used up: later reads are not delayed


def test_fault_concurrent_modify_between_get_and_write(emu, core):
    emu.create(node('race', labels={'mine': 'no'}))
    emu.inject(verb='get', resource='nodes', name='race', modify={'metadata': {'labels': {'writer': 'other'}}})
    seen = core.read_node('race')
    assert 'writer' not in seen.metadata.labels  # the answer is from before the other writer
    seen.metadata.labels['mine'] = 'yes'
    with pytest.raises(ApiException) as conflict:
        core.replace_node('race', seen)
    assert (conflict.value.status, status_of(conflict.value)['reason']) == (409, 'Conflict')
    with pytest.raises(ApiException) as conflict:
        core.patch_node('race', {'metadata': {'resourceVersion': seen.metadata.resource_version,
                                              'labels': {'mine': 'yes'}}})
    assert conflict.value.status == 409
    fresh = core.read_node('race')
    assert fresh.metadata.labels == {'mine': 'no', 'writer': 'other'}
    assert int(fresh.metadata.resource_version) > int(seen.metadata.resource_version)


# -- kubernetes.core through ansible-playbook -------------------------------------------------


def test_kubernetes_core_apply_reapply_info_and_absent(emu, tmp_path):
    kubeconfig = emu.kubeconfig('admin')
    emu.add_nodes(3, prefix='gpu-', labels={'emulator.test/pool': 'ansible'})
    ns = {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': 'gpu-operator'}}
    ds = daemonset('device-plugin', 'gpu-operator')
    auth = {'kubeconfig': kubeconfig}
    tasks = [
        {'name': 'Namespace', 'kubernetes.core.k8s': dict(auth, definition=ns), 'register': 'ns'},
        {'name': 'DaemonSet', 'kubernetes.core.k8s': dict(auth, definition=ds), 'register': 'ds_first'},
        {'name': 'DaemonSet again', 'kubernetes.core.k8s': dict(auth, definition=ds), 'register': 'ds_again'},
        {'name': 'Pool nodes', 'register': 'gpu_nodes',
         'kubernetes.core.k8s_info': dict(auth, kind='Node', label_selectors=['emulator.test/pool=ansible'])},
        {'name': 'DaemonSet gone', 'kubernetes.core.k8s': dict(auth, definition=ds, state='absent'),
         'register': 'ds_absent'},
    ]
    emu.clear_requests()
    proc, results = run_tasks(str(tmp_path), tasks, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert results['ns']['changed'] and results['ds_first']['changed']
    assert results['ds_first']['result']['metadata']['generation'] == 1
    assert results['ds_again']['changed'] is False
    assert sorted(n['metadata']['name'] for n in results['gpu_nodes']['resources']) == ['gpu-00000', 'gpu-00001',
                                                                                        'gpu-00002']
    assert results['ds_absent']['changed']
    assert not emu.exists('apps/v1', 'DaemonSet', 'device-plugin', 'gpu-operator')
    counts = emu.counts()
    assert counts[('create', 'daemonsets')] == 1 and counts[('patch', 'daemonsets')] == 1
    assert counts[('delete', 'daemonsets')] == 1 and counts[('list', 'nodes')] == 1
    assert all(r['code'] < 500 and r['user'] == 'admin' for r in emu.requests())


def test_rbac_role_and_binding_writes_cannot_grant_more_than_the_writer_holds(emu):
    rbac_api = 'rbac.authorization.k8s.io/v1'
    ref = {'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'ClusterRole'}
    node_patcher = {'apiVersion': rbac_api, 'kind': 'ClusterRole', 'metadata': {'name': 'esc-node-patcher'},
                    'rules': [{'apiGroups': [''], 'resources': ['nodes'], 'verbs': ['patch']}]}
    emu.create(node_patcher)
    emu.create({'apiVersion': rbac_api, 'kind': 'ClusterRole', 'metadata': {'name': 'esc-writer'}, 'rules': [
        {'apiGroups': ['rbac.authorization.k8s.io'], 'resources': ['clusterroles', 'clusterrolebindings'],
         'verbs': ['create', 'patch']},
        {'apiGroups': [''], 'resources': ['nodes'], 'verbs': ['get']}]})
    emu.create({'apiVersion': rbac_api, 'kind': 'ClusterRoleBinding', 'metadata': {'name': 'esc-writer'},
                'roleRef': dict(ref, name='esc-writer'),
                'subjects': [{'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'User', 'name': 'esc-writer'}]})
    writer = k8s.RbacAuthorizationV1Api(api_client(emu.add_identity('esc-writer').kubeconfig))

    def binding(name, role):
        return {'metadata': {'name': name}, 'roleRef': dict(ref, name=role),
                'subjects': [{'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'User', 'name': 'someone'}]}

    # What the writer holds it may grant; more needs escalate (roles) or bind (bindings) on that name.
    writer.create_cluster_role({'metadata': {'name': 'esc-reader'},
                                'rules': [{'apiGroups': [''], 'resources': ['nodes'], 'verbs': ['get']}]})
    for call, refused in (
            (lambda: writer.create_cluster_role({'metadata': {'name': 'esc-more'}, 'rules': node_patcher['rules']}),
             'clusterroles.rbac.authorization.k8s.io "esc-more"'),
            (lambda: writer.patch_cluster_role('esc-reader', {'rules': node_patcher['rules']}),
             'clusterroles.rbac.authorization.k8s.io "esc-reader"'),
            (lambda: writer.create_cluster_role_binding(binding('esc-b1', 'esc-node-patcher')),
             'clusterrolebindings.rbac.authorization.k8s.io "esc-b1"')):
        with pytest.raises(ApiException) as denied:
            call()
        message = status_of(denied.value)['message']
        assert denied.value.status == 403 and message.startswith(refused + ' is forbidden: user "esc-writer"'), message
        assert 'is attempting to grant RBAC permissions not currently held' in message
        assert "Resources:['nodes'], ResourceNames:[], Verbs:['patch']" in message
    assert not emu.exists(rbac_api, 'ClusterRole', 'esc-more') and not emu.exists(rbac_api, 'ClusterRoleBinding', 'esc-b1')
    assert emu.get(rbac_api, 'ClusterRole', 'esc-reader')['rules'][0]['verbs'] == ['get']

    emu.patch(rbac_api, 'ClusterRole', 'esc-writer', {'rules': emu.get(rbac_api, 'ClusterRole', 'esc-writer')['rules'] + [
        {'apiGroups': ['rbac.authorization.k8s.io'], 'resources': ['clusterroles'], 'verbs': ['escalate', 'bind'],
         'resourceNames': ['esc-more', 'esc-node-patcher']}]})
    # A create carries no name for the escalate check (the real API server refuses it too,
    # tests/integration/test_control_plane.py); a server-side apply names the role.
    with pytest.raises(ApiException) as denied:
        writer.create_cluster_role({'metadata': {'name': 'esc-more'}, 'rules': node_patcher['rules']})
    assert denied.value.status == 403
    assert 'is attempting to grant RBAC permissions not currently held' in status_of(denied.value)['message']
    roles = dynamic.DynamicClient(writer.api_client).resources.get(api_version=rbac_api, kind='ClusterRole')
    roles.server_side_apply(body={'apiVersion': rbac_api, 'kind': 'ClusterRole', 'metadata': {'name': 'esc-more'},
                                  'rules': node_patcher['rules']}, name='esc-more', field_manager='t')
    assert emu.get(rbac_api, 'ClusterRole', 'esc-more')['rules'] == node_patcher['rules']
    writer.create_cluster_role_binding(binding('esc-b1', 'esc-node-patcher'))
    with pytest.raises(ApiException) as denied:  # escalate names esc-more, not esc-reader
        writer.patch_cluster_role('esc-reader', {'rules': node_patcher['rules']})
    assert denied.value.status == 403
