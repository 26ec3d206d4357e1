# -*- coding: utf-8 -*-
"""containerd_argspec: the option spec the action plugin validates with is the one the module documents."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import yaml

from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_argspec import ARGUMENT_SPEC
from ansible_collections.gpuready.nvidia.plugins.modules import containerd_nvidia_runtime as module


def test_every_documented_option_is_in_the_spec_with_its_type_default_and_choices():
    documented = yaml.safe_load(module.DOCUMENTATION)["options"]
    assert sorted(documented) == sorted(ARGUMENT_SPEC)
    for name, spec in ARGUMENT_SPEC.items():
        doc = documented[name]
        assert doc.get("type", "str") == spec["type"], name
        assert doc.get("default") == spec.get("default"), name
        assert [str(c) for c in doc.get("choices", [])] == spec.get("choices", []), name
