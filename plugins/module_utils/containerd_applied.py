# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The applied record: what containerd_nvidia_runtime last left in a node's config files.

A re-run with the same options, the same engine and the same containerd on files whose checksums are
those the record holds is known to be a no-op without parsing them (tomlkit takes about 0.4 s on a
2,000-line config, most of the module's cost). Any other difference - a file edited by someone else,
another option, a new containerd, a changed kubelet config, an upgraded collection or tomlkit - takes
the full path.

One record file per node, one entry per main config path. Plain Python, no Ansible.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import json

RECORD_FORMAT = 1
# Options that change only how the edit is checked or kept, never its result.
_NOT_IN_FINGERPRINT = frozenset(("backup", "validate", "applied_record"))
# What a no-op run reports, as the full path computed it.
RESULT_KEYS = ("config_version", "runtime_table", "default_runtime_name", "warnings", "restart_service")


def sha256_text(text):
    """Checksum of a file's text as the node module reports it (SHA-256 of its UTF-8 bytes); None for no file."""
    if text is None:
        return None
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def engine_identity(source_files, tomlkit_version):
    """SHA-256 over the source files of the code that computes the edit and the tomlkit version that
    renders it: a record made by other code never matches."""
    digest = hashlib.sha256(("tomlkit %s\n" % tomlkit_version).encode("utf-8"))
    for path in sorted(source_files):
        with open(path, "rb") as handle:
            digest.update(path.rsplit("/", 1)[-1].encode("utf-8") + b"\n" + handle.read())
    return digest.hexdigest()


def fingerprint(params, engine):
    """SHA-256 of the options that shape the edit, with the engine's identity."""
    shaping = dict((k, v) for k, v in params.items() if k not in _NOT_IN_FINGERPRINT)
    text = json.dumps({"format": RECORD_FORMAT, "engine": engine, "params": shaping}, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def observation(file_checksums, containerd_version, kubelet_text):
    """What the node showed: each file's checksum (None: absent), containerd's version and the kubelet
    config's checksum (it decides SystemdCgroup for systemd_cgroup=auto)."""
    return {"files": dict(file_checksums), "containerd_version": containerd_version,
            "kubelet_config": sha256_text(kubelet_text)}


def _entries(record_text):
    """The entries of a record file; an unreadable or foreign record counts as empty (it is rewritten)."""
    if not record_text:
        return {}
    try:
        record = json.loads(record_text)
    except ValueError:
        return {}
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT or not isinstance(record.get("entries"), dict):
        return {}
    return record["entries"]


def applied_result(record_text, main_path, fingerprint_value, observed):
    """The result the full path computed when the record shows this exact edit already applied to
    exactly these files; None otherwise."""
    entry = _entries(record_text).get(main_path)
    if not isinstance(entry, dict):
        return None
    if entry.get("fingerprint") != fingerprint_value or entry.get("observed") != observed:
        return None
    result = entry.get("result")
    return dict(result) if isinstance(result, dict) else None


def updated_record(record_text, main_path, fingerprint_value, observed, result):
    """The record file's new text with this path's entry set; None when it already says exactly that."""
    entries = dict(_entries(record_text))
    entry = {"fingerprint": fingerprint_value, "observed": observed,
             "result": dict((k, result[k]) for k in RESULT_KEYS if k in result)}
    if entries.get(main_path) == entry:
        return None
    entries[main_path] = entry
    return json.dumps({"format": RECORD_FORMAT, "entries": entries}, indent=2, sort_keys=True) + "\n"
