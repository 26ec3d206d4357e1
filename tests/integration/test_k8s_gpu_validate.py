# -*- coding: utf-8 -*-
"""k8s_gpu_validate and its module_utils against a real kube-apiserver (k8s_api: the lab's control plane behind
the fault-injecting proxy): the LIST and WATCH of nodes, pagination, an expired list and watch, time-outs naming
the node, a test pod the real scheduler cannot place, the module through ansible-playbook under exactly the RBAC
its documentation asks for. The test pod that runs and logs needs a kubelet: it runs on the real one in
test_real_cluster.py (the module, the role, run_test_pod and the pod's retries) and test_lab_doctor.py (site.yml
and the README's validate on both nodes)."""

from __future__ import absolute_import, division, print_function

import json
import os
import re
import threading
import time

import pytest

import gfd_cases
from fake_nvml import harness
from playbook import run_tasks
from ansible_collections.gpuready.nvidia.plugins.module_utils import gpu_validate as gv
from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s.api import list_objects
from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s.pods import run_test_pod

MODULE = "gpuready.nvidia.k8s_gpu_validate"
GPU = "nvidia.com/gpu"
PRESENT = {"nvidia.com/gpu.present": "true"}
# What the module's notes ask for, and nothing more.
VALIDATOR_RULES = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "delete", "get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
]
CUDA_IMAGE = "nvcr.io/nvidia/cuda:12.2.0-base-ubuntu22.04"


def _node(name, capacity=None, allocatable=None, labels=None):
    """A Node with these GPU resources (allocatable defaults to capacity), labelled as a GPU node unless labels say."""
    labels = PRESENT if labels is None else labels
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": dict({"kubernetes.io/hostname": name}, **labels)},
            "status": {"capacity": dict({"cpu": "8"}, **(capacity or {})),
                       "allocatable": dict({"cpu": "8"}, **(allocatable if allocatable is not None else capacity or {}))}}


def _set_gpus(k8s_api, name, capacity, allocatable):
    k8s_api.patch("v1", "Node", name, {"status": {"capacity": capacity, "allocatable": allocatable}},
                  subresource="status")


def _later(seconds, action, *args):
    """Run action(*args) in seconds from now, as a controller would, while the code under test waits."""
    timer = threading.Timer(seconds, action, args)
    timer.start()
    return timer


class _Recording(object):
    """A CoreV1Api whose list_node keeps the arguments of each call (the request log has no query)."""

    def __init__(self, core):
        self.core, self.calls, self.first_resource_version = core, [], None

    def list_node(self, **kwargs):
        self.calls.append(kwargs)
        response = self.core.list_node(**kwargs)
        if len(self.calls) == 1:
            body = json.loads(response.data)
            self.first_resource_version = body["metadata"]["resourceVersion"]
            response = _Replayed(response.data)
        return response

    def read_node(self, *args, **kwargs):
        return self.core.read_node(*args, **kwargs)


class _Replayed(object):
    """A response already read, as the caller expects it."""

    def __init__(self, data):
        self.data = data

    def release_conn(self):
        pass


@pytest.fixture(scope="module")
def core(validator):
    """CoreV1Api as the validator, through the fault proxy."""
    from kubernetes import client, config
    return client.CoreV1Api(config.new_client_from_config(validator.kubeconfig))


def _bind_validator(api, identity, subject):
    api.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "gpuready-gpu-validator"}, "rules": VALIDATOR_RULES})
    api.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "gpuready-gpu-validator"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": "gpuready-gpu-validator"},
                "subjects": [subject]})
    return identity


@pytest.fixture(scope="module")
def validator(k8s_api):
    """A ServiceAccount bound to exactly VALIDATOR_RULES, with a bearer token."""
    identity = k8s_api.add_identity("validator")
    return _bind_validator(k8s_api, identity, identity.subject)


def _verbs(k8s_api, resource):
    return [r["verb"] for r in k8s_api.requests() if r["resource"] == resource]


# --- module_utils against the real server ---------------------------------------------------


def test_list_nodes_pages_through_every_node(k8s_api, core):
    names = ["val-page-%d" % i for i in range(5)]
    for name in names:
        k8s_api.create(_node(name, labels={"gpuready.test/validate": "pages"}))
    k8s_api.clear_requests()
    nodes, resource_version = gv.list_nodes(core, "gpuready.test/validate=pages", page_size=2)
    assert sorted(n["metadata"]["name"] for n in nodes) == names
    assert int(resource_version) > 0
    assert _verbs(k8s_api, "nodes") == ["list", "list", "list"]  # 2 + 2 + 1


def test_list_restarts_when_the_continue_token_expired(k8s_api, core):
    for i in range(3):
        k8s_api.create(_node("val-expire-%d" % i, labels={"gpuready.test/validate": "expire"}))
    k8s_api.clear_requests()
    tokens = []

    def list_expiring_once(**kwargs):
        """core.list_node, whose first continued page answers 410 as after a compaction."""
        tokens.append(kwargs.get("_continue"))
        if kwargs.get("_continue") and tokens.count(None) == 1:
            k8s_api.inject(verb="list", resource="nodes", status=410, count=1)
        return core.list_node(**kwargs)

    nodes, _rv = list_objects(list_expiring_once, "gpuready.test/validate=expire", page_size=1)
    assert sorted(n["metadata"]["name"] for n in nodes) == ["val-expire-0", "val-expire-1", "val-expire-2"]
    assert tokens.count(None) == 2 and tokens[2] is None  # listed again from the start after the 410
    # One request per call: the first page, the 410, then the pages from the start (the real server may end
    # them with an empty page behind a last continue token).
    codes = [r["code"] for r in k8s_api.requests() if r["resource"] == "nodes"]
    assert codes == [200, 410] + [200] * (len(tokens) - 2), (codes, tokens)


def test_the_watch_sees_the_status_change(k8s_api, core):
    k8s_api.create(_node("val-watch-1"))
    k8s_api.clear_requests()
    timer = _later(1.0, _set_gpus, k8s_api, "val-watch-1", {GPU: "4"}, {GPU: "4"})
    started = time.monotonic()
    api = _Recording(core)
    rows = gv.wait_for_resources(api, {"val-watch-1": {GPU: 4}}, timeout=30, gpus={"val-watch-1": 4})
    timer.join()
    assert time.monotonic() - started < 10
    assert rows == [{"node": "val-watch-1", "gpus": 4, "expected": {GPU: 4}, "capacity": {GPU: 4},
                     "allocatable": {GPU: 4}, "unhealthy": {}, "ok": True, "problem": None}]
    # One LIST, then the watch from its resourceVersion: no polling.
    verbs = _verbs(k8s_api, "nodes")
    assert verbs[0] == "list" and set(verbs[1:]) == {"watch"}, verbs
    listed, watched = api.calls[0], api.calls[1]
    assert watched["watch"] is True and watched["label_selector"] == listed["label_selector"] == gv.DEFAULT_SELECTOR
    assert watched["resource_version"] == api.first_resource_version


def test_an_expired_watch_lists_again(k8s_api, core):
    k8s_api.create(_node("val-gone-1"))
    k8s_api.clear_requests()
    k8s_api.inject(verb="watch", resource="nodes", status=410, count=1)
    timer = _later(1.5, _set_gpus, k8s_api, "val-gone-1", {GPU: "2"}, {GPU: "2"})
    rows = gv.wait_for_resources(core, {"val-gone-1": {GPU: 2}}, timeout=30)
    timer.join()
    assert rows[0]["ok"] is True, rows
    verbs = [(r["verb"], r["code"]) for r in k8s_api.requests() if r["resource"] == "nodes"]
    assert verbs[:3] == [("list", 200), ("watch", 410), ("list", 200)], verbs


def test_timeout_names_the_node_and_the_missing_resource(k8s_api, core):
    k8s_api.create(_node("val-late-1"))
    started = time.monotonic()
    rows = gv.wait_for_resources(core, {"val-late-1": {GPU: 4}}, timeout=2)
    assert 2 <= time.monotonic() - started < 10
    assert rows[0]["ok"] is False
    assert rows[0]["problem"] == ("node val-late-1: no nvidia.com/gpu (expected 4); "
                                  "the NVIDIA device plugin has not registered there")


def test_capacity_above_allocatable_is_reported_unhealthy(k8s_api, core):
    k8s_api.create(_node("val-sick-1", {GPU: "4"}, {GPU: "3"}))
    rows = gv.wait_for_resources(core, {"val-sick-1": {GPU: 4}}, timeout=1)
    assert rows[0]["unhealthy"] == {GPU: 1} and rows[0]["capacity"] == {GPU: 4} and rows[0]["allocatable"] == {GPU: 3}
    assert rows[0]["problem"] == "node val-sick-1: 1 of 4 nvidia.com/gpu unhealthy (allocatable 3)"


def test_missing_and_unselected_nodes_are_told_apart(k8s_api, core):
    k8s_api.create(_node("val-unlabelled-1", {GPU: "1"}, labels={}))
    rows = gv.wait_for_resources(core, {"val-unlabelled-1": {GPU: 1}, "val-nowhere-1": {GPU: 1}}, timeout=1)
    assert [r["problem"] for r in rows] == [
        "node val-nowhere-1: no such Node in the cluster",
        "node val-unlabelled-1: the Node does not match the label selector nvidia.com/gpu.present=true"]


def test_a_pod_that_never_runs_times_out_and_is_deleted(k8s_api, core):
    started = time.monotonic()
    result = run_test_pod(core, "default", "val-pod-stuck", CUDA_IMAGE, "example.com/none", timeout=5)
    assert 5 <= time.monotonic() - started < 15
    assert result["ok"] is False and result["phase"] == "Pending"
    # The real scheduler's own words: these Nodes have no kubelet, so they keep the not-ready taint.
    assert re.match(r"test pod default/val-pod-stuck asking for 1 example.com/none did not finish within 5 s "
                    r"\(not scheduled: 0/\d+ nodes are available: \d+ node\(s\) had untolerated taint", result["problem"]), \
        result["problem"]
    assert not k8s_api.exists("v1", "Pod", "val-pod-stuck", namespace="default")


# --- the module through ansible-playbook -----------------------------------------------------


def _run(tmp_path, args, identity, check_mode=False):
    task = {"name": "Validate", MODULE: dict(args, kubeconfig=identity.kubeconfig), "register": "result",
            "ignore_errors": True}
    if check_mode:
        task["check_mode"] = True
    proc, results = run_tasks(str(tmp_path), [task])
    return proc, results["result"]


def test_module_fails_naming_the_node_and_still_writes_the_report(tmp_path, k8s_api, validator):
    k8s_api.create(_node("val-mod-2", {GPU: "8"}, {GPU: "6"}))
    k8s_api.create(_node("val-mod-3", {GPU: "8"}))
    report = tmp_path / "report.json"
    k8s_api.clear_requests()
    proc, result = _run(tmp_path, {"expected": {"val-mod-2": {GPU: 8}, "val-mod-3": {GPU: 8}}, "timeout": 2,
                                   "test_pod": False, "report_path": str(report)}, validator)
    assert result["failed"] is True and result["changed"] is False, proc.stdout
    assert result["msg"] == "GPU validation failed: node val-mod-2: 2 of 8 nvidia.com/gpu unhealthy (allocatable 6)"
    assert [r["ok"] for r in result["rows"]] == [False, True]
    assert json.loads(report.read_text())["problems"] == ["node val-mod-2: 2 of 8 nvidia.com/gpu unhealthy "
                                                          "(allocatable 6)"]
    assert not [r for r in k8s_api.requests() if r["resource"] == "pods"]


def test_module_in_check_mode_asks_nothing(tmp_path, k8s_api, validator):
    k8s_api.clear_requests()
    report = tmp_path / "report.json"
    proc, result = _run(tmp_path, {"expected": {"val-mod-1": {GPU: 4}}, "report_path": str(report)}, validator,
                        check_mode=True)
    assert result["skipped"] is True and result["changed"] is False, proc.stdout
    assert not result.get("failed")
    assert k8s_api.requests() == [] and not report.exists()


def test_module_refuses_a_count_that_is_not_a_whole_number(tmp_path, k8s_api, validator):
    k8s_api.clear_requests()
    proc, result = _run(tmp_path, {"expected": {"val-mod-1": {GPU: "four"}}}, validator)
    assert result["failed"] is True, proc.stdout
    assert result["msg"] == "expected.val-mod-1.nvidia.com/gpu must be a whole number, got 'four'"
    assert k8s_api.requests() == []


# --- the role, on localhost standing for a GPU node with the seed's 4 Tesla P4 -----------------


@pytest.fixture(scope="module")
def seed_node(tmp_path_factory):
    """The seed case's node for nvidia_gpu_facts: a fake NVML library, sysfs and DMI file."""
    root = str(tmp_path_factory.mktemp("seed-node"))
    library_dir = os.path.join(root, "lib")
    os.mkdir(library_dir)
    harness.build(library_dir)
    case = next(c for _n, c in gfd_cases.all_cases() if c["name"].startswith("seed-4x-tesla-p4"))
    return dict(harness.node_from_case(case, os.path.join(root, "node")), library_dir=library_dir)


def _role_tasks(seed_node, role_vars, check_mode=False):
    include = {"name": "gpuready.nvidia.validate"}
    if check_mode:
        include["apply"] = {"check_mode": True}
    return [
        {"name": "Gather the seed node's GPU facts", "gpuready.nvidia.nvidia_gpu_facts": {
            "sysfs_root": seed_node["sysfs_root"], "dmi_product_file": seed_node["dmi_product_file"]},
         "environment": {"LD_LIBRARY_PATH": seed_node["library_dir"], "FAKE_NVML_CONFIG": seed_node["config"]}},
        {"name": "The role", "ansible.builtin.include_role": include, "vars": role_vars},
        {"name": "What the role's validation registered", "ansible.builtin.debug": {"var": "validate_result"},
         "register": "role"},
    ]


def test_role_in_check_mode_skips_the_validation(tmp_path, k8s_api, validator, seed_node):  # pylint: disable=redefined-outer-name
    k8s_api.clear_requests()
    proc, results = run_tasks(str(tmp_path), _role_tasks(seed_node, {
        "validate_gpu_group": "all", "gpuready_node_name": "val-role-absent",
        "gpuready_k8s_kubeconfig": validator.kubeconfig, "validate_timeout": 600}, check_mode=True))
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert results["role"]["validate_result"]["skipped"] is True
    assert k8s_api.requests() == []
