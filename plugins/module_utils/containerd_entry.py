# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The nvidia runtime entry under containerd.runtimes, as nvidia-ctk builds it: a copy of the base
runtime (the default, else runc, else crun) with our binary, or a fresh runc v2 entry.

Plain Python, no Ansible.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy

from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_marks import RUNC_NOTE, mark_of
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_toml import (
    ConfigError, find_item, is_table, plain, to_item)

RUNC_V2 = "io.containerd.runc.v2"


def _base_runtime(runtimes, default_name):
    """nvidia-ctk's base: the default unless it is an nvidia* runtime, else runc, else crun."""
    candidates = []
    if isinstance(default_name, str) and default_name and not default_name.startswith("nvidia"):
        candidates.append(default_name)
    candidates += ["runc", "crun"]
    for name in candidates:
        # A runc we declared for D5 is not a base: copying it would change our entry on the next run.
        if runtimes is not None and is_table(runtimes.get(name)) and \
                mark_of(find_item(runtimes, name)) != RUNC_NOTE:
            return name
    return None


def _set_option(options, key, value):
    """Set an option and drop keys that differ only in case: containerd 1.x decodes options
    case-insensitively, so `binaryName` next to `BinaryName` makes the winner random."""
    for other in [k for k in options if k != key and k.lower() == key.lower()]:
        del options[other]
    options[key] = value


def no_base_systemd_cgroup(request):
    """SystemdCgroup for a runtime with nothing to copy from: forced, or the kubelet's (D4)."""
    if request.systemd_cgroup != "auto":
        return request.systemd_cgroup
    return request.kubelet_systemd_cgroup


def build_entry(runtimes, default_name, version, request, filename):
    """The runtime entry as plain data (section 2 of containerd-semantics.md, plus D4 and D8)."""
    base = _base_runtime(runtimes, default_name)
    if base is not None:
        entry = copy.deepcopy(plain(runtimes[base]))
    else:
        entry = {"runtime_type": RUNC_V2}
        if version < 3:
            # D8: containerd 2.x removed runtime_root/runtime_engine; 1.x layouts keep nvidia-ctk's keys.
            entry.update({"runtime_root": "", "runtime_engine": ""})
        entry["privileged_without_host_devices"] = False
    if not entry.get("runtime_type"):
        entry["runtime_type"] = RUNC_V2
    options = entry.get("options")
    if options is None:
        options = entry["options"] = {}
    elif not is_table(options):
        raise ConfigError("%s: options of runtime %r must be a table" % (filename, base))
    _set_option(options, "BinaryName", request.runtime_path)
    if version == 1:
        _set_option(options, "Runtime", request.runtime_path)
    if request.systemd_cgroup != "auto":
        _set_option(options, "SystemdCgroup", request.systemd_cgroup)
    elif base is None and request.kubelet_systemd_cgroup is not None:
        _set_option(options, "SystemdCgroup", request.kubelet_systemd_cgroup)
    if not options:
        del entry["options"]
    return entry, base


def new_runtime_table(entry):
    return to_item(entry)
