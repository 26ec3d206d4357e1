# -*- coding: utf-8 -*-
"""k8s_gpu_labels through ansible-playbook against a real kube-apiserver (the k8s_api fixture: the lab's control
plane behind the fault-injecting proxy), with requests read from the server's audit log."""

from __future__ import absolute_import, division, print_function

import copy
import os

import pytest

import gfd_cases as cases
import lab_scripts
from cluster_api import install_nfd_crds
from playbook import run_tasks

MODULE = "gpuready.nvidia.k8s_gpu_labels"
SEED = next(c for _n, c in cases.all_cases() if c["name"].startswith("seed-4x-tesla-p4"))
SEED_FACTS = dict(cases.facts_of(SEED), present=True, nvml_ok=True, error=None)
SEED_LABELS = dict(SEED["expected_labels"], **{"nvidia.com/gpu.present": "true"})
OWNER = "gpuready.nvidia/managed-labels"
# The ClusterRole the README documents for k8s_gpu_labels.
LABELLER_RULES = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
    {"apiGroups": ["nfd.k8s-sigs.io"], "resources": ["nodefeatures"], "verbs": ["list"]},
]


def _node(name, labels=None, annotations=None):
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": dict({"kubernetes.io/hostname": name}, **(labels or {})),
                         "annotations": dict(annotations or {})},
            "status": {"capacity": {"cpu": "8"}, "allocatable": {"cpu": "8"}}}


def _labels(k8s_api, name):
    return k8s_api.get("v1", "Node", name)["metadata"].get("labels") or {}


def _node_requests(k8s_api):
    return [(r["verb"], r["resource"], r["name"], r["code"]) for r in k8s_api.requests()]


@pytest.fixture(scope="module")
def labeller(k8s_api):
    """An identity bound to exactly the documented ClusterRole, with a bearer token; the user `labeller-cert`,
    with a client certificate, is bound too."""
    install_nfd_crds(k8s_api.client)  # GFD's NodeFeature objects, which the module lists
    identity = k8s_api.add_identity("labeller")
    k8s_api.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                    "metadata": {"name": "gpuready-node-labeller"}, "rules": LABELLER_RULES})
    k8s_api.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                    "metadata": {"name": "gpuready-node-labeller"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                "name": "gpuready-node-labeller"},
                    "subjects": [identity.subject,
                                 {"kind": "User", "name": "labeller-cert", "apiGroup": "rbac.authorization.k8s.io"}]})
    return identity


def _run(tmp_path, args, identity, check_mode=False, extra=None):
    task = {"name": "Label", MODULE: dict(args, kubeconfig=identity.kubeconfig), "register": "result",
            "ignore_errors": True}
    if check_mode:
        task["check_mode"] = True
    task.update(extra or {})
    proc, results = run_tasks(str(tmp_path), [task])
    return proc, results["result"]


def test_seed_node_from_facts_then_idempotent(tmp_path, k8s_api, labeller):
    k8s_api.create(_node("seed-1", labels={"team": "ml"}))
    k8s_api.clear_requests()
    proc, result = _run(tmp_path, {"node": "seed-1", "gpu_facts": SEED_FACTS}, labeller)
    assert not result.get("failed"), proc.stdout
    assert result["changed"] is True
    expected = dict(SEED_LABELS, **{"kubernetes.io/hostname": "seed-1", "team": "ml"})
    assert _labels(k8s_api, "seed-1") == expected == result["labels"]
    assert result["added"] == SEED_LABELS and result["removed"] == []
    node = k8s_api.get("v1", "Node", "seed-1")
    assert node["metadata"]["annotations"][OWNER] == ",".join(sorted(SEED_LABELS))
    # GFD's NodeFeature is looked up (once per task) only because a change was about to be made.
    assert _node_requests(k8s_api) == [("get", "nodes", "seed-1", 200), ("list", "nodefeatures", None, 200),
                                       ("patch", "nodes", "seed-1", 200)]

    k8s_api.clear_requests()
    proc, result = _run(tmp_path, {"node": "seed-1", "gpu_facts": SEED_FACTS}, labeller)
    assert result["changed"] is False, proc.stdout
    assert _node_requests(k8s_api) == [("get", "nodes", "seed-1", 200)]


def test_check_mode_only_reads(tmp_path, k8s_api, labeller):
    k8s_api.create(_node("check-1"))
    k8s_api.clear_requests()
    proc, result = _run(tmp_path, {"node": "check-1", "gpu_facts": SEED_FACTS}, labeller, check_mode=True)
    assert result["changed"] is True, proc.stdout
    assert result["added"] == SEED_LABELS
    assert _node_requests(k8s_api) == [("get", "nodes", "check-1", 200), ("list", "nodefeatures", None, 200)]
    assert _labels(k8s_api, "check-1") == {"kubernetes.io/hostname": "check-1"}


def test_prune_removes_only_ours(tmp_path, k8s_api, labeller):
    k8s_api.create(_node("prune-1", labels={"nvidia.com/set-by-someone": "x"}))
    _run(tmp_path, {"node": "prune-1", "labels": {"nvidia.com/gpu.present": "true", "nvidia.com/mig.strategy": "single"}},
         labeller)
    proc, result = _run(tmp_path, {"node": "prune-1", "labels": {"nvidia.com/gpu.present": "true"}}, labeller)
    assert result["changed"] is True and result["removed"] == ["nvidia.com/mig.strategy"], proc.stdout
    assert _labels(k8s_api, "prune-1") == {"kubernetes.io/hostname": "prune-1", "nvidia.com/set-by-someone": "x",
                                           "nvidia.com/gpu.present": "true"}
    proc, result = _run(tmp_path, {"node": "prune-1", "state": "absent"}, labeller)
    assert result["removed"] == ["nvidia.com/gpu.present"], proc.stdout
    assert _labels(k8s_api, "prune-1") == {"kubernetes.io/hostname": "prune-1", "nvidia.com/set-by-someone": "x"}


def test_respect_gfd_from_the_nfd_annotation(tmp_path, k8s_api, labeller):
    gfd = {"nvidia.com/gpu.product": "Tesla-P4-from-GFD", "nvidia.com/gpu.count": "4"}
    k8s_api.create(_node("gfd-1", labels=gfd, annotations={
        "nfd.node.kubernetes.io/feature-labels": "nvidia.com/gpu.count,nvidia.com/gpu.product,pci-10de.present"}))
    proc, result = _run(tmp_path, {"node": "gfd-1", "gpu_facts": SEED_FACTS}, labeller)
    assert result["added"] == {"nvidia.com/gpu.present": "true"}, proc.stdout
    expected = dict(gfd, **{"kubernetes.io/hostname": "gfd-1", "nvidia.com/gpu.present": "true"})
    assert _labels(k8s_api, "gfd-1") == expected


def test_respect_gfd_from_its_node_feature(tmp_path, k8s_api, labeller):
    k8s_api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gfd-nodefeatures"}})
    k8s_api.create({"apiVersion": "nfd.k8s-sigs.io/v1alpha1", "kind": "NodeFeature",
                    "metadata": {"name": "nvidia-features-for-gfd-2", "namespace": "gfd-nodefeatures"},
                    "spec": {"labels": {"nvidia.com/gpu.product": "Tesla-P4"}}})
    k8s_api.create(_node("gfd-2"))
    proc, result = _run(tmp_path, {"node": "gfd-2", "gpu_facts": SEED_FACTS}, labeller)
    assert result["added"] == {"nvidia.com/gpu.present": "true"}, proc.stdout
    proc, result = _run(tmp_path, {"node": "gfd-2", "gpu_facts": SEED_FACTS, "respect_gfd": False}, labeller)
    assert result["added"] == dict((k, v) for k, v in SEED_LABELS.items() if k != "nvidia.com/gpu.present")


def test_concurrent_modification_between_get_and_patch(tmp_path, k8s_api, labeller):
    k8s_api.create(_node("race-1"))
    k8s_api.clear_requests()
    k8s_api.inject(verb="get", resource="nodes", name="race-1", count=1,
                   modify={"metadata": {"labels": {"written-meanwhile": "yes"}}})
    proc, result = _run(tmp_path, {"node": "race-1", "labels": {"nvidia.com/gpu.present": "true"}}, labeller)
    assert not result.get("failed"), proc.stdout
    labels = _labels(k8s_api, "race-1")
    assert labels["written-meanwhile"] == "yes" and labels["nvidia.com/gpu.present"] == "true"
    assert [(v, r, c) for v, r, n, c in _node_requests(k8s_api)] == [
        ("get", "nodes", 200), ("list", "nodefeatures", 200), ("patch", "nodes", 409), ("get", "nodes", 200),
        ("patch", "nodes", 200)]


@pytest.mark.parametrize("verb, status, count", [("patch", 409, 1), ("get", 503, 3), ("patch", 500, 2)])
def test_transient_errors_are_retried(tmp_path, k8s_api, labeller, verb, status, count):
    name = "retry-%s-%d" % (verb, status)
    k8s_api.create(_node(name))
    k8s_api.clear_requests()
    k8s_api.inject(verb=verb, resource="nodes", name=name, status=status, count=count)
    proc, result = _run(tmp_path, {"node": name, "labels": {"nvidia.com/gpu.present": "true"}}, labeller)
    assert not result.get("failed"), proc.stdout
    assert _labels(k8s_api, name)["nvidia.com/gpu.present"] == "true"
    assert [c for v, r, n, c in _node_requests(k8s_api) if v == verb].count(status) == count


def test_wrong_token_is_401_without_the_token(tmp_path, k8s_api, labeller):
    k8s_api.create(_node("auth-1"))
    secret = "not-a-valid-token-7f3a9c"
    proc, result = _run(tmp_path, {"node": "auth-1", "labels": {"nvidia.com/gpu.present": "true"}, "api_key": secret},
                        labeller)
    assert result.get("failed") is True
    assert "401" in result["msg"] and "rejected the credentials" in result["msg"]
    assert secret not in proc.stdout


def test_forbidden_is_403_naming_the_verb(tmp_path, k8s_api):
    reader = k8s_api.add_identity("no-rights")
    k8s_api.create(_node("auth-2"))
    proc, result = _run(tmp_path, {"node": "auth-2", "labels": {"nvidia.com/gpu.present": "true"}}, reader)
    assert result.get("failed") is True and "forbidden (403)" in result["msg"], proc.stdout


def test_wrong_ca_fails_verification(tmp_path, k8s_api, labeller):
    k8s_api.create(_node("tls-1"))
    pki = lab_scripts.script("lab/pki.py", "gpuready_lab_pki")
    other_ca = pki.CertificateAuthority.create(str(tmp_path), common_name="some-other-ca").cert_path
    proc, result = _run(tmp_path, {"node": "tls-1", "labels": {"nvidia.com/gpu.present": "true"}, "ca_cert": other_ca},
                        labeller)
    assert result.get("failed") is True, proc.stdout
    assert "TLS verification of the API server at https://127.0.0.1" in result["msg"]


def test_client_certificate_and_module_defaults(tmp_path, k8s_api, labeller):
    identity = k8s_api.add_identity("labeller-cert", client_cert=True)
    k8s_api.create(_node("cert-1"))
    # A client certificate ends at the fault proxy's TLS: this user talks to the real server itself.
    task = {"name": "Label", "module_defaults": {"group/gpuready.nvidia.k8s": {
        "host": k8s_api.server_url, "ca_cert": k8s_api.ca_cert, "client_cert": identity.cert, "client_key": identity.key}},
        MODULE: {"node": "cert-1", "labels": {"nvidia.com/gpu.present": "true"}}, "register": "result"}
    proc, results = run_tasks(str(tmp_path), [task])
    assert results["result"]["changed"] is True, proc.stdout
    assert k8s_api.requests()[-1]["user"] == "labeller-cert"


def test_environment_fallback(tmp_path, k8s_api, labeller):
    k8s_api.create(_node("env-1"))
    task = {"name": "Label", MODULE: {"node": "env-1", "labels": {"nvidia.com/gpu.present": "true"}},
            "environment": {"K8S_AUTH_HOST": k8s_api.url, "K8S_AUTH_API_KEY": labeller.token,
                            "K8S_AUTH_SSL_CA_CERT": k8s_api.ca_cert, "KUBECONFIG": os.devnull},
            "register": "result"}
    proc, results = run_tasks(str(tmp_path), [task])
    assert results["result"]["changed"] is True, proc.stdout


def test_bulk_labels_the_rest_and_names_the_missing(tmp_path, k8s_api, labeller):
    names = ["bulk-%03d" % i for i in range(100)]
    for name in names:
        k8s_api.create(_node(name))
    entries = [{"name": name, "gpu_facts": SEED_FACTS} for name in names]
    entries[10:10] = [{"name": "bulk-missing-a", "gpu_facts": SEED_FACTS}]
    entries.append({"name": "bulk-missing-b", "labels": {"nvidia.com/gpu.present": "true"}})
    k8s_api.clear_requests()
    proc, result = _run(tmp_path, {"nodes": entries}, labeller)
    assert result.get("failed") is True, proc.stdout
    assert result["failed_nodes"] == ["bulk-missing-a", "bulk-missing-b"]
    assert "bulk-missing-a, bulk-missing-b" in result["msg"]
    assert all(_labels(k8s_api, name) == dict(SEED_LABELS, **{"kubernetes.io/hostname": name}) for name in names)
    assert len([r for r in result["results"] if r["changed"]]) == 100
    verbs = [v for v, r, n, c in _node_requests(k8s_api)]
    assert verbs.count("patch") == 100 and verbs.count("get") == 102


@pytest.mark.parametrize("args, words", [
    ({"labels": {"nvidia.com/gpu present": "true"}}, "invalid name"),
    ({"labels": {"nvidia.com/gpu.present": True}}, "must be a string"),
    ({"gpu_facts": dict(SEED_FACTS, nvml_ok=False, error="NVIDIA driver not loaded")}, "refusing to label or prune"),
    ({"gpu_facts": SEED_FACTS, "sharing": {"strategy": "timeSlicing", "resources": []}}, "sharing.strategy"),
])
def test_bad_input_fails_before_any_request(tmp_path, k8s_api, labeller, args, words):
    k8s_api.clear_requests()
    proc, result = _run(tmp_path, dict(args, node="bad-input"), labeller)
    assert result.get("failed") is True and words in result["msg"], proc.stdout
    assert k8s_api.requests() == []


def test_facts_of_a_cpu_node_add_nothing(tmp_path, k8s_api, labeller):
    k8s_api.create(_node("cpu-1"))
    facts = {"present": False, "nvml_ok": False, "error": "NVML library not found", "devices": []}
    proc, result = _run(tmp_path, {"node": "cpu-1", "gpu_facts": copy.deepcopy(facts)}, labeller)
    assert result["changed"] is False and result["added"] == {}, proc.stdout
