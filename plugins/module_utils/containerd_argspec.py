# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Ansible option spec of containerd_nvidia_runtime.

Shared by the action plugin, which validates the task's options with it, and the module, whose
DOCUMENTATION validate-modules checks against it. Apart from the containerd_* engine module_utils,
which are plain Python and know nothing of Ansible options.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

ARGUMENT_SPEC = dict(
    path=dict(type="path"),
    flavor=dict(type="str", default="containerd", choices=["containerd", "k3s", "rke2"]),
    flavor_config_dir=dict(type="path"),
    containerd_binary=dict(type="str", default="containerd"),
    runtime_name=dict(type="str", default="nvidia"),
    runtime_path=dict(type="path", default="/usr/bin/nvidia-container-runtime"),
    set_as_default=dict(type="bool"),
    enable_cdi=dict(type="bool", default=False),
    systemd_cgroup=dict(type="str", default="auto", choices=["auto", "true", "false"]),
    kubelet_config=dict(type="path", default="/var/lib/kubelet/config.yaml"),
    drop_in=dict(type="path"),
    config_version=dict(type="str", default="auto", choices=["auto", "1", "2", "3", "4"]),
    state=dict(type="str", default="present", choices=["present", "absent"]),
    backup=dict(type="bool", default=False),
    validate=dict(type="bool", default=True),
    applied_record=dict(type="path"),
)
