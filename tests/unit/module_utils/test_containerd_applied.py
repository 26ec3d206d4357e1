# -*- coding: utf-8 -*-
"""containerd_applied: the record matches only the exact edit on the exact files it was made for."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import json

import pytest

from ansible_collections.gpuready.nvidia.plugins.module_utils import containerd_applied as applied

CONFIG = "/etc/containerd/config.toml"
PARAMS = {"path": CONFIG, "runtime_name": "nvidia", "set_as_default": True, "enable_cdi": False,
          "systemd_cgroup": "auto", "state": "present", "backup": False, "validate": True,
          "applied_record": "/var/lib/gpuready/applied.json"}
TEXT = 'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n  default_runtime_name = "nvidia"\n'
SHA = hashlib.sha256(TEXT.encode()).hexdigest()
RESULT = {"config_version": 2, "runtime_table": 'plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia',
          "default_runtime_name": "nvidia", "warnings": ["a warning"]}


def _observed(checksum=SHA, version="1.7.24", kubelet="cgroupDriver: systemd\n"):
    return applied.observation([(CONFIG, checksum)], version, kubelet)


def _record(params=None, observed=None, result=None, path=CONFIG, previous=None):
    return applied.updated_record(previous, path, applied.fingerprint(params or PARAMS, "engine-1"),
                                  observed or _observed(), result or RESULT)


def test_sha256_text_is_the_node_modules_checksum_of_the_bytes():
    assert applied.sha256_text(TEXT) == SHA
    assert applied.sha256_text("é\n") == hashlib.sha256("é\n".encode("utf-8")).hexdigest()
    assert applied.sha256_text(None) is None


def test_the_same_edit_on_the_same_files_matches_and_returns_the_recorded_result():
    known = applied.applied_result(_record(), CONFIG, applied.fingerprint(PARAMS, "engine-1"), _observed())
    assert known == RESULT


@pytest.mark.parametrize("observed", [
    _observed(checksum="0" * 64),            # someone else changed the file
    _observed(checksum=None),                # or deleted it
    _observed(version="2.1.4"),              # containerd was upgraded
    _observed(kubelet="cgroupDriver: cgroupfs\n"),  # the kubelet's cgroup driver changed
    applied.observation([(CONFIG, SHA), ("/etc/containerd/conf.d/99-nvidia.toml", None)], "1.7.24",
                        "cgroupDriver: systemd\n"),  # another set of files
], ids=["file-changed", "file-deleted", "containerd-upgraded", "kubelet-changed", "other-files"])
def test_any_change_on_the_node_misses(observed):
    assert applied.applied_result(_record(), CONFIG, applied.fingerprint(PARAMS, "engine-1"), observed) is None


@pytest.mark.parametrize("change", [{"enable_cdi": True}, {"set_as_default": None}, {"runtime_name": "nv"},
                                    {"state": "absent"}, {"systemd_cgroup": "true"}, {"drop_in": "/x/99.toml"}])
def test_an_option_that_shapes_the_edit_misses(change):
    params = dict(PARAMS, **change)
    assert applied.fingerprint(params, "engine-1") != applied.fingerprint(PARAMS, "engine-1")
    assert applied.applied_result(_record(), CONFIG, applied.fingerprint(params, "engine-1"), _observed()) is None


def test_options_that_only_check_or_keep_the_edit_do_not_change_the_fingerprint():
    params = dict(PARAMS, backup=True, validate=False, applied_record="/elsewhere.json")
    assert applied.fingerprint(params, "engine-1") == applied.fingerprint(PARAMS, "engine-1")


def test_another_engine_misses():
    assert applied.applied_result(_record(), CONFIG, applied.fingerprint(PARAMS, "engine-2"), _observed()) is None


def test_engine_identity_follows_the_source_and_tomlkit(tmp_path):
    source = tmp_path / "containerd_config.py"
    source.write_text("A = 1\n")
    first = applied.engine_identity([str(source)], "0.15.1")
    assert applied.engine_identity([str(source)], "0.15.1") == first
    assert applied.engine_identity([str(source)], "0.13.3") != first
    source.write_text("A = 2\n")
    assert applied.engine_identity([str(source)], "0.15.1") != first


@pytest.mark.parametrize("text", [None, "", "{not json", "[]", json.dumps({"format": 99, "entries": {}}),
                                  json.dumps({"format": 1, "entries": []})])
def test_a_missing_or_foreign_record_misses_and_is_replaced(text):
    fingerprint = applied.fingerprint(PARAMS, "engine-1")
    assert applied.applied_result(text, CONFIG, fingerprint, _observed()) is None
    rewritten = applied.updated_record(text, CONFIG, fingerprint, _observed(), RESULT)
    assert applied.applied_result(rewritten, CONFIG, fingerprint, _observed()) == RESULT


def test_an_entry_is_per_main_path_and_others_are_kept():
    other = "/etc/containerd/other.toml"
    both = _record(path=other, previous=_record())
    fingerprint = applied.fingerprint(PARAMS, "engine-1")
    assert applied.applied_result(both, CONFIG, fingerprint, _observed()) == RESULT
    assert applied.applied_result(both, other, fingerprint, _observed()) == RESULT
    assert sorted(json.loads(both)["entries"]) == sorted([CONFIG, other])


def test_an_unchanged_record_is_not_rewritten():
    assert _record(previous=_record()) is None
    assert _record(previous=_record(), result=dict(RESULT, warnings=[])) is not None


def test_only_the_result_fields_are_recorded():
    text = _record(result=dict(RESULT, changed=True, diff=[{"before": "x"}], restart_service="k3s"))
    entry = json.loads(text)["entries"][CONFIG]
    assert sorted(entry["result"]) == sorted(list(RESULT) + ["restart_service"])
