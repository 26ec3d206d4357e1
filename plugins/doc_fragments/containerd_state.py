# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    # How to find the running containerd and what it must have loaded (module_utils/containerd_state.py).
    DOCUMENTATION = r"""
options:
  service:
    description: The systemd unit that runs containerd (C(k3s), C(k3s-agent), C(rke2-server), C(rke2-agent) for those).
    type: str
    default: containerd
  socket:
    description: containerd's CRI socket (C(/run/k3s/containerd/containerd.sock) on k3s and RKE2).
    type: str
    default: /run/containerd/containerd.sock
  config_paths:
    description: The config files containerd reads (the main file and drop-ins); a file newer than the running
      service needs a restart.
    type: list
    elements: path
    default: [/etc/containerd/config.toml]
  runtime_name:
    description: The runtime that must be loaded.
    type: str
    default: nvidia
  set_as_default:
    description: Whether O(runtime_name) must be (V(true)) or must not be (V(false)) the default runtime;
      unset does not check the default.
    type: bool
  check_runtime:
    description: V(false) checks neither O(runtime_name) nor the default runtime, only that CRI answers and that no
      config file is newer than the service; for after a M(gpuready.nvidia.containerd_nvidia_runtime) run with C(state=absent),
      which gives the files back whatever runtimes they had before.
    type: bool
    default: true
  timeout:
    description: Seconds for one CRI call.
    type: float
    default: 5
  transport:
    description: How to ask CRI; V(auto) uses grpcio when it imports, else crictl.
    type: str
    choices: [auto, grpc, crictl]
    default: auto
requirements:
  - grpcio (node, import name C(grpc)), or C(crictl) on the node's PATH
  - systemd on the node
"""
