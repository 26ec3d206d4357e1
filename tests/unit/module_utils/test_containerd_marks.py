# -*- coding: utf-8 -*-
"""containerd_marks: the gpuready.nvidia comments that record what an edit changed, and their undoing."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import tomlkit

from ansible_collections.gpuready.nvidia.plugins.module_utils import containerd_config as engine
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_marks import (
    HEADER_NOTE, created_by_us, drop_mark, mark_of, prune, revert_value, set_mark, set_value)
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_toml import item_of, parse

CONFIG = "/etc/containerd/config.toml"


def test_marks_record_the_old_default_and_absent_restores_it():
    before = ('version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
              '  default_runtime_name = "runc"  # keep\n'
              '  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
              '    runtime_type = "io.containerd.runc.v2"\n')
    request = engine.Request(set_as_default=True, enable_cdi=True)
    present = engine.edit(before, request, CONFIG)
    assert 'default_runtime_name = "nvidia"  # keep  # gpuready.nvidia: was "runc"' in present.config_text
    assert "enable_cdi = true # gpuready.nvidia" in present.config_text
    request.state = "absent"
    assert engine.edit(present.config_text, request, CONFIG).config_text == before


def test_a_mark_follows_the_items_own_comment_and_drops_off_exactly():
    doc = parse("a = 1 # mine\nb = 2\n", CONFIG)
    assert mark_of(item_of(doc, "a")) is None
    set_mark(item_of(doc, "a"), "was 0")
    set_mark(item_of(doc, "b"))
    assert doc.as_string() == "a = 1 # mine  # gpuready.nvidia: was 0\nb = 2 # gpuready.nvidia\n"
    assert (mark_of(item_of(doc, "a")), mark_of(item_of(doc, "b"))) == ("was 0", "")
    drop_mark(item_of(doc, "a"))
    drop_mark(item_of(doc, "b"))
    assert doc.as_string() == "a = 1 # mine\nb = 2\n"


def test_set_value_records_the_old_value_once_and_revert_value_restores_it():
    text = "[t]\nx = [\n  1,\n  2,\n] # keep\n"
    doc = parse(text, CONFIG)
    assert set_value(doc, doc["t"], "x", [3]) is True
    assert set_value(doc, doc["t"], "x", [4]) is True  # the first change already recorded the original
    assert set_value(doc, doc["t"], "x", [4]) is False
    assert "x = [4] # keep  # gpuready.nvidia: was [1, 2]\n" in doc.as_string()
    assert revert_value(doc["t"], "x") is True
    assert tomlkit.parse(doc.as_string())["t"]["x"] == [1, 2]
    assert revert_value(doc["t"], "x") is False  # unmarked: not ours to revert


def test_a_key_added_to_a_header_less_table_gives_it_a_header_that_prune_takes_away():
    text = "[a.b]\nx = 1\n"
    doc = parse(text, CONFIG)
    set_value(doc, doc["a"], "y", 2)
    assert mark_of(doc["a"]) == HEADER_NOTE
    assert revert_value(doc["a"], "y") is True
    prune(doc)
    assert doc.as_string() == text


def test_created_by_us():
    assert created_by_us("version = 2 # gpuready.nvidia: new file\n")
    assert not created_by_us("version = 2 # gpuready.nvidia\n")
    assert not created_by_us(None)
