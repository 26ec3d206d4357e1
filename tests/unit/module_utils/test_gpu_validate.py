# -*- coding: utf-8 -*-
"""gpu_validate's pure parts: rows and problem sentences from Node objects, the test pod's manifest
and outcome, the table. The API-facing parts are tested against the emulator in
tests/integration/test_k8s_gpu_validate.py."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from ansible_collections.gpuready.nvidia.plugins.module_utils import gpu_validate as gv

GPU = "nvidia.com/gpu"


def node(name, capacity, allocatable):
    """A Node as the API returns it: quantities are strings, next to cpu and memory."""
    return {"metadata": {"name": name},
            "status": {"capacity": dict({"cpu": "8", "memory": "32Gi"}, **capacity),
                       "allocatable": dict({"cpu": "8", "memory": "31Gi"}, **allocatable)}}


def test_a_node_advertising_what_is_expected_is_ok():
    row = gv.node_row("gpu-1", {GPU: 4}, node("gpu-1", {GPU: "4"}, {GPU: "4"}), gpus=4)
    assert row == {"node": "gpu-1", "gpus": 4, "expected": {GPU: 4}, "capacity": {GPU: 4}, "allocatable": {GPU: 4},
                   "unhealthy": {}, "ok": True, "problem": None}


def test_capacity_above_allocatable_is_reported_as_unhealthy():
    row = gv.node_row("gpu-1", {GPU: 4}, node("gpu-1", {GPU: "4"}, {GPU: "3"}))
    assert row["ok"] is False and row["unhealthy"] == {GPU: 1}
    assert row["problem"] == "node gpu-1: 1 of 4 nvidia.com/gpu unhealthy (allocatable 3)"


def test_a_node_without_the_plugin_says_so():
    row = gv.node_row("gpu-1", {GPU: 4}, node("gpu-1", {}, {}))
    assert row["capacity"] == {} and row["unhealthy"] == {}
    assert row["problem"] == ("node gpu-1: no nvidia.com/gpu (expected 4); "
                              "the NVIDIA device plugin has not registered there")


@pytest.mark.parametrize("capacity, allocatable, sentence", [
    ({GPU: "2"}, {GPU: "2"}, "nvidia.com/gpu capacity 2, expected 4"),
    ({GPU: "8"}, {GPU: "8"}, "nvidia.com/gpu capacity 8, expected 4"),
    ({GPU: "4"}, {}, "4 of 4 nvidia.com/gpu unhealthy (allocatable 0)"),
    ({GPU: "4"}, {GPU: "5"}, "nvidia.com/gpu allocatable 5, expected 4"),
])
def test_each_mismatch_names_the_resource_and_the_counts(capacity, allocatable, sentence):
    assert gv.problem("n1", {GPU: 4}, *gv.node_resources(node("n1", capacity, allocatable), {GPU: 4})) \
        == "node n1: " + sentence


def test_an_unexpected_allocatable_nvidia_resource_fails_the_node():
    """Sharing configured on the cluster but not in the settings: gpu.shared instead of gpu."""
    row = gv.node_row("gpu-1", {GPU: 4}, node("gpu-1", {GPU + ".shared": "16"}, {GPU + ".shared": "16"}))
    assert row["problem"] == "node gpu-1: no nvidia.com/gpu (expected 4); unexpected nvidia.com/gpu.shared=16"
    assert row["capacity"] == {GPU + ".shared": 16}


def test_a_stale_resource_of_a_removed_plugin_is_ignored():
    """The kubelet keeps the capacity of a plugin that went away, with allocatable 0."""
    row = gv.node_row("gpu-1", {GPU + ".shared": 16},
                      node("gpu-1", {GPU: "4", GPU + ".shared": "16"}, {GPU: "0", GPU + ".shared": "16"}))
    assert row["ok"] is True and row["unhealthy"] == {}
    assert row["capacity"] == {GPU: 4, GPU + ".shared": 16}


def test_every_expected_resource_is_checked_in_sorted_order():
    expected = {"nvidia.com/mig-3g.40gb": 2, "nvidia.com/mig-1g.10gb": 4}
    row = gv.node_row("mig-1", expected, node("mig-1", {"nvidia.com/mig-3g.40gb": "2"}, {"nvidia.com/mig-3g.40gb": "1"}))
    assert row["problem"] == ("node mig-1: no nvidia.com/mig-1g.10gb (expected 4); "
                              "1 of 2 nvidia.com/mig-3g.40gb unhealthy (allocatable 1)")
    assert row["unhealthy"] == {"nvidia.com/mig-3g.40gb": 1}


def test_a_node_that_was_not_listed_names_why():
    row = gv.node_row("gpu-9", {GPU: 1}, None, missing="no such Node in the cluster")
    assert row["ok"] is False and row["problem"] == "node gpu-9: no such Node in the cluster"


def test_a_node_expected_to_have_nothing_only_needs_to_exist():
    assert gv.node_row("cpu-1", {}, node("cpu-1", {}, {}))["ok"] is True


def test_the_test_pod_asks_for_one_unit_pinned_by_name_with_the_runtime_class():
    pod = gv.gpu_test_pod("gpuready-gpu-test-n1", "ns", "img:1", GPU, node="n1", runtime_class="nvidia",
                          pull_policy="Never")
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never" and spec["runtimeClassName"] == "nvidia"
    assert spec["containers"] == [{"name": "gpu-test", "image": "img:1", "imagePullPolicy": "Never",
                                   "command": ["nvidia-smi", "-L"], "resources": {"limits": {GPU: "1"}}}]
    term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]
    assert pod["metadata"]["labels"] == gv.TEST_POD_LABELS


def test_without_a_runtime_class_or_node_the_pod_names_neither():
    spec = gv.gpu_test_pod("p", "ns", "img:1", GPU)["spec"]
    assert "runtimeClassName" not in spec and "affinity" not in spec


def test_pod_names_are_dns_subdomains():
    assert gv.pod_name_for("gpu-1") == "gpuready-gpu-test-gpu-1"
    long_name = gv.pod_name_for("a" * 240 + ".b")
    assert len(long_name) == 253 and not long_name.endswith((".", "-"))


TEST = {"node": "n1", "name": "gpuready-gpu-test-n1", "namespace": "ns", "resource": GPU, "timeout": 30,
        "products": ["Tesla P4"]}


def pod(phase, **status):
    return {"metadata": {"name": TEST["name"]}, "status": dict(status, phase=phase)}


def test_a_succeeded_pod_whose_log_names_the_product_passes():
    result = gv.outcome(TEST, pod("Succeeded"), "GPU 0: Tesla P4 (UUID: GPU-1)\n")
    assert result["ok"] is True and result["product_found"] is True and result["product"] == "Tesla P4"
    assert result["problem"] is None and gv.pod_cell(result) == "passed: Tesla P4"


def test_a_log_without_the_product_fails_naming_it():
    result = gv.outcome(TEST, pod("Succeeded"), "GPU 0: Tesla T4 (UUID: GPU-1)\n")
    assert result["ok"] is False and result["product_found"] is False
    assert result["problem"] == ("node n1: test pod ns/gpuready-gpu-test-n1 ran nvidia-smi but its log does not "
                                 "name Tesla P4: GPU 0: Tesla T4 (UUID: GPU-1)")


def test_a_failed_pod_quotes_its_log():
    result = gv.outcome(TEST, pod("Failed"), "nvidia-smi: not found\n")
    assert result["problem"] == "node n1: test pod ns/gpuready-gpu-test-n1 failed: nvidia-smi: not found"
    assert gv.pod_cell(result) == "failed (Failed)"


def test_a_pending_pod_gives_the_schedulers_reason():
    pending = pod("Pending", conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                          "message": "0/2 nodes are available: 2 Insufficient example.com/none."}])
    result = gv.outcome(dict(TEST, resource="example.com/none"), pending)
    assert result["ok"] is False and result["phase"] == "Pending"
    assert result["problem"] == ("node n1: test pod ns/gpuready-gpu-test-n1 asking for 1 example.com/none did not "
                                 "finish within 30 s (not scheduled: 0/2 nodes are available: 2 Insufficient "
                                 "example.com/none.)")


def test_a_waiting_container_gives_the_kubelets_reason():
    waiting = pod("Pending", containerStatuses=[{"state": {"waiting": {"reason": "ErrImagePull",
                                                                       "message": "img:1 not found"}}}])
    assert gv.waiting_reason(waiting) == "ErrImagePull: img:1 not found"


def test_the_table_lines_up_every_column():
    rows = [gv.node_row("gpu-p4", {GPU: 4}, node("gpu-p4", {GPU: "4"}, {GPU: "4"}), gpus=4),
            gv.node_row("gpu-h100-long", {GPU: 8}, node("gpu-h100-long", {GPU: "8"}, {GPU: "7"}), gpus=8)]
    rows[0]["test_pod"] = gv.outcome(TEST, pod("Succeeded"), "GPU 0: Tesla P4\n")
    lines = gv.format_table(rows)
    assert lines == [
        "node           GPUs  expected          capacity          allocatable       test pod",
        "gpu-p4         4     nvidia.com/gpu=4  nvidia.com/gpu=4  nvidia.com/gpu=4  passed: Tesla P4",
        "gpu-h100-long  8     nvidia.com/gpu=8  nvidia.com/gpu=8  nvidia.com/gpu=7  -",
    ]


def test_the_table_of_a_missing_node_shows_dashes():
    lines = gv.format_table([gv.node_row("gone", {GPU: 1}, None, missing="no such Node in the cluster")])
    assert lines[1] == "gone  -     nvidia.com/gpu=1  -         -            -"


def test_a_pod_refused_at_admission_gives_the_kubelets_message():
    refused = pod("Failed", reason="UnexpectedAdmissionError",
                  message="Allocate failed due to requested number of devices unavailable for nvidia.com/gpu")
    result = gv.outcome(TEST, refused, "")
    assert result["problem"] == ("node n1: test pod ns/gpuready-gpu-test-n1 failed: UnexpectedAdmissionError: "
                                 "Allocate failed due to requested number of devices unavailable for nvidia.com/gpu")


def test_a_container_that_could_not_start_gives_its_exit():
    ended = pod("Failed", containerStatuses=[{"state": {"terminated": {
        "reason": "StartError", "exitCode": 128, "message": "exec: \"nvidia-smi\": executable file not found"}}}])
    assert gv.failure_reason(ended) == 'StartError, exit code 128: exec: "nvidia-smi": executable file not found'
