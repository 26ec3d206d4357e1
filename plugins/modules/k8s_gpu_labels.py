#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: k8s_gpu_labels
short_description: Label Kubernetes nodes for NVIDIA GPU scheduling, from GPU facts or explicit labels
version_added: 0.1.0
description:
  - Puts labels on Kubernetes Node objects so the NVIDIA device plugin and GPU workloads schedule there.
    This is the manual-label path for clusters without GPU Feature Discovery (GFD), and the way to add
    C(nvidia.com/gpu.present), which the device plugin DaemonSet's node affinity asks for.
  - From O(gpu_facts) (the C(ansible_facts.nvidia_gpu) of M(gpuready.nvidia.nvidia_gpu_facts)) it applies exactly
    the labels GFD v0.20.0 would write (see the P(gpuready.nvidia.gfd_labels#filter) filter), without
    C(nvidia.com/gfd.timestamp), plus C(nvidia.com/gpu.present=true) when GPU hardware is present. A node without
    NVIDIA hardware gets no labels. Facts where hardware is present but NVML failed are refused (the node is
    neither labelled nor pruned) because such labels would be guesses.
  - Labels it wrote are listed in the node annotation C(gpuready.nvidia/managed-labels); O(prune) only ever removes
    keys listed there, never labels set by anyone else.
  - Requests per node are one GET and, only when something changes, one JSON merge PATCH carrying the
    C(resourceVersion) it read. A concurrent writer makes the PATCH fail with 409; the node is then read again and the
    change re-planned, so both changes survive. 5xx and 429 answers are retried with a bounded backoff (about 6 s).
    In check mode only GETs are made.
  - With O(nodes), a whole fleet is labelled from one connection pool; every node that can be labelled is, and the
    task then fails naming the nodes that could not be.
author: gpuready.nvidia contributors (!UNKNOWN)
extends_documentation_fragment:
  - gpuready.nvidia.attributes
  - gpuready.nvidia.k8s_auth
attributes:
  check_mode:
    support: full
    details: Only reads the nodes.
  diff_mode:
    support: full
    details: Labels before and after, per node.
  action:
    support: none
  action_group:
    description: Use C(group/gpuready.nvidia.k8s) in C(module_defaults) to set the authentication options once.
    support: full
    membership:
      - gpuready.nvidia.k8s
options:
  node:
    description: Name of the Node to label. Exactly one of O(node) and O(nodes) is required.
    type: str
  labels:
    description:
      - Labels to apply, a dict of label keys to string values. With O(state=absent), the keys to remove (a dict or a
        list of keys), whoever set them.
      - Mutually exclusive with O(gpu_facts). Checked against Kubernetes' label rules before any request.
    type: raw
  gpu_facts:
    description: The node's C(ansible_facts.nvidia_gpu); the labels are computed from it.
    type: dict
  mig_strategy:
    description: The device plugin's and GFD's MIG strategy, used with O(gpu_facts).
    type: str
    choices: [none, single, mixed]
    default: none
  sharing:
    description:
      - GPU sharing as configured for the device plugin and GFD, used with O(gpu_facts). Same shape as the
        P(gpuready.nvidia.gfd_labels#filter) filter's C(sharing), with C(strategy) (V(time-slicing) or V(mps)),
        C(rename_by_default) and C(resources), a list of C(name) and C(replicas).
    type: dict
  nodes:
    description: Many nodes in one call, each with C(name) and C(labels) or C(gpu_facts).
    type: list
    elements: dict
    suboptions:
      name:
        description: Node name.
        type: str
        required: true
      labels:
        description: As O(labels).
        type: raw
      gpu_facts:
        description: As O(gpu_facts).
        type: dict
  state:
    description:
      - V(present) applies the labels; V(absent) removes them.
      - With V(absent) and neither O(labels) nor O(gpu_facts), every label this module set on the node is removed.
      - With V(absent) and O(gpu_facts), the labels this module set that the facts would give are removed.
    type: str
    choices: [present, absent]
    default: present
  prune:
    description:
      - With O(state=present), remove the labels this module set earlier (recorded in the C(gpuready.nvidia/managed-labels)
        annotation) that are no longer wanted, for example C(nvidia.com/mig-*) labels after MIG is turned off.
      - Labels set by anyone else are never removed.
    type: bool
    default: true
  respect_gfd:
    description:
      - Leave the labels GPU Feature Discovery manages alone. A node counts as GFD-managed when NFD's
        C(nfd.node.kubernetes.io/feature-labels) annotation lists C(nvidia.com/) keys or a NodeFeature
        C(nvidia-features-for-<node>) exists (looked up only when a change is about to be made, once per task).
      - On such nodes only C(nvidia.com/gpu.present) is ensured from O(gpu_facts); explicit O(labels) are applied
        except the keys GFD manages.
    type: bool
    default: true
notes:
  - Runs where the task runs, usually on the controller (C(delegate_to=localhost)), once with O(nodes) or per host with
    O(node). Needs C(get) and C(patch) on C(nodes), and C(list) on C(nodefeatures.nfd.k8s-sigs.io) when
    O(respect_gfd=true). The collection README lists the ClusterRole.
  - Each API request is tried up to 5 times while the API server answers 5xx or 429 or drops the connection, waiting
    0.5, 1, 2 and 4 seconds in between (7.5 s in all); a request other than a watch times out after 10 s to connect and 60 s to read. 401 and 403
    fail at once, the message naming the API server and, for 403, the verb and resource refused; it never shows the
    credentials.
  - A 409 Conflict (the node changed between read and write) reads the node again and redoes the change, up to 5
    times.
seealso:
  - plugin: gpuready.nvidia.gfd_labels
    plugin_type: filter
  - module: gpuready.nvidia.nvidia_gpu_facts
"""

EXAMPLES = r"""
- name: Label each GPU node from its own facts (the controller talks to the API)
  gpuready.nvidia.k8s_gpu_labels:
    node: "{{ inventory_hostname }}"
    gpu_facts: "{{ ansible_facts.nvidia_gpu }}"
    kubeconfig: ~/.kube/config
  delegate_to: localhost

- name: Each GPU host states how its node should be labelled
  ansible.builtin.set_fact:
    gpu_label_entry:
      name: "{{ inventory_hostname }}"
      gpu_facts: "{{ ansible_facts.nvidia_gpu }}"

- name: Label the whole fleet in one call from the controller
  gpuready.nvidia.k8s_gpu_labels:
    nodes: "{{ ansible_play_hosts | map('extract', hostvars, 'gpu_label_entry') | list }}"
    mig_strategy: single
  delegate_to: localhost
  run_once: true

- name: Just make the device plugin schedule on a node
  gpuready.nvidia.k8s_gpu_labels:
    node: gpu-node-1
    labels:
      nvidia.com/gpu.present: "true"

- name: Remove every label this module set
  gpuready.nvidia.k8s_gpu_labels:
    node: gpu-node-1
    state: absent

- name: Authentication once for the group
  module_defaults:
    group/gpuready.nvidia.k8s:
      host: https://10.0.0.1:6443
      api_key: "{{ vault_k8s_token }}"
      ca_cert: /etc/kubernetes/pki/ca.crt
  block:
    - name: Label
      gpuready.nvidia.k8s_gpu_labels:
        node: gpu-node-1
        labels:
          nvidia.com/gpu.present: "true"
"""

RETURN = r"""
labels:
  description: The node's labels after the task (predicted in check mode). Single-node mode only.
  returned: success and O(node) given
  type: dict
  sample: {"kubernetes.io/hostname": "gpu-node-1", "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "4"}
added:
  description: Labels set or changed, with their new values. Single-node mode only.
  returned: success and O(node) given
  type: dict
removed:
  description: Label keys removed. Single-node mode only.
  returned: success and O(node) given
  type: list
  elements: str
results:
  description: One entry per node in O(nodes) order, with C(node), C(changed), C(labels), C(added), C(removed), C(diff),
    and C(failed)/C(msg) for a node that could not be labelled.
  returned: O(nodes) given
  type: list
  elements: dict
failed_nodes:
  description: Names of the nodes in O(nodes) that could not be labelled.
  returned: O(nodes) given
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpuready.nvidia.plugins.module_utils import node_labels
from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s import auth


def _wanted(module, spec, prefix):
    """(labels wanted, explicit) for one node spec; ValueError on bad input."""
    labels, facts = spec.get("labels"), spec.get("gpu_facts")
    if labels is not None and facts is not None:
        raise ValueError("%sgive labels or gpu_facts, not both" % prefix)
    if facts is not None:
        return node_labels.labels_from_facts(facts, module.params["mig_strategy"], module.params["sharing"],
                                             prefix + "gpu_facts"), False
    if labels is None:
        if module.params["state"] == "present":
            raise ValueError("%sstate=present needs labels or gpu_facts" % (prefix or "node: "))
        return {}, False
    if module.params["state"] == "absent":
        if not isinstance(labels, (dict, list)):
            raise ValueError("%slabels must be a list of keys (or a dict) with state=absent" % prefix)
        return node_labels.check_labels(dict((key, None) for key in labels), prefix + "labels"), True
    if not isinstance(labels, dict):
        raise ValueError("%slabels must be a dict of key: value" % prefix)
    return node_labels.check_labels(labels, prefix + "labels"), True


def main():
    argument_spec = dict(
        node=dict(type="str"),
        labels=dict(type="raw"),
        gpu_facts=dict(type="dict"),
        mig_strategy=dict(type="str", choices=["none", "single", "mixed"], default="none"),
        sharing=dict(type="dict"),
        nodes=dict(type="list", elements="dict", options=dict(
            name=dict(type="str", required=True),
            labels=dict(type="raw"),
            gpu_facts=dict(type="dict"),
        )),
        state=dict(type="str", choices=["present", "absent"], default="present"),
        prune=dict(type="bool", default=True),
        respect_gfd=dict(type="bool", default=True),
    )
    argument_spec.update(auth.AUTH_ARG_SPEC)
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True,
                           mutually_exclusive=[("node", "nodes"), ("labels", "gpu_facts"), ("labels", "nodes"),
                                               ("gpu_facts", "nodes")],
                           required_one_of=[("node", "nodes")])
    if not auth.HAS_KUBERNETES:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=str(auth.KUBERNETES_IMPORT_ERROR))

    bulk = module.params["nodes"] is not None
    specs = module.params["nodes"] if bulk else [dict(name=module.params["node"], labels=module.params["labels"],
                                                      gpu_facts=module.params["gpu_facts"])]
    wanted = []
    try:  # every input is checked before the first request
        for index, spec in enumerate(specs):
            wanted.append(_wanted(module, spec, "nodes[%d]." % index if bulk else ""))
    except ValueError as exc:
        module.fail_json(msg=str(exc))

    try:
        labeler = node_labels.NodeLabeler(auth.api_client(module.params), check_mode=module.check_mode,
                                          respect_gfd=module.params["respect_gfd"])
    except auth.K8sAuthError as exc:
        module.fail_json(msg=str(exc))

    results, failed = [], []
    for spec, (labels, explicit) in zip(specs, wanted):
        try:
            results.append(labeler.label(spec["name"], labels, state=module.params["state"],
                                         prune=module.params["prune"], explicit=explicit,
                                         facts_mode=spec.get("gpu_facts") is not None))
        except node_labels.NodeLabelError as exc:
            if not bulk:
                module.fail_json(msg=str(exc))
            failed.append(spec["name"])
            results.append({"node": spec["name"], "changed": False, "failed": True, "msg": str(exc)})

    changed = any(r["changed"] for r in results)
    if not bulk:
        result = results[0]
        module.exit_json(changed=changed, labels=result["labels"], added=result["added"], removed=result["removed"],
                         diff=result["diff"])
    diff = [dict(r["diff"], before_header=r["node"], after_header=r["node"]) for r in results if r.get("diff")]
    if failed:
        module.fail_json(msg="could not label %d of %d nodes: %s" % (len(failed), len(specs), ", ".join(failed)),
                         changed=changed, results=results, failed_nodes=failed, diff=diff)
    module.exit_json(changed=changed, results=results, failed_nodes=failed, diff=diff)


if __name__ == "__main__":
    main()
