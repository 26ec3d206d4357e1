#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: containerd_config_file
short_description: Node-side file access for containerd_nvidia_runtime
version_added: 0.1.0
description:
  - The node half of M(gpuready.nvidia.containerd_nvidia_runtime), which computes the new configuration
    on the controller and calls this module to read the files, validate the result with the node's
    containerd and write it.
  - Reads files and reports their content and SHA-256 checksum, following symbolic links.
  - Refuses, with a message and without reading further, a path that is not a regular file (a directory,
    a FIFO, a device, a socket, a symbolic link loop), a file larger than 4 MiB (containerd configs are a
    few KiB; a runaway file is not shipped to the controller), and content that would not come back
    unchanged - bytes that are not UTF-8, NUL bytes (binary data), a leading UTF-8 byte order mark.
  - Writes atomically (temporary file next to the target, then rename), and only while every file still
    has the checksum that was read (optimistic concurrency), under a lock on a sidecar file next to each
    target. Existing files keep mode and owner (and SELinux context); new files are created C(0644). A
    symbolic link stays a link and its target is written.
  - When writing one of several files fails, the files written before it in the same call get their
    previous content back (or are removed again when they did not exist), and the module fails with a
    message naming the file and what was rolled back. No temporary file stays behind.
  - Needs only the Python standard library on the node.
  - Use M(gpuready.nvidia.containerd_nvidia_runtime) in playbooks; this module is its transport.
author: gpuready.nvidia contributors (!UNKNOWN)
extends_documentation_fragment:
  - gpuready.nvidia.attributes
attributes:
  check_mode:
    support: full
    details: C(op=write) reports what it would write and writes nothing.
  diff_mode:
    support: none
    details: The calling action plugin produces the diff.
  action:
    support: none
options:
  op:
    description:
      - V(read) reads O(paths), and optionally the containerd version and the kubelet configuration.
      - V(validate) writes O(files) to a private temporary folder and runs C(containerd config dump) on them.
      - V(write) writes or deletes O(files).
    type: str
    choices: [read, validate, write]
    required: true
  paths:
    description: Files to read with O(op=read).
    type: list
    elements: path
    default: []
  files:
    description: Files to validate or write, in order; the first one is the main config.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Path of the file (a symbolic link is followed).
        type: path
        required: true
      content:
        description: New content; V(null) deletes the file.
        type: str
      checksum:
        description: SHA-256 the file must still have; V(null) means it must not exist.
        type: str
  containerd_binary:
    description: containerd executable, a name on E(PATH) or an absolute path.
    type: str
  kubelet_config:
    description: Kubelet configuration file to read with O(op=read), when it exists.
    type: path
  backup:
    description: With O(op=write), keep a timestamped copy of each file it replaces or deletes.
    type: bool
    default: false
  import_rewrite:
    description:
      - With O(op=validate), the C(imports) entry of the main config that points at the second file's
        folder; it is rewritten to the temporary copy so that the pair is validated together.
    type: str
  applied_record:
    description:
      - With O(op=read), a file to return as RV(applied_record_text) (V(null) when it does not exist).
      - With O(op=write) and O(applied_record_content), the file to replace with that content (mode
        C(0600)) after the files, not in check mode. It is not counted in RV(written) or C(changed).
    type: path
  applied_record_content:
    description: With O(op=write), the new content of O(applied_record).
    type: str
"""

EXAMPLES = r"""
- name: Read config.toml the way containerd_nvidia_runtime does
  gpuready.nvidia.containerd_config_file:
    op: read
    paths: [/etc/containerd/config.toml]
    containerd_binary: containerd
"""

RETURN = r"""
files:
  description: With O(op=read), one entry per path.
  returned: op=read
  type: dict
  sample:
    /etc/containerd/config.toml:
      exists: true
      target: /etc/containerd/config.toml
      content: "version = 2\n"
      checksum: 3f2a...
      mode: "0644"
      uid: 0
      gid: 0
containerd_version:
  description: Version reported by C(containerd --version), V(null) when not found.
  returned: op=read
  type: str
  sample: 1.6.20
kubelet_config_text:
  description: Content of O(kubelet_config), V(null) when it does not exist.
  returned: op=read
  type: str
applied_record_text:
  description: Content of O(applied_record), V(null) when it does not exist or none was named.
  returned: op=read
  type: str
dump:
  description: Output of C(containerd config dump) for the validated files.
  returned: op=validate
  type: str
written:
  description: Paths written or deleted with O(op=write).
  returned: op=write
  type: list
  elements: str
backups:
  description: Path of each backup taken, V(null) for a file that did not exist before.
  returned: op=write
  type: dict
"""

import codecs
import errno
import fcntl
import hashlib
import os
import re
import shutil
import stat
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_bytes, to_text

NEW_FILE_MODE = 0o644
RECORD_FILE_MODE = 0o600
# containerd configs are a few KiB; a runaway file must not be shipped to the controller.
MAX_FILE_SIZE = 4 * 1024 * 1024
VERSION_RE = re.compile(r"\bv?(\d+)\.(\d+)\.(\d+)\S*")


class FileError(Exception):
    pass


def _target(path):
    """The file behind path, following symbolic links; a loop, a directory or any other file that is
    not a regular file (a FIFO or a device would block or never end) is an error."""
    try:
        st = os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FileError("%s: symbolic link loop" % path)
        if exc.errno == errno.EACCES:
            raise FileError("%s: permission denied" % path)
        if exc.errno != errno.ENOENT:
            raise FileError("%s: %s" % (path, exc.strerror))
        st = None
    target = os.path.realpath(path)
    if st is not None:
        _check_regular(path, st.st_mode)
    return target


def _check_regular(path, mode):
    if stat.S_ISDIR(mode):
        raise FileError("%s is a directory, not a containerd config file" % path)
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else \
            "a socket" if stat.S_ISSOCK(mode) else "a special file"
        raise FileError("%s is %s, not a regular file; refusing to read or replace it" % (path, kind))


def _read(path):
    target = _target(path)
    info = {"exists": os.path.exists(target), "target": target, "is_link": os.path.islink(path)}
    if not info["exists"]:
        info.update(content=None, checksum=None)
        return info
    try:
        # O_NONBLOCK: a FIFO swapped in after _target's check must not block the open.
        fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK)
    except (IOError, OSError) as exc:
        raise FileError("%s: cannot read: %s" % (path, exc.strerror))
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(fd)
        _check_regular(path, st.st_mode)
        try:
            # One byte more than allowed tells a file at the limit from a larger one, without reading it all.
            data = handle.read(MAX_FILE_SIZE + 1)
        except (IOError, OSError) as exc:
            raise FileError("%s: cannot read: %s" % (path, exc.strerror))
    if len(data) > MAX_FILE_SIZE:
        raise FileError("%s is larger than %d MiB, too large for a containerd config file; refusing to read it"
                        % (path, MAX_FILE_SIZE // (1024 * 1024)))
    _check_text(path, data)
    info.update(content=data.decode("utf-8"), checksum=hashlib.sha256(data).hexdigest(),
                mode="%04o" % (st.st_mode & 0o7777), uid=st.st_uid, gid=st.st_gid)
    return info


def _check_text(path, data):
    """Refuse what would not survive the round trip through the controller unchanged."""
    if data.startswith(codecs.BOM_UTF8):
        raise FileError("%s starts with a UTF-8 byte order mark; containerd's TOML parsers do not expect one. "
                        "Remove it and run again" % path)
    if b"\0" in data:
        raise FileError("%s: binary data (NUL byte at offset %d), not a containerd config file"
                        % (path, data.index(b"\0")))
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FileError("%s: not UTF-8 text (byte %d)" % (path, exc.start))


def _containerd_version(module, binary):
    executable = binary if os.path.isabs(binary) else module.get_bin_path(binary)
    if not executable or not os.path.exists(executable):
        return None
    rc, out, err = module.run_command([executable, "--version"])
    match = VERSION_RE.search(out or "")
    if rc != 0 or not match:
        raise FileError("%s --version failed (rc %d): %s" % (executable, rc, (err or out).strip()))
    return "%s.%s.%s" % match.groups()


def _op_read(module):
    params = module.params
    result = {"files": {}, "containerd_version": None, "kubelet_config_text": None, "applied_record_text": None}
    for path in params["paths"]:
        result["files"][path] = _read(path)
    if params["applied_record"]:
        result["applied_record_text"] = _read(params["applied_record"])["content"]
    if params["containerd_binary"]:
        result["containerd_version"] = _containerd_version(module, params["containerd_binary"])
    kubelet = params["kubelet_config"]
    if kubelet and os.path.exists(kubelet):
        result["kubelet_config_text"] = _read(kubelet)["content"]
    return result


def _op_validate(module):
    params = module.params
    binary = params["containerd_binary"] or "containerd"
    executable = binary if os.path.isabs(binary) else module.get_bin_path(binary)
    if not executable:
        raise FileError("containerd binary %r not found; cannot validate" % binary)
    workdir = tempfile.mkdtemp(prefix="gpuready-validate-")
    try:
        paths = []
        for index, spec in enumerate(params["files"]):
            if spec.get("content") is None:
                continue
            folder = os.path.join(workdir, str(index))
            os.mkdir(folder)
            paths.append(os.path.join(folder, os.path.basename(spec["path"])))
        contents = [s["content"] for s in params["files"] if s.get("content") is not None]
        if params["import_rewrite"] and len(paths) > 1:
            glob = os.path.join(os.path.dirname(paths[1]), "*.toml")
            contents[0] = _rewrite_import(contents[0], params["import_rewrite"], glob)
        for path, content in zip(paths, contents):
            with open(path, "wb") as handle:
                handle.write(to_bytes(content))
        if not paths:
            return {"dump": ""}
        rc, out, err = module.run_command([executable, "--config", paths[0], "config", "dump"])
        if rc != 0:
            raise FileError("containerd config dump refused the new configuration (rc %d): %s"
                            % (rc, (err or out).strip().replace(workdir, "<tmp>")))
        return {"dump": out}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _rewrite_import(text, pattern, replacement):
    """Point the imports entry that covers the drop-in at the temporary copy (both quote styles)."""
    for quote in ('"', "'"):
        needle = quote + pattern + quote
        if needle in text:
            return text.replace(needle, '"%s"' % replacement, 1)
    raise FileError("imports entry %r not found in the new config; cannot validate the drop-in" % pattern)


class _Locks(object):
    """flock on a sidecar file next to each target (its name does not end in .toml, so no
    imports glob picks it up)."""

    def __init__(self, targets):
        self.targets = sorted(set(targets))
        self.handles = []

    def __enter__(self):
        for target in self.targets:
            folder = os.path.dirname(target)
            if not os.path.isdir(folder):
                os.makedirs(folder, 0o755)
            lock = os.path.join(folder, ".%s.gpuready-lock" % os.path.basename(target))
            handle = open(lock, "a")
            fcntl.flock(handle, fcntl.LOCK_EX)
            self.handles.append(handle)
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()


def _op_write(module):
    params = module.params
    specs = [dict(spec, target=_target(spec["path"])) for spec in params["files"]]
    result = {"written": [], "backups": {}, "changed": False}
    with _Locks([s["target"] for s in specs]):
        for spec in specs:
            current = _read(spec["path"])
            if current["checksum"] != spec.get("checksum"):
                raise FileError("%s changed since it was read (another writer?); nothing was written, "
                                "run again" % spec["path"])
        done = []  # (spec, what it held before) for the rollback
        for spec in specs:
            current = _read(spec["path"])
            if spec.get("content") is None and not current["exists"]:
                continue
            result["changed"] = True
            result["written"].append(spec["path"])
            if module.check_mode:
                continue
            try:
                before = _snapshot(spec["target"], current)
                if params["backup"]:
                    result["backups"][spec["path"]] = module.backup_local(spec["target"]) if current["exists"] else None
                if spec.get("content") is None:
                    os.unlink(spec["target"])
                else:
                    _atomic_write(module, spec["target"], to_bytes(spec["content"]), before[1])
                done.append((spec, before))
            except (IOError, OSError) as exc:
                raise FileError("%s: cannot write: %s; %s"
                                % (spec["path"], exc.strerror or exc, _roll_back(module, done)))
        if params["applied_record"] and params["applied_record_content"] is not None and not module.check_mode:
            _write_record(module, params["applied_record"], params["applied_record_content"])
    return result


def _write_record(module, path, content):
    """The applied record, private to root. A failure here leaves the config files as written (it only
    costs the next run its shortcut) but is still an error."""
    try:
        _atomic_write(module, _target(path), to_bytes(content), None, RECORD_FILE_MODE)
    except FileError as exc:
        raise FileError("cannot write the applied record: %s (the config files were written)" % exc)
    except (IOError, OSError) as exc:
        raise FileError("cannot write the applied record %s: %s (the config files were written)"
                        % (path, exc.strerror or exc))


def _snapshot(target, current):
    """(bytes, stat) of a file before it is replaced; (None, None) when it does not exist."""
    if not current["exists"]:
        return None, None
    return to_bytes(current["content"]), os.stat(target)


def _roll_back(module, done):
    """Put back the files of this call written before a failure, newest first, so that a
    config.toml never imports a drop-in that is missing, or the other way round."""
    failed = []
    for spec, (data, old_stat) in reversed(done):
        try:
            if data is None:
                os.unlink(spec["target"])
            else:
                _atomic_write(module, spec["target"], data, old_stat)
        except (IOError, OSError) as exc:
            failed.append("%s (%s)" % (spec["path"], exc.strerror or exc))
    if failed:
        return "rolling back failed too, check by hand: " + ", ".join(failed)
    if done:
        return "rolled back %s to its previous content" % ", ".join(s["path"] for s, _b in done)
    return "nothing was changed"


def _atomic_write(module, target, data, old_stat, new_mode=NEW_FILE_MODE):
    """Write to a temporary file next to target, then rename it over target. The temporary file
    takes the mode and owner of the file it replaces (old_stat), or new_mode. OSError goes to
    the caller, which rolls back; the temporary file never stays behind."""
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        os.makedirs(folder, 0o755)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".%s." % os.path.basename(target), suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if old_stat is None:
            os.chmod(tmp, new_mode)
        else:
            os.chmod(tmp, stat.S_IMODE(old_stat.st_mode))
            os.chown(tmp, old_stat.st_uid, old_stat.st_gid)
        if module.selinux_enabled():
            context = module.selinux_context(target) if old_stat else module.selinux_default_context(target)
            module.set_context_if_different(tmp, context, False)
        os.rename(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


ARGUMENT_SPEC = dict(
    op=dict(type="str", required=True, choices=["read", "validate", "write"]),
    paths=dict(type="list", elements="path", default=[]),
    files=dict(type="list", elements="dict", default=[], options=dict(
        path=dict(type="path", required=True),
        content=dict(type="str"),
        checksum=dict(type="str"),
    )),
    containerd_binary=dict(type="str"),
    kubelet_config=dict(type="path"),
    backup=dict(type="bool", default=False),
    import_rewrite=dict(type="str"),
    applied_record=dict(type="path"),
    applied_record_content=dict(type="str"),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    operations = {"read": _op_read, "validate": _op_validate, "write": _op_write}
    try:
        result = operations[module.params["op"]](module)
    except FileError as exc:
        module.fail_json(msg=to_text(exc))
    result.setdefault("changed", False)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
