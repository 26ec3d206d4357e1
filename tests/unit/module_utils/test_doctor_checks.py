# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""doctor_checks.py and the doctor's explicit table of checks: one check per link, in the chain's
order, each a function of doctor_checks. What each check finds: tests/unit/module_utils/test_doctor.py."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from ansible_collections.gpuready.nvidia.plugins.module_utils import doctor, doctor_checks
from ansible_collections.gpuready.nvidia.plugins.module_utils.doctor_causes import LINKS, Finding


def test_the_table_has_one_check_per_link_in_chain_order():
    assert tuple(link for link, _check in doctor.CHECKS) == LINKS
    for link, check in doctor.CHECKS:
        assert check is getattr(doctor_checks, 'check_' + link)


def test_the_node_evidence_reads_settings_and_the_test_pod():
    api = {'daemonsets': [], 'nodes': {'n1': {'node': {'metadata': {'name': 'n1'}}, 'pods': []}}}
    n = doctor_checks.NodeEvidence('n1', None, api, None, {}, {'ok': False, 'pod': 'p', 'problem': 'exit code 1'})
    assert (n.runtime_name, n.mig_strategy, n.expected, n.dev_root) == ('nvidia', 'none', {}, '/dev')
    assert n.node == {'metadata': {'name': 'n1'}} and n.plugin_daemonsets() == [] and n.plugin_pods() == []
    with pytest.raises(Finding) as found:
        doctor_checks.check_driver(n)
    assert found.value.cause == 'node_not_inspected'
    api['unscheduled_gpu_pods'] = []
    with pytest.raises(Finding) as found:
        doctor_checks.check_workload(n)
    assert found.value.cause == 'test_pod_failed' and found.value.evidence == ['test pod p: exit code 1']


# --- why GFD's labels did not come (the feature_discovery role's message, filter gfd_diagnosis) ----

NODE = {'metadata': {'name': 'gpu-1'}}


def test_a_missing_node_says_to_set_the_node_name():
    assert doctor_checks.why_no_gfd_labels(None, 'gpu-1', [], 'gpu', 300) == (
        "node gpu-1 does not exist (set gpuready_node_name to the host's Kubernetes Node name)")


def test_without_a_gfd_pod_it_says_why_none_may_run():
    assert doctor_checks.why_no_gfd_labels(NODE, 'gpu-1', [], 'gpu', 300) == (
        "node gpu-1 has no GFD labels after 300 s. No GFD pod runs there: the node carries neither "
        "feature.node.kubernetes.io/pci-10de.present=true (nfd-worker's PCI scan) nor nvidia.com/gpu.present=true "
        "(gpuready.nvidia.node_labels), or it has a taint feature_discovery_tolerations does not tolerate.")


def test_each_gfd_pod_gives_its_phase_states_restarts_and_log_command():
    crashing = {'state': {'waiting': {'reason': 'CrashLoopBackOff'}}, 'restartCount': 4}
    pods = [{'metadata': {'name': 'gfd-a'}, 'status': {'phase': 'Running', 'containerStatuses': [crashing]}},
            {'metadata': {'name': 'gfd-b'}, 'status': {}}]
    assert doctor_checks.why_no_gfd_labels(NODE, 'gpu-1', pods, 'gpu', '120') == (
        "node gpu-1 has no GFD labels after 120 s. GFD pod gfd-a: Running, waiting (CrashLoopBackOff), 4 restarts; "
        "its log says why (kubectl -n gpu logs gfd-a). GFD pod gfd-b: Pending; its log says why (kubectl -n gpu logs gfd-b).")
