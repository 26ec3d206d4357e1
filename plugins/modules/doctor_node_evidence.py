#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: doctor_node_evidence
short_description: Read what a GPU node shows about the driver, NVML, device nodes, toolkit, containerd and kubelet
version_added: 0.1.0
description:
  - The node half of the doctor (M(gpuready.nvidia.k8s_gpu_doctor) judges it). Reads, and changes nothing,
    the NVIDIA kernel module, nouveau and the PCI GPUs from sysfs, NVML through pynvml, the C(/dev/nvidia*) device
    nodes, the NVIDIA Container Toolkit binaries (and every C(BinaryName) the containerd
    config names), the containerd config file and the drop-ins its C(imports) match, the containerd service and what
    its CRI plugin has loaded, the kubelet config and its device-plugins folder.
  - A missing library (pynvml, grpcio) or file is evidence, not an error; the module fails only on bad options.
  - The TOML is not parsed here (the node may lack a TOML library); RV(evidence) carries the files' text.
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
options:
  sysfs_root:
    description: Where sysfs is mounted (the PCI devices and kernel modules are read under it).
    type: path
    default: /sys
  dmi_product_file:
    description: File holding the DMI product name.
    type: path
    default: /sys/class/dmi/id/product_name
  dev_root:
    description: Where the device nodes are.
    type: path
    default: /dev
  containerd_service:
    description: The systemd unit that runs containerd.
    type: str
    default: containerd
  containerd_socket:
    description: containerd's CRI socket.
    type: path
    default: /run/containerd/containerd.sock
  containerd_config:
    description: containerd's main config file.
    type: path
    default: /etc/containerd/config.toml
  kubelet_config:
    description: The kubelet's config file (C(cgroupDriver) is read from it).
    type: path
    default: /var/lib/kubelet/config.yaml
  kubelet_root_dir:
    description: The kubelet's C(--root-dir); its C(device-plugins) folder is listed.
    type: path
    default: /var/lib/kubelet
  runtime_name:
    description: The NVIDIA runtime's name in containerd.
    type: str
    default: nvidia
requirements:
  - nvidia-ml-py (node, import name C(pynvml)) and grpcio (node) for the NVML and CRI evidence; without them that
    evidence says the library is missing
notes:
  - Run it with C(become=true); the device-plugins folder and the containerd socket are root's.
seealso:
  - module: gpuready.nvidia.k8s_gpu_doctor
  - module: gpuready.nvidia.nvidia_gpu_facts
"""

EXAMPLES = r"""
- name: Read the node's side of the chain
  gpuready.nvidia.doctor_node_evidence:
  become: true
  register: node_evidence

- name: On k3s
  gpuready.nvidia.doctor_node_evidence:
    containerd_service: k3s-agent
    containerd_socket: /run/k3s/containerd/containerd.sock
    containerd_config: /var/lib/rancher/k3s/agent/etc/containerd/config.toml
  become: true
"""

RETURN = r"""
evidence:
  description:
    - C(gpu) (the facts M(gpuready.nvidia.nvidia_gpu_facts) returns), C(pci_gpus) (PCI bus ids of NVIDIA GPUs),
      C(pynvml) (C(present), C(error)), C(executables) (path to whether it is an executable file).
    - C(containerd) with C(config) and C(drop_ins) (each C(path), C(exists), C(text), C(error)), C(service)
      (C(active_state), C(main_pid), C(started_at)), C(cri) (what the CRI plugin reports, V(null) when it does not
      answer), C(cri_error) and C(config_files) (C(path), C(exists), C(mtime)).
    - C(kubelet) with C(config) (as a config file above) and C(device_plugins) (C(dir), C(exists), C(sockets)).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuready.nvidia.plugins.module_utils import doctor_node


def main():
    module = AnsibleModule(
        argument_spec=dict(
            sysfs_root=dict(type='path', default='/sys'),
            dmi_product_file=dict(type='path', default='/sys/class/dmi/id/product_name'),
            dev_root=dict(type='path', default='/dev'),
            containerd_service=dict(type='str', default='containerd'),
            containerd_socket=dict(type='path', default='/run/containerd/containerd.sock'),
            containerd_config=dict(type='path', default='/etc/containerd/config.toml'),
            kubelet_config=dict(type='path', default='/var/lib/kubelet/config.yaml'),
            kubelet_root_dir=dict(type='path', default='/var/lib/kubelet'),
            runtime_name=dict(type='str', default='nvidia'),
        ),
        supports_check_mode=True,
    )
    params = module.params
    evidence = doctor_node.gather(
        sysfs_root=params['sysfs_root'], dmi_product_file=params['dmi_product_file'], dev_root=params['dev_root'],
        containerd_unit=params['containerd_service'], containerd_socket=params['containerd_socket'],
        containerd_config=params['containerd_config'], kubelet_config=params['kubelet_config'],
        kubelet_root_dir=params['kubelet_root_dir'], runtime_name=params['runtime_name'])
    module.exit_json(changed=False, evidence=evidence)


if __name__ == '__main__':
    main()
