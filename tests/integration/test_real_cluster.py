# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The seed on the real cluster (lab/lab.py --kubernetes real): kube-apiserver, scheduler and controllers
1.37, the real kubelet on gpu-p4, and the real NVIDIA device plugin (lab/go) loading the fake NVML that
the node's nvidia runtime gives it. Nothing here answers with the collection's own code: the plugin's
errors, the Node's capacity and the scheduler's message are the upstream programs' own."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
import time

import pytest
import yaml

import require
from playbook import run_tasks

NODE = 'gpu-p4'
HOST = 'p4.lab.internal'
NAMESPACE = 'kube-system'
PLUGIN_LABEL = 'name=nvidia-device-plugin-ds'
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')
MANIFEST = os.path.join(ROOT, 'tests', 'fixtures', 'manifests', 'nvidia-device-plugin-v0.20.0.yml')
CUDA_IMAGE = 'nvcr.io/nvidia/cuda:12.2.0-base-ubuntu22.04'
CONFIG = '/etc/containerd/config.toml'
NVML_MISSING = 'Failed to initialize NVML: ERROR_LIBRARY_NOT_FOUND'


def _pinned_plugin():
    with open(os.path.join(ROOT, 'lab', 'go', 'device-plugin', 'go.mod')) as handle:
        return re.search(r'^\s*github\.com/NVIDIA/k8s-device-plugin (v\S+)', handle.read(), re.M).group(1)


def wait_for(what, check, timeout=120, interval=0.5):
    """check() until it returns something truthy; fails with the last value."""
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError('timed out after %ss waiting for %s; last: %r' % (timeout, what, value))


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


def plugin_pod(core):
    pods = [p for p in core.list_namespaced_pod(NAMESPACE, label_selector=PLUGIN_LABEL).items
            if p.spec.node_name == NODE and not p.metadata.deletion_timestamp]
    return pods[0] if len(pods) == 1 else None


def plugin_status(core):
    pod = plugin_pod(core)
    return pod, (pod.status.container_statuses or [None])[0] if pod else None


def crash_looping(core, uid=None, restarted_more_than=-1):
    """The plugin pod and its container status while it waits in CrashLoopBackOff (optionally: this pod,
    after more than so many restarts), else None."""
    pod, status = plugin_status(core)
    if not (status and status.state.waiting and status.state.waiting.reason == 'CrashLoopBackOff'):
        return None
    if (uid and pod.metadata.uid != uid) or status.restart_count <= restarted_more_than:
        return None
    return pod, status


def gpu_resources(core):
    status = core.read_node(NODE).status
    return status.capacity.get('nvidia.com/gpu'), status.allocatable.get('nvidia.com/gpu')


def configure_containerd(real_lab, tmp_path):
    """containerd_nvidia_runtime on the node through the lab's inventory, then a containerd restart."""
    exports = real_lab.exports()
    tasks = [{'name': 'nvidia runtime', 'register': 'runtime',
              'gpuready.nvidia.containerd_nvidia_runtime': {'set_as_default': True}},
             {'name': 'restart containerd', 'ansible.builtin.systemd': {'name': 'containerd', 'state': 'restarted'}}]
    proc, results = run_tasks(str(tmp_path), tasks, inventory=exports['GPUREADY_LAB_INVENTORY'], hosts=HOST,
                              env={'CONTAINERS_CONF': exports['CONTAINERS_CONF'],
                                   'CONTAINERS_STORAGE_CONF': exports['CONTAINERS_STORAGE_CONF']})
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
    pod, status = wait_for('the plugin pod to crash-loop', lambda: crash_looping(core))
    log = core.read_namespaced_pod_log(pod.metadata.name, NAMESPACE, previous=True)
    assert NVML_MISSING in log, log
    assert status.last_state.terminated.exit_code == 1
    assert gpu_resources(core) == (None, None)

    # 2. The fix: our module makes nvidia the default, containerd restarts.
    result = configure_containerd(real_lab, tmp_path)
    assert result['changed'] is True
    assert 'default_runtime_name = "nvidia"' in real_lab.node_exec(real_lab.container(NODE), 'cat', CONFIG)

    # 3. The crash-looping pod does not recover by itself: its sandbox was made with runc, and the kubelet
    # restarts the container in that sandbox, so the next run fails the same way. (Its log is the
    # last run's while it waits to be restarted.)
    restarts = plugin_status(core)[1].restart_count
    wait_for('the next restart of the crash-looping plugin pod to fail',
             lambda: crash_looping(core, pod.metadata.uid, restarts), timeout=300)
    assert NVML_MISSING in core.read_namespaced_pod_log(pod.metadata.name, NAMESPACE)
    assert gpu_resources(core) == (None, None)

    # 4. A new pod (what `kubectl rollout restart` makes) gets a sandbox from the nvidia runtime: the real
    # plugin registers the four GPUs with the real kubelet.
    core.delete_namespaced_pod(pod.metadata.name, NAMESPACE)
    wait_for('nvidia.com/gpu on %s' % NODE, lambda: gpu_resources(core) == ('4', '4'))
    new_pod = plugin_pod(core)
    assert new_pod.metadata.uid != pod.metadata.uid
    assert "Registered device plugin for 'nvidia.com/gpu' with Kubelet" in core.read_namespaced_pod_log(
        new_pod.metadata.name, NAMESPACE)

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
