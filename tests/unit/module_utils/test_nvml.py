# -*- coding: utf-8 -*-
"""module_utils.nvml in process: NVML quirks with a pure-Python stand-in, then the real pynvml
ctypes path against the fake libnvidia-ml.so.1 preloaded by absolute path."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ctypes
from types import SimpleNamespace

import pytest

import require
from fake_nvml import harness
from ansible_collections.gpuready.nvidia.plugins.module_utils import nvml


class NVMLError(Exception):
    def __init__(self, value):
        super(NVMLError, self).__init__(value)
        self.value = value

    def __str__(self):
        return {3: "Not Supported", 9: "Driver Not Loaded", 12: "NVML Shared Library Not Found",
                13: "Function Not Found", 15: "GPU is lost"}.get(self.value, "Unknown Error")


class StandIn(object):
    """Answers like pynvml for one Pascal GPU; ``fail`` maps a call name to an NVML error code."""
    NVMLError = NVMLError

    def __init__(self, fail=None, init_rc=0):
        self.fail = fail or {}
        self.init_rc = init_rc
        self.shutdown = False

    def _answer(self, name, value):
        if name in self.fail:
            raise NVMLError(self.fail[name])
        return value

    def nvmlInit(self):
        if self.init_rc:
            raise NVMLError(self.init_rc)

    def nvmlShutdown(self):
        self.shutdown = True

    def nvmlSystemGetDriverVersion(self):
        return "535.183.01"

    def nvmlSystemGetNVMLVersion(self):
        return self._answer("nvml", "12.535.183.01")

    def nvmlSystemGetCudaDriverVersion(self):
        return 12020

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetName(self, handle):
        return self._answer("name", "Tesla P4")

    def nvmlDeviceGetUUID(self, handle):
        return "GPU-1"

    def nvmlDeviceGetPciInfo(self, handle):
        return SimpleNamespace(busId=b"00000000:3B:00.0")

    def nvmlDeviceGetMinorNumber(self, handle):
        return self._answer("minor", 0)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(total=7611 * 1024 * 1024)

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        return (6, 1)

    def nvmlDeviceGetMigMode(self, handle):
        return self._answer("mig", [0, 0])


HARDWARE = {"0000:3b:00.0": {"pci_class": "0x030200"}}


def test_normalize_bus_id():
    assert nvml.normalize_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert nvml.normalize_bus_id("0000:3b:00.0") == "0000:3b:00.0"
    assert nvml.normalize_bus_id(None) is None


def test_sysfs_gpus(tmp_path):
    root = harness.write_sysfs(str(tmp_path / "sys"), {
        "0000:3b:00.0": {"vendor": "0x10de", "class": "0x030200"},
        "0000:3b:00.1": {"vendor": "0x10de", "class": "0x040300"},
        "0000:00:02.0": {"vendor": "0x8086", "class": "0x030000"}})
    assert list(nvml.sysfs_gpus(root)) == ["0000:3b:00.0"]
    assert nvml.sysfs_gpus(str(tmp_path / "missing")) == {}


def test_pascal():
    facts = nvml.nvml_facts(StandIn(fail={"mig": 3}), HARDWARE)
    assert facts["nvml_ok"] and facts["error"] is None
    device = facts["devices"][0]
    assert device["mig_capable"] is False and device["memory_mib"] == 7611
    assert device["pci_bus_id"] == "00000000:3B:00.0" and device["pci_class"] == "0x030200"


def test_function_not_found_is_data():
    facts = nvml.nvml_facts(StandIn(fail={"minor": 13, "nvml": 13}), HARDWARE)
    assert facts["nvml_ok"] and facts["devices"][0]["minor_number"] is None and facts["nvml_version"] is None


def test_query_error_is_reported():
    lib = StandIn(fail={"name": 15})
    facts = nvml.nvml_facts(lib, HARDWARE)
    assert not facts["nvml_ok"] and "GPU is lost" in facts["error"] and lib.shutdown


@pytest.mark.parametrize("code, reason", [(12, "library not found"), (9, "driver not loaded"),
                                          (999, "initialization failed")])
def test_init_errors(code, reason):
    facts = nvml.nvml_facts(StandIn(init_rc=code), HARDWARE)
    assert not facts["nvml_ok"] and reason in facts["error"]


def test_pynvml_missing(tmp_path):
    facts = nvml.gather(sysfs_root=str(tmp_path), dmi_product_file=str(tmp_path / "none"), use_pynvml=False)
    assert facts["present"] is False and facts["nvml_ok"] is False and "nvidia-ml-py" in facts["error"]
    assert facts["machine_type"] is None


def test_kernel_module_version(tmp_path):
    version = tmp_path / "version"
    version.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n")
    (tmp_path / "module" / "nouveau").mkdir(parents=True)
    assert nvml.kernel_module(str(tmp_path), str(version)) == {
        "loaded": False, "version": "535.183.01", "nouveau_loaded": True}


@pytest.mark.parametrize("parent_mib, mig_mb, gb", [
    (40960, 4864, 5), (40960, 9856, 10), (40960, 19968, 20), (40960, 40192, 40),  # A100 40GB
    (81920, 9856, 10), (81920, 80384, 80),  # A100 80GB: MB / 1024 rounded up would say 79
    (40536, 4864, 5),  # what NVML really reports for an A100 40GB with ECC
])
def test_mig_memory_gb(parent_mib, mig_mb, gb):
    assert nvml.mig_memory_gb(parent_mib * harness.MIB, mig_mb) == gb


@pytest.mark.parametrize("gi, ci, gb, profile_id, name", [
    (1, 1, 5, 0x0, "1g.5gb"), (3, 1, 20, 0x2, "1c.3g.20gb"), (1, 1, 10, 0x7, "1g.10gb+me"),
    (1, 1, 20, 0x9, "1g.20gb"), (2, 2, 24, 0xB, "2g.24gb+gfx"), (1, 1, 12, 0xD, "1g.12gb-me"),
    (1, 1, 12, 0xF, "1g.12gb+me.all"), (7, 7, 40, None, "7g.40gb"),
])
def test_mig_profile_name(gi, ci, gb, profile_id, name):
    assert nvml.mig_profile_name(gi, ci, gb, profile_id) == name


def _vgpu_sysfs(tmp_path, config):
    return harness.write_sysfs(str(tmp_path / "sys"), {
        "0000:02:00.0": {"vendor": "0x10de", "class": "0x030000", "config": config},
        "0000:00:01.0": {"vendor": "0x8086", "class": "0x060000", "config": b"\xff" * 16}})


def test_vgpu_guest(tmp_path):
    config = harness.config_space(harness.vgpu_capability("550.54.16", "r550_40"))
    assert nvml.vgpu_devices(_vgpu_sysfs(tmp_path, config)) == [
        {"pci_bus_id": "0000:02:00.0", "host_driver_version": "550.54.16", "host_driver_branch": "r550_40"}]


@pytest.mark.parametrize("capability", [None, b"XY" + b"\0" * 24])
def test_bare_metal_is_no_vgpu(tmp_path, capability):
    assert nvml.vgpu_devices(_vgpu_sysfs(tmp_path, harness.config_space(capability))) == []


def test_unreadable_config_space_means_unknown(tmp_path):
    full = harness.config_space(harness.vgpu_capability("550.54.16", "r550_40"))
    # Unprivileged reads of sysfs config stop at 64 bytes: the capability list is cut off.
    assert nvml.vgpu_devices(_vgpu_sysfs(tmp_path, full[:64])) is None


@pytest.mark.parametrize("body", [
    b"VF" + bytes([7, 1]),                  # record length below 2
    b"VF" + bytes([0, 22]) + b"550.54.16",  # host driver record cut short
])
def test_malformed_vgpu_capability(tmp_path, body):
    assert nvml.vgpu_devices(_vgpu_sysfs(tmp_path, harness.config_space(body))) is None


def test_capability_list_loop():
    config = bytearray(harness.config_space())
    config[0x69] = 0x60  # PCIe capability points back to PM
    with pytest.raises(ValueError, match="loops"):
        nvml.vendor_capability(config)


def test_real_pynvml_against_fake_library(tmp_path, monkeypatch):
    pynvml = require.module("pynvml")
    library = harness.build(str(tmp_path))
    ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)
    config = harness.write_config(str(tmp_path / "conf"), {
        "driver_version": "535.183.01", "cuda_driver_version": 12020, "devices": [
            {"name": "Tesla P4", "uuid": "GPU-1", "pci_bus_id": "00000000:3B:00.0",
             "memory_total": 7611 * harness.MIB, "compute_capability": [6, 1],
             "not_supported": ["nvmlDeviceGetMinorNumber"]},
            {"name": "NVIDIA GB200", "uuid": "GPU-2", "pci_bus_id": "00000000:3C:00.0",
             "memory_total": 189471 * harness.MIB, "compute_capability": [10, 0], "mig_mode": [0, 0],
             "fabric": {"cluster_uuid": "7b968a6d-c8aa-45e1-9e07-e1e51be99c31", "clique_id": 32766, "state": 3}}]})
    monkeypatch.setenv("FAKE_NVML_CONFIG", config)
    monkeypatch.setattr(pynvml, "nvmlLib", None)
    getattr(pynvml, "_nvmlGetFunctionPointer_cache").clear()
    facts = nvml.nvml_facts(pynvml, HARDWARE)
    assert facts["nvml_ok"], facts["error"]
    assert facts["cuda_driver_version"] == 12020 and facts["count"] == 2
    p4, gb200 = facts["devices"]
    assert p4["memory_mib"] == 7611 and p4["compute_capability"] == [6, 1]
    assert (p4["mig_capable"], p4["fabric"], p4["minor_number"]) == (False, None, None)
    assert (gb200["mig_capable"], gb200["mig_enabled"]) == (True, False)
    assert gb200["fabric"] == {"cluster_uuid": "7b968a6d-c8aa-45e1-9e07-e1e51be99c31", "clique_id": 32766,
                               "attached": True}
    with open(config, "w") as handle:
        handle.write('{"devices": [')  # a broken fixture must not look like a GPU node
    facts = nvml.nvml_facts(pynvml, HARDWARE)
    assert not facts["nvml_ok"] and "code 999" in facts["error"]
    getattr(pynvml, "_nvmlGetFunctionPointer_cache").clear()
