# -*- coding: utf-8 -*-
"""Every GFD label case end to end: the case's node is built (fake libnvidia-ml.so.1 configured from
the case, fake sysfs with PCI class and config space, DMI file), ``nvidia_gpu_facts`` gathers through
the real pynvml, and the ``gfd_labels`` / ``gpu_resources`` filters run on what it registered, all in
one ansible-playbook run. Then the real gpu-feature-discovery (lab/go) labels the same node once, and
its labels must equal what ``gfd_labels`` made of the facts: the upstream program is the oracle."""

from __future__ import absolute_import, division, print_function

import json
import os
import subprocess
import threading

import pytest
import yaml

import gfd_cases as cases
import lab_scripts
from fake_nvml import harness
from playbook import run_tasks

ALL_CASES = cases.all_cases()
gobuild = lab_scripts.script("lab/go/gobuild.py", "gpuready_gobuild")
# GFD's own names for the collection's sharing strategies (its config file, version v1)
GFD_SHARING = {"time-slicing": "timeSlicing", "mps": "mps"}
TIMESTAMP = "nvidia.com/gfd.timestamp"
NO_DEVICES = "No devices found. Waiting indefinitely."


def _tasks(index, case, node, library_dir):
    facts = "facts_%d.ansible_facts.nvidia_gpu" % index
    options = cases.options_of(case)
    call = "(mig_strategy=opts.mig_strategy, sharing=opts.sharing%s)"
    return [
        {"name": "Gather %s" % case["name"], "gpuready.nvidia.nvidia_gpu_facts": {
            "sysfs_root": node["sysfs_root"], "dmi_product_file": node["dmi_product_file"]},
         "environment": {"LD_LIBRARY_PATH": library_dir, "FAKE_NVML_CONFIG": node["config"]},
         "register": "facts_%d" % index},
        {"name": "Labels of %s" % case["name"], "vars": {"opts": options}, "ignore_errors": True,
         "ansible.builtin.debug": {"msg": "{{ %s | gpuready.nvidia.gfd_labels%s }}" % (
             facts, call % ", timestamp=opts.timestamp")},
         "register": "labels_%d" % index},
        {"name": "Resources of %s" % case["name"], "vars": {"opts": options}, "ignore_errors": True,
         "ansible.builtin.debug": {"msg": "{{ %s | gpuready.nvidia.gpu_resources%s }}" % (facts, call % "")},
         "register": "resources_%d" % index},
    ]


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    """The fake NVML library and each case's node: (library folder, {case name: node})."""
    workdir = str(tmp_path_factory.mktemp("gfd-cases"))
    library_dir = os.path.join(workdir, "lib")
    os.mkdir(library_dir)
    harness.build(library_dir)
    return library_dir, dict((case["name"], harness.node_from_case(case, os.path.join(workdir, "node-%d" % index)))
                             for index, (_name, case) in enumerate(ALL_CASES))


@pytest.fixture(scope="module")
def results(nodes, tmp_path_factory):
    """{case name: {"facts", "labels", "resources": registered result}} from one playbook run."""
    library_dir, case_nodes = nodes
    tasks = []
    for index, (_name, case) in enumerate(ALL_CASES):
        tasks.extend(_tasks(index, case, case_nodes[case["name"]], library_dir))
    dummy, registered = run_tasks(str(tmp_path_factory.mktemp("gfd-play")), tasks)
    return dict(
        (case["name"], dict((kind, registered["%s_%d" % (kind, index)]) for kind in ("facts", "labels", "resources")))
        for index, (_name, case) in enumerate(ALL_CASES))


def _subset(gathered, expected, where):
    """Every key the case gives has the case's value in the gathered facts (lists item by item)."""
    if isinstance(expected, dict):
        assert isinstance(gathered, dict), where
        for key, value in expected.items():
            _subset(gathered.get(key), value, "%s.%s" % (where, key))
    elif isinstance(expected, list) and expected and isinstance(expected[0], dict):
        assert isinstance(gathered, list) and len(gathered) == len(expected), where
        for position, (got, want) in enumerate(zip(gathered, expected)):
            _subset(got, want, "%s[%d]" % (where, position))
    else:
        assert gathered == expected, "%s: %r != %r" % (where, gathered, expected)


@pytest.mark.parametrize("entry", ALL_CASES, ids=cases.case_id)
def test_module_gathers_the_case_facts(results, entry):
    case = entry[1]
    facts = results[case["name"]]["facts"]
    assert not facts.get("failed"), facts.get("msg")
    gathered = facts["ansible_facts"]["nvidia_gpu"]
    assert gathered["nvml_ok"] is True and gathered["error"] is None
    assert gathered["present"] is bool(case["devices"])
    assert gathered["count"] == len(case["devices"])
    _subset(gathered, cases.facts_of(case), "nvidia_gpu")


@pytest.mark.parametrize("entry", ALL_CASES, ids=cases.case_id)
def test_labels_from_the_module_facts(results, entry):
    case = entry[1]
    labels = results[case["name"]]["labels"]
    if case.get("expected_error"):
        assert labels.get("failed") is True, labels
        cases.check_label_error(case, labels["msg"])
        return
    assert not labels.get("failed"), labels.get("msg")
    cases.check_labels(case, dict(labels["msg"]))


@pytest.mark.parametrize("entry", ALL_CASES, ids=cases.case_id)
def test_resources_from_the_module_facts(results, entry):
    case = entry[1]
    resources = results[case["name"]]["resources"]
    if case.get("expected_plugin_error"):
        assert resources.get("failed") is True, resources
        cases.check_plugin_error(case, resources["msg"])
        return
    assert not resources.get("failed"), resources.get("msg")
    assert resources["msg"] == case["expected_node_resources"]


def gfd_config(options):
    """The case's options in GFD's own config file format (the device plugin's, version v1)."""
    config = {"version": "v1", "flags": {"migStrategy": options["mig_strategy"]}}
    sharing = options.get("sharing")
    if sharing:
        body = {"resources": sharing["resources"]}
        if sharing.get("rename_by_default"):
            body["renameByDefault"] = True
        if sharing.get("fail_requests_greater_than_one"):
            body["failRequestsGreaterThanOne"] = True
        config["sharing"] = {GFD_SHARING[sharing["strategy"]]: body}
    return config


def in_node(node, command, plugin_dir=None):
    """`command` in a mount namespace of its own where the case's node files are where NVIDIA's programs
    read them, as in their DaemonSets on a real node: the node's sysfs over /sys (PCI devices), its driver
    files over /proc/driver (MIG capability minors) and, for the device plugin, `plugin_dir` as the
    kubelet's device plugin folder (on a tmpfs over /var/lib, so the host's is left alone)."""
    script = 'mount --bind "$1" /sys && mount --bind "$2" /proc/driver'
    if plugin_dir:
        script += (' && mount -t tmpfs gpuready /var/lib && mkdir -p /var/lib/kubelet/device-plugins'
                   ' && mount --bind "$3" /var/lib/kubelet/device-plugins')
    script += ' && shift 3 && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "in-node",
            node["sysfs_root"], node["proc_driver_root"], plugin_dir or "-"] + command


def write_config(node, options):
    """The case's options as the config file GFD and the device plugin read; its path."""
    path = os.path.join(os.path.dirname(node["config"]), "nvidia-config.yaml")
    with open(path, "w") as handle:
        yaml.safe_dump(gfd_config(options), handle)
    return path


def nvml_env(library_dir, node):
    return dict(os.environ, LD_LIBRARY_PATH=library_dir, FAKE_NVML_CONFIG=node["config"])


def run_real_gfd(library_dir, node, options, timestamp):
    """The real gpu-feature-discovery, once (--oneshot, labels to a file), on the case's node:
    (process, labels or None)."""
    output = os.path.join(os.path.dirname(node["config"]), "gfd-labels")
    command = [str(gobuild.find_binary("gpu-feature-discovery")), "--oneshot", "--use-node-feature-api=false",
               "--output-file=" + output, "--machine-type-file=" + node["dmi_product_file"],
               "--config-file=" + write_config(node, options)] + ([] if timestamp else ["--no-timestamp"])
    proc = subprocess.run(in_node(node, command), env=nvml_env(library_dir, node), capture_output=True,
                          text=True, timeout=120, check=False)
    if not os.path.exists(output):
        return proc, None
    with open(output) as handle:
        return proc, dict(line.split("=", 1) for line in handle.read().splitlines() if line)


@pytest.mark.parametrize("entry", ALL_CASES, ids=cases.case_id)
def test_real_gfd_labels_equal_gfd_labels(nodes, results, entry):
    case = entry[1]
    options = cases.options_of(case)
    library_dir, case_nodes = nodes
    proc, real = run_real_gfd(library_dir, case_nodes[case["name"]], options, options["timestamp"])
    ours = results[case["name"]]["labels"]
    if case.get("expected_error"):
        # GFD refuses the configuration; so does gfd_labels, for the same reason.
        assert proc.returncode != 0 and real is None, (proc.returncode, real)
        cases.check_label_error(case, proc.stderr)
        cases.check_label_error(case, ours["msg"])
        return
    assert proc.returncode == 0 and real is not None, proc.stderr[-3000:]
    ours = dict(ours["msg"])
    if options["timestamp"]:
        assert real.pop(TIMESTAMP).isdigit() and ours.pop(TIMESTAMP).isdigit()
    if case.get("expected_label_alternatives"):
        # GFD's answer on a node of mixed models depends on which GPU it reads first (the case says
        # which alternatives there are): both must be one of them, and agree on every other label.
        varying = set(key for alternative in case["expected_label_alternatives"] for key in alternative)
        cases.check_labels(case, dict(real))
        cases.check_labels(case, dict(ours))
        real, ours = [dict((k, v) for k, v in labels.items() if k not in varying) for labels in (real, ours)]
    assert real == ours


class _Lines:
    """The lines a process writes to `stream`, read by a thread of their own as they come."""

    def __init__(self, stream, changed):
        self.lines, self.changed = [], changed
        self.thread = threading.Thread(target=self._follow, args=(stream,), daemon=True)
        self.thread.start()

    def _follow(self, stream):
        for line in stream:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()


def run_real_plugin(library_dir, node, options, done, timeout=90):
    """The real nvidia-device-plugin on the case's node, registering with the real kubelet's device manager
    (kubelet-device-manager, lab/go: the kubelet's own code for it), until done(allocatable, output) holds,
    the plugin exits or `timeout` seconds pass: (its exit code, None while it ran; {"capacity", "allocatable"}:
    what the kubelet would write into its Node, {resource: count}; its output)."""
    folder = os.path.join(os.path.dirname(node["config"]), "device-plugins")
    os.makedirs(folder, exist_ok=True)
    command = [str(gobuild.find_binary("nvidia-device-plugin")), "--config-file=" + write_config(node, options)]
    if (options.get("sharing") or {}).get("strategy") == "mps":
        # As its Helm chart sets it with MPS on; without it the plugin refuses any MPS config for that alone.
        command.append("--mps-root=" + os.path.join(folder, "mps"))
    changed = threading.Condition()
    kubelet = subprocess.Popen(in_node(node, [str(gobuild.find_binary("kubelet-device-manager"))], plugin_dir=folder),
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    plugin = None
    try:
        states = _Lines(kubelet.stdout, changed)
        with changed:
            # Its first line comes once its Registration service listens (kubelet.sock).
            assert changed.wait_for(lambda: states.lines or kubelet.poll() is not None, timeout=30), 'no device manager'
            assert kubelet.poll() is None, 'the device manager exited with %s' % kubelet.returncode
        plugin = subprocess.Popen(in_node(node, command, plugin_dir=folder), env=nvml_env(library_dir, node),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        output = _Lines(plugin.stdout, changed)

        def state():
            return json.loads(states.lines[-1])
        with changed:
            changed.wait_for(lambda: done(state()["allocatable"], "".join(output.lines)) or plugin.poll() is not None,
                             timeout=timeout)
            returncode = plugin.poll()
    finally:
        for proc in (plugin, kubelet):
            if proc and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
    output.thread.join(timeout=30)
    with changed:
        return returncode, state(), "".join(output.lines)


def _runs_mps(entry):
    options = entry[1]["options"]
    return (options.get("sharing") or {}).get("strategy") == "mps" and not entry[1].get("expected_plugin_error")


# Not here: a case the plugin serves with MPS. Its MPS plugin waits for the MPS control daemon (the
# plugin's mps-control-daemon and the driver's nvidia-cuda-mps-control, at /mps in its container).
PLUGIN_CASES = [entry for entry in ALL_CASES if not _runs_mps(entry)]


@pytest.mark.parametrize("entry", PLUGIN_CASES, ids=cases.case_id)
def test_real_plugin_registers_what_gpu_resources_expects(nodes, results, entry):
    case = entry[1]
    library_dir, case_nodes = nodes
    # How many resources the case says the node gets tells when the plugin has registered them all.
    count = len(case["expected_node_resources"])

    def done(allocatable, output):
        return len(allocatable) >= count if count else NO_DEVICES in output
    returncode, kubelet, output = run_real_plugin(library_dir, case_nodes[case["name"]], cases.options_of(case), done)
    ours = results[case["name"]]["resources"]
    if case.get("expected_plugin_error"):
        # The plugin refuses the configuration at start and registers nothing; so does gpu_resources.
        assert returncode not in (None, 0) and kubelet == {"capacity": {}, "allocatable": {}}, output[-3000:]
        assert ours.get("failed") is True, ours
        return
    assert returncode is None, output[-3000:]
    assert kubelet == {"capacity": ours["msg"], "allocatable": ours["msg"]}, output[-3000:]
