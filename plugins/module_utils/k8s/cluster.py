# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the device_plugin and feature_discovery roles must know of a cluster before they change it,
read with one client in one module call (each read a kubernetes.core.k8s_info task would cost a
process and a second).

Plain Python over ``api.RawClient``: one request per API path, no typed API to import.

* ``read_cluster`` returns the GPU components gpuready.nvidia did not deploy (``workloads.gpu_components``
  over every DaemonSet and the GPU Operator's ClusterPolicies), the namespaces, the RuntimeClass, NFD's
  NodeFeature CRD, whether the NodeFeature API is served and, when asked, an existing NFD's nfd-master
  Deployment and nfd-worker DaemonSet. A missing object is None; an API the server does not serve
  (no GPU Operator, no NFD) reads as none, as kubernetes.core.k8s_info's ``api_found: false`` does.
* With the objects a role renders, it also says which of them are ``current``: the live object holds every
  field of the rendered one, including the ``FINGERPRINT_ANNOTATION`` (``fingerprinted``) that the roles
  apply with each object. A server-side apply of a current object would change nothing: nobody changed or
  removed a field we set (``holds``), and the template renders what it rendered then (the fingerprint), so
  there is no field it dropped that the apply would remove. The roles apply only the others (``to_apply``).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy
import functools
import hashlib
import json

from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s.api import (
    ApiError, call_api, json_body, list_all, path_of, read_object)
from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s.workloads import gpu_components

NODE_FEATURE_CRD = 'nodefeatures.nfd.k8s-sigs.io'
FINGERPRINT_ANNOTATION = 'gpuready.nvidia/rendered'

# Applied on every run, without a fingerprint: on the lab, the annotation on NFD's CRDs made the first
# site.yml run's NFD apply about 20 s slower (bench site_rerun, 3 runs each way; the cause is not known).
ALWAYS_APPLIED_KINDS = ('CustomResourceDefinition',)

# kind: (plural, namespaced) of each kind the collection's templates render
# (tests/unit/module_utils/k8s/test_cluster.py renders them all); any other kind is never current.
RENDERED_KINDS = {
    'ClusterRole': ('clusterroles', False),
    'ClusterRoleBinding': ('clusterrolebindings', False),
    'ConfigMap': ('configmaps', True),
    'CustomResourceDefinition': ('customresourcedefinitions', False),
    'DaemonSet': ('daemonsets', True),
    'Deployment': ('deployments', True),
    'Namespace': ('namespaces', False),
    'Role': ('roles', True),
    'RoleBinding': ('rolebindings', True),
    'RuntimeClass': ('runtimeclasses', False),
    'ServiceAccount': ('serviceaccounts', True),
}


def _compact(obj):
    """The object without metadata.managedFields, which nothing here reads and which is most of its size."""
    if obj is None:
        return None
    metadata = dict(obj.get('metadata') or {})
    metadata.pop('managedFields', None)
    return dict(obj, metadata=metadata)


def _served(what, list_func):
    """The objects of a LIST, none where the API group or kind is not served (404)."""
    try:
        return list_all(what, list_func)
    except ApiError as exc:
        if exc.status == 404:
            return []
        raise


def _node_feature_api(client, namespace):
    """Whether the NodeFeature API is served: one LIST of at most one object (GFD writes one per node)."""
    try:
        json_body(call_api('listing NodeFeatures in namespace %s' % namespace, client.get,
                           path_of('nfd.k8s-sigs.io/v1alpha1', 'nodefeatures', namespace=namespace), limit=1))
        return True
    except ApiError as exc:
        if exc.status == 404:
            return False
        raise


def read_cluster(client, namespace, nfd_namespace, runtime_class, nfd_existing=None, objects=()):
    """{found, namespace, nfd_namespace, runtime_class, node_feature_crd, node_feature_api, nfd_existing,
    current}. client is an api.RawClient; nfd_existing, when given, is {namespace, master, worker}
    (nfd_existing in the answer is then {master: Deployment or None, worker: DaemonSet or None}, else None);
    current is the object_key of each of objects (rendered objects) that is current. Raises ApiError."""
    daemonsets = list_all('listing DaemonSets in all namespaces',
                          functools.partial(client.get, path_of('apps/v1', 'daemonsets')))
    policies = _served('listing GPU Operator ClusterPolicies',
                       functools.partial(client.get, path_of('nvidia.com/v1', 'clusterpolicies')))
    ours = _read(client, 'Namespace', 'v1', 'namespaces', namespace)
    return {
        'found': gpu_components(daemonsets, policies),
        'namespace': ours,
        'nfd_namespace': ours if nfd_namespace == namespace else _read(client, 'Namespace', 'v1', 'namespaces',
                                                                       nfd_namespace),
        'runtime_class': _read(client, 'RuntimeClass', 'node.k8s.io/v1', 'runtimeclasses', runtime_class),
        'node_feature_crd': _read(client, 'CustomResourceDefinition', 'apiextensions.k8s.io/v1',
                                  'customresourcedefinitions', NODE_FEATURE_CRD),
        'node_feature_api': _node_feature_api(client, namespace),
        'nfd_existing': {
            'master': _read(client, 'Deployment', 'apps/v1', 'deployments', nfd_existing['master'],
                            nfd_existing['namespace']),
            'worker': _read(client, 'DaemonSet', 'apps/v1', 'daemonsets', nfd_existing['worker'],
                            nfd_existing['namespace']),
        } if nfd_existing else None,
        'current': [object_key(obj) for obj in objects if _current(client, obj)],
    }


def _read(client, kind, api_version, plural, name, namespace=None):
    """The object without its managedFields, or None where it does not exist."""
    what = 'reading %s %s%s' % (kind, '%s/' % namespace if namespace else '', name)
    return _compact(read_object(what, client.get, path_of(api_version, plural, name, namespace),
                                missing_ok=True))


# --- what is applied already ---------------------------------------------------------------------


def object_key(obj):
    """'apiVersion Kind namespace/name', or 'apiVersion Kind name' without a namespace."""
    metadata = obj.get('metadata') or {}
    where = '%s/' % metadata['namespace'] if metadata.get('namespace') else ''
    return '%s %s %s%s' % (obj.get('apiVersion'), obj.get('kind'), where, metadata.get('name'))


def fingerprint(obj):
    """The sha256 of the object as rendered (without its fingerprint annotation), keys sorted."""
    plain = copy.deepcopy(obj)
    annotations = (plain.get('metadata') or {}).get('annotations')
    if annotations:
        annotations.pop(FINGERPRINT_ANNOTATION, None)
        if not annotations:
            del plain['metadata']['annotations']
    return hashlib.sha256(json.dumps(plain, sort_keys=True, separators=(',', ':')).encode('utf-8')).hexdigest()


def fingerprinted(obj):
    """A copy of the object carrying its fingerprint in the FINGERPRINT_ANNOTATION (ALWAYS_APPLIED_KINDS
    none): what the roles apply."""
    marked = copy.deepcopy(obj)
    if obj.get('kind') in ALWAYS_APPLIED_KINDS:
        return marked
    metadata = marked.setdefault('metadata', {})
    metadata['annotations'] = dict(metadata.get('annotations') or {}, **{FINGERPRINT_ANNOTATION: fingerprint(obj)})
    return marked


def holds(live, rendered):
    """Whether live holds every field of rendered: maps key by key, lists item by item with as many items,
    other values equal. An empty map or list, or null, in rendered is held by a missing field too (the API
    server drops them)."""
    if rendered in ({}, [], None) and live is None:
        return True
    if isinstance(rendered, dict):
        return isinstance(live, dict) and all(holds(live.get(key), value) for key, value in rendered.items())
    if isinstance(rendered, list):
        return isinstance(live, list) and len(live) == len(rendered) and all(
            holds(item, want) for item, want in zip(live, rendered))
    return type(live) is type(rendered) and live == rendered


def to_apply(objects, current):
    """The objects whose object_key is not in current, fingerprinted: what a role applies."""
    current = set(current or ())
    return [fingerprinted(obj) for obj in objects if object_key(obj) not in current]


def _current(client, obj):
    """Whether the live object holds the fingerprinted rendered one (False for a kind not in RENDERED_KINDS
    and for ALWAYS_APPLIED_KINDS, which are not read)."""
    kind, metadata = obj.get('kind'), obj.get('metadata') or {}
    if kind not in RENDERED_KINDS or kind in ALWAYS_APPLIED_KINDS or not metadata.get('name'):
        return False
    plural, namespaced = RENDERED_KINDS[kind]
    if namespaced and not metadata.get('namespace'):
        return False
    live = _read(client, kind, str(obj.get('apiVersion')), plural, metadata['name'],
                 metadata['namespace'] if namespaced else None)
    return live is not None and holds(live, fingerprinted(obj))
