#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: k8s_gpu_doctor
short_description: Name, per GPU node, the first broken link between the driver and a schedulable GPU pod
version_added: 0.1.0
description:
  - Judges each node of O(nodes) along a fixed chain of links, in this order, and stops at the first broken one
    (the links after it are C(not_checked)); C(driver), C(nvml), C(device_nodes), C(toolkit), C(containerd_config),
    C(containerd_runtime_loaded), C(runtime_class), C(plugin_scheduled), C(plugin_running), C(kubelet_registration),
    C(capacity), C(allocatable), C(labels), C(workload). A link is C(ok), C(broken), C(not_checked) or
    C(not_applicable) (C(runtime_class) where nvidia is containerd's default).
  - The node side comes from M(gpuready.nvidia.doctor_node_evidence) (O(nodes)); the API side is read here
    (DaemonSets and Deployments in all namespaces, RuntimeClasses, the Node, the pods on it with their events and
    logs, unscheduled pods requesting GPUs). The containerd config text is parsed here, with tomlkit.
  - Each broken link carries a cause from a fixed vocabulary (the README's Troubleshooting section lists them),
    the evidence it saw (the file line, API field or log line, quoted) and the fix.
  - It changes nothing, except with O(run_workload=true), which creates one labelled test pod per node that got as far
    as C(workload), runs C(nvidia-smi -L) in it and deletes it.
author: gpuready.nvidia contributors (!UNKNOWN)
extends_documentation_fragment:
  - gpuready.nvidia.attributes
  - gpuready.nvidia.k8s_auth
attributes:
  check_mode:
    support: full
    details: The module only reads; O(run_workload) runs no pod in check mode.
  diff_mode:
    support: none
  action:
    support: none
  action_group:
    description: Use C(group/gpuready.nvidia.k8s) in C(module_defaults) to set the authentication options once.
    support: full
    membership:
      - gpuready.nvidia.k8s
options:
  nodes:
    description:
      - Kubernetes Node name to that node's RV(gpuready.nvidia.doctor_node_evidence#module:evidence), or to V(null)
        where it could not be read (the chain then breaks at C(driver) with cause C(node_not_inspected)).
    type: dict
    required: true
  expected:
    description:
      - Node name to what its GPUs should give (resource name to count), as the P(gpuready.nvidia.gpu_resources#filter)
        filter computes it; nodes left out are not checked at C(capacity).
    type: dict
    default: {}
  runtime_name:
    description: The NVIDIA runtime's name in containerd.
    type: str
    default: nvidia
  mig_strategy:
    description: The MIG strategy the cluster is meant to use (C(gpuready_mig_strategy)).
    type: str
    choices: [none, single, mixed]
    default: none
  run_workload:
    description: Run a test pod on each node whose chain is healthy up to C(workload).
    type: bool
    default: false
  namespace:
    description: Namespace of the test pod; it must exist.
    type: str
    default: nvidia-device-plugin
  image:
    description: Image of the test pod.
    type: str
    default: nvcr.io/nvidia/cuda:12.2.0-base-ubuntu22.04
  runtime_class:
    description: C(runtimeClassName) of the test pod, where nvidia is not containerd's default.
    type: str
  test_pod_timeout:
    description: Seconds the test pods may take.
    type: int
    default: 120
  report_path:
    description: Write RV(report) as JSON to this file where the module runs. Its folder must exist.
    type: path
notes:
  - Runs on the controller (C(delegate_to=localhost), C(run_once=true)), which needs tomlkit and kubernetes.
  - Reads C(get) on namespaces, C(list) on nodes, daemonsets, deployments, runtimeclasses, pods and events in all
    namespaces, C(get) on pods/log; roles/gpuready/files/clusterrole.yml grants all of it. Nodes and pods come from
    one paginated list each, whatever the number of nodes (measured on 1,000 nodes in bench/).
  - Each API request is tried up to 5 times while the API server answers 5xx or 429 or drops the connection, waiting
    0.5, 1, 2 and 4 seconds in between (7.5 s in all); a request other than a watch times out after 10 s to connect and 60 s to read. 401 and 403
    fail at once, the message naming the API server and, for 403, the verb and resource refused; it never shows the
    credentials. A pod log or event list that is refused fails the module too, since a link judged without its
    evidence could look healthy; one that cannot be read for other reasons (a container not started yet) is left out.
seealso:
  - module: gpuready.nvidia.doctor_node_evidence
  - module: gpuready.nvidia.k8s_gpu_validate
"""

EXAMPLES = r"""
- name: Read each node
  gpuready.nvidia.doctor_node_evidence:
  become: true
  register: node_evidence

- name: Judge every node
  gpuready.nvidia.k8s_gpu_doctor:
    nodes: "{{ dict(ansible_play_hosts | map('extract', hostvars, 'gpuready_node_name')
              | zip(ansible_play_hosts | map('extract', hostvars, ['node_evidence', 'evidence']))) }}"
    report_path: /tmp/gpu-doctor.json
  delegate_to: localhost
  run_once: true
  register: doctor

- name: Show the chain
  ansible.builtin.debug:
    msg: "{{ doctor.chain }}"
  run_once: true
"""

RETURN = r"""
report:
  description:
    - C(nodes), keyed by Kubernetes Node name, each with C(status) (C(ok) or C(broken)), C(first_broken_link),
      C(cause), C(summary) (what the cause means), C(evidence) (a list of quoted lines), C(fix) and C(links)
      (link name to C(ok), C(broken), C(not_checked) or C(not_applicable)).
  returned: always
  type: dict
  sample:
    nodes:
      gpu-p4:
        status: broken
        first_broken_link: runtime_class
        cause: default_runtime_not_nvidia
        evidence: ["CRI status: defaultRuntimeName = 'runc'",
                   "DaemonSet kube-system/nvidia-device-plugin-daemonset has no spec.template.spec.runtimeClassName"]
        fix: "gpuready_set_as_default: true (nvidia-ctk ... --set-as-default), or false, ..."
        links: {driver: ok, nvml: ok, runtime_class: broken, workload: not_checked}
chain:
  description: The report for people, one line per node and link.
  returned: always
  type: list
  elements: str
broken:
  description: Names of the nodes with a broken link.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.gpuready.nvidia.plugins.module_utils import doctor, doctor_evidence, gpu_validate
from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s import auth, pods
from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s.api import ApiError, ListWatchError

try:
    from kubernetes.client import AppsV1Api, CoreV1Api, NodeV1Api
except ImportError:  # pragma: no cover - k8s.auth.HAS_KUBERNETES reports it
    pass


def _test_pods(core, reports, params):
    """{node: test pod result} for each node healthy up to workload."""
    results = {}
    for name, report in sorted(reports.items()):
        if report['status'] != doctor.OK:
            continue
        results[name] = pods.run_test_pod(
            core, params['namespace'], 'gpuready-doctor-%s' % name, params['image'], 'nvidia.com/gpu',
            runtime_class=params['runtime_class'], node_name=name, timeout=params['test_pod_timeout'])
    return results


def main():
    argument_spec = dict(
        nodes=dict(type='dict', required=True),
        expected=dict(type='dict', default={}),
        runtime_name=dict(type='str', default='nvidia'),
        mig_strategy=dict(type='str', choices=['none', 'single', 'mixed'], default='none'),
        run_workload=dict(type='bool', default=False),
        namespace=dict(type='str', default='nvidia-device-plugin'),
        image=dict(type='str', default='nvcr.io/nvidia/cuda:12.2.0-base-ubuntu22.04'),
        runtime_class=dict(type='str'),
        test_pod_timeout=dict(type='int', default=120),
        report_path=dict(type='path'),
    )
    argument_spec.update(auth.AUTH_ARG_SPEC)
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    params = module.params
    if not auth.HAS_KUBERNETES:
        module.fail_json(msg=missing_required_lib('kubernetes'), exception=str(auth.KUBERNETES_IMPORT_ERROR))
    try:
        expected = gpu_validate.check_expected(params['expected'])
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    if params['test_pod_timeout'] < 1:
        module.fail_json(msg='test_pod_timeout must be at least 1, got %d' % params['test_pod_timeout'])
    for name, evidence in params['nodes'].items():
        if evidence is not None and not isinstance(evidence, dict):
            module.fail_json(msg='nodes.%s must be the evidence dict of doctor_node_evidence or null, got %r'
                             % (name, evidence))
    settings = {'runtime_name': params['runtime_name'], 'mig_strategy': params['mig_strategy']}
    try:
        client = auth.api_client(params)
        core = CoreV1Api(client)
        api = doctor_evidence.api_evidence(core, AppsV1Api(client), NodeV1Api(client), sorted(params['nodes']))
        reports = dict((name, doctor.diagnose(name, evidence, api, expected.get(name), settings))
                       for name, evidence in params['nodes'].items())
        if params['run_workload'] and not module.check_mode:
            for name, result in _test_pods(core, reports, params).items():
                reports[name] = doctor.diagnose(name, params['nodes'][name], api, expected.get(name), settings,
                                                test_result=result)
    except (auth.K8sAuthError, ApiError, ListWatchError, doctor_evidence.DoctorError, pods.PodRunError) as exc:
        module.fail_json(msg=str(exc))
    report = {'nodes': reports}
    if params['report_path']:
        try:
            gpu_validate.write_report(params['report_path'], report)
        except (IOError, OSError) as exc:
            module.fail_json(msg='cannot write the report to %s: %s' % (params['report_path'], exc), report=report)
    broken = sorted(name for name, r in reports.items() if r['status'] != doctor.OK)
    module.exit_json(changed=False, report=report, chain=doctor.format_chain(reports), broken=broken)


if __name__ == '__main__':
    main()
