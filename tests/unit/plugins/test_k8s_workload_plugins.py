# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The filters gpu_components, owned_selectors, gfd_diagnosis and nfd_labels and the test owned: the names the roles call, over
module_utils/k8s/workloads.py (whose classifier is tested in tests/unit/module_utils/k8s/test_workloads.py).
The same expressions as the roles write them, through ansible-playbook: tests/integration/test_k8s_workload_plugins_in_play.py."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpuready.nvidia.plugins.filter.gfd_diagnosis import FilterModule as GfdDiagnosis
from ansible_collections.gpuready.nvidia.plugins.filter.gpu_components import FilterModule
from ansible_collections.gpuready.nvidia.plugins.filter.nfd_labels import FilterModule as NfdLabels
from ansible_collections.gpuready.nvidia.plugins.test.owned import TestModule as OwnedTests

FILTERS = FilterModule().filters()
OWNED = OwnedTests().tests()['owned']
OURS = {'app.kubernetes.io/managed-by': 'gpuready.nvidia'}


def _daemonset(name, labels=None):
    return {'kind': 'DaemonSet', 'metadata': {'name': name, 'namespace': 'gpu', 'labels': labels or {}},
            'spec': {'selector': {'matchLabels': {'app': name}}, 'template': {'spec': {'containers': [
                {'name': 'c', 'image': 'nvcr.io/nvidia/k8s-device-plugin:v0.20.0', 'command': ['nvidia-device-plugin']}]}}}}


def test_the_plugins_are_registered_under_their_names():
    assert sorted(FILTERS) == ['gpu_components', 'owned_selectors']
    assert sorted(OwnedTests().tests()) == ['owned']


def test_gpu_components_takes_k8s_info_results():
    daemonsets = {'resources': [_daemonset('theirs'), _daemonset('ours', OURS)], 'api_found': True}
    policies = {'resources': [], 'api_found': False}
    assert FILTERS['gpu_components'](daemonsets, policies) == [
        {'component': 'device-plugin', 'kind': 'DaemonSet', 'namespace': 'gpu', 'name': 'theirs', 'selector': ['app=theirs']}]
    assert FILTERS['gpu_components']({}, {}) == []  # a skipped or empty k8s_info


def test_gpu_components_refuses_what_is_not_a_list_of_objects():
    with pytest.raises(AnsibleFilterError, match='gpu_components'):
        FILTERS['gpu_components']({'resources': ['not an object']})


def test_owned_selectors_put_ours_first():
    assert FILTERS['owned_selectors'](['app.kubernetes.io/name=gpu-feature-discovery']) == [
        'app.kubernetes.io/managed-by=gpuready.nvidia', 'app.kubernetes.io/name=gpu-feature-discovery']
    assert FILTERS['owned_selectors'](None) == ['app.kubernetes.io/managed-by=gpuready.nvidia']


@pytest.mark.parametrize('obj, ours', [
    ({'metadata': {'labels': OURS}}, True),
    ({'metadata': {'labels': {'app.kubernetes.io/managed-by': 'Helm'}}}, False),
    ({'metadata': {'labels': None}}, False),
    ({'metadata': {'name': 'no-labels'}}, False),
    (None, False),
])
def test_owned_is_the_managed_by_label(obj, ours):
    assert OWNED(obj) is ours


def test_gfd_diagnosis_takes_the_k8s_info_node_or_nothing():
    gfd_diagnosis = GfdDiagnosis().filters()['gfd_diagnosis']
    assert gfd_diagnosis(None, 'gpu-1').startswith('node gpu-1 does not exist')
    assert gfd_diagnosis({}, 'gpu-1').startswith('node gpu-1 does not exist')
    assert gfd_diagnosis({'metadata': {'name': 'gpu-1'}}, 'gpu-1', [], 'gpu', 60).startswith(
        'node gpu-1 has no GFD labels after 60 s. No GFD pod runs there')


def test_nfd_labels_takes_the_k8s_info_node_and_a_prefix():
    nfd_labels = NfdLabels().filters()['nfd_labels']
    node = {'metadata': {'annotations': {'nfd.node.kubernetes.io/feature-labels': 'pci-10de.present,nvidia.com/gpu.count'}}}
    assert nfd_labels(node) == ['pci-10de.present', 'nvidia.com/gpu.count']
    assert nfd_labels(node, 'nvidia.com/') == ['nvidia.com/gpu.count']
    assert nfd_labels(None) == []
