# -*- coding: utf-8 -*-
"""containerd_entry: the nvidia runtime entry, copied from the base runtime as nvidia-ctk does or
built fresh (D4, D8)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_config import Request
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_entry import (
    RUNC_V2, build_entry, no_base_systemd_cgroup)
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_marks import RUNC_NOTE
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_toml import ConfigError, parse

CONFIG = "/etc/containerd/config.toml"
BINARY = "/usr/bin/nvidia-container-runtime"


def _runtimes(text):
    return parse(text, CONFIG)["runtimes"]


@pytest.mark.parametrize("version, old_keys", [(1, True), (2, True), (3, False), (4, False)])
def test_a_fresh_entry_keeps_nvidia_ctks_keys_only_where_containerd_1_reads_them(version, old_keys):
    entry, base = build_entry(None, None, version, Request(), CONFIG)
    assert base is None
    assert entry["runtime_type"] == RUNC_V2 and entry["privileged_without_host_devices"] is False
    assert ("runtime_root" in entry and "runtime_engine" in entry) is old_keys  # D8
    assert entry["options"] == ({"BinaryName": BINARY, "Runtime": BINARY} if version == 1 else {"BinaryName": BINARY})


def test_the_entry_copies_the_default_runtime_and_drops_option_keys_that_differ_in_case():
    runtimes = _runtimes('[runtimes.crun]\nruntime_type = "io.containerd.crun.v1"\n'
                         '[runtimes.crun.options]\nbinaryName = "/usr/bin/crun"\nSystemdCgroup = true\n')
    entry, base = build_entry(runtimes, "crun", 2, Request(), CONFIG)
    assert base == "crun"
    assert entry == {"runtime_type": "io.containerd.crun.v1",
                     "options": {"SystemdCgroup": True, "BinaryName": BINARY}}


def test_an_nvidia_default_is_no_base_and_runc_declared_for_d5_neither():
    runtimes = _runtimes('[runtimes.nvidia]\nruntime_type = "x"\n[runtimes.runc] # gpuready.nvidia: %s\n'
                         'runtime_type = "io.containerd.runc.v2"\n' % RUNC_NOTE)
    assert build_entry(runtimes, "nvidia", 2, Request(), CONFIG)[1] is None


@pytest.mark.parametrize("systemd_cgroup, kubelet, expected", [("auto", None, None), ("auto", True, True),
                                                               (False, True, False), (True, None, True)])
def test_systemd_cgroup_without_a_base_follows_the_request_or_the_kubelet(systemd_cgroup, kubelet, expected):
    request = Request(systemd_cgroup=systemd_cgroup, kubelet_systemd_cgroup=kubelet)
    assert no_base_systemd_cgroup(request) is expected
    entry, _base = build_entry(None, None, 3, request, CONFIG)
    assert entry["options"].get("SystemdCgroup") is expected


def test_a_base_whose_options_are_not_a_table_is_refused():
    with pytest.raises(ConfigError, match="options of runtime 'runc' must be a table"):
        build_entry(_runtimes('[runtimes.runc]\noptions = 1\n'), None, 2, Request(), CONFIG)
