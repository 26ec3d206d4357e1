# -*- coding: utf-8 -*-
"""containerd_checks: the kubelet's cgroup driver (D4), the semantic checks of a new text, and what
`containerd config dump` shows after an edit."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_checks import (
    dump_problem, kubelet_systemd_cgroup, semantic_problems)
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_toml import ConfigError


@pytest.mark.parametrize("kubelet, expected", [(None, None), ({"cgroupDriver": "systemd"}, True),
                                               ({"cgroupDriver": "cgroupfs"}, False), ({}, False)])
def test_kubelet_systemd_cgroup(kubelet, expected):
    assert kubelet_systemd_cgroup(kubelet) is expected


def test_kubelet_with_unknown_driver_is_refused():
    with pytest.raises(ConfigError, match="cgroupDriver"):
        kubelet_systemd_cgroup({"cgroupDriver": "weird"})


def test_semantic_problems():
    v3 = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]\n"
    assert "silently ignores" in semantic_problems(v3, "c.toml", 1)[0]
    assert semantic_problems(v3, "c.toml", 2) == []
    no_entry = 'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\ndefault_runtime_name = "nvidia"\n'
    assert "has no entry" in semantic_problems(no_entry, "c.toml", 1)[0]
    no_runc = 'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
    assert "runc is not" in semantic_problems(no_runc, "c.toml", 1)[0]


def test_semantic_problems_of_an_empty_file_and_of_runc_as_the_implied_default():
    assert semantic_problems("", "c.toml", 1) == []
    # containerd 2.x declares runc itself for a version 3 file; naming it the default needs no entry.
    v3_runc = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd]\ndefault_runtime_name = \"runc\"\n"
    assert semantic_problems(v3_runc, "c.toml", 2) == []


def test_dump_problem():
    dump = ('version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\ndefault_runtime_name = "nvidia"\n'
            '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]\nBinaryName = "/x"\n')
    assert dump_problem(dump, "nvidia", "/x", "nvidia") is None
    assert "BinaryName" in dump_problem(dump, "nvidia", "/y")
    assert "no runtime" in dump_problem(dump, "gpu", "/x")
    assert "default_runtime_name" in dump_problem(dump, "nvidia", "/x", "runc")
    assert "not print TOML" in dump_problem("[", "nvidia", "/x")
