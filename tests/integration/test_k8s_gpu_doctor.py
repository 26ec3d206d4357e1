# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""k8s_gpu_doctor through ansible-playbook against a real kube-apiserver, as an identity bound only to the
shipped ClusterRole: every read it makes is allowed, a node that could not be read is a finding, bad
options fail before anything is read. The causes themselves: tests/unit/module_utils/test_doctor.py
and, on the lab, tests/integration/test_lab_doctor.py."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json

import pytest

from cluster_api import shipped_rules
from playbook import run_tasks

MODULE = 'gpuready.nvidia.k8s_gpu_doctor'


@pytest.fixture(scope='module')
def deployer(k8s_api):
    """An identity bound to roles/gpuready/files/clusterrole.yml."""
    identity = k8s_api.add_identity('doctor')
    k8s_api.bind_cluster_role('gpuready-nvidia-doctor-test', shipped_rules(), [identity.subject])
    return identity


def _run(tmp_path, args, identity, check_mode=False):
    task = {'name': 'Doctor', MODULE: dict(args, kubeconfig=identity.kubeconfig), 'register': 'result',
            'ignore_errors': True}
    if check_mode:
        task['check_mode'] = True
    proc, results = run_tasks(str(tmp_path), [task])
    return proc, results['result']


@pytest.mark.parametrize('check_mode', [False, True])
def test_an_unread_node_is_reported_and_every_read_is_allowed(tmp_path, k8s_api, deployer, check_mode):
    if not k8s_api.exists('v1', 'Node', 'doc-1'):
        k8s_api.create({'apiVersion': 'v1', 'kind': 'Node', 'metadata': {'name': 'doc-1'}})
    report = tmp_path / 'doctor.json'
    k8s_api.clear_requests()
    proc, result = _run(tmp_path, {'nodes': {'doc-1': None}, 'report_path': str(report)}, deployer, check_mode)
    assert not result.get('failed'), proc.stdout
    assert result['changed'] is False and result['broken'] == ['doc-1']
    node = result['report']['nodes']['doc-1']
    assert (node['status'], node['first_broken_link'], node['cause']) == ('broken', 'driver', 'node_not_inspected')
    assert json.loads(report.read_text()) == result['report']
    assert result['chain'][0] == 'doc-1: BROKEN at driver (node_not_inspected)'
    requests = [r for r in k8s_api.requests() if r.get('user') == deployer.username]
    assert requests and all(r['code'] < 400 for r in requests), [r for r in requests if r['code'] >= 400]
    assert {r['resource'] for r in requests} >= {'daemonsets', 'deployments', 'runtimeclasses', 'nodes', 'pods'}


@pytest.mark.parametrize('args, message', [
    ({'nodes': {'doc-1': 'not evidence'}}, "nodes.doc-1 must be the evidence dict of doctor_node_evidence or null"),
    ({'nodes': {'doc-1': None}, 'expected': {'doc-1': {'nvidia.com/gpu': 'four'}}},
     'expected.doc-1.nvidia.com/gpu must be a whole number'),
    ({'nodes': {'doc-1': None}, 'test_pod_timeout': 0}, 'test_pod_timeout must be at least 1, got 0'),
    ({'nodes': {'doc-1': None}, 'mig_strategy': 'both'}, 'value of mig_strategy must be one of'),
])
def test_bad_options_fail_before_any_read(tmp_path, k8s_api, deployer, args, message):
    report = tmp_path / 'doctor.json'
    k8s_api.clear_requests()
    proc, result = _run(tmp_path, dict(args, report_path=str(report)), deployer)
    assert result['failed'] is True, proc.stdout
    assert message in result['msg']
    assert not report.exists()
    assert not [r for r in k8s_api.requests() if r.get('user') == deployer.username]
