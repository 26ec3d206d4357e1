#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: nvidia_gpu_facts
short_description: Gather facts about a node's NVIDIA GPUs, driver and NVML
version_added: 0.1.0
description:
  - Sets RV(ansible_facts.nvidia_gpu) with what a GPU node looks like. Whether NVIDIA GPU hardware is there
    (from sysfs, independent of the driver), what NVML reports (driver and CUDA versions, one entry per GPU),
    the C(/dev/nvidia*) device nodes and the kernel module.
  - NVIDIA hardware is a PCI function with vendor C(0x10de) and a display class C(0x03xxxx).
  - A node without NVIDIA hardware is not an error (RV(ansible_facts.nvidia_gpu.present=false)). A node with
    hardware where NVML cannot be used (library not found, driver not loaded, nvidia-ml-py missing, ...) is not
    an error either, unless O(fail_on_error=true); RV(ansible_facts.nvidia_gpu.error) says why.
  - A query a GPU does not support (for example MIG mode on a Pascal GPU) is data, not an error.
author: gpuready.nvidia contributors (!UNKNOWN)
extends_documentation_fragment:
  - gpuready.nvidia.attributes
attributes:
  check_mode:
    support: full
    details: The module only reads.
  diff_mode:
    support: none
  action:
    support: none
requirements:
  - nvidia-ml-py >= 12.550.52 (node, import name C(pynvml); older releases lack the fabric clique field); without it only
    the sysfs, device node and kernel module facts are set
options:
  sysfs_root:
    description: Where sysfs is mounted; PCI functions are read from C(<sysfs_root>/bus/pci/devices).
    type: path
    default: /sys
  dmi_product_file:
    description: File holding the DMI product name, reported as RV(ansible_facts.nvidia_gpu.machine_type).
    type: path
    default: /sys/class/dmi/id/product_name
  fail_on_error:
    description: Fail when NVIDIA hardware is present but NVML cannot be used.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Gather NVIDIA GPU facts
  gpuready.nvidia.nvidia_gpu_facts:

- name: Require a working driver on GPU nodes
  gpuready.nvidia.nvidia_gpu_facts:
    fail_on_error: true

- name: Show the GPUs
  ansible.builtin.debug:
    msg: "{{ ansible_facts.nvidia_gpu.count }} x {{ ansible_facts.nvidia_gpu.devices | map(attribute='name') | list }}"
  when: ansible_facts.nvidia_gpu.nvml_ok
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to ansible_facts.
  returned: always
  type: dict
  contains:
    nvidia_gpu:
      description: The node's NVIDIA GPU facts.
      returned: always
      type: dict
      contains:
        present:
          description: Whether sysfs shows NVIDIA GPU hardware (vendor 0x10de, class 0x03xxxx), with or without a driver.
          type: bool
          returned: always
        nvml_ok:
          description: Whether NVML was initialized and answered.
          type: bool
          returned: always
        error:
          description: Why NVML could not be used (library not found, driver not loaded, nvidia-ml-py not installed, ...), else null.
          type: str
          returned: always
          sample: NVIDIA driver not loaded (NVML Driver Not Loaded)
        count:
          description: Number of GPUs NVML reports (0 without NVML).
          type: int
          returned: always
          sample: 4
        driver_version:
          description: Driver version from NVML.
          type: str
          returned: always
          sample: 535.183.01
        cuda_driver_version:
          description: CUDA version the driver supports, as NVML returns it (1000 x major + 10 x minor).
          type: int
          returned: always
          sample: 12020
        nvml_version:
          description: NVML library version.
          type: str
          returned: always
          sample: 12.535.183.01
        machine_type:
          description: DMI product name (O(dmi_product_file), surrounding whitespace removed), or null when unreadable.
          type: str
          returned: always
          sample: PowerEdge R740
        devices:
          description:
            - One entry per GPU in NVML order. A value the GPU or driver does not report is null.
            - These names are the input of the P(gpuready.nvidia.gfd_labels#filter) and
              P(gpuready.nvidia.gpu_resources#filter) filters.
          type: list
          elements: dict
          returned: always
          contains:
            index:
              description: NVML index.
              type: int
            name:
              description: Product name from NVML.
              type: str
              sample: Tesla P4
            uuid:
              description: GPU UUID.
              type: str
              sample: GPU-5d2c1e3a-0b6f-4c1e-9a7d-3f8e2b1c4d5e
            pci_bus_id:
              description: PCI bus id as NVML writes it.
              type: str
              sample: "00000000:3B:00.0"
            minor_number:
              description: The N of C(/dev/nvidia<N>).
              type: int
            memory_mib:
              description: Total memory in MiB (NVML bytes divided by 2^20 and rounded down).
              type: int
              sample: 7611
            compute_capability:
              description: CUDA compute capability C([major, minor]).
              type: list
              elements: int
              sample: [6, 1]
            mig_capable:
              description: Whether NVML answers MIG mode for the GPU (C(NOT_SUPPORTED) means not capable).
              type: bool
            mig_enabled:
              description: Whether MIG mode is on now (the current, not the pending, mode).
              type: bool
            mig_devices:
              description:
                - The MIG devices of a MIG-enabled GPU, empty otherwise.
                - C(profile) is named as the device plugin and GFD name it, for example C(1g.5gb),
                  C(1c.3g.20gb) or C(1g.10gb+me); null where NVML gives no attributes for the MIG device.
              type: list
              elements: dict
              contains:
                index:
                  description: Slot of the MIG device under its GPU.
                  type: int
                uuid:
                  description: MIG device UUID.
                  type: str
                profile:
                  description: MIG profile name.
                  type: str
                  sample: 1g.5gb
                memory_mb:
                  description: Memory of the MIG device in MiB (NVML's C(memorySizeMB)).
                  type: int
                multiprocessors:
                  description: Streaming multiprocessors.
                  type: int
                gi_slices:
                  description: GPU instance slices.
                  type: int
                ci_slices:
                  description: Compute instance slices.
                  type: int
                copy_engines:
                  description: Shared copy engines.
                  type: int
                decoders:
                  description: Shared decoders.
                  type: int
                encoders:
                  description: Shared encoders.
                  type: int
                jpeg:
                  description: Shared JPEG engines.
                  type: int
                ofa:
                  description: Shared optical flow accelerators.
                  type: int
            pci_class:
              description: PCI class from sysfs (C(0x030200) 3D controller, C(0x030000) VGA), or null.
              type: str
              sample: "0x030200"
            fabric:
              description:
                - NVLink fabric membership from C(nvmlDeviceGetGpuFabricInfoV), null where the GPU has none.
                - C(attached) is true when fabric registration completed successfully.
              type: dict
              contains:
                cluster_uuid:
                  description: Fabric cluster UUID.
                  type: str
                clique_id:
                  description: Fabric clique id.
                  type: int
                attached:
                  description: Whether the GPU is attached to the fabric.
                  type: bool
        vgpu_devices:
          description:
            - The node's vGPU functions (a VM guest's GPUs), found as GFD finds them, from the NVIDIA
              vendor capability in PCI config space (which needs root to read beyond 64 bytes).
            - Empty on bare metal; null when some NVIDIA function's config space could not be read,
              in which case GFD writes no C(nvidia.com/vgpu.*) labels.
          type: list
          elements: dict
          returned: always
          contains:
            pci_bus_id:
              description: The function's PCI address (sysfs form).
              type: str
              sample: "0000:02:00.0"
            host_driver_version:
              description: The hypervisor's vGPU manager driver version.
              type: str
              sample: 550.54.16
            host_driver_branch:
              description: The hypervisor's driver branch.
              type: str
              sample: r550_40
        device_nodes:
          description: C(/dev/nvidia<N>), C(/dev/nvidiactl), C(/dev/nvidia-uvm), C(/dev/nvidia-uvm-tools), each with C(exists), C(mode) and C(owner).
          type: dict
          returned: always
        kernel_module:
          description: C(loaded) (nvidia), C(version) (from C(/proc/driver/nvidia/version)) and C(nouveau_loaded).
          type: dict
          returned: always
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuready.nvidia.plugins.module_utils import nvml


def main():
    module = AnsibleModule(
        argument_spec=dict(
            sysfs_root=dict(type='path', default='/sys'),
            dmi_product_file=dict(type='path', default='/sys/class/dmi/id/product_name'),
            fail_on_error=dict(type='bool', default=False),
        ),
        supports_check_mode=True,
    )
    facts = nvml.gather(sysfs_root=module.params['sysfs_root'], dmi_product_file=module.params['dmi_product_file'])
    if module.params['fail_on_error'] and facts['present'] and not facts['nvml_ok']:
        module.fail_json(msg='NVIDIA GPU present but NVML unusable: %s' % facts['error'],
                         ansible_facts=dict(nvidia_gpu=facts))
    module.exit_json(changed=False, ansible_facts=dict(nvidia_gpu=facts))


if __name__ == '__main__':
    main()
