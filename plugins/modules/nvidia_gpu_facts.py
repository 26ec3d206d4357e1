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
  - nvidia-ml-py (node, import name C(pynvml)); without it only the sysfs, device node and kernel module facts are set
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
          description: DMI product name (O(dmi_product_file)), or null.
          type: str
          returned: always
          sample: PowerEdge R740
        devices:
          description:
            - One entry per GPU, with keys C(index), C(name), C(uuid), C(pci_bus_id) (as NVML writes it),
              C(minor_number), C(memory_mib), C(compute_capability) (C([major, minor])), C(mig_capable),
              C(mig_enabled), C(mig_devices) (C(index), C(uuid), C(memory_mib) of each MIG device) and
              C(pci_class) (from sysfs).
            - A value the GPU does not report is null.
          type: list
          elements: dict
          returned: always
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
