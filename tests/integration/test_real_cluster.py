# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The seed on the real cluster (lab/lab.py): kube-apiserver, scheduler and controllers
1.37, the real kubelet on gpu-p4, and the real NVIDIA device plugin (lab/go) loading the fake NVML that
the node's nvidia runtime gives it. Nothing here answers with the collection's own code: the plugin's
errors, the Node's capacity and the scheduler's message are the upstream programs' own. Then the real
plugin is the oracle for `gpu_resources`: for each sharing configuration, what it registers with the real
kubelet must equal what the filter expects from the facts `nvidia_gpu_facts` gathers from the node's
driver files. Last, k8s_gpu_validate's test pod runs on the real kubelet, also behind the fault-injecting proxy
(its retries)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import re
import time

import pytest
import yaml

import lab_scripts
import require
from ansible_collections.gpuready.nvidia.plugins.module_utils import doctor_checks, doctor_evidence
from ansible_collections.gpuready.nvidia.plugins.module_utils.doctor_causes import Finding
from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s.pods import run_test_pod
from cluster_api import ApiWithFaults, install_nfd_crds, wait_for
from fake_nvml import harness
from playbook import run_tasks

gobuild = lab_scripts.script('lab/go/gobuild.py', 'gpuready_gobuild')

NODE = 'gpu-p4'
HOST = 'p4.lab.internal'
NAMESPACE = 'kube-system'
PLUGIN_LABEL = 'name=nvidia-device-plugin-ds'
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')
MANIFEST = os.path.join(ROOT, 'tests', 'fixtures', 'manifests', 'nvidia-device-plugin-v0.20.0.yml')
CUDA_IMAGE = 'nvcr.io/nvidia/cuda:12.2.0-base-ubuntu22.04'
CONFIG = '/etc/containerd/config.toml'
NVML_MISSING = 'Failed to initialize NVML: ERROR_LIBRARY_NOT_FOUND'
GFD_MANIFEST = os.path.join(ROOT, 'tests', 'fixtures', 'manifests', 'gpu-feature-discovery-v0.20.0.yml')
GFD_NAMESPACE = 'node-feature-discovery'
FAKE_SYSFS = '/var/lib/nvidia-fake/sys'
REGISTERED = "Registered device plugin for '%s' with Kubelet"
PLUGIN_CONFIG = 'nvidia-device-plugin-config'
# Each case: the real plugin's config file (its own format, upstream docs) and the same choice in the
# collection's `sharing` setting, which gpu_resources reads.
SHARING_CASES = {
    'no-sharing': ({'version': 'v1'}, None),
    'time-slicing-x4': (
        {'version': 'v1', 'sharing': {'timeSlicing': {'resources': [{'name': 'nvidia.com/gpu', 'replicas': 4}]}}},
        {'strategy': 'time-slicing', 'resources': [{'name': 'nvidia.com/gpu', 'replicas': 4}]}),
    'time-slicing-x2-renamed': (
        {'version': 'v1', 'sharing': {'timeSlicing': {'renameByDefault': True, 'failRequestsGreaterThanOne': True,
                                                      'resources': [{'name': 'nvidia.com/gpu', 'replicas': 2}]}}},
        {'strategy': 'time-slicing', 'rename_by_default': True,
         'resources': [{'name': 'nvidia.com/gpu', 'replicas': 2}]}),
}


def _pinned_plugin():
    with open(os.path.join(ROOT, 'lab', 'go', 'device-plugin', 'go.mod')) as handle:
        return re.search(r'^\s*github\.com/NVIDIA/k8s-device-plugin (v\S+)', handle.read(), re.M).group(1)


@pytest.fixture(scope='module')
def api(real_lab):
    kubernetes = require.module('kubernetes')
    client = kubernetes.config.new_client_from_config(real_lab.state['kubeconfig'])
    return kubernetes.client.CoreV1Api(client), kubernetes.client.AppsV1Api(client)


def plugin_manifest():
    """The upstream static DaemonSet, at the plugin version the lab builds (lab/go/device-plugin)."""
    with open(MANIFEST) as handle:
        manifest = yaml.safe_load(handle)
    container = manifest['spec']['template']['spec']['containers'][0]
    container['image'] = container['image'].rsplit(':', 1)[0] + ':' + _pinned_plugin()
    return manifest


def plugin_with_config(manifest):
    """The static DaemonSet reading its config file from the ConfigMap PLUGIN_CONFIG (CONFIG_FILE, as the
    plugin's Helm chart sets it)."""
    spec = manifest['spec']['template']['spec']
    spec['containers'][0]['env'] = [{'name': 'CONFIG_FILE', 'value': '/config/config.yaml'}]
    spec['containers'][0]['volumeMounts'].append({'name': 'config', 'mountPath': '/config'})
    spec['volumes'].append({'name': 'config', 'configMap': {'name': PLUGIN_CONFIG}})
    return manifest


def plugin_pod(core):
    pods = [p for p in core.list_namespaced_pod(NAMESPACE, label_selector=PLUGIN_LABEL).items
            if p.spec.node_name == NODE and not p.metadata.deletion_timestamp]
    return pods[0] if len(pods) == 1 else None


def registered(core, old, resources):
    """The plugin pod, when it is not `old` and its log says it registered each of `resources`."""
    pod = plugin_pod(core)
    if not pod or (old and pod.metadata.uid == old.metadata.uid) or pod.status.phase != 'Running':
        return None
    log = core.read_namespaced_pod_log(pod.metadata.name, NAMESPACE)
    return pod if all(REGISTERED % resource in log for resource in resources) else None


def plugin_status(core):
    pod = plugin_pod(core)
    return pod, (pod.status.container_statuses or [None])[0] if pod else None


def crash_looping(core, uid=None, restarted_more_than=1):
    """The plugin pod and its last termination while it is down after failing again and again: restarted
    by the kubelet more than `restarted_more_than` times and not running (terminated, or waiting in
    CrashLoopBackOff; the kubelet may report either while it backs off), else None. Optionally only pod `uid`."""
    pod, status = plugin_status(core)
    if not status or status.state.running or status.restart_count <= restarted_more_than:
        return None
    if uid and pod.metadata.uid != uid:
        return None
    return pod, status.state.terminated or status.last_state.terminated


def back_off_events(core, pod):
    """The kubelet's BackOff events for the pod (its own words for a crash loop)."""
    return core.list_namespaced_event(
        NAMESPACE, field_selector='involvedObject.uid=%s,reason=BackOff' % pod.metadata.uid).items


def advertised(core):
    """The nvidia.com resources the node offers now: allocatable, leaving out those a stopped plugin left
    at 0 (the kubelet keeps them in capacity for a while)."""
    allocatable = core.read_node(NODE).status.allocatable
    return dict((name, int(count)) for name, count in allocatable.items()
                if name.startswith('nvidia.com/') and count != '0')


def gpu_resources(core):
    status = core.read_node(NODE).status
    return status.capacity.get('nvidia.com/gpu'), status.allocatable.get('nvidia.com/gpu')


def doctor_says(core, apps, checks, expected=None):
    """What the doctor's API-side checks (`checks`, in the chain's order) conclude about NODE from what the
    real cluster answers through the doctor's own reads: (cause, evidence) of the first broken one, or None.
    The node-side links need the node's Python (doctor_node_evidence) and are not judged here."""
    kubernetes = require.module('kubernetes')
    evidence = doctor_evidence.api_evidence(core, apps, kubernetes.client.NodeV1Api(core.api_client), [NODE])
    node = doctor_checks.NodeEvidence(NODE, None, evidence, expected, {})
    try:
        for check in checks:
            check(node)
    except Finding as finding:
        return finding.cause, finding.evidence
    return None


def configure_containerd(real_lab, tmp_path):
    """containerd_nvidia_runtime on the node through the lab's inventory, then a containerd restart."""
    exports = real_lab.exports()
    tasks = [{'name': 'nvidia runtime', 'register': 'runtime',
              'gpuready.nvidia.containerd_nvidia_runtime': {'set_as_default': True}},
             {'name': 'restart containerd', 'ansible.builtin.systemd': {'name': 'containerd', 'state': 'restarted'}}]
    proc, results = run_tasks(str(tmp_path), tasks, inventory=exports['GPUREADY_LAB_INVENTORY'], hosts=HOST,
                              env=real_lab.ansible_env())
    assert proc.returncode == 0, proc.stdout[-4000:]
    return results['runtime']


def gpu_test_pod(name, gpus, command):
    return {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': name, 'namespace': 'default'},
            'spec': {'restartPolicy': 'Never', 'nodeSelector': {'kubernetes.io/hostname': NODE},
                     'containers': [{'name': 'cuda', 'image': CUDA_IMAGE, 'imagePullPolicy': 'Never',
                                     'command': command, 'resources': {'limits': {'nvidia.com/gpu': str(gpus)}}}]}}


def test_seed_reproduced_and_fixed_on_the_real_cluster(real_lab, api, tmp_path):
    core, apps = api
    assert 'default_runtime_name = "runc"' in real_lab.node_exec(real_lab.container(NODE), 'cat', CONFIG)

    # 1. The seed: the upstream static manifest while runc is containerd's default. The real plugin
    # finds no NVML and exits; the node gets no nvidia.com/gpu.
    apps.create_namespaced_daemon_set(NAMESPACE, plugin_manifest())
    # While it backs off, the kubelet may report the container terminated rather than waiting in
    # CrashLoopBackOff for minutes (seen: 250 s), so the loop is known by its restarts and BackOff events.
    pod, terminated = wait_for('the plugin pod to crash-loop', lambda: crash_looping(core), timeout=300,
                               report=lambda: plugin_report(core))
    assert terminated.exit_code == 1
    log = core.read_namespaced_pod_log(pod.metadata.name, NAMESPACE)
    assert NVML_MISSING in log, log
    back_off = wait_for('the kubelet to report the back-off', lambda: back_off_events(core, pod))
    assert back_off[0].message.startswith('Back-off restarting failed container'), back_off[0].message
    assert gpu_resources(core) == (None, None)
    # The doctor reads the real plugin's own words as the cause.
    cause, evidence = doctor_says(core, apps, (doctor_checks.check_plugin_scheduled, doctor_checks.check_plugin_running))
    assert cause == 'plugin_nvml_load_failed' and NVML_MISSING in evidence[0], (cause, evidence)

    # 2. The fix: our module makes nvidia the default, containerd restarts.
    result = configure_containerd(real_lab, tmp_path)
    assert result['changed'] is True
    assert 'default_runtime_name = "nvidia"' in real_lab.node_exec(real_lab.container(NODE), 'cat', CONFIG)

    # 3. The crash-looping pod does not recover by itself: its sandbox was made with runc, and the kubelet
    # restarts the container in that sandbox, so the next run fails the same way. (Its log is the
    # last run's while it waits to be restarted.)
    restarts = plugin_status(core)[1].restart_count
    _pod, terminated = wait_for('the next restart of the crash-looping plugin pod to fail',
                                lambda: crash_looping(core, pod.metadata.uid, restarts), timeout=300,
                                report=lambda: plugin_report(core))
    assert terminated.exit_code == 1
    assert NVML_MISSING in core.read_namespaced_pod_log(pod.metadata.name, NAMESPACE)
    assert gpu_resources(core) == (None, None)

    # 4. A new pod (what `kubectl rollout restart` makes) gets a sandbox from the nvidia runtime: the real
    # plugin registers the four GPUs with the real kubelet.
    core.delete_namespaced_pod(pod.metadata.name, NAMESPACE)
    wait_for('nvidia.com/gpu on %s' % NODE, lambda: gpu_resources(core) == ('4', '4'), timeout=180,
             report=lambda: plugin_report(core))
    new_pod = plugin_pod(core)
    assert new_pod.metadata.uid != pod.metadata.uid
    assert REGISTERED % 'nvidia.com/gpu' in core.read_namespaced_pod_log(
        new_pod.metadata.name, NAMESPACE)
    assert doctor_says(core, apps, (doctor_checks.check_plugin_scheduled, doctor_checks.check_plugin_running,
                                    doctor_checks.check_capacity, doctor_checks.check_allocatable),
                       expected={'nvidia.com/gpu': 4}) is None

    # 5. A pod asking for one GPU runs nvidia-smi and sees exactly one Tesla P4.
    core.create_namespaced_pod('default', gpu_test_pod('gpu-test', 1, ['nvidia-smi', '-L']))
    wait_for('gpu-test to succeed', lambda: core.read_namespaced_pod('gpu-test', 'default').status.phase == 'Succeeded')
    log = core.read_namespaced_pod_log('gpu-test', 'default')
    assert log.count('Tesla P4') == 1, log

    # 6. Five GPUs fit on no node: Pending with the real scheduler's message.
    core.create_namespaced_pod('default', gpu_test_pod('gpu-test-5', 5, ['nvidia-smi']))
    condition = wait_for('gpu-test-5 to be unschedulable', lambda: [
        c for c in core.read_namespaced_pod('gpu-test-5', 'default').status.conditions or []
        if c.type == 'PodScheduled' and c.status == 'False'])
    assert condition[0].reason == 'Unschedulable'
    assert condition[0].message.startswith('0/1 nodes are available: 1 Insufficient nvidia.com/gpu.'), (
        condition[0].message)
    # The doctor's workload link quotes the real scheduler.
    cause, evidence = doctor_says(core, apps, (doctor_checks.check_workload,))
    assert cause == 'gpu_request_unschedulable', (cause, evidence)
    assert 'default/gpu-test-5' in evidence[0] and condition[0].message in evidence[0], evidence


@pytest.fixture(scope='module')
def node_driver(real_lab, tmp_path_factory):
    """gpu-p4's own driver files (its NVML configuration and PCI sysfs, copied out of the node) and the fake
    NVML library: what nvidia_gpu_facts run on the test machine needs to see the node's GPUs."""
    workdir = tmp_path_factory.mktemp('real-facts')
    node = real_lab.container(NODE)
    real_lab.podman('cp', node + ':/etc/nvidia-fake/gpus.json', str(workdir / 'gpus.json'))
    real_lab.podman('cp', node + ':/var/lib/nvidia-fake', str(workdir / 'nvidia-fake'))
    # The loaded kernel module the fake NVML checks at init: the node's, copied with its sysfs
    inventory = json.loads((workdir / 'gpus.json').read_text())
    inventory['kernel_module'] = inventory['kernel_module'].replace(FAKE_SYSFS, str(workdir / 'nvidia-fake' / 'sys'))
    (workdir / 'gpus.json').write_text(json.dumps(inventory))
    library_dir = workdir / 'lib'
    library_dir.mkdir()
    harness.build(str(library_dir))
    return {'workdir': workdir,
            'facts_args': {'sysfs_root': str(workdir / 'nvidia-fake' / 'sys'),
                           'dmi_product_file': str(workdir / 'nvidia-fake' / 'product_name')},
            'environment': {'LD_LIBRARY_PATH': str(library_dir), 'FAKE_NVML_CONFIG': str(workdir / 'gpus.json')}}


@pytest.fixture(scope='module')
def expected(node_driver):  # pylint: disable=redefined-outer-name
    """What the collection expects of gpu-p4, from the facts nvidia_gpu_facts gathers from the node's own
    driver files: {"resources": {case: gpu_resources(facts, sharing=case's)}, "labels": gfd_labels(facts)}."""
    facts = 'facts.ansible_facts.nvidia_gpu'
    tasks = [{'name': 'Gather', 'register': 'facts', 'gpuready.nvidia.nvidia_gpu_facts': node_driver['facts_args'],
              'environment': node_driver['environment']},
             {'name': 'Labels', 'register': 'labels', 'ansible.builtin.debug': {
                 'msg': '{{ %s | gpuready.nvidia.gfd_labels }}' % facts}}]
    for index, (_config, sharing) in enumerate(SHARING_CASES.values()):
        tasks.append({'name': 'Resources %d' % index, 'register': 'resources_%d' % index,
                      'vars': {'sharing': sharing},
                      'ansible.builtin.debug': {'msg': '{{ %s | gpuready.nvidia.gpu_resources(sharing=sharing) }}' % facts}})
    proc, results = run_tasks(str(node_driver['workdir']), tasks)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert results['facts']['ansible_facts']['nvidia_gpu']['count'] == 4
    return {'resources': dict((name, results['resources_%d' % index]['msg']) for index, name in enumerate(SHARING_CASES)),
            'labels': results['labels']['msg']}


def start_plugin(real_lab, api, tmp_path, case, resources):
    """The real plugin on gpu-p4 with SHARING_CASES[case]'s config (a new pod: it reads its config once, at
    start), nvidia containerd's default runtime; returns the new plugin pod once its log says it registered
    each of `resources` and the node offers exactly them."""
    core, apps = api
    plugin_config, _sharing = SHARING_CASES[case]
    configure_containerd(real_lab, tmp_path)  # a no-op after the seed test
    config_map = {'apiVersion': 'v1', 'kind': 'ConfigMap',
                  'metadata': {'name': PLUGIN_CONFIG, 'namespace': NAMESPACE},
                  'data': {'config.yaml': yaml.safe_dump(plugin_config)}}
    if core.list_namespaced_config_map(NAMESPACE, field_selector='metadata.name=' + PLUGIN_CONFIG).items:
        core.replace_namespaced_config_map(PLUGIN_CONFIG, NAMESPACE, config_map)
    else:
        core.create_namespaced_config_map(NAMESPACE, config_map)
    daemon_set = plugin_with_config(plugin_manifest())
    name = daemon_set['metadata']['name']
    if apps.list_namespaced_daemon_set(NAMESPACE, field_selector='metadata.name=' + name).items:
        apps.replace_namespaced_daemon_set(name, NAMESPACE, daemon_set)
    else:
        apps.create_namespaced_daemon_set(NAMESPACE, daemon_set)
    old = plugin_pod(core)
    if old:
        core.delete_namespaced_pod(old.metadata.name, NAMESPACE)
    pod = wait_for('a new plugin pod to register %s' % sorted(resources), lambda: registered(core, old, resources),
                   timeout=180, report=lambda: plugin_report(core))
    wait_for('%s to offer %s (%s)' % (NODE, resources, case), lambda: advertised(core) == resources,
             report=lambda: plugin_report(core))
    return pod


@pytest.mark.parametrize('case', sorted(SHARING_CASES))
def test_real_plugin_registers_what_gpu_resources_expects(real_lab, api, tmp_path, expected, case):
    core, _apps = api
    pod = start_plugin(real_lab, api, tmp_path, case, expected['resources'][case])
    assert plugin_pod(core).metadata.uid == pod.metadata.uid


def plugin_report(core):
    """The plugin pods and the kube-system events, for a failure message."""
    events = ['%s %s/%s: %s %s' % (e.last_timestamp or e.event_time, e.involved_object.kind, e.involved_object.name,
                                   e.reason, e.message)
              for e in core.list_namespaced_event(NAMESPACE).items]
    return '%s\nevents:\n%s' % (pods_report(core, NAMESPACE, PLUGIN_LABEL), '\n'.join(events))


def node_feature(kubernetes, custom, name):
    """The NodeFeature object `name` in GFD's namespace; None until it exists."""
    try:
        return custom.get_namespaced_custom_object('nfd.k8s-sigs.io', 'v1alpha1', GFD_NAMESPACE, 'nodefeatures', name)
    except kubernetes.client.exceptions.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def pods_report(core, namespace, selector):
    """The state and last log lines of the pods matching `selector`, for a failure message."""
    lines = []
    for pod in core.list_namespaced_pod(namespace, label_selector=selector).items:
        lines.append('%s: %s %s' % (pod.metadata.name, pod.status.phase, pod.status.container_statuses))
        if pod.status.phase in ('Running', 'Failed', 'Succeeded'):
            lines.append(core.read_namespaced_pod_log(pod.metadata.name, namespace, tail_lines=30))
    return '\n'.join(lines) or 'no pod matches %s in %s' % (selector, namespace)


def labels_present(core, wanted):
    """True when the Node carries every label of `wanted` with its value."""
    labels = core.read_node(NODE).metadata.labels or {}
    return all(labels.get(key) == value for key, value in wanted.items())


def nfd_master_objects():
    """NFD's own base deployment of nfd-master (RBAC and Deployment, from the NFD module lab/go pins), with
    what its default overlay adds: the namespace (each namespaced object, the binding's ServiceAccount) and
    the environment of components/common (NODE_NAME, POD_NAME, POD_UID; nfd-master exits without
    NODE_NAME). Its control-plane affinity is left out: the lab has no control-plane node."""
    base = gobuild.upstream_dir('nfd') / 'deployment' / 'base'
    objects = []
    for name in ('rbac/master-serviceaccount.yaml', 'rbac/master-clusterrole.yaml',
                 'rbac/master-clusterrolebinding.yaml', 'master/master-deployment.yaml'):
        obj = yaml.safe_load((base / name).read_text())
        if obj['kind'] in ('ServiceAccount', 'Deployment'):
            obj['metadata']['namespace'] = GFD_NAMESPACE
        if obj['kind'] == 'Deployment':
            obj['spec']['template']['spec']['containers'][0]['env'] = [
                {'name': name, 'valueFrom': {'fieldRef': {'fieldPath': path}}}
                for name, path in (('NODE_NAME', 'spec.nodeName'), ('POD_NAME', 'metadata.name'),
                                   ('POD_UID', 'metadata.uid'))]
        for subject in obj.get('subjects', []):
            subject['namespace'] = GFD_NAMESPACE
        objects.append(obj)
    return objects


def test_real_gfd_labels_through_real_nfd_equal_gfd_labels(real_lab, api, tmp_path, expected):
    """The real GFD v0.19.3 in NodeFeature mode (its default) writes its labels into a NodeFeature object,
    and the real nfd-master v0.19.0 puts them on the Node; both must equal gfd_labels of the node's facts."""
    kubernetes = require.module('kubernetes')
    core = api[0]
    client = core.api_client
    configure_containerd(real_lab, tmp_path)
    # NFD's CRDs; the namespace GFD's manifest uses.
    install_nfd_crds(client)
    core.create_namespace({'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': GFD_NAMESPACE}})
    # GFD's manifest selects GPU nodes by a label NFD's PCI source or the collection sets.
    core.patch_node(NODE, {'metadata': {'labels': {'nvidia.com/gpu.present': 'true'}}})
    with open(GFD_MANIFEST) as handle:
        manifest = yaml.safe_load(handle)
    for item in manifest['items']:
        if item['kind'] == 'DaemonSet':
            spec = item['spec']['template']['spec']
            container = spec['containers'][0]
            container['image'] = container['image'].rsplit(':', 1)[0] + ':' + _pinned_plugin()
            # The lab's one substitution: a node's own /sys is the test machine's, its GPUs' PCI functions
            # and DMI name are in the fake sysfs (lab/README.md, "PCI sysfs").
            for volume in spec['volumes']:
                if volume['name'] == 'host-sys':
                    volume['hostPath']['path'] = FAKE_SYSFS
    kubernetes.utils.create_from_dict(client, manifest)
    custom = kubernetes.client.CustomObjectsApi(client)
    feature = wait_for('GFD to write its NodeFeature for %s' % NODE,
                       lambda: node_feature(kubernetes, custom, 'nvidia-features-for-' + NODE), timeout=180)
    assert feature['metadata']['labels']['nfd.node.kubernetes.io/node-name'] == NODE
    assert feature['spec']['labels'] == expected['labels']

    # Through the real NFD: nfd-master (its own deployment) turns the NodeFeature into the Node's labels.
    for obj in nfd_master_objects():
        kubernetes.utils.create_from_dict(client, obj)
    wait_for('nfd-master to label %s' % NODE, lambda: labels_present(core, expected['labels']), timeout=180,
             report=lambda: pods_report(core, GFD_NAMESPACE, 'app=nfd-master'))
    annotations = core.read_node(NODE).metadata.annotations
    # nfd-master records the labels it owns: exactly GFD's.
    assert set(annotations['nfd.node.kubernetes.io/feature-labels'].split(',')) == set(expected['labels'])


# --- k8s_gpu_validate's test pod on the real kubelet --------------------------------------------------------
# The pod is created, run, logged and deleted by the real scheduler, kubelet and nvidia runtime of gpu-p4, with
# the plugin registering its 4 GPUs without sharing; the validator's requests pass the fault-injecting proxy.

GPU = 'nvidia.com/gpu'
POD_NAMESPACE = 'gpuready-val'
# What k8s_gpu_validate's notes ask for, and nothing more.
VALIDATOR_RULES = [
    {'apiGroups': [''], 'resources': ['nodes'], 'verbs': ['get', 'list', 'watch']},
    {'apiGroups': [''], 'resources': ['pods'], 'verbs': ['create', 'delete', 'get', 'list', 'watch']},
    {'apiGroups': [''], 'resources': ['pods/log'], 'verbs': ['get']},
]


@pytest.fixture(scope='module')
def gpu_cluster(real_lab, api, tmp_path_factory):
    """(ApiWithFaults on the real cluster, the validator): gpu-p4 offering its 4 GPUs, the RuntimeClass nvidia,
    a namespace for test pods and a ServiceAccount bound to exactly VALIDATOR_RULES, behind the proxy."""
    start_plugin(real_lab, api, str(tmp_path_factory.mktemp('plugin')), 'no-sharing', {GPU: 4})
    cluster = ApiWithFaults(real_lab.control_plane, real_lab.state['kubeconfig'], str(tmp_path_factory.mktemp('val')))
    try:
        if not cluster.exists('node.k8s.io/v1', 'RuntimeClass', 'nvidia'):
            cluster.create({'apiVersion': 'node.k8s.io/v1', 'kind': 'RuntimeClass', 'metadata': {'name': 'nvidia'},
                            'handler': 'nvidia'})
        cluster.create({'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': POD_NAMESPACE}})
        validator = cluster.add_identity('validator')
        cluster.create({'apiVersion': 'rbac.authorization.k8s.io/v1', 'kind': 'ClusterRole',
                        'metadata': {'name': 'gpuready-gpu-validator'}, 'rules': VALIDATOR_RULES})
        cluster.create({'apiVersion': 'rbac.authorization.k8s.io/v1', 'kind': 'ClusterRoleBinding',
                        'metadata': {'name': 'gpuready-gpu-validator'},
                        'roleRef': {'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'ClusterRole',
                                    'name': 'gpuready-gpu-validator'},
                        'subjects': [validator.subject]})
        yield cluster, validator
    finally:
        cluster.stop()


@pytest.fixture
def faults_cleared(gpu_cluster):  # pylint: disable=redefined-outer-name
    """The cluster and validator, with no fault left over from a test before or for a test after."""
    cluster = gpu_cluster[0]
    cluster.clear_faults()
    yield gpu_cluster
    cluster.clear_faults()


def _validate(tmp_path, identity, **args):
    task = {'name': 'Validate', 'gpuready.nvidia.k8s_gpu_validate': dict(dict(
        {'expected': {NODE: {GPU: 4}}, 'gpus': {NODE: 4}, 'products': {NODE: 'Tesla P4'}, 'namespace': POD_NAMESPACE,
         'runtime_class': 'nvidia', 'test_pod_timeout': 120, 'timeout': 30}, **args), kubeconfig=identity.kubeconfig),
        'register': 'result', 'ignore_errors': True}
    started = time.monotonic()
    proc, results = run_tasks(str(tmp_path), [task])
    return proc, results['result'], time.monotonic() - started


def _codes(cluster, user, verb, resource, subresource=None):
    return [r['code'] for r in cluster.requests() if r['user'] == user and r['verb'] == verb
            and r['resource'] == resource and (r['subresource'] or None) == subresource]


def test_run_test_pod_replaces_a_leftover_and_deletes_its_pod(faults_cleared):
    cluster, validator = faults_cleared
    cluster.clear_requests()
    kubernetes = require.module('kubernetes')
    core = kubernetes.client.CoreV1Api(kubernetes.config.new_client_from_config(validator.kubeconfig))
    cluster.create({
        'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': 'val-pod-1', 'namespace': POD_NAMESPACE},
        'spec': {'nodeName': NODE, 'terminationGracePeriodSeconds': 1, 'containers': [
            {'name': 'old', 'image': CUDA_IMAGE, 'imagePullPolicy': 'Never', 'command': ['sleep', '3600']}]}})
    result = run_test_pod(core, POD_NAMESPACE, 'val-pod-1', CUDA_IMAGE, GPU, runtime_class='nvidia', node_name=NODE,
                          timeout=120, products=['Tesla P4'])
    assert result['ok'] is True and result['phase'] == 'Succeeded' and result['product_found'] is True, result
    assert result['log'].count('Tesla P4') == 1, result['log']  # nvidia-smi -L in a pod given one GPU
    assert not cluster.exists('v1', 'Pod', 'val-pod-1', namespace=POD_NAMESPACE)
    asked = [(r['verb'], r['code']) for r in cluster.requests() if r['user'] == validator.username
             and r['name'] == 'val-pod-1' and r['verb'] in ('create', 'delete')]
    assert asked == [('delete', 200), ('create', 201), ('delete', 200)], asked


def test_module_passes_unchanged_and_writes_the_report(tmp_path, faults_cleared):
    _cluster, validator = faults_cleared
    report = tmp_path / 'report.json'
    proc, result, _seconds = _validate(tmp_path, validator, report_path=str(report))
    assert not result.get('failed'), proc.stdout
    assert result['changed'] is False
    row = result['rows'][0]
    # The kubelet keeps a resource a stopped plugin registered (nvidia.com/gpu.shared of the renamed case) in
    # capacity with allocatable 0; validation reports it and checks what is expected.
    assert (row['node'], row['capacity'][GPU], row['allocatable'][GPU], row['ok']) == (NODE, 4, 4, True), row
    assert result['table'][0].split() == ['node', 'GPUs', 'expected', 'capacity', 'allocatable', 'test', 'pod']
    assert result['table'][1].split()[:3] == [NODE, '4', 'nvidia.com/gpu=4']
    assert result['table'][1].endswith('passed: Tesla P4')
    written = json.loads(report.read_text())
    assert written['passed'] is True and written['problems'] == []
    assert written['nodes'] == result['rows'] and written['nodes'][0]['test_pod']['product_found'] is True


def test_role_validates_the_node_from_its_facts(tmp_path, faults_cleared, node_driver):  # pylint: disable=redefined-outer-name
    cluster, validator = faults_cleared
    cluster.clear_requests()
    report = tmp_path / 'report.json'
    tasks = [
        {'name': "Gather the node's GPU facts", 'gpuready.nvidia.nvidia_gpu_facts': node_driver['facts_args'],
         'environment': node_driver['environment']},
        {'name': 'The role', 'ansible.builtin.include_role': {'name': 'gpuready.nvidia.validate'}, 'vars': {
            'validate_gpu_group': 'all', 'gpuready_node_name': NODE, 'gpuready_namespace': POD_NAMESPACE,
            'gpuready_k8s_kubeconfig': validator.kubeconfig, 'gpuready_set_as_default': False,
            'validate_timeout': 60, 'validate_test_pod_timeout': 120, 'validate_report_path': str(report)}},
        {'name': "What the role's validation registered", 'ansible.builtin.debug': {'var': 'validate_result'},
         'register': 'role'}]
    proc, results = run_tasks(str(tmp_path), tasks)
    assert proc.returncode == 0, proc.stdout[-4000:]
    result = results['role']['validate_result']
    assert result['changed'] is False and result['problems'] == []
    assert result['rows'][0]['expected'] == {GPU: 4} and result['rows'][0]['gpus'] == 4
    assert result['rows'][0]['allocatable'][GPU] == 4 and result['rows'][0]['ok'] is True
    assert result['table'][1].split()[:3] == [NODE, '4', 'nvidia.com/gpu=4']
    assert result['table'][1].endswith('passed: Tesla P4')
    assert 'passed: Tesla P4' in proc.stdout  # the table is printed
    assert json.loads(report.read_text())['passed'] is True
    assert _codes(cluster, validator.username, 'create', 'pods') == [201]


def test_validate_retries_every_kind_of_test_pod_request_and_waits_for_a_slow_one(tmp_path, faults_cleared):
    cluster, validator = faults_cleared
    cluster.clear_requests()
    cluster.inject(verb='list', resource='pods', namespace=POD_NAMESPACE, delay=2, count=1)
    cluster.inject(verb='create', resource='pods', namespace=POD_NAMESPACE, status=500, count=2)
    cluster.inject(verb='watch', resource='pods', namespace=POD_NAMESPACE, status=503, count=2)
    cluster.inject(verb='get', resource='pods', namespace=POD_NAMESPACE, subresource='log', status=500, count=1)
    cluster.inject(verb='delete', resource='pods', namespace=POD_NAMESPACE, status=503, count=1)
    proc, result, seconds = _validate(tmp_path, validator)
    assert not result.get('failed'), proc.stdout
    assert result['rows'][0]['test_pod']['ok'] is True and result['rows'][0]['test_pod']['product'] == 'Tesla P4'
    user = validator.username
    assert _codes(cluster, user, 'list', 'pods') == [200]  # answered late, not asked again
    assert seconds >= 2 + 0.5 + 1  # the slow list and two backoffs at least
    assert _codes(cluster, user, 'create', 'pods') == [500, 500, 201]
    assert _codes(cluster, user, 'watch', 'pods')[:3] == [503, 503, 200]
    assert _codes(cluster, user, 'get', 'pods', 'log') == [500, 200]
    # The leftover check before and the clean-up after: the first delete's 503 is retried (404: none there).
    assert _codes(cluster, user, 'delete', 'pods') == [503, 404, 200]
    assert not cluster.exists('v1', 'Pod', 'gpuready-gpu-test-' + NODE, namespace=POD_NAMESPACE)


def test_validate_gets_over_a_409_on_creating_the_test_pod(tmp_path, faults_cleared):
    cluster, validator = faults_cleared
    cluster.clear_requests()
    cluster.inject(verb='create', resource='pods', namespace=POD_NAMESPACE, status=409, count=1)
    proc, result, _seconds = _validate(tmp_path, validator)
    assert not result.get('failed'), proc.stdout
    assert result['rows'][0]['test_pod']['ok'] is True
    assert _codes(cluster, validator.username, 'create', 'pods') == [409, 201]
    # Before, after the 409 (nothing there: the conflict was injected) and the clean-up at the end.
    assert _codes(cluster, validator.username, 'delete', 'pods') == [404, 404, 200]
