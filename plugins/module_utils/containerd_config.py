# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The containerd config edit engine: what ``nvidia-ctk runtime configure`` does, with tomlkit.

Plain Python, no Ansible. Input is the text of config.toml (and of a drop-in), output is the new
text of each file plus what changed. Everything else in the file keeps its bytes.

Ownership is recorded in the file itself: every key or table this engine adds or changes outside
the runtime entry carries a trailing comment starting with ``gpuready.nvidia`` (``: was <old
value>`` when it replaced one). ``state=absent`` reverts exactly those, so present-then-absent
gives back the original bytes, and a human reading the file sees who changed what.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy
import fnmatch
import posixpath
import re

try:
    import tomllib  # Python 3.11+: a strict TOML 1.0 reader, as containerd's
except ImportError:  # pragma: no cover - older controllers go without the check
    tomllib = None

try:
    import tomlkit
    from tomlkit.exceptions import ParseError as _TomlParseError, TOMLKitError as _TOMLKitError
    from tomlkit.items import AoT as _AoT, Item as _Item, Null as _Null, Table as _Table, Whitespace as _Whitespace
    HAS_TOMLKIT = True
    TOMLKIT_IMPORT_ERROR = None
except ImportError as exc:  # pragma: no cover - reported by the caller
    HAS_TOMLKIT = False
    TOMLKIT_IMPORT_ERROR = exc

    class _TOMLKitError(Exception):
        pass

RUNC_V2 = "io.containerd.runc.v2"
MARK = "gpuready.nvidia"
MARK_SEPARATOR = "  "  # between an item's own comment and our mark
HEADER_NOTE = "header"
RUNC_NOTE = "containerd 1.x drops its built-in runc once runtimes are declared"
NEW_FILE_NOTE = "new file"
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
# No dots: a RuntimeClass handler is a DNS label, and a dotted name reads as nested tables when unquoted.
RUNTIME_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")


class ConfigError(Exception):
    """Input we refuse. Nothing may be written when this is raised."""


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


# ---------------------------------------------------------------- parsing and small helpers

def parse(text, filename):
    """Parse TOML text, or raise ConfigError naming the file, line and column."""
    try:
        doc = tomlkit.parse(text)
    except _TomlParseError as exc:
        raise ConfigError("%s: invalid TOML at line %s, column %s: %s"
                          % (filename, exc.line, exc.col, _parse_error_reason(exc)))
    except Exception as exc:  # tomlkit raises a few non-ParseError types on odd input
        raise ConfigError("%s: invalid TOML: %s" % (filename, exc))
    if tomllib is not None:
        # tomlkit also reads TOML 1.1 (escapes such as \e), which containerd 1.6 and 1.7 refuse to start with.
        try:
            tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("%s: invalid TOML 1.0, which containerd 1.x reads: %s" % (filename, exc))
    if _may_have_shifted_headers(doc):
        _restore_header_indents(doc, text)
    return doc


def _may_have_shifted_headers(container):
    """Whether tomlkit's parser may have re-indented headers: it does so to the second and later
    headers below a header-less table that took the indentation of the first one, e.g. under
    `  [a.b.c.d]` then `  [a.b.c.e]` with b and c never written (Debian's stock config after
    runtimes are added). Cheap, so that only such files pay for the render in the repair."""
    for _key, item in container.body:
        if isinstance(item, _Table):
            if item.is_super_table() and item.trivia.indent.strip("\n") and len(item) > 1:
                return True
            if _may_have_shifted_headers(item.value):
                return True
    return False


def _header_tables(container):
    """Every table that writes a [header] line, in the order tomlkit renders them."""
    for _key, item in container.body:
        if isinstance(item, _Table):
            if not item.is_super_table():
                yield item
            yield from _header_tables(item.value)
        elif isinstance(item, _AoT):
            for element in item.body:
                yield element
                yield from _header_tables(element.value)


def _restore_header_indents(doc, text):
    """Give every header line the indentation it has in text. Each header is found in the rendering
    by a marker in its indent; the text's line at the same place, holding the same header, has the
    indentation that tomlkit lost. Without this a file is re-indented on every run and never a no-op."""
    tables = list(_header_tables(doc))
    saved = [table.trivia.indent for table in tables]
    for number, table in enumerate(tables):
        table.trivia.indent = "%s\x00%d\x00" % (saved[number], number)
    marked = tomlkit.dumps(doc).split("\n")
    for table, indent in zip(tables, saved):
        table.trivia.indent = indent
    lines = text.split("\n")
    if len(marked) != len(lines):
        return
    for line, source in zip(marked, lines):
        match = re.search("\x00(\\d+)\x00", line)
        if match is None:
            continue
        written = line[:match.start()] + line[match.end():]
        if written.lstrip() != source.lstrip():
            continue
        number = int(match.group(1))
        kept = saved[number][:saved[number].rfind("\n") + 1]  # blank lines before the header
        tables[number].trivia.indent = kept + source[:len(source) - len(source.lstrip())]


def _parse_error_reason(exc):
    # ParseError's text ends with " at line L col C"; we print those ourselves.
    return re.sub(r"\s+at line \d+ col \d+$", "", str(exc))


def plain(value):
    """tomlkit item -> plain Python (dict/list/str/int/bool/float)."""
    if hasattr(value, "unwrap"):
        return value.unwrap()
    if isinstance(value, dict):
        return dict((k, plain(v)) for k, v in value.items())
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def _kind(value):
    """TOML type of a plain value (bool before int: True is an int in Python)."""
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return kind
    return type(value)


def _same(a, b):
    """TOML equality that tells booleans from integers."""
    a, b = plain(a), plain(b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return _kind(a) is _kind(b) and a == b


def _is_table(value):
    return isinstance(value, dict)


def _expect_table(value, where, filename):
    if value is not None and not _is_table(value):
        raise ConfigError("%s: %s must be a table, found %s" % (filename, where, _type_name(value)))
    return value


def _type_name(value):
    value = plain(value)
    for typ, name in ((bool, "a boolean"), (int, "an integer"), (float, "a float"), (str, "a string"),
                      (list, "an array"), (dict, "a table")):
        if isinstance(value, typ):
            return name
    return type(value).__name__


def _dotted(parts):
    return ".".join(p if re.match(r"^[A-Za-z0-9_-]+$", p) else '"%s"' % p for p in parts)


def _get_path(doc, parts, filename):
    """Walk tables; None when a part is missing; ConfigError when a part is not a table."""
    node = doc
    for i, part in enumerate(parts):
        _expect_table(node, _dotted(parts[:i]) or "the document", filename)
        if part not in node:
            return None
        node = node[part]
    return node


# ---------------------------------------------------------------- ownership marks

def _mark_of(item):
    """The gpuready.nvidia note on an item, '' for a bare mark, None when unmarked."""
    comment = getattr(getattr(item, "trivia", None), "comment", "") or ""
    idx = comment.find("# " + MARK)
    if idx < 0:
        return None
    note = comment[idx + 2 + len(MARK):]
    return note[2:] if note.startswith(": ") else ""


def _set_mark(item, note=""):
    """Add our mark after any comment the item already has (kept, to be restored by absent)."""
    mark = "# " + MARK + (": " + note if note else "")
    trivia = item.trivia
    if trivia.comment:
        trivia.comment = trivia.comment + MARK_SEPARATOR + mark
    else:
        trivia.comment_ws = trivia.comment_ws or " "
        trivia.comment = mark


def _drop_mark(item):
    """Undo _set_mark exactly, keeping the item's own comment byte for byte."""
    trivia = item.trivia
    idx = trivia.comment.find("# " + MARK)
    if idx < 0:
        return
    if idx == 0:
        trivia.comment, trivia.comment_ws = "", ""
    else:
        trivia.comment = trivia.comment[:idx - len(MARK_SEPARATOR)]


def _new_table():
    return tomlkit.table()


def _concrete(table, key):
    """tomlkit hands out a proxy for a table split over several headers (a sub-table written
    before its parent); edits go to the part that holds the key, else to one with a header."""
    parts = getattr(table, "_tables", None)  # only OutOfOrderTableProxy has it
    if parts is None:
        return table
    holding = [t for t in parts if key in t]
    headed = [t for t in parts if not t.is_super_table()]
    return (holding or headed or parts)[0]


def _item_of(table, key):
    """table.item(key) for a document or a table (tomlkit < 0.13.1 Tables have no .item)."""
    return (table.value if isinstance(table, _Table) else table).item(key)


def _item(table, key):
    """The tomlkit item (with its comment) for key; table[key] unwraps booleans."""
    return _item_of(_concrete(table, key), key)


def _containers(container):
    """A tomlkit container and every table container below it."""
    yield container
    for _key, item in container.body:
        if isinstance(item, _Table):
            yield from _containers(item.value)
        elif isinstance(item, _AoT):
            for table in item.body:
                yield from _containers(table.value)


def _insert(doc, parent, key, item):
    """parent[key] = item, leaving every other line of the file as it was.

    tomlkit adds blank lines around an inserted item (in its neighbours' trivia, or as whitespace
    items in their bodies); removing the item later would leave them behind. We undo those and let
    our item carry its own separation, so that absent gives back the original bytes."""
    containers = list(_containers(doc))
    bodies = [(c, set(id(entry[1]) for entry in c.body)) for c in containers]
    trivia = [(i, i.trivia.indent, i.trivia.trail) for c in containers for _k, i in c.body
              if isinstance(i, _Item) and not isinstance(i, (_Whitespace, _Null))]
    parent = _concrete(parent, key)
    parent[key] = item
    for container, before in bodies:
        for index, (entry_key, entry) in enumerate(container.body):
            if isinstance(entry, _Whitespace) and id(entry) not in before:
                container.body[index] = (entry_key, _Null())  # Null keeps tomlkit's indexes valid
    for other, indent, trail in trivia:
        other.trivia.indent, other.trivia.trail = indent, trail
    inserted = _item_of(parent, key)
    _indent_like_siblings(doc, parent, key, inserted)
    return inserted


def _indent_like_siblings(doc, parent, key, inserted):
    """Indent a new item like the items next to it. A new table ends with a blank line: on the next
    parse that line belongs to our table, so removing the table removes the line too."""
    if isinstance(inserted, _Table):
        # A blank line before our header would belong to the previous table on the next parse.
        inserted.trivia.indent = inserted.trivia.indent.lstrip("\n")
        if inserted.is_super_table():
            return
        _copy_indent(inserted, _layout_model(doc, parent, key))
        if len(inserted):
            last = inserted
            while [k for k in last if isinstance(last[k], _Table)]:
                last = _item_of(last, [k for k in last if isinstance(last[k], _Table)][-1])
            last.add(tomlkit.nl())
        return
    values = [_item(parent, k) for k in parent if k != key and not _table_parts(parent[k])]
    if values:
        inserted.trivia.indent = values[0].trivia.indent


def _headed(table):
    """table itself, or for a header-less one the first table below it that has a header (or None)."""
    if not table.is_super_table():
        return table
    return next(_header_tables(table.value), None)


def _layout_model(doc, parent, key):
    """The table whose layout a new table in parent copies: a sibling, else the nearest header table
    below an ancestor (in Debian's stock config, a runtime added under the header-less
    `containerd.runtimes` is laid out like `[plugins."io.containerd.grpc.v1.cri".cni]`)."""
    skip = _item(parent, key)
    for table in [_concrete(parent, key)] + list(reversed(_ancestors(doc, _concrete(parent, key)) or [])):
        for name in table:
            child = _item(table, name)
            if child is skip or not isinstance(child, _Table) or _contains(child, skip):
                continue
            if _headed(child) is not None:
                return _headed(child)
        skip = table
    return None


def _ancestors(container, target, chain=()):
    """The tables from the document down to target (exclusive), found by identity; None if absent."""
    for _key, item in (container.value if isinstance(container, _Table) else container).body:
        if isinstance(item, _Table):
            if item is target:
                return list(chain)
            found = _ancestors(item, target, chain + (item,))
            if found is not None:
                return found
    return None


def _contains(table, target):
    return _ancestors(table, target) is not None


def _copy_indent(table, model):
    """Give table (ours, fresh) the indentation of model, a parsed table of the same shape."""
    if model is None:
        return
    header = model.trivia.indent.lstrip("\n")
    table.trivia.indent = header
    model_values = [_item_of(model, k) for k in model if not isinstance(model[k], _Table)]
    model_tables = [_headed(_item_of(model, k)) for k in model if isinstance(model[k], _Table)]
    model_tables = [t for t in model_tables if t is not None]
    key_indent = model_values[0].trivia.indent.lstrip("\n") if model_values else header
    for k in table:
        item = _item_of(table, k)
        if isinstance(item, _Table):
            alike = _headed(_item_of(model, k)) if k in model and isinstance(model[k], _Table) else None
            if alike is not None or model_tables:
                _copy_indent(item, alike or model_tables[0])
            else:  # nothing alike to copy: nest one level like the keys
                item.trivia.indent = key_indent
                for sub in item:
                    _item_of(item, sub).trivia.indent = key_indent + key_indent[len(header):]
        else:
            item.trivia.indent = key_indent


def _ensure_path(doc, parts):
    """Create the missing tables along parts, header-less until a key lands in one."""
    node = doc
    for part in parts:
        if part not in node:
            _insert(doc, node, part, tomlkit.table(is_super_table=True))
        node = node[part]
    return node


def _set_value(doc, table, key, value, note=""):
    """Set table[key] = value and mark it (recording the old value) so that absent can undo it."""
    table = _concrete(table, key)
    if key not in table:
        if isinstance(table, _Table) and table.is_super_table():
            # The table gets a header line for our key; absent takes the header away again.
            _set_mark(table, HEADER_NOTE)
        item = tomlkit.item(value)
        _set_mark(item, note)
        _insert(doc, table, key, item)
        return True
    old = _item_of(table, key)
    if _same(old, value):
        return False
    note = _mark_of(old)
    if note is None:
        old_text = old.as_string().strip()
        if "\n" in old_text:  # a multi-line array does not fit in a comment: record it inline
            old_text = tomlkit.item(plain(old)).as_string()
        note = "was " + old_text
    _drop_mark(old)  # the first change already recorded the original value
    comment, comment_ws = old.trivia.comment, old.trivia.comment_ws
    table[key] = tomlkit.item(value)
    new = _item_of(table, key)
    new.trivia.comment, new.trivia.comment_ws = comment, comment_ws
    _set_mark(new, note)
    return True


def _revert_value(table, key):
    """Undo _set_value: restore the recorded old value, or delete a key we added."""
    table = _concrete(table, key)
    item = _item_of(table, key)
    note = _mark_of(item)
    if note is None:
        return False
    if note.startswith("was "):
        old = tomlkit.parse("x = " + note[4:])
        restored = _item_of(old, "x")
        restored.trivia.comment_ws, restored.trivia.comment = item.trivia.comment_ws, item.trivia.comment
        table[key] = restored
        _drop_mark(_item_of(table, key))
    else:
        del table[key]
    return True


# ---------------------------------------------------------------- reading a config

def _document_is_empty(doc):
    return len(doc) == 0


def detect_version(doc, filename, new_file_version):
    """Config version per containerd: no keys -> new-file version; keys but no version -> 1."""
    if _document_is_empty(doc):
        return new_file_version
    if "version" not in doc:
        return 1
    version = plain(doc["version"])
    if isinstance(version, bool) or not isinstance(version, int):
        raise ConfigError("%s: 'version' must be an integer, found %s (%s)"
                          % (filename, _type_name(version), doc.item("version").as_string().strip()))
    if version not in SUPPORTED_VERSIONS:
        raise ConfigError("%s: config version %d is not supported (containerd knows 1 to 4)"
                          % (filename, version))
    return version


def cri_table_name(doc, version, filename, warnings):
    """The CRI plugin table to edit. D7: the one the file really uses wins over what version implies,
    but only where containerd reads it at that version; a table it ignores is named in a warning."""
    implied = CRI_TABLE_BY_VERSION[version]
    plugins = _expect_table(doc.get("plugins"), "plugins", filename)
    if not plugins:
        return implied

    def used(name):
        cri = _expect_table(plugins.get(name), _dotted(["plugins", name]), filename)
        ctr = cri and _expect_table(cri.get("containerd"), _dotted(["plugins", name, "containerd"]), filename)
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


def _check_cri_enabled(doc, filename, warnings):
    if _cri_disabled(doc):
        warnings.append(
            "%s: disabled_plugins switches the CRI plugin off; Kubernetes cannot use this containerd "
            "until 'cri' is removed from disabled_plugins" % filename)


# ---------------------------------------------------------------- building the runtime entry

def _base_runtime(runtimes, default_name):
    """nvidia-ctk's base: the default unless it is an nvidia* runtime, else runc, else crun."""
    candidates = []
    if isinstance(default_name, str) and default_name and not default_name.startswith("nvidia"):
        candidates.append(default_name)
    candidates += ["runc", "crun"]
    for name in candidates:
        # A runc we declared for D5 is not a base: copying it would change our entry on the next run.
        if runtimes is not None and _is_table(runtimes.get(name)) and \
                _mark_of(_item(runtimes, name)) != RUNC_NOTE:
            return name
    return None


def _set_option(options, key, value):
    """Set an option and drop keys that differ only in case: containerd 1.x decodes options
    case-insensitively, so `binaryName` next to `BinaryName` makes the winner random."""
    for other in [k for k in options if k != key and k.lower() == key.lower()]:
        del options[other]
    options[key] = value


def _no_base_systemd_cgroup(request):
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
    elif not _is_table(options):
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


def _sync_table(table, wanted):
    """Make tomlkit `table` equal `wanted` key by key, so unchanged keys keep their layout."""
    changed = False
    for key in [k for k in table if k not in wanted]:
        del table[key]
        changed = True
    for key, value in wanted.items():
        if key in table and _is_table(value) and isinstance(table[key], _Table):
            changed = _sync_table(table[key], value) or changed
        elif key not in table or not _same(table[key], value):
            table[key] = _to_item(value)
            changed = True
    return changed


def _to_item(value):
    if _is_table(value):
        table = _new_table()
        for key, sub in value.items():
            table[key] = _to_item(sub)
        return table
    return tomlkit.item(value)


def _new_runtime_table(entry):
    return _to_item(entry)


def _inline(value):
    """A table as one line (an inline table), to record it in a comment."""
    if not _is_table(value):
        return tomlkit.item(value)
    table = tomlkit.inline_table()
    for key, sub in value.items():
        table[key] = _inline(sub)
    return table


# ---------------------------------------------------------------- the edits

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
        return _expect_table(_get_path(self.doc, parts, self.filename), _dotted(parts), self.filename)

    def check_types(self):
        """Every key we read must have the type containerd expects."""
        ctr = self.table(self.ctr_path)
        runtimes = self.table(self.runtimes_path)
        if ctr is not None and "default_runtime_name" in ctr:
            name = plain(ctr["default_runtime_name"])
            if not isinstance(name, str):
                raise ConfigError("%s: %s must be a string, found %s" % (
                    self.filename, _dotted(self.ctr_path + ["default_runtime_name"]), _type_name(name)))
        if runtimes is not None:
            for name, value in runtimes.items():
                where = _dotted(self.runtimes_path + [name])
                _expect_table(value, where, self.filename)
                if "options" in value:
                    _expect_table(value["options"], where + ".options", self.filename)
                    self._check_options(value["options"], where + ".options")
                if "runtime_type" in value and not isinstance(plain(value["runtime_type"]), str):
                    raise ConfigError("%s: %s.runtime_type must be a string" % (self.filename, where))
        cri = self.table(self.cri_path)
        if cri is not None and "enable_cdi" in cri and not isinstance(plain(cri["enable_cdi"]), bool):
            raise ConfigError("%s: %s.enable_cdi must be a boolean" % (self.filename, _dotted(self.cri_path)))
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
                                  % (self.filename, where, key, name, _type_name(options[key])))

    def default_name(self):
        ctr = self.table(self.ctr_path)
        return plain(ctr.get("default_runtime_name")) if ctr is not None else None

    def imports(self):
        imports = plain(self.doc.get("imports", []))
        if not isinstance(imports, list):
            raise ConfigError("%s: 'imports' must be an array, found %s" % (self.filename, _type_name(imports)))
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
            runtimes = _ensure_path(self.doc, self.runtimes_path)
            self._declare_runc_if_dropped(runtimes)
        if name in runtimes:
            self._update_existing_runtime(runtimes, name, entry)
        else:
            table = _new_runtime_table(entry)
            _set_mark(table)  # ours: absent deletes it
            _insert(self.doc, runtimes, name, table)

        ctr = self.table(self.ctr_path)
        if request.set_as_default is True:
            _set_value(self.doc, ctr, "default_runtime_name", name)
        elif request.set_as_default is False and self.default_name() == name:
            if not _revert_value(ctr, "default_runtime_name"):
                del ctr["default_runtime_name"]
        if request.enable_cdi:
            # D2: also on version 1 the key belongs on the plugin table (plugins.cri.enable_cdi).
            _set_value(self.doc, self.table(self.cri_path), "enable_cdi", True)

    def _update_existing_runtime(self, runtimes, name, entry):
        """A runtime declared before us: sync it, recording the original on its header so absent can
        give it back (a header-less table has nowhere to hold the note; absent then keeps our version)."""
        original = plain(runtimes[name])
        table = _item(runtimes, name)
        if not _sync_table(runtimes[name], entry) or _mark_of(table) is not None:
            return
        if isinstance(table, _Table) and not table.is_super_table():
            _set_mark(table, "was " + _inline(original).as_string())

    def _refuse_deprecated_default_runtime(self):
        legacy = self.table(self.ctr_path + ["default_runtime"])
        if legacy is not None and plain(legacy.get("runtime_type", "")):
            raise ConfigError(
                "%s: %s sets runtime_type = %r; containerd 1.x then ignores default_runtime_name, so "
                "set_as_default would have no effect (D6). Remove the deprecated default_runtime table "
                "(or empty its runtime_type) and declare that runtime under containerd.runtimes instead."
                % (self.filename, _dotted(self.ctr_path + ["default_runtime"]),
                   plain(legacy["runtime_type"])))

    def _declare_runc_if_dropped(self, runtimes):
        """D5: containerd 1.x replaces its built-in runtimes map with the file's. When the file had
        none and runc stays the default, runc must be declared or the CRI plugin fails to load."""
        if self.version > 2 or self.request.set_as_default is True:
            return
        if self.default_name() not in (None, "", "runc"):
            return
        runc = {"runtime_type": RUNC_V2}
        systemd_cgroup = _no_base_systemd_cgroup(self.request)
        if systemd_cgroup is not None:
            runc["options"] = {"SystemdCgroup": systemd_cgroup}
        table = _new_runtime_table(runc)
        _set_mark(table, RUNC_NOTE)
        _insert(self.doc, runtimes, "runc", table)

    def absent(self):
        """Undo our marked edits. A file without any of our marks (configured by nvidia-ctk or by hand)
        loses the runtime and the default naming it, as nvidia-ctk's own cleanup does."""
        name = self.request.runtime_name
        edited_by_us = ("# " + MARK) in self.doc.as_string()
        runtimes = self.table(self.runtimes_path)
        if runtimes is not None and name in runtimes:
            note = _mark_of(_item(runtimes, name))
            if note is not None and note.startswith("was "):
                _sync_table(runtimes[name], plain(tomlkit.parse("x = " + note[4:])["x"]))
                _drop_mark(_item(runtimes, name))
            elif note is not None or not edited_by_us:
                del runtimes[name]
        if runtimes is not None and "runc" in runtimes and _mark_of(_item(runtimes, "runc")) is not None:
            del runtimes["runc"]
        ctr = self.table(self.ctr_path)
        if ctr is not None and self.default_name() == name:
            if not _revert_value(ctr, "default_runtime_name") and not edited_by_us:
                del ctr["default_runtime_name"]
        _revert_marked(self.doc, skip_keys=("default_runtime_name",))
        _prune(self.doc)


def _table_parts(value):
    """The tomlkit tables behind a value: one, several for a split table, none for a plain value."""
    if isinstance(value, _Table):
        return [value]
    return list(getattr(value, "_tables", None) or [])


def _revert_marked(table, skip_keys=()):
    """Revert every marked value under table (default_runtime_name is handled by its owner)."""
    for key in list(table.keys()):
        value = table[key]
        if _table_parts(value):
            _revert_marked(value, skip_keys)
        elif key not in skip_keys and _mark_of(_item(table, key)) is not None:
            _revert_value(table, key)


def _prune(table):
    """Drop the empty tables that we created (header-less or marked) and the headers we added."""
    for key in list(table.keys()):
        value = table[key]
        parts = _table_parts(value)
        if not parts:
            continue
        _prune(value)
        if len(value) == 0 and all(p.is_super_table() or _mark_of(p) is not None for p in parts):
            del table[key]
            continue
        for part in parts:
            if _mark_of(part) == HEADER_NOTE and all(_table_parts(v) for v in part.values()):
                _drop_mark(part)
                # tomlkit has no public way to hide a header again; the flag exists from 0.11 to 0.15.
                part._is_super_table = True  # pylint: disable=protected-access


# ---------------------------------------------------------------- drop-in support

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


def _add_import(doc, glob):
    if "imports" in doc:
        _set_value(doc, doc, "imports", plain(doc["imports"]) + [glob])
        return
    item = tomlkit.item([glob])
    _set_mark(item)
    _insert_top_level(doc, "imports", item)


def _insert_top_level(doc, key, item):
    """Insert a top-level key right after `version` (or first). tomlkit's append would add a blank
    line before the next table that removing the key later leaves behind."""
    keys = list(doc.keys())
    index = keys.index("version") + 1 if "version" in doc else 0
    if index >= len(keys):
        doc[key] = item
        return
    body_index = [i for i, (k, _v) in enumerate(doc.body) if k is not None and k.key == keys[index]][0]
    # tomlkit has no public insert-at; _insert_at exists unchanged from 0.11 to 0.15.
    doc._insert_at(body_index, key, item)  # pylint: disable=protected-access


def _drop_in_document(config_doc, version, cri, config_filename):
    """The drop-in starts as version + a copy of the config's whole CRI table: containerd 1.x
    replaces an imported plugin table by key instead of merging it."""
    doc = tomlkit.document()
    doc["version"] = version
    source = _get_path(config_doc, ["plugins", cri], config_filename)
    plugins = tomlkit.table(is_super_table=True)
    plugins[cri] = _to_item(copy.deepcopy(plain(source))) if source is not None else _new_table()
    doc["plugins"] = plugins
    return doc


DROP_IN_HEADER = ("# Written by gpuready.nvidia (containerd_nvidia_runtime) and rewritten on every run.\n"
                  "# %s imports it through %s.\n")


def _check_drop_in(drop_in_path, drop_in_text, config_path, version):
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


# ---------------------------------------------------------------- entry point

LAYOUT_REFUSAL = ("%s: refusing to write: tomlkit cannot lay out this edit of the file's table order faithfully "
                  "(sub-tables split across distant headers); nothing was written. Group each table's headers "
                  "together and run again.")


def _dumps(doc, filename, original=None):
    """Render, then prove that the text reads back as the same data: tomlkit cannot always lay out
    an edit of a file whose tables are split in unusual orders, and we write nothing then. Text equal
    to the original (a no-op run) is what was parsed, so it needs no second parse."""
    text = tomlkit.dumps(doc)
    if text == original:
        return text
    try:
        same = _same(tomlkit.parse(text), plain(doc))
    except Exception:  # any parse failure means the same: not faithful
        same = False
    if not same:
        raise ConfigError(LAYOUT_REFUSAL % filename)
    return text


def _created_by_us(text):
    return text is not None and ("# %s: %s" % (MARK, NEW_FILE_NOTE)) in text


def _finish(outcome, editor):
    outcome.config_version = editor.version
    outcome.runtime_table = _dotted(editor.runtimes_path + [editor.request.runtime_name])
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
    except _TOMLKitError:
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
    is_empty = _document_is_empty(doc)
    version = detect_version(doc, config_path, request.new_file_version)
    cri = cri_table_name(doc, version, config_path, outcome.warnings)
    _check_cri_enabled(doc, config_path, outcome.warnings)
    editor = _Editor(doc, config_path, request, version, cri, outcome)
    editor.check_types()
    if drop_in_path is not None:
        _check_drop_in(drop_in_path, drop_in_text, config_path, version)

    if request.state == "absent":
        # The runtime must be gone from config.toml too, even in drop-in mode.
        editor.absent()
        _finish(outcome, editor)
        if config_text is None or (_document_is_empty(doc) and _created_by_us(config_text)):
            outcome.config_text = None
        else:
            outcome.config_text = _dumps(doc, config_path, config_text)
        return outcome

    if is_empty:
        # A file we create says so in its version line, so that absent removes it again.
        _set_value(doc, doc, "version", version, note=NEW_FILE_NOTE if config_text is None else "")
    if drop_in_path is None:
        editor.present()
        _finish(outcome, editor)
        outcome.config_text = _dumps(doc, config_path, config_text)
        return outcome

    if not imports_cover(editor.imports(), drop_in_path, config_path):
        _add_import(doc, import_glob(drop_in_path))
    if editor.table(editor.runtimes_path + [request.runtime_name]) is not None:
        outcome.warnings.append(
            "%s still declares %s; containerd 2.x merges it under the drop-in's entry"
            % (config_path, _dotted(editor.runtimes_path + [request.runtime_name])))
    outcome.config_text = _dumps(doc, config_path, config_text)
    drop_editor = _Editor(_drop_in_document(doc, version, cri, config_path), drop_in_path, request,
                          version, cri, outcome)
    drop_editor.present()
    _finish(outcome, drop_editor)
    outcome.drop_in_text = (DROP_IN_HEADER % (config_path, import_glob(drop_in_path))
                            + _dumps(drop_editor.doc, drop_in_path))
    return outcome


def semantic_problems(text, filename, containerd_major=None):
    """Checks that `containerd config dump` does not make (test-environment.md section 2)."""
    problems = []
    doc = parse(text, filename)
    if _document_is_empty(doc):
        return problems
    version = detect_version(doc, filename, 2)
    if containerd_major is not None and containerd_major < 2 and version >= 3:
        problems.append("%s is a version %d config, which containerd %d.x silently ignores"
                        % (filename, version, containerd_major))
    cri = cri_table_name(doc, version, filename, [])
    ctr = _get_path(doc, ["plugins", cri, "containerd"], filename)
    runtimes = ctr.get("runtimes") if ctr else None
    default = plain(ctr.get("default_runtime_name")) if ctr else None
    declared = set(runtimes.keys()) if runtimes else set()
    if default and default not in declared and (version <= 2 or default != "runc"):
        problems.append("%s: default_runtime_name = %r has no entry under %s"
                        % (filename, default, _dotted(["plugins", cri, "containerd", "runtimes"])))
    if version <= 2 and declared and not default and "runc" not in declared \
            and (containerd_major is None or containerd_major < 2):
        problems.append("%s: runtimes are declared but runc is not, and runc is the default: containerd "
                        "1.x drops its built-in runc and the CRI plugin fails to load (D5)" % filename)
    return problems


def covering_import(config_text, drop_in_path, config_path):
    """The `imports` entry (as written) that covers the drop-in, for validating the pair elsewhere."""
    imports = plain(parse(config_text, config_path).get("imports", []))
    for pattern in imports:
        if imports_cover([pattern], drop_in_path, config_path):
            return pattern
    return None


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


# The options of containerd_nvidia_runtime, shared by its action plugin and its documentation stub.
ARGUMENT_SPEC = dict(
    path=dict(type="path"),
    flavor=dict(type="str", default="containerd", choices=["containerd", "k3s", "rke2"]),
    flavor_config_dir=dict(type="path"),
    containerd_binary=dict(type="str", default="containerd"),
    runtime_name=dict(type="str", default="nvidia"),
    runtime_path=dict(type="path", default="/usr/bin/nvidia-container-runtime"),
    set_as_default=dict(type="bool"),
    enable_cdi=dict(type="bool", default=False),
    systemd_cgroup=dict(type="str", default="auto", choices=["auto", "true", "false"]),
    kubelet_config=dict(type="path", default="/var/lib/kubelet/config.yaml"),
    drop_in=dict(type="path"),
    config_version=dict(type="str", default="auto", choices=["auto", "1", "2", "3", "4"]),
    state=dict(type="str", default="present", choices=["present", "absent"]),
    backup=dict(type="bool", default=False),
    validate=dict(type="bool", default=True),
)
