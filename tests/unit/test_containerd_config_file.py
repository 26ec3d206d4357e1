# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node module containerd_config_file run for real on files in tmp_path: a write that fails half
way leaves the old files (and no temporary file), refusals of unreadable input, and real concurrent
read-edit-write cycles that never lose an update."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import hashlib
import io
import json
import multiprocessing
import os
import stat
import sys
import tempfile
import tomllib

import pytest

import require
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args
from ansible_collections.gpuready.nvidia.plugins.module_utils import containerd_config as engine
from ansible_collections.gpuready.nvidia.plugins.modules import containerd_config_file as node

V2 = 'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n  runtime_type = "io.containerd.runc.v2"\n'
CHANGED = "changed since it was read"


def _write(path, data, mode=0o644):
    with open(path, "wb") as handle:
        handle.write(data if isinstance(data, bytes) else data.encode())
    os.chmod(path, mode)


def _bytes(path):
    with open(path, "rb") as handle:
        return handle.read()


def _sha(data):
    return hashlib.sha256(data).hexdigest()


def _module(args):
    with patch_module_args(args):
        return basic.AnsibleModule(argument_spec=node.ARGUMENT_SPEC, supports_check_mode=True)


def _run_main(args, monkeypatch):
    """main() as Ansible runs it: the JSON it prints (exit_json and fail_json end in SystemExit)."""
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    with patch_module_args(args), pytest.raises(SystemExit):
        node.main()
    monkeypatch.undo()
    return json.loads(out.getvalue())


def _fail_rename_to(monkeypatch, victim, err=errno.EIO):
    """os.rename raises for one destination (as a full disk or a read-only remount would), works for the rest."""
    real = os.rename

    def rename(src, dst):
        if os.path.realpath(dst) == os.path.realpath(victim):
            raise OSError(err, os.strerror(err))
        return real(src, dst)
    monkeypatch.setattr(node.os, "rename", rename)


def _spec(path, content):
    return {"path": path, "content": content, "checksum": _sha(_bytes(path)) if os.path.exists(path) else None}


def test_failed_rename_keeps_the_old_file_and_no_temporary_file(tmp_path, monkeypatch):
    path = str(tmp_path / "config.toml")
    _write(path, V2, 0o640)
    _fail_rename_to(monkeypatch, path)
    reply = _run_main({"op": "write", "files": [_spec(path, "version = 2\n")]}, monkeypatch)
    assert reply["failed"]
    assert reply["msg"] == "%s: cannot write: Input/output error; nothing was changed" % path
    assert "exception" not in reply
    assert _bytes(path) == V2.encode() and stat.S_IMODE(os.stat(path).st_mode) == 0o640
    assert sorted(os.listdir(str(tmp_path))) == [".config.toml.gpuready-lock", "config.toml"]


def test_failed_fsync_is_a_clear_error_and_leaves_nothing(tmp_path, monkeypatch):
    path = str(tmp_path / "config.toml")
    _write(path, V2)

    def fsync(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(node.os, "fsync", fsync)
    with pytest.raises(node.FileError, match="cannot write: No space left on device; nothing was changed"):
        node._op_write(_module({"op": "write", "files": [_spec(path, "version = 2\n")]}))
    assert _bytes(path) == V2.encode()
    assert sorted(os.listdir(str(tmp_path))) == [".config.toml.gpuready-lock", "config.toml"]


@pytest.mark.parametrize("drop_in_existed", [True, False])
def test_failure_on_the_second_file_rolls_the_first_back(tmp_path, monkeypatch, drop_in_existed):
    config = str(tmp_path / "config.toml")
    os.makedirs(str(tmp_path / "conf.d"))
    drop_in = str(tmp_path / "conf.d" / "99-nvidia.toml")
    _write(config, V2, 0o600)
    if drop_in_existed:
        _write(drop_in, "version = 2\n# old drop-in\n")
    files = [_spec(config, V2 + 'imports = ["/x/*.toml"]\n'), _spec(drop_in, "version = 2\n# new\n")]
    _fail_rename_to(monkeypatch, drop_in)
    reply = _run_main({"op": "write", "files": files, "backup": False}, monkeypatch)
    assert reply["failed"] and "exception" not in reply
    assert reply["msg"] == ("%s: cannot write: Input/output error; rolled back %s to its previous content"
                            % (drop_in, config))
    assert _bytes(config) == V2.encode() and stat.S_IMODE(os.stat(config).st_mode) == 0o600
    assert _bytes(drop_in) == b"version = 2\n# old drop-in\n" if drop_in_existed else not os.path.exists(drop_in)
    leftovers = [n for d in (tmp_path, tmp_path / "conf.d") for n in os.listdir(str(d)) if n.endswith(".tmp")]
    assert leftovers == []


def test_deleting_then_failing_restores_the_deleted_file(tmp_path, monkeypatch):
    config = str(tmp_path / "config.toml")
    drop_in = str(tmp_path / "99-nvidia.toml")
    _write(config, "version = 2\n")
    _write(drop_in, V2, 0o640)
    _fail_rename_to(monkeypatch, config)
    files = [{"path": drop_in, "content": None, "checksum": _sha(_bytes(drop_in))}, _spec(config, V2)]
    with pytest.raises(node.FileError, match="rolled back %s to its previous content" % drop_in):
        node._op_write(_module({"op": "write", "files": files}))
    assert _bytes(drop_in) == V2.encode() and stat.S_IMODE(os.stat(drop_in).st_mode) == 0o640
    assert _bytes(config) == b"version = 2\n"


def test_a_good_write_still_keeps_mode_and_writes(tmp_path):
    """The counterpart of the failures above: the same call without injected faults writes both files."""
    config = str(tmp_path / "config.toml")
    drop_in = str(tmp_path / "conf.d" / "99-nvidia.toml")
    _write(config, V2, 0o640)
    files = [_spec(config, "version = 2\n"), _spec(drop_in, "version = 2\n# new\n")]
    result = node._op_write(_module({"op": "write", "files": files}))
    assert result["written"] == [config, drop_in] and result["changed"]
    assert _bytes(config) == b"version = 2\n" and stat.S_IMODE(os.stat(config).st_mode) == 0o640
    assert stat.S_IMODE(os.stat(drop_in).st_mode) == 0o644


def test_the_applied_record_is_read_and_written_beside_the_files(tmp_path):
    config = str(tmp_path / "config.toml")
    record = str(tmp_path / "state" / "applied.json")
    _write(config, V2)
    read = node._op_read(_module({"op": "read", "paths": [config], "applied_record": record}))
    assert read["applied_record_text"] is None
    # a record only: written private to root, neither counted as written nor as a change
    result = node._op_write(_module({"op": "write", "files": [], "applied_record": record,
                                     "applied_record_content": '{"format": 1}\n'}))
    assert result == {"written": [], "backups": {}, "changed": False}
    assert _bytes(record) == b'{"format": 1}\n' and stat.S_IMODE(os.stat(record).st_mode) == 0o600
    read = node._op_read(_module({"op": "read", "paths": [config], "applied_record": record}))
    assert read["applied_record_text"] == '{"format": 1}\n'
    # with a file: the file first, then the record; a loosened mode is put back to 0600
    os.chmod(record, 0o644)
    result = node._op_write(_module({"op": "write", "files": [_spec(config, "version = 2\n")],
                                     "applied_record": record, "applied_record_content": "{}\n"}))
    assert result["written"] == [config] and _bytes(config) == b"version = 2\n"
    assert _bytes(record) == b"{}\n" and stat.S_IMODE(os.stat(record).st_mode) == 0o600


def test_check_mode_writes_no_applied_record(tmp_path):
    config = str(tmp_path / "config.toml")
    record = str(tmp_path / "applied.json")
    _write(config, V2)
    module = _module({"op": "write", "files": [_spec(config, "version = 2\n")], "applied_record": record,
                      "applied_record_content": "{}\n", "_ansible_check_mode": True})
    assert node._op_write(module)["changed"]
    assert not os.path.exists(record) and _bytes(config) == V2.encode()


def test_an_applied_record_that_cannot_be_written_is_an_error_after_the_files(tmp_path):
    config = str(tmp_path / "config.toml")
    record = str(tmp_path / "record-is-a-folder")
    os.mkdir(record)
    _write(config, V2)
    with pytest.raises(node.FileError, match="cannot write the applied record: .*record-is-a-folder is a directory"):
        node._op_write(_module({"op": "write", "files": [_spec(config, "version = 2\n")],
                                "applied_record": record, "applied_record_content": "{}\n"}))
    assert _bytes(config) == b"version = 2\n"
    with pytest.raises(node.FileError, match="record-is-a-folder is a directory"):
        node._op_read(_module({"op": "read", "paths": [config], "applied_record": record}))


def _read_as_nobody(path):
    """node._read in a child that dropped root (tests run as root, and root reads everything)."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports the message and never returns into pytest
        os.close(reader)
        try:
            os.setgid(65534)
            os.setuid(65534)
            try:
                node._read(path)
                message = "read it"
            except node.FileError as exc:
                message = "FileError: %s" % exc
            except BaseException as exc:  # pylint: disable=broad-except
                message = "%s: %s" % (type(exc).__name__, exc)
            os.write(writer, message.encode())
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader, "rb") as handle:
        message = handle.read().decode()
    os.waitpid(pid, 0)
    return message


def test_unreadable_file_and_folder_are_refused_clearly():
    require.root()  # dropping to uid 65534
    folder = tempfile.mkdtemp(prefix="gpuready-perm-")  # under /tmp: other users may pass through it
    try:
        os.chmod(folder, 0o755)
        path = os.path.join(folder, "config.toml")
        _write(path, V2, 0o600)
        assert _read_as_nobody(path) == "FileError: %s: cannot read: Permission denied" % path
        os.chmod(folder, 0o700)
        assert _read_as_nobody(path) == "FileError: %s: permission denied" % path
        os.chmod(path, 0o644)
        os.chmod(folder, 0o755)
        assert _read_as_nobody(path) == "read it"  # the same child can read what it may read
    finally:
        os.chmod(folder, 0o755)
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))
        os.rmdir(folder)


def test_size_limit_is_exact(tmp_path):
    path = str(tmp_path / "config.toml")
    _write(path, b"#" * (node.MAX_FILE_SIZE - 1) + b"\n")
    assert len(node._read(path)["content"]) == node.MAX_FILE_SIZE
    _write(path, b"#" * node.MAX_FILE_SIZE + b"\n")
    with pytest.raises(node.FileError, match="is larger than 4 MiB"):
        node._read(path)


@pytest.mark.parametrize("data, message", [
    (b"\xef\xbb\xbfversion = 2\n", "starts with a UTF-8 byte order mark"),
    (b"version = 2\n\x00\x00", "binary data (NUL byte at offset 12)"),
    (b"version = 2\n# \xff\n", "not UTF-8 text (byte 14)"),
])
def test_content_that_would_not_round_trip_is_refused(tmp_path, data, message):
    path = str(tmp_path / "config.toml")
    _write(path, data)
    with pytest.raises(node.FileError) as caught:
        node._read(path)
    assert message in str(caught.value)
    assert _bytes(path) == data


def test_a_fifo_is_refused_without_blocking(tmp_path):
    path = str(tmp_path / "config.toml")
    os.mkfifo(path)
    with pytest.raises(node.FileError, match="is a FIFO, not a regular file"):
        node._read(path)
    with pytest.raises(node.FileError, match="is a FIFO, not a regular file"):
        node._op_write(_module({"op": "write", "files": [{"path": path, "content": "x", "checksum": None}]}))
    assert os.listdir(str(tmp_path)) == ["config.toml"]  # refused before any lock file


# ---------------------------------------------------------------- concurrency

WORKERS = 8


def _cycle(path, name, barrier, queue, retries):
    """One full containerd_nvidia_runtime cycle, as the action plugin runs it: node read, engine edit,
    node write guarded by the checksum that was read."""
    barrier.wait()
    outcome = None
    for attempt in range(retries + 1):
        facts = node._read(path)
        request = engine.Request(runtime_name=name, runtime_path="/usr/bin/nvidia-container-runtime")
        text = engine.edit(facts["content"], request, config_path=path).config_text
        try:
            files = [{"path": path, "content": text, "checksum": facts["checksum"]}]
            node._op_write(_module({"op": "write", "files": files}))
            outcome = "ok"
            break
        except node.FileError as exc:
            outcome = str(exc)
    queue.put((name, attempt, outcome))


def _race(path, names, retries=0):
    """Run one cycle per name at once (a barrier lines them up); [(name, attempts - 1, outcome)]."""
    context = multiprocessing.get_context("fork")
    barrier, queue = context.Barrier(len(names)), context.Queue()
    workers = [context.Process(target=_cycle, args=(path, name, barrier, queue, retries)) for name in names]
    for worker in workers:
        worker.start()
    results = [queue.get(timeout=120) for _w in workers]
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    return results


def _runtimes(path):
    return tomllib.loads(_bytes(path).decode())["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]


def test_concurrent_runs_adding_the_same_runtime(tmp_path):
    path = str(tmp_path / "config.toml")
    _write(path, V2)
    outcomes = [outcome for _n, _a, outcome in _race(path, ["nvidia"] * WORKERS)]
    assert outcomes.count("ok") >= 1
    assert all(o == "ok" or o == "%s %s; nothing was written, run again" % (path, CHANGED + " (another writer?)")
               for o in outcomes), outcomes
    assert _bytes(path).decode().count("runtimes.nvidia]") == 1
    assert sorted(_runtimes(path)) == ["nvidia", "runc"]
    assert _runtimes(path)["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"


def test_concurrent_runs_adding_different_runtimes_lose_no_update(tmp_path):
    path = str(tmp_path / "config.toml")
    _write(path, V2)
    names = ["nvidia%d" % i for i in range(WORKERS)]
    results = _race(path, names)
    assert sorted(n for n, _a, _o in results) == names  # every process reported
    succeeded = [n for n, _a, outcome in results if outcome == "ok"]
    assert succeeded, results
    for name, _attempt, outcome in results:
        assert outcome == "ok" or CHANGED in outcome, (name, outcome)
    declared = _runtimes(path)
    assert sorted(n for n in declared if n.startswith("nvidia")) == sorted(succeeded)  # none lost, none extra


def test_concurrent_runs_that_retry_all_land(tmp_path):
    path = str(tmp_path / "config.toml")
    _write(path, V2)
    names = ["nvidia%d" % i for i in range(WORKERS)]
    results = _race(path, names, retries=WORKERS)
    assert all(outcome == "ok" for _n, _a, outcome in results), results
    assert sorted(_runtimes(path)) == sorted(names + ["runc"])
