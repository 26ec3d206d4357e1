# -*- coding: utf-8 -*-
"""gpu_validate's pure parts: rows and problem sentences from Node objects, the table (the test
pod's manifest and outcome: k8s/test_pods.py). The API-facing parts are tested against a real kube-apiserver
in tests/integration/test_k8s_gpu_validate.py."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from ansible_collections.gpuready.nvidia.plugins.module_utils import gpu_validate as gv
from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s import pods

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


TEST = {"node": "n1", "name": "gpuready-gpu-test-n1", "namespace": "ns", "resource": GPU, "timeout": 30,
        "products": ["Tesla P4"]}


def pod(phase, **status):
    return {"metadata": {"name": TEST["name"]}, "status": dict(status, phase=phase)}


def test_the_table_lines_up_every_column():
    rows = [gv.node_row("gpu-p4", {GPU: 4}, node("gpu-p4", {GPU: "4"}, {GPU: "4"}), gpus=4),
            gv.node_row("gpu-h100-long", {GPU: 8}, node("gpu-h100-long", {GPU: "8"}, {GPU: "7"}), gpus=8)]
    rows[0]["test_pod"] = pods.outcome(TEST, pod("Succeeded"), "GPU 0: Tesla P4\n")
    lines = gv.format_table(rows)
    assert lines == [
        "node           GPUs  expected          capacity          allocatable       test pod",
        "gpu-p4         4     nvidia.com/gpu=4  nvidia.com/gpu=4  nvidia.com/gpu=4  passed: Tesla P4",
        "gpu-h100-long  8     nvidia.com/gpu=8  nvidia.com/gpu=8  nvidia.com/gpu=7  -",
    ]


def test_the_table_of_a_missing_node_shows_dashes():
    lines = gv.format_table([gv.node_row("gone", {GPU: 1}, None, missing="no such Node in the cluster")])
    assert lines[1] == "gone  -     nvidia.com/gpu=1  -         -            -"
