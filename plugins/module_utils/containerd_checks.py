# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checks around an edit of containerd's config: what the kubelet's cgroup driver implies before it
(D4), what `containerd config dump` would not catch in the new text, and what the dump of the running
containerd shows after it.

Plain Python, no Ansible.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_toml import (
    ConfigError, document_is_empty, dotted, get_path, parse, plain, tomlkit)
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_versions import (
    CRI_TABLE_BY_VERSION, cri_table_name, detect_version)


def semantic_problems(text, filename, containerd_major=None):
    """Checks that `containerd config dump` does not make (test-environment.md section 2)."""
    problems = []
    doc = parse(text, filename)
    if document_is_empty(doc):
        return problems
    version = detect_version(doc, filename, 2)
    if containerd_major is not None and containerd_major < 2 and version >= 3:
        problems.append("%s is a version %d config, which containerd %d.x silently ignores"
                        % (filename, version, containerd_major))
    cri = cri_table_name(doc, version, filename, [])
    ctr = get_path(doc, ["plugins", cri, "containerd"], filename)
    runtimes = ctr.get("runtimes") if ctr else None
    default = plain(ctr.get("default_runtime_name")) if ctr else None
    declared = set(runtimes.keys()) if runtimes else set()
    if default and default not in declared and (version <= 2 or default != "runc"):
        problems.append("%s: default_runtime_name = %r has no entry under %s"
                        % (filename, default, dotted(["plugins", cri, "containerd", "runtimes"])))
    if version <= 2 and declared and not default and "runc" not in declared \
            and (containerd_major is None or containerd_major < 2):
        problems.append("%s: runtimes are declared but runc is not, and runc is the default: containerd "
                        "1.x drops its built-in runc and the CRI plugin fails to load (D5)" % filename)
    return problems


def dump_problem(dump_text, runtime_name, runtime_path, default_runtime_name=None):
    """What is wrong with `containerd config dump` output for our runtime, or None.

    The dump is what containerd really loads, so a runtime written into a table this containerd does
    not read (a version 3 file on 1.x, a version 1 file on 2.x, a wrong plugin name) shows up here. Only
    the CRI plugin's own table counts: containerd 2.x also prints tables no plugin reads, as they were."""
    try:
        dump = plain(tomlkit.parse(dump_text))
    except Exception as exc:  # containerd printed something that is not TOML
        return "config dump did not print TOML: %s" % exc
    # containerd 1.x dumps a version 2 config and reads runtimes from the grpc table, 2.x a version 3 one.
    loaded_in = CRI_TABLE_BY_VERSION.get(dump.get("version"), CRI_TABLE_BY_VERSION[2])
    ctr = dump.get("plugins", {}).get(loaded_in, {}).get("containerd", {})
    runtime = ctr.get("runtimes", {}).get(runtime_name)
    if not isinstance(runtime, dict):
        return "config dump shows no runtime %r: this containerd does not read the table it was written to" \
            % runtime_name
    binary = runtime.get("options", {}).get("BinaryName")
    if binary != runtime_path:
        return "config dump shows runtime %r with BinaryName %r, not %r" % (runtime_name, binary, runtime_path)
    if default_runtime_name and ctr.get("default_runtime_name") != default_runtime_name:
        return "config dump shows default_runtime_name %r, not %r" % (
            ctr.get("default_runtime_name"), default_runtime_name)
    return None


def kubelet_systemd_cgroup(kubelet_config):
    """D4: SystemdCgroup implied by a parsed kubelet config (None when there is no kubelet config)."""
    if kubelet_config is None:
        return None
    if not isinstance(kubelet_config, dict):
        raise ConfigError("the kubelet config is not a YAML mapping")
    driver = kubelet_config.get("cgroupDriver", "cgroupfs")  # the kubelet's own default
    if driver not in ("systemd", "cgroupfs"):
        raise ConfigError("the kubelet config has cgroupDriver %r; expected systemd or cgroupfs" % (driver,))
    return driver == "systemd"
