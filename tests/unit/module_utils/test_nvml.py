# -*- coding: utf-8 -*-
"""module_utils.nvml in process: NVML quirks with a pure-Python stand-in, then the real pynvml
ctypes path against the fake libnvidia-ml.so.1 preloaded by absolute path."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ctypes
from types import SimpleNamespace

import pytest

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
        "0000:3b:00.0": ("0x10de", "0x030200"), "0000:3b:00.1": ("0x10de", "0x040300"),
        "0000:00:02.0": ("0x8086", "0x030000")})
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


def test_real_pynvml_against_fake_library(tmp_path, monkeypatch):
    pynvml = pytest.importorskip("pynvml")
    library = harness.build(str(tmp_path))
    ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)
    config = harness.write_config(str(tmp_path / "conf"), {"devices": [
        {"name": "Tesla P4", "uuid": "GPU-1", "bus_id": "00000000:3B:00.0", "memory": 7611 * harness.MIB,
         "compute_capability": [6, 1], "not_supported": ["nvmlDeviceGetMigMode"]}]})
    monkeypatch.setenv("FAKE_NVML_CONFIG", config)
    monkeypatch.setattr(pynvml, "nvmlLib", None)
    getattr(pynvml, "_nvmlGetFunctionPointer_cache").clear()
    facts = nvml.nvml_facts(pynvml, HARDWARE)
    assert facts["nvml_ok"], facts["error"]
    assert facts["cuda_driver_version"] == 12020 and facts["count"] == 1
    assert facts["devices"][0]["memory_mib"] == 7611 and facts["devices"][0]["compute_capability"] == [6, 1]
    assert facts["devices"][0]["mig_capable"] is False
    getattr(pynvml, "_nvmlGetFunctionPointer_cache").clear()
