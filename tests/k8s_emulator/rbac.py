# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""RBAC authorization from the stored rbac.authorization.k8s.io/v1 objects, evaluated per request.

Follows k8s.io/kubernetes/plugin/pkg/auth/authorizer/rbac: system:masters may do anything;
otherwise a request is allowed when a rule of a role bound to the user (User subject), one of
its groups (Group) or its service account (ServiceAccount, as system:serviceaccount:NS:NAME)
matches. ClusterRoleBindings grant everywhere, RoleBindings only in their namespace (to a Role
of that namespace or a ClusterRole). Not modelled: aggregated ClusterRoles (their rules are
filled by a controller), escalation checks on role writes, impersonation.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

RBAC = 'rbac.authorization.k8s.io'


def _subject_matches(subject, user, groups, binding_namespace):
    kind = subject.get('kind')
    if kind == 'User':
        return subject.get('name') == user
    if kind == 'Group':
        return subject.get('name') in groups
    if kind == 'ServiceAccount':
        namespace = subject.get('namespace') or binding_namespace
        return user == 'system:serviceaccount:%s:%s' % (namespace, subject.get('name'))
    return False


def _rule_allows(rule, verb, group, resource, subresource, name):
    if not ('*' in (rule.get('verbs') or ()) or verb in (rule.get('verbs') or ())):
        return False
    groups = rule.get('apiGroups') or ()
    if not ('*' in groups or group in groups):
        return False
    resources = rule.get('resources') or ()
    combined = '%s/%s' % (resource, subresource) if subresource else resource
    if not ('*' in resources or combined in resources or (subresource and '*/' + subresource in resources)):
        return False
    names = rule.get('resourceNames') or ()
    return not names or (bool(name) and name in names)


class Authorizer:
    """``allowed(user, groups, verb, group, resource, namespace, name, subresource)`` against a Store."""

    def __init__(self, store):
        self.store = store
        table = store.table
        self.cluster_roles = table.by_path(RBAC, 'v1', 'clusterroles')
        self.cluster_role_bindings = table.by_path(RBAC, 'v1', 'clusterrolebindings')
        self.roles = table.by_path(RBAC, 'v1', 'roles')
        self.role_bindings = table.by_path(RBAC, 'v1', 'rolebindings')

    def _role_rules(self, role_ref, binding_namespace):
        kind, name = role_ref.get('kind'), role_ref.get('name')
        if kind == 'ClusterRole':
            role = self.store.find(self.cluster_roles, None, name)
        elif kind == 'Role' and binding_namespace:
            role = self.store.find(self.roles, binding_namespace, name)
        else:
            role = None
        return (role or {}).get('rules') or ()

    def allowed(self, user, groups, verb, group, resource, namespace, name=None, subresource=None):
        """None when denied, else why it is allowed (in the words of the RBAC authorizer)."""
        if 'system:masters' in groups:
            return 'allowed by the system:masters group'
        bindings = [(b, None) for b in self.store.list(self.cluster_role_bindings)[0]]
        if namespace:
            bindings.extend((b, namespace) for b in self.store.list(self.role_bindings, namespace)[0])
        for binding, binding_namespace in bindings:
            subject = next((s for s in binding.get('subjects') or ()
                            if _subject_matches(s, user, groups, binding_namespace)), None)
            if subject is None:
                continue
            role_ref = binding.get('roleRef') or {}
            for rule in self._role_rules(role_ref, binding_namespace):
                if _rule_allows(rule, verb, group, resource, subresource, name):
                    return 'RBAC: allowed by %s "%s" of %s "%s" to %s "%s"' % (
                        'RoleBinding' if binding_namespace else 'ClusterRoleBinding', binding['metadata']['name'],
                        role_ref.get('kind'), role_ref.get('name'), subject.get('kind'), subject.get('name'))
        return None
