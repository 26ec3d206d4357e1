# -*- coding: utf-8 -*-
"""k8s/pods.py's pure parts: the test pod's manifest and name, its outcome, why a pod waits or
failed. Running the pods is tested on the lab's real kubelet in tests/integration/test_real_cluster.py."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuready.nvidia.plugins.module_utils import gpu_validate as gv
from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s import pods

GPU = "nvidia.com/gpu"
TEST = {"node": "n1", "name": "gpuready-gpu-test-n1", "namespace": "ns", "resource": GPU, "timeout": 30,
        "products": ["Tesla P4"]}


def pod(phase, **status):
    return {"metadata": {"name": TEST["name"]}, "status": dict(status, phase=phase)}


def test_the_test_pod_asks_for_one_unit_pinned_by_name_with_the_runtime_class():
    pod = pods.gpu_test_pod("gpuready-gpu-test-n1", "ns", "img:1", GPU, node="n1", runtime_class="nvidia",
                            pull_policy="Never")
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never" and spec["runtimeClassName"] == "nvidia"
    assert spec["containers"] == [{"name": "gpu-test", "image": "img:1", "imagePullPolicy": "Never",
                                   "command": ["nvidia-smi", "-L"], "resources": {"limits": {GPU: "1"}}}]
    term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]
    assert pod["metadata"]["labels"] == pods.TEST_POD_LABELS


def test_without_a_runtime_class_or_node_the_pod_names_neither():
    spec = pods.gpu_test_pod("p", "ns", "img:1", GPU)["spec"]
    assert "runtimeClassName" not in spec and "affinity" not in spec


def test_pod_names_are_dns_subdomains():
    assert pods.pod_name_for("gpu-1") == "gpuready-gpu-test-gpu-1"
    long_name = pods.pod_name_for("a" * 240 + ".b")
    assert len(long_name) == 253 and not long_name.endswith((".", "-"))


def test_a_succeeded_pod_whose_log_names_the_product_passes():
    result = pods.outcome(TEST, pod("Succeeded"), "GPU 0: Tesla P4 (UUID: GPU-1)\n")
    assert result["ok"] is True and result["product_found"] is True and result["product"] == "Tesla P4"
    assert result["problem"] is None and gv.pod_cell(result) == "passed: Tesla P4"


def test_a_log_without_the_product_fails_naming_it():
    result = pods.outcome(TEST, pod("Succeeded"), "GPU 0: Tesla T4 (UUID: GPU-1)\n")
    assert result["ok"] is False and result["product_found"] is False
    assert result["problem"] == ("node n1: test pod ns/gpuready-gpu-test-n1 ran nvidia-smi but its log does not "
                                 "name Tesla P4: GPU 0: Tesla T4 (UUID: GPU-1)")


def test_a_failed_pod_quotes_its_log():
    result = pods.outcome(TEST, pod("Failed"), "nvidia-smi: not found\n")
    assert result["problem"] == "node n1: test pod ns/gpuready-gpu-test-n1 failed: nvidia-smi: not found"
    assert gv.pod_cell(result) == "failed (Failed)"


def test_a_pending_pod_gives_the_schedulers_reason():
    pending = pod("Pending", conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                          "message": "0/2 nodes are available: 2 Insufficient example.com/none."}])
    result = pods.outcome(dict(TEST, resource="example.com/none"), pending)
    assert result["ok"] is False and result["phase"] == "Pending"
    assert result["problem"] == ("node n1: test pod ns/gpuready-gpu-test-n1 asking for 1 example.com/none did not "
                                 "finish within 30 s (not scheduled: 0/2 nodes are available: 2 Insufficient "
                                 "example.com/none.)")


def test_a_waiting_container_gives_the_kubelets_reason():
    waiting = pod("Pending", containerStatuses=[{"state": {"waiting": {"reason": "ErrImagePull",
                                                                       "message": "img:1 not found"}}}])
    assert pods.waiting_reason(waiting) == "ErrImagePull: img:1 not found"


def test_a_pod_refused_at_admission_gives_the_kubelets_message():
    refused = pod("Failed", reason="UnexpectedAdmissionError",
                  message="Allocate failed due to requested number of devices unavailable for nvidia.com/gpu")
    result = pods.outcome(TEST, refused, "")
    assert result["problem"] == ("node n1: test pod ns/gpuready-gpu-test-n1 failed: UnexpectedAdmissionError: "
                                 "Allocate failed due to requested number of devices unavailable for nvidia.com/gpu")


def test_a_container_that_could_not_start_gives_its_exit():
    ended = pod("Failed", containerStatuses=[{"state": {"terminated": {
        "reason": "StartError", "exitCode": 128, "message": "exec: \"nvidia-smi\": executable file not found"}}}])
    assert pods.failure_reason(ended) == 'StartError, exit code 128: exec: "nvidia-smi": executable file not found'
