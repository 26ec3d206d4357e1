# -*- coding: utf-8 -*-
"""containerd_toml: parsing as containerd reads TOML, the header-indent repair, TOML-typed comparison
and paths, and the rendering that must read back as the same data."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest
import tomlkit

from ansible_collections.gpuready.nvidia.plugins.module_utils import containerd_config as engine
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_toml import (
    LAYOUT_REFUSAL, ConfigError, dotted, dumps_checked, get_path, parse, plain, same_data)

CONFIG = "/etc/containerd/config.toml"


def test_toml_1_1_that_containerd_cannot_read_is_refused():
    # tomlkit accepts the \e escape of TOML 1.1; containerd 1.6 and 1.7 refuse the file ("invalid escape sequence").
    text = 'version = 2\n[plugins."io\\erd.grpc.v1.cri"]\n'
    with pytest.raises(ConfigError, match=r"invalid TOML 1.0, which containerd 1.x reads: Unescaped"):
        parse(text, CONFIG)
    with pytest.raises(ConfigError, match=r"invalid TOML 1.0, which containerd 1.x reads: Unescaped"):
        engine.edit(text, engine.Request(set_as_default=True), CONFIG)


def test_invalid_toml_names_the_file_line_and_column():
    with pytest.raises(ConfigError, match=r"^/etc/containerd/config.toml: invalid TOML at line 2, column \d+: "):
        parse("version = 2\n[plugins\n", CONFIG)


def test_headers_below_header_less_tables_keep_their_indentation():
    # tomlkit's parser adds the first header's indentation to each later sibling below the header-less
    # a.c.d, so every parse-and-render of this file would indent [a.c.d.n] one step deeper.
    text = ("[a]\n  [a.b]\n    x = 1\n  [a.c.d.r] # m\n    y = 2\n\n  [a.c.d.n]\n    y = 3\n"
            "    [a.c.d.n.o]\n      z = 1\n  [a.e]\n")
    assert tomlkit.dumps(parse(text, CONFIG)) == text


@pytest.mark.parametrize("a, b, same", [(1, 1, True), (True, 1, False), (False, 0, False), ("1", 1, False),
                                        ({"a": [1, True]}, {"a": [1, True]}, True),
                                        ({"a": [1, True]}, {"a": [1, 1]}, False), ([1], [1, 2], False)])
def test_same_data_tells_booleans_from_integers(a, b, same):
    assert same_data(tomlkit.item(a), b) is same


def test_dotted_quotes_parts_that_are_not_bare_keys():
    assert dotted(["plugins", "io.containerd.grpc.v1.cri", "containerd"]) == 'plugins."io.containerd.grpc.v1.cri".containerd'


def test_get_path_stops_at_a_missing_part_and_refuses_a_value_on_the_way():
    doc = parse('version = 2\n[plugins]\ncri = "x"\n', CONFIG)
    assert get_path(doc, ["plugins", "other", "containerd"], CONFIG) is None
    assert plain(get_path(doc, ["plugins"], CONFIG)) == {"cri": "x"}
    with pytest.raises(ConfigError, match=r"plugins\.cri must be a table, found a string"):
        get_path(doc, ["plugins", "cri", "containerd"], CONFIG)


def test_dumps_checked_skips_the_read_back_of_a_no_op_and_refuses_an_unfaithful_render(monkeypatch):
    text = 'version = 2\n[plugins]\n'
    doc = parse(text, CONFIG)
    assert dumps_checked(doc, CONFIG, text) == text
    doc["x"] = 1
    monkeypatch.setattr(tomlkit, "parse", lambda _text: tomlkit.document())  # reads back as other data
    with pytest.raises(ConfigError) as error:
        dumps_checked(doc, CONFIG, text)
    assert str(error.value) == LAYOUT_REFUSAL % CONFIG
