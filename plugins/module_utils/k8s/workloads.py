# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the GPU workloads in a cluster are, whose they are, and where their pods may go.

Plain Python over the objects' dicts (a k8s_info result's resources, a raw API answer, a fixture).

* ``classify`` says which GPU component a DaemonSet, Deployment or pod runs: the NVIDIA device
  plugin, its MPS control daemon, GPU Feature Discovery (GFD), a part of Node Feature Discovery
  (NFD), or none. The device_plugin role's preflight (through the ``gpu_components`` filter) and the
  doctor both ask it, so they cannot disagree.
* ``owned`` is the one rule for "deployed by gpuready.nvidia": the label ``OWNED_LABELS`` names,
  which every template of the collection writes.
* ``placement_problem`` says why a pod spec cannot go to a node (nodeSelector, required node
  affinity, taints), as the scheduler and the DaemonSet controller decide it.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import re

from ansible.module_utils.parsing.convert_bool import boolean

# --- ownership -----------------------------------------------------------------------------------

MANAGED_BY = 'app.kubernetes.io/managed-by'
OWNER = 'gpuready.nvidia'
OWNED_LABELS = {MANAGED_BY: OWNER}


def labels_of(obj):
    """An object's metadata.labels ({} when it has none, or when obj is None)."""
    return ((obj or {}).get('metadata') or {}).get('labels') or {}


def owned(obj):
    """Whether gpuready.nvidia deployed the object: its labels say app.kubernetes.io/managed-by:
    gpuready.nvidia. None (an object that is not there) is not ours."""
    return labels_of(obj).get(MANAGED_BY) == OWNER


def owned_selectors(selectors=None):
    """Label selectors (key=value strings) that pick only our objects: ours, then selectors."""
    return ['%s=%s' % (MANAGED_BY, OWNER)] + list(selectors or [])


# --- the classifier ------------------------------------------------------------------------------

DEVICE_PLUGIN = 'device-plugin'
MPS_CONTROL_DAEMON = 'mps-control-daemon'
GFD = 'gpu-feature-discovery'
NFD_MASTER = 'nfd-master'
NFD_WORKER = 'nfd-worker'
NFD = 'node-feature-discovery'  # another part of NFD (nfd-gc, nfd-topology-updater), or one known by name only
GPU_OPERATOR = 'gpu-operator'
NFD_PARTS = (NFD_MASTER, NFD_WORKER, NFD)

# A workload with several of these is what comes first: a pod with a plugin container registers
# GPUs with the kubelet whatever else it runs.
PRECEDENCE = (DEVICE_PLUGIN, GFD, MPS_CONTROL_DAEMON, NFD_MASTER, NFD_WORKER, NFD)

# The programs each component runs, looked for in a container's command and args. The
# k8s-device-plugin image holds the plugin, GFD, the MPS control daemon and config-manager (a
# sidecar), so the program, not the image, says what a container is. Earlier entries win where a
# script runs several.
PROGRAMS = (
    (GFD, 'gpu-feature-discovery'),
    (MPS_CONTROL_DAEMON, 'mps-control-daemon'),
    (DEVICE_PLUGIN, 'nvidia-device-plugin'),
    (NFD_MASTER, 'nfd-master'),
    (NFD_WORKER, 'nfd-worker'),
    (NFD, 'nfd-gc'),
    (NFD, 'nfd-topology-updater'),
)

# Names and app labels of the upstream static manifests, Helm charts and GPU Operator: what a
# workload is when its commands do not say (a shell wrapper such as the GPU Operator's
# /bin/entrypoint.sh, no command at all: the GPU Operator runs GFD from the plugin's image without
# one). Earlier entries win: the Helm chart names its MPS daemon <release>-nvidia-device-plugin-mps-control-daemon.
NAMES = (
    (GFD, 'gpu-feature-discovery'),
    (MPS_CONTROL_DAEMON, 'mps-control-daemon'),
    (NFD_MASTER, 'nfd-master'),
    (NFD_WORKER, 'nfd-worker'),
    (NFD, 'node-feature-discovery'),
    (DEVICE_PLUGIN, 'nvidia-device-plugin'),
)
NAME_LABELS = ('app.kubernetes.io/name', 'app', 'name')


def _image_is(image, repository):
    """Whether an image reference is repository (last path part) at any registry, tag or digest."""
    return re.search(r'(^|/)%s([:@]|$)' % re.escape(repository), image or '') is not None


def _programs(argv):
    """The program names a command line may run: each word (words of a `sh -c` script too) without
    its directory. An option naming one (-server=nfd-master:8080) is not running it."""
    for word in ' '.join(str(part) for part in argv).split():
        yield word.strip('"\';&|()').rsplit('/', 1)[-1]


def _program_component(container):
    """What a container's command and args say it runs, or None."""
    programs = set(_programs((container.get('command') or []) + (container.get('args') or [])))
    for component, program in PROGRAMS:
        if program in programs:
            return component
    return None


def _image_component(container):
    """What a container's image runs when no command replaces its entrypoint, or None."""
    image = container.get('image') or ''
    if _image_is(image, 'gpu-feature-discovery'):
        return GFD
    if _image_is(image, 'node-feature-discovery'):
        return NFD
    if _image_is(image, 'k8s-device-plugin') and not container.get('command'):
        return DEVICE_PLUGIN
    return None


def container_component(container):
    """What one container runs (a component of this module, or None): its command and args name
    the program; without a command the image's own entrypoint runs, which for the k8s-device-plugin
    image is the plugin. A shell or another program on the plugin image is none of them."""
    return _program_component(container) or _image_component(container)


def _pod_spec(obj):
    """The pod spec of a pod, or of a DaemonSet's or Deployment's template."""
    spec = obj.get('spec') or {}
    return (spec.get('template') or {}).get('spec') or spec


def _names(obj):
    spec = obj.get('spec') or {}
    labels = dict(labels_of(obj), **labels_of(spec.get('template')))
    return [(obj.get('metadata') or {}).get('name') or ''] + [labels.get(key) or '' for key in NAME_LABELS]


def _first(found):
    for component in PRECEDENCE:
        if component in found:
            return component
    return None


def classify(obj):
    """Which GPU component a DaemonSet, Deployment or pod runs (a component of this module), or None.
    The programs its containers' commands name decide (init containers count, as the MPS daemon's
    mount-shm does); where they name none (a shell wrapper such as the GPU Operator's), the names and
    app labels that the upstream manifests, Helm charts and GPU Operator give it; where those say
    nothing, the images (see container_component)."""
    spec = _pod_spec(obj)
    containers = (spec.get('containers') or []) + (spec.get('initContainers') or [])
    component = _first(set(_program_component(c) for c in containers))
    if component:
        return component
    names = _names(obj)
    for component, name in NAMES:
        if any(name in candidate for candidate in names):
            return component
    return _first(set(_image_component(c) for c in containers))


def _resources(result):
    """The objects of a k8s_info result (or a plain list of objects)."""
    if isinstance(result, dict):
        return result.get('resources') or []
    return list(result or [])


def _selector(obj):
    match_labels = ((obj.get('spec') or {}).get('selector') or {}).get('matchLabels') or {}
    return ['%s=%s' % item for item in match_labels.items()]


def gpu_components(daemonsets, cluster_policies=None):
    """What gpuready.nvidia did not deploy among the DaemonSets and GPU Operator ClusterPolicies
    (k8s_info results or lists): [{component, kind, namespace, name, selector}], component one of
    device-plugin, mps-control-daemon, gpu-feature-discovery, node-feature-discovery or gpu-operator
    (the parts of NFD are one component here), selector the DaemonSet's matchLabels as key=value.
    A ClusterPolicy counts only while its device plugin is enabled (the default)."""
    found = []
    for daemonset in _resources(daemonsets):
        if owned(daemonset):
            continue
        component = classify(daemonset)
        if component is None:
            continue
        metadata = daemonset.get('metadata') or {}
        found.append({'component': NFD if component in NFD_PARTS else component, 'kind': 'DaemonSet',
                      'namespace': metadata.get('namespace'), 'name': metadata.get('name'),
                      'selector': _selector(daemonset)})
    for policy in _resources(cluster_policies):
        enabled = ((policy.get('spec') or {}).get('devicePlugin') or {}).get('enabled')
        if enabled is None or boolean(enabled, strict=False):
            found.append({'component': GPU_OPERATOR, 'kind': 'ClusterPolicy', 'namespace': None,
                          'name': (policy.get('metadata') or {}).get('name'), 'selector': []})
    return found


def owner_daemonset(pod):
    """The name of the DaemonSet that owns a pod, or None."""
    for ref in (pod.get('metadata') or {}).get('ownerReferences') or []:
        if ref.get('kind') == 'DaemonSet':
            return ref.get('name')
    return None


def gpu_requests(pod):
    """{resource: count} of nvidia.com/* limits and requests over the pod's containers."""
    found = {}
    for container in (pod.get('spec') or {}).get('containers') or []:
        resources = container.get('resources') or {}
        for section in ('limits', 'requests'):
            for name, value in (resources.get(section) or {}).items():
                if name.startswith('nvidia.com/'):
                    found[name] = max(found.get(name, 0), int(value))
    return found


# --- scheduling rules ----------------------------------------------------------------------------

# Taints the DaemonSet controller tolerates on its own (kubernetes daemon/util AddOrUpdateDaemonPodTolerations).
DAEMONSET_TOLERATED = ('node.kubernetes.io/not-ready', 'node.kubernetes.io/unreachable',
                       'node.kubernetes.io/disk-pressure', 'node.kubernetes.io/memory-pressure',
                       'node.kubernetes.io/pid-pressure', 'node.kubernetes.io/unschedulable',
                       'node.kubernetes.io/network-unavailable')


def _requirement_matches(labels, req):
    key, op, values = req.get('key'), req.get('operator'), req.get('values') or []
    value = labels.get(key)
    if op == 'In':
        return value in values
    if op == 'NotIn':
        return value not in values
    if op == 'Exists':
        return key in labels
    if op == 'DoesNotExist':
        return key not in labels
    if op in ('Gt', 'Lt'):
        try:
            number, limit = int(value), int(values[0])
        except (TypeError, ValueError, IndexError):
            return False
        return number > limit if op == 'Gt' else number < limit
    return False


def _describe_requirement(req):
    values = req.get('values') or []
    return '%s %s%s' % (req.get('key'), req.get('operator'), ' %s' % values if values else '')


def placement_problem(pod_spec, node):
    """Why a pod with this spec cannot go to the node: (kind, why) with kind affinity (nodeSelector,
    required node affinity) or taint; None when it can."""
    labels = labels_of(node)
    for key, value in (pod_spec.get('nodeSelector') or {}).items():
        if labels.get(key) != value:
            return 'affinity', 'nodeSelector %s=%s; the node has %s' % (
                key, value, '%s=%s' % (key, labels[key]) if key in labels else 'no label %s' % key)
    required = (((pod_spec.get('affinity') or {}).get('nodeAffinity') or {})
                .get('requiredDuringSchedulingIgnoredDuringExecution') or {})
    terms = required.get('nodeSelectorTerms') or []
    if terms and not any(all(_requirement_matches(labels, r) for r in term.get('matchExpressions') or [])
                         for term in terms):
        wanted = ' or '.join('(%s)' % ', '.join(_describe_requirement(r) for r in t.get('matchExpressions') or [])
                             for t in terms)
        present = sorted(k for k in labels if k.startswith(('nvidia.com/', 'feature.node.kubernetes.io/pci')))
        return 'affinity', 'required node affinity %s; the node\'s GPU labels: %s' % (
            wanted, ', '.join('%s=%s' % (k, labels[k]) for k in present) or 'none')
    tolerations = pod_spec.get('tolerations') or []
    for taint in (node.get('spec') or {}).get('taints') or []:
        if taint.get('effect') not in ('NoSchedule', 'NoExecute') or taint.get('key') in DAEMONSET_TOLERATED:
            continue
        if not any(tolerates(t, taint) for t in tolerations):
            return 'taint', 'taint %s=%s:%s is not tolerated (tolerations: %s)' % (
                taint.get('key'), taint.get('value', ''), taint.get('effect'), json.dumps(tolerations, sort_keys=True))
    return None


def tolerates(toleration, taint):
    """Whether one toleration tolerates one taint."""
    if toleration.get('effect') and toleration['effect'] != taint.get('effect'):
        return False
    if not toleration.get('key'):
        return toleration.get('operator') == 'Exists'
    if toleration['key'] != taint.get('key'):
        return False
    if toleration.get('operator') == 'Exists':
        return True
    return (toleration.get('value') or '') == (taint.get('value') or '')
