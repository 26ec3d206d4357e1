# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fake NVML's calls that the real device plugin and GFD make (tests/fake_nvml/README.md), through the
real nvidia-ml-py in a process of its own, so that NVML's state never leaks between tests. The expected
codes and constants are pynvml's own."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import subprocess
import sys

import require
from fake_nvml import harness

PROBE = r'''
import json, pynvml

def code(call, *args):
    try:
        return ["ok", call(*args)]
    except pynvml.NVMLError as exc:
        return ["error", exc.value]

out = {}
pynvml.nvmlInit()
pynvml.nvmlInit()
pynvml.nvmlShutdown()
out["count_after_one_of_two_shutdowns"] = code(pynvml.nvmlDeviceGetCount)
first, second, third = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(3))
out["by_uuid"] = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByUUID(b"GPU-2"))
out["index_of_third"] = pynvml.nvmlDeviceGetIndex(third)
out["unknown_uuid"] = code(pynvml.nvmlDeviceGetHandleByUUID, b"GPU-404")
out["same_numa"] = code(pynvml.nvmlDeviceGetTopologyCommonAncestor, first, second)
out["other_numa"] = code(pynvml.nvmlDeviceGetTopologyCommonAncestor, first, third)
out["nvlink_state"] = code(pynvml.nvmlDeviceGetNvLinkState, first, 0)
out["nvlink_remote"] = code(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, first, 0)
out["supported_events"] = pynvml.nvmlDeviceGetSupportedEventTypes(first)
events = pynvml.nvmlEventSetCreate()
pynvml.nvmlDeviceRegisterEvents(first, pynvml.nvmlEventTypeXidCriticalError, events)
out["wait"] = code(pynvml.nvmlEventSetWait_v2, events, 50)
pynvml.nvmlEventSetFree(events)
pynvml.nvmlShutdown()
out["count_after_last_shutdown"] = code(pynvml.nvmlDeviceGetCount)
print(json.dumps(out))
'''


def _device(index, numa_node):
    return {"name": "Tesla P4", "uuid": "GPU-%d" % index, "pci_bus_id": "00000000:%02X:00.0" % (0x3B + index),
            "memory_total": 7611 * harness.MIB, "compute_capability": [6, 1], "numa_node": numa_node}


def test_calls_of_the_real_plugin_and_gfd(tmp_path):
    pynvml = require.module("pynvml")
    harness.build(str(tmp_path))
    config = harness.write_config(str(tmp_path / "gpus.json"), {
        "driver_version": "535.183.01", "devices": [_device(1, 0), _device(2, 0), _device(3, 1)]})
    env = dict(os.environ, LD_LIBRARY_PATH=str(tmp_path), FAKE_NVML_CONFIG=config)
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)

    # NVML counts inits: one shutdown of two leaves it initialized, the last one does not.
    assert out["count_after_one_of_two_shutdowns"] == ["ok", 3]
    assert out["count_after_last_shutdown"] == ["error", pynvml.NVML_ERROR_UNINITIALIZED]
    assert out["by_uuid"] == "Tesla P4"
    assert out["index_of_third"] == 2
    assert out["unknown_uuid"] == ["error", pynvml.NVML_ERROR_NOT_FOUND]
    assert out["same_numa"] == ["ok", pynvml.NVML_TOPOLOGY_NODE]
    assert out["other_numa"] == ["ok", pynvml.NVML_TOPOLOGY_SYSTEM]
    assert out["nvlink_state"] == ["error", pynvml.NVML_ERROR_NOT_SUPPORTED]
    assert out["nvlink_remote"] == ["error", pynvml.NVML_ERROR_NOT_SUPPORTED]
    assert out["supported_events"] & pynvml.nvmlEventTypeXidCriticalError
    # No event ever fires: the health check's wait runs out its timeout, as on a healthy GPU.
    assert out["wait"] == ["error", pynvml.NVML_ERROR_TIMEOUT]


MIG_PROBE = r'''
import json, pynvml

def code(call, *args, **kwargs):
    try:
        return ["ok", call(*args, **kwargs)]
    except pynvml.NVMLError as exc:
        return ["error", exc.value]

out = {}
pynvml.nvmlInit()
gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
out["ci_id"] = pynvml.nvmlDeviceGetComputeInstanceId(mig)
gi = pynvml.nvmlDeviceGetGpuInstanceById(gpu, pynvml.nvmlDeviceGetGpuInstanceId(mig))
out["gi_profile"] = pynvml.nvmlGpuInstanceGetInfo(gi).profileId
for profile in (pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE):
    result = code(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, gpu, profile, version=1)
    out["gi_profile_info_%d" % profile] = (
        ["ok", [result[1].id, result[1].sliceCount, result[1].memorySizeMB]] if result[0] == "ok" else result)
for profile in (pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE):
    result = code(pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, profile, 0, version=1)
    out["ci_profile_info_%d" % profile] = ["ok", result[1].id] if result[0] == "ok" else result
ci = pynvml.nvmlGpuInstanceGetComputeInstanceById(gi, 0)
info = pynvml.nvmlComputeInstanceGetInfo_v2(ci)
out["ci_info"] = [info.id, info.profileId, info.placement.size]
out["other_ci"] = code(pynvml.nvmlGpuInstanceGetComputeInstanceById, gi, 1)
print(json.dumps(out))
'''


def test_mig_profile_calls_of_go_nvlib(tmp_path):
    """What go-nvlib calls to name a MIG device's profile (GFD's MIG labels, the plugin's MIG resources):
    a 1c.3g.20gb device is compute instance 0 with the 1-slice profile in a GPU instance of the 3-slice
    profile, and the GPU answers profile info for that GPU instance profile only."""
    pynvml = require.module("pynvml")
    harness.build(str(tmp_path))
    mig = {"profile": "1c.3g.20gb", "memory_mb": 19968, "multiprocessors": 14, "copy_engines": 3, "decoders": 2,
           "encoders": 0, "jpeg": 0, "ofa": 0, "gi_slices": 3, "ci_slices": 1}
    gpu = {"name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-1", "pci_bus_id": "00000000:07:00.0",
           "memory_total": 40960 * harness.MIB, "compute_capability": [8, 0], "mig_mode": [1, 1],
           "mig_devices": [harness.mig_device("probe", 0, 0, {"name": "NVIDIA A100-SXM4-40GB"}, mig)]}
    config = harness.write_config(str(tmp_path / "gpus.json"), {"driver_version": "535.183.01", "devices": [gpu]})
    env = dict(os.environ, LD_LIBRARY_PATH=str(tmp_path), FAKE_NVML_CONFIG=config)
    proc = subprocess.run([sys.executable, "-c", MIG_PROBE], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)

    three, one = pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE
    assert out["ci_id"] == 0
    assert out["gi_profile"] == three
    assert out["gi_profile_info_%d" % three] == ["ok", [three, 3, 19968]]
    assert out["gi_profile_info_%d" % one] == ["error", pynvml.NVML_ERROR_NOT_SUPPORTED]
    ci_one, ci_three = pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE
    assert out["ci_profile_info_%d" % ci_one] == ["ok", ci_one]
    assert out["ci_profile_info_%d" % ci_three] == ["error", pynvml.NVML_ERROR_NOT_SUPPORTED]
    assert out["ci_info"] == [0, ci_one, 1]
    assert out["other_ci"] == ["error", pynvml.NVML_ERROR_NOT_FOUND]


INIT_PROBE = r'''
import json, pynvml
try:
    pynvml.nvmlInit()
    print(json.dumps(["ok", pynvml.nvmlSystemGetDriverVersion()]))
except pynvml.NVMLError as exc:
    print(json.dumps(["error", exc.value, pynvml.nvmlErrorString(exc.value)]))
'''


def test_init_checks_the_loaded_kernel_module_as_real_nvml_does(tmp_path):
    pynvml = require.module("pynvml")
    harness.build(str(tmp_path))
    module = tmp_path / "sys" / "module" / "nvidia"
    config = harness.write_config(str(tmp_path / "gpus.json"), {
        "driver_version": "535.183.01", "kernel_module": str(module), "devices": [_device(0, 0)]})
    env = dict(os.environ, LD_LIBRARY_PATH=str(tmp_path), FAKE_NVML_CONFIG=config)

    def init():
        proc = subprocess.run([sys.executable, "-c", INIT_PROBE], env=env, capture_output=True, text=True,
                              check=False)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    # No module loaded: the code, and the library's string for it (what nvidia-smi and Go clients print)
    assert init() == ["error", pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"]
    module.mkdir(parents=True)
    assert init() == ["ok", "535.183.01"]  # a module that does not say its version
    (module / "version").write_text("535.183.01\n")
    assert init() == ["ok", "535.183.01"]
    # Another module version than the library's, as after a driver upgrade without a reboot
    (module / "version").write_text("535.216.01\n")
    assert init() == ["error", pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "Driver/library version mismatch"]
