# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The in-memory object store: API objects, one global resourceVersion counter, the watch event log.

Thread-safe: every read and write holds one lock. Stored objects are never mutated: each write
stores a fresh deep copy, so readers may serialise what they got without copying. Writes that
change nothing are not stored (no new resourceVersion, no watch event), as on a real API server.

What a write does, per type (see ResourceType): server-owned metadata (uid, creationTimestamp,
resourceVersion, generation), name and label validation, status kept on main-resource writes and
only status taken from /status writes, and the little defaulting clients can see everywhere:
Namespace phase, finalizer and ``kubernetes.io/metadata.name`` label, Pod phase and QoS class,
Secret ``stringData`` folded into ``data`` and type Opaque.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import bisect
import json
import random
import threading
import time
import uuid

from . import errors
from .errors import ApiError
from .patches import PatchError, json_patch, merge_patch, strategic_merge_patch
from .validation import metadata_causes, string_map_problem

MERGE_PATCH = 'application/merge-patch+json'
STRATEGIC_PATCH = 'application/strategic-merge-patch+json'
JSON_PATCH = 'application/json-patch+json'
APPLY_PATCH = 'application/apply-patch+yaml'
PATCH_TYPES = (JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH, APPLY_PATCH)

SEED_NAMESPACES = ('default', 'kube-system', 'kube-public', 'kube-node-lease')
_NAME_CHARS = 'bcdfghjklmnpqrstvwxz2456789'  # what the API server's generateName suffix uses
_SERVER_META = ('uid', 'creationTimestamp', 'generation', 'deletionTimestamp', 'deletionGracePeriodSeconds')


def now_rfc3339():
    return time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())


def deep_copy(obj):
    """A deep copy that also proves the object is plain JSON."""
    return json.loads(json.dumps(obj))


def _meta(obj):
    return obj.get('metadata') or {}


def _without_rv(obj):
    copy = dict(obj)
    meta = dict(_meta(obj))
    meta.pop('resourceVersion', None)
    copy['metadata'] = meta
    return copy


def _pod_qos(pod):
    """The QoS class the API server computes for a pod (cpu and memory only)."""
    spec = pod.get('spec') or {}
    containers = list(spec.get('containers') or []) + list(spec.get('initContainers') or [])
    any_set, guaranteed = False, bool(containers)
    for container in containers:
        resources = container.get('resources') or {}
        requests, limits = resources.get('requests') or {}, resources.get('limits') or {}
        for res in ('cpu', 'memory'):
            if res in requests or res in limits:
                any_set = True
            if res not in limits or (res in requests and str(requests[res]) != str(limits[res])):
                guaranteed = False
    if not any_set:
        return 'BestEffort'
    return 'Guaranteed' if guaranteed else 'Burstable'


class Expired(Exception):
    """A watch or continue token asked for events the store no longer keeps (HTTP 410)."""


class Store:
    """API objects by resource type, plus the event log watches read from."""

    def __init__(self, table, event_limit=50000):
        self.table = table
        self.event_limit = event_limit
        self._cond = threading.Condition(threading.RLock())
        self._rv = 0
        self._objects = {}
        self._events = []      # (rv, resource key, type, old object, new object)
        self._event_rvs = []   # the rv of each event, for bisect
        self._compacted = 0    # events up to this rv were dropped
        self._logs = {}
        self.reset()

    # -- bookkeeping -------------------------------------------------------------------------

    def reset(self):
        """Back to a fresh cluster: the four system namespaces, cluster-admin for system:masters and
        system:basic-user (self reviews) for everyone authenticated."""
        with self._cond:
            self._objects = dict((r.key, {}) for r in self.table.resources)
            self._logs = {}
            self._events, self._event_rvs = [], []
            self._compacted = self._rv
            namespaces = self.table.by_path('', 'v1', 'namespaces')
            for name in SEED_NAMESPACES:
                self.create(namespaces, None, {'metadata': {'name': name}})
            roles = self.table.by_path('rbac.authorization.k8s.io', 'v1', 'clusterroles')
            bindings = self.table.by_path('rbac.authorization.k8s.io', 'v1', 'clusterrolebindings')
            self.create(roles, None, {'metadata': {'name': 'cluster-admin'}, 'rules': [
                {'apiGroups': ['*'], 'resources': ['*'], 'verbs': ['*']}, {'nonResourceURLs': ['*'], 'verbs': ['*']}]})
            self.create(roles, None, {'metadata': {'name': 'system:basic-user'}, 'rules': [
                {'apiGroups': ['authorization.k8s.io'], 'resources': ['selfsubjectaccessreviews',
                                                                      'selfsubjectrulesreviews'], 'verbs': ['create']},
                {'apiGroups': ['authentication.k8s.io'], 'resources': ['selfsubjectreviews'], 'verbs': ['create']}]})
            self.create(bindings, None, {
                'metadata': {'name': 'system:basic-user'},
                'roleRef': {'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'ClusterRole', 'name': 'system:basic-user'},
                'subjects': [{'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'Group', 'name': 'system:authenticated'}]})
            self.create(bindings, None, {
                'metadata': {'name': 'cluster-admin'},
                'roleRef': {'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'ClusterRole', 'name': 'cluster-admin'},
                'subjects': [{'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'Group', 'name': 'system:masters'}]})

    @property
    def resource_version(self):
        with self._cond:
            return str(self._rv)

    def _commit(self, rtype, event_type, old, new):
        """Store new (None: delete old) with the next resourceVersion and log the watch event."""
        self._rv += 1
        rv = str(self._rv)
        bucket = self._objects[rtype.key]
        if new is None:
            meta = _meta(old)
            del bucket[(meta.get('namespace'), meta['name'])]
            final = dict(old)
            final['metadata'] = dict(meta, resourceVersion=rv)
            stored = final
        else:
            stored = deep_copy(new)
            stored['metadata']['resourceVersion'] = rv
            bucket[(stored['metadata'].get('namespace'), stored['metadata']['name'])] = stored
        self._events.append((self._rv, rtype.key, event_type, old, stored))
        self._event_rvs.append(self._rv)
        if len(self._events) > self.event_limit + self.event_limit // 2:
            drop = len(self._events) - self.event_limit
            self._compacted = self._event_rvs[drop - 1]
            del self._events[:drop]
            del self._event_rvs[:drop]
        self._cond.notify_all()
        return stored

    # -- reads -------------------------------------------------------------------------------

    def get(self, rtype, namespace, name):
        with self._cond:
            obj = self._objects[rtype.key].get((namespace if rtype.namespaced else None, name))
        if obj is None:
            raise errors.not_found(rtype, name)
        return obj

    def find(self, rtype, namespace, name):
        with self._cond:
            return self._objects[rtype.key].get((namespace if rtype.namespaced else None, name))

    def namespace_exists(self, namespace):
        with self._cond:
            return (None, namespace) in self._objects[('', 'namespaces')]

    def list(self, rtype, namespace=None, labels=None, fields=None, limit=0, continue_token=None):
        """(items, list resourceVersion, continue token or '', remaining count or None), sorted by
        namespace and name like etcd keys. A continued list reads the current objects after the
        last key (the real one reads a snapshot at the first page's revision)."""
        start, list_rv = None, None
        if continue_token:
            try:
                state = json.loads(base64.urlsafe_b64decode(continue_token.encode('ascii')).decode('utf-8'))
                start, list_rv = tuple(state['start']), str(state['rv'])
            except (ValueError, KeyError, TypeError, UnicodeError):
                raise errors.bad_request('continue key is not valid: invalid continue token')
            if int(list_rv) <= self._compacted:
                raise Expired('The provided continue parameter is too old to display a consistent list result. '
                              'You can start a new list without the continue parameter, or use the continue token '
                              'in this response to retrieve the remainder of the results. Continuing with the '
                              'provided token results in an inconsistent list - objects that were created, modified, '
                              'or deleted between the time the first chunk was returned and now may show up in the '
                              'list.')
        with self._cond:
            rv = list_rv or str(self._rv)
            bucket = self._objects[rtype.key]
            keys = sorted((k for k in bucket if namespace is None or k[0] == namespace), key=lambda k: (k[0] or '', k[1]))
            candidates = [bucket[k] for k in keys if start is None or (k[0] or '', k[1]) > (start[0] or '', start[1])]
        items = [o for o in candidates if (not labels or labels.matches(_meta(o).get('labels')))
                 and (not fields or fields.matches(o))]
        token, remaining = '', None
        if limit and len(items) > limit:
            last = _meta(items[limit - 1])
            token = base64.urlsafe_b64encode(json.dumps(
                {'rv': int(rv), 'start': [last.get('namespace') or '', last['name']]}).encode('utf-8')).decode('ascii')
            if not labels and not fields:
                remaining = len(items) - limit
            items = items[:limit]
        return items, rv, token, remaining

    def watch_start(self, rtype, namespace, resource_version, labels=None, fields=None):
        """(initial ADDED objects, rv to read events after). No resourceVersion or "0": the current
        objects first; otherwise only changes after it (410 when those were compacted)."""
        with self._cond:
            if not resource_version or resource_version == '0':
                items = self.list(rtype, namespace, labels, fields)[0]
                return items, self._rv
            try:
                after = int(resource_version)
            except ValueError:
                raise errors.bad_request('invalid resource version: %s' % resource_version)
            if after < self._compacted:
                raise Expired('too old resource version: %d (%d)' % (after, self._compacted + 1))
            return [], after

    def events_after(self, after, timeout):
        """Events with rv > after, waiting up to timeout seconds for the first one."""
        with self._cond:
            if after < self._compacted:
                raise Expired('too old resource version: %d (%d)' % (after, self._compacted + 1))
            if not self._event_rvs or self._event_rvs[-1] <= after:
                self._cond.wait(timeout)
            index = bisect.bisect_right(self._event_rvs, after)
            return self._events[index:]

    # -- writes ------------------------------------------------------------------------------

    def _check_body(self, rtype, namespace, body):
        """A deep copy of body with apiVersion, kind and namespace checked and set."""
        if not isinstance(body, dict):
            raise errors.bad_request('the body of the request must be a %s object' % rtype.kind)
        obj = deep_copy(body)
        api_version, kind = obj.get('apiVersion'), obj.get('kind')
        if api_version and api_version != rtype.api_version:
            raise errors.bad_request('the API version in the data (%s) does not match the expected API version (%s)'
                                     % (api_version, rtype.api_version))
        if kind and kind != rtype.kind:
            raise errors.bad_request('the kind in the data (%s) does not match the expected kind (%s)'
                                     % (kind, rtype.kind))
        obj['apiVersion'], obj['kind'] = rtype.api_version, rtype.kind
        meta = obj.get('metadata')
        if meta is None:
            meta = obj['metadata'] = {}
        if not isinstance(meta, dict):
            raise errors.bad_request('metadata must be an object')
        for field in ('labels', 'annotations'):
            problem = string_map_problem(meta, field)
            if problem:
                raise errors.bad_request(problem)
        if rtype.namespaced:
            if meta.get('namespace') and meta['namespace'] != namespace:
                raise errors.bad_request('the namespace of the provided object does not match the namespace sent '
                                         'on the request')
            meta['namespace'] = namespace
        else:
            meta.pop('namespace', None)
        return obj

    def _normalize(self, rtype, obj, old):
        """The per-type defaulting clients can observe."""
        meta = obj['metadata']
        if rtype.key == ('', 'secrets'):
            string_data = obj.pop('stringData', None) or {}
            if string_data:
                data = dict(obj.get('data') or {})
                for key, value in string_data.items():
                    data[key] = base64.b64encode(str(value).encode('utf-8')).decode('ascii')
                obj['data'] = data
            obj.setdefault('type', 'Opaque')
        elif rtype.key == ('', 'namespaces'):
            meta['labels'] = dict(meta.get('labels') or {}, **{'kubernetes.io/metadata.name': meta['name']})
            if old is None:
                spec = obj.setdefault('spec', {})
                spec.setdefault('finalizers', ['kubernetes'])
            elif 'spec' in old:  # finalizers change only through namespaces/finalize
                obj['spec'] = old['spec']
            else:
                obj.pop('spec', None)

    def _validate(self, rtype, obj):
        causes = metadata_causes(obj['metadata'], rtype)
        if causes:
            raise errors.invalid(rtype, obj['metadata'].get('name'), causes)

    def create(self, rtype, namespace, body, dry_run=False):
        obj = self._check_body(rtype, namespace, body)
        meta = obj['metadata']
        if meta.get('resourceVersion'):
            raise ApiError(500, 'Internal error occurred: resourceVersion should not be set on objects to be created')
        for field in _SERVER_META + ('managedFields', 'selfLink'):
            meta.pop(field, None)
        meta['uid'] = str(uuid.uuid4())
        meta['creationTimestamp'] = now_rfc3339()
        if rtype.generation:
            meta['generation'] = 1
        policy = rtype.status_on_create
        if policy == 'pod':
            obj['status'] = {'phase': 'Pending', 'qosClass': _pod_qos(obj)}
        elif isinstance(policy, dict):
            obj['status'] = deep_copy(policy)
        elif policy == 'clear' and rtype.has_status:
            obj.pop('status', None)
        with self._cond:
            if rtype.namespaced and not self.namespace_exists(namespace):
                raise errors.namespace_not_found(namespace)
            if not meta.get('name') and meta.get('generateName'):
                bucket = self._objects[rtype.key]
                while True:
                    name = meta['generateName'] + ''.join(random.choices(_NAME_CHARS, k=5))
                    if (meta.get('namespace'), name) not in bucket:
                        break
                meta['name'] = name
            self._normalize(rtype, obj, None)
            self._validate(rtype, obj)
            if (meta.get('namespace'), meta['name']) in self._objects[rtype.key]:
                raise errors.already_exists(rtype, meta['name'])
            if dry_run:
                return obj
            return self._commit(rtype, 'ADDED', None, obj)

    def _spec_changed(self, rtype, old, new):
        if rtype.custom:
            strip = ('metadata', 'status')
            return ({k: v for k, v in old.items() if k not in strip} != {k: v for k, v in new.items() if k not in strip})
        return old.get('spec') != new.get('spec')

    def update(self, rtype, namespace, name, body, subresource=None, dry_run=False, from_patch=False):
        """PUT (and the second half of PATCH): body replaces the object, or only its status on /status."""
        obj = self._check_body(rtype, namespace, body)
        meta = obj['metadata']
        if meta.get('name') != name:
            raise errors.bad_request('the name of the object (%s) does not match the name on the URL (%s)'
                                     % (meta.get('name') or '', name))
        with self._cond:
            old = self.get(rtype, namespace, name)
            old_meta = _meta(old)
            rv = meta.get('resourceVersion')
            if not rv and rtype.custom and not from_patch:
                raise errors.invalid(rtype, name, [('metadata.resourceVersion',
                                                    'Invalid value: 0x0: must be specified for an update')])
            if rv and rv != old_meta.get('resourceVersion'):
                raise errors.conflict(rtype, name)
            if meta.get('uid') and meta['uid'] != old_meta.get('uid'):
                raise errors.conflict(rtype, name, 'Precondition failed: UID in precondition: %s, UID in object meta: %s'
                                      % (meta['uid'], old_meta.get('uid')))
            if subresource == 'status':
                new = deep_copy(old)
                if 'status' in obj:
                    new['status'] = obj['status']
                else:
                    new.pop('status', None)
            else:
                new = obj
                for field in _SERVER_META:
                    if field in old_meta:
                        meta[field] = old_meta[field]
                    else:
                        meta.pop(field, None)
                meta.pop('selfLink', None)
                meta.pop('managedFields', None)  # the server's to write (and it writes none here)
                if rtype.has_status:
                    if 'status' in old:
                        new['status'] = old['status']
                    else:
                        new.pop('status', None)
                self._normalize(rtype, new, old)
                self._validate(rtype, new)
                if rtype.generation and self._spec_changed(rtype, old, new):
                    new['metadata']['generation'] = old_meta.get('generation', 0) + 1
            new['metadata']['resourceVersion'] = old_meta.get('resourceVersion')
            if _without_rv(new) == _without_rv(old):
                return old
            if dry_run:
                return new
            return self._commit(rtype, 'MODIFIED', old, new)

    def patch(self, rtype, namespace, name, content_type, patch, subresource=None, dry_run=False):
        """PATCH: apply to the stored object, then update (a stale resourceVersion in the patch conflicts)."""
        with self._cond:
            old = self.get(rtype, namespace, name)
            try:
                if content_type == MERGE_PATCH:
                    patched = merge_patch(old, patch)
                elif content_type == STRATEGIC_PATCH:
                    patched = strategic_merge_patch(old, patch)
                elif content_type == JSON_PATCH:
                    patched = json_patch(old, patch)
                else:
                    raise errors.unsupported_media_type(content_type, PATCH_TYPES)
            except PatchError as exc:
                raise ApiError(exc.code, str(exc))
            if not isinstance(patched, dict):
                raise ApiError(422, 'the patch did not produce an object')
            patched_meta = patched.get('metadata') if isinstance(patched.get('metadata'), dict) else {}
            if patched_meta.get('name') != name:
                raise errors.invalid(rtype, name, [('metadata.name', 'Invalid value: "%s": field is immutable'
                                                    % patched_meta.get('name'))])
            if rtype.namespaced and patched_meta.get('namespace') != namespace:
                raise errors.invalid(rtype, name, [('metadata.namespace', 'Invalid value: "%s": field is immutable'
                                                    % patched_meta.get('namespace'))])
            return self.update(rtype, namespace, name, patched, subresource, dry_run, from_patch=True)

    def apply(self, rtype, namespace, name, body, subresource=None, dry_run=False):
        """Server-side apply, approximated: create when absent, else a merge of the applied
        configuration (strategic for built-in types). No field ownership, no conflicts, and fields
        dropped from the configuration are not removed."""
        with self._cond:
            if self.find(rtype, namespace, name) is None and subresource is None:
                if isinstance(body, dict) and _meta(body).get('name') not in (None, name):
                    raise errors.bad_request('the name of the object (%s) does not match the name on the URL (%s)'
                                             % (_meta(body).get('name'), name))
                body = dict(body, metadata=dict(_meta(body), name=name))
                return self.create(rtype, namespace, body, dry_run)
            kind = MERGE_PATCH if rtype.custom else STRATEGIC_PATCH
            return self.patch(rtype, namespace, name, kind, body, subresource, dry_run)

    def delete(self, rtype, namespace, name, options=None, dry_run=False):
        """Delete now (no finalizers, no grace period); a namespace takes its objects with it."""
        preconditions = (options or {}).get('preconditions') or {}
        with self._cond:
            old = self.get(rtype, namespace, name)
            old_meta = _meta(old)
            for field, label in (('uid', 'UID'), ('resourceVersion', 'ResourceVersion')):
                if preconditions.get(field) and preconditions[field] != old_meta.get(field):
                    raise errors.conflict(rtype, name, 'Precondition failed: %s in precondition: %s, %s in object '
                                                       'meta: %s' % (label, preconditions[field], label,
                                                                     old_meta.get(field)))
            if dry_run:
                return old
            if rtype.key == ('', 'namespaces'):
                for other in self.table.resources:
                    if other.namespaced:
                        for key in [k for k in self._objects[other.key] if k[0] == name]:
                            self._commit(other, 'DELETED', self._objects[other.key][key], None)
                self._logs = dict((k, v) for k, v in self._logs.items() if k[0] != name)
            if rtype.key == ('', 'pods'):
                self._logs.pop((namespace, name), None)
            return self._commit(rtype, 'DELETED', old, None)

    def delete_collection(self, rtype, namespace, labels=None, fields=None, dry_run=False):
        with self._cond:
            items = self.list(rtype, namespace, labels, fields)[0]
            return [self.delete(rtype, _meta(o).get('namespace'), _meta(o)['name'], dry_run=dry_run) for o in items]

    def bind(self, namespace, name, node, annotations=None, preconditions=None, dry_run=False):
        """pods/binding, as the real BindingREST does it: set spec.nodeName once (409 when already
        bound), copy the Binding's annotations and set the PodScheduled condition."""
        pods = self.table.by_path('', 'v1', 'pods')
        with self._cond:
            old = self.get(pods, namespace, name)
            for field, label in (('uid', 'UID'), ('resourceVersion', 'ResourceVersion')):
                wanted = (preconditions or {}).get(field)
                if wanted and wanted != _meta(old).get(field):
                    raise errors.conflict(pods, name, '%s in precondition: %s, %s in object meta: %s'
                                          % (label, wanted, label, _meta(old).get(field)))
            pod = deep_copy(old)
            spec, status = pod.setdefault('spec', {}), pod.setdefault('status', {})
            if spec.get('nodeName'):
                raise errors.conflict(pods, name, 'pod %s is already assigned to node "%s"' % (name, spec['nodeName']))
            if spec.get('schedulingGates'):
                raise errors.conflict(pods, name, 'pod %s has non-empty .spec.schedulingGates' % name)
            spec['nodeName'] = node
            if annotations:
                pod['metadata']['annotations'] = dict(_meta(pod).get('annotations') or {}, **annotations)
            conditions = [c for c in status.get('conditions') or () if c.get('type') != 'PodScheduled']
            scheduled = next((c for c in status.get('conditions') or () if c.get('type') == 'PodScheduled'), {})
            since = scheduled.get('lastTransitionTime') if scheduled.get('status') == 'True' else now_rfc3339()
            status['conditions'] = conditions + [{'type': 'PodScheduled', 'status': 'True', 'lastProbeTime': None,
                                                  'lastTransitionTime': since}]
            if dry_run:
                return pod
            return self._commit(pods, 'MODIFIED', old, pod)

    # -- emulator extras ---------------------------------------------------------------------

    def set_log(self, namespace, name, text):
        with self._cond:
            self._logs[(namespace, name)] = text

    def get_log(self, namespace, name):
        pods = self.table.by_path('', 'v1', 'pods')
        with self._cond:
            self.get(pods, namespace, name)
            return self._logs.get((namespace, name), '')

    def add_nodes(self, count, prefix='node-', labels=None, start=0):
        """Create count Nodes (API objects only) named PREFIX00000..., Ready, 8 CPUs, 32 GiB."""
        nodes = self.table.by_path('', 'v1', 'nodes')
        created = []
        for index in range(start, start + count):
            name = '%s%05d' % (prefix, index)
            node_labels = {'kubernetes.io/hostname': name, 'kubernetes.io/os': 'linux', 'kubernetes.io/arch': 'amd64',
                           'beta.kubernetes.io/os': 'linux', 'beta.kubernetes.io/arch': 'amd64'}
            node_labels.update(labels or {})
            capacity = {'cpu': '8', 'memory': '32Gi', 'pods': '110', 'ephemeral-storage': '100Gi'}
            created.append(self.create(nodes, None, {
                'apiVersion': 'v1', 'kind': 'Node', 'metadata': {'name': name, 'labels': node_labels},
                'spec': {},
                'status': {
                    'capacity': capacity, 'allocatable': dict(capacity),
                    'conditions': [{'type': 'Ready', 'status': 'True', 'reason': 'KubeletReady',
                                    'message': 'kubelet is posting ready status',
                                    'lastHeartbeatTime': now_rfc3339(), 'lastTransitionTime': now_rfc3339()}],
                    'addresses': [{'type': 'Hostname', 'address': name}],
                    'nodeInfo': {'architecture': 'amd64', 'operatingSystem': 'linux', 'kubeletVersion': 'v1.31.0',
                                 'containerRuntimeVersion': 'containerd://1.7.24', 'kernelVersion': '6.1.0',
                                 'osImage': 'Debian GNU/Linux 12 (bookworm)', 'kubeProxyVersion': 'v1.31.0',
                                 'machineID': '', 'systemUUID': '', 'bootID': ''}}}))
        return created
