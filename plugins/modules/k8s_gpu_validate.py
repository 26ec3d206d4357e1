#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: k8s_gpu_validate
short_description: Prove that Kubernetes GPU nodes advertise their GPUs and that a GPU pod runs there
version_added: 0.1.0
description:
  - Lists the nodes matching O(label_selector) (paginated, O(page_size) per request), then watches them from that
    list's C(resourceVersion) until every node of O(expected) has exactly the expected count of each resource in both
    C(status.capacity) and C(status.allocatable), or O(timeout) seconds pass. An expired watch (HTTP 410) is answered
    by listing again. There is no polling loop.
  - Capacity above allocatable is reported as unhealthy devices, per node and resource. An C(nvidia.com/) resource
    the node makes allocatable but O(expected) does not name also fails the node (for example C(nvidia.com/gpu.shared)
    where plain C(nvidia.com/gpu) was expected); one whose allocatable is 0 is ignored, because the kubelet keeps the
    capacity of a device plugin that went away for a while.
  - With O(test_pod=true), every node that passed then runs a pod, all at the same time, that asks for one unit of the
    node's first expected resource (in sorted order) and runs C(nvidia-smi -L); the pod must succeed and, where
    O(products) names the node's GPU models, its log must name one of them. Every test pod is deleted afterwards,
    also when it failed or timed out; a pod of the same name left by an earlier run is deleted before.
  - Fails naming each node and what it lacks. The per-node table (node, GPUs, expected, capacity, allocatable, test
    pod) is returned as RV(table); the whole result can be written as JSON to O(report_path).
  - The test pod and the report are not configuration, so the module always reports C(changed=false).
author: gpuready.nvidia contributors (!UNKNOWN)
extends_documentation_fragment:
  - gpuready.nvidia.attributes
  - gpuready.nvidia.k8s_auth
attributes:
  check_mode:
    support: full
    details: In check mode nothing is read, waited for or run; the result says C(skipped).
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
  expected:
    description:
      - What each node must advertise, a dict of Node name to a dict of resource name to count (see the examples);
        the P(gpuready.nvidia.gpu_resources#filter) filter computes it from a node's GPU facts.
      - A node with an empty dict must only exist and match O(label_selector).
    type: dict
    required: true
  products:
    description:
      - GPU model names per node (a dict of Node name to a name or a list of names, as NVML reports them in
        C(ansible_facts.nvidia_gpu.devices[].name)); the test pod's log must name one of them.
      - Nodes left out are not checked for a name.
    type: dict
  gpus:
    description: Number of physical GPUs per node (a dict of Node name to count), shown in the table only.
    type: dict
  label_selector:
    description: Label selector of the GPU nodes to list and watch.
    type: str
    default: nvidia.com/gpu.present=true
  page_size:
    description: Nodes per list request.
    type: int
    default: 500
  timeout:
    description: Seconds to wait for the nodes to advertise the expected resources.
    type: int
    default: 300
  test_pod:
    description: Run a test pod on each node that advertises what it should.
    type: bool
    default: true
  test_pod_timeout:
    description: Seconds the test pods may take together, image pull included, to finish.
    type: int
    default: 300
  namespace:
    description: Namespace of the test pods; it must exist.
    type: str
    default: nvidia-device-plugin
  image:
    description: Image of the test pods. C(nvidia-smi) comes from the NVIDIA runtime, not from the image.
    type: str
    default: nvcr.io/nvidia/cuda:12.2.0-base-ubuntu22.04
  runtime_class:
    description:
      - C(runtimeClassName) of the test pods. Needed when the NVIDIA runtime is not containerd's default; leave it
        unset when it is.
    type: str
  pull_policy:
    description: C(imagePullPolicy) of the test pods.
    type: str
    choices: [Always, IfNotPresent, Never]
    default: IfNotPresent
  report_path:
    description:
      - Write the report (RV(report)) as JSON to this file where the module runs, also when validation fails. Its
        folder must exist.
    type: path
notes:
  - Runs where the task runs, usually on the controller (C(delegate_to=localhost), C(run_once=true)).
  - Needs C(list), C(watch) and C(get) on C(nodes); with O(test_pod=true) also C(create), C(delete), C(get), C(list) and
    C(watch) on C(pods) and C(get) on C(pods/log) in O(namespace).
  - Each API request is tried up to 5 times while the API server answers 5xx or 429 or drops the connection, waiting
    0.5, 1, 2 and 4 seconds in between (7.5 s in all); a request other than a watch times out after 10 s to connect and 60 s to read. 401 and 403
    fail at once, the message naming the API server and, for 403, the verb and resource refused; it never shows the
    credentials.
  - A 409 on creating a test pod (a pod of that name appeared meanwhile) deletes that pod and creates the test pod
    again, once.
seealso:
  - plugin: gpuready.nvidia.gpu_resources
    plugin_type: filter
  - module: gpuready.nvidia.nvidia_gpu_facts
"""

EXAMPLES = r"""
- name: Wait for two nodes to advertise their GPUs and run nvidia-smi on each
  gpuready.nvidia.k8s_gpu_validate:
    expected:
      gpu-node-1: {"nvidia.com/gpu": 4}
      gpu-node-2: {"nvidia.com/gpu": 8}
    products:
      gpu-node-1: Tesla P4
      gpu-node-2: [NVIDIA H100 80GB HBM3]
    timeout: 600
    report_path: /tmp/gpu-validation.json
  delegate_to: localhost
  run_once: true
  register: gpu_validation

- name: Show the table
  ansible.builtin.debug:
    msg: "{{ gpu_validation.table }}"
  run_once: true

- name: The NVIDIA runtime is not containerd's default, so the test pod names its RuntimeClass
  gpuready.nvidia.k8s_gpu_validate:
    expected: "{{ {inventory_hostname: ansible_facts.nvidia_gpu | gpuready.nvidia.gpu_resources} }}"
    runtime_class: nvidia
    kubeconfig: ~/.kube/config
  delegate_to: localhost
"""

RETURN = r"""
rows:
  description:
    - One entry per node of O(expected), sorted by name, with C(node), C(gpus), C(expected), C(capacity) and
      C(allocatable) (the expected resources and every C(nvidia.com/) one, as numbers), C(unhealthy) (capacity minus
      allocatable per expected resource, where above 0), C(ok), C(problem) (a sentence naming the node and what it
      lacks, or null) and C(test_pod) (null when none ran).
    - C(test_pod) has C(pod), C(resource), C(phase), C(log), C(ok), C(product_found), C(product) and C(problem).
  returned: unless in check mode
  type: list
  elements: dict
  sample:
    - node: gpu-node-1
      gpus: 4
      expected: {"nvidia.com/gpu": 4}
      capacity: {"nvidia.com/gpu": 4}
      allocatable: {"nvidia.com/gpu": 3}
      unhealthy: {"nvidia.com/gpu": 1}
      ok: false
      problem: "node gpu-node-1: 1 of 4 nvidia.com/gpu unhealthy (allocatable 3)"
      test_pod: null
table:
  description: The per-node table as text lines, a header first.
  returned: unless in check mode
  type: list
  elements: str
  sample:
    - "node        GPUs  expected          capacity          allocatable       test pod"
    - "gpu-node-1  4     nvidia.com/gpu=4  nvidia.com/gpu=4  nvidia.com/gpu=4  passed: Tesla P4"
report:
  description: What O(report_path) receives, C(passed), C(checked_at) (UTC, ISO 8601), C(label_selector),
    C(problems) (the sentences) and C(nodes) (RV(rows)).
  returned: unless in check mode
  type: dict
problems:
  description: Every problem sentence, one per failed node or test pod.
  returned: unless in check mode
  type: list
  elements: str
skipped:
  description: True in check mode, where nothing is validated.
  returned: in check mode
  type: bool
"""

import datetime

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpuready.nvidia.plugins.module_utils import gpu_validate
from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s import auth, pods
from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s.api import ApiError, ListWatchError

try:
    from kubernetes.client import CoreV1Api
except ImportError:  # pragma: no cover - k8s.auth.HAS_KUBERNETES reports it
    pass


def _products(value):
    """A node's products option as a list of names."""
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


def main():
    argument_spec = dict(
        expected=dict(type="dict", required=True),
        products=dict(type="dict"),
        gpus=dict(type="dict"),
        label_selector=dict(type="str", default=gpu_validate.DEFAULT_SELECTOR),
        page_size=dict(type="int", default=500),
        timeout=dict(type="int", default=300),
        test_pod=dict(type="bool", default=True),
        test_pod_timeout=dict(type="int", default=300),
        namespace=dict(type="str", default="nvidia-device-plugin"),
        image=dict(type="str", default="nvcr.io/nvidia/cuda:12.2.0-base-ubuntu22.04"),
        runtime_class=dict(type="str"),
        pull_policy=dict(type="str", choices=["Always", "IfNotPresent", "Never"], default="IfNotPresent"),
        report_path=dict(type="path"),
    )
    argument_spec.update(auth.AUTH_ARG_SPEC)
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    params = module.params
    if not auth.HAS_KUBERNETES:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=str(auth.KUBERNETES_IMPORT_ERROR))
    try:
        expected = gpu_validate.check_expected(params["expected"])
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    for name in ("page_size", "timeout", "test_pod_timeout"):
        if params[name] < 1:
            module.fail_json(msg="%s must be at least 1, got %d" % (name, params[name]))
    if module.check_mode:
        module.exit_json(changed=False, skipped=True,
                         msg="check mode: nothing validated (validation waits for the nodes and runs pods)")

    products = dict((node, _products(names)) for node, names in (params["products"] or {}).items())
    try:
        core = CoreV1Api(auth.api_client(params))
        rows = gpu_validate.wait_for_resources(core, expected, params["label_selector"], params["timeout"],
                                               params["page_size"], params["gpus"])
        tested = [row for row in rows if row["ok"] and row["expected"]] if params["test_pod"] else []
        results = pods.run_test_pods(
            core, [{"node": row["node"], "resource": sorted(row["expected"])[0], "products": products.get(row["node"])}
                   for row in tested],
            params["namespace"], params["image"], params["runtime_class"], params["test_pod_timeout"],
            params["pull_policy"], params["page_size"]) if tested else []
    except (auth.K8sAuthError, ApiError, ListWatchError, gpu_validate.ValidationError, pods.PodRunError) as exc:
        module.fail_json(msg=str(exc))

    by_node = dict((result["node"], result) for result in results)
    for row in rows:
        row["test_pod"] = by_node.get(row["node"])
    problems = [row["problem"] for row in rows if row["problem"]] + [r["problem"] for r in results if r["problem"]]
    report = {"passed": not problems, "checked_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "label_selector": params["label_selector"], "problems": problems, "nodes": rows}
    if params["report_path"]:
        try:
            gpu_validate.write_report(params["report_path"], report)
        except (IOError, OSError) as exc:
            module.fail_json(msg="cannot write the report to %s: %s" % (params["report_path"], exc), rows=rows)
    result = dict(changed=False, rows=rows, table=gpu_validate.format_table(rows), report=report, problems=problems)
    if problems:
        module.fail_json(msg="GPU validation failed: %s" % "; ".join(problems), **result)
    module.exit_json(msg="%d GPU node(s) validated" % len(rows), **result)


if __name__ == "__main__":
    main()
