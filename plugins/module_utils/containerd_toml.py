# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""containerd config TOML, read and changed without moving a byte we do not change (tomlkit).

Plain Python, no Ansible. Parsing (tomlkit, then tomllib as containerd 1.x's strict TOML 1.0 reader),
the repair of header indentation tomlkit's parser loses, TOML-typed comparison and paths, inserting
keys and tables laid out like their neighbours, and rendering that proves the text reads back as the
same data. Every containerd_* module_util builds on this one; ConfigError is their common refusal.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

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
    tomlkit = None  # the other containerd_* module_utils import it from here; callers check HAS_TOMLKIT first

    class _TOMLKitError(Exception):
        pass


# What tomlkit raises when it fails to carry out an edit; containerd_config refuses the edit then.
TOMLKitError = _TOMLKitError


class ConfigError(Exception):
    """Input we refuse. Nothing may be written when this is raised."""


# ---------------------------------------------------------------- parsing

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


def same_data(a, b):
    """TOML equality that tells booleans from integers."""
    a, b = plain(a), plain(b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_data(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_data(x, y) for x, y in zip(a, b))
    return _kind(a) is _kind(b) and a == b


def is_table(value):
    return isinstance(value, dict)


def is_tomlkit_table(value):
    """A tomlkit Table: not a document, an inline table or the proxy of a table split over several headers."""
    return isinstance(value, _Table)


def expect_table(value, where, filename):
    if value is not None and not is_table(value):
        raise ConfigError("%s: %s must be a table, found %s" % (filename, where, type_name(value)))
    return value


def type_name(value):
    value = plain(value)
    for typ, name in ((bool, "a boolean"), (int, "an integer"), (float, "a float"), (str, "a string"),
                      (list, "an array"), (dict, "a table")):
        if isinstance(value, typ):
            return name
    return type(value).__name__


def dotted(parts):
    return ".".join(p if re.match(r"^[A-Za-z0-9_-]+$", p) else '"%s"' % p for p in parts)


def get_path(doc, parts, filename):
    """Walk tables; None when a part is missing; ConfigError when a part is not a table."""
    node = doc
    for i, part in enumerate(parts):
        expect_table(node, dotted(parts[:i]) or "the document", filename)
        if part not in node:
            return None
        node = node[part]
    return node


# ---------------------------------------------------------------- tables and items, keeping the layout

def new_table():
    return tomlkit.table()


def concrete_table(table, key):
    """tomlkit hands out a proxy for a table split over several headers (a sub-table written
    before its parent); edits go to the part that holds the key, else to one with a header."""
    parts = getattr(table, "_tables", None)  # only OutOfOrderTableProxy has it
    if parts is None:
        return table
    holding = [t for t in parts if key in t]
    headed = [t for t in parts if not t.is_super_table()]
    return (holding or headed or parts)[0]


def item_of(table, key):
    """table.item(key) for a document or a table (tomlkit < 0.13.1 Tables have no .item)."""
    return (table.value if isinstance(table, _Table) else table).item(key)


def find_item(table, key):
    """The tomlkit item (with its comment) for key; table[key] unwraps booleans."""
    return item_of(concrete_table(table, key), key)


def _containers(container):
    """A tomlkit container and every table container below it."""
    yield container
    for _key, item in container.body:
        if isinstance(item, _Table):
            yield from _containers(item.value)
        elif isinstance(item, _AoT):
            for table in item.body:
                yield from _containers(table.value)


def insert_keeping_layout(doc, parent, key, item):
    """parent[key] = item, leaving every other line of the file as it was.

    tomlkit adds blank lines around an inserted item (in its neighbours' trivia, or as whitespace
    items in their bodies); removing the item later would leave them behind. We undo those and let
    our item carry its own separation, so that absent gives back the original bytes."""
    containers = list(_containers(doc))
    bodies = [(c, set(id(entry[1]) for entry in c.body)) for c in containers]
    trivia = [(i, i.trivia.indent, i.trivia.trail) for c in containers for _k, i in c.body
              if isinstance(i, _Item) and not isinstance(i, (_Whitespace, _Null))]
    parent = concrete_table(parent, key)
    parent[key] = item
    for container, before in bodies:
        for index, (entry_key, entry) in enumerate(container.body):
            if isinstance(entry, _Whitespace) and id(entry) not in before:
                container.body[index] = (entry_key, _Null())  # Null keeps tomlkit's indexes valid
    for other, indent, trail in trivia:
        other.trivia.indent, other.trivia.trail = indent, trail
    inserted = item_of(parent, key)
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
                last = item_of(last, [k for k in last if isinstance(last[k], _Table)][-1])
            last.add(tomlkit.nl())
        return
    values = [find_item(parent, k) for k in parent if k != key and not table_parts(parent[k])]
    if values:
        inserted.trivia.indent = values[0].trivia.indent


def _headed(table):
    """table itself, or for a header-less one the first table below it that has a header (or None)."""
    if not table.is_super_table():
        return table
    return next(_header_tables(table.value), None)


def _headed_part(value):
    """The first table with a header behind value (a table, or the parts of a split one), or None."""
    return next((t for t in (_headed(part) for part in table_parts(value)) if t is not None), None)


def _layout_model(doc, parent, key):
    """The table whose layout a new table in parent copies: a sibling, else the nearest header table
    below an ancestor (in Debian's stock config, a runtime added under the header-less
    `containerd.runtimes` is laid out like `[plugins."io.containerd.grpc.v1.cri".cni]`)."""
    skip = find_item(parent, key)
    for table in [concrete_table(parent, key)] + list(reversed(_ancestors(doc, concrete_table(parent, key)) or [])):
        for name in table:
            child = find_item(table, name)
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
    # A sub-table of model may be split over several headers (a proxy of its parts, not a Table)
    model_values = [item_of(model, k) for k in model if not table_parts(model[k])]
    model_tables = [_headed_part(model[k]) for k in model if table_parts(model[k])]
    model_tables = [t for t in model_tables if t is not None]
    key_indent = model_values[0].trivia.indent.lstrip("\n") if model_values else header
    for k in table:
        item = item_of(table, k)
        if isinstance(item, _Table):
            alike = _headed_part(model[k]) if k in model else None
            if alike is not None or model_tables:
                _copy_indent(item, alike or model_tables[0])
            else:  # nothing alike to copy: nest one level like the keys
                item.trivia.indent = key_indent
                for sub in item:
                    item_of(item, sub).trivia.indent = key_indent + key_indent[len(header):]
        else:
            item.trivia.indent = key_indent


def ensure_path(doc, parts):
    """Create the missing tables along parts, header-less until a key lands in one."""
    node = doc
    for part in parts:
        if part not in node:
            insert_keeping_layout(doc, node, part, tomlkit.table(is_super_table=True))
        node = node[part]
    return node


def document_is_empty(doc):
    return len(doc) == 0


def sync_table(table, wanted):
    """Make tomlkit `table` equal `wanted` key by key, so unchanged keys keep their layout."""
    changed = False
    for key in [k for k in table if k not in wanted]:
        del table[key]
        changed = True
    for key, value in wanted.items():
        if key in table and is_table(value) and isinstance(table[key], _Table):
            changed = sync_table(table[key], value) or changed
        elif key not in table or not same_data(table[key], value):
            table[key] = to_item(value)
            changed = True
    return changed


def to_item(value):
    if is_table(value):
        table = new_table()
        for key, sub in value.items():
            table[key] = to_item(sub)
        return table
    return tomlkit.item(value)


def to_inline(value):
    """A table as one line (an inline table), to record it in a comment."""
    if not is_table(value):
        return tomlkit.item(value)
    table = tomlkit.inline_table()
    for key, sub in value.items():
        table[key] = to_inline(sub)
    return table


def table_parts(value):
    """The tomlkit tables behind a value: one, several for a split table, none for a plain value."""
    if isinstance(value, _Table):
        return [value]
    return list(getattr(value, "_tables", None) or [])


def insert_top_level(doc, key, item):
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


# ---------------------------------------------------------------- rendering

LAYOUT_REFUSAL = ("%s: refusing to write: tomlkit cannot lay out this edit of the file's table order faithfully "
                  "(sub-tables split across distant headers); nothing was written. Group each table's headers "
                  "together and run again.")


def dumps_checked(doc, filename, original=None):
    """Render, then prove that the text reads back as the same data: tomlkit cannot always lay out
    an edit of a file whose tables are split in unusual orders, and we write nothing then. Text equal
    to the original (a no-op run) is what was parsed, so it needs no second parse."""
    text = tomlkit.dumps(doc)
    if text == original:
        return text
    try:
        same = same_data(tomlkit.parse(text), plain(doc))
    except Exception:  # any parse failure means the same: not faithful
        same = False
    if not same:
        raise ConfigError(LAYOUT_REFUSAL % filename)
    return text
