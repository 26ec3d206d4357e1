# -*- coding: utf-8 -*-
"""node_labels without an API server: Kubernetes label rules, labels from facts, and the plan."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy

import pytest

import gfd_cases as cases
from ansible_collections.gpuready.nvidia.plugins.module_utils import node_labels

SEED = next(c for _n, c in cases.all_cases() if c["name"].startswith("seed-4x-tesla-p4"))


def _facts(**overrides):
    facts = dict(cases.facts_of(copy.deepcopy(SEED)), present=True, nvml_ok=True, error=None)
    facts.update(overrides)
    return facts


def _node(labels=None, owned=None, annotations=None):
    metadata = {"name": "n1", "resourceVersion": "7", "labels": dict(labels or {}),
                "annotations": dict(annotations or {})}
    if owned is not None:
        metadata["annotations"][node_labels.OWNER_ANNOTATION] = ",".join(owned)
    return {"metadata": metadata}


@pytest.mark.parametrize("key, value", [
    ("nvidia.com/gpu.present", "true"), ("gpu", ""), ("a.b-c/x_y.z", "A-1_b.2"), ("k", "x" * 63),
    ("%s/k" % ("a" * 253), "v"),
])
def test_valid_labels(key, value):
    node_labels.check_label(key, value)


@pytest.mark.parametrize("key, value, words", [
    ("Nvidia.com/gpu", "x", "invalid prefix"), ("/gpu", "x", "invalid prefix"), ("nvidia.com/", "x", "invalid name"),
    ("nvidia.com/-gpu", "x", "invalid name"), ("k" * 64, "x", "invalid name"), ("%s/k" % ("a" * 254), "v", "prefix"),
    ("nvidia.com/gpu", "x" * 64, "not a valid label value"), ("nvidia.com/gpu", "a b", "not a valid label value"),
    ("nvidia.com/gpu", True, "must be a string"), ("nvidia.com/gpu", 4, "quote it"), (7, "x", "must be a string"),
])
def test_invalid_labels(key, value, words):
    with pytest.raises(ValueError, match=words):
        node_labels.check_label(key, value)


def test_labels_from_facts_are_gfd_labels_plus_present():
    labels = node_labels.labels_from_facts(_facts())
    expected = dict(SEED["expected_labels"], **{"nvidia.com/gpu.present": "true"})
    assert labels == expected
    assert "nvidia.com/gfd.timestamp" not in labels


def test_cpu_node_gets_no_labels():
    assert node_labels.labels_from_facts({"present": False, "nvml_ok": False, "error": "no library"}) == {}


def test_broken_driver_is_refused():
    with pytest.raises(ValueError, match="NVML failed \\(NVIDIA driver not loaded\\); refusing"):
        node_labels.labels_from_facts(_facts(nvml_ok=False, error="NVIDIA driver not loaded"))


def test_engine_errors_name_the_field():
    with pytest.raises(ValueError, match="gpu_facts: mig_strategy"):
        node_labels.labels_from_facts(_facts(), mig_strategy="all")
    with pytest.raises(ValueError, match="must be an nvidia_gpu facts dict"):
        node_labels.labels_from_facts(["Tesla P4"])


def test_plan_adds_changes_and_owns_only_what_it_wrote():
    node = _node(labels={"team": "ml", "nvidia.com/gpu.count": "4", "nvidia.com/gpu.product": "old"})
    to_set, to_remove, owned = node_labels.plan(node, {"nvidia.com/gpu.count": "4", "nvidia.com/gpu.product": "Tesla-P4",
                                                       "nvidia.com/gpu.present": "true"})
    assert to_set == {"nvidia.com/gpu.product": "Tesla-P4", "nvidia.com/gpu.present": "true"}
    assert to_remove == []
    assert owned == {"nvidia.com/gpu.product", "nvidia.com/gpu.present"}  # gpu.count was already there


def test_plan_prunes_only_owned_keys():
    node = _node(labels={"nvidia.com/mig.strategy": "single", "nvidia.com/foreign": "x", "nvidia.com/gpu.present": "true"},
                 owned=["nvidia.com/mig.strategy", "nvidia.com/gpu.present", "nvidia.com/gone"])
    to_set, to_remove, owned = node_labels.plan(node, {"nvidia.com/gpu.present": "true"})
    assert (to_set, to_remove, owned) == ({}, ["nvidia.com/mig.strategy"], {"nvidia.com/gpu.present"})
    assert node_labels.plan(node, {"nvidia.com/gpu.present": "true"}, prune=False)[1] == []


def test_plan_unchanged_node():
    node = _node(labels={"nvidia.com/gpu.present": "true"}, owned=["nvidia.com/gpu.present"])
    assert node_labels.plan(node, {"nvidia.com/gpu.present": "true"}) == ({}, [], {"nvidia.com/gpu.present"})


def test_plan_leaves_gfd_keys_alone():
    node = _node(labels={"nvidia.com/gpu.product": "Tesla-P4"}, owned=["nvidia.com/gpu.product"])
    to_set, to_remove, owned = node_labels.plan(node, {"nvidia.com/gpu.present": "true"},
                                                gfd_keys={"nvidia.com/gpu.product"})
    assert (to_set, to_remove, owned) == ({"nvidia.com/gpu.present": "true"}, [], {"nvidia.com/gpu.present"})


def test_plan_absent():
    node = _node(labels={"a": "1", "b": "2", "c": "3"}, owned=["a", "b"])
    assert node_labels.plan(node, {}, state="absent", explicit=False) == ({}, ["a", "b"], set())
    assert node_labels.plan(node, {"c": None}, state="absent") == ({}, ["c"], {"a", "b"})
    assert node_labels.plan(node, {"b": None, "c": None}, state="absent", explicit=False)[1] == ["b"]


def _nfd_node(annotation):
    return {'metadata': {'name': 'gpu-1', 'annotations': {'nfd.node.kubernetes.io/feature-labels': annotation}}}


def test_nfd_labels_reads_the_keys_nfd_master_lists():
    node = _nfd_node('cpu-cpuid.AVX,nvidia.com/gpu.count,nvidia.com/gpu.product,pci-10de.present')
    assert node_labels.nfd_labels(node) == ['cpu-cpuid.AVX', 'nvidia.com/gpu.count', 'nvidia.com/gpu.product',
                                            'pci-10de.present']
    assert node_labels.nfd_labels(node, 'nvidia.com/') == ['nvidia.com/gpu.count', 'nvidia.com/gpu.product']


@pytest.mark.parametrize('node', [None, {}, {'metadata': {}}, {'metadata': {'annotations': None}}, _nfd_node(''),
                                  {'metadata': {'annotations': {'other': 'nvidia.com/gpu.count'}}}])
def test_nfd_labels_of_a_node_nfd_did_not_label(node):
    assert node_labels.nfd_labels(node) == []
    assert node_labels.nfd_labels(node, 'nvidia.com/') == []
