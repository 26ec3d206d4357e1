# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Drop-ins and `imports`: the file the runtime goes to when the caller names a drop_in, the
`imports` entry of config.toml that makes containerd read it, and the checks on the pair.

Plain Python, no Ansible.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy
import fnmatch
import posixpath

from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_marks import set_mark, set_value
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_toml import (
    ConfigError, get_path, insert_top_level, new_table, parse, plain, to_item, tomlkit)


def import_glob(drop_in_path):
    return posixpath.join(posixpath.dirname(drop_in_path), "*.toml")


def imports_cover(imports, drop_in_path, config_path):
    """True when an `imports` entry already matches the drop-in (containerd globs per path element;
    relative entries are relative to the config's folder)."""
    config_dir = posixpath.dirname(config_path)
    for pattern in imports:
        if not isinstance(pattern, str):
            continue
        if not posixpath.isabs(pattern):
            pattern = posixpath.join(config_dir, pattern)
        if posixpath.dirname(pattern) == posixpath.dirname(drop_in_path) and \
                fnmatch.fnmatchcase(posixpath.basename(drop_in_path), posixpath.basename(pattern)):
            return True
    return False


def add_import(doc, glob):
    if "imports" in doc:
        set_value(doc, doc, "imports", plain(doc["imports"]) + [glob])
        return
    item = tomlkit.item([glob])
    set_mark(item)
    insert_top_level(doc, "imports", item)


def drop_in_document(config_doc, version, cri, config_filename):
    """The drop-in starts as version + a copy of the config's whole CRI table: containerd 1.x
    replaces an imported plugin table by key instead of merging it."""
    doc = tomlkit.document()
    doc["version"] = version
    source = get_path(config_doc, ["plugins", cri], config_filename)
    plugins = tomlkit.table(is_super_table=True)
    plugins[cri] = to_item(copy.deepcopy(plain(source))) if source is not None else new_table()
    doc["plugins"] = plugins
    return doc


DROP_IN_HEADER = ("# Written by gpuready.nvidia (containerd_nvidia_runtime) and rewritten on every run.\n"
                  "# %s imports it through %s.\n")


def check_drop_in(drop_in_path, drop_in_text, config_path, version):
    if not posixpath.isabs(drop_in_path):
        raise ConfigError("drop_in must be an absolute path, got %r" % (drop_in_path,))
    if posixpath.normpath(drop_in_path) == posixpath.normpath(config_path):
        raise ConfigError("drop_in must name another file than %s" % config_path)
    if not drop_in_path.endswith(".toml"):
        raise ConfigError("drop_in must end in .toml so that an imports glob can cover it, got %r"
                          % (drop_in_path,))
    if imports_cover([import_glob(drop_in_path)], config_path, config_path):
        # The imports glob for the drop-in would make containerd import config.toml into itself.
        raise ConfigError("drop_in must be in a folder of its own (a conf.d), not next to %s: the imports entry "
                          "%s would match %s too" % (config_path, import_glob(drop_in_path), config_path))
    if version == 1:
        raise ConfigError(
            "%s is a version 1 config: containerd does not apply a drop-in the way nvidia-ctk writes "
            "it for version 1 (D3). Omit drop_in to edit the file in place, or migrate the file to "
            "version 2." % config_path)
    if drop_in_text is not None:
        parse(drop_in_text, drop_in_path)  # refuse a broken drop-in before touching anything


def covering_import(config_text, drop_in_path, config_path):
    """The `imports` entry (as written) that covers the drop-in, for validating the pair elsewhere."""
    imports = plain(parse(config_text, config_path).get("imports", []))
    for pattern in imports:
        if imports_cover([pattern], drop_in_path, config_path):
            return pattern
    return None
