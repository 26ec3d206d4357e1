# -*- coding: utf-8 -*-
"""The lab's real control plane (lab/control_plane.py), built from the Kubernetes module lab/go pins,
and the collection's Kubernetes module against it: what only a real API server answers."""

from __future__ import absolute_import, division, print_function

import copy
import json
import os
import re
import subprocess
import sys
import time

import pytest
import yaml

import gfd_cases as cases
from cluster_api import admission_refusal, wait_until_pod_security_enforces
from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s import api as k8s_api
import manifest_render
import require
from playbook import run_tasks

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')
SEED = next(c for _n, c in cases.all_cases() if c["name"].startswith("seed-4x-tesla-p4"))
SEED_FACTS = dict(cases.facts_of(SEED), present=True, nvml_ok=True, error=None)
SEED_LABELS = dict(SEED["expected_labels"], **{"nvidia.com/gpu.present": "true"})
# The ClusterRole the README documents for k8s_gpu_labels.
LABELLER_RULES = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
    {"apiGroups": ["nfd.k8s-sigs.io"], "resources": ["nodefeatures"], "verbs": ["list"]},
]


def _pinned_kubernetes():
    with open(os.path.join(ROOT, 'lab', 'go', 'kubernetes', 'go.mod')) as handle:
        return re.search(r'^\s*k8s\.io/kubernetes (v\S+)', handle.read(), re.M).group(1)


@pytest.fixture(scope='module')
def kube(control_plane):
    kubernetes = require.module('kubernetes')
    return kubernetes, kubernetes.config.new_client_from_config(control_plane.kubeconfig_path('admin'))


def test_served_by_the_pinned_release(kube):
    kubernetes, api = kube
    version = kubernetes.client.VersionApi(api).get_code()
    assert version.git_version == _pinned_kubernetes()
    assert (version.major, version.minor) == tuple(_pinned_kubernetes().lstrip('v').split('.')[:2])


def test_admission_rejects_a_pod_naming_a_missing_runtime_class(kube):
    kubernetes, api = kube
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "no-such-class", "namespace": "default"},
           "spec": {"runtimeClassName": "no-such-class", "containers": [{"name": "c", "image": "pause"}]}}
    with pytest.raises(kubernetes.client.ApiException) as raised:
        kubernetes.client.CoreV1Api(api).create_namespaced_pod("default", pod)
    assert raised.value.status == 403
    assert 'RuntimeClass "no-such-class" not found' in json.loads(raised.value.body)["message"]


def test_labels_a_real_node_as_a_user_bound_to_the_documented_role(tmp_path, kube, control_plane):
    kubernetes, api = kube
    core, rbac = kubernetes.client.CoreV1Api(api), kubernetes.client.RbacAuthorizationV1Api(api)
    core.create_node({"apiVersion": "v1", "kind": "Node",
                      "metadata": {"name": "seed-1", "labels": {"kubernetes.io/hostname": "seed-1", "team": "ml"}}})
    rbac.create_cluster_role({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                              "metadata": {"name": "gpuready-node-labeller"}, "rules": LABELLER_RULES})
    rbac.create_cluster_role_binding({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "gpuready-node-labeller"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gpuready-node-labeller"},
        "subjects": [{"kind": "User", "name": "labeller", "apiGroup": "rbac.authorization.k8s.io"}]})
    kubeconfig = control_plane.issue_kubeconfig('labeller', 'labeller')
    labels_args = {"node": "seed-1", "gpu_facts": SEED_FACTS, "kubeconfig": kubeconfig}
    task = {"name": "Label", "gpuready.nvidia.k8s_gpu_labels": labels_args,
            "register": "result", "ignore_errors": True}

    proc, results = run_tasks(str(tmp_path), [task])
    assert not results["result"].get("failed"), proc.stdout
    assert results["result"]["changed"] is True
    labels = core.read_node("seed-1").metadata.labels
    assert labels == dict(SEED_LABELS, **{"kubernetes.io/hostname": "seed-1", "team": "ml"})

    proc, results = run_tasks(str(tmp_path), [task])
    assert not results["result"].get("failed"), proc.stdout
    assert results["result"]["changed"] is False


# What the roles deploy, by variant: the device plugin alone, with a MIG strategy (SYS_ADMIN) and with MPS
# (its privileged control daemon), GFD, and NFD's master and worker.
WORKLOAD_VARIANTS = [
    ('device_plugin', 'device-plugin.yml.j2', 'default', {}),
    ('device_plugin', 'device-plugin.yml.j2', 'mig', {'gpuready_mig_strategy': 'single'}),
    ('device_plugin', 'device-plugin.yml.j2', 'mps', {
        'gpuready_sharing': {'strategy': 'mps', 'resources': [{'name': 'nvidia.com/gpu', 'replicas': 2}]}}),
    ('feature_discovery', 'gfd.yml.j2', 'default', {}),
    ('feature_discovery', 'nfd.yml.j2', 'default', {}),
]


def _pods_of_our_workloads():
    """{namespace: [Pod]}: a Pod from the template of every DaemonSet and Deployment the roles render."""
    pods = {}
    for role, template, variant, overrides in WORKLOAD_VARIANTS:
        for obj in manifest_render.render(role, template, overrides):
            if obj['kind'] not in ('DaemonSet', 'Deployment'):
                continue
            namespace = obj['metadata']['namespace']
            pods.setdefault(namespace, []).append({
                'apiVersion': 'v1', 'kind': 'Pod',
                'metadata': {'name': '%s-%s' % (obj['metadata']['name'], variant), 'namespace': namespace,
                             'labels': obj['spec']['template']['metadata']['labels']},
                'spec': obj['spec']['template']['spec']})
    return pods


def test_pod_security_admits_our_pods_at_the_level_we_label_and_not_one_stricter(kube):
    kubernetes, api = kube
    core = kubernetes.client.CoreV1Api(api)
    # Our namespaces as the roles label them (feature_discovery renders the device plugin's too), and the
    # ServiceAccounts our pods name; the default one comes from the service account controller.
    namespaces = [o for o in manifest_render.render('feature_discovery', 'prerequisites.yml.j2') if o['kind'] == 'Namespace']
    assert manifest_render.render('device_plugin', 'namespace.yml.j2') == namespaces[:1]
    for namespace in namespaces:
        core.create_namespace(namespace)
    for _role, template, _variant, overrides in WORKLOAD_VARIANTS[3:]:
        for obj in manifest_render.render('feature_discovery', template, overrides):
            if obj['kind'] == 'ServiceAccount':
                core.create_namespaced_service_account(obj['metadata']['namespace'], obj)
    pods = _pods_of_our_workloads()
    assert sorted(pods) == sorted(n['metadata']['name'] for n in namespaces)
    for namespace in pods:
        wait_for_default_service_account(core, kubernetes, namespace)

    refusals = {}
    for namespace, members in sorted(pods.items()):
        level = next(n for n in namespaces if n['metadata']['name'] == namespace)['metadata']['labels'][
            'pod-security.kubernetes.io/enforce']
        assert dict((p['metadata']['name'], admission_refusal(core, p)) for p in members) == dict(
            (p['metadata']['name'], None) for p in members), namespace
        # One level stricter (the Pod Security Standards: privileged, baseline, restricted) refuses some of
        # them with the real PodSecurity admission's own reason: the label asks for no more than they need.
        assert level == 'privileged'
        core.patch_namespace(namespace, {'metadata': {'labels': {'pod-security.kubernetes.io/enforce': 'baseline'}}})
        try:
            wait_until_pod_security_enforces(core, namespace, 'baseline')
            refused = dict((p['metadata']['name'], admission_refusal(core, p)) for p in members)
        finally:
            core.patch_namespace(namespace, {'metadata': {'labels': {'pod-security.kubernetes.io/enforce': level}}})
        refused = dict((name, message) for name, message in refused.items() if message)
        assert refused, namespace
        for name, message in refused.items():
            assert message.startswith('403 pods "%s" is forbidden: violates PodSecurity "baseline:latest"' % name), message
        refusals.update(refused)
    # What needs privileged, in the admission's words: every hostPath (the plugin's kubelet socket folder,
    # nfd-worker's /sys) and the privileged containers (GFD, the MPS control daemon).
    assert sorted(refusals) == ['gpu-feature-discovery-default', 'nfd-worker-default', 'nvidia-device-plugin-default',
                                'nvidia-device-plugin-mig', 'nvidia-device-plugin-mps',
                                'nvidia-device-plugin-mps-control-daemon-mps'], refusals
    assert 'hostPath volumes' in refusals['nvidia-device-plugin-default']
    assert 'privileged' in refusals['gpu-feature-discovery-default']


def wait_for_default_service_account(core, kubernetes, namespace, timeout=60):
    """Until the service account controller has made `default` in namespace (a watch, from the start)."""
    watch = kubernetes.watch.Watch()
    for event in watch.stream(core.list_namespaced_service_account, namespace, field_selector='metadata.name=default',
                              timeout_seconds=timeout):
        if event['type'] in ('ADDED', 'MODIFIED'):
            watch.stop()
            return event['object']
    raise AssertionError('no ServiceAccount default in %s after %ss' % (namespace, timeout))


CLUSTERROLE = os.path.join(ROOT, 'roles', 'gpuready', 'files', 'clusterrole.yml')
RBAC_KINDS = ('ClusterRole', 'ClusterRoleBinding', 'Role', 'RoleBinding')
NOT_HELD = 'is attempting to grant RBAC permissions not currently held'


def _rbac_objects():
    """The roles and bindings feature_discovery gives NFD and GFD (grants the shipped role does not hold)."""
    return [obj for template in ('gfd.yml.j2', 'nfd.yml.j2')
            for obj in manifest_render.render('feature_discovery', template) if obj['kind'] in RBAC_KINDS]


def _apply_as(kubernetes, client, obj, create=False):
    """What the API says to `obj` applied through `client` (a DynamicClient) as the roles apply it (server-side
    apply, field manager gpuready.nvidia), or created with a POST when `create`: None when accepted, else
    'status message'."""
    resource = client.resources.get(api_version=obj['apiVersion'], kind=obj['kind'])
    namespace = obj['metadata'].get('namespace')
    try:
        if create:
            resource.create(body=obj, namespace=namespace)
        else:
            resource.server_side_apply(body=obj, name=obj['metadata']['name'], namespace=namespace,
                                       field_manager='gpuready.nvidia', force_conflicts=True)
    except kubernetes.client.ApiException as exc:
        return '%s %s' % (exc.status, json.loads(exc.body)['message'])
    return None


@pytest.mark.parametrize('variant', ['shipped', 'without escalate', 'without bind', 'created with POST'])
def test_the_shipped_clusterrole_grants_nfd_and_gfd_their_roles_on_the_real_authorizer(kube, control_plane, variant):
    """As a user bound only to roles/gpuready/files/clusterrole.yml: the roles' server-side apply of NFD's and
    GFD's roles and bindings is accepted by the real RBAC escalation checks; without `escalate` the roles,
    without `bind` the bindings are refused with the API's own 403. A POST create is refused even with the
    shipped role: kube-apiserver checks `escalate` against the request's name, which a create does not have,
    so `resourceNames` holds only for the apply (a PATCH that names the object)."""
    kubernetes, api = kube
    core = kubernetes.client.CoreV1Api(api)
    rbac = kubernetes.client.RbacAuthorizationV1Api(api)
    with open(CLUSTERROLE) as handle:
        shipped = yaml.safe_load(handle)
    rules = copy.deepcopy(shipped['rules'])
    named = [rule for rule in rules if rule.get('resourceNames')]
    assert len(named) == 1 and sorted(named[0]['verbs']) == ['bind', 'escalate']
    if variant.startswith('without '):
        named[0]['verbs'].remove(variant.split()[1])
    user = 'gpuready-' + variant.replace(' ', '-').lower()
    rbac.create_cluster_role(dict(shipped, metadata={'name': user}, rules=rules))
    rbac.create_cluster_role_binding({
        'apiVersion': 'rbac.authorization.k8s.io/v1', 'kind': 'ClusterRoleBinding', 'metadata': {'name': user},
        'roleRef': {'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'ClusterRole', 'name': user},
        'subjects': [{'kind': 'User', 'name': user, 'apiGroup': 'rbac.authorization.k8s.io'}]})
    client = kubernetes.dynamic.DynamicClient(
        kubernetes.config.new_client_from_config(control_plane.issue_kubeconfig(user, user)))
    objects = _rbac_objects()
    assert sorted(set(o['kind'] for o in objects)) == sorted(RBAC_KINDS)
    for name in set(o['metadata']['namespace'] for o in objects if o['metadata'].get('namespace')):
        if not core.list_namespace(field_selector='metadata.name=' + name).items:
            core.create_namespace({'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': name}})
    answers = {}
    try:
        for obj in objects:
            answers['%s %s' % (obj['kind'], obj['metadata']['name'])] = _apply_as(
                kubernetes, client, obj, create=variant == 'created with POST')
    finally:
        admin = kubernetes.dynamic.DynamicClient(api)
        for obj in objects:  # as admin: each variant starts from none of them
            resource = admin.resources.get(api_version=obj['apiVersion'], kind=obj['kind'])
            try:
                resource.delete(name=obj['metadata']['name'], namespace=obj['metadata'].get('namespace'))
            except kubernetes.client.ApiException as exc:
                if exc.status != 404:
                    raise
    refused = dict((what, message) for what, message in answers.items() if message)
    granting = set(what for what in answers if what.split()[0] in ('ClusterRole', 'Role'))
    if variant == 'shipped':
        assert refused == {}
    elif variant == 'without bind':
        assert set(refused) == set(answers) - granting, answers
    else:  # without escalate, or created with POST: the roles themselves are refused
        assert granting <= set(refused), answers
    for message in refused.values():
        assert message.startswith('403 ') and NOT_HELD in message, message


def _device_plugin_role(tmp_path, control_plane, mig_strategy, check=False):
    """The device_plugin role against the real API server as admin (no nodes: no rollout to wait for);
    returns (completed process, the DaemonSet as the API has it afterwards)."""
    task = {'name': 'The device plugin', 'ansible.builtin.import_role': {'name': 'gpuready.nvidia.device_plugin'},
            'vars': {'gpuready_k8s_kubeconfig': control_plane.kubeconfig_path('admin'),
                     'gpuready_mig_strategy': mig_strategy, 'device_plugin_wait_timeout': 0}}
    if check:
        task['check_mode'] = True
    proc, _results = run_tasks(str(tmp_path), [task])
    assert proc.returncode == 0, proc.stdout[-6000:]
    kubernetes = require.module('kubernetes')
    apps = kubernetes.client.AppsV1Api(kubernetes.config.new_client_from_config(control_plane.kubeconfig_path('admin')))
    return proc, apps.read_namespaced_daemon_set('nvidia-device-plugin', 'nvidia-device-plugin').to_dict()


def _plugin_container(daemon_set):
    container = daemon_set['spec']['template']['spec']['containers'][0]
    return dict((env['name'], env['value']) for env in container['env']), container['security_context']


def _changed(proc):
    return int(re.search(r'^localhost\s*:.*changed=(\d+)', proc.stdout, re.M).group(1))


def test_server_side_apply_removes_what_the_template_no_longer_renders(tmp_path, control_plane):
    """With a MIG strategy the plugin's container has NVIDIA_MIG_MONITOR_DEVICES and SYS_ADMIN; back to no MIG
    the template renders neither, and the real API server's server-side apply removes both (the fields the
    field manager gpuready.nvidia owned and no longer applies). Check mode shows it without doing it."""
    _proc, mig = _device_plugin_role(tmp_path, control_plane, 'single')
    env, security = _plugin_container(mig)
    assert env['NVIDIA_MIG_MONITOR_DEVICES'] == 'all' and security['capabilities']['add'] == ['SYS_ADMIN']

    proc, unchanged = _device_plugin_role(tmp_path, control_plane, 'none', check=True)
    assert _changed(proc) > 0
    assert re.search(r'^-.*NVIDIA_MIG_MONITOR_DEVICES', proc.stdout, re.M), proc.stdout[-6000:]
    assert unchanged['metadata']['generation'] == mig['metadata']['generation']
    assert _plugin_container(unchanged) == (env, security)

    proc, plain = _device_plugin_role(tmp_path, control_plane, 'none')
    env, security = _plugin_container(plain)
    assert 'NVIDIA_MIG_MONITOR_DEVICES' not in env
    assert security['capabilities'] == {'add': None, 'drop': ['ALL']} and security['allow_privilege_escalation'] is False
    assert plain['metadata']['generation'] == mig['metadata']['generation'] + 1

    proc, again = _device_plugin_role(tmp_path, control_plane, 'none')
    assert _changed(proc) == 0, proc.stdout[-6000:]
    assert again['metadata']['resource_version'] == plain['metadata']['resource_version']


class _RecordedList(object):
    """A list function (core.list_node) that records each request and every event the real server streams
    to a watch; with `resume_from`, the first watch asks from that resourceVersion instead (a watch resumed
    long after its list, as after a dropped connection)."""

    def __init__(self, list_func, resume_from=None):
        self.list_func = list_func
        self.resume_from = resume_from
        self.requests = []
        self.events = []

    def __call__(self, **kwargs):
        if kwargs.get('watch') and self.resume_from:
            kwargs['resource_version'], self.resume_from = self.resume_from, None
        self.requests.append(dict((k, v) for k, v in kwargs.items() if not k.startswith('_')))
        response = self.list_func(**kwargs)
        return _RecordedStream(response, self.events) if kwargs.get('watch') else response


class _RecordedStream(object):
    def __init__(self, response, events):
        self._response = response
        self._events = events

    def stream(self, amount):
        pending = b''
        for chunk in self._response.stream(amount):
            pending += chunk
            lines = pending.split(b'\n')
            pending = lines.pop()
            self._events.extend(json.loads(line) for line in lines if line.strip())
            yield chunk

    def close(self):
        self._response.close()

    def release_conn(self):
        self._response.release_conn()


def _watch_nodes(kube):
    kubernetes, api = kube
    core = kubernetes.client.CoreV1Api(api)
    for name in ('watch-1', 'watch-2'):
        if not core.list_node(field_selector='metadata.name=' + name).items:
            core.create_node({'apiVersion': 'v1', 'kind': 'Node', 'metadata': {'name': name, 'labels': {'watched': 'yes'}}})
    return core


def test_the_watch_takes_the_real_servers_bookmarks_as_progress_not_objects(kube):
    """Validation's watch (k8s.api.follow, allowWatchBookmarks) on the real server: a BOOKMARK (sent about 2 s
    before the watch's timeout) carries only a resourceVersion, and the nodes followed stay exactly the two."""
    core = _watch_nodes(kube)
    recorded = _RecordedList(core.list_node)
    objects = k8s_api.follow(recorded, 'watched=yes', 500, time.monotonic() + 10, lambda nodes: False, 'the nodes')
    assert sorted(objects) == ['watch-1', 'watch-2']
    bookmarks = [e for e in recorded.events if e['type'] == 'BOOKMARK']
    assert bookmarks, recorded.events
    assert all(set(b['object']['metadata']) <= {'resourceVersion', 'annotations'} for b in bookmarks), bookmarks
    assert all(r.get('allow_watch_bookmarks') for r in recorded.requests if r.get('watch'))


def _compact_etcd(control_plane, revision):
    """What kube-apiserver has etcd do every 5 minutes (--etcd-compaction-interval), now: forget every
    revision before `revision` (etcd's JSON gateway, on its client URL inside the control plane's network)."""
    script = ('import sys, urllib.request; urllib.request.urlopen(urllib.request.Request('
              '"http://127.0.0.1:2379/v3/kv/compaction", data=sys.argv[1].encode(), method="POST"), timeout=10).read()')
    subprocess.run(['ip', 'netns', 'exec', control_plane.state['network']['name'], sys.executable, '-c', script,
                    json.dumps({'revision': str(revision), 'physical': True})], check=True)


def test_the_watch_lists_again_when_the_real_server_says_410(uncached_control_plane):
    """A watch resumed from a resourceVersion that etcd has compacted away is answered 410 Gone by the real
    server; follow lists again, and its next watch sees a change made after that list."""
    kubernetes = require.module('kubernetes')
    control_plane = uncached_control_plane
    core = _watch_nodes((kubernetes, kubernetes.config.new_client_from_config(control_plane.kubeconfig_path('admin'))))
    old = core.list_node(label_selector='watched=yes').metadata.resource_version
    for phase in ('one', 'two', 'before'):
        latest = core.patch_node('watch-2', {'metadata': {'labels': {'phase': phase}}}).metadata.resource_version
    _compact_etcd(control_plane, latest)
    recorded = _RecordedList(core.list_node, resume_from=old)

    def done(nodes):
        if len(recorded.requests) == 3 and not changed:  # listed again after the 410: change a node now
            core.patch_node('watch-2', {'metadata': {'labels': {'phase': 'after'}}})
            changed.append(True)
        return nodes.get('watch-2', {}).get('metadata', {}).get('labels', {}).get('phase') == 'after'

    changed = []
    objects = k8s_api.follow(recorded, 'watched=yes', 500, time.monotonic() + 60, done, 'the nodes')
    seen = [(e['type'], e['object'].get('code'), e['object'].get('metadata', {}).get('name')) for e in recorded.events]
    assert objects['watch-2']['metadata']['labels']['phase'] == 'after', (recorded.requests, seen)
    # list, the watch refused, a second list, the watch that saw the change
    assert [bool(r.get('watch')) for r in recorded.requests] == [False, True, False, True], recorded.requests
    # The first watch's one event is the 410. The second sees our change, and may see a controller's too: the
    # controller-manager writes Nodes as well (node IPAM's podCIDR; node lifecycle's taints once a Node with no
    # kubelet has outlived its grace period), whenever a loaded machine gets round to it.
    assert [e['type'] for e in recorded.events[:2]] == ['ERROR', 'MODIFIED'], seen
    assert set(e['type'] for e in recorded.events[1:]) == {'MODIFIED'}, seen
    assert recorded.events[0]['object']['code'] == 410, recorded.events[0]
