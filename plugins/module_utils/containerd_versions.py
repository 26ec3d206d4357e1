# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""containerd config versions and the CRI plugin's tables: which table holds the runtimes at each
version, which a containerd reads, and whether the CRI plugin is switched off.

Plain Python, no Ansible. The rules are what `containerd config dump` of 1.6.20, 1.7.24 and 2.1.9
shows (shared/reference/containerd-semantics.md).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_toml import (
    ConfigError, document_is_empty, dotted, expect_table, plain, tomlkit, type_name)

SUPPORTED_VERSIONS = (1, 2, 3, 4)
# The CRI plugin table that holds `containerd.runtimes` for each config version.
CRI_TABLE_BY_VERSION = {1: "cri", 2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime",
                        4: "io.containerd.cri.v1.runtime"}
# The CRI plugin's table names; listed in `disabled_plugins`, each also switches CRI off.
CRI_TABLES = ("cri", "io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime")
# The tables a containerd reads runtimes from at each config version (`config dump` of 1.6.20, 1.7.24
# and 2.1.9): 1 is read by 1.x from plugins.cri only; 2 by 1.x from the grpc table and by 2.x from the
# grpc or the v3 runtime table (AKS writes the latter); 3 and 4 by 2.x from the v3 runtime table only.
CRI_TABLES_READ_BY_VERSION = {1: ("cri",), 2: ("io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"),
                              3: ("io.containerd.cri.v1.runtime",), 4: ("io.containerd.cri.v1.runtime",)}
# The config version whose CRI table each name is.
CRI_TABLE_VERSION = {"cri": 1, "io.containerd.grpc.v1.cri": 2, "io.containerd.cri.v1.runtime": 3}


def detect_version(doc, filename, new_file_version):
    """Config version per containerd: no keys -> new-file version; keys but no version -> 1."""
    if document_is_empty(doc):
        return new_file_version
    if "version" not in doc:
        return 1
    version = plain(doc["version"])
    if isinstance(version, bool) or not isinstance(version, int):
        raise ConfigError("%s: 'version' must be an integer, found %s (%s)"
                          % (filename, type_name(version), doc.item("version").as_string().strip()))
    if version not in SUPPORTED_VERSIONS:
        raise ConfigError("%s: config version %d is not supported (containerd knows 1 to 4)"
                          % (filename, version))
    return version


def cri_table_name(doc, version, filename, warnings):
    """The CRI plugin table to edit. D7: the one the file really uses wins over what version implies,
    but only where containerd reads it at that version; a table it ignores is named in a warning."""
    implied = CRI_TABLE_BY_VERSION[version]
    plugins = expect_table(doc.get("plugins"), "plugins", filename)
    if not plugins:
        return implied

    def used(name):
        cri = expect_table(plugins.get(name), dotted(["plugins", name]), filename)
        ctr = cri and expect_table(cri.get("containerd"), dotted(["plugins", name, "containerd"]), filename)
        return bool(ctr) and ("runtimes" in ctr or "default_runtime_name" in ctr)

    in_use = [name for name in CRI_TABLES if used(name)]
    readable = CRI_TABLES_READ_BY_VERSION[version]
    for name in in_use:
        if name not in readable:
            warnings.append(
                "%s: containerd does not read plugins.\"%s\" in a version %d config, so the runtimes and default "
                "runtime there have no effect until the file says version = %d; editing plugins.\"%s\""
                % (filename, name, version, CRI_TABLE_VERSION[name], implied))
    if implied in in_use:
        return implied
    others = [name for name in in_use if name in readable]
    if len(others) == 1:
        warnings.append(
            "%s: config version %d implies the CRI table plugins.\"%s\", but the file keeps its runtimes "
            "in plugins.\"%s\"; editing that one" % (filename, version, implied, others[0]))
        return others[0]
    return implied


def _cri_disabled(doc):
    disabled = plain(doc.get("disabled_plugins", []))
    return isinstance(disabled, list) and any(p in CRI_TABLES for p in disabled)


def cri_disabled(text):
    """True when the config switches the CRI plugin off (Docker's containerd.io does)."""
    return _cri_disabled(tomlkit.parse(text))


def check_cri_enabled(doc, filename, warnings):
    if _cri_disabled(doc):
        warnings.append(
            "%s: disabled_plugins switches the CRI plugin off; Kubernetes cannot use this containerd "
            "until 'cri' is removed from disabled_plugins" % filename)
