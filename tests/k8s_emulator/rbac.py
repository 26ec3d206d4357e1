# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""RBAC authorization from the stored rbac.authorization.k8s.io/v1 objects, evaluated per request.

Follows k8s.io/kubernetes/plugin/pkg/auth/authorizer/rbac: system:masters may do anything;
otherwise a request is allowed when a rule of a role bound to the user (User subject), one of
its groups (Group) or its service account (ServiceAccount, as system:serviceaccount:NS:NAME)
matches. ClusterRoleBindings grant everywhere, RoleBindings only in their namespace (to a Role
of that namespace or a ClusterRole).

Escalation prevention, as the API server's RBAC storage does it: writing a (Cluster)Role needs every
permission it grants, or `escalate` on the request's name (a create has none, so `escalate` with
resourceNames holds only for a PATCH or PUT that names the role, as kube-apiserver 1.37 answers it);
writing a (Cluster)RoleBinding needs every permission of the role it refers to, or `bind` on that role. A wildcard in the new rule is held only through the same
wildcard. Not modelled: aggregated ClusterRoles (their rules are filled by a controller),
nonResourceURLs rules (only system:masters may grant them here), impersonation.
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

    def _holds(self, user, groups, rule, namespace):
        if rule.get('nonResourceURLs') and not rule.get('resources'):
            return 'system:masters' in groups
        names = rule.get('resourceNames') or [None]
        for verb in rule.get('verbs') or ():
            for group in rule.get('apiGroups') or ():
                for combined in rule.get('resources') or ():
                    resource, dummy, subresource = combined.partition('/')
                    for name in names:
                        if not self.allowed(user, groups, verb, group, resource, namespace, name, subresource or None):
                            return False
        return True

    def not_held(self, user, groups, rules, namespace=None):
        """The rules this user could not grant for lack of holding them (in namespace, or cluster-wide)."""
        return [rule for rule in rules if not self._holds(user, groups, rule, namespace)]

    def escalation(self, user, groups, resource, namespace, obj, name=None):
        """None when user may write obj (a role or a binding, as it would be stored) by a request naming
        `name` (None for a create), else why not."""
        if resource in ('clusterroles', 'roles'):
            if self.allowed(user, groups, 'escalate', RBAC, resource, namespace, name):
                return None
            rules = obj.get('rules') or ()
        else:
            role_ref = obj.get('roleRef') or {}
            referred = 'clusterroles' if role_ref.get('kind') == 'ClusterRole' else 'roles'
            if self.allowed(user, groups, 'bind', RBAC, referred, namespace, role_ref.get('name')):
                return None
            rules = self._role_rules(role_ref, namespace)
        missing = self.not_held(user, groups, rules, namespace)
        if not missing:
            return None
        return 'user "%s" (groups=%s) is attempting to grant RBAC permissions not currently held:\n%s' % (
            user, list(groups), '\n'.join('{APIGroups:%s, Resources:%s, ResourceNames:%s, Verbs:%s}' % (
                rule.get('apiGroups'), rule.get('resources'), rule.get('resourceNames') or [], rule.get('verbs'))
                for rule in missing))
