# -*- coding: utf-8 -*-
"""The GFD label engine against every case file entry, input checking, and the filter plugins."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy
import os
import re
import time

import pytest

import gfd_cases as cases
from shared_reference import assert_same_as_shared

from ansible.errors import AnsibleFilterError
from ansible_collections.gpuready.nvidia.plugins.filter.gfd_labels import FilterModule as GfdLabelsFilters
from ansible_collections.gpuready.nvidia.plugins.filter.gpu_resources import FilterModule as GpuResourcesFilters
from ansible_collections.gpuready.nvidia.plugins.module_utils import gpu_labels as engine

ALL_CASES = cases.all_cases()
facts_of = cases.facts_of


def options_of(case):
    return dict((k, v) for k, v in cases.options_of(case).items() if k != "timestamp")


def test_public_cases_are_byte_identical_to_shared():
    assert_same_as_shared(os.path.join(cases.FIXTURES, cases.PUBLIC), cases.PUBLIC)


def test_every_public_case_is_loaded():
    assert len([e for e in ALL_CASES if e[0] == cases.PUBLIC]) >= 11


@pytest.mark.parametrize("entry", ALL_CASES, ids=cases.case_id)
def test_labels(entry):
    case = entry[1]
    if case.get("expected_error"):
        with pytest.raises(engine.LabelError) as error:
            engine.gfd_labels(cases.facts_of(case), **cases.options_of(case))
        cases.check_label_error(case, str(error.value))
        return
    cases.check_labels(case, engine.gfd_labels(cases.facts_of(case), **cases.options_of(case)))


@pytest.mark.parametrize("entry", ALL_CASES, ids=cases.case_id)
def test_node_resources(entry):
    case = entry[1]
    if case.get("expected_plugin_error"):
        with pytest.raises(engine.LabelError) as error:
            engine.expected_node_resources(facts_of(case), **options_of(case))
        cases.check_plugin_error(case, str(error.value))
        return
    assert engine.expected_node_resources(facts_of(case), **options_of(case)) == case["expected_node_resources"]


def test_mixed_models_are_deterministic_whatever_the_device_order():
    case = dict(next(c for _n, c in ALL_CASES if c["name"] == "mixed-model-a100-pcie-and-t4"))
    first = engine.gfd_labels(facts_of(case))
    case["devices"] = list(reversed(case["devices"]))
    assert engine.gfd_labels(facts_of(case)) == first
    assert first["nvidia.com/gpu.product"] == "NVIDIA-A100-PCIE-40GB"


def test_mixed_models_tie_goes_to_the_name_that_sorts_first():
    devices = [{"name": name, "memory_mib": 1, "compute_capability": [7, 5], "pci_class": "0x030200"}
               for name in ("Tesla T4", "NVIDIA L4")]
    facts = {"devices": devices, "driver_version": "550.90.07", "cuda_driver_version": 12040, "machine_type": None}
    assert engine.gfd_labels(facts)["nvidia.com/gpu.product"] == "NVIDIA-L4"


def test_timestamp_is_epoch_seconds():
    case = ALL_CASES[0][1]
    before = int(time.time())
    stamp = engine.gfd_labels(facts_of(case), timestamp=True)["nvidia.com/gfd.timestamp"]
    assert re.match(r"^\d{10}$", stamp) and before <= int(stamp) <= int(time.time())


@pytest.mark.parametrize("name, expected", [
    ("Tesla P4", "Tesla-P4"), ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
    ("NVIDIA TITAN X (Pascal)", "NVIDIA-TITAN-X-Pascal"), ("some / thing /else", "some-thing-else"),
    ("Standard PC (Q35 + ICH9, 2009)", "Standard-PC-Q35-ICH9-2009"), ("VMware20,1", "VMware201"),
])
def test_sanitise(name, expected):
    assert engine.sanitise(name) == expected


@pytest.mark.parametrize("major, minor, family", [
    (1, 0, "tesla"), (3, 5, "kepler"), (7, 2, "volta"), (7, 5, "turing"), (8, 7, "ampere"), (8, 9, "ada-lovelace"),
    (9, 0, "hopper"), (10, 0, "blackwell"), (12, 0, "blackwell"), (13, 0, "rubin"), (4, 0, "undefined"),
    (11, 0, "undefined"),
])
def test_arch_family(major, minor, family):
    assert engine.arch_family(major, minor) == family


def _seed_facts():
    return facts_of(copy.deepcopy(ALL_CASES[0][1]))


def _set(facts, path, value):
    target = facts
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return facts


@pytest.mark.parametrize("path, value, field", [
    (("devices",), "Tesla P4", "devices"),
    (("devices", 0), "Tesla P4", "devices[0]"),
    (("devices", 1, "name"), 42, "devices[1].name"),
    (("devices", 0, "memory_mib"), "7611", "devices[0].memory_mib"),
    (("devices", 0, "memory_mib"), True, "devices[0].memory_mib"),
    (("devices", 0, "compute_capability"), "6.1", "devices[0].compute_capability"),
    (("devices", 0, "mig_capable"), "false", "devices[0].mig_capable"),
    (("devices", 0, "mig_enabled"), 1, "devices[0].mig_enabled"),
    (("devices", 0, "pci_class"), ["0x030200"], "devices[0].pci_class"),
    (("devices", 0, "mig_devices"), {"profile": "1g.5gb"}, "devices[0].mig_devices"),
    (("devices", 0, "mig_devices"), [{"profile": 1}], "devices[0].mig_devices[0].profile"),
    (("devices", 0, "fabric"), "attached", "devices[0].fabric"),
    (("driver_version",), 535.18, "driver_version"),
    (("driver_version",), "535", "driver_version"),
    (("cuda_driver_version",), "12020", "cuda_driver_version"),
    (("machine_type",), 7, "machine_type"),
    (("vgpu_devices",), "yes", "vgpu_devices"),
])
def test_wrong_input_names_the_field(path, value, field):
    facts = _set(_seed_facts(), path, value)
    with pytest.raises(engine.LabelError, match=re.escape(field)):
        engine.gfd_labels(facts)


@pytest.mark.parametrize("options, field", [
    ({"mig_strategy": "all"}, "mig_strategy"),
    ({"sharing": "time-slicing"}, "sharing"),
    ({"sharing": {"strategy": "timeSlicing", "resources": []}}, "sharing.strategy"),
    ({"sharing": {"strategy": "mps", "resources": [{"name": "nvidia.com/gpu", "replicas": "4"}]}},
     "sharing.resources[0].replicas"),
    ({"sharing": {"strategy": "mps", "rename_by_default": "yes", "resources": []}}, "sharing.rename_by_default"),
])
def test_wrong_options_name_the_field(options, field):
    for function in (engine.gfd_labels, engine.expected_node_resources):
        with pytest.raises(engine.LabelError, match=re.escape(field)):
            function(_seed_facts(), **options)
    assert issubclass(engine.LabelError, ValueError)


def test_facts_must_be_a_dict():
    with pytest.raises(engine.LabelError, match="facts"):
        engine.expected_node_resources(["Tesla P4"])


def test_filters_through_the_plugin_classes():
    case = ALL_CASES[0][1]
    gfd_labels = GfdLabelsFilters().filters()["gfd_labels"]
    gpu_resources = GpuResourcesFilters().filters()["gpu_resources"]
    assert gfd_labels(facts_of(case)) == case["expected_labels"]
    assert gpu_resources(facts_of(case)) == {"nvidia.com/gpu": 4}
    with pytest.raises(AnsibleFilterError, match="gfd_labels: mig_strategy must be one of"):
        gfd_labels(facts_of(case), mig_strategy="bogus")
    invalid = next(c for _n, c in ALL_CASES if c.get("expected_plugin_error"))
    with pytest.raises(AnsibleFilterError, match="gpu_resources: device plugin refuses"):
        gpu_resources(facts_of(invalid), **options_of(invalid))


def test_unanswered_memory_and_capability_leave_their_labels_out():
    facts = _seed_facts()
    for device in facts["devices"]:
        device["memory_mib"] = None
        device["compute_capability"] = None
    labels = engine.gfd_labels(facts)
    assert [k for k in ("gpu.memory", "gpu.family", "gpu.compute.major", "gpu.compute.minor")
            if "nvidia.com/" + k in labels] == []
    assert labels["nvidia.com/gpu.count"] == "4"
