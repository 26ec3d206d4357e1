# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The seed problem, reproduced and fixed in the lab: the upstream device-plugin DaemonSet on
node gpu-p4 (4x Tesla P4, containerd with nvidia declared but runc the default) crash-loops
without NVML and the node gets no nvidia.com/gpu; our containerd module fixes the node, the
plugin registers 4 GPUs and a pod requesting one runs nvidia-smi. The lab's kubelet, controllers
and plugin stand-in are described in lab/README.md."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy
import json
import os
import time

import pytest
import yaml

from ansible_collections.gpuready.nvidia.plugins.module_utils import gpu_validate as gv
from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s.pods import pod_name_for, run_test_pods
from ansible_collections.gpuready.nvidia.tests.playbook import run_tasks

NODE = 'gpu-p4'
HOST = 'p4.lab.internal'
NAMESPACE = 'kube-system'
PLUGIN_LABEL = 'name=nvidia-device-plugin-ds'
MANIFEST = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'fixtures', 'manifests',
                        'nvidia-device-plugin-v0.20.0.yml')
CUDA_IMAGE = 'nvcr.io/nvidia/cuda:12.2.0-base-ubuntu22.04'
CONFIG = '/etc/containerd/config.toml'


def wait_for(what, check, timeout=90, interval=0.5):
    """check() until it returns something truthy; fails with the last value."""
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError('timed out after %ss waiting for %s; last: %r' % (timeout, what, value))


def plugin_manifest(runtime_class=None):
    with open(MANIFEST) as handle:
        manifest = yaml.safe_load(handle)
    if runtime_class:
        manifest['spec']['template']['spec']['runtimeClassName'] = runtime_class
    return manifest


def plugin_pod(k8s_api):
    pods = [p for p in k8s_api.list('v1', 'Pod', namespace=NAMESPACE, label_selector=PLUGIN_LABEL)
            if p['spec'].get('nodeName') == NODE and not p['metadata'].get('deletionTimestamp')]
    return pods[0] if len(pods) == 1 else None


def container_state(pod):
    statuses = (pod or {}).get('status', {}).get('containerStatuses') or [{}]
    return statuses[0].get('state') or {}


def gpu_resources(k8s_api):
    status = k8s_api.get('v1', 'Node', NODE)['status']
    return status['capacity'].get('nvidia.com/gpu'), status['allocatable'].get('nvidia.com/gpu')


def pod_log(k8s_api, name, namespace, previous=False):
    """pods/log with the official client, through the API server, which asks the node's kubelet."""
    from kubernetes import client, config
    api = client.CoreV1Api(config.new_client_from_config(k8s_api.kubeconfig()))
    return api.read_namespaced_pod_log(name, namespace, previous=previous)


def configure_containerd(lab, tmp_path, set_as_default):
    """Our module on the node through the lab inventory, then a containerd restart (the handler users write)."""
    exports = lab.exports()
    tmp_path.mkdir()
    tasks = [{'name': 'nvidia runtime', 'register': 'runtime',
              'gpuready.nvidia.containerd_nvidia_runtime': {'set_as_default': set_as_default}},
             {'name': 'restart containerd', 'ansible.builtin.systemd': {'name': 'containerd', 'state': 'restarted'}}]
    proc, results = run_tasks(str(tmp_path), tasks, inventory=exports['GPUREADY_LAB_INVENTORY'], hosts=HOST,
                              env={'CONTAINERS_CONF': exports['CONTAINERS_CONF'],
                                   'CONTAINERS_STORAGE_CONF': exports['CONTAINERS_STORAGE_CONF']})
    assert proc.returncode == 0, proc.stdout[-4000:]
    return results['runtime']


def gpu_test_pod(name, gpus, runtime_class=None, command=('nvidia-smi',)):
    spec = {'restartPolicy': 'OnFailure', 'nodeSelector': {'kubernetes.io/hostname': NODE},
            'containers': [{'name': 'cuda', 'image': CUDA_IMAGE, 'command': list(command),
                            'resources': {'limits': {'nvidia.com/gpu': gpus}}}]}
    if runtime_class:
        spec['runtimeClassName'] = runtime_class
    return {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': name, 'namespace': 'default'}, 'spec': spec}


@pytest.fixture
def seed_node(lab, k8s_api):
    """gpu-p4 in the seed state before and after the test: the original containerd config
    (containerd restarted), no plugin DaemonSet, no RuntimeClass, no test pods."""
    container = lab.container(NODE)
    original = lab.node_exec(container, 'cat', CONFIG)
    assert 'default_runtime_name = "runc"' in original

    def clean():
        for kind, name, namespace in (('DaemonSet', 'nvidia-device-plugin-daemonset', NAMESPACE),
                                      ('RuntimeClass', 'nvidia', None)):
            api_version = 'apps/v1' if kind == 'DaemonSet' else 'node.k8s.io/v1'
            if k8s_api.exists(api_version, kind, name, namespace=namespace):
                k8s_api.delete(api_version, kind, name, namespace=namespace)
        for pod in k8s_api.list('v1', 'Pod', namespace='default', label_selector='gpuready.test=seed'):
            k8s_api.delete('v1', 'Pod', pod['metadata']['name'], namespace='default')
        wait_for('the plugin pods to go',
                 lambda: not k8s_api.list('v1', 'Pod', namespace=NAMESPACE, label_selector=PLUGIN_LABEL))

    clean()
    yield container
    clean()
    lab.podman('exec', '-i', container, 'sh', '-c', 'cat > %s' % CONFIG, stdin=original)
    lab.node_exec(container, 'systemctl', 'restart', 'containerd')


def labelled(pod):
    pod = copy.deepcopy(pod)
    pod['metadata']['labels'] = {'gpuready.test': 'seed'}
    return pod


def test_seed_reproduced_and_fixed_with_nvidia_as_default(lab, k8s_api, seed_node, tmp_path):
    # 1. The seed: the upstream static manifest, containerd's default runtime still runc.
    k8s_api.create(plugin_manifest())
    pod = wait_for('the plugin pod on %s to crash-loop' % NODE,
                   lambda: (container_state(plugin_pod(k8s_api)).get('waiting', {}).get('reason') == 'CrashLoopBackOff'
                            and plugin_pod(k8s_api)))
    log = pod_log(k8s_api, pod['metadata']['name'], NAMESPACE, previous=True)
    assert 'could not load NVML library' in log and 'Incompatible strategy detected auto' in log, log
    assert pod['status']['containerStatuses'][0]['restartCount'] >= 1
    assert pod['status']['containerStatuses'][0]['lastState']['terminated']['exitCode'] == 1
    assert gpu_resources(k8s_api) == (None, None)
    events = k8s_api.list('v1', 'Event', namespace=NAMESPACE,
                          field_selector='involvedObject.name=%s' % pod['metadata']['name'])
    assert 'BackOff' in [e['reason'] for e in events], [(e['reason'], e['message']) for e in events]

    # 2. The fix: our module makes nvidia the default, containerd restarts, the plugin pod is
    # recreated (what `kubectl rollout restart` does; the crash loop would also retry by itself).
    result = configure_containerd(lab, tmp_path / 'fix', set_as_default=True)
    assert result['changed'] is True
    assert 'default_runtime_name = "nvidia"' in lab.node_exec(seed_node, 'cat', CONFIG)
    k8s_api.delete('v1', 'Pod', pod['metadata']['name'], namespace=NAMESPACE)
    wait_for('the new plugin pod to run', lambda: 'running' in container_state(plugin_pod(k8s_api)))
    assert wait_for('nvidia.com/gpu on %s' % NODE, lambda: gpu_resources(k8s_api) == ('4', '4')), gpu_resources(k8s_api)
    plugin = plugin_pod(k8s_api)
    assert 'Registered device plugin for \'nvidia.com/gpu\' with Kubelet' in pod_log(
        k8s_api, plugin['metadata']['name'], NAMESPACE)
    assert 'nvidia-gpu.sock' in lab.node_exec(seed_node, 'ls', '/var/lib/kubelet/device-plugins').split()

    # 3. A pod asking for one GPU runs nvidia-smi and sees exactly one Tesla P4.
    k8s_api.create(labelled(gpu_test_pod('gpu-test', 1)))
    done = wait_for('gpu-test to succeed', lambda: k8s_api.get('v1', 'Pod', 'gpu-test', namespace='default')
                    ['status'].get('phase') == 'Succeeded')
    assert done
    log = pod_log(k8s_api, 'gpu-test', 'default')
    assert log.count('Tesla P4') == 1 and 'Driver Version: 535.183.01' in log, log

    # 4. Five GPUs fit on no node: Pending with the scheduler's message.
    k8s_api.create(labelled(gpu_test_pod('gpu-test-5', 5)))
    condition = wait_for('gpu-test-5 to be unschedulable', lambda: [
        c for c in k8s_api.get('v1', 'Pod', 'gpu-test-5', namespace='default')['status'].get('conditions', [])
        if c['type'] == 'PodScheduled' and c['status'] == 'False'])
    nodes = len(k8s_api.list('v1', 'Node', label_selector='gpuready.lab/node=true'))  # what the lab schedules onto
    assert condition[0]['reason'] == 'Unschedulable'
    # gpu-p4 (selected) has 4, the other lab nodes are not selected
    assert condition[0]['message'].startswith('0/%d nodes are available: 1 Insufficient nvidia.com/gpu' % nodes), (
        condition[0]['message'])
    pod5 = k8s_api.get('v1', 'Pod', 'gpu-test-5', namespace='default')
    assert pod5['status']['phase'] == 'Pending' and not pod5['spec'].get('nodeName')
    events = k8s_api.list('v1', 'Event', namespace='default', field_selector='involvedObject.name=gpu-test-5')
    assert condition[0]['message'] in [e['message'] for e in events if e['reason'] == 'FailedScheduling']

    # 5. Removing the plugin keeps the capacity and drops allocatable to 0, as a kubelet does.
    k8s_api.delete('apps/v1', 'DaemonSet', 'nvidia-device-plugin-daemonset', namespace=NAMESPACE)
    assert wait_for('allocatable 0', lambda: gpu_resources(k8s_api) == ('4', '0')), gpu_resources(k8s_api)


def test_seed_fixed_with_a_runtime_class(lab, k8s_api, seed_node, tmp_path):
    """nvidia stays a non-default runtime; the plugin and the workload select it by RuntimeClass."""
    result = configure_containerd(lab, tmp_path / 'fix', set_as_default=False)
    assert 'default_runtime_name = "runc"' in lab.node_exec(seed_node, 'cat', CONFIG), result
    k8s_api.create({'apiVersion': 'node.k8s.io/v1', 'kind': 'RuntimeClass', 'metadata': {'name': 'nvidia'},
                    'handler': 'nvidia'})
    k8s_api.create(plugin_manifest(runtime_class='nvidia'))
    wait_for('the plugin pod to run', lambda: 'running' in container_state(plugin_pod(k8s_api)))
    assert wait_for('nvidia.com/gpu on %s' % NODE, lambda: gpu_resources(k8s_api)[1] == '4'), gpu_resources(k8s_api)

    k8s_api.create(labelled(gpu_test_pod('gpu-test-rc', 1, runtime_class='nvidia')))
    wait_for('gpu-test-rc to succeed', lambda: k8s_api.get('v1', 'Pod', 'gpu-test-rc', namespace='default')
             ['status'].get('phase') == 'Succeeded')
    log = pod_log(k8s_api, 'gpu-test-rc', 'default')
    assert log.count('Tesla P4') == 1, log

    # Without the RuntimeClass the pod still gets a GPU assigned, but runc injects nothing.
    k8s_api.create(labelled(gpu_test_pod('gpu-test-runc', 1, command=('sh', '-c', 'nvidia-smi; echo "rc=$?"'))))
    wait_for('gpu-test-runc to finish', lambda: k8s_api.get('v1', 'Pod', 'gpu-test-runc', namespace='default')
             ['status'].get('phase') == 'Succeeded')
    log = pod_log(k8s_api, 'gpu-test-runc', 'default')
    assert 'nvidia-smi: not found' in log and 'rc=127' in log, log


def manifest_objects(name):
    """The items of a manifest file holding one List."""
    with open(os.path.join(os.path.dirname(MANIFEST), name)) as handle:
        return yaml.safe_load(handle)['items']


@pytest.fixture
def nfd_namespace(k8s_api, seed_node):  # pylint: disable=redefined-outer-name,unused-argument
    """The namespace node-feature-discovery with nothing in it; afterwards it is gone, with the
    cluster-scoped objects of the GFD and NFD manifests and the labels NFD put on gpu-p4."""
    def clean():
        if k8s_api.exists('v1', 'Namespace', 'node-feature-discovery'):
            k8s_api.delete('v1', 'Namespace', 'node-feature-discovery')
        for doc in manifest_objects('gpu-feature-discovery-v0.20.0.yml') + manifest_objects('nfd-v0.17.3.yml'):
            if doc['kind'] in ('ClusterRole', 'ClusterRoleBinding') and k8s_api.exists(
                    doc['apiVersion'], doc['kind'], doc['metadata']['name']):
                k8s_api.delete(doc['apiVersion'], doc['kind'], doc['metadata']['name'])
        if k8s_api.exists('node.k8s.io/v1', 'RuntimeClass', 'nvidia'):
            k8s_api.delete('node.k8s.io/v1', 'RuntimeClass', 'nvidia')
        labels = k8s_api.get('v1', 'Node', NODE)['metadata'].get('labels') or {}
        drop = dict((k, None) for k in labels if k.startswith('nvidia.com/') or k.startswith('feature.node.'))
        k8s_api.patch('v1', 'Node', NODE, {'metadata': {'labels': drop, 'annotations': {
            'nfd.node.kubernetes.io/feature-labels': None}}})

    clean()
    k8s_api.create({'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': 'node-feature-discovery'}})
    yield 'node-feature-discovery'
    clean()


def test_gfd_labels_the_node_only_through_nfd(lab, k8s_api, nfd_namespace):  # pylint: disable=redefined-outer-name
    """GFD (NodeFeature API mode) on the seed node through a RuntimeClass: its NodeFeature holds
    the labels of the GFD case, but the Node gets them only once NFD runs."""
    from ansible_collections.gpuready.nvidia.tests import gfd_cases

    case = [c for _f, c in gfd_cases.load(gfd_cases.PUBLIC) if c['name'] == 'seed-4x-tesla-p4-driver-535'][0]
    k8s_api.create({'apiVersion': 'node.k8s.io/v1', 'kind': 'RuntimeClass', 'metadata': {'name': 'nvidia'},
                    'handler': 'nvidia'})
    # GFD's affinity needs a PCI label from NFD or nvidia.com/gpu.present (its "forced deployment" term).
    k8s_api.patch('v1', 'Node', NODE, {'metadata': {'labels': {'nvidia.com/gpu.present': 'true'}}})
    for doc in manifest_objects('gpu-feature-discovery-v0.20.0.yml'):
        if doc['kind'] == 'DaemonSet':
            doc['spec']['template']['spec']['runtimeClassName'] = 'nvidia'
        k8s_api.create(doc)
    feature = wait_for('GFD to write its NodeFeature', lambda: k8s_api.exists(
        'nfd.k8s-sigs.io/v1alpha1', 'NodeFeature', 'nvidia-features-for-' + NODE, namespace=nfd_namespace) and k8s_api.get(
        'nfd.k8s-sigs.io/v1alpha1', 'NodeFeature', 'nvidia-features-for-' + NODE, namespace=nfd_namespace))
    gfd_cases.check_labels(case, feature['spec']['labels'])
    assert feature['metadata']['labels'] == {'nfd.node.kubernetes.io/node-name': NODE}
    time.sleep(2)  # NFD is not deployed: nothing may label the node meanwhile
    labels = k8s_api.get('v1', 'Node', NODE)['metadata']['labels']
    assert 'nvidia.com/gpu.product' not in labels, labels

    for doc in manifest_objects('nfd-v0.17.3.yml'):
        k8s_api.create(doc)
    labels = wait_for('NFD to label the node', lambda: (
        k8s_api.get('v1', 'Node', NODE)['metadata']['labels'].get('nvidia.com/gpu.product') == 'Tesla-P4'
        and k8s_api.get('v1', 'Node', NODE)['metadata']['labels'].get('feature.node.kubernetes.io/pci-10de.present')
        and k8s_api.get('v1', 'Node', NODE)['metadata']['labels']))
    gfd_cases.check_labels(case, dict((k, v) for k, v in labels.items() if k.startswith('nvidia.com/')
                                      and k != 'nvidia.com/gpu.present'))
    assert labels['feature.node.kubernetes.io/pci-10de.present'] == 'true'
    managed = k8s_api.get('v1', 'Node', NODE)['metadata']['annotations']['nfd.node.kubernetes.io/feature-labels']
    assert 'nvidia.com/gpu.product' in managed.split(',') and 'pci-10de.present' in managed.split(',')

    # GFD gone, its NodeFeature deleted: NFD takes back the labels it had set.
    k8s_api.delete('apps/v1', 'DaemonSet', 'gpu-feature-discovery', namespace=nfd_namespace)
    k8s_api.delete('nfd.k8s-sigs.io/v1alpha1', 'NodeFeature', 'nvidia-features-for-' + NODE, namespace=nfd_namespace)
    wait_for('NFD to remove the GPU labels', lambda: 'nvidia.com/gpu.product' not in k8s_api.get(
        'v1', 'Node', NODE)['metadata']['labels'])


def test_plugin_config_time_slicing_renamed(lab, k8s_api, seed_node):  # pylint: disable=unused-argument
    """The plugin's config file (a ConfigMap, CONFIG_FILE): 4 replicas per GPU, renameByDefault."""
    config = ('version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n'
              '      - name: nvidia.com/gpu\n        replicas: 4\n')
    k8s_api.create({'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'plugin-config', 'namespace': NAMESPACE},
                    'data': {'config.yaml': config}})
    try:
        k8s_api.create({'apiVersion': 'node.k8s.io/v1', 'kind': 'RuntimeClass', 'metadata': {'name': 'nvidia'},
                        'handler': 'nvidia'})
        manifest = plugin_manifest(runtime_class='nvidia')
        spec = manifest['spec']['template']['spec']
        spec['containers'][0]['env'] = [{'name': 'CONFIG_FILE', 'value': '/config/config.yaml'}]
        spec['containers'][0]['volumeMounts'].append({'name': 'config', 'mountPath': '/config'})
        spec['volumes'].append({'name': 'config', 'configMap': {'name': 'plugin-config'}})
        k8s_api.create(manifest)
        wait_for('16 shared GPUs', lambda: k8s_api.get('v1', 'Node', NODE)['status']['allocatable'].get(
            'nvidia.com/gpu.shared') == '16')
        assert k8s_api.get('v1', 'Node', NODE)['status']['capacity']['nvidia.com/gpu.shared'] == '16'
        log = pod_log(k8s_api, plugin_pod(k8s_api)['metadata']['name'], NAMESPACE)
        assert "Registered device plugin for 'nvidia.com/gpu.shared' with Kubelet" in log, log
    finally:
        k8s_api.delete('v1', 'ConfigMap', 'plugin-config', namespace=NAMESPACE)


def test_pods_that_cannot_start_say_why(lab, k8s_api, seed_node):  # pylint: disable=unused-argument
    """An image the node does not have, and a RuntimeClass that does not exist."""
    missing_image = labelled(gpu_test_pod('no-image', 0, command=('true',)))
    missing_image['spec']['containers'][0]['image'] = 'docker.io/library/nginx:1.27'
    del missing_image['spec']['containers'][0]['resources']
    no_class = labelled(gpu_test_pod('no-class', 0, runtime_class='missing', command=('true',)))
    del no_class['spec']['containers'][0]['resources']
    for pod in (missing_image, no_class):
        k8s_api.create(pod)
    waiting = wait_for('ErrImagePull', lambda: container_state(k8s_api.get('v1', 'Pod', 'no-image', namespace='default'))
                       .get('waiting', {}).get('reason') in ('ErrImagePull', 'ImagePullBackOff')
                       and container_state(k8s_api.get('v1', 'Pod', 'no-image', namespace='default'))['waiting'])
    assert 'docker.io/library/nginx:1.27' in waiting['message']
    events = wait_for('FailedCreatePodSandBox', lambda: [
        e for e in k8s_api.list('v1', 'Event', namespace='default', field_selector='involvedObject.name=no-class')
        if e['reason'] == 'FailedCreatePodSandBox'])
    assert events[0]['message'] == 'Failed to create pod sandbox: runtimeclass.node.k8s.io "missing" not found'
    assert events[0]['type'] == 'Warning' and events[0]['source']['host'] == NODE
    assert k8s_api.get('v1', 'Pod', 'no-class', namespace='default')['status']['phase'] == 'Pending'


def test_a_pod_deleted_while_containerd_is_down_is_stopped_once_it_is_back(lab_module, lab, k8s_api, seed_node):
    """The kubelet's pod cleanup retries: a sandbox it could not stop stays on its list (a plugin pod left
    running would keep advertising its GPUs)."""
    def sandboxes():
        return set(json.loads(lab.node_exec(seed_node, *(lab_module.CRI + ['pods']))))

    before = sandboxes()
    pod = labelled(gpu_test_pod('orphan', 0, command=('sleep', '3600')))
    del pod['spec']['containers'][0]['resources']
    k8s_api.create(pod)
    wait_for('the pod to run', lambda: k8s_api.get('v1', 'Pod', 'orphan', namespace='default')['status'].get(
        'phase') == 'Running')
    sandbox = wait_for('its sandbox', lambda: sandboxes() - before)
    lab.node_exec(seed_node, 'systemctl', 'stop', 'containerd')
    try:
        k8s_api.delete('v1', 'Pod', 'orphan', namespace='default')
        time.sleep(3)  # the kubelet's cleanup passes meet containerd down
    finally:
        lab.node_exec(seed_node, 'systemctl', 'start', 'containerd')
    assert sandbox <= sandboxes()  # stopping containerd left the pod running
    wait_for('the kubelet to stop the sandbox', lambda: not sandbox & sandboxes())


def test_gfd_file_output_reaches_the_node_through_nfd_worker(lab, k8s_api, nfd_namespace):
    """GFD with the NodeFeature API off writes features.d/gfd on the node; nfd-worker publishes it."""
    k8s_api.create({'apiVersion': 'node.k8s.io/v1', 'kind': 'RuntimeClass', 'metadata': {'name': 'nvidia'},
                    'handler': 'nvidia'})
    for doc in manifest_objects('nfd-v0.17.3.yml') + manifest_objects('gpu-feature-discovery-v0.20.0.yml'):
        if doc['kind'] == 'DaemonSet' and doc['metadata']['name'] == 'gpu-feature-discovery':
            spec = doc['spec']['template']['spec']
            spec['runtimeClassName'] = 'nvidia'
            spec['containers'][0]['env'].append({'name': 'GFD_USE_NODE_FEATURE_API', 'value': 'false'})
        k8s_api.create(doc)
    wait_for('the GPU labels from the file', lambda: k8s_api.get('v1', 'Node', NODE)['metadata']['labels'].get(
        'nvidia.com/gpu.count') == '4')
    content = lab.node_exec(lab.container(NODE), 'cat', '/etc/kubernetes/node-feature-discovery/features.d/gfd')
    assert 'nvidia.com/gpu.product=Tesla-P4\n' in content
    feature = k8s_api.get('nfd.k8s-sigs.io/v1alpha1', 'NodeFeature', NODE, namespace=nfd_namespace)
    assert feature['spec']['labels']['nvidia.com/gpu.product'] == 'Tesla-P4'
    assert not k8s_api.exists('nfd.k8s-sigs.io/v1alpha1', 'NodeFeature', 'nvidia-features-for-' + NODE,
                              namespace=nfd_namespace)


def test_validation_test_pods_on_the_node(lab, k8s_api, seed_node):  # pylint: disable=unused-argument
    """k8s_gpu_validate's test pod on gpu-p4 for real, the plugin and the pod through RuntimeClass nvidia (runc
    stays containerd's default): nvidia-smi names the product; a resource nobody advertises times out with the
    scheduler's reason. Both pods are deleted."""
    from kubernetes import client, config
    core = client.CoreV1Api(config.new_client_from_config(k8s_api.kubeconfig()))
    k8s_api.create({'apiVersion': 'node.k8s.io/v1', 'kind': 'RuntimeClass', 'metadata': {'name': 'nvidia'},
                    'handler': 'nvidia'})
    k8s_api.create(plugin_manifest(runtime_class='nvidia'))
    rows = gv.wait_for_resources(core, {NODE: {'nvidia.com/gpu': 4}}, label_selector='kubernetes.io/hostname=' + NODE,
                                 timeout=180)
    assert rows[0]['ok'], rows

    result = run_test_pods(core, [{'node': NODE, 'resource': 'nvidia.com/gpu', 'products': ['Tesla P4']}], 'default',
                           CUDA_IMAGE, runtime_class='nvidia', timeout=120)[0]
    assert result['ok'] is True and result['phase'] == 'Succeeded', result
    assert result['product'] == 'Tesla P4' and result['log'].count('Tesla P4') == 1, result['log']
    assert not k8s_api.exists('v1', 'Pod', pod_name_for(NODE), namespace='default')

    result = run_test_pods(core, [{'node': NODE, 'resource': 'example.com/none'}], 'default', CUDA_IMAGE,
                           runtime_class='nvidia', timeout=15)[0]
    assert result['ok'] is False and result['phase'] == 'Pending', result
    assert result['problem'].startswith('node gpu-p4: test pod default/gpuready-gpu-test-gpu-p4 asking for 1 '
                                        'example.com/none did not finish within 15 s (not scheduled: ')
    assert 'Insufficient example.com/none' in result['problem']
    assert not k8s_api.exists('v1', 'Pod', pod_name_for(NODE), namespace='default')
