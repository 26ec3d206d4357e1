# -*- coding: utf-8 -*-
"""Every GFD label case end to end: the case's node is built (fake libnvidia-ml.so.1 configured from
the case, fake sysfs with PCI class and config space, DMI file), ``nvidia_gpu_facts`` gathers through
the real pynvml, and the ``gfd_labels`` / ``gpu_resources`` filters run on what it registered, all in
one ansible-playbook run."""

from __future__ import absolute_import, division, print_function

import os

import pytest

import gfd_cases as cases
from fake_nvml import harness
from playbook import run_tasks

ALL_CASES = cases.all_cases()


def _tasks(index, case, node, library_dir):
    facts = "facts_%d.ansible_facts.nvidia_gpu" % index
    options = cases.options_of(case)
    call = "(mig_strategy=opts.mig_strategy, sharing=opts.sharing%s)"
    return [
        {"name": "Gather %s" % case["name"], "gpuready.nvidia.nvidia_gpu_facts": {
            "sysfs_root": node["sysfs_root"], "dmi_product_file": node["dmi_product_file"]},
         "environment": {"LD_LIBRARY_PATH": library_dir, "FAKE_NVML_CONFIG": node["config"]},
         "register": "facts_%d" % index},
        {"name": "Labels of %s" % case["name"], "vars": {"opts": options}, "ignore_errors": True,
         "ansible.builtin.debug": {"msg": "{{ %s | gpuready.nvidia.gfd_labels%s }}" % (
             facts, call % ", timestamp=opts.timestamp")},
         "register": "labels_%d" % index},
        {"name": "Resources of %s" % case["name"], "vars": {"opts": options}, "ignore_errors": True,
         "ansible.builtin.debug": {"msg": "{{ %s | gpuready.nvidia.gpu_resources%s }}" % (facts, call % "")},
         "register": "resources_%d" % index},
    ]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """{case name: {"facts", "labels", "resources": registered result}} from one playbook run."""
    workdir = str(tmp_path_factory.mktemp("gfd-cases"))
    library_dir = os.path.join(workdir, "lib")
    os.mkdir(library_dir)
    harness.build(library_dir)
    tasks = []
    for index, (_name, case) in enumerate(ALL_CASES):
        node = harness.node_from_case(case, os.path.join(workdir, "node-%d" % index))
        tasks.extend(_tasks(index, case, node, library_dir))
    dummy, registered = run_tasks(workdir, tasks)
    return dict(
        (case["name"], dict((kind, registered["%s_%d" % (kind, index)]) for kind in ("facts", "labels", "resources")))
        for index, (_name, case) in enumerate(ALL_CASES))


def _subset(gathered, expected, where):
    """Every key the case gives has the case's value in the gathered facts (lists item by item)."""
    if isinstance(expected, dict):
        assert isinstance(gathered, dict), where
        for key, value in expected.items():
            _subset(gathered.get(key), value, "%s.%s" % (where, key))
    elif isinstance(expected, list) and expected and isinstance(expected[0], dict):
        assert isinstance(gathered, list) and len(gathered) == len(expected), where
        for position, (got, want) in enumerate(zip(gathered, expected)):
            _subset(got, want, "%s[%d]" % (where, position))
    else:
        assert gathered == expected, "%s: %r != %r" % (where, gathered, expected)


@pytest.mark.parametrize("entry", ALL_CASES, ids=cases.case_id)
def test_module_gathers_the_case_facts(results, entry):
    case = entry[1]
    facts = results[case["name"]]["facts"]
    assert not facts.get("failed"), facts.get("msg")
    gathered = facts["ansible_facts"]["nvidia_gpu"]
    assert gathered["nvml_ok"] is True and gathered["error"] is None
    assert gathered["present"] is bool(case["devices"])
    assert gathered["count"] == len(case["devices"])
    _subset(gathered, cases.facts_of(case), "nvidia_gpu")


@pytest.mark.parametrize("entry", ALL_CASES, ids=cases.case_id)
def test_labels_from_the_module_facts(results, entry):
    case = entry[1]
    labels = results[case["name"]]["labels"]
    if case.get("expected_error"):
        assert labels.get("failed") is True, labels
        cases.check_label_error(case, labels["msg"])
        return
    assert not labels.get("failed"), labels.get("msg")
    cases.check_labels(case, dict(labels["msg"]))


@pytest.mark.parametrize("entry", ALL_CASES, ids=cases.case_id)
def test_resources_from_the_module_facts(results, entry):
    case = entry[1]
    resources = results[case["name"]]["resources"]
    if case.get("expected_plugin_error"):
        assert resources.get("failed") is True, resources
        cases.check_plugin_error(case, resources["msg"])
        return
    assert not resources.get("failed"), resources.get("msg")
    assert resources["msg"] == case["expected_node_resources"]
