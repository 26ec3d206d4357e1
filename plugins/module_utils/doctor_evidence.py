# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the API says, for the doctor: ``api_evidence`` reads once, for all nodes, the DaemonSets,
Deployments and RuntimeClasses, the device plugin's namespaces and events, the GPU pods nobody
scheduled, and per node its Node object and pods (with the device plugin's and failed GPU pods'
logs and events). Nodes and pods come from one paginated LIST each, for any number of nodes.
Every read goes through ``k8s.api`` (its retries of 5xx, 429 and dropped connections; its messages)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s.api import (
    ApiError, ListWatchError, call_api, list_all, read_object)
from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s.workloads import DEVICE_PLUGIN, classify, gpu_requests

LOG_TAIL_LINES = 50
RECENT_PODS = 20  # GPU-requesting pods looked at per node by the workload link


class DoctorError(Exception):
    """The API refused or could not answer; the message says what was asked, never credentials."""


def _pod_log(core, pod, previous=False):
    meta = pod['metadata']
    try:
        response = call_api('reading the log of pod %s/%s' % (meta['namespace'], meta['name']),
                            core.read_namespaced_pod_log, meta['name'], meta['namespace'], tail_lines=LOG_TAIL_LINES,
                            previous=previous, _preload_content=False)
    except ApiError as exc:
        if exc.status in (401, 403):
            raise  # without the permission nothing it could not read may be judged ok
        return ''  # a log that cannot be read (not started, no previous one) is no evidence; the rest still is
    try:
        return response.data.decode('utf-8', 'replace')
    finally:
        response.release_conn()


def _events(core, obj):
    meta = obj['metadata']
    selector = 'involvedObject.name=%s' % meta['name']
    namespace = meta.get('namespace') or 'default'
    try:
        return list_all('listing the events of %s/%s' % (namespace, meta['name']), core.list_namespaced_event,
                        namespace=namespace, field_selector=selector)
    except ApiError as exc:
        if exc.status in (401, 403):
            raise
        return []


def api_evidence(core, apps, node_api, node_names):
    """{cluster: {...}, nodes: {name: {...}}}: what the API says, read once for all nodes."""
    try:
        cluster = {
            'daemonsets': list_all('listing DaemonSets in all namespaces', apps.list_daemon_set_for_all_namespaces),
            'deployments': list_all('listing Deployments in all namespaces', apps.list_deployment_for_all_namespaces),
            'runtime_classes': list_all('listing RuntimeClasses', node_api.list_runtime_class),
            'namespaces': {},
            'events': {},
        }
        for ds in cluster['daemonsets']:
            if classify(ds) == DEVICE_PLUGIN:
                namespace = ds['metadata']['namespace']
                if namespace not in cluster['namespaces']:
                    cluster['namespaces'][namespace] = read_object('reading namespace %s' % namespace, core.read_namespace,
                                                                   namespace)
                cluster['events']['%s/%s' % (namespace, ds['metadata']['name'])] = _events(core, ds)
        # One paginated LIST per kind, whatever the number of nodes: a read per node costs a fleet 2N requests.
        wanted = set(node_names)
        listed = dict((n['metadata']['name'], n) for n in list_all('listing nodes', core.list_node)
                      if n['metadata']['name'] in wanted)
        pods_on = dict((name, []) for name in node_names)
        pending = []
        for pod in list_all('listing pods in all namespaces', core.list_pod_for_all_namespaces):
            node_name = (pod.get('spec') or {}).get('nodeName')
            if node_name in pods_on:
                pods_on[node_name].append(pod)
            elif not node_name and (pod.get('status') or {}).get('phase') == 'Pending' and gpu_requests(pod):
                pending.append(pod)
        for pod in pending[:RECENT_PODS]:
            pod['events'] = _events(core, pod)
        cluster['unscheduled_gpu_pods'] = pending
        nodes = {}
        for name in node_names:
            pods = pods_on[name]
            for pod in pods:
                component = classify(pod)
                if component == DEVICE_PLUGIN or (gpu_requests(pod) and component is None):
                    restarted = any(s.get('restartCount') for s in (pod.get('status') or {}).get('containerStatuses') or [])
                    pod['log'] = _pod_log(core, pod)
                    pod['previous_log'] = _pod_log(core, pod, previous=True) if restarted else ''
                    pod['events'] = _events(core, pod)
            nodes[name] = {'node': listed.get(name), 'pods': pods}
        cluster['nodes'] = nodes
        return cluster
    except (ApiError, ListWatchError) as exc:
        raise DoctorError(str(exc))
