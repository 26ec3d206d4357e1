# -*- coding: utf-8 -*-
"""The edit engine in-process: every case file entry, every real config, present then absent."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
import tomllib

import pytest
import tomlkit
import yaml

import containerd_cases as cases
from shared_reference import assert_same_as_shared
from ansible_collections.gpuready.nvidia.plugins.module_utils import containerd_config as engine
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_checks import kubelet_systemd_cgroup
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_marks import RUNC_NOTE
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_toml import ConfigError
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_versions import CRI_TABLE_BY_VERSION, CRI_TABLES

CONFIG = "/etc/containerd/config.toml"


def request_for(case, state=None):
    opts = case["options"]
    kubelet = cases.kubelet_config_text(case)
    return engine.Request(
        runtime_name=opts["runtime_name"], runtime_path=opts["binary_path"],
        set_as_default=opts.get("set_as_default"), enable_cdi=opts["enable_cdi"],
        systemd_cgroup={"auto": "auto", "true": True, "false": False}[opts.get("systemd_cgroup", "auto")],
        kubelet_systemd_cgroup=kubelet_systemd_cgroup(yaml.safe_load(kubelet)) if kubelet else None,
        state=state or opts.get("state", "present"),
        new_file_version=int(opts.get("config_version", 3 if case.get("containerd_major") == 2 else 2)))


def run(case, config_text, drop_in_text=None, state=None):
    return engine.edit(config_text, request_for(case, state), CONFIG, cases.drop_in_path(case, "/etc/containerd"),
                       drop_in_text)


def test_public_cases_are_byte_identical_to_shared():
    assert_same_as_shared(os.path.join(cases.FIXTURES, cases.PUBLIC), cases.PUBLIC)


@pytest.mark.parametrize("entry", cases.all_cases(), ids=cases.case_id)
def test_case(entry):
    case = entry[1]
    before = cases.input_text(case)
    if case.get("expect_error"):
        with pytest.raises(ConfigError) as err:
            run(case, before)
        assert re.search(case.get("expect_error_match", ""), str(err.value), re.I), str(err.value)
        return
    first = run(case, before)
    assert cases.expectation_failures(case, first.config_text, first.drop_in_text) == []
    changed = first.config_text != before or first.drop_in_text is not None
    assert changed == case["expect_changed"]
    if case.get("expect_warning"):
        assert any(case["expect_warning"] in w for w in first.warnings), first.warnings
    second = run(case, first.config_text, first.drop_in_text)
    assert (second.config_text, second.drop_in_text) == (first.config_text, first.drop_in_text)


@pytest.mark.parametrize("entry", [e for e in cases.all_cases() if not e[1].get("expect_error")
                                   and e[1]["options"].get("state", "present") == "present"
                                   and "runtimes.%s]" % e[1]["options"]["runtime_name"] not in e[1]["input_toml"]
                                   and "gpuready.nvidia" not in e[1]["input_toml"]],
                         ids=cases.case_id)
def test_present_then_absent_restores_the_bytes(entry):
    case = entry[1]
    before = cases.input_text(case)
    present = run(case, before)
    absent = run(case, present.config_text, present.drop_in_text, state="absent")
    assert absent.config_text == before
    assert absent.drop_in_text is None


def test_a_new_runtime_in_an_indented_file_is_laid_out_like_its_relatives():
    with open(os.path.join(cases.FIXTURES, "real-configs", "16-debian-bookworm-containerd-package.toml")) as handle:
        debian = handle.read()
    outcome = engine.edit(debian, engine.Request(set_as_default=False), CONFIG)
    grpc = '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes'
    # Headers and keys as deep as the cni table beside them (header 4 spaces, keys 6), options one step in.
    assert ("    %s.runc] # gpuready.nvidia: %s\n      runtime_type = \"io.containerd.runc.v2\"\n"
            % (grpc, RUNC_NOTE)) in outcome.config_text
    assert ("    %s.nvidia] # gpuready.nvidia\n      runtime_type = \"io.containerd.runc.v2\"\n" % grpc
            in outcome.config_text)
    assert ('      %s.nvidia.options]\n        BinaryName = "/usr/bin/nvidia-container-runtime"\n' % grpc
            in outcome.config_text)


@pytest.mark.parametrize("path", cases.real_configs(), ids=os.path.basename)
def test_real_config(path):
    with open(path) as handle:
        before = handle.read()
    request = engine.Request(set_as_default=True)
    outcome = engine.edit(before, request, CONFIG)
    old, new = tomllib.loads(before), tomllib.loads(outcome.config_text)
    cri = outcome.runtime_table.split(".containerd.runtimes.")[0].split("plugins.")[1].strip('"')
    # The runtime lands in the table that holds the file's runtimes (or the one its version implies).
    expected_cri = _table_in_use(old)
    assert cri == expected_cri
    entry = new["plugins"][cri]["containerd"]["runtimes"]["nvidia"]
    assert entry["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    assert new["plugins"][cri]["containerd"]["default_runtime_name"] == "nvidia"
    # Every value we do not own is unchanged.
    assert _without_ours(new, cri) == _without_ours(old, cri)
    # Every comment line survives.
    for line in before.splitlines():
        if line.strip().startswith("#"):
            assert line in outcome.config_text.splitlines()
    # Second run: no change.
    assert engine.edit(outcome.config_text, request, CONFIG).config_text == outcome.config_text
    # Absent gives the original back: the bytes, or at least the values when the file declared the
    # runtime before us and we rewrote it (tomlkit cannot always put restored keys back in place).
    request.state = "absent"
    undone = engine.edit(outcome.config_text, request, CONFIG).config_text
    if "runtimes.nvidia" not in before and "runtimes.'nvidia'" not in before:
        assert undone == before
    else:
        assert tomllib.loads(undone) == old


def _table_in_use(doc):
    plugins = doc.get("plugins", {})
    for name in CRI_TABLES:
        ctr = plugins.get(name, {}).get("containerd", {})
        if "runtimes" in ctr or "default_runtime_name" in ctr:
            return name
    return CRI_TABLE_BY_VERSION[doc.get("version", 1)]


def _without_ours(doc, cri):
    doc = yaml.safe_load(yaml.safe_dump(doc))  # deep copy of plain data
    plugins = doc.get("plugins", {})
    ctr = plugins.get(cri, {}).get("containerd", {})
    ctr.get("runtimes", {}).pop("nvidia", None)
    ctr.pop("default_runtime_name", None)
    # Tables that held only our keys (created by the edit) do not count as values.
    for parent, key in ((ctr, "runtimes"), (plugins.get(cri, {}), "containerd"), (plugins, cri), (doc, "plugins")):
        if parent.get(key) == {}:
            del parent[key]
    return doc


SEED_V2 = ('version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
           '  default_runtime_name = "runc"\n'
           '  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
           '    runtime_type = "io.containerd.runc.v2"\n'
           '  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]  # from the driver bundle\n'
           '    runtime_type = "io.containerd.runc.v2"\n'
           '    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]\n'
           '      BinaryName = "%s"\n')


def test_absent_keeps_a_runtime_declared_before_us():
    """The classic broken node: nvidia declared, not the default. Undoing our fix keeps the declaration."""
    before = SEED_V2 % "/usr/bin/nvidia-container-runtime"
    request = engine.Request(set_as_default=True)
    present = engine.edit(before, request, CONFIG)
    assert "nvidia] # gpuready" not in present.config_text  # the entry was already right: unmarked
    request.state = "absent"
    assert engine.edit(present.config_text, request, CONFIG).config_text == before


def test_absent_restores_a_runtime_we_rewrote():
    before = SEED_V2 % "/opt/old/nvidia-container-runtime"
    request = engine.Request(set_as_default=True)
    present = engine.edit(before, request, CONFIG)
    assert 'gpuready.nvidia: was {runtime_type = "io.containerd.runc.v2", options = {BinaryName = ' \
        '"/opt/old/nvidia-container-runtime"}}' in present.config_text
    assert engine.edit(present.config_text, request, CONFIG).config_text == present.config_text
    request.state = "absent"
    assert engine.edit(present.config_text, request, CONFIG).config_text == before


def test_absent_removes_a_runtime_we_added():
    before = SEED_V2.split("  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia]", maxsplit=1)[0]
    request = engine.Request(set_as_default=False)
    present = engine.edit(before, request, CONFIG)
    assert "runtimes.nvidia] # gpuready.nvidia\n" in present.config_text
    request.state = "absent"
    assert engine.edit(present.config_text, request, CONFIG).config_text == before


def test_drop_in_absent_removes_our_import_only():
    case = {"options": {"runtime_name": "nvidia", "binary_path": "/usr/bin/nvidia-container-runtime",
                        "set_as_default": True, "enable_cdi": False,
                        "drop_in_path": "/etc/containerd/conf.d/99-nvidia.toml"}}
    before = 'version = 2\nimports = ["/etc/containerd/extra/*.toml"]\n'
    present = run(case, before)
    assert 'imports = ["/etc/containerd/extra/*.toml", "/etc/containerd/conf.d/*.toml"]' in present.config_text
    assert present.drop_in_text.startswith("# Written by gpuready.nvidia")
    absent = run(case, present.config_text, present.drop_in_text, state="absent")
    assert absent.config_text == before and absent.drop_in_text is None


@pytest.mark.parametrize("kwargs, message", [({"runtime_path": "bin/x"}, "absolute"),
                                             ({"runtime_name": ""}, "runtime_name"),
                                             ({"systemd_cgroup": "yes"}, "systemd_cgroup"),
                                             ({"state": "gone"}, "state"),
                                             ({"new_file_version": 7}, "config_version")])
def test_bad_requests(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        engine.Request(**kwargs)


@pytest.mark.parametrize("text", [
    # Found by test_containerd_config_properties.py: a version 1 file (no `version`) whose plugins table is
    # split by another table; tomlkit loses the plugins.cri table it has just inserted.
    'ersion = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n[grpc]\n[metrics]\n[plugins."io.containerd.internal.v1.opt"]\n',
    'ersion = 2\n[plugins."io.containerd.grpc.v1.cri"]\n[grpc]\n[plugins."io.containerd.grpc.v1.cri".containerd]\n',
])
def test_a_split_table_tomlkit_cannot_extend_is_refused_clearly(text):
    with pytest.raises(ConfigError, match="tomlkit cannot lay out this edit"):
        engine.edit(text, engine.Request(), "/etc/containerd/config.toml")


def test_a_no_op_parses_the_file_once_and_a_change_is_read_back(monkeypatch):
    # A re-run that changes nothing skips the read-back check, which would parse the same text again
    # (bench/: the module's no-op cost); an edit still proves its rendering reads back as the same data.
    parses = []
    real_parse = tomlkit.parse
    monkeypatch.setattr(tomlkit, "parse", lambda text: parses.append(text) or real_parse(text))
    request = engine.Request(set_as_default=True)
    edited = engine.edit('version = 2\n', request).config_text
    assert len(parses) == 2 and parses[1] == edited
    del parses[:]
    assert engine.edit(edited, request).config_text == edited
    assert parses == [edited]
