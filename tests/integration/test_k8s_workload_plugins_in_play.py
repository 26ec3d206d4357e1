# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The filters gpu_components, owned_selectors and nfd_labels and the test owned in the expressions the
device_plugin and feature_discovery roles write, through the real ansible-playbook (no cluster:
k8s_info results are given as variables)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from playbook import run_tasks

OURS = {'app.kubernetes.io/managed-by': 'gpuready.nvidia'}
NFD_ANNOTATION = 'nfd.node.kubernetes.io/feature-labels'
PLUGIN = {'kind': 'DaemonSet', 'metadata': {'name': 'nvidia-device-plugin-daemonset', 'namespace': 'kube-system'},
          'spec': {'selector': {'matchLabels': {'name': 'nvidia-device-plugin-ds'}}, 'template': {'spec': {'containers': [
              {'name': 'nvidia-device-plugin-ctr', 'image': 'nvcr.io/nvidia/k8s-device-plugin:v0.20.0'}]}}}}


def test_the_roles_expressions_run_in_a_play(tmp_path):
    ours = dict(PLUGIN, metadata=dict(PLUGIN['metadata'], name='ours', labels=OURS))
    variables = {
        'device_plugin_daemonsets': {'resources': [PLUGIN, ours], 'api_found': True},
        'device_plugin_cluster_policies': {'resources': [], 'api_found': False},
        'device_plugin_namespace': {'metadata': {'name': 'nvidia-device-plugin', 'labels': OURS}},
        'device_plugin_runtime_class': None,
        'feature_discovery_crd': {'metadata': {'name': 'nodefeatures.nfd.k8s-sigs.io', 'labels': {}}},
        'feature_discovery_nodes': {'resources': [
            {'metadata': {'name': 'gpu-1', 'annotations': {NFD_ANNOTATION: 'pci-10de.present,nvidia.com/gpu.count'}}},
            {'metadata': {'name': 'cpu-1', 'annotations': {NFD_ANNOTATION: 'pci-8086.present'}}},
            {'metadata': {'name': 'new-1'}}]},
    }
    tasks = [{'name': 'Expressions', 'vars': variables, 'register': 'out', 'ansible.builtin.set_fact': {
        'found': "{{ device_plugin_daemonsets | gpuready.nvidia.gpu_components(device_plugin_cluster_policies) }}",
        'namespace_ours': "{{ device_plugin_namespace is gpuready.nvidia.owned }}",
        'runtime_class_ours': "{{ device_plugin_runtime_class is gpuready.nvidia.owned }}",
        'crd_foreign': "{{ feature_discovery_crd is not gpuready.nvidia.owned }}",
        'selectors': "{{ ['app.kubernetes.io/name=gpu-feature-discovery'] | gpuready.nvidia.owned_selectors }}",
        'gfd_counted': "{{ 'nvidia.com/gpu.count' in (feature_discovery_nodes.resources | first | gpuready.nvidia.nfd_labels) }}",
        'gfd_labelled': "{{ feature_discovery_nodes.resources | map('gpuready.nvidia.nfd_labels', 'nvidia.com/') | select | list }}",
    }}]
    proc, results = run_tasks(str(tmp_path), tasks, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    facts = results['out']['ansible_facts']
    assert facts['found'] == [{'component': 'device-plugin', 'kind': 'DaemonSet', 'namespace': 'kube-system',
                               'name': 'nvidia-device-plugin-daemonset', 'selector': ['name=nvidia-device-plugin-ds']}]
    assert facts['namespace_ours'] is True and facts['runtime_class_ours'] is False and facts['crd_foreign'] is True
    assert facts['selectors'] == ['app.kubernetes.io/managed-by=gpuready.nvidia', 'app.kubernetes.io/name=gpu-feature-discovery']
    assert facts['gfd_counted'] is True and facts['gfd_labelled'] == [['nvidia.com/gpu.count']]
