#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: containerd_runtime_info
short_description: Tell whether the running containerd has loaded the NVIDIA runtime its config files declare
version_added: 0.1.0
description:
  - Asks the running containerd's CRI plugin (C(Status), as C(crictl info) does) which runtimes and which default
    runtime it really loaded, reads when the service started and when its config files last changed, and says
    whether a restart is needed and why.
  - This is what decides a restart after C(gpuready.nvidia.containerd_nvidia_runtime), so that a restart lost to an
    interrupted play is made up by the next run, and what verifies containerd after the restart.
author: gpuready.nvidia contributors (!UNKNOWN)
extends_documentation_fragment:
  - gpuready.nvidia.attributes
  - gpuready.nvidia.containerd_state
attributes:
  check_mode:
    support: full
    details: The module only reads.
  diff_mode:
    support: none
  action:
    support: none
options:
  wait:
    description: Seconds to keep asking while the socket is missing or CRI is still starting (after a restart).
    type: float
    default: 0
"""

EXAMPLES = r"""
- name: Is containerd running what its files say?
  gpuready.nvidia.containerd_runtime_info:
    set_as_default: true
  register: containerd_state

- name: Restart when it is not, and check that it then is
  gpuready.nvidia.containerd_restart:
    set_as_default: true
  register: containerd_after
  failed_when: not containerd_after.healthy
  when: containerd_state.restart_needed

- name: Wait up to a minute for CRI to answer (a restart made by someone else)
  gpuready.nvidia.containerd_runtime_info:
    wait: 60
"""

RETURN = r"""
restart_needed:
  description: containerd must restart to run what its config files declare.
  returned: always
  type: bool
restart_reasons:
  description: Why, one sentence each (empty when no restart is needed).
  returned: always
  type: list
  elements: str
  sample: ["the running CRI plugin's default runtime is 'runc', not 'nvidia'"]
healthy:
  description: The service is active, CRI answers and is ready, and the runtime (and default) are as asked.
  returned: always
  type: bool
service:
  description: The unit's C(active_state), C(main_pid) and C(started_at) (epoch seconds of the main process start).
  returned: always
  type: dict
  sample: {"name": "containerd", "active_state": "active", "main_pid": 812, "started_at": 1796250000.5}
cri:
  description: What the CRI plugin reports (C(runtime_ready), C(default_runtime_name), C(runtimes), C(runtime_version),
    ...), V(null) when it does not answer.
  returned: always
  type: dict
cri_error:
  description: Why CRI could not be asked, V(null) when it answered.
  returned: always
  type: str
config_files:
  description: Each of O(config_paths) with C(exists) and C(mtime).
  returned: always
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_state import STATE_ARGS, gather


def main():
    module = AnsibleModule(
        argument_spec=dict(STATE_ARGS, wait=dict(type='float', default=0.0)),
        supports_check_mode=True,
    )
    params = module.params
    result = gather(params['service'], params['socket'], params['config_paths'], params['runtime_name'],
                    params['set_as_default'], timeout=params['timeout'], wait=params['wait'],
                    transport=params['transport'], check_runtime=params['check_runtime'])
    module.exit_json(changed=False, **result)


if __name__ == '__main__':
    main()
