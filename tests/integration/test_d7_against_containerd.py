# -*- coding: utf-8 -*-
"""D7 (which CRI table to edit) checked against what real containerd loads. A file of each config version
keeps its runtimes (default crun) in each of the three CRI tables. Each containerd series the file is written
for (version 1: 1.6 and 1.7; version 2: 1.6, 1.7 and 2.x, but 2.x alone when it uses the version 3 table, as
AKS does; version 3: 2.x) that loads the file must load the edited file with nvidia as its default runtime,
as `config dump` shows in the CRI runtime plugin's own table; a file it refuses stays refused. On containerd
2.x a version 1 file's runtimes are never read: the module's dump check must refuse the edit there."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from ansible_collections.gpuready.nvidia.plugins.module_utils import containerd_config as engine
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_checks import dump_problem
from ansible_collections.gpuready.nvidia.tests.integration.containerd_daemon import config_dump, loaded_cri_runtime

TABLES = ("cri", "io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime")


def _series(version, table):
    if version is None:
        return ("1.6", "1.7")
    if version == 2 and table != "io.containerd.cri.v1.runtime":
        return ("1.6", "1.7", "2")
    return ("2",)


CASES = [(version, table, series) for version in (None, 2, 3) for table in TABLES
         for series in _series(version, table)]


def _file(version, table):
    head = "" if version is None else "version = %d\n" % version
    return head + ('[plugins."{t}".containerd]\n  default_runtime_name = "crun"\n'
                   '[plugins."{t}".containerd.runtimes.crun]\n  runtime_type = "io.containerd.runc.v2"\n'
                   '[plugins."{t}".containerd.runtimes.crun.options]\n  BinaryName = "/usr/bin/crun"\n').format(t=table)


def _loaded(binary, path, series):
    """The CRI runtime settings containerd loads from path, or None when it refuses the file."""
    table, _refusal = loaded_cri_runtime(binary, path, series)
    return None if table is None else table["containerd"]


@pytest.mark.parametrize("version, table, series", CASES,
                         ids=["v%s-%s@%s" % (v or "none", t, s) for v, t, s in CASES])
def test_where_containerd_loads_the_file_it_loads_nvidia_as_default(tmp_path, containerd_binary,
                                                                    version, table, series):
    binary = containerd_binary(series)
    before = str(tmp_path / "before.toml")
    with open(before, "w") as handle:
        handle.write(_file(version, table))
    loaded = _loaded(binary, before, series)
    if loaded is None or loaded.get("default_runtime_name") != "crun":
        # This containerd refuses the file or does not read that table at that version: the edit must still
        # give a file it loads, with our runtime as the default.
        assert loaded is None or "crun" not in loaded.get("runtimes", {})
    outcome = engine.edit(_file(version, table), engine.Request(set_as_default=True), before)
    after = str(tmp_path / "after.toml")
    with open(after, "w") as handle:
        handle.write(outcome.config_text)
    edited = _loaded(binary, after, series)
    if loaded is None:
        assert edited is None  # a file this containerd refuses stays refused: nothing we own made it so
        return
    assert edited.get("default_runtime_name") == "nvidia", (outcome.config_text, outcome.warnings)
    assert edited["runtimes"]["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    if loaded.get("default_runtime_name") == "crun":
        # The runtimes containerd read before are still read (we edited the table it reads).
        assert "crun" in edited["runtimes"]
    else:
        assert outcome.warnings and "does not read" in " ".join(outcome.warnings), outcome.warnings


@pytest.mark.parametrize("table", TABLES)
def test_a_version_1_file_is_refused_on_containerd_2(tmp_path, containerd_binary, table):
    outcome = engine.edit(_file(None, table), engine.Request(set_as_default=True), "/etc/containerd/config.toml")
    after = str(tmp_path / "after.toml")
    with open(after, "w") as handle:
        handle.write(outcome.config_text)
    proc = config_dump(containerd_binary("2"), after)
    assert proc.returncode == 0, proc.stderr
    problem = dump_problem(proc.stdout, "nvidia", "/usr/bin/nvidia-container-runtime", "nvidia")
    assert problem and "does not read the table it was written to" in problem
