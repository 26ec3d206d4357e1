# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The GFD label engine: GPU facts + options -> the labels GPU Feature Discovery v0.20.0 writes,
and the resources the NVIDIA device plugin v0.20.0 advertises.

Plain Python, no Ansible. Input is the facts dict:

* ``devices``: list of dicts with ``name``, ``memory_mib``, ``compute_capability`` ([major, minor];
  either may be None when NVML failed, and the labels that need it are left out),
  ``mig_capable``, ``mig_enabled``, ``pci_class`` (``"0x030200"``, an int, or None when unreadable),
  optional ``mig_devices`` (dicts with ``profile``, ``memory_mb``, ``multiprocessors``,
  ``gi_slices``, ``ci_slices``, ``copy_engines``, ``decoders``, ``encoders``, ``jpeg``, ``ofa``) and
  optional ``fabric`` (``attached``, ``cluster_uuid``, ``clique_id``).
* ``driver_version`` (str), ``cuda_driver_version`` (the NVML int, e.g. 12040).
* ``machine_type``: the raw DMI product name, None when unreadable.
* ``vgpu_devices``: list of dicts with ``host_driver_version`` and ``host_driver_branch``; None
  when PCI config space could not be read (GFD then writes no vgpu labels).

Sharing is ``None`` or ``{"strategy": "time-slicing"|"mps", "rename_by_default": bool,
"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}``.

Where we differ from GFD on purpose: on a node with several GPU models GFD writes one
``nvidia.com/gpu.*`` set per model into the same keys in Go map order, so the winning model is
random and can flip between relabels. Here the order is fixed: as in GFD, names that have a
MIG-enabled GPU are written before names of full GPUs; within each group the model with the most
GPUs is written last and so wins, ties going to the name that sorts first. The same rule picks
the parent model of a MIG ``single`` node when several exist (first MIG-enabled GPU in device order).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re
import time

PREFIX = "nvidia.com/"
GPU_RESOURCE = "nvidia.com/gpu"
MIG_STRATEGIES = ("none", "single", "mixed")
SHARING_STRATEGIES = ("time-slicing", "mps")
# go-nvlib GetDevices leaves these boards out of everything GFD and the plugin see.
SKIPPED_DEVICE_NAMES = ("DGX Display", "NVIDIA DGX Display")
PCI_CLASS_VGA = 0x030000
PCI_CLASS_3D = 0x030200
# Profiles with compute-instance sub-slicing (<C>c.<G>g...) get no default resource in the plugin.
SUBSLICED_PROFILE_RE = re.compile(r"^\d+c\.")
MIG_ATTRIBUTE_LABELS = (
    ("multiprocessors", "multiprocessors"),
    ("slices.gi", "gi_slices"),
    ("slices.ci", "ci_slices"),
    ("engines.copy", "copy_engines"),
    ("engines.decoder", "decoders"),
    ("engines.encoder", "encoders"),
    ("engines.jpeg", "jpeg"),
    ("engines.ofa", "ofa"),
)
MPS_ON_MIG_ERROR = "MPS sharing is not supported for mig devices"  # GFD's wording
PLUGIN_MPS_ON_MIG_ERROR = "MPS sharing is not supported for MIG devices"  # the device plugin's
PLUGIN_REFUSES_SINGLE = ("device plugin refuses the MIG configuration (invalid for mig-strategy=single); "
                         "nothing is advertised")


class LabelError(ValueError):
    """Facts or options we cannot label from, or a configuration GFD / the device plugin refuses."""


def sanitise(value):
    """GFD's sanitise: keep [A-Za-z0-9-_. ], then join the whitespace-separated words with '-'."""
    return "-".join(re.sub(r"[^A-Za-z0-9\-_. ]", "", value).split())


def arch_family(major, minor):
    """gpu.family from the CUDA compute capability (getArchFamily, v0.20.0)."""
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    return {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper",
            10: "blackwell", 12: "blackwell", 13: "rubin"}.get(major, "undefined")


def mig_resource_name(profile):
    """The mixed-strategy resource / label stem of a MIG profile: '+' becomes '.'."""
    return "mig-" + profile.replace("+", ".")


# --- input checking -------------------------------------------------------------------------


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _need(condition, field, what):
    if not condition:
        raise LabelError("%s must be %s" % (field, what))


def _check_int(value, field):
    _need(_is_int(value) and value >= 0, field, "a non-negative integer, got %r" % (value,))
    return value


def _check_bool(value, field):
    _need(isinstance(value, bool), field, "a boolean, got %r" % (value,))
    return value


def _check_str(value, field, optional=False):
    if optional and value is None:
        return None
    _need(isinstance(value, str), field, "a string%s, got %r" % (" or null" if optional else "", value))
    return value


def _pci_class(value, field):
    if value is None:
        return None
    if _is_int(value):
        return value
    _need(isinstance(value, str), field, "a string like '0x030200', an integer or null, got %r" % (value,))
    try:
        return int(value, 16)
    except ValueError:
        raise LabelError("%s must be a hex PCI class like '0x030200', got %r" % (field, value))


def _mig_device(raw, field):
    _need(isinstance(raw, dict), field, "a dict, got %r" % (type(raw).__name__,))
    mig = {"profile": _check_str(raw.get("profile"), field + ".profile"),
           "memory_mb": _check_int(raw.get("memory_mb", 0), field + ".memory_mb"),
           "uuid": _check_str(raw.get("uuid"), field + ".uuid", optional=True)}
    for _label, key in MIG_ATTRIBUTE_LABELS:
        mig[key] = _check_int(raw.get(key, 0), "%s.%s" % (field, key))
    return mig


def _device(raw, field):
    _need(isinstance(raw, dict), field, "a dict, got %r" % (type(raw).__name__,))
    # None where NVML could not answer: GFD leaves those labels out, as it does for 0.
    capability = raw.get("compute_capability")
    capability = [0, 0] if capability is None else capability
    _need(isinstance(capability, (list, tuple)) and len(capability) == 2 and all(_is_int(v) for v in capability),
          field + ".compute_capability", "a [major, minor] pair of integers, got %r" % (capability,))
    mig_devices = raw.get("mig_devices") or []
    _need(isinstance(mig_devices, list), field + ".mig_devices", "a list, got %r" % (type(mig_devices).__name__,))
    fabric = raw.get("fabric")
    _need(fabric is None or isinstance(fabric, dict), field + ".fabric", "a dict or null, got %r" % (fabric,))
    device = {
        "name": _check_str(raw.get("name"), field + ".name"),
        "uuid": _check_str(raw.get("uuid"), field + ".uuid", optional=True),
        "memory_mib": _check_int(raw.get("memory_mib") or 0, field + ".memory_mib"),
        "compute_capability": tuple(capability),
        "mig_capable": _check_bool(raw.get("mig_capable", False), field + ".mig_capable"),
        "mig_enabled": _check_bool(raw.get("mig_enabled", False), field + ".mig_enabled"),
        "pci_class": _pci_class(raw.get("pci_class"), field + ".pci_class"),
        "mig_devices": [_mig_device(m, "%s.mig_devices[%d]" % (field, i)) for i, m in enumerate(mig_devices)],
        "fabric": None,
    }
    if fabric:
        device["fabric"] = {
            "attached": _check_bool(fabric.get("attached", False), field + ".fabric.attached"),
            "cluster_uuid": _check_str(fabric.get("cluster_uuid"), field + ".fabric.cluster_uuid", optional=True),
            "clique_id": _check_int(fabric.get("clique_id", 0), field + ".fabric.clique_id"),
        }
    return device


def _devices(facts):
    """The checked devices GFD and the plugin see (skipped boards dropped)."""
    _need(isinstance(facts, dict), "facts", "a dict, got %r" % (type(facts).__name__,))
    raw = facts.get("devices") or []
    _need(isinstance(raw, list), "devices", "a list, got %r" % (type(raw).__name__,))
    devices = [_device(d, "devices[%d]" % i) for i, d in enumerate(raw)]
    return [d for d in devices if d["name"] not in SKIPPED_DEVICE_NAMES]


class _Sharing(object):
    """The parts of the sharing config that survive DisableResourceNamingInConfig."""

    def __init__(self, sharing):
        self.strategy = "none"
        self.rename_by_default = False
        self.replicas = {}
        if sharing is None:
            return
        _need(isinstance(sharing, dict), "sharing", "a dict or null, got %r" % (type(sharing).__name__,))
        configured = sharing.get("strategy")
        _need(configured in SHARING_STRATEGIES, "sharing.strategy",
              "one of %s, got %r" % (", ".join(SHARING_STRATEGIES), configured))
        self.rename_by_default = _check_bool(sharing.get("rename_by_default", False), "sharing.rename_by_default")
        resources = sharing.get("resources") or []
        _need(isinstance(resources, list), "sharing.resources", "a list, got %r" % (type(resources).__name__,))
        for i, resource in enumerate(resources):
            field = "sharing.resources[%d]" % i
            _need(isinstance(resource, dict), field, "a dict, got %r" % (type(resource).__name__,))
            name = _check_str(resource.get("name"), field + ".name")
            replicas = resource.get("replicas")
            _need(_is_int(replicas) and replicas > 0, field + ".replicas", "an integer > 0, got %r" % (replicas,))
            self.replicas[name] = replicas
        # SharingStrategy(): only a resource with replicas > 1 makes the node "shared".
        if any(r > 1 for r in self.replicas.values()):
            self.strategy = configured

    def replicas_for(self, resource):
        return self.replicas.get(resource, 1)

    def is_mps(self):
        return self.strategy == "mps"

    def renamed(self, resource):
        return self.rename_by_default and self.replicas_for(resource) > 1


def _mig_strategy(mig_strategy):
    _need(mig_strategy in MIG_STRATEGIES, "mig_strategy",
          "one of %s, got %r" % (", ".join(MIG_STRATEGIES), mig_strategy))
    return mig_strategy


def _invalid_single_reason(devices):
    """Why the device plugin refuses mig-strategy=single (assertAllMigDevicesAreValid), or None."""
    enabled = [d for d in devices if d["mig_enabled"]]
    if not enabled:
        return None
    for index, device in enumerate(devices):
        if device["mig_enabled"] and not device["mig_devices"]:
            return "device %d (%s) has no MIG devices configured" % (index, device["name"])
    if len(enabled) != len(devices):
        return "all devices on the node must be configured with the same migEnabled value"
    if len(set(m["profile"] for d in enabled for m in d["mig_devices"])) > 1:
        return "more than one MIG device type present on node"
    return None


# --- labels ---------------------------------------------------------------------------------


def _version_labels(facts):
    driver = _check_str(facts.get("driver_version"), "driver_version")
    parts = driver.split(".")
    if len(parts) not in (2, 3):
        raise LabelError("driver_version %r must have 2 or 3 dot-separated parts" % (driver,))
    revision = parts[2] if len(parts) == 3 else ""
    cuda = _check_int(facts.get("cuda_driver_version"), "cuda_driver_version")
    cuda_major, cuda_minor = str(cuda // 1000), str((cuda % 1000) // 10)
    return {
        "cuda.driver.major": parts[0], "cuda.driver.minor": parts[1], "cuda.driver.rev": revision,
        "cuda.driver-version.major": parts[0], "cuda.driver-version.minor": parts[1],
        "cuda.driver-version.revision": revision, "cuda.driver-version.full": driver,
        "cuda.runtime.major": cuda_major, "cuda.runtime.minor": cuda_minor,
        "cuda.runtime-version.major": cuda_major, "cuda.runtime-version.minor": cuda_minor,
        "cuda.runtime-version.full": "%s.%s" % (cuda_major, cuda_minor),
    }


def _architecture_labels(device, stem="gpu"):
    major, minor = device["compute_capability"]
    if major == 0:
        return {}
    return {stem + ".family": arch_family(major, minor), stem + ".compute.major": str(major),
            stem + ".compute.minor": str(minor)}


def _product(model, sharing, resource, *extra):
    parts = [model] + list(extra)
    if sharing.replicas_for(resource) > 1 and not sharing.renamed(resource):
        parts.append("SHARED")
    return "-".join(sanitise(p) for p in parts)


def _sharing_labels(stem, sharing, resource):
    replicas = sharing.replicas_for(resource)
    return {stem + ".replicas": str(replicas),
            stem + ".sharing-strategy": sharing.strategy if replicas > 1 else "none"}


def _full_gpu_labels(devices, sharing):
    """newGPULabelers: one set per model into the same keys, in our deterministic order."""
    counts = {}
    for device in devices:
        counts[device["name"]] = counts.get(device["name"], 0) + 1
    mig_enabled, full = {}, {}
    for device in devices:
        (mig_enabled if device["mig_enabled"] else full).setdefault(device["name"], device)

    def order(group):
        # Written in this order and the last one wins: most common model last, ties to the first name.
        by_name_descending = sorted(group.values(), key=lambda d: d["name"], reverse=True)
        return sorted(by_name_descending, key=lambda d: counts[d["name"]])

    labels = {}
    for device in order(mig_enabled) + order(full):
        labels["gpu.count"] = str(counts[device["name"]])
        if device["memory_mib"]:
            labels["gpu.memory"] = str(device["memory_mib"])
        labels.update(_architecture_labels(device))
        if device["mig_enabled"]:
            # Sharing never applies to a MIG-enabled parent.
            labels["gpu.product"] = sanitise(device["name"])
            labels["gpu.replicas"] = "0"
            labels["gpu.sharing-strategy"] = "none"
        else:
            labels["gpu.product"] = _product(device["name"], sharing, GPU_RESOURCE)
            labels.update(_sharing_labels("gpu", sharing, GPU_RESOURCE))
    return labels


def _mig_set(stem, parent, mig_devices, sharing, resource):
    first = mig_devices[0]
    labels = {
        stem + ".count": str(len(mig_devices)),
        stem + ".product": _product(parent["name"], sharing, resource, "MIG", first["profile"].replace("+", ".")),
        stem + ".memory": str(first["memory_mb"]),
    }
    labels.update(_sharing_labels(stem, sharing, resource))
    for label, key in MIG_ATTRIBUTE_LABELS:
        labels["%s.%s" % (stem, label)] = str(first[key])
    return labels


def _mig_strategy_labels(devices, mig_strategy, sharing):
    if mig_strategy == "none":
        return {}
    labels = {"mig.strategy": mig_strategy}
    enabled = [d for d in devices if d["mig_enabled"]]
    if mig_strategy == "single":
        if not enabled:
            return labels
        if _invalid_single_reason(devices):
            labels.update({"gpu.product": sanitise(enabled[0]["name"]) + "-MIG-INVALID", "gpu.count": "0",
                           "gpu.replicas": "0", "gpu.sharing-strategy": "", "gpu.memory": "0"})
            return labels
        mig_devices = [m for d in enabled for m in d["mig_devices"]]
        labels.update(_mig_set("gpu", enabled[0], mig_devices, sharing, GPU_RESOURCE))
        return labels
    # mixed: one set per profile; MIG-enabled GPUs without MIG devices add nothing.
    by_profile = {}
    for device in enabled:
        for mig in device["mig_devices"]:
            by_profile.setdefault(mig["profile"], (device, []))[1].append(mig)
    for profile in sorted(by_profile):
        parent, migs = by_profile[profile]
        resource = mig_resource_name(profile)
        labels.update(_mig_set(resource, parent, migs, sharing, PREFIX + resource))
    return labels


def _mode_label(devices):
    classes = set(d["pci_class"] for d in devices)
    if classes == set([PCI_CLASS_VGA]):
        return "graphics"
    if classes == set([PCI_CLASS_3D]):
        return "compute"
    return "unknown"


def _clique_labels(devices):
    attached = [d["fabric"] for d in devices
                if d["fabric"] and d["fabric"]["attached"] and (d["fabric"]["cluster_uuid"] or "").strip("0-")]
    uuids = set(f["cluster_uuid"].lower() for f in attached)
    cliques = set(f["clique_id"] for f in attached)
    if len(uuids) != 1 or len(cliques) != 1:
        # No fabric, or GPUs disagree: GFD warns and writes no clique label.
        return {}
    return {"gpu.clique": "%s.%d" % (uuids.pop(), cliques.pop())}


def _vgpu_labels(facts):
    vgpus = facts.get("vgpu_devices", [])
    if vgpus is None:
        return {}
    _need(isinstance(vgpus, list), "vgpu_devices", "a list or null, got %r" % (type(vgpus).__name__,))
    labels = {"vgpu.present": "true" if vgpus else "false"}
    for index, vgpu in enumerate(vgpus):
        field = "vgpu_devices[%d]" % index
        _need(isinstance(vgpu, dict), field, "a dict, got %r" % (type(vgpu).__name__,))
        # GFD walks every vGPU device; the last one's host-driver record wins.
        labels["vgpu.host-driver-version"] = _check_str(vgpu.get("host_driver_version", ""),
                                                        field + ".host_driver_version")
        labels["vgpu.host-driver-branch"] = _check_str(vgpu.get("host_driver_branch", ""),
                                                       field + ".host_driver_branch")
    return labels


def gfd_labels(facts, mig_strategy="none", sharing=None, timestamp=False):
    """The labels GFD v0.20.0 writes for these facts, as a dict of str -> str.

    Raises LabelError for malformed input and where GFD itself refuses to label (MPS sharing
    with a MIG-enabled GPU, a driver version without 2 or 3 parts)."""
    devices = _devices(facts)
    mig_strategy = _mig_strategy(mig_strategy)
    sharing = _Sharing(sharing)
    timestamp = _check_bool(timestamp, "timestamp")
    labels = {}
    if timestamp:
        labels["gfd.timestamp"] = str(int(time.time()))
    if devices:
        # Same order as NewDeviceLabeler; a later labeler overwrites an earlier one's keys.
        machine = _check_str(facts.get("machine_type"), "machine_type", optional=True)
        labels["gpu.machine"] = "unknown" if machine is None else sanitise(machine.strip())
        labels.update(_version_labels(facts))
        labels["mig.capable"] = "true" if any(d["mig_capable"] for d in devices) else "false"
        mps_capable = "false"
        if sharing.is_mps():
            if any(d["mig_enabled"] for d in devices):
                raise LabelError(MPS_ON_MIG_ERROR)
            mps_capable = "true"
        labels["mps.capable"] = mps_capable
        labels.update(_full_gpu_labels(devices, sharing))
        labels.update(_mig_strategy_labels(devices, mig_strategy, sharing))
        labels["gpu.mode"] = _mode_label(devices)
        labels.update(_clique_labels(devices))
    labels.update(_vgpu_labels(facts))
    return dict((PREFIX + key, value) for key, value in labels.items())


# --- device plugin --------------------------------------------------------------------------


def plugin_devices(facts, mig_strategy="none", sharing=None):
    """The devices the device plugin v0.20.0 advertises: dict resource name -> list of device IDs
    (the GPU or MIG UUID; with replicas ``<uuid>::<n>``). Devices without a UUID in the facts get
    ``GPU-<index>`` / ``MIG-<index>-<slot>``.

    Raises LabelError with the plugin's reason where it refuses to start (invalid MIG single
    configuration, MPS with MIG) and for malformed input."""
    devices = _devices(facts)
    mig_strategy = _mig_strategy(mig_strategy)
    sharing = _Sharing(sharing)
    if sharing.is_mps():
        if mig_strategy == "mixed":
            raise LabelError("MPS sharing is not supported with mig-strategy=mixed")
        if any(d["mig_enabled"] for d in devices):
            raise LabelError(PLUGIN_MPS_ON_MIG_ERROR)
    if mig_strategy == "single":
        reason = _invalid_single_reason(devices)
        if reason:
            raise LabelError(PLUGIN_REFUSES_SINGLE + ": " + reason)
    physical = {}
    for index, device in enumerate(devices):
        gpu_id = device["uuid"] or "GPU-%d" % index
        if mig_strategy == "none" or not device["mig_enabled"]:
            physical.setdefault(GPU_RESOURCE, []).append(gpu_id)
            continue
        for slot, mig in enumerate(device["mig_devices"]):
            mig_id = mig["uuid"] or "MIG-%d-%d" % (index, slot)
            if mig_strategy == "single":
                physical.setdefault(GPU_RESOURCE, []).append(mig_id)
            elif not SUBSLICED_PROFILE_RE.match(mig["profile"]):
                physical.setdefault(PREFIX + mig_resource_name(mig["profile"]), []).append(mig_id)
    resources = {}
    for name, ids in physical.items():
        advertised = name + ".shared" if sharing.renamed(name) else name
        replicas = sharing.replicas_for(name)
        if replicas > 1:
            ids = ["%s::%d" % (device_id, n) for device_id in ids for n in range(replicas)]
        resources[advertised] = ids
    return resources


def expected_node_resources(facts, mig_strategy="none", sharing=None):
    """What the device plugin v0.20.0 advertises for these facts: dict resource name -> count
    (see plugin_devices)."""
    return dict((name, len(ids)) for name, ids in plugin_devices(facts, mig_strategy, sharing).items())
