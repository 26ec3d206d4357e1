# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node-side readers of the doctor (module_utils/doctor_node.py) on files in tmp_path: a config's
imports found without a TOML parser, files read as text or reported missing, executables, the
kubelet's device-plugin sockets. gather() as a whole runs on the lab's nodes
(tests/integration/test_lab_doctor.py)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

from ansible_collections.gpuready.nvidia.plugins.module_utils import doctor_node


def test_read_text_of_a_file_a_missing_file_and_a_folder(tmp_path):
    path = tmp_path / "config.toml"
    path.write_bytes(b"version = 2\n\xff\n")
    assert doctor_node.read_text(str(path)) == {"path": str(path), "exists": True, "text": "version = 2\n\ufffd\n",
                                                "error": None}
    missing = str(tmp_path / "missing.toml")
    assert doctor_node.read_text(missing) == {"path": missing, "exists": False, "text": None, "error": None}
    folder = doctor_node.read_text(str(tmp_path))
    assert folder["exists"] is True and folder["text"] is None and "Is a directory" in folder["error"]


def test_read_text_keeps_only_the_first_bytes(tmp_path):
    path = tmp_path / "big.toml"
    path.write_text("#" * (doctor_node.TEXT_LIMIT + 10))
    assert len(doctor_node.read_text(str(path))["text"]) == doctor_node.TEXT_LIMIT


def test_imported_files_follow_absolute_and_relative_globs(tmp_path):
    (tmp_path / "conf.d").mkdir()
    for name in ("b.toml", "a.toml", "skip.txt"):
        (tmp_path / "conf.d" / name).write_text("")
    other = tmp_path / "other.toml"
    other.write_text("")
    config = str(tmp_path / "config.toml")
    text = 'version = 2\nimports = ["conf.d/*.toml", \'%s\']\n[plugins]\n' % other
    assert doctor_node.imported_files(text, config) == [
        str(tmp_path / "conf.d" / "a.toml"), str(tmp_path / "conf.d" / "b.toml"), str(other)]


def test_imported_files_without_imports_or_text():
    assert doctor_node.imported_files('version = 2\n[plugins."x"]\n', "/etc/containerd/config.toml") == []
    assert doctor_node.imported_files(None, "/etc/containerd/config.toml") == []
    # only a top-level `imports` counts: one inside a table is another key
    assert doctor_node.imported_files('[plugins]\n  imports = ["/x/*.toml"]\n', "/c.toml") == []


def test_executables(tmp_path):
    runnable = tmp_path / "run"
    runnable.write_text("#!/bin/sh\n")
    os.chmod(str(runnable), 0o755)
    plain = tmp_path / "plain"
    plain.write_text("")
    os.chmod(str(plain), 0o644)
    found = doctor_node.executables([str(runnable), str(plain), str(tmp_path / "none"), str(tmp_path)])
    assert found == {str(runnable): True, str(plain): False, str(tmp_path / "none"): False,
                     str(tmp_path): False}


def test_device_plugin_sockets(tmp_path):
    assert doctor_node.device_plugin_sockets(str(tmp_path)) == {
        "dir": str(tmp_path / "device-plugins"), "exists": False, "sockets": []}
    (tmp_path / "device-plugins").mkdir()
    for name in ("nvidia-gpu.sock", "kubelet.sock", "DEPRECATION"):
        (tmp_path / "device-plugins" / name).write_text("")
    assert doctor_node.device_plugin_sockets(str(tmp_path)) == {
        "dir": str(tmp_path / "device-plugins"), "exists": True, "sockets": ["kubelet.sock", "nvidia-gpu.sock"]}
