#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: containerd_restart
short_description: Restart containerd and wait until CRI shows the NVIDIA runtime it was configured with
version_added: 0.1.0
description:
  - Restarts the systemd unit that runs containerd, waits for its CRI plugin to answer, and reports what it loaded,
    as M(gpuready.nvidia.containerd_runtime_info) does, so that the caller can roll back when it is not healthy.
  - On a node that serves the Kubernetes API (a k3s or RKE2 server, O(api_url) set) it restarts only while the API
    answers C(/readyz), and returns only once it answers again (or O(api_wait) passed). Run on the servers one at
    a time (C(throttle) or C(serial) 1), this never takes more than one API server down.
author: gpuready.nvidia contributors (!UNKNOWN)
extends_documentation_fragment:
  - gpuready.nvidia.attributes
  - gpuready.nvidia.containerd_state
attributes:
  check_mode:
    support: full
    details: In check mode nothing restarts; the module reports the state it would restart from, with C(changed).
  diff_mode:
    support: none
  action:
    support: none
options:
  wait:
    description: Seconds to wait for CRI to answer after the restart.
    type: float
    default: 60
  api_url:
    description: The Kubernetes API served by this node, for example V(https://127.0.0.1:6443); unset for nodes
      that do not serve it.
    type: str
  api_ca_file:
    description: CA bundle that signed the API's serving certificate (k3s C(/var/lib/rancher/k3s/server/tls/server-ca.crt)).
    type: path
  api_client_cert_file:
    description: Client certificate for C(/readyz) where anonymous requests are refused, as on k3s and RKE2
      (C(/var/lib/rancher/k3s/server/tls/client-admin.crt)).
    type: path
  api_client_key_file:
    description: The key of O(api_client_cert_file).
    type: path
  api_wait:
    description: Seconds to wait for the API to be ready again after the restart.
    type: float
    default: 300
"""

EXAMPLES = r"""
- name: Restart containerd where it does not run its config
  gpuready.nvidia.containerd_restart:
    set_as_default: true
  register: containerd_after
  failed_when: not containerd_after.healthy

- name: Restart k3s servers one at a time, each waiting for the API
  gpuready.nvidia.containerd_restart:
    service: k3s
    socket: /run/k3s/containerd/containerd.sock
    config_paths: [/var/lib/rancher/k3s/agent/etc/containerd/config.toml]
    api_url: https://127.0.0.1:6443
    api_ca_file: /var/lib/rancher/k3s/server/tls/server-ca.crt
    api_client_cert_file: /var/lib/rancher/k3s/server/tls/client-admin.crt
    api_client_key_file: /var/lib/rancher/k3s/server/tls/client-admin.key
  throttle: 1
  register: k3s_after
  failed_when: not (k3s_after.healthy and k3s_after.api_ready)
"""

RETURN = r"""
restarted:
  description: The unit was restarted (false in check mode, after a failed C(systemctl restart), or when the API
    was not ready before it).
  returned: always
  type: bool
restart_error:
  description: Why the unit was not restarted, or why C(systemctl restart) failed; V(null) otherwise.
  returned: always
  type: str
api_ready:
  description: The API answered C(/readyz) after the restart; V(null) without O(api_url) or when containerd is not healthy.
  returned: always
  type: bool
api_error:
  description: The API's last answer when it was not ready.
  returned: always
  type: str
restarted_at:
  description: Epoch seconds when the module began (before its API check and restart).
  returned: always
  type: float
finished_at:
  description: Epoch seconds when CRI (and the API) answered or the waits ran out.
  returned: always
  type: float
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
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_state import STATE_ARGS, gather, restart


def main():
    module = AnsibleModule(
        argument_spec=dict(
            STATE_ARGS,
            wait=dict(type='float', default=60.0),
            api_url=dict(type='str'),
            api_ca_file=dict(type='path'),
            api_client_cert_file=dict(type='path'),
            api_client_key_file=dict(type='path'),
            api_wait=dict(type='float', default=300.0),
        ),
        required_by={'api_client_key_file': 'api_client_cert_file'},
        supports_check_mode=True,
    )
    params = module.params
    state_args = (params['service'], params['socket'], params['config_paths'], params['runtime_name'],
                  params['set_as_default'])
    state_kwargs = dict(timeout=params['timeout'], transport=params['transport'],
                        check_runtime=params['check_runtime'])
    if module.check_mode:
        result = gather(*state_args, **state_kwargs)
        module.exit_json(changed=True, restarted=False, restart_error=None, api_ready=None, api_error=None,
                         restarted_at=None, finished_at=None, **result)
    api = None
    if params['api_url']:
        api = {'url': params['api_url'], 'ca_file': params['api_ca_file'],
               'cert_file': params['api_client_cert_file'], 'key_file': params['api_client_key_file']}
    result = restart(*state_args, wait=params['wait'], api=api, api_wait=params['api_wait'], **state_kwargs)
    module.exit_json(changed=result['restarted'], **result)


if __name__ == '__main__':
    main()
