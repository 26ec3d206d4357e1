# -*- coding: utf-8 -*-
"""containerd_versions: the config version of a file, the CRI table to edit (D7), and a CRI plugin
switched off."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_toml import ConfigError, parse
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_versions import (
    check_cri_enabled, cri_disabled, cri_table_name, detect_version)

CONFIG = "/etc/containerd/config.toml"
GRPC_RUNTIMES = '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
V3_RUNTIMES = "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n"


@pytest.mark.parametrize("text, version", [("", 3), ("# only a comment\n", 3), ("root = '/x'\n", 1),
                                           ("version = 2\n", 2), ("version = 4\n", 4)])
def test_detect_version(text, version):
    assert detect_version(parse(text, CONFIG), CONFIG, 3) == version


@pytest.mark.parametrize("text, message", [("version = true\n", r"must be an integer, found a boolean \(true\)"),
                                           ("version = '2'\n", "must be an integer, found a string"),
                                           ("version = 5\n", "config version 5 is not supported")])
def test_a_version_containerd_does_not_know_is_refused(text, message):
    with pytest.raises(ConfigError, match=message):
        detect_version(parse(text, CONFIG), CONFIG, 2)


@pytest.mark.parametrize("text, version, cri, warned", [
    ("version = 2\n", 2, "io.containerd.grpc.v1.cri", None),
    ("version = 3\n", 3, "io.containerd.cri.v1.runtime", None),
    ("root = '/x'\n", 1, "cri", None),
    # D7: version 2 read by containerd 2.x from the v3 runtime table too (AKS writes it there).
    ("version = 2\n" + V3_RUNTIMES, 2, "io.containerd.cri.v1.runtime", "the file keeps its runtimes"),
    # A table containerd does not read at this version is named, and the implied one is edited.
    ("version = 3\n" + GRPC_RUNTIMES, 3, "io.containerd.cri.v1.runtime", "does not read plugins.\"io.containerd.grpc.v1.cri\""),
])
def test_cri_table_name(text, version, cri, warned):
    warnings = []
    assert cri_table_name(parse(text, CONFIG), version, CONFIG, warnings) == cri
    if warned is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and warned in warnings[0], warnings


def test_a_cri_table_that_is_not_a_table_is_refused():
    with pytest.raises(ConfigError, match=r'plugins."io.containerd.grpc.v1.cri" must be a table'):
        cri_table_name(parse('version = 2\n[plugins]\n"io.containerd.grpc.v1.cri" = 1\n', CONFIG), 2, CONFIG, [])


@pytest.mark.parametrize("disabled, off", [('["cri"]', True), ('["io.containerd.grpc.v1.cri"]', True),
                                           ('["io.containerd.cri.v1.runtime"]', True), ('["aufs"]', False),
                                           ('"cri"', False)])
def test_cri_disabled(disabled, off):
    text = "version = 2\ndisabled_plugins = %s\n" % disabled
    assert cri_disabled(text) is off
    warnings = []
    check_cri_enabled(parse(text, CONFIG), CONFIG, warnings)
    assert bool(warnings) is off
