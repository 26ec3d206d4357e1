# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""k8s_gpu_validate and k8s_gpu_doctor through ansible-playbook against a real kube-apiserver behind the
fault-injecting proxy (k8s_api): a burst of 500 or 503 shorter than the retry budget (k8s.api.RETRY_DELAYS) is
retried and the module succeeds, a longer one fails saying how many attempts, a slow answer within the request
timeout succeeds, 401 and 403 fail at once with a clear message and never the token. The test pod's faults (each
of its requests retried, a 409 on creating it got over) are in test_real_cluster.py, on a real kubelet.
k8s_gpu_labels' retries and refusals are in
test_k8s_gpu_labels.py; the retry logic without a server in tests/unit/module_utils/k8s/test_api.py."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

import pytest

from cluster_api import shipped_rules
from playbook import run_tasks
from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s.api import RETRY_DELAYS

GPU = "nvidia.com/gpu"
NAMESPACE = "flt-pods"
SECRET = "not-a-valid-token-c0ffee42"
ATTEMPTS = len(RETRY_DELAYS) + 1
BUDGET = sum(RETRY_DELAYS)
VALIDATOR_RULES = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "delete", "get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
]


def _bind(k8s_api, user, rules):
    """A new ServiceAccount `user` bound to a ClusterRole of exactly these rules."""
    identity = k8s_api.add_identity(user)
    k8s_api.bind_cluster_role("gpuready-%s" % user, rules, [identity.subject])
    return identity


def _doctor_rules(without_list_of=None):
    """The shipped ClusterRole's rules, with list taken from one resource."""
    rules = shipped_rules()
    for rule in rules:
        if without_list_of in rule["resources"]:
            rule["verbs"] = [v for v in rule["verbs"] if v != "list"]
    return rules


@pytest.fixture(scope="module")
def validator(k8s_api):
    k8s_api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    return _bind(k8s_api, "flt-validator", VALIDATOR_RULES)


@pytest.fixture(scope="module")
def doctor(k8s_api):
    return _bind(k8s_api, "flt-doctor", _doctor_rules())


@pytest.fixture(autouse=True)
def no_faults_left(k8s_api):
    """A fault a test did not use up must not hit the next test."""
    k8s_api.clear_faults()
    yield
    k8s_api.clear_faults()


def _gpu_node(k8s_api, name):
    if not k8s_api.exists("v1", "Node", name):
        k8s_api.create({"apiVersion": "v1", "kind": "Node",
                        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                              "nvidia.com/gpu.present": "true"}},
                        "status": {"capacity": {"cpu": "8", GPU: "4"}, "allocatable": {"cpu": "8", GPU: "4"}}})


def _run(tmp_path, module, args, identity):
    task = {"name": "Run", module: dict(args, kubeconfig=identity.kubeconfig), "register": "result",
            "ignore_errors": True}
    started = time.monotonic()
    proc, results = run_tasks(str(tmp_path), [task])
    return proc, results["result"], time.monotonic() - started


def _codes(k8s_api, user, verb, resource, subresource=None):
    return [r["code"] for r in k8s_api.requests() if r["user"] == user and r["verb"] == verb
            and r["resource"] == resource and (r["subresource"] or None) == subresource]


# --- k8s_gpu_validate ---------------------------------------------------------------------------


def _validate(tmp_path, node, identity, **args):
    return _run(tmp_path, "gpuready.nvidia.k8s_gpu_validate",
                dict({"expected": {node: {GPU: 4}}, "test_pod": False, "timeout": 10}, **args), identity)


def test_validate_retries_a_short_burst_on_the_node_list(tmp_path, k8s_api, validator):
    node = "flt-val-burst"
    _gpu_node(k8s_api, node)
    k8s_api.clear_requests()
    k8s_api.inject(verb="list", resource="nodes", status=503, count=2)  # 500s: the test pod's test below
    proc, result, _seconds = _validate(tmp_path, node, validator)
    assert not result.get("failed"), proc.stdout
    assert [row["ok"] for row in result["rows"]] == [True]
    assert _codes(k8s_api, validator.username, "list", "nodes") == [503, 503, 200]


def test_validate_gives_up_after_the_budget_saying_how_many_attempts(tmp_path, k8s_api, validator):
    node = "flt-val-down"
    _gpu_node(k8s_api, node)
    k8s_api.clear_requests()
    k8s_api.inject(verb="list", resource="nodes", status=503, count=ATTEMPTS)
    proc, result, seconds = _validate(tmp_path, node, validator)
    assert result.get("failed") is True, proc.stdout
    assert result["msg"] == ("reading the nodes failed: listing the nodes: the API server at %s answered 503 (injected "
                             "fault (HTTP 503)) to all %d attempts over %g s" % (k8s_api.url, ATTEMPTS, BUDGET))
    assert _codes(k8s_api, validator.username, "list", "nodes") == [503] * ATTEMPTS
    assert seconds >= BUDGET


def test_validate_wrong_token_fails_at_once_without_the_token(tmp_path, k8s_api, validator):
    node = "flt-val-401"
    _gpu_node(k8s_api, node)
    k8s_api.clear_requests()
    proc, result, _seconds = _validate(tmp_path, node, validator, api_key=SECRET)
    assert result.get("failed") is True, proc.stdout
    assert result["msg"] == ("reading the nodes failed: listing the nodes: the API server at %s rejected the "
                             "credentials (401 Unauthorized); check the token, client certificate or kubeconfig"
                             % k8s_api.url)
    assert [r["code"] for r in k8s_api.requests()] == [401]
    assert SECRET not in proc.stdout


def test_validate_forbidden_create_fails_at_once_naming_verb_and_resource(tmp_path, k8s_api, validator):  # pylint: disable=unused-argument
    # validator: the fixture that creates NAMESPACE; the test runs as a user lacking create on pods.
    rules = [dict(rule, verbs=[v for v in rule["verbs"] if v != "create"]) for rule in VALIDATOR_RULES]
    identity = _bind(k8s_api, "flt-validator-no-create", rules)
    node = "flt-val-403"
    _gpu_node(k8s_api, node)
    k8s_api.clear_requests()
    proc, result, _seconds = _validate(tmp_path, node, identity, test_pod=True, namespace=NAMESPACE)
    assert result.get("failed") is True, proc.stdout
    assert result["msg"] == (
        'running the test pods in namespace %s failed: creating pod %s/gpuready-gpu-test-%s: forbidden (403) by the '
        'API server at %s: pods is forbidden: User "%s" cannot create resource "pods" in API '
        'group "" in the namespace "%s"' % (NAMESPACE, NAMESPACE, node, k8s_api.url, identity.username, NAMESPACE))
    assert _codes(k8s_api, identity.username, "create", "pods") == [403]


# --- k8s_gpu_doctor -----------------------------------------------------------------------------


def _doctor(tmp_path, node, identity, **args):
    return _run(tmp_path, "gpuready.nvidia.k8s_gpu_doctor", dict({"nodes": {node: None}}, **args), identity)


def _node(k8s_api, name):
    if not k8s_api.exists("v1", "Node", name):
        k8s_api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})


def test_doctor_retries_short_bursts_and_waits_for_a_slow_answer(tmp_path, k8s_api, doctor):
    node = "flt-doc-burst"
    _node(k8s_api, node)
    k8s_api.clear_requests()
    k8s_api.inject(verb="list", resource="deployments", delay=2, count=1)
    k8s_api.inject(verb="list", resource="daemonsets", status=500, count=2)
    k8s_api.inject(verb="list", resource="nodes", status=503, count=2)
    k8s_api.inject(verb="list", resource="runtimeclasses", status=502, count=1)
    proc, result, seconds = _doctor(tmp_path, node, doctor)
    assert not result.get("failed"), proc.stdout
    report = result["report"]["nodes"][node]
    assert (report["first_broken_link"], report["cause"]) == ("driver", "node_not_inspected")
    assert _codes(k8s_api, doctor.username, "list", "daemonsets") == [500, 500, 200]
    # the Nodes come from one LIST, retried as a whole; no node is read alone
    assert _codes(k8s_api, doctor.username, "list", "nodes") == [503, 503, 200]
    assert _codes(k8s_api, doctor.username, "get", "nodes") == []
    assert _codes(k8s_api, doctor.username, "list", "runtimeclasses") == [502, 200]
    assert _codes(k8s_api, doctor.username, "list", "deployments") == [200]  # answered late, not asked again
    assert seconds >= 2 + 0.5 + 1 + 0.5


def test_doctor_gives_up_after_the_budget_saying_how_many_attempts(tmp_path, k8s_api, doctor):
    node = "flt-doc-down"
    _node(k8s_api, node)
    k8s_api.clear_requests()
    k8s_api.inject(verb="list", resource="deployments", status=500, count=ATTEMPTS)
    proc, result, seconds = _doctor(tmp_path, node, doctor)
    assert result.get("failed") is True, proc.stdout
    assert result["msg"] == ("listing Deployments in all namespaces: the API server at %s answered 500 (injected "
                             "fault (HTTP 500)) to all %d attempts over %g s" % (k8s_api.url, ATTEMPTS, BUDGET))
    assert _codes(k8s_api, doctor.username, "list", "deployments") == [500] * ATTEMPTS
    assert seconds >= BUDGET


def test_doctor_wrong_token_fails_at_once_without_the_token(tmp_path, k8s_api, doctor):
    node = "flt-doc-401"
    _node(k8s_api, node)
    k8s_api.clear_requests()
    proc, result, _seconds = _doctor(tmp_path, node, doctor, api_key=SECRET)
    assert result.get("failed") is True, proc.stdout
    assert result["msg"] == ("listing DaemonSets in all namespaces: the API server at %s rejected the credentials "
                             "(401 Unauthorized); check the token, client certificate or kubeconfig" % k8s_api.url)
    assert [r["code"] for r in k8s_api.requests()] == [401]
    assert SECRET not in proc.stdout


def test_doctor_forbidden_list_fails_at_once_naming_verb_and_resource(tmp_path, k8s_api):
    identity = _bind(k8s_api, "flt-doctor-no-rc", _doctor_rules(without_list_of="runtimeclasses"))
    node = "flt-doc-403"
    _node(k8s_api, node)
    k8s_api.clear_requests()
    proc, result, _seconds = _doctor(tmp_path, node, identity)
    assert result.get("failed") is True, proc.stdout
    assert result["msg"] == (
        'listing RuntimeClasses: forbidden (403) by the API server at %s: runtimeclasses.node.k8s.io is forbidden: '
        'User "%s" cannot list resource "runtimeclasses" in API group "node.k8s.io" at the cluster '
        'scope' % (k8s_api.url, identity.username))
    assert _codes(k8s_api, identity.username, "list", "runtimeclasses") == [403]
