# -*- coding: utf-8 -*-
"""The lab on the real control plane (lab/lab.py): Nodes written by the real kubelet,
pods on a CNI network that reach the API server through the `kubernetes` Service (kube-proxy)."""

from __future__ import absolute_import, division, print_function

import ipaddress
import os
import re

import pytest

import require

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', '..')


def _pinned_kubernetes():
    with open(os.path.join(ROOT, 'lab', 'go', 'kubernetes', 'go.mod')) as handle:
        return re.search(r'^\s*k8s\.io/kubernetes (v\S+)', handle.read(), re.M).group(1)


@pytest.fixture(scope='module')
def core(real_lab):
    kubernetes = require.module('kubernetes')
    api = kubernetes.config.new_client_from_config(real_lab.state['kubeconfig'])
    return kubernetes, kubernetes.client.CoreV1Api(api)


def _run_pod(kubernetes, core, name, command, timeout=120):
    """Creates a runc pod on gpu-p4 and follows it (a watch) until it ends; returns (pod, log)."""
    core.create_namespaced_pod('default', {
        'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': name},
        'spec': {'restartPolicy': 'Never', 'nodeName': 'gpu-p4',
                 'containers': [{'name': 'c', 'image': 'localhost/gpuready-lab/workload:1',
                                 'imagePullPolicy': 'Never', 'command': ['/bin/sh', '-c', command]}]}})
    watch = kubernetes.watch.Watch()
    pod = None
    for event in watch.stream(core.list_namespaced_pod, 'default', field_selector='metadata.name=' + name,
                              timeout_seconds=timeout):
        pod = event['object']
        if pod.status.phase in ('Succeeded', 'Failed'):
            watch.stop()
    assert pod is not None and pod.status.phase == 'Succeeded', pod and pod.status
    return pod, core.read_namespaced_pod_log(name, 'default')


def test_nodes_are_written_by_the_real_kubelet(real_lab, core):
    _kubernetes, api = core
    nodes = api.list_node().items  # the official client validates what a real kubelet writes
    assert [node.metadata.name for node in nodes] == ['gpu-p4']
    node = nodes[0]
    assert node.status.node_info.kubelet_version == _pinned_kubernetes()
    assert node.status.node_info.system_uuid
    assert node.status.node_info.container_runtime_version.startswith('containerd://1.6.')
    assert [a.address for a in node.status.addresses if a.type == 'InternalIP'] == [
        real_lab.state['nodes']['gpu-p4']['ip']]
    assert node.spec.pod_cidr, 'node IPAM gave the node no podCIDR'
    ready = [c for c in node.status.conditions if c.type == 'Ready']
    assert ready[0].status == 'True', ready


def test_pods_get_the_node_network_and_reach_the_api_through_the_service(core):
    kubernetes, api = core
    pod, log = _run_pod(kubernetes, api, 'service-probe',
                        "printf 'GET /version HTTP/1.0\\r\\n\\r\\n' | "
                        "nc -w 5 $KUBERNETES_SERVICE_HOST $KUBERNETES_SERVICE_PORT")
    node = api.read_node('gpu-p4')
    assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network(node.spec.pod_cidr)
    # kube-proxy sent the Service's address to the API server's TLS port, which answers plain HTTP so
    assert 'Client sent an HTTP request to an HTTPS server.' in log
