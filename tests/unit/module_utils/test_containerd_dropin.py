# -*- coding: utf-8 -*-
"""containerd_dropin: which `imports` entry covers a drop-in, and the drop-ins we refuse."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

import pytest

from ansible_collections.gpuready.nvidia.plugins.module_utils import containerd_config as engine
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_dropin import (
    check_drop_in, covering_import, import_glob, imports_cover)
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_toml import ConfigError

CONFIG = "/etc/containerd/config.toml"
DROP_IN = "/etc/containerd/conf.d/99-nvidia.toml"


def test_refused_drop_in_is_named():
    with pytest.raises(ConfigError, match="99-nvidia.toml: invalid TOML at line 1"):
        engine.edit("version = 2\n", engine.Request(), CONFIG, "/etc/containerd/conf.d/99-nvidia.toml", "[broken")


@pytest.mark.parametrize("drop_in, message", [("conf.d/99.toml", "absolute"), ("/etc/containerd/conf.d/99.conf", ".toml"),
                                              (CONFIG, "another file")])
def test_bad_drop_in_paths(drop_in, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        engine.edit("version = 2\n", engine.Request(), CONFIG, drop_in)


def test_a_drop_in_beside_config_toml_or_for_a_version_1_file_is_refused():
    with pytest.raises(ConfigError, match="a folder of its own"):
        check_drop_in("/etc/containerd/99-nvidia.toml", None, CONFIG, 2)
    with pytest.raises(ConfigError, match=r"version 1 config.*\(D3\)"):
        check_drop_in(DROP_IN, None, CONFIG, 1)
    check_drop_in(DROP_IN, "version = 2\n", CONFIG, 2)


def test_import_glob_is_the_drop_in_folder():
    assert import_glob(DROP_IN) == "/etc/containerd/conf.d/*.toml"


@pytest.mark.parametrize("imports, covered", [
    (["/etc/containerd/conf.d/*.toml"], True),
    (["conf.d/*.toml"], True),  # relative to the config's folder
    (["/etc/containerd/conf.d/99-*.toml"], True),
    (["/etc/containerd/conf.d/other.toml"], False),
    (["/etc/containerd/conf.d/*.conf"], False),
    ([7, "/etc/containerd/other/*.toml"], False),
])
def test_imports_cover(imports, covered):
    assert imports_cover(imports, DROP_IN, CONFIG) is covered


def test_covering_import_is_the_entry_as_written():
    config = 'version = 2\nimports = ["/etc/containerd/extra/*.toml", "conf.d/*.toml"]\n'
    assert covering_import(config, DROP_IN, CONFIG) == "conf.d/*.toml"
    assert covering_import("version = 2\n", DROP_IN, CONFIG) is None
