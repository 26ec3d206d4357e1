# -*- coding: utf-8 -*-
"""The GFD label case files (format: ../shared/reference/gfd-and-device-plugin.md section 2) and the
checks every test layer applies to them: the engine in-process and the module + filters end to end."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import re

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "gfd")
PUBLIC = "gfd_label_cases.public.json"
OWN = "gfd_label_cases.own.json"
FACT_KEYS = ("devices", "driver_version", "cuda_driver_version", "machine_type", "vgpu_devices")


def load(name):
    with open(os.path.join(FIXTURES, name)) as handle:
        return [(name, case) for case in json.load(handle)]


def all_cases():
    return load(PUBLIC) + load(OWN)


def case_id(entry):
    return "%s:%s" % (entry[0].split(".")[1], entry[1]["name"])


def facts_of(case):
    return dict((key, case[key]) for key in FACT_KEYS)


def options_of(case):
    """Keyword arguments of gfd_labels / gpu_resources for the case's options."""
    opts = case["options"]
    return {"mig_strategy": opts["mig_strategy"], "sharing": opts.get("sharing"),
            "timestamp": not opts.get("no_timestamp", True)}


def check_labels(case, labels):
    """Assert labels (a dict, consumed) are what the case expects."""
    for key, pattern in (case.get("expected_label_patterns") or {}).items():
        assert re.match(pattern, labels.pop(key, "")), key
    alternatives = case.get("expected_label_alternatives")
    if alternatives:
        matching = [alt for alt in alternatives if dict(case["expected_labels"], **alt) == labels]
        assert len(matching) == 1, labels
    else:
        assert labels == case["expected_labels"]
    assert [key for key in case.get("expected_absent_labels", []) if key in labels] == []


def check_label_error(case, message):
    assert case["expected_error"] in message, message


def check_plugin_error(case, message):
    """The refusal carries the case's reason; a refusing plugin advertises nothing."""
    assert case["expected_plugin_error"] in message, message
    assert case.get("expected_node_resources", {}) == {}
