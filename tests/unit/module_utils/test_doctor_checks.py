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
