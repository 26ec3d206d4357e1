# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ownership marks: how the containerd config engine records in the file what it changed, and undoes it.

Plain Python, no Ansible. Every key or table the engine adds or changes outside the runtime entry
carries a trailing comment starting with ``gpuready.nvidia`` (``: was <old value>`` when it replaced
one). ``state=absent`` reverts exactly those, so present-then-absent gives back the original bytes,
and a human reading the file sees who changed what.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_toml import (
    concrete_table, find_item, insert_keeping_layout, is_tomlkit_table, item_of, plain, same_data, table_parts, tomlkit)

MARK = "gpuready.nvidia"
MARK_SEPARATOR = "  "  # between an item's own comment and our mark
HEADER_NOTE = "header"
RUNC_NOTE = "containerd 1.x drops its built-in runc once runtimes are declared"
NEW_FILE_NOTE = "new file"


def mark_of(item):
    """The gpuready.nvidia note on an item, '' for a bare mark, None when unmarked."""
    comment = getattr(getattr(item, "trivia", None), "comment", "") or ""
    idx = comment.find("# " + MARK)
    if idx < 0:
        return None
    note = comment[idx + 2 + len(MARK):]
    return note[2:] if note.startswith(": ") else ""


def set_mark(item, note=""):
    """Add our mark after any comment the item already has (kept, to be restored by absent)."""
    mark = "# " + MARK + (": " + note if note else "")
    trivia = item.trivia
    if trivia.comment:
        trivia.comment = trivia.comment + MARK_SEPARATOR + mark
    else:
        trivia.comment_ws = trivia.comment_ws or " "
        trivia.comment = mark


def drop_mark(item):
    """Undo set_mark exactly, keeping the item's own comment byte for byte."""
    trivia = item.trivia
    idx = trivia.comment.find("# " + MARK)
    if idx < 0:
        return
    if idx == 0:
        trivia.comment, trivia.comment_ws = "", ""
    else:
        trivia.comment = trivia.comment[:idx - len(MARK_SEPARATOR)]


def set_value(doc, table, key, value, note=""):
    """Set table[key] = value and mark it (recording the old value) so that absent can undo it."""
    table = concrete_table(table, key)
    if key not in table:
        if is_tomlkit_table(table) and table.is_super_table():
            # The table gets a header line for our key; absent takes the header away again.
            set_mark(table, HEADER_NOTE)
        item = tomlkit.item(value)
        set_mark(item, note)
        insert_keeping_layout(doc, table, key, item)
        return True
    old = item_of(table, key)
    if same_data(old, value):
        return False
    note = mark_of(old)
    if note is None:
        old_text = old.as_string().strip()
        if "\n" in old_text:  # a multi-line array does not fit in a comment: record it inline
            old_text = tomlkit.item(plain(old)).as_string()
        note = "was " + old_text
    drop_mark(old)  # the first change already recorded the original value
    comment, comment_ws = old.trivia.comment, old.trivia.comment_ws
    table[key] = tomlkit.item(value)
    new = item_of(table, key)
    new.trivia.comment, new.trivia.comment_ws = comment, comment_ws
    set_mark(new, note)
    return True


def revert_value(table, key):
    """Undo set_value: restore the recorded old value, or delete a key we added."""
    table = concrete_table(table, key)
    item = item_of(table, key)
    note = mark_of(item)
    if note is None:
        return False
    if note.startswith("was "):
        old = tomlkit.parse("x = " + note[4:])
        restored = item_of(old, "x")
        restored.trivia.comment_ws, restored.trivia.comment = item.trivia.comment_ws, item.trivia.comment
        table[key] = restored
        drop_mark(item_of(table, key))
    else:
        del table[key]
    return True


def revert_marked(table, skip_keys=()):
    """Revert every marked value under table (default_runtime_name is handled by its owner)."""
    for key in list(table.keys()):
        value = table[key]
        if table_parts(value):
            revert_marked(value, skip_keys)
        elif key not in skip_keys and mark_of(find_item(table, key)) is not None:
            revert_value(table, key)


def prune(table):
    """Drop the empty tables that we created (header-less or marked) and the headers we added."""
    for key in list(table.keys()):
        value = table[key]
        parts = table_parts(value)
        if not parts:
            continue
        prune(value)
        if len(value) == 0 and all(p.is_super_table() or mark_of(p) is not None for p in parts):
            del table[key]
            continue
        for part in parts:
            if mark_of(part) == HEADER_NOTE and all(table_parts(v) for v in part.values()):
                drop_mark(part)
                # tomlkit has no public way to hide a header again; the flag exists from 0.11 to 0.15.
                part._is_super_table = True  # pylint: disable=protected-access


def created_by_us(text):
    return text is not None and ("# %s: %s" % (MARK, NEW_FILE_NOTE)) in text
