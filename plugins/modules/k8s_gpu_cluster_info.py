#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: k8s_gpu_cluster_info
short_description: Read what deploying the NVIDIA device plugin, GFD and NFD depends on, in one call
version_added: 0.1.0
description:
  - Reads, with one client and one module run, what the P(gpuready.nvidia.device_plugin#role) and
    P(gpuready.nvidia.feature_discovery#role) roles check before they change a cluster. Each of these reads
    made as its own C(kubernetes.core.k8s_info) task costs a process and about a second.
  - Every DaemonSet in every namespace and every GPU Operator C(ClusterPolicy) (C(nvidia.com/v1)) is read once,
    and only the GPU components that gpuready.nvidia did not deploy are returned (RV(found)); the objects
    themselves are not.
  - The namespaces, the RuntimeClass, NFD's C(nodefeatures.nfd.k8s-sigs.io) CustomResourceDefinition and, with
    O(nfd_existing), an existing NFD's nfd-master Deployment and nfd-worker DaemonSet are read by name; a missing
    one is returned as V(null), without C(metadata.managedFields).
  - An API the server does not serve (no GPU Operator CRD, no NFD CRDs) is no error; it has no objects, as
    C(api_found=false) in C(kubernetes.core.k8s_info).
  - With O(objects), the objects a role renders, it also says which of them are current (RV(current)). An object is
    current when the live one holds every field of the rendered one and the fingerprint annotation
    C(gpuready.nvidia/rendered) that the roles apply with each object (P(gpuready.nvidia.to_apply#filter)). A server-side apply of such an object would
    change nothing, so the roles skip it; any field changed or removed by someone else, or a template that renders
    something else (a new fingerprint), makes the object not current. CustomResourceDefinitions are never current
    (the roles apply them on every run, without the annotation).
  - 5xx and 429 answers are retried with a bounded backoff (about 7.5 s); anything else fails the task with a message
    that names the request.
author: gpuready.nvidia contributors (!UNKNOWN)
extends_documentation_fragment:
  - gpuready.nvidia.attributes
  - gpuready.nvidia.k8s_auth
attributes:
  check_mode:
    support: full
    details: The module only reads.
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
  namespace:
    description:
      - The namespace of the device plugin and GFD (C(gpuready_namespace)). It is read, and the NodeFeature API is
        asked for in it.
    type: str
    default: nvidia-device-plugin
  nfd_namespace:
    description: The namespace NFD is deployed to (C(gpuready_nfd_namespace)).
    type: str
    default: node-feature-discovery
  runtime_class:
    description: The name of the RuntimeClass of the NVIDIA runtime (C(gpuready_runtime_class)).
    type: str
    default: nvidia
  nfd_existing:
    description: Where an NFD deployed by something else runs; its two objects are read only when this is given.
    type: dict
    suboptions:
      namespace:
        description: Its namespace.
        type: str
        required: true
      master:
        description: The name of its nfd-master Deployment.
        type: str
        default: nfd-master
      worker:
        description: The name of its nfd-worker DaemonSet.
        type: str
        default: nfd-worker
  objects:
    description:
      - Rendered objects (C(apiVersion), C(kind), C(metadata.name), C(metadata.namespace) where namespaced) to compare
        with the live ones. Each is read by name; kinds other than those the collection's templates render are never
        current.
    type: list
    elements: dict
    default: []
notes:
  - Needs C(get) on namespaces, runtimeclasses and customresourcedefinitions, C(list) on daemonsets,
    C(clusterpolicies.nvidia.com) and C(nodefeatures.nfd.k8s-sigs.io), and with O(nfd_existing) C(get) on
    deployments and daemonsets.
seealso:
  - plugin: gpuready.nvidia.to_apply
    plugin_type: filter
  - module: gpuready.nvidia.k8s_gpu_doctor
"""

EXAMPLES = r"""
- name: Read the cluster before deploying the device plugin, and which of our objects are applied already
  gpuready.nvidia.k8s_gpu_cluster_info:
    namespace: nvidia-device-plugin
    runtime_class: nvidia
    objects: "{{ lookup('ansible.builtin.template', 'objects.yml.j2') | from_yaml_all | list }}"
  delegate_to: localhost
  run_once: true
  register: cluster

- name: Stop at a device plugin we did not deploy
  ansible.builtin.fail:
    msg: "Found {{ cluster.found | map(attribute='name') | join(', ') }}"
  when: cluster.found | selectattr('component', '==', 'device-plugin') | list | length > 0
  run_once: true

- name: Apply the objects that are not current
  kubernetes.core.k8s:
    definition: "{{ item }}"
    apply: true
    server_side_apply: {field_manager: gpuready.nvidia}
  loop: >-
    {{ lookup('ansible.builtin.template', 'objects.yml.j2') | from_yaml_all | list
    | gpuready.nvidia.to_apply(cluster.current) }}
  delegate_to: localhost
  run_once: true

- name: Check an NFD installed by its Helm chart
  gpuready.nvidia.k8s_gpu_cluster_info:
    nfd_existing:
      namespace: node-feature-discovery
      master: node-feature-discovery-master
      worker: node-feature-discovery-worker
  delegate_to: localhost
  run_once: true
  register: cluster
"""

RETURN = r"""
found:
  description:
    - The GPU components gpuready.nvidia did not deploy, as the P(gpuready.nvidia.gpu_components#filter) filter
      gives them; C(component) is one of C(device-plugin), C(mps-control-daemon), C(gpu-feature-discovery),
      C(node-feature-discovery) or C(gpu-operator) (a ClusterPolicy whose device plugin is enabled).
  returned: always
  type: list
  elements: dict
  sample:
    - {component: device-plugin, kind: DaemonSet, namespace: kube-system, name: nvidia-device-plugin-daemonset,
       selector: ["name=nvidia-device-plugin-ds"]}
namespace:
  description: The Namespace O(namespace), or V(null) where it does not exist.
  returned: always
  type: dict
nfd_namespace:
  description: The Namespace O(nfd_namespace), or V(null).
  returned: always
  type: dict
runtime_class:
  description: The RuntimeClass O(runtime_class), or V(null).
  returned: always
  type: dict
node_feature_crd:
  description: The CustomResourceDefinition C(nodefeatures.nfd.k8s-sigs.io), or V(null).
  returned: always
  type: dict
node_feature_api:
  description: Whether the API server serves C(nfd.k8s-sigs.io/v1alpha1) NodeFeatures.
  returned: always
  type: bool
nfd_existing:
  description:
    - With O(nfd_existing), C(master) (the Deployment or V(null)) and C(worker) (the DaemonSet or V(null));
      else V(null).
  returned: always
  type: dict
current:
  description: The keys (C(apiVersion Kind namespace/name), or C(apiVersion Kind name)) of the O(objects) that are current.
  returned: always
  type: list
  elements: str
  sample: ["v1 Namespace nvidia-device-plugin", "apps/v1 DaemonSet nvidia-device-plugin/nvidia-device-plugin"]
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s import auth, cluster
from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s.api import ApiError, ListWatchError, RawClient


def main():
    argument_spec = dict(
        namespace=dict(type='str', default='nvidia-device-plugin'),
        nfd_namespace=dict(type='str', default='node-feature-discovery'),
        runtime_class=dict(type='str', default='nvidia'),
        nfd_existing=dict(type='dict', options=dict(
            namespace=dict(type='str', required=True),
            master=dict(type='str', default='nfd-master'),
            worker=dict(type='str', default='nfd-worker'),
        )),
        objects=dict(type='list', elements='dict', default=[]),
    )
    argument_spec.update(auth.AUTH_ARG_SPEC)
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    params = module.params
    if not auth.HAS_KUBERNETES:
        module.fail_json(msg=missing_required_lib('kubernetes'), exception=str(auth.KUBERNETES_IMPORT_ERROR))
    try:
        client = RawClient(auth.api_client(params))
        answer = cluster.read_cluster(client, params['namespace'], params['nfd_namespace'], params['runtime_class'],
                                      params['nfd_existing'], params['objects'])
    except (auth.K8sAuthError, ApiError, ListWatchError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **answer)


if __name__ == '__main__':
    main()
