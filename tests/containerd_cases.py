# -*- coding: utf-8 -*-
"""The containerd case files (format: ../shared/reference/containerd-semantics.md section 9) and the
checks every test layer applies to them: the engine in-process, the plugin through Ansible, and the
real daemons."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import tomllib

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "containerd")
PUBLIC = "containerd_cases.public.json"
OWN = "containerd_cases.own.json"
CASE_CONFIG_DIR = "/etc/containerd"
MISSING = object()


def load(name):
    with open(os.path.join(FIXTURES, name), "rb") as handle:
        return json.load(handle)


def all_cases():
    return [(PUBLIC, c) for c in load(PUBLIC)] + [(OWN, c) for c in load(OWN)]


def case_id(entry):
    return "%s:%s" % ("public" if entry[0] == PUBLIC else "own", entry[1]["name"])


def real_configs():
    folder = os.path.join(FIXTURES, "real-configs")
    return sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".toml"))


def input_text(case, config_dir=CASE_CONFIG_DIR):
    """None when the case says the file does not exist; imports under /etc/containerd/ move to config_dir."""
    if case.get("input_file_exists") is False:
        return None
    return "".join(line.replace(CASE_CONFIG_DIR + "/", config_dir + "/") if line.startswith("imports") else line
                   for line in case["input_toml"].splitlines(True))


def read_text(path):
    """The file's text, None when it does not exist."""
    if not os.path.exists(path):
        return None
    with open(path) as handle:
        return handle.read()


def lay_out(folder, case):
    """The case's files in a new folder: config.toml (unless the case has none, with the case's mode) and
    kubelet.yaml (when the case names a cgroup driver). Returns the config's path."""
    os.makedirs(folder)
    config = os.path.join(folder, "config.toml")
    text = input_text(case, folder)
    if text is not None:
        with open(config, "w") as handle:
            handle.write(text)
        if case.get("input_file_mode"):
            os.chmod(config, int(case["input_file_mode"], 8))
    kubelet = kubelet_config_text(case)
    if kubelet:
        with open(os.path.join(folder, "kubelet.yaml"), "w") as handle:
            handle.write(kubelet)
    return config


def series(case):
    """The containerd series that load a case's result: 2.x for a containerd 2 case, else 1.6 and 1.7."""
    return ["2"] if case.get("containerd_major") == 2 else ["1.6", "1.7"]


def real_config_series(path):
    """The containerd series a real config is written for: 2.x for version 3 or its tables, else 1.6 and 1.7."""
    doc = tomllib.loads(read_text(path))
    if doc.get("version", 1) >= 3 or "io.containerd.cri.v1.runtime" in doc.get("plugins", {}):
        return ["2"]
    return ["1.6", "1.7"]


def drop_in_path(case, config_dir):
    """The case's drop-in path, with /etc/containerd standing for the config's folder."""
    path = case["options"].get("drop_in_path")
    if path is None:
        return None
    if path.startswith(CASE_CONFIG_DIR + "/"):
        return config_dir + path[len(CASE_CONFIG_DIR):]
    return path


def module_args(case, config_dir):
    """containerd_nvidia_runtime parameters for a case (the names differ: see semantics.md)."""
    opts = case["options"]
    args = {
        "path": os.path.join(config_dir, "config.toml"),
        "runtime_name": opts["runtime_name"],
        "runtime_path": opts["binary_path"],
        "enable_cdi": opts["enable_cdi"],
        "config_version": str(opts.get("config_version", 3 if case.get("containerd_major") == 2 else 2)),
        "systemd_cgroup": opts.get("systemd_cgroup", "auto"),
        "state": opts.get("state", "present"),
    }
    if opts.get("set_as_default") is not None:
        args["set_as_default"] = opts["set_as_default"]
    drop_in = drop_in_path(case, config_dir)
    if drop_in:
        args["drop_in"] = drop_in
    return args


def kubelet_config_text(case):
    driver = case["options"].get("kubelet_cgroup_driver")
    if driver is None:
        return None
    return "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: %s\n" % driver


def lookup(doc, path):
    for part in path:
        if not isinstance(doc, dict) or part not in doc:
            return MISSING
        doc = doc[part]
    return doc


def same(a, b):
    """Equal by TOML value and type (booleans are not integers), lists element by element."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _in_config_dir(value, config_dir):
    """Expected values name paths under /etc/containerd, which stands for the config's folder."""
    if isinstance(value, list):
        return [_in_config_dir(v, config_dir) for v in value]
    if isinstance(value, str) and value.startswith(CASE_CONFIG_DIR + "/"):
        return config_dir + value[len(CASE_CONFIG_DIR):]
    return value


def expectation_failures(case, config_text, drop_in_text, config_dir=CASE_CONFIG_DIR):
    """Every `expect` entry and preserved substring that the result breaks (empty = pass)."""
    docs = {"config": tomllib.loads(config_text or ""), "drop_in": tomllib.loads(drop_in_text or "")}
    failures = []
    for expect in case["expect"]:
        value = lookup(docs[expect.get("file", "config")], expect["path"])
        if "equals" in expect and expect["path"] == ["imports"]:
            expect = dict(expect, equals=_in_config_dir(expect["equals"], config_dir))
        if expect.get("absent"):
            if value is not MISSING:
                failures.append("%s should be absent, is %r" % (expect["path"], value))
        elif value is MISSING or not same(value, expect["equals"]):
            found = None if value is MISSING else value
            failures.append("%s is %r, expected %r" % (expect["path"], found, expect["equals"]))
    for text in case.get("preserved_substrings", []):
        if text not in (config_text or ""):
            failures.append("lost %r" % text)
    return failures
