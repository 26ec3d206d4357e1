# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Facts about a node's NVIDIA GPUs: hardware from sysfs, the rest from NVML.

Plain Python, no Ansible. NVML is reached through nvidia-ml-py (import name ``pynvml``), which
loads ``libnvidia-ml.so.1`` with ctypes at ``nvmlInit()``. Every NVML quirk is handled here:

* a missing library, a driver that is not loaded or a missing ``pynvml`` are reasons, not crashes;
* a call a GPU does not support (``NOT_SUPPORTED``, for example MIG on Pascal) or a symbol an old
  driver lacks (``FUNCTION_NOT_FOUND``) is data: the field gets its "not there" value;
* NVML reports memory in bytes (facts are MiB) and PCI bus ids as ``00000000:3B:00.0`` (sysfs
  names the function ``0000:3b:00.0``).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ctypes
import glob
import grp
import math
import os
import pwd
import re
import stat

try:
    import pynvml
    HAS_PYNVML = True
    PYNVML_IMPORT_ERROR = None
except ImportError as exc:  # pragma: no cover - depends on the node
    pynvml = None
    HAS_PYNVML = False
    PYNVML_IMPORT_ERROR = str(exc)

NVIDIA_VENDOR = '0x10de'
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
FABRIC_STATE_COMPLETED = 3
PCI_STATUS_CAP_LIST = 0x10
PCI_CAP_ID_VENDOR = 0x09
VGPU_FIELD_LENGTH = 10
MIB = 1024 * 1024
GIB = 1024 * MIB
# MIG fact -> nvmlDeviceAttributes_t field
MIG_ATTRIBUTES = {
    'memory_mb': 'memorySizeMB', 'multiprocessors': 'multiprocessorCount',
    'gi_slices': 'gpuInstanceSliceCount', 'ci_slices': 'computeInstanceSliceCount',
    'copy_engines': 'sharedCopyEngineCount', 'decoders': 'sharedDecoderCount',
    'encoders': 'sharedEncoderCount', 'jpeg': 'sharedJpegCount', 'ofa': 'sharedOfaCount',
}
# NVML_GPU_INSTANCE_PROFILE_* ids whose profile names carry an attribute (go-nvlib's naming)
GI_PROFILE_SUFFIXES = {
    0x7: '+me', 0x8: '+me', 0xA: '+gfx', 0xB: '+gfx', 0xC: '+gfx', 0x11: '+gfx',
    0xD: '-me', 0xE: '-me', 0xF: '+me.all', 0x10: '+me.all',
}
# Errors that mean "this GPU or driver does not have it", not "NVML is broken".
DATA_ERRORS = (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND)
STATIC_NODES = ('/dev/nvidiactl', '/dev/nvidia-uvm', '/dev/nvidia-uvm-tools')
PROC_VERSION = '/proc/driver/nvidia/version'


def _read(path):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except (IOError, OSError, UnicodeDecodeError):
        return None


def normalize_bus_id(bus_id):
    """``00000000:3B:00.0`` (NVML) or ``0000:3b:00.0`` (sysfs) -> ``0000:3b:00.0``."""
    if not bus_id:
        return None
    match = re.match(r'^([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-7])$', bus_id.strip())
    if not match:
        return bus_id.strip().lower()
    domain, bus, device, function = match.groups()
    return '%04x:%02x:%02x.%s' % (int(domain, 16) & 0xffff, int(bus, 16), int(device, 16), function)


def sysfs_gpus(sysfs_root='/sys'):
    """NVIDIA display-class PCI functions (vendor 0x10de, class 0x03xxxx): {bus id: info}."""
    found = {}
    for path in sorted(glob.glob(os.path.join(sysfs_root, 'bus', 'pci', 'devices', '*'))):
        vendor = (_read(os.path.join(path, 'vendor')) or '').lower()
        pci_class = (_read(os.path.join(path, 'class')) or '').lower()
        if vendor != NVIDIA_VENDOR or not pci_class.startswith('0x03'):
            continue
        found[normalize_bus_id(os.path.basename(path))] = {
            'pci_class': pci_class,
            'pci_device_id': (_read(os.path.join(path, 'device')) or '').lower() or None,
        }
    return found


def vendor_capability(config):
    """The vendor-specific capability (id 0x09) in a PCI function's config space bytes, or None.
    Raises ValueError where the capability list runs past what could be read (unprivileged reads of
    sysfs ``config`` stop at 64 bytes)."""
    if len(config) < 0x40 or not config[0x06] & PCI_STATUS_CAP_LIST:
        return None
    pointer, seen = config[0x34] & 0xfc, set()
    while pointer:
        if pointer in seen or pointer + 3 > len(config):
            raise ValueError('capability list at 0x%02x is unreadable or loops' % pointer)
        seen.add(pointer)
        if config[pointer] == PCI_CAP_ID_VENDOR:
            return config[pointer:pointer + config[pointer + 2]]
        pointer = config[pointer + 1] & 0xfc
    return None


def vgpu_host_driver(capability):
    """(host driver version, branch) from a vGPU vendor capability: "VF" at bytes 3-4, then
    records (id, length, payload) from byte 5; record 0 holds two NUL-padded 10-byte fields."""
    position = 5
    while position < len(capability) and capability[position] != 0:
        if position + 2 > len(capability) or capability[position + 1] < 2:
            raise ValueError('malformed vGPU capability record at byte %d' % position)
        position += capability[position + 1]
    end = position + 2 + 2 * VGPU_FIELD_LENGTH
    if position + 2 > len(capability) or capability[position + 1] < end - position or end > len(capability):
        raise ValueError('no complete host driver record in the vGPU capability')
    version = capability[position + 2:position + 2 + VGPU_FIELD_LENGTH]
    branch = capability[position + 2 + VGPU_FIELD_LENGTH:end]
    return (bytes(version).strip(b'\0').decode('ascii', 'replace'),
            bytes(branch).strip(b'\0').decode('ascii', 'replace'))


def vgpu_devices(sysfs_root='/sys'):
    """vGPU functions (as GFD finds them, from PCI config space): a list of {pci_bus_id,
    host_driver_version, host_driver_branch}, or None when some NVIDIA function's config space
    could not be read or parsed (GFD then writes no vgpu labels)."""
    found = []
    for path in sorted(glob.glob(os.path.join(sysfs_root, 'bus', 'pci', 'devices', '*'))):
        if (_read(os.path.join(path, 'vendor')) or '').lower() != NVIDIA_VENDOR:
            continue
        try:
            with open(os.path.join(path, 'config'), 'rb') as handle:
                capability = vendor_capability(bytearray(handle.read()))
            if capability is None or bytes(capability[3:5]) != b'VF':
                continue
            version, branch = vgpu_host_driver(capability)
        except (IOError, OSError, ValueError):
            return None
        found.append({'pci_bus_id': normalize_bus_id(os.path.basename(path)),
                      'host_driver_version': version, 'host_driver_branch': branch})
    return found


def kernel_module(sysfs_root='/sys', proc_version=PROC_VERSION):
    """nvidia kernel module: loaded, version (/proc/driver/nvidia/version), nouveau loaded."""
    version = None
    text = _read(proc_version)
    if text:
        match = re.search(r'Kernel Module(?: for [^ ]+)?\s+([0-9][0-9.]*)', text)
        if match:
            version = match.group(1)
    if version is None:
        version = _read(os.path.join(sysfs_root, 'module', 'nvidia', 'version'))
    return {
        'loaded': os.path.isdir(os.path.join(sysfs_root, 'module', 'nvidia')),
        'version': version,
        'nouveau_loaded': os.path.isdir(os.path.join(sysfs_root, 'module', 'nouveau')),
    }


def _owner(info):
    try:
        user = pwd.getpwuid(info.st_uid).pw_name
    except KeyError:
        user = str(info.st_uid)
    try:
        group = grp.getgrgid(info.st_gid).gr_name
    except KeyError:
        group = str(info.st_gid)
    return '%s:%s' % (user, group)


def device_nodes(dev_root='/dev'):
    """{path: {exists, mode, owner}} for /dev/nvidia<N>, nvidiactl, nvidia-uvm, nvidia-uvm-tools."""
    paths = [os.path.join(dev_root, os.path.basename(p)) for p in STATIC_NODES]
    numbered = [p for p in glob.glob(os.path.join(dev_root, 'nvidia*')) if re.search(r'/nvidia[0-9]+$', p)]
    paths.extend(sorted(numbered, key=lambda p: int(re.search(r'([0-9]+)$', p).group(1))))
    nodes = {}
    for path in paths:
        try:
            info = os.stat(path)
        except OSError:
            nodes[path] = {'exists': False, 'mode': None, 'owner': None}
            continue
        nodes[path] = {'exists': True, 'mode': '%04o' % stat.S_IMODE(info.st_mode), 'owner': _owner(info)}
    return nodes


def _code(exc):
    return getattr(exc, 'value', None)


def _text(value):
    if isinstance(value, bytes):
        return value.decode('utf-8', 'replace')
    return value


def _optional(call, *args):
    """(value, None) or (None, code) for a "not supported" answer; other NVML errors raise."""
    try:
        return call(*args), None
    except lib_error() as exc:
        if _code(exc) in DATA_ERRORS:
            return None, _code(exc)
        raise


_NVML = {'lib': None}


def lib_error():
    lib = _NVML['lib']
    return getattr(lib, 'NVMLError', Exception) if lib is not None else Exception


def init_error_reason(exc):
    """A precise reason for an nvmlInit failure."""
    code = _code(exc)
    text = str(exc)
    if code == NVML_ERROR_LIBRARY_NOT_FOUND:
        return 'NVML library not found (libnvidia-ml.so.1 could not be loaded: %s)' % text
    if code == NVML_ERROR_DRIVER_NOT_LOADED:
        return 'NVIDIA driver not loaded (NVML: %s)' % text
    if code == NVML_ERROR_NO_PERMISSION:
        return 'no permission to use NVML (%s)' % text
    if code == NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return 'NVML library and kernel driver versions differ (%s); reboot or reload the driver' % text
    if code == NVML_ERROR_FUNCTION_NOT_FOUND:
        return 'NVML library too old (%s)' % text
    return 'NVML initialization failed: %s (code %s)' % (text, code)


def mig_memory_gb(parent_memory_bytes, mig_memory_mb):
    """The "<N>gb" of a MIG profile name: the MIG's share of the parent's memory rounded up to an
    eighth, times the parent's memory in whole GiB rounded up (go-nvlib's rule, so the names match
    GFD's and the device plugin's)."""
    fraction = math.ceil(mig_memory_mb * MIB / float(parent_memory_bytes) * 8) / 8.0
    total_gb = (parent_memory_bytes + GIB - 1) // GIB
    return int(math.floor(fraction * total_gb + 0.5))  # Go's math.Round: halves away from zero


def mig_profile_name(gi_slices, ci_slices, memory_gb, gi_profile_id=None):
    """``1g.5gb``, ``1c.3g.20gb`` (compute instance smaller than its GPU instance), ``1g.10gb+me``."""
    name = "%dg.%dgb" % (gi_slices, memory_gb)
    if ci_slices != gi_slices:
        name = "%dc.%s" % (ci_slices, name)
    return name + GI_PROFILE_SUFFIXES.get(gi_profile_id, "")


def _gpu_instance_profile_id(lib, parent, mig):
    """The GPU instance profile id behind a MIG device, or None where NVML will not say (reading
    GPU instances can need privileges a MIG device handle does not)."""
    try:
        instance = lib.nvmlDeviceGetGpuInstanceById(parent, lib.nvmlDeviceGetGpuInstanceId(mig))
        return int(lib.nvmlGpuInstanceGetInfo(instance).profileId)
    except lib_error() as exc:
        if _code(exc) in DATA_ERRORS + (NVML_ERROR_NO_PERMISSION, NVML_ERROR_NOT_FOUND):
            return None
        raise


def _mig_device(lib, parent, parent_memory, slot, mig):
    uuid, dummy = _optional(lib.nvmlDeviceGetUUID, mig)
    attributes, dummy = _optional(lib.nvmlDeviceGetAttributes, mig)
    fact = {'index': slot, 'uuid': _text(uuid), 'profile': None}
    for key in MIG_ATTRIBUTES:
        fact[key] = None
    if attributes is None:
        return fact
    for key, field in MIG_ATTRIBUTES.items():
        fact[key] = int(getattr(attributes, field))
    if parent_memory:
        fact['profile'] = mig_profile_name(fact['gi_slices'], fact['ci_slices'],
                                           mig_memory_gb(parent_memory, fact['memory_mb']),
                                           _gpu_instance_profile_id(lib, parent, mig))
    return fact


def _mig(lib, handle, memory):
    """(mig_capable, mig_enabled, mig_devices). MigMode NOT_SUPPORTED means not capable."""
    mode, missing = _optional(lib.nvmlDeviceGetMigMode, handle)
    if missing is not None or not mode:
        return False, False, []
    enabled = bool(mode[0])
    mig_devices = []
    if enabled:
        count, missing = _optional(lib.nvmlDeviceGetMaxMigDeviceCount, handle)
        for slot in range(count or 0):
            try:
                mig = lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except lib_error() as exc:
                if _code(exc) in DATA_ERRORS + (NVML_ERROR_NOT_FOUND, NVML_ERROR_INVALID_ARGUMENT):
                    continue  # an empty slot
                raise
            mig_devices.append(_mig_device(lib, handle, memory.total if memory is not None else None, slot, mig))
    return True, enabled, mig_devices


def _format_uuid(raw):
    digits = "".join("%02x" % b for b in bytearray(raw))
    return "-".join((digits[:8], digits[8:12], digits[12:16], digits[16:20], digits[20:32]))


def _fabric(lib, handle):
    """{cluster_uuid, clique_id, attached} from nvmlDeviceGetGpuFabricInfoV (the unversioned call on
    drivers without it); None where the GPU has no fabric (NOT_SUPPORTED)."""
    calls = []
    if hasattr(lib, 'c_nvmlGpuFabricInfoV_t'):
        calls.append((lib.nvmlDeviceGetGpuFabricInfoV, lib.c_nvmlGpuFabricInfoV_t))
    if hasattr(lib, 'c_nvmlGpuFabricInfo_t'):
        calls.append((lib.nvmlDeviceGetGpuFabricInfo, lib.c_nvmlGpuFabricInfo_t))
    for call, structure in calls:
        info = structure()
        try:
            call(handle, ctypes.byref(info))  # pynvml passes this argument through as given
        except lib_error() as exc:
            if _code(exc) in (NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_ARGUMENT_VERSION_MISMATCH):
                continue  # an older driver: try the older call
            if _code(exc) in DATA_ERRORS:
                return None
            raise
        return {
            'cluster_uuid': _format_uuid(info.clusterUuid),
            'clique_id': int(info.cliqueId),
            'attached': int(info.state) & 0xff == FABRIC_STATE_COMPLETED and int(info.status) == 0,
        }
    return None


def _device(lib, index, hardware):
    handle = lib.nvmlDeviceGetHandleByIndex(index)
    pci, dummy = _optional(lib.nvmlDeviceGetPciInfo, handle)
    bus_id = _text(pci.busId) if pci is not None else None
    minor, dummy = _optional(lib.nvmlDeviceGetMinorNumber, handle)
    memory, dummy = _optional(lib.nvmlDeviceGetMemoryInfo, handle)
    capability, dummy = _optional(lib.nvmlDeviceGetCudaComputeCapability, handle)
    uuid, dummy = _optional(lib.nvmlDeviceGetUUID, handle)
    mig_capable, mig_enabled, mig_devices = _mig(lib, handle, memory)
    sysfs = hardware.get(normalize_bus_id(bus_id), {})
    return {
        'index': index,
        'name': _text(lib.nvmlDeviceGetName(handle)),
        'uuid': _text(uuid),
        'pci_bus_id': bus_id,
        'minor_number': minor,
        'memory_mib': int(memory.total // MIB) if memory is not None else None,
        'compute_capability': [int(capability[0]), int(capability[1])] if capability else None,
        'mig_capable': mig_capable,
        'mig_enabled': mig_enabled,
        'mig_devices': mig_devices,
        'pci_class': sysfs.get('pci_class'),
        'fabric': _fabric(lib, handle),
    }


def nvml_facts(lib, hardware):
    """The NVML part of the facts; ``lib`` is the pynvml module (or a stand-in)."""
    facts = {'nvml_ok': False, 'error': None, 'count': 0, 'driver_version': None,
             'cuda_driver_version': None, 'nvml_version': None, 'devices': []}
    if lib is None:
        facts['error'] = 'nvidia-ml-py is not installed (Python module pynvml: %s)' % (
            PYNVML_IMPORT_ERROR or 'not importable')
        return facts
    _NVML['lib'] = lib
    try:
        lib.nvmlInit()
    except lib_error() as exc:
        facts['error'] = init_error_reason(exc)
        return facts
    try:
        facts['driver_version'] = _text(lib.nvmlSystemGetDriverVersion())
        facts['nvml_version'] = _text(_optional(lib.nvmlSystemGetNVMLVersion)[0])
        facts['cuda_driver_version'] = _optional(lib.nvmlSystemGetCudaDriverVersion)[0]
        count = lib.nvmlDeviceGetCount()
        facts['devices'] = [_device(lib, index, hardware) for index in range(count)]
        facts['count'] = count
        facts['nvml_ok'] = True
    except lib_error() as exc:
        facts['error'] = 'NVML query failed: %s (code %s)' % (exc, _code(exc))
    finally:
        try:
            lib.nvmlShutdown()
        except lib_error():
            pass
    return facts


def gather(sysfs_root='/sys', dmi_product_file='/sys/class/dmi/id/product_name', lib=None, use_pynvml=True,
           dev_root='/dev', proc_version=PROC_VERSION):
    """All the facts (ansible_facts.nvidia_gpu). ``lib`` defaults to the imported pynvml."""
    if lib is None and use_pynvml:
        lib = pynvml
    hardware = sysfs_gpus(sysfs_root)
    facts = {'present': bool(hardware)}
    facts.update(nvml_facts(lib, hardware))
    facts['vgpu_devices'] = vgpu_devices(sysfs_root)
    facts['machine_type'] = _read(dmi_product_file)
    facts['device_nodes'] = device_nodes(dev_root)
    facts['kernel_module'] = kernel_module(sysfs_root, proc_version)
    return facts
