# -*- coding: utf-8 -*-
"""The real nvidia-ctk as the oracle for containerd_nvidia_runtime.

Every containerd case (public and ours) and every real config goes through the real
``nvidia-ctk runtime configure --runtime=containerd`` (built from its Go module at the lab's pin, lab/go)
on one copy and through our module on another; real containerd of the matching series then says what it
loads from each (``containerd config dump``, which reads imports too). Where the two differ, the case must
name the deviation that explains it, and the difference must lie where that deviation acts: the table
below. The test prints the whole tally."""

from __future__ import absolute_import, division, print_function

import os
import shutil
import subprocess
import tomllib

import pytest

import containerd_cases as cases
import lab_scripts
from playbook import run_tasks
from ansible_collections.gpuready.nvidia.tests.integration.containerd_daemon import loaded_cri_runtime

MODULE = "gpuready.nvidia.containerd_nvidia_runtime"
gobuild = lab_scripts.script("lab/go/gobuild.py", "gpuready_gobuild")

CASES = cases.all_cases()
REAL = cases.real_configs()


def _input_version(text):
    """The config version nvidia-ctk reads from a file: missing or empty gives 2, no `version` key 1
    (containerd-semantics.md section 1)."""
    if text is None or not text.strip():
        return 2
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return None
    return doc.get("version", 1) if doc else 2


def _ctk_command(config, options, drop_in, version):
    command = [str(gobuild.find_binary("nvidia-ctk")), "runtime", "configure", "--runtime=containerd",
               "--config-source=file", "--config=" + config,
               "--nvidia-runtime-name=" + options["runtime_name"], "--nvidia-runtime-path=" + options["binary_path"]]
    if options.get("set_as_default"):
        command.append("--nvidia-set-as-default")
    if options.get("enable_cdi"):
        command.append("--cdi.enabled")
    if drop_in is None:
        # From 1.18 on, nvidia-ctk edits only a version 1 file in place; any other version goes to its
        # default drop-in, conf.d/99-nvidia.toml beside the config (in place it adds no runtime at all).
        drop_in = "" if version == 1 else os.path.join(os.path.dirname(config), "conf.d", "99-nvidia.toml")
    return command + ["--drop-in-config", drop_in]


# Every documented difference (the module's DOCUMENTATION says each one and why) and the aspects of what
# containerd loads where it may show: a name ending in "." covers the keys under it.
DEVIATIONS = {
    "D1": ("a new file gets the version the installed containerd wants", ("entry.",)),
    "D2": ("CDI on a version 1 file goes where containerd reads it", ("cdi",)),
    "D3": ("a drop-in for a version 1 file is refused", ("refused",)),
    "D4": ("without a base runtime, SystemdCgroup follows the kubelet", ("entry.options.SystemdCgroup",)),
    "D5": ("containerd 1.x's built-in runc is declared beside ours", ("runtimes",)),
    "D6": ("set_as_default is refused under the deprecated default_runtime table", ("refused",)),
    "D7": ("the CRI table the file really uses", ("runtimes", "default", "entry", "cdi")),
    "D8": ("no runtime_root/runtime_engine on version 3 files", ("entry.runtime_root", "entry.runtime_engine")),
    "D9": ("the entry is replaced in config.toml itself; containerd 2.x merges nvidia-ctk's drop-in over the "
           "older entry, whose other keys stay", ("entry.",)),
    "key-case": ("option keys that differ only in case from ours are removed", ("entry.options.",)),
    "refusal": ("input the module refuses: a key of the wrong type, a runtime_name no RuntimeClass can name",
                ("refused",)),
}
# Deviations a case shows besides the one its `deviation` field names, and those of each real config.
CASE_DEVIATIONS = {
    "own:d4_no_base_follows_systemd_kubelet": {"D5"},
    "own:debian_stock_config_without_default_is_idempotent": {"D5"},
    "own:lower_camel_option_keys_are_replaced": {"key-case"},
    "own:default_runtime_name_not_a_string_is_refused": {"refusal"},
    "own:enable_cdi_not_a_boolean_is_refused": {"refusal"},
    "own:imports_not_an_array_is_refused": {"refusal"},
    "own:invalid_runtime_name_is_refused": {"refusal"},
}
REAL_DEVIATIONS = {
    "04-eks-al2023-nodeadm-nvidia.toml": {"D9"},
    "06-kubespray-v2.27.0-containerd-1.7.toml": {"key-case"},
    "15-aks-node-controller-containerd2-gpu.toml": {"D7"},
}

REAL_OPTIONS = {"runtime_name": "nvidia", "binary_path": "/usr/bin/nvidia-container-runtime", "set_as_default": True,
                "enable_cdi": False}


def _entries():
    """One comparison per case and per real config: what goes to both tools, and the containerd series
    that load the results."""
    entries = []
    for source, case in CASES:
        entries.append({"id": cases.case_id((source, case)), "case": case, "options": case["options"],
                        "series": cases.series(case),
                        "listed": CASE_DEVIATIONS.get(cases.case_id((source, case)), set()),
                        "deviations": {case["deviation"]} if case.get("deviation") else set()})
    for path in REAL:
        entries.append({"id": "real:" + os.path.basename(path), "real": path, "options": REAL_OPTIONS,
                        "series": cases.real_config_series(path),
                        "listed": REAL_DEVIATIONS.get(os.path.basename(path), set()), "deviations": set()})
    return entries


def _lay_out(folder, entry):
    if "real" in entry:
        os.makedirs(folder)
        return shutil.copy(entry["real"], os.path.join(folder, "config.toml"))
    return cases.lay_out(folder, entry["case"])


def _module_args(entry, folder, containerd_binaries):
    binary = containerd_binaries[entry["series"][-1]]
    if "real" in entry:
        return {"path": os.path.join(folder, "config.toml"), "set_as_default": True, "containerd_binary": binary,
                "kubelet_config": os.path.join(folder, "none.yaml")}
    return dict(cases.module_args(entry["case"], folder), containerd_binary=binary,
                kubelet_config=os.path.join(folder, "kubelet.yaml"))


def _loaded(binary, config, series, name):
    """What containerd loads from a config for runtime `name`: a dict, or a sentence when it refuses."""
    table, refusal = loaded_cri_runtime(binary, config, series)
    if refusal:
        return "containerd refuses the file: " + refusal
    runtimes = table.get("containerd", {}).get("runtimes", {})
    legacy = table.get("containerd", {}).get("default_runtime") or {}
    # containerd 1.x runs the deprecated default_runtime table whenever it names a runtime type.
    default = ("the default_runtime table" if legacy.get("runtime_type")
               else table.get("containerd", {}).get("default_runtime_name"))
    return {"runtimes": sorted(runtimes), "entry": runtimes.get(name), "default": default,
            "cdi": table.get("enable_cdi")}


def _flat(value, prefix):
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            out.update(_flat(item, prefix + "." + key))
        return out
    return {prefix: value}


def differences(ours, theirs):
    """Where two outcomes differ: `refused` when one side refused and the other did not, else the
    aspects of what containerd loads (runtimes, default, cdi, entry.<key path>)."""
    if isinstance(ours, str) or isinstance(theirs, str):
        return set() if isinstance(ours, str) and isinstance(theirs, str) else {"refused"}
    found = {key for key in ("runtimes", "default", "cdi") if ours[key] != theirs[key]}
    if ours["entry"] is None or theirs["entry"] is None:
        if ours["entry"] != theirs["entry"]:
            found.add("entry")
        return found
    mine, other = _flat(ours["entry"], "entry"), _flat(theirs["entry"], "entry")
    return found | {key for key in set(mine) | set(other) if mine.get(key) != other.get(key)}


@pytest.fixture(scope="module")
def oracle_runs(tmp_path_factory, containerd_binaries, node_files):
    root = str(tmp_path_factory.mktemp("oracle"))
    tasks, tool = [], {}
    for index, entry in enumerate(ENTRIES):
        theirs = _lay_out(os.path.join(root, "%d-nvidia-ctk" % index), entry)
        ours = _lay_out(os.path.join(root, "%d-module" % index), entry)
        if entry["options"].get("state", "present") == "absent":
            continue  # nvidia-ctk has no unconfigure command
        drop_in = cases.drop_in_path(entry["case"], os.path.dirname(theirs)) if "case" in entry else None
        proc = subprocess.run(_ctk_command(theirs, entry["options"], drop_in, _input_version(cases.read_text(theirs))),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                              timeout=60, check=False)
        tool[index] = proc
        tasks.append({"name": entry["id"], MODULE: _module_args(entry, os.path.dirname(ours), containerd_binaries),
                      "register": "r%d" % index, "ignore_errors": True})
    _proc, results = run_tasks(root, tasks)
    outcomes = []
    for index, entry in enumerate(ENTRIES):
        if index not in tool:
            outcomes.append((entry, None, "(nvidia-ctk has no unconfigure command)", None))
            continue
        name = entry["options"]["runtime_name"]
        result = results["r%d" % index]
        for series in entry["series"]:
            binary = containerd_binaries[series]
            ours = ("refused: " + result["msg"].splitlines()[0]) if result.get("failed") else _loaded(
                binary, os.path.join(root, "%d-module" % index, "config.toml"), series, name)
            if tool[index].returncode != 0:
                theirs = "refused: " + (tool[index].stdout.strip().splitlines() or ["?"])[-1]
            else:
                theirs = _loaded(binary, os.path.join(root, "%d-nvidia-ctk" % index, "config.toml"), series, name)
            outcomes.append((entry, series, ours, theirs))
    return outcomes


def _explains(name, aspect):
    return any(aspect == where or (where.endswith(".") and aspect.startswith(where)) for where in DEVIATIONS[name][1])


def _verdict(outcomes):
    """(kind, deviations shown, text) for one entry; kind: agree, both refuse, deviation or no counterpart."""
    entry = outcomes[0][0]
    if outcomes[0][1] is None:
        return "no counterpart", [], outcomes[0][2]
    found = set().union(*(differences(ours, theirs) for _e, _s, ours, theirs in outcomes))
    if not found:
        both_refuse = all(isinstance(ours, str) and isinstance(theirs, str) for _e, _s, ours, theirs in outcomes)
        return ("both refuse" if both_refuse else "agree"), [], ""
    names = sorted(n for n in entry["deviations"] | entry["listed"] if any(_explains(n, a) for a in found))
    return "deviation", names, "%s: %s" % (", ".join(names), ", ".join(sorted(found)))


ENTRIES = _entries()


def test_the_oracle_is_nvidia_ctk_at_the_lab_pin():
    pin = gobuild.component("container-toolkit").version
    out = subprocess.run([str(gobuild.find_binary("nvidia-ctk")), "--version"], stdout=subprocess.PIPE,
                         universal_newlines=True, check=True).stdout
    assert "NVIDIA Container Toolkit CLI version %s\n" % pin.lstrip("v") in out


@pytest.mark.parametrize("entry_id", [e["id"] for e in ENTRIES])
def test_module_and_nvidia_ctk_load_the_same_or_differ_where_a_deviation_says(oracle_runs, entry_id):
    outcomes = [o for o in oracle_runs if o[0]["id"] == entry_id]
    entry = outcomes[0][0]
    if outcomes[0][1] is None:
        assert entry["options"].get("state") == "absent"  # the one thing nvidia-ctk cannot do
        return
    declared = entry["deviations"] | entry["listed"]
    unexplained, shown = [], set()
    for _entry, series, ours, theirs in outcomes:
        for aspect in differences(ours, theirs):
            explaining = {name for name in declared if _explains(name, aspect)}
            shown |= explaining
            if not explaining:
                unexplained.append((series, aspect, ours, theirs))
    assert unexplained == [], "no deviation declared for this entry (%s) explains these" % sorted(declared)
    # This file's tables list what each entry was seen to show: a listed deviation that no longer shows is stale.
    assert sorted(entry["listed"] - shown) == []


def test_tally_printed_and_in_the_readme(oracle_runs, capsys):
    rows, kinds, shown = [], {}, {}
    for entry in ENTRIES:
        kind, names, text = _verdict([o for o in oracle_runs if o[0]["id"] == entry["id"]])
        kinds[kind] = kinds.get(kind, 0) + 1
        for name in names:
            shown[name] = shown.get(name, 0) + 1
        rows.append("  %-62s %s%s" % (entry["id"], kind, " " + text if text else ""))
    assert sum(kinds.values()) == len(ENTRIES) == len(CASES) + len(REAL)
    with capsys.disabled():
        print("\ncontainerd_nvidia_runtime and nvidia-ctk %s, as containerd loads each result:"
              % gobuild.component("container-toolkit").version)
        print("\n".join(rows))
        print("  tally: %d compared; %s" % (len(ENTRIES), ", ".join("%s %d" % kv for kv in sorted(kinds.items()))))
    # The README states this tally; it must be this run's.
    labels = {"key-case": "option key case", "refusal": "refused input"}
    claim = ("Of %d compared: %d agree, %d are refused by both, %d differ only where a named deviation says they "
             "may (%s), and %d (`state: absent`) has no nvidia-ctk counterpart." % (
                 len(ENTRIES), kinds.get("agree", 0), kinds.get("both refuse", 0), kinds.get("deviation", 0),
                 ", ".join("%s %d" % (labels.get(name, name), shown[name]) for name in DEVIATIONS if name in shown),
                 kinds.get("no counterpart", 0)))
    readme = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")
    assert claim in " ".join(cases.read_text(readme).split()), claim
