# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The containerd config edit engine: what ``nvidia-ctk runtime configure`` does, with tomlkit.

Plain Python, no Ansible. Input is the text of config.toml (and of a drop-in), output is the new
text of each file plus what changed. Everything else in the file keeps its bytes.

This file is the editor: the Request, the Outcome and edit(). It builds on the containerd_*
module_utils beside it: containerd_toml (format-preserving TOML), containerd_marks (the ownership
marks that let state=absent undo exactly our edits), containerd_versions (config versions and CRI
tables), containerd_entry (the runtime entry) and containerd_dropin (drop-ins and imports).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import posixpath
import re

from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_dropin import (
    DROP_IN_HEADER, add_import, check_drop_in, drop_in_document, import_glob, imports_cover)
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_entry import (
    RUNC_V2, build_entry, new_runtime_table, no_base_systemd_cgroup)
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_marks import (
    MARK, NEW_FILE_NOTE, RUNC_NOTE, created_by_us, drop_mark, mark_of, prune, revert_marked, revert_value,
    set_mark, set_value)
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_toml import (
    HAS_TOMLKIT, LAYOUT_REFUSAL, TOMLKIT_IMPORT_ERROR, ConfigError, TOMLKitError, document_is_empty, dotted,
    dumps_checked, ensure_path, expect_table, find_item, get_path, insert_keeping_layout, is_tomlkit_table, parse,
    plain, sync_table, to_inline, tomlkit, type_name)
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_versions import (
    SUPPORTED_VERSIONS, check_cri_enabled, cri_table_name, detect_version)

# No dots: a RuntimeClass handler is a DNS label, and a dotted name reads as nested tables when unquoted.
RUNTIME_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")


class Request(object):
    """What the caller wants. ``set_as_default`` is tri-state (None = leave as it is); ``systemd_cgroup``
    is "auto" or a bool, and ``kubelet_systemd_cgroup`` what the kubelet's cgroupDriver implies (D4)."""

    def __init__(self, runtime_name="nvidia", runtime_path="/usr/bin/nvidia-container-runtime",
                 set_as_default=None, enable_cdi=False, systemd_cgroup="auto", kubelet_systemd_cgroup=None,
                 state="present", new_file_version=2):
        self.runtime_name = runtime_name
        self.runtime_path = runtime_path
        self.set_as_default = set_as_default
        self.enable_cdi = enable_cdi
        # "auto": copy the base runtime's setting, or (D4) follow the kubelet when there is no base.
        self.systemd_cgroup = systemd_cgroup
        self.kubelet_systemd_cgroup = kubelet_systemd_cgroup
        self.state = state
        self.new_file_version = new_file_version
        self.validate()

    def validate(self):
        if not isinstance(self.runtime_name, str) or not RUNTIME_NAME_RE.match(self.runtime_name):
            raise ConfigError(
                "invalid runtime_name %r: use 1-63 letters, digits, '_' or '-', starting with a "
                "letter or digit (it becomes a TOML table name and a Kubernetes RuntimeClass handler)"
                % (self.runtime_name,))
        if not isinstance(self.runtime_path, str) or not posixpath.isabs(self.runtime_path):
            raise ConfigError("runtime_path must be an absolute path, got %r" % (self.runtime_path,))
        if self.state not in ("present", "absent"):
            raise ConfigError("state must be 'present' or 'absent', got %r" % (self.state,))
        if self.systemd_cgroup not in ("auto", True, False):
            raise ConfigError("systemd_cgroup must be auto, true or false, got %r" % (self.systemd_cgroup,))
        if self.set_as_default not in (None, True, False):
            raise ConfigError("set_as_default must be true, false or omitted, got %r" % (self.set_as_default,))
        if self.new_file_version not in SUPPORTED_VERSIONS:
            raise ConfigError("config_version must be one of 1, 2, 3, 4, got %r" % (self.new_file_version,))


class Outcome(object):
    """Result of an edit. A text of None means the file must not exist."""

    def __init__(self):
        self.config_text = None
        self.drop_in_text = None
        self.config_version = None
        self.runtime_table = None
        self.default_runtime_name = None
        self.warnings = []


class _Editor(object):
    """Applies a Request to one parsed document."""

    def __init__(self, doc, filename, request, version, cri, outcome):
        self.doc = doc
        self.filename = filename
        self.request = request
        self.version = version
        self.cri = cri
        self.outcome = outcome
        self.cri_path = ["plugins", cri]
        self.ctr_path = self.cri_path + ["containerd"]
        self.runtimes_path = self.ctr_path + ["runtimes"]

    def table(self, parts):
        return expect_table(get_path(self.doc, parts, self.filename), dotted(parts), self.filename)

    def check_types(self):
        """Every key we read must have the type containerd expects."""
        ctr = self.table(self.ctr_path)
        runtimes = self.table(self.runtimes_path)
        if ctr is not None and "default_runtime_name" in ctr:
            name = plain(ctr["default_runtime_name"])
            if not isinstance(name, str):
                raise ConfigError("%s: %s must be a string, found %s" % (
                    self.filename, dotted(self.ctr_path + ["default_runtime_name"]), type_name(name)))
        if runtimes is not None:
            for name, value in runtimes.items():
                where = dotted(self.runtimes_path + [name])
                expect_table(value, where, self.filename)
                if "options" in value:
                    expect_table(value["options"], where + ".options", self.filename)
                    self._check_options(value["options"], where + ".options")
                if "runtime_type" in value and not isinstance(plain(value["runtime_type"]), str):
                    raise ConfigError("%s: %s.runtime_type must be a string" % (self.filename, where))
        cri = self.table(self.cri_path)
        if cri is not None and "enable_cdi" in cri and not isinstance(plain(cri["enable_cdi"]), bool):
            raise ConfigError("%s: %s.enable_cdi must be a boolean" % (self.filename, dotted(self.cri_path)))
        self.imports()
        disabled = plain(self.doc.get("disabled_plugins", []))
        if not isinstance(disabled, list) or not all(isinstance(p, str) for p in disabled):
            raise ConfigError("%s: 'disabled_plugins' must be an array of strings" % self.filename)

    def _check_options(self, options, where):
        """The options a base runtime passes on to ours (copied as they are) must have containerd's types."""
        for key, kind, name in (("BinaryName", str, "a string"), ("Runtime", str, "a string"),
                                ("SystemdCgroup", bool, "a boolean")):
            if key in options and not isinstance(plain(options[key]), kind):
                raise ConfigError("%s: %s.%s must be %s, found %s"
                                  % (self.filename, where, key, name, type_name(options[key])))

    def default_name(self):
        ctr = self.table(self.ctr_path)
        return plain(ctr.get("default_runtime_name")) if ctr is not None else None

    def imports(self):
        imports = plain(self.doc.get("imports", []))
        if not isinstance(imports, list):
            raise ConfigError("%s: 'imports' must be an array, found %s" % (self.filename, type_name(imports)))
        if not all(isinstance(entry, str) for entry in imports):
            raise ConfigError("%s: 'imports' must be an array of strings (paths or globs)" % self.filename)
        return imports

    def present(self):
        request = self.request
        name = request.runtime_name
        if request.set_as_default:
            self._refuse_deprecated_default_runtime()
        runtimes = self.table(self.runtimes_path)
        entry, base = build_entry(runtimes, self.default_name(), self.version, request, self.filename)
        if runtimes is None or len(runtimes) == 0:
            runtimes = ensure_path(self.doc, self.runtimes_path)
            self._declare_runc_if_dropped(runtimes)
        if name in runtimes:
            self._update_existing_runtime(runtimes, name, entry)
        else:
            table = new_runtime_table(entry)
            set_mark(table)  # ours: absent deletes it
            insert_keeping_layout(self.doc, runtimes, name, table)

        ctr = self.table(self.ctr_path)
        if request.set_as_default is True:
            set_value(self.doc, ctr, "default_runtime_name", name)
        elif request.set_as_default is False and self.default_name() == name:
            if not revert_value(ctr, "default_runtime_name"):
                del ctr["default_runtime_name"]
        if request.enable_cdi:
            # D2: also on version 1 the key belongs on the plugin table (plugins.cri.enable_cdi).
            set_value(self.doc, self.table(self.cri_path), "enable_cdi", True)

    def _update_existing_runtime(self, runtimes, name, entry):
        """A runtime declared before us: sync it, recording the original on its header so absent can
        give it back (a header-less table has nowhere to hold the note; absent then keeps our version)."""
        original = plain(runtimes[name])
        table = find_item(runtimes, name)
        if not sync_table(runtimes[name], entry) or mark_of(table) is not None:
            return
        if is_tomlkit_table(table) and not table.is_super_table():
            set_mark(table, "was " + to_inline(original).as_string())

    def _refuse_deprecated_default_runtime(self):
        legacy = self.table(self.ctr_path + ["default_runtime"])
        if legacy is not None and plain(legacy.get("runtime_type", "")):
            raise ConfigError(
                "%s: %s sets runtime_type = %r; containerd 1.x then ignores default_runtime_name, so "
                "set_as_default would have no effect (D6). Remove the deprecated default_runtime table "
                "(or empty its runtime_type) and declare that runtime under containerd.runtimes instead."
                % (self.filename, dotted(self.ctr_path + ["default_runtime"]),
                   plain(legacy["runtime_type"])))

    def _declare_runc_if_dropped(self, runtimes):
        """D5: containerd 1.x replaces its built-in runtimes map with the file's. When the file had
        none and runc stays the default, runc must be declared or the CRI plugin fails to load."""
        if self.version > 2 or self.request.set_as_default is True:
            return
        if self.default_name() not in (None, "", "runc"):
            return
        runc = {"runtime_type": RUNC_V2}
        systemd_cgroup = no_base_systemd_cgroup(self.request)
        if systemd_cgroup is not None:
            runc["options"] = {"SystemdCgroup": systemd_cgroup}
        table = new_runtime_table(runc)
        set_mark(table, RUNC_NOTE)
        insert_keeping_layout(self.doc, runtimes, "runc", table)

    def absent(self):
        """Undo our marked edits. A file without any of our marks (configured by nvidia-ctk or by hand)
        loses the runtime and the default naming it, as nvidia-ctk's own cleanup does."""
        name = self.request.runtime_name
        edited_by_us = ("# " + MARK) in self.doc.as_string()
        runtimes = self.table(self.runtimes_path)
        if runtimes is not None and name in runtimes:
            note = mark_of(find_item(runtimes, name))
            if note is not None and note.startswith("was "):
                sync_table(runtimes[name], plain(tomlkit.parse("x = " + note[4:])["x"]))
                drop_mark(find_item(runtimes, name))
            elif note is not None or not edited_by_us:
                del runtimes[name]
        if runtimes is not None and "runc" in runtimes and mark_of(find_item(runtimes, "runc")) is not None:
            del runtimes["runc"]
        ctr = self.table(self.ctr_path)
        if ctr is not None and self.default_name() == name:
            if not revert_value(ctr, "default_runtime_name") and not edited_by_us:
                del ctr["default_runtime_name"]
        revert_marked(self.doc, skip_keys=("default_runtime_name",))
        prune(self.doc)


def _finish(outcome, editor):
    outcome.config_version = editor.version
    outcome.runtime_table = dotted(editor.runtimes_path + [editor.request.runtime_name])
    outcome.default_runtime_name = editor.default_name() or None


def edit(config_text, request, config_path="/etc/containerd/config.toml", drop_in_path=None,
         drop_in_text=None):
    """Compute the new text of config.toml (and of the drop-in).

    ``config_text`` / ``drop_in_text`` are None when the file does not exist; in the outcome None
    means the file must not exist. Raises ConfigError on input we refuse; the caller then writes
    nothing.
    """
    try:
        return _edit(config_text, request, config_path, drop_in_path, drop_in_text)
    except TOMLKitError:
        # tomlkit itself failing to edit a table split in an odd order (a key it just inserted into
        # an out-of-order table not found again): the same refusal as a layout it cannot render.
        raise ConfigError(LAYOUT_REFUSAL % config_path)


def _edit(config_text, request, config_path, drop_in_path, drop_in_text):
    if not HAS_TOMLKIT:
        raise ConfigError("the Python library tomlkit is required on the controller: %s"
                          % TOMLKIT_IMPORT_ERROR)
    if not posixpath.isabs(config_path):
        raise ConfigError("path must be an absolute path, got %r" % (config_path,))
    outcome = Outcome()
    doc = parse(config_text or "", config_path)
    is_empty = document_is_empty(doc)
    version = detect_version(doc, config_path, request.new_file_version)
    cri = cri_table_name(doc, version, config_path, outcome.warnings)
    check_cri_enabled(doc, config_path, outcome.warnings)
    editor = _Editor(doc, config_path, request, version, cri, outcome)
    editor.check_types()
    if drop_in_path is not None:
        check_drop_in(drop_in_path, drop_in_text, config_path, version)

    if request.state == "absent":
        # The runtime must be gone from config.toml too, even in drop-in mode.
        editor.absent()
        _finish(outcome, editor)
        if config_text is None or (document_is_empty(doc) and created_by_us(config_text)):
            outcome.config_text = None
        else:
            outcome.config_text = dumps_checked(doc, config_path, config_text)
        return outcome

    if is_empty:
        # A file we create says so in its version line, so that absent removes it again.
        set_value(doc, doc, "version", version, note=NEW_FILE_NOTE if config_text is None else "")
    if drop_in_path is None:
        editor.present()
        _finish(outcome, editor)
        outcome.config_text = dumps_checked(doc, config_path, config_text)
        return outcome

    if not imports_cover(editor.imports(), drop_in_path, config_path):
        add_import(doc, import_glob(drop_in_path))
    if editor.table(editor.runtimes_path + [request.runtime_name]) is not None:
        outcome.warnings.append(
            "%s still declares %s; containerd 2.x merges it under the drop-in's entry"
            % (config_path, dotted(editor.runtimes_path + [request.runtime_name])))
    outcome.config_text = dumps_checked(doc, config_path, config_text)
    drop_editor = _Editor(drop_in_document(doc, version, cri, config_path), drop_in_path, request,
                          version, cri, outcome)
    drop_editor.present()
    _finish(outcome, drop_editor)
    outcome.drop_in_text = (DROP_IN_HEADER % (config_path, import_glob(drop_in_path))
                            + dumps_checked(drop_editor.doc, drop_in_path))
    return outcome
