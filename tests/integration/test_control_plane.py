# -*- coding: utf-8 -*-
"""The lab's real control plane (lab/control_plane.py), built from the Kubernetes module lab/go pins,
and the collection's Kubernetes module against it: what only a real API server answers."""

from __future__ import absolute_import, division, print_function

import json
import os
import re

import pytest

import gfd_cases as cases
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
