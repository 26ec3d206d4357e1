# -*- coding: utf-8 -*-
"""nvidia_gpu_facts through ansible-playbook against a fake libnvidia-ml.so.1 (tests/fake_nvml,
loaded by nvidia-ml-py through LD_LIBRARY_PATH as the real one would be) and a fake sysfs tree."""

from __future__ import absolute_import, division, print_function

import json
import os
import subprocess
import sys

import pytest

import gfd_cases
from fake_nvml import harness
from playbook import run_tasks

MODULE = "gpuready.nvidia.nvidia_gpu_facts"
P4_MEMORY = 7611 * harness.MIB
P4_BUS = ["00000000:%02X:00.0" % bus for bus in (0x3B, 0x5E, 0x86, 0xAF)]
P4_SYSFS = {"0000:%02x:00.0" % bus: {"vendor": "0x10de", "class": "0x030200"} for bus in (0x3B, 0x5E, 0x86, 0xAF)}
# facts from tests' seed case (gfd_label_cases: 4x Tesla P4, driver 535.183.01, CUDA 12.2, PowerEdge R740)
SEED = {
    "driver_version": "535.183.01", "nvml_version": "12.535.183.01", "cuda_driver_version": 12020,
    "devices": [{"name": "Tesla P4", "uuid": "GPU-%08d-1111-2222-3333-444444444444" % i, "pci_bus_id": P4_BUS[i],
                 "minor_number": i, "memory_total": P4_MEMORY, "compute_capability": [6, 1]} for i in range(4)],
}


@pytest.fixture(scope="session")
def fake_nvml_dir(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("fake-nvml"))
    harness.build(directory)
    return directory


def _run(tmp_path, fake_nvml_dir, config, functions, machine="PowerEdge R740", args=None, ld_path=None):
    workdir = str(tmp_path)
    sysfs = harness.write_sysfs(os.path.join(workdir, "sys"), functions, modules=("nvidia",))
    dmi = os.path.join(workdir, "product_name")
    with open(dmi, "w") as handle:
        handle.write(machine + "\n")
    conf = harness.write_config(os.path.join(workdir, "fake-nvml.json"), config)
    task_args = dict(sysfs_root=sysfs, dmi_product_file=dmi, **(args or {}))
    tasks = [{"name": "Gather", MODULE: task_args, "register": "facts", "ignore_errors": True,
              "environment": {"LD_LIBRARY_PATH": fake_nvml_dir if ld_path is None else ld_path,
                              "FAKE_NVML_CONFIG": conf}}]
    proc, results = run_tasks(workdir, tasks)
    return proc, results["facts"]


def test_seed_4x_tesla_p4(tmp_path, fake_nvml_dir):
    proc, result = _run(tmp_path, fake_nvml_dir, SEED, P4_SYSFS)
    assert not result.get("failed"), proc.stdout
    assert result["changed"] is False
    gpu = result["ansible_facts"]["nvidia_gpu"]
    assert gpu["present"] is True
    assert gpu["nvml_ok"] is True and gpu["error"] is None
    assert gpu["count"] == 4
    assert gpu["driver_version"] == "535.183.01"
    assert gpu["cuda_driver_version"] == 12020
    assert gpu["nvml_version"] == "12.535.183.01"
    assert gpu["machine_type"] == "PowerEdge R740"
    assert gpu["kernel_module"]["loaded"] is True
    assert gpu["kernel_module"]["nouveau_loaded"] is False
    assert set(gpu["device_nodes"]) >= {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
    for index, device in enumerate(gpu["devices"]):
        assert device == {
            "index": index, "name": "Tesla P4", "uuid": SEED["devices"][index]["uuid"], "pci_bus_id": P4_BUS[index],
            "minor_number": index, "memory_mib": 7611, "compute_capability": [6, 1], "mig_capable": False,
            "mig_enabled": False, "mig_devices": [], "pci_class": "0x030200", "fabric": None}
    assert gpu["vgpu_devices"] == []


def test_seed_matches_the_reference_case(tmp_path, fake_nvml_dir):
    """The facts carry the reference seed case's values under its names (the case file is a
    byte-identical copy of ../shared's, checked in the unit tests)."""
    seed = next(c for _n, c in gfd_cases.all_cases() if c["name"].startswith("seed-4x-tesla-p4"))
    dummy, result = _run(tmp_path, fake_nvml_dir, SEED, P4_SYSFS, machine=seed["machine_type"])
    gpu = result["ansible_facts"]["nvidia_gpu"]
    for key in ("driver_version", "cuda_driver_version", "machine_type"):
        assert gpu[key] == seed[key], key
    assert gpu["count"] == len(seed["devices"])
    for fact, expected in zip(gpu["devices"], seed["devices"]):
        assert {key: fact[key] for key in expected} == expected


def test_mig_enabled_a100_without_instances(tmp_path, fake_nvml_dir):
    config = {"driver_version": "550.54.15", "cuda_driver_version": 12040, "devices": [
        {"name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-a100", "pci_bus_id": "00000000:07:00.0",
         "memory_total": 40960 * harness.MIB, "compute_capability": [8, 0], "mig_mode": [1, 1],
         "max_mig_devices": 7}]}
    proc, result = _run(tmp_path, fake_nvml_dir, config, {"0000:07:00.0": {"vendor": "0x10de", "class": "0x030200"}})
    assert not result.get("failed"), proc.stdout
    device = result["ansible_facts"]["nvidia_gpu"]["devices"][0]
    assert (device["mig_capable"], device["mig_enabled"], device["mig_devices"]) == (True, True, [])
    assert device["compute_capability"] == [8, 0] and device["memory_mib"] == 40960


def test_mig_on_pascal_not_supported_is_data(tmp_path, fake_nvml_dir):
    proc, result = _run(tmp_path, fake_nvml_dir, SEED, P4_SYSFS)
    gpu = result["ansible_facts"]["nvidia_gpu"]
    assert not result.get("failed"), proc.stdout
    assert gpu["nvml_ok"] is True and gpu["error"] is None
    assert [d["mig_capable"] for d in gpu["devices"]] == [False] * 4


def test_no_hardware(tmp_path, fake_nvml_dir):
    proc, result = _run(tmp_path, fake_nvml_dir, {"devices": []},
                        {"0000:00:02.0": {"vendor": "0x8086", "class": "0x030000"}},
                        args={"fail_on_error": True})
    assert not result.get("failed"), proc.stdout
    assert result["ansible_facts"]["nvidia_gpu"]["present"] is False


def test_hardware_without_library(tmp_path, fake_nvml_dir):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc, result = _run(tmp_path, fake_nvml_dir, SEED, P4_SYSFS, ld_path=str(empty))
    assert not result.get("failed"), proc.stdout
    gpu = result["ansible_facts"]["nvidia_gpu"]
    assert gpu["present"] is True and gpu["nvml_ok"] is False
    assert "library not found" in gpu["error"]


def test_driver_not_loaded(tmp_path, fake_nvml_dir):
    proc, result = _run(tmp_path, fake_nvml_dir, dict(SEED, init_rc=9), P4_SYSFS)
    assert not result.get("failed"), proc.stdout
    gpu = result["ansible_facts"]["nvidia_gpu"]
    assert gpu["present"] is True and gpu["nvml_ok"] is False
    assert "driver not loaded" in gpu["error"]


def test_fail_on_error(tmp_path, fake_nvml_dir):
    proc, result = _run(tmp_path, fake_nvml_dir, dict(SEED, init_rc=9), P4_SYSFS, args={"fail_on_error": True})
    assert result.get("failed") is True, proc.stdout
    assert "driver not loaded" in result["msg"]


def test_check_mode(tmp_path, fake_nvml_dir):
    workdir = str(tmp_path)
    conf = harness.write_config(os.path.join(workdir, "c.json"), SEED)
    sysfs = harness.write_sysfs(os.path.join(workdir, "sys"), P4_SYSFS)
    tasks = [{"name": "Gather", MODULE: {"sysfs_root": sysfs}, "check_mode": True, "register": "facts",
              "environment": {"LD_LIBRARY_PATH": fake_nvml_dir, "FAKE_NVML_CONFIG": conf}}]
    proc, results = run_tasks(workdir, tasks)
    assert results["facts"]["ansible_facts"]["nvidia_gpu"]["count"] == 4, proc.stdout


def test_adhoc_on_this_machine(tmp_path):
    """No GPU here: the module succeeds with present false."""
    if any(os.path.exists(p) for p in ("/dev/nvidiactl", "/proc/driver/nvidia/version")):
        pytest.skip("this machine has an NVIDIA driver")
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=str(tmp_path / "l"),
               ANSIBLE_REMOTE_TEMP=str(tmp_path / "r"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json")
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible"), "localhost", "-i", "localhost,", "-c", "local",
           "-e", "ansible_python_interpreter=%s" % sys.executable, "-m", MODULE]
    proc = subprocess.run(cmd, env=env, cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout
    result = json.loads(proc.stdout[proc.stdout.index("{"):])["plays"][0]["tasks"][0]["hosts"]["localhost"]
    gpu = result["ansible_facts"]["nvidia_gpu"]
    assert gpu["present"] is False
    assert gpu["nvml_ok"] is False and "library not found" in gpu["error"]


def test_nvidia_ml_py_absent(tmp_path, fake_nvml_dir):
    """A node Python without nvidia-ml-py: a venv of the same interpreter without site packages."""
    venv = str(tmp_path / "bare")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    workdir = str(tmp_path)
    conf = harness.write_config(os.path.join(workdir, "c.json"), SEED)
    sysfs = harness.write_sysfs(os.path.join(workdir, "sys"), P4_SYSFS)
    tasks = [{"name": "Gather", MODULE: {"sysfs_root": sysfs}, "register": "facts",
              "environment": {"LD_LIBRARY_PATH": fake_nvml_dir, "FAKE_NVML_CONFIG": conf}}]
    proc, results = run_tasks(workdir, tasks, python=os.path.join(venv, "bin", "python"))
    gpu = results["facts"]["ansible_facts"]["nvidia_gpu"]
    assert gpu["present"] is True and gpu["nvml_ok"] is False, proc.stdout
    assert "nvidia-ml-py is not installed" in gpu["error"]
