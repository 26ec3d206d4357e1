# -*- coding: utf-8 -*-
"""containerd_nvidia_runtime through ansible-playbook, on files on disk, validated by the node's
real containerd; then every result loaded by real daemons (v1/v2 by 1.6 and 1.7, v3 by 2.x)."""

from __future__ import absolute_import, division, print_function

import hashlib
import os
import re
import shutil
import stat
import tomllib

import pytest

import containerd_cases as cases
from playbook import run_tasks

MODULE = "gpuready.nvidia.containerd_nvidia_runtime"
CASES = cases.all_cases()
REAL = cases.real_configs()


def _sha(path):
    if not os.path.exists(path):
        return None
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


@pytest.fixture(scope="module")
def case_runs(tmp_path_factory, containerd_binaries):
    """Every case three times through the plugin in one ansible-playbook run: first run, second run,
    and check mode (with diff) on a fresh copy."""
    root = str(tmp_path_factory.mktemp("cases"))
    tasks = []
    for index, (source, case) in enumerate(CASES):
        for kind in ("run", "check"):
            folder = os.path.join(root, "%d-%s" % (index, kind))
            cases.lay_out(folder, case)
            args = cases.module_args(case, folder)
            args["kubelet_config"] = os.path.join(folder, "kubelet.yaml")
            args["containerd_binary"] = containerd_binaries["2" if case.get("containerd_major") == 2 else "1.6"]
            names = ["first", "second"] if kind == "run" else ["check"]
            for name in names:
                task = {"name": "%s %s %s" % (case["name"], kind, name), MODULE: args,
                        "register": "r%d_%s" % (index, name), "ignore_errors": True}
                if name == "check":
                    task["check_mode"] = True
                tasks.append(task)
    proc, results = run_tasks(root, tasks)
    return root, results, proc.stdout


@pytest.mark.parametrize("index", range(len(CASES)), ids=[cases.case_id(c) for c in CASES])
def test_case_through_the_plugin(case_runs, index):
    root, results, log = case_runs
    case = CASES[index][1]
    folder = os.path.join(root, "%d-run" % index)
    check_folder = os.path.join(root, "%d-check" % index)
    config = os.path.join(folder, "config.toml")
    drop_in = cases.drop_in_path(case, folder)
    first, second, check = results["r%d_first" % index], results["r%d_second" % index], results["r%d_check" % index]
    original = cases.input_text(case, folder)
    original_sha = hashlib.sha256(original.encode()).hexdigest() if original is not None else None
    check_original = cases.input_text(case, check_folder)
    check_sha = hashlib.sha256(check_original.encode()).hexdigest() if check_original is not None else None

    if case.get("expect_error"):
        assert first.get("failed"), first
        assert re.search(case.get("expect_error_match", ""), first["msg"], re.I), first["msg"]
        assert _sha(config) == original_sha  # refused: byte for byte as it was
        assert drop_in is None or not os.path.exists(drop_in)
        assert check.get("failed") and _sha(os.path.join(check_folder, "config.toml")) == check_sha
        return

    assert not first.get("failed"), first.get("msg", first)
    assert first["changed"] == case["expect_changed"]
    assert cases.expectation_failures(case, cases.read_text(config), cases.read_text(drop_in) if drop_in else None, folder) == []
    assert first["restart_required"] == first["changed"]
    if case.get("expect_file_mode"):
        assert "%04o" % stat.S_IMODE(os.stat(config).st_mode) == case["expect_file_mode"]
    # Second run: nothing to do, same bytes.
    assert not second.get("failed"), second.get("msg")
    assert second["changed"] is False
    assert second["diff"] == []
    # Check mode on a fresh copy: same verdict and diff, nothing written.
    assert not check.get("failed"), check.get("msg")
    assert check["changed"] == first["changed"]
    assert _sha(os.path.join(check_folder, "config.toml")) == check_sha
    written = {d["after_header"]: d["after"] for d in first["diff"]}
    predicted = {d["after_header"].replace(check_folder, folder): d["after"].replace(check_folder, folder)
                 for d in check["diff"]}
    assert predicted == written
    for path, text in written.items():
        assert text == cases.read_text(path)


@pytest.fixture(scope="module")
def real_config_runs(tmp_path_factory, containerd_binaries):
    """Every real config: present (set as default), again, then absent on a copy of the result."""
    root = str(tmp_path_factory.mktemp("real"))
    tasks = []
    for index, source in enumerate(REAL):
        folder = os.path.join(root, str(index))
        os.makedirs(folder)
        config = os.path.join(folder, "config.toml")
        shutil.copy(source, config)
        args = {"path": config, "set_as_default": True, "kubelet_config": os.path.join(folder, "none.yaml"),
                "containerd_binary": containerd_binaries[cases.real_config_series(source)[0]], "backup": True}
        tasks += [{"name": "%s present" % os.path.basename(source), MODULE: args, "register": "p%d" % index,
                   "ignore_errors": True},
                  {"name": "%s again" % os.path.basename(source), MODULE: args, "register": "a%d" % index,
                   "ignore_errors": True},
                  {"name": "copy result", "ansible.builtin.copy": {"src": config, "dest": config + ".result",
                                                                   "remote_src": True, "mode": "preserve"}},
                  {"name": "%s absent" % os.path.basename(source),
                   MODULE: dict(args, state="absent", backup=False), "register": "x%d" % index,
                   "ignore_errors": True}]
    _proc, results = run_tasks(root, tasks)
    return root, results


@pytest.mark.parametrize("index", range(len(REAL)), ids=[os.path.basename(p) for p in REAL])
def test_real_config_through_the_plugin(real_config_runs, index):
    root, results = real_config_runs
    present, again, absent = results["p%d" % index], results["a%d" % index], results["x%d" % index]
    assert not present.get("failed"), present.get("msg")
    assert present["changed"] and present["default_runtime_name"] == "nvidia"
    config = os.path.join(root, str(index), "config.toml")
    assert present["backups"][config] and cases.read_text(present["backups"][config]) == cases.read_text(REAL[index])
    assert not again.get("failed") and again["changed"] is False
    assert not absent.get("failed"), absent.get("msg")
    original = cases.read_text(REAL[index])
    if "runtimes.nvidia]" not in original and "runtimes.'nvidia']" not in original:
        assert cases.read_text(config) == original  # present then absent: the original bytes
    else:  # a runtime declared before us comes back with its values
        assert tomllib.loads(cases.read_text(config)) == tomllib.loads(original)


LOADED_CASES = [(i, series) for i, (_s, case) in enumerate(CASES) if not case.get("expect_error")
                for series in cases.series(case)]


@pytest.mark.parametrize("index, series", LOADED_CASES,
                         ids=["%s@%s" % (cases.case_id(CASES[i]), s) for i, s in LOADED_CASES])
def test_case_result_loads_in_real_containerd(case_runs, containerd_daemon, index, series):
    root, _results, _log = case_runs
    case = CASES[index][1]
    folder = os.path.join(root, "%d-run" % index)
    config = os.path.join(folder, "config.toml")
    drop_in = cases.drop_in_path(case, folder)
    daemon = containerd_daemon(series, config_path=config)
    status = daemon.cri_status()
    assert status["runtime_ready"], status["conditions"]
    effective = tomllib.loads(cases.read_text(drop_in) if drop_in else cases.read_text(config))
    default = _default_in(effective) or "runc"
    assert status["default_runtime_name"] == default
    name = case["options"]["runtime_name"]
    if case["options"].get("state") == "absent":
        assert name not in status["runtimes"]
        return
    assert status["runtimes"][name]["options"]["BinaryName"] == case["options"]["binary_path"]


# Where containerd reads the default runtime at each config version (`config dump` of 1.6, 1.7, 2.1).
DEFAULT_READ_FROM = {1: ("cri",), 2: ("io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"),
                     3: ("io.containerd.cri.v1.runtime",)}


def _default_in(doc):
    plugins = doc.get("plugins", {})
    for name in DEFAULT_READ_FROM[doc.get("version", 1)]:
        if "default_runtime_name" in plugins.get(name, {}).get("containerd", {}):
            return plugins[name]["containerd"]["default_runtime_name"]
    return None


LOADED_REAL = [(i, series) for i, path in enumerate(REAL) for series in cases.real_config_series(path)]


@pytest.mark.parametrize("index, series", LOADED_REAL,
                         ids=["%s@%s" % (os.path.basename(REAL[i]), s) for i, s in LOADED_REAL])
def test_real_config_result_loads_in_real_containerd(real_config_runs, node_files, containerd_daemon, index,
                                                     series):
    root, _results = real_config_runs
    result = os.path.join(root, str(index), "config.toml.result")
    daemon = containerd_daemon(series, config_path=result)
    if "disabled_plugins = [\"cri\"]" in cases.read_text(result):
        # Docker's containerd.io switches CRI off; the module warned, containerd serves no CRI.
        assert daemon.plugin_status("io.containerd.grpc.v1", "cri") is None
        return
    status = daemon.cri_status()
    assert status["runtime_ready"], status["conditions"]
    assert status["default_runtime_name"] == "nvidia"
    assert status["runtimes"]["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"


def test_applied_record_skips_only_a_true_no_op(tmp_path, containerd_binaries):
    """Through ansible-playbook: a re-run on files the record matches is known unchanged; a file someone
    else edited, a changed kubelet cgroup driver or another option takes the full path and is set right."""
    config, kubelet, record = (str(tmp_path / n) for n in ("config.toml", "kubelet.yaml", "state/applied.json"))
    with open(config, "w") as handle:  # no runc: SystemdCgroup follows the kubelet's cgroupDriver
        handle.write('version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n  snapshotter = "overlayfs"\n')
    with open(kubelet, "w") as handle:
        handle.write("cgroupDriver: systemd\n")
    args = {"path": config, "set_as_default": True, "kubelet_config": kubelet, "applied_record": record,
            "containerd_binary": containerd_binaries["1.7"]}

    def run(name, **task):
        return dict({"name": name, MODULE: args, "register": name}, **task)

    def someone_else(name, regexp, line, path=config):
        return {"name": name, "ansible.builtin.lineinfile": {"path": path, "regexp": regexp, "line": line}}

    def record_sha(name):
        return {"name": name, "ansible.builtin.stat": {"path": record, "checksum_algorithm": "sha256"},
                "register": name}

    tasks = [run("first"), run("again"),
             someone_else("edit", "default_runtime_name", '  default_runtime_name = "runc"'),
             record_sha("record_before"), run("check", check_mode=True), record_sha("record_after_check"),
             run("repair"), run("repaired"),
             someone_else("cgroupfs", "cgroupDriver", "cgroupDriver: cgroupfs", kubelet), run("kubelet"),
             {"name": "cdi", MODULE: dict(args, enable_cdi=True), "register": "cdi"}]
    proc, results = run_tasks(str(tmp_path), tasks)
    assert proc.returncode == 0, proc.stdout[-3000:]
    first, again, check, repair, repaired = (results[n] for n in ("first", "again", "check", "repair", "repaired"))

    assert first["changed"] and first["applied_record_matched"] is False
    assert stat.S_IMODE(os.stat(record).st_mode) == 0o600
    assert again["changed"] is False and again["applied_record_matched"] is True
    assert again["default_runtime_name"] == "nvidia" and again["config_version"] == 2
    assert again["runtime_table"] == first["runtime_table"]
    # check mode sees the other writer's edit, changes nothing and leaves the record as it was
    assert check["changed"] and check["applied_record_matched"] is False
    assert results["record_after_check"]["stat"]["checksum"] == results["record_before"]["stat"]["checksum"]
    assert repair["changed"] and repair["applied_record_matched"] is False and repair["default_runtime_name"] == "nvidia"
    assert repaired["changed"] is False and repaired["applied_record_matched"] is True
    after_repair = tomllib.loads(repair["diff"][0]["after"])["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert after_repair["default_runtime_name"] == "nvidia"
    assert after_repair["runtimes"]["nvidia"]["options"]["SystemdCgroup"] is True
    # the kubelet moved to cgroupfs: the full path runs, and the runtime follows it
    kubelet_run = results["kubelet"]
    assert kubelet_run["applied_record_matched"] is False and kubelet_run["changed"]
    assert results["cdi"]["changed"] and results["cdi"]["applied_record_matched"] is False
    final = tomllib.loads(cases.read_text(config))["plugins"]["io.containerd.grpc.v1.cri"]
    assert final["containerd"]["runtimes"]["nvidia"]["options"]["SystemdCgroup"] is False
    assert final["enable_cdi"] is True and final["containerd"]["default_runtime_name"] == "nvidia"


def test_applied_record_with_k3s(tmp_path):
    """k3s renders config.toml itself: the record covers the rendered file and the files we own beside it."""
    rendered = tmp_path / "agent" / "etc" / "containerd" / "config.toml"
    rendered.parent.mkdir(parents=True)
    rendered.write_text('version = 3\n[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]\n'
                        '  runtime_type = "io.containerd.runc.v2"\n')
    args = {"flavor": "k3s", "path": str(rendered), "flavor_config_dir": str(tmp_path / "rancher"),
            "set_as_default": True, "applied_record": str(tmp_path / "applied.json")}
    tasks = [{"name": n, MODULE: args, "register": n} for n in ("first", "again")]
    tasks.append({"name": "k3s re-renders", "ansible.builtin.lineinfile": {
        "path": str(rendered), "line": '  runtime_type = "io.containerd.runc.v2" # rendered anew',
        "regexp": "runtime_type"}})
    tasks.append({"name": "after", MODULE: args, "register": "after"})
    proc, results = run_tasks(str(tmp_path), tasks)
    assert proc.returncode == 0, proc.stdout[-3000:]
    first, again, after = results["first"], results["again"], results["after"]
    assert first["changed"] and first["applied_record_matched"] is False and first["restart_service"] == "k3s"
    assert again["changed"] is False and again["applied_record_matched"] is True
    assert again["restart_service"] == "k3s" and again["default_runtime_name"] == first["default_runtime_name"]
    assert after["applied_record_matched"] is False and after["changed"] is False
