# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The resource types the emulator serves, as data: one ResourceType per REST resource.

Adding a resource is one more entry in RESOURCES. Each entry says what the real API server's
registry strategy does for that type where it matters to clients: which subresources exist,
what happens to ``status`` on create, whether ``metadata.generation`` is maintained, which
field selectors are supported, how names are validated, and whether the type is a custom
resource (served by apiextensions: no strategic merge patch, resourceVersion required on PUT,
list items keep apiVersion/kind).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

FULL_VERBS = ('create', 'delete', 'deletecollection', 'get', 'list', 'patch', 'update', 'watch')
SUBRESOURCE_VERBS = {'status': ('get', 'patch', 'update'), 'log': ('get',), 'binding': ('create',),
                     'token': ('create',)}
# Subresources whose body is of another kind than their resource (discovery names it, as the real server does).
SUBRESOURCE_KINDS = {'binding': {'kind': 'Binding'},
                     'token': {'group': 'authentication.k8s.io', 'version': 'v1', 'kind': 'TokenRequest'}}

# Field selectors every resource supports (k8s.io/apiserver DefaultClusterScopedAttr / DefaultNamespaceScopedAttr).
COMMON_FIELD_LABELS = ('metadata.name', 'metadata.namespace')


class ResourceType:
    """One REST resource (group, version, plural) and the registry behaviour clients can see."""

    def __init__(self, group, version, resource, kind, namespaced, singular, short_names=(), categories=(),
                 verbs=FULL_VERBS, subresources=(), status_on_create='clear', generation=False, custom=False,
                 name_rule='subdomain', field_labels=(), field_defaults=None, delete_returns_object=False,
                 review=None):
        self.group = group
        self.version = version
        self.resource = resource
        self.kind = kind
        self.namespaced = namespaced
        self.singular = singular
        self.short_names = tuple(short_names)
        self.categories = tuple(categories)
        self.verbs = tuple(verbs)
        self.subresources = tuple(subresources)
        # 'keep' (the body's status is stored, as for nodes), 'clear' (status is reset, set to
        # an empty status below), or a dict used as the initial status.
        self.status_on_create = status_on_create
        self.generation = generation
        self.custom = custom
        self.name_rule = name_rule
        self.field_labels = COMMON_FIELD_LABELS + tuple(field_labels)
        self.field_defaults = dict(field_defaults or {})
        # DELETE answers with the deleted object (pods, services, service accounts) instead of a Status.
        self.delete_returns_object = delete_returns_object
        # 'access' (SelfSubjectAccessReview) or 'self' (SelfSubjectReview): create-only, answered, never stored.
        self.review = review

    @property
    def api_version(self):
        """apiVersion of objects: "v1" for the core group, "apps/v1" otherwise."""
        return '%s/%s' % (self.group, self.version) if self.group else self.version

    @property
    def list_kind(self):
        return self.kind + 'List'

    @property
    def qualified(self):
        """The name used in error messages: "nodes", "daemonsets.apps"."""
        return '%s.%s' % (self.resource, self.group) if self.group else self.resource

    @property
    def has_status(self):
        return 'status' in self.subresources

    @property
    def key(self):
        return (self.group, self.resource)

    def discovery_entries(self):
        """APIResource entries for /api/v1 or /apis/GROUP/VERSION (main resource, then subresources)."""
        entry = {'name': self.resource, 'singularName': self.singular, 'namespaced': self.namespaced,
                 'kind': self.kind, 'verbs': list(self.verbs)}
        if self.short_names:
            entry['shortNames'] = list(self.short_names)
        if self.categories:
            entry['categories'] = list(self.categories)
        entries = [entry]
        for sub in self.subresources:
            sub_entry = {'name': '%s/%s' % (self.resource, sub), 'singularName': '', 'namespaced': self.namespaced,
                         'kind': self.kind, 'verbs': list(SUBRESOURCE_VERBS[sub])}
            sub_entry.update(SUBRESOURCE_KINDS.get(sub, {}))
            entries.append(sub_entry)
        return entries

    def __repr__(self):
        return 'ResourceType(%s)' % self.qualified


_POD_FIELDS = ('spec.nodeName', 'spec.restartPolicy', 'spec.schedulerName', 'spec.serviceAccountName',
               'spec.hostNetwork', 'status.phase', 'status.podIP', 'status.nominatedNodeName')
_EVENT_FIELDS = ('involvedObject.kind', 'involvedObject.namespace', 'involvedObject.name', 'involvedObject.uid',
                 'involvedObject.apiVersion', 'involvedObject.resourceVersion', 'involvedObject.fieldPath',
                 'reason', 'reportingComponent', 'source', 'type')
_DS_STATUS = {'currentNumberScheduled': 0, 'numberMisscheduled': 0, 'desiredNumberScheduled': 0, 'numberReady': 0}

RESOURCES = (
    # core/v1
    ResourceType('', 'v1', 'namespaces', 'Namespace', False, 'namespace', ('ns',),
                 verbs=('create', 'delete', 'get', 'list', 'patch', 'update', 'watch'), subresources=('status',),
                 status_on_create={'phase': 'Active'}, name_rule='label', field_labels=('status.phase',)),
    ResourceType('', 'v1', 'nodes', 'Node', False, 'node', ('no',), subresources=('status',),
                 status_on_create='keep', field_labels=('spec.unschedulable',),
                 field_defaults={'spec.unschedulable': 'false'}),
    ResourceType('', 'v1', 'pods', 'Pod', True, 'pod', ('po',), ('all',), subresources=('status', 'log', 'binding'),
                 status_on_create='pod', field_labels=_POD_FIELDS, field_defaults={'spec.hostNetwork': 'false'},
                 delete_returns_object=True),
    ResourceType('', 'v1', 'configmaps', 'ConfigMap', True, 'configmap', ('cm',)),
    ResourceType('', 'v1', 'secrets', 'Secret', True, 'secret', field_labels=('type',)),
    ResourceType('', 'v1', 'serviceaccounts', 'ServiceAccount', True, 'serviceaccount', ('sa',),
                 subresources=('token',), delete_returns_object=True),
    ResourceType('', 'v1', 'services', 'Service', True, 'service', ('svc',), ('all',), subresources=('status',),
                 status_on_create={'loadBalancer': {}}, name_rule='dns1035', delete_returns_object=True),
    ResourceType('', 'v1', 'events', 'Event', True, 'event', ('ev',), field_labels=_EVENT_FIELDS),
    # apps/v1
    ResourceType('apps', 'v1', 'daemonsets', 'DaemonSet', True, 'daemonset', ('ds',), ('all',),
                 subresources=('status',), status_on_create=_DS_STATUS, generation=True),
    ResourceType('apps', 'v1', 'deployments', 'Deployment', True, 'deployment', ('deploy',), ('all',),
                 subresources=('status',), status_on_create={}, generation=True),
    # node.k8s.io/v1
    ResourceType('node.k8s.io', 'v1', 'runtimeclasses', 'RuntimeClass', False, 'runtimeclass'),
    # rbac.authorization.k8s.io/v1 (names are path segments, e.g. "system:node")
    ResourceType('rbac.authorization.k8s.io', 'v1', 'clusterroles', 'ClusterRole', False, 'clusterrole',
                 name_rule='path'),
    ResourceType('rbac.authorization.k8s.io', 'v1', 'clusterrolebindings', 'ClusterRoleBinding', False,
                 'clusterrolebinding', name_rule='path'),
    ResourceType('rbac.authorization.k8s.io', 'v1', 'roles', 'Role', True, 'role', name_rule='path'),
    ResourceType('rbac.authorization.k8s.io', 'v1', 'rolebindings', 'RoleBinding', True, 'rolebinding',
                 name_rule='path'),
    # Node Feature Discovery (a CRD on real clusters)
    ResourceType('nfd.k8s-sigs.io', 'v1alpha1', 'nodefeatures', 'NodeFeature', True, 'nodefeature',
                 generation=True, custom=True),
    # Reviews: `kubectl auth can-i` and `kubectl auth whoami`.
    ResourceType('authorization.k8s.io', 'v1', 'selfsubjectaccessreviews', 'SelfSubjectAccessReview', False,
                 'selfsubjectaccessreview', verbs=('create',), review='access'),
    ResourceType('authentication.k8s.io', 'v1', 'selfsubjectreviews', 'SelfSubjectReview', False,
                 'selfsubjectreview', verbs=('create',), review='self'),
    # CRDs are stored, not served: creating one does not add a resource to discovery.
    ResourceType('apiextensions.k8s.io', 'v1', 'customresourcedefinitions', 'CustomResourceDefinition', False,
                 'customresourcedefinition', ('crd', 'crds'), subresources=('status',), status_on_create={},
                 generation=True),
)


class ResourceTable:
    """Look-ups over RESOURCES plus the discovery documents built from them."""

    def __init__(self, resources=RESOURCES):
        self.resources = tuple(resources)
        self._by_path = dict(((r.group, r.version, r.resource), r) for r in self.resources)
        self._by_kind = dict(((r.api_version, r.kind), r) for r in self.resources)

    def by_path(self, group, version, resource):
        return self._by_path.get((group, version, resource))

    def by_kind(self, api_version, kind):
        return self._by_kind.get((api_version, kind))

    def group_versions(self):
        """{group: [version, ...]} in table order; the core group is ''."""
        found = {}
        for res in self.resources:
            versions = found.setdefault(res.group, [])
            if res.version not in versions:
                versions.append(res.version)
        return found

    def api_group(self, group):
        versions = self.group_versions().get(group)
        if not versions or not group:
            return None
        listed = [{'groupVersion': '%s/%s' % (group, v), 'version': v} for v in versions]
        return {'name': group, 'versions': listed, 'preferredVersion': listed[0]}

    def api_group_list(self):
        groups = [self.api_group(g) for g in self.group_versions() if g]
        return {'kind': 'APIGroupList', 'apiVersion': 'v1', 'groups': groups}

    def api_resource_list(self, group, version):
        if version not in self.group_versions().get(group, ()):
            return None
        entries = []
        for res in self.resources:
            if res.group == group and res.version == version:
                entries.extend(res.discovery_entries())
        return {'kind': 'APIResourceList', 'apiVersion': 'v1',
                'groupVersion': '%s/%s' % (group, version) if group else version, 'resources': entries}

    def describe(self):
        """What the test client needs to build URLs (served by the control API)."""
        return [{'group': r.group, 'version': r.version, 'apiVersion': r.api_version, 'resource': r.resource,
                 'kind': r.kind, 'namespaced': r.namespaced, 'subresources': list(r.subresources)}
                for r in self.resources]
