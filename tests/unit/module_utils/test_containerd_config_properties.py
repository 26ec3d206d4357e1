# -*- coding: utf-8 -*-
"""Property tests: random valid containerd configs with extra tables, keys, comments and layouts."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import tomllib

import pytest
import tomlkit
import tomlkit.exceptions
from hypothesis import HealthCheck, assume, event, example, given, settings, strategies as st

from ansible_collections.gpuready.nvidia.plugins.module_utils import containerd_config as engine
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_toml import ConfigError
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_versions import CRI_TABLES

CONFIG = "/etc/containerd/config.toml"
DROP_IN = "/etc/containerd/conf.d/99-nvidia.toml"
CRI_BY_VERSION = {None: "cri", 1: "cri", 2: '"io.containerd.grpc.v1.cri"', 3: "'io.containerd.cri.v1.runtime'"}

names = st.from_regex(r"\A[a-z][a-z0-9_]{0,7}\Z").filter(lambda n: n not in ("version", "imports", "plugins"))
scalars = st.one_of(st.integers(-5, 5000), st.booleans(),
                    st.text("abcxyz/._-:0123456789 ", max_size=12).map(lambda s: '"%s"' % s)).map(
    lambda v: str(v).lower() if isinstance(v, bool) else str(v))
comments = st.one_of(st.just(""), st.text("abc XYZ=[]#'\"", max_size=15).map(lambda s: " # " + s))
indents = st.sampled_from(["", "  ", "    "])


@st.composite
def key_lines(draw, reserved=()):
    """Key lines without their indentation: the layout adds it."""
    keys = draw(st.lists(names.filter(lambda n: n not in reserved), max_size=3, unique=True))
    return ["%s = %s%s" % (k, draw(scalars), draw(comments)) for k in keys]


@st.composite
def configs(draw):
    """A config in one of two layouts: flat (each table's keys at one random indentation, tables in any
    order) or nested like Debian's stock file (parents first, each header two spaces deeper than its
    parent's and its keys two deeper than the header), where parent tables may be bare headers."""
    version = draw(st.sampled_from([None, 1, 2, 3]))
    cri = CRI_BY_VERSION[version]
    nested = draw(st.booleans())
    head = "" if version is None else "version = %d%s\n" % (version, draw(comments))
    head += "".join(line + "\n" for line in draw(key_lines(reserved=("enable_cdi",))))
    if version is None and not head:
        head = "root = \"/var/lib/containerd\"\n"
    sections = []  # (table name, key lines)
    if nested and draw(st.booleans()):
        sections.append(("plugins", []))
    if draw(st.booleans()):
        sections.append(("plugins.%s" % cri, draw(key_lines(reserved=("containerd", "enable_cdi")))
                         + (["enable_cdi = false"] if draw(st.booleans()) else [])))
    if draw(st.booleans()):
        default = ['default_runtime_name = "runc"%s' % draw(comments)] if draw(st.booleans()) else []
        sections.append(("plugins.%s.containerd" % cri, default + draw(key_lines(
            reserved=("runtimes", "default_runtime_name", "default_runtime")))))
    for runtime in draw(st.lists(st.sampled_from(["runc", "crun", "kata"]), max_size=2, unique=True)):
        sections.append(("plugins.%s.containerd.runtimes.%s" % (cri, runtime),
                         ['runtime_type = "io.containerd.runc.v2"'] + draw(key_lines(reserved=("options",)))))
        if draw(st.booleans()):
            sections.append(("plugins.%s.containerd.runtimes.%s.options" % (cri, runtime), draw(key_lines(
                reserved=("BinaryName", "binaryname", "SystemdCgroup", "systemdcgroup", "Runtime", "runtime")))))
    for extra in draw(st.lists(st.sampled_from(["grpc", "metrics", 'plugins."io.containerd.internal.v1.opt"',
                                                "debug"]), max_size=3, unique=True)):
        sections.append((extra, draw(key_lines())))
    order = sections if nested else draw(st.permutations(sections))  # nested: parents come first
    text = head
    for name, lines in order:
        if nested:
            depth = _depth(name)
            header, keys = "  " * (depth - 1), "  " * depth
        else:
            header, keys = "", draw(indents)
        text += draw(st.sampled_from(["", "\n", "# a comment line\n", "\n# section\n"]))
        text += "%s[%s]\n%s" % (header, name, "".join(keys + line + "\n" for line in lines))
    if draw(st.booleans()):
        text += "# trailing comment\n"
    return text


def _depth(name):
    """How many tables deep a header's name is (dots inside quotes do not count)."""
    doc, depth = tomllib.loads("[%s]" % name), 0
    while doc:
        doc, depth = next(iter(doc.values())), depth + 1
    return depth


requests = st.builds(engine.Request, set_as_default=st.sampled_from([None, True, False]),
                     enable_cdi=st.booleans(), systemd_cgroup=st.sampled_from(["auto", True, False]),
                     kubelet_systemd_cgroup=st.sampled_from([None, True, False]))


def _strip_ours(doc):
    """Plain data minus what the engine owns: our runtime, a runc it declared, default, cdi, imports."""
    plugins = doc.get("plugins", {})
    for cri in CRI_TABLES:
        table = plugins.get(cri)
        if not isinstance(table, dict):
            continue
        table.pop("enable_cdi", None)
        ctr = table.get("containerd", {})
        ctr.pop("default_runtime_name", None)
        runtimes = ctr.get("runtimes", {})
        runtimes.pop("nvidia", None)
        for parent, key in ((ctr, "runtimes"), (table, "containerd"), (plugins, cri)):
            if parent.get(key) == {}:
                del parent[key]
    if doc.get("plugins") == {}:
        del doc["plugins"]
    doc.pop("imports", None)
    doc.pop("version", None)
    return doc


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(text=configs(), request=requests, drop_in=st.sampled_from([None, DROP_IN]))
def test_random_configs(text, request, drop_in):
    before = tomllib.loads(text)  # the generator only makes valid TOML
    assume(not (drop_in and before.get("version", 1) == 1))  # D3: refused, covered by the cases
    try:
        tomlkit.parse(text)
    except tomlkit.exceptions.ParseError:
        # Valid TOML that tomlkit cannot read (some orders of split tables): a clear refusal.
        with pytest.raises(ConfigError, match="invalid TOML at line"):
            engine.edit(text, request, CONFIG, drop_in)
        return
    try:
        present = engine.edit(text, request, CONFIG, drop_in)
    except ConfigError as exc:
        # The one refusal a valid file may get: tomlkit cannot re-lay-out some split-table orders.
        assert "tomlkit cannot lay out this edit" in str(exc), str(exc)
        event("refused: split tables")
        return
    after = tomllib.loads(present.config_text)
    runtimes_before = _runtimes(before)
    declared_runc = not runtimes_before and "runc" in _runtimes(after) and drop_in is None
    stripped = _strip_ours(after)
    if declared_runc:  # D5
        _drop_declared_runc(stripped)
    assert stripped == _strip_ours(tomllib.loads(text))
    if drop_in:
        assert tomllib.loads(present.drop_in_text)["version"] == before["version"]

    again = engine.edit(present.config_text, request, CONFIG, drop_in, present.drop_in_text)
    assert (again.config_text, again.drop_in_text) == (present.config_text, present.drop_in_text)

    request.state = "absent"
    absent = engine.edit(present.config_text, request, CONFIG, drop_in, present.drop_in_text)
    assert absent.config_text == text
    assert absent.drop_in_text is None


# Characters that matter to TOML, plus a BOM, a NUL, non-ASCII and a bare carriage return.
NOISE = st.text('[]{}="\'.,#\n\\ \t\ufeff\x00\r\u00e9abc123', min_size=1, max_size=6)


@st.composite
def damaged_configs(draw):
    """A valid config with a few spans deleted, replaced or inserted: mostly invalid, sometimes not."""
    text = draw(configs())
    for dummy in range(draw(st.integers(1, 3))):
        start = draw(st.integers(0, len(text)))
        end = draw(st.integers(start, min(len(text), start + 8)))
        text = text[:start] + draw(st.one_of(st.just(""), NOISE)) + text[end:]
    return text


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(text=damaged_configs(), request=requests, drop_in=st.sampled_from([None, DROP_IN]))
# Found by this test (tomlkit 0.15.1): version gone, runc's table before its parent's header, so the parent
# that a runc we declare copies its layout from is split over two headers; that raised AttributeError.
@example(text='ersion = 2\n[plugins."io.containerd.grpc.v1.cri"]\n'
              '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\nruntime_type = "io.containerd.runc.v2"\n'
              '[plugins."io.containerd.grpc.v1.cri".containerd]\n',
         request=engine.Request(set_as_default=None, enable_cdi=False, systemd_cgroup='auto', kubelet_systemd_cgroup=None),
         drop_in=None)
def test_damaged_configs_are_refused_clearly_or_edited_validly(text, request, drop_in):
    """Whatever the input, the engine answers a ConfigError (which the module reports) or a file
    that TOML readers accept and that a second run leaves alone; never another exception."""
    try:
        outcome = engine.edit(text, request, CONFIG, drop_in)
    except ConfigError as exc:
        assert str(exc), "a refusal must say why"
        event("refused")
        return
    event("edited")
    after = tomllib.loads(outcome.config_text)
    if outcome.drop_in_text is not None:
        tomllib.loads(outcome.drop_in_text)
    runtimes = _runtimes(tomllib.loads(outcome.drop_in_text) if drop_in else after)
    assert "nvidia" in runtimes
    again = engine.edit(outcome.config_text, request, CONFIG, drop_in, outcome.drop_in_text)
    assert (again.config_text, again.drop_in_text) == (outcome.config_text, outcome.drop_in_text)


def _runtimes(doc):
    for cri in CRI_TABLES:
        runtimes = doc.get("plugins", {}).get(cri, {}).get("containerd", {}).get("runtimes")
        if runtimes:
            return runtimes
    return {}


def _drop_declared_runc(doc):
    for cri in CRI_TABLES:
        ctr = doc.get("plugins", {}).get(cri, {}).get("containerd", {})
        if "runc" in ctr.get("runtimes", {}):
            del ctr["runtimes"]["runc"]
            if not ctr["runtimes"]:
                del ctr["runtimes"]
            if not ctr:
                del doc["plugins"][cri]["containerd"]
            if not doc["plugins"][cri]:
                del doc["plugins"][cri]
            if not doc["plugins"]:
                del doc["plugins"]
