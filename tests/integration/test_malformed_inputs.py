# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Malformed input for containerd_nvidia_runtime through the real ansible-playbook: broken TOML, wrong
types at every key the engine reads, unknown versions, files that are not text or not regular files,
and bad parameters. Each must fail with a clear message, no traceback, and leave every file (and the
absence of any other) byte for byte as it was. The static configs live in malformed/ (see its README)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import os
import shutil
import stat

import pytest

from playbook import run_tasks

MODULE = "gpuready.nvidia.containerd_nvidia_runtime"
MALFORMED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "malformed")
V2 = 'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n  runtime_type = "io.containerd.runc.v2"\n'
CRI = 'plugins."io.containerd.grpc.v1.cri"'
HUGE = 17 * 1024 * 1024

# malformed/<name>.toml: (phrase the message must hold, extra module arguments)
STATIC_CASES = {
    "syntax-unclosed-table-header": ("invalid TOML at line 2, column 8: Unexpected character: '\\n'", {}),
    "syntax-duplicate-key": ('invalid TOML at line 3, column 0: Key "root" already exists.', {}),
    "syntax-duplicate-table": ('invalid TOML at line 6, column 0: Key "containerd" already exists.', {}),
    "syntax-bad-string-escape": ("invalid TOML at line 2, column 11: Invalid character 'd' in string", {}),
    "syntax-missing-value": ("invalid TOML at line 2, column 11: Unexpected character", {}),
    "syntax-unclosed-string": ("invalid TOML at line 2, column 27: Control characters", {}),
    "syntax-table-redefined": ("invalid TOML: Redefinition of an existing table", {}),
    "version-string": ("'version' must be an integer, found a string", {}),
    "version-float": ("'version' must be an integer, found a float", {}),
    "version-boolean": ("'version' must be an integer, found a boolean", {}),
    "version-negative": ("config version -2 is not supported", {}),
    "version-0": ("config version 0 is not supported", {}),
    "version-5": ("config version 5 is not supported", {}),
    "version-99": ("config version 99 is not supported", {}),
    "plugins-not-a-table": ("plugins must be a table, found a string", {}),
    "cri-plugin-not-a-table": ('%s must be a table, found an integer' % CRI, {}),
    "containerd-not-a-table": ("%s.containerd must be a table, found an array" % CRI, {}),
    "runtimes-not-a-table": ("%s.containerd.runtimes must be a table, found a string" % CRI, {}),
    "runtime-entry-not-a-table": ("%s.containerd.runtimes.runc must be a table, found a string" % CRI, {}),
    "options-not-a-table": ("%s.containerd.runtimes.runc.options must be a table, found a string" % CRI, {}),
    "runtime-type-not-a-string": ("%s.containerd.runtimes.runc.runtime_type must be a string" % CRI, {}),
    "default-runtime-name-not-a-string": ("%s.containerd.default_runtime_name must be a string, found an integer" % CRI,
                                          {}),
    "enable-cdi-not-a-boolean": ("%s.enable_cdi must be a boolean" % CRI, {}),
    "systemd-cgroup-not-a-boolean": ("runtimes.runc.options.SystemdCgroup must be a boolean, found a string", {}),
    "binary-name-not-a-string": ("runtimes.runc.options.BinaryName must be a string, found an integer", {}),
    "imports-not-an-array": ("'imports' must be an array, found a string", {}),
    "imports-not-strings": ("'imports' must be an array of strings", {}),
    "disabled-plugins-not-an-array": ("'disabled_plugins' must be an array of strings", {}),
    "legacy-default-runtime-not-a-table": ("%s.containerd.default_runtime must be a table, found a string" % CRI,
                                           {"set_as_default": True}),
    "v1-runtimes-not-a-table": ("plugins.cri.containerd.runtimes must be a table, found an integer", {}),
    "v1-runtime-option-not-a-string": ("plugins.cri.containerd.runtimes.runc.options.Runtime must be a string, "
                                       "found a boolean", {}),
    "v3-systemd-cgroup-not-a-boolean": ('plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options.'
                                        'SystemdCgroup must be a boolean, found an integer', {}),
    "v3-enable-cdi-not-a-boolean": ('plugins."io.containerd.cri.v1.runtime".enable_cdi must be a boolean', {}),
    "v3-default-runtime-name-not-a-string": ('plugins."io.containerd.cri.v1.runtime".containerd.default_runtime_name '
                                             'must be a string, found an array', {}),
}

# Built by the fixture in cases/<name>/: (phrase, extra module arguments; "{d}" is the case folder).
DYNAMIC_CASES = {
    "binary-content": ("binary data (NUL byte at offset 4), not a containerd config file", {}),
    "not-utf8": ("not UTF-8 text (byte 17)", {}),
    "utf8-bom": ("starts with a UTF-8 byte order mark", {}),
    "huge-file": ("is larger than 4 MiB, too large for a containerd config file", {}),
    "symlink-loop": ("symbolic link loop", {}),
    "directory": ("is a directory, not a containerd config file", {}),
    "fifo": ("is a FIFO, not a regular file", {}),
    "device": ("is a device, not a regular file", {}),
    "drop-in-is-a-fifo": ("conf.d/99-nvidia.toml is a FIFO, not a regular file", {"drop_in": "{d}/conf.d/99-nvidia.toml"}),
    "drop-in-invalid-toml": ("conf.d/99-nvidia.toml: invalid TOML at line 1", {"drop_in": "{d}/conf.d/99-nvidia.toml"}),
    "runtime-name-empty": ("invalid runtime_name ''", {"runtime_name": ""}),
    "runtime-name-dots": ("invalid runtime_name 'nvidia.v2'", {"runtime_name": "nvidia.v2"}),
    "runtime-name-space": ("invalid runtime_name 'nvidia gpu'", {"runtime_name": "nvidia gpu"}),
    "runtime-name-quote": ("invalid runtime_name 'nv\"idia'", {"runtime_name": 'nv"idia'}),
    "runtime-name-too-long": ("invalid runtime_name '%s'" % ("n" * 64), {"runtime_name": "n" * 64}),
    "runtime-path-relative": ("runtime_path must be an absolute path, got 'bin/nvidia-container-runtime'",
                              {"runtime_path": "bin/nvidia-container-runtime"}),
    "config-version-5": ("config_version must be one of: auto, 1, 2, 3, 4, got: 5", {"config_version": "5"}),
    "state-unknown": ("state must be one of: present, absent, got: gone", {"state": "gone"}),
    "systemd-cgroup-unknown": ("systemd_cgroup must be one of: auto, true, false, got: maybe", {"systemd_cgroup": "maybe"}),
    "path-relative": ("path must be an absolute path, got 'etc/containerd/config.toml'",
                      {"path": "etc/containerd/config.toml"}),
    "drop-in-next-to-config": ("drop_in must be in a folder of its own (a conf.d), not next to",
                               {"drop_in": "{d}/99-nvidia.toml"}),
    "drop-in-relative": ("drop_in must be an absolute path, got 'conf.d/99-nvidia.toml'", {"drop_in": "conf.d/99-nvidia.toml"}),
    "drop-in-not-toml": ("drop_in must end in .toml", {"drop_in": "{d}/conf.d/99-nvidia.conf"}),
    "drop-in-is-the-config": ("drop_in must name another file than", {"drop_in": "{d}/config.toml"}),
    "drop-in-on-version-1": ("is a version 1 config", {"drop_in": "{d}/conf.d/99-nvidia.toml"}),
    "flavor-config-dir-without-flavor": ("flavor_config_dir is for flavor k3s or rke2", {"flavor_config_dir": "{d}/rancher"}),
}


def _write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(data if isinstance(data, bytes) else data.encode())


def _build_dynamic(name, folder):
    config = os.path.join(folder, "config.toml")
    os.makedirs(folder)
    if name == "binary-content":
        _write(config, b"\x7fELF\x00\x02\x01\x00" + bytes(range(256)))
    elif name == "not-utf8":
        _write(config, b"version = 2\n# caf\xe9 cr\xe8me\n")
    elif name == "utf8-bom":
        _write(config, b"\xef\xbb\xbf" + V2.encode())
    elif name == "huge-file":
        line = b"# a runaway generator wrote this line again and again\n"
        _write(config, V2.encode() + line * (HUGE // len(line)))
    elif name == "symlink-loop":
        os.symlink(os.path.join(folder, "other.toml"), config)
        os.symlink(config, os.path.join(folder, "other.toml"))
    elif name == "directory":
        os.makedirs(config)
        _write(os.path.join(config, "inside.toml"), V2)
    elif name in ("fifo", "drop-in-is-a-fifo"):
        fifo = config if name == "fifo" else os.path.join(folder, "conf.d", "99-nvidia.toml")
        os.makedirs(os.path.dirname(fifo), exist_ok=True)
        os.mkfifo(fifo)
    elif name == "device":
        os.symlink("/dev/zero", config)
    elif name == "drop-in-invalid-toml":
        _write(os.path.join(folder, "conf.d", "99-nvidia.toml"), "[plugins\n")
    elif name == "drop-in-on-version-1":
        _write(config, 'version = 1\n[plugins.cri.containerd.runtimes.runc]\n  runtime_type = "io.containerd.runc.v2"\n')
    if not os.path.lexists(config):
        _write(config, V2)


def _snapshot(root):
    """Every entry under root: sha256 of regular files, the target of links, the kind of the rest.
    Links are not followed (a loop, /dev/zero)."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                found[path] = "link to " + os.readlink(path)
            elif stat.S_ISREG(mode):
                digest = hashlib.sha256()
                with open(path, "rb") as handle:
                    for block in iter(lambda: handle.read(1 << 20), b""):
                        digest.update(block)
                found[path] = digest.hexdigest()
            else:
                found[path] = "mode %o" % stat.S_IFMT(mode)
    return found


@pytest.fixture(scope="module")
def runs(tmp_path_factory, containerd_binaries):
    """One folder per case under cases/, then one ansible-playbook call for all of them; the play's own
    files (play, results, Ansible's temporary folders) stay outside cases/."""
    workdir = str(tmp_path_factory.mktemp("malformed"))
    root = os.path.join(workdir, "cases")
    tasks = []
    for name in sorted(STATIC_CASES):
        folder = os.path.join(root, name)
        os.makedirs(folder)
        shutil.copyfile(os.path.join(MALFORMED, name + ".toml"), os.path.join(folder, "config.toml"))
        tasks.append((name, folder, STATIC_CASES[name][1]))
    for name in sorted(DYNAMIC_CASES):
        folder = os.path.join(root, name)
        _build_dynamic(name, folder)
        extra = dict((k, v.replace("{d}", folder) if isinstance(v, str) else v)
                     for k, v in DYNAMIC_CASES[name][1].items())
        tasks.append((name, folder, extra))
    before = _snapshot(root)
    play = [{"name": name, "register": "r_" + name.replace("-", "_"), "ignore_errors": True,
             MODULE: dict({"path": os.path.join(folder, "config.toml"), "containerd_binary": containerd_binaries["1.6"],
                           "kubelet_config": os.path.join(folder, "kubelet.yaml")}, **extra)}
            for name, folder, extra in tasks]
    proc, results = run_tasks(workdir, play, timeout=600)
    return root, before, _snapshot(root), proc, results


def test_corpus_matches_its_readme():
    on_disk = sorted(f[:-len(".toml")] for f in os.listdir(MALFORMED) if f.endswith(".toml"))
    assert on_disk == sorted(STATIC_CASES)
    with open(os.path.join(MALFORMED, "README.md")) as handle:
        readme = handle.read()
    assert [n for n in on_disk if "`%s.toml`" % n not in readme] == []
    assert len(STATIC_CASES) + len(DYNAMIC_CASES) >= 30


@pytest.mark.parametrize("name", sorted(STATIC_CASES) + sorted(DYNAMIC_CASES))
def test_refused_clearly_and_nothing_changed(runs, name):
    root, before, after, _proc, results = runs
    result = results["r_" + name.replace("-", "_")]
    phrase = (STATIC_CASES.get(name) or DYNAMIC_CASES[name])[0]
    assert result.get("failed") is True, result
    assert phrase in result["msg"], result["msg"]
    assert "Traceback" not in result.get("exception", "") and "module_stderr" not in result, result
    folder = os.path.join(root, name) + os.sep
    mine = dict((p, v) for p, v in before.items() if p.startswith(folder))
    assert mine  # the case did lay out its files
    assert dict((p, v) for p, v in after.items() if p.startswith(folder)) == mine


def test_no_file_appeared_or_changed_anywhere(runs):
    _root, before, after, _proc, _results = runs
    assert after == before  # refused input creates nothing, not even a lock file
