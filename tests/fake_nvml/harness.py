# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Build the fake libnvidia-ml.so.1 (fake_nvml.c), write its JSON configuration and the fake sysfs
and DMI files a node would have. ``node_from_case`` turns a GFD label case into all three."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import json
import os
import re
import shutil
import stat
import struct
import subprocess

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_nvml.c")
MIB = 1024 * 1024
NVIDIA = "0x10de"
FABRIC_STATE_NOT_STARTED = 1
FABRIC_STATE_COMPLETED = 3
PCI_STATUS_CAP_LIST = 0x10
PCI_CAP_ID_PM = 0x01
PCI_CAP_ID_VNDR = 0x09
PCI_CAP_ID_EXP = 0x10
NVIDIA_MAJOR, UVM_MAJOR = 195, 508  # nvidia-uvm's major is dynamic on a real node
NVIDIA_CAPS_MAJOR = 509  # as is nvidia-caps' (/dev/nvidia-caps/nvidia-cap<minor>)
MIG_CONFIG_MINOR, MIG_MONITOR_MINOR = 1, 2
LIBRARY_DIR = "usr/lib/x86_64-linux-gnu"


def build(directory, default_config=None, builtin_config=None):
    """Compile the fake NVML into directory; returns the .so path. default_config: the file it reads when
    FAKE_NVML_CONFIG is unset (a node's /etc/nvidia-fake/gpus.json); builtin_config: a configuration (the
    fake's JSON schema) the library carries, for where neither is (in a container: fake_nvml.c says how
    it answers there)."""
    gcc = shutil.which("gcc")
    if not gcc:
        raise RuntimeError("gcc is needed to build the fake NVML")
    target = os.path.join(directory, "libnvidia-ml.so.1")
    command = [gcc, "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-Wl,-soname,libnvidia-ml.so.1"]
    if default_config:
        command.append('-DFAKE_NVML_DEFAULT_CONFIG="%s"' % default_config)
    if builtin_config is not None:
        header = os.path.join(directory, "builtin_config.h")
        data = json.dumps(builtin_config).encode("utf-8") + b"\0"
        with open(header, "w") as handle:
            handle.write("static const char builtin_config[] = {%s};\n" % ",".join(str(b) for b in data))
        command.append('-DFAKE_NVML_BUILTIN_CONFIG_HEADER="%s"' % header)
    subprocess.run(command + ["-o", target, SOURCE], check=True)
    return target


def device_nodes(config):
    """{name under /dev: (major, minor)} of the character devices the driver makes for config's GPUs:
    nvidia<minor> of each GPU, nvidiactl, nvidia-uvm, nvidia-uvm-tools, and with MIG devices their
    nvidia-caps (mig_cap_devices)."""
    devices = {"nvidiactl": (NVIDIA_MAJOR, 255), "nvidia-uvm": (UVM_MAJOR, 0), "nvidia-uvm-tools": (UVM_MAJOR, 1)}
    for index, device in enumerate(config["devices"]):
        minor = device.get("minor_number", index)
        devices["nvidia%d" % minor] = (NVIDIA_MAJOR, minor)
    devices.update(mig_cap_devices(config))
    return devices


def driver_install(root, library, config):
    """What a driver install puts under root for the GPUs of config (the fake's JSON schema), for tools that
    take a driver root and a device root: the NVML library under its versioned name
    (usr/lib/x86_64-linux-gnu/libnvidia-ml.so.<driver_version>) with its libnvidia-ml.so.1 link, and the
    character devices of device_nodes (mknod: root only). Returns the library folder."""
    library_dir = os.path.join(root, LIBRARY_DIR)
    os.makedirs(library_dir)
    versioned = "libnvidia-ml.so." + config["driver_version"]
    shutil.copyfile(library, os.path.join(library_dir, versioned))
    os.symlink(versioned, os.path.join(library_dir, "libnvidia-ml.so.1"))
    os.makedirs(os.path.join(root, "dev"))
    for name, (major, minor) in device_nodes(config).items():
        path = os.path.join(root, "dev", name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(major, minor))
        os.chmod(path, 0o666)  # past the umask, as the driver's own nodes are
    return library_dir


def write_config(path, config):
    """config: the fake's JSON schema (README.md next to this file)."""
    with open(path, "w") as handle:
        json.dump(config, handle, indent=1)
    return path


def config_space(vendor_capability=None):
    """256 bytes of PCI config space: a capability list PM -> PCIe -> vendor-specific (when given,
    the bytes after the 3-byte header). Without one, no vendor capability, as on most GPUs."""
    space = bytearray(256)
    struct.pack_into("<HH", space, 0, 0x10DE, 0x1BB3)
    struct.pack_into("<H", space, 0x06, PCI_STATUS_CAP_LIST)
    space[0x34] = 0x60
    space[0x60:0x62] = bytes([PCI_CAP_ID_PM, 0x68])
    space[0x68:0x6A] = bytes([PCI_CAP_ID_EXP, 0x78 if vendor_capability is not None else 0])
    if vendor_capability is not None:
        body = bytes(vendor_capability)
        space[0x78:0x78 + 3 + len(body)] = bytes([PCI_CAP_ID_VNDR, 0, 3 + len(body)]) + body
    return bytes(space)


def vgpu_capability(host_driver_version, host_driver_branch, records_before=((0x07, b"\x01\x02"),)):
    """The vendor capability body of a vGPU guest function: the "VF" signature, then records
    (id, length, payload); record 0 carries the host driver version and branch, 10 bytes each."""
    body = bytearray(b"VF")
    for record_id, payload in records_before:
        body += bytes([record_id, 2 + len(payload)]) + payload
    host = host_driver_version.encode().ljust(10, b"\0") + host_driver_branch.encode().ljust(10, b"\0")
    body += bytes([0, 2 + len(host)]) + host
    return bytes(body)


# A GPU's BARs as the kernel lists them in a PCI function's `resource` file (start, end, flags; 13 lines:
# BAR0-5, the ROM, 6 unused): 16 MiB of registers, 8 GiB and 32 MiB of prefetchable 64-bit memory.
GPU_RESOURCE_LINES = [(0xFA000000, 0xFAFFFFFF, 0x40200), (0x38000000000, 0x381FFFFFFFF, 0x14220C), (0, 0, 0),
                      (0x38200000000, 0x38201FFFFFF, 0x14220C)] + [(0, 0, 0)] * 9


def write_sysfs(root, functions, modules=()):
    """functions: {sysfs bus id: {"vendor", "class" (None: no file), "device", "config" (bytes),
    "numa_node" (default 0, as the fake NVML's)}}; modules: names under <root>/module. Each function
    also gets the `resource` file every PCI function has (GPU_RESOURCE_LINES)."""
    os.makedirs(os.path.join(root, "bus", "pci", "devices"), exist_ok=True)
    for bus_id, function in functions.items():
        path = os.path.join(root, "bus", "pci", "devices", bus_id)
        os.makedirs(path)
        for name in ("vendor", "class", "device"):
            if function.get(name) is not None:
                with open(os.path.join(path, name), "w") as handle:
                    handle.write(function[name] + "\n")
        with open(os.path.join(path, "numa_node"), "w") as handle:
            handle.write("%d\n" % function.get("numa_node", 0))
        with open(os.path.join(path, "resource"), "w") as handle:
            handle.writelines("0x%016x 0x%016x 0x%016x\n" % line for line in GPU_RESOURCE_LINES)
        with open(os.path.join(path, "config"), "wb") as handle:
            handle.write(function.get("config") or config_space())
    for name in modules:
        os.makedirs(os.path.join(root, "module", name))
    return root


def mig_cap_minor(gpu, gpu_instance, compute_instance=None):
    """The nvidia-caps minor of a GPU instance's access capability, or of one of its compute instances', in
    the driver's layout: config and monitor first, then for each GPU its 15 GPU instances, each followed by
    its 8 compute instances."""
    minor = 3 + gpu * 135 + gpu_instance * 9
    return minor if compute_instance is None else minor + 1 + compute_instance


def mig_cap_devices(config):
    """{name under /dev: (major, minor)} of the nvidia-caps devices a driver makes for config's MIG devices
    (their GPU and compute instances) and the config and monitor capabilities; {} without MIG devices."""
    devices = {}
    for index, gpu in enumerate(config["devices"]):
        for mig in gpu.get("mig_devices") or ():
            minor, gi, ci = gpu.get("minor_number", index), mig["gpu_instance_id"], mig.get("compute_instance_id", 0)
            for cap in (mig_cap_minor(minor, gi), mig_cap_minor(minor, gi, ci)):
                devices["nvidia-caps/nvidia-cap%d" % cap] = (NVIDIA_CAPS_MAJOR, cap)
    if devices:
        for cap in (MIG_CONFIG_MINOR, MIG_MONITOR_MINOR):
            devices["nvidia-caps/nvidia-cap%d" % cap] = (NVIDIA_CAPS_MAJOR, cap)
    return devices


def write_mig_minors(root, gpus=32):
    """<root>/nvidia-caps/mig-minors as the driver's nvidia-caps module lists it under /proc/driver: the
    device minor of each MIG capability (mig_cap_minor). The device plugin and the toolkit map a MIG device to
    its /dev/nvidia-caps nodes through it."""
    lines = ["config %d" % MIG_CONFIG_MINOR, "monitor %d" % MIG_MONITOR_MINOR]
    for gpu in range(gpus):
        for gpu_instance in range(15):
            lines.append("gpu%d/gi%d/access %d" % (gpu, gpu_instance, mig_cap_minor(gpu, gpu_instance)))
            lines.extend("gpu%d/gi%d/ci%d/access %d" % (gpu, gpu_instance, ci, mig_cap_minor(gpu, gpu_instance, ci))
                         for ci in range(8))
    os.makedirs(os.path.join(root, "nvidia-caps"), exist_ok=True)
    with open(os.path.join(root, "nvidia-caps", "mig-minors"), "w") as handle:
        handle.write("\n".join(lines) + "\n")
    return root


def _uuid(prefix, *parts):
    digest = hashlib.sha1("/".join(str(p) for p in parts).encode()).hexdigest()
    return "%s-%s-%s-%s-%s-%s" % (prefix, digest[:8], digest[8:12], digest[12:16], digest[16:20], digest[20:32])


# NVML_GPU_INSTANCE_PROFILE_* by (slices, profile name suffix)
GPU_INSTANCE_PROFILE_IDS = {
    (1, ""): 0x0, (2, ""): 0x1, (3, ""): 0x2, (4, ""): 0x3, (7, ""): 0x4, (8, ""): 0x5, (6, ""): 0x6,
    (1, "+me"): 0x7, (2, "+me"): 0x8, (1, "+gfx"): 0xA, (2, "+gfx"): 0xB, (4, "+gfx"): 0xC, (3, "+gfx"): 0x11,
    (1, "-me"): 0xD, (2, "-me"): 0xE, (1, "+me.all"): 0xF, (2, "+me.all"): 0x10,
}


# NVML_COMPUTE_INSTANCE_PROFILE_* by compute slices
COMPUTE_INSTANCE_PROFILE_IDS = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4, 8: 0x5, 6: 0x6}


def gpu_instance_profile_id(profile):
    """The NVML GPU instance profile id behind a MIG profile name such as 1g.10gb+me or 1c.3g.20gb."""
    match = re.match(r"^(?:\d+c\.)?(\d+)g\.\d+gb(.*)$", profile)
    if not match or (int(match.group(1)), match.group(2)) not in GPU_INSTANCE_PROFILE_IDS:
        raise ValueError("no NVML GPU instance profile for MIG profile %r" % (profile,))
    return GPU_INSTANCE_PROFILE_IDS[(int(match.group(1)), match.group(2))]


def compute_instance_profile_id(profile):
    """The NVML compute instance profile id behind a MIG profile name: its `Nc.` slices, else the GPU
    instance's (one compute instance filling it)."""
    match = re.match(r"^(?:(\d+)c\.)?(\d+)g\.", profile)
    if not match or int(match.group(1) or match.group(2)) not in COMPUTE_INSTANCE_PROFILE_IDS:
        raise ValueError("no NVML compute instance profile for MIG profile %r" % (profile,))
    return COMPUTE_INSTANCE_PROFILE_IDS[int(match.group(1) or match.group(2))]


def mig_device(case_name, index, slot, parent, mig):
    return {
        "slot": slot,
        "gpu_instance_id": slot + 1,
        "gpu_instance_profile_id": gpu_instance_profile_id(mig["profile"]),
        "compute_instance_profile_id": compute_instance_profile_id(mig["profile"]),
        "name": "%s MIG %s" % (parent["name"], mig["profile"]),
        "uuid": _uuid("MIG", case_name, index, slot),
        "memory_total": mig["memory_mb"] * MIB,
        "attributes": {
            "multiprocessorCount": mig["multiprocessors"], "sharedCopyEngineCount": mig["copy_engines"],
            "sharedDecoderCount": mig["decoders"], "sharedEncoderCount": mig["encoders"],
            "sharedJpegCount": mig["jpeg"], "sharedOfaCount": mig["ofa"],
            "gpuInstanceSliceCount": mig["gi_slices"], "computeInstanceSliceCount": mig["ci_slices"],
            "memorySizeMB": mig["memory_mb"],
        },
    }


def bus_ids(index):
    """(NVML bus id, sysfs bus id) of the index-th fake GPU."""
    bus = 0x07 + 0x10 * index
    return "00000000:%02X:00.0" % bus, "0000:%02x:00.0" % bus


def node_from_case(case, root):
    """Write the fake NVML configuration, sysfs tree, /proc/driver files and DMI file of a GFD label
    case's node under root. Returns {"config", "sysfs_root", "proc_driver_root", "dmi_product_file"}
    and the facts the module must give are the case's own."""
    os.makedirs(root, exist_ok=True)
    devices, functions = [], {}
    vgpus = list(case.get("vgpu_devices") or [])
    for index, device in enumerate(case["devices"]):
        nvml_bus_id, sysfs_bus_id = bus_ids(index)
        nvml = {
            "name": device["name"], "uuid": _uuid("GPU", case["name"], index), "pci_bus_id": nvml_bus_id,
            "minor_number": index, "memory_total": device["memory_mib"] * MIB,
            "compute_capability": device["compute_capability"],
        }
        if device["mig_capable"]:
            mode = 1 if device["mig_enabled"] else 0
            nvml["mig_mode"] = [mode, mode]
            nvml["mig_devices"] = [mig_device(case["name"], index, slot, device, mig)
                                   for slot, mig in enumerate(device.get("mig_devices") or [])]
        if device.get("fabric"):
            fabric = device["fabric"]
            nvml["fabric"] = {
                "cluster_uuid": fabric.get("cluster_uuid") or "", "clique_id": fabric.get("clique_id", 0),
                "state": FABRIC_STATE_COMPLETED if fabric.get("attached") else FABRIC_STATE_NOT_STARTED}
        devices.append(nvml)
        vgpu = vgpus.pop(0) if vgpus else None
        capability = vgpu_capability(vgpu["host_driver_version"], vgpu["host_driver_branch"]) if vgpu else None
        functions[sysfs_bus_id] = {"vendor": NVIDIA, "class": device["pci_class"], "device": "0x1bb3",
                                   "config": config_space(capability)}
    if vgpus:
        raise ValueError("case %s has more vgpu_devices than devices" % case["name"])
    sysfs_root = write_sysfs(os.path.join(root, "sys"), functions, modules=("nvidia",) if devices else ())
    config = {"driver_version": case["driver_version"], "nvml_version": "12.%s" % case["driver_version"],
              "cuda_driver_version": case["cuda_driver_version"], "devices": devices}
    if devices:  # NVML checks the loaded module at init, as the real one does
        config["kernel_module"] = os.path.join(sysfs_root, "module", "nvidia")
    node = {
        "config": write_config(os.path.join(root, "fake-nvml.json"), config),
        "sysfs_root": sysfs_root,
        "proc_driver_root": write_mig_minors(os.path.join(root, "proc-driver")),
        "dmi_product_file": os.path.join(root, "product_name"),
    }
    if case["machine_type"] is not None:
        with open(node["dmi_product_file"], "w") as handle:
            handle.write(case["machine_type"] + "\n")
    return node
