# -*- coding: utf-8 -*-
"""What containerd_nvidia_runtime does with the files themselves: links, modes, backups, refusals,
validation by the node's containerd, and the checksum guard against a concurrent writer."""

from __future__ import absolute_import, division, print_function

import hashlib
import os
import stat

import pytest

import containerd_cases as cases
from playbook import run_tasks

MODULE = "gpuready.nvidia.containerd_nvidia_runtime"
NODE = "gpuready.nvidia.containerd_config_file"
V2 = 'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n  runtime_type = "io.containerd.runc.v2"\n'


def _write(path, data, mode=None):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(data if isinstance(data, bytes) else data.encode())
    if mode is not None:
        os.chmod(path, mode)


def _bytes(path):
    with open(path, "rb") as handle:
        return handle.read()


@pytest.fixture(scope="module")
def runs(tmp_path_factory, containerd_binaries):
    """Lay out one folder per situation, then run every task in one ansible-playbook call."""
    root = str(tmp_path_factory.mktemp("files"))
    ctd16, ctd2 = containerd_binaries["1.6"], containerd_binaries["2"]

    def d(*parts):
        return os.path.join(root, *parts)
    _write(d("link", "real", "config.toml"), V2, 0o640)
    os.chown(d("link", "real", "config.toml"), 1234, 2345)
    os.makedirs(d("link", "etc"))
    os.symlink(d("link", "real", "config.toml"), d("link", "etc", "config.toml"))
    os.makedirs(d("loop"))
    os.symlink(d("loop", "b.toml"), d("loop", "a.toml"))
    os.symlink(d("loop", "a.toml"), d("loop", "b.toml"))
    os.makedirs(d("dir", "config.toml"))
    _write(d("latin1", "config.toml"), b"version = 2\n# caf\xe9\n")
    _write(d("v3on16", "config.toml"), "")
    _write(d("badkey", "config.toml"), 'version = 2\noom_score = "high"\n')
    _write(d("race", "config.toml"), V2)
    _write(d("newdir", "keep.txt"), "")
    _write(d("kubelet", "config.yaml"), "kind: KubeletConfiguration\ncgroupDriver: systemd\n")
    with open(os.path.join(cases.FIXTURES, "real-configs", "08-rke2-selinux-registry-auth.toml")) as handle:
        _write(d("rke2", "agent", "config.toml"), handle.read())
    rke2 = {"flavor": "rke2", "path": d("rke2", "agent", "config.toml"), "flavor_config_dir": d("rke2", "etc"),
            "runtime_path": "/opt/nvidia/bin/nvidia-container-runtime", "set_as_default": True}
    base = {"containerd_binary": ctd16, "kubelet_config": d("none.yaml")}
    tasks = [
        {"name": "through a symlink", MODULE: dict(base, path=d("link", "etc", "config.toml"), set_as_default=True,
                                                   backup=True), "register": "link"},
        {"name": "symlink loop", MODULE: dict(base, path=d("loop", "a.toml")), "register": "loop",
         "ignore_errors": True},
        {"name": "a directory", MODULE: dict(base, path=d("dir", "config.toml")), "register": "dir",
         "ignore_errors": True},
        {"name": "not UTF-8", MODULE: dict(base, path=d("latin1", "config.toml")), "register": "latin1",
         "ignore_errors": True},
        {"name": "new file in a new folder, version from containerd 2.x", MODULE: dict(
            base, path=d("newdir", "etc", "config.toml"), containerd_binary=ctd2, set_as_default=True,
            backup=True), "register": "newfile"},
        {"name": "version 3 forced on a 1.6 node", "register": "v3on16", "ignore_errors": True,
         MODULE: dict(base, path=d("v3on16", "config.toml"), config_version=3)},
        {"name": "a value containerd refuses", MODULE: dict(base, path=d("badkey", "config.toml")),
         "register": "badkey", "ignore_errors": True},
        {"name": "kubelet drives SystemdCgroup", MODULE: dict(base, path=d("kubelet", "config.toml"),
                                                              kubelet_config=d("kubelet", "config.yaml")),
         "register": "kubelet"},
        {"name": "read for the race", NODE: {"op": "read", "paths": [d("race", "config.toml")]}, "register": "read"},
        {"name": "another writer changes the file", "ansible.builtin.copy": {
            "dest": d("race", "config.toml"), "content": V2 + "# someone else\n", "mode": "0644"}},
        {"name": "write with the stale checksum", NODE: {"op": "write", "files": [{
            "path": d("race", "config.toml"), "content": "version = 2\n",
            "checksum": "{{ read.files['%s'].checksum }}" % d("race", "config.toml")}]},
         "register": "race", "ignore_errors": True},
        {"name": "rke2: runtime it does not detect, as default", MODULE: rke2, "register": "rke2_first"},
        {"name": "rke2: again", MODULE: rke2, "register": "rke2_again"},
        {"name": "rke2: keep what was written", "ansible.builtin.copy": {
            "src": d("rke2", "agent", "config-v3.toml.tmpl"), "dest": d("rke2", "template.written"),
            "remote_src": True, "mode": "0644"}},
        {"name": "rke2: absent", MODULE: dict(rke2, state="absent"), "register": "rke2_absent"},
    ]
    _proc, results = run_tasks(root, tasks)
    return root, results


def test_symlink_is_followed_and_kept(runs):
    root, results = runs
    link = os.path.join(root, "link", "etc", "config.toml")
    target = os.path.join(root, "link", "real", "config.toml")
    assert results["link"]["changed"]
    assert os.path.islink(link) and os.readlink(link) == target
    assert b'default_runtime_name = "nvidia"' in _bytes(target)
    info = os.stat(target)
    assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (0o640, 1234, 2345)  # mode and owner kept
    backup = results["link"]["backups"][link]
    assert _bytes(backup) == V2.encode()


@pytest.mark.parametrize("name, message", [("loop", "symbolic link loop"), ("dir", "is a directory"),
                                           ("latin1", "not UTF-8")])
def test_unreadable_paths_are_refused(runs, name, message):
    _root, results = runs
    assert results[name].get("failed") and message in results[name]["msg"], results[name]


def test_latin1_file_is_left_as_it_was(runs):
    root, _results = runs
    assert _bytes(os.path.join(root, "latin1", "config.toml")) == b"version = 2\n# caf\xe9\n"


def test_new_file_gets_0644_and_containerd2_layout(runs):
    root, results = runs
    path = os.path.join(root, "newdir", "etc", "config.toml")
    assert results["newfile"]["changed"] and results["newfile"]["config_version"] == 3
    assert results["newfile"]["backups"] == {path: None}  # nothing existed to back up
    info = os.stat(path)
    assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (0o644, 0, 0)  # root's, world-readable
    assert "io.containerd.cri.v1.runtime" in results["newfile"]["runtime_table"]


def test_validation_failures_write_nothing(runs):
    root, results = runs
    assert results["v3on16"].get("failed")
    assert "version 3 config" in results["v3on16"]["msg"]
    assert _bytes(os.path.join(root, "v3on16", "config.toml")) == b""
    assert results["badkey"].get("failed") and "config dump refused" in results["badkey"]["msg"]
    assert _bytes(os.path.join(root, "badkey", "config.toml")) == b'version = 2\noom_score = "high"\n'


def test_kubelet_cgroup_driver_sets_systemd_cgroup(runs):
    root, _results = runs
    text = _bytes(os.path.join(root, "kubelet", "config.toml")).decode()
    assert text.count("SystemdCgroup = true") == 2  # nvidia and the runc declared for containerd 1.x


def test_concurrent_change_is_detected(runs):
    root, results = runs
    assert results["race"].get("failed") and "changed since it was read" in results["race"]["msg"]
    path = os.path.join(root, "race", "config.toml")
    assert _bytes(path) == (V2 + "# someone else\n").encode()
    assert hashlib.sha256(_bytes(path)).hexdigest() != results["read"]["files"][path]["checksum"]


def test_rke2_flavor_writes_only_files_rke2_reads(runs):
    root, results = runs
    rendered = os.path.join(root, "rke2", "agent", "config.toml")
    first = results["rke2_first"]
    assert first["changed"] and first["restart_service"] == "rke2"
    template = os.path.join(root, "rke2", "agent", "config-v3.toml.tmpl")
    default_file = os.path.join(root, "rke2", "etc", "config.yaml.d", "90-gpuready-nvidia.yaml")
    assert sorted(first["files"]) == sorted([template, default_file])
    written = _bytes(os.path.join(root, "rke2", "template.written")).decode()
    assert '{{ template "base" . }}' in written and "/opt/nvidia/bin/nvidia-container-runtime" in written
    with open(os.path.join(cases.FIXTURES, "real-configs", "08-rke2-selinux-registry-auth.toml"), "rb") as handle:
        assert _bytes(rendered) == handle.read()  # the rendered file is never edited
    assert results["rke2_again"]["changed"] is False
    assert results["rke2_absent"]["changed"]
    assert not os.path.exists(template) and not os.path.exists(default_file)
