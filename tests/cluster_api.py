# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's real kube-apiserver (lab/control_plane.py) as the tests use it: objects by apiVersion and kind
through the official client's DynamicClient as the lab's admin, users of a test's own (a client certificate
from the lab's CA, or a ServiceAccount's token), and what each user asked for, from the API server's own
audit log (lab/control_plane.py AUDIT_POLICY); and `wait_for`, the one way tests wait on the cluster."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import json
import os
import time

import lab_scripts
import require

ADMIN_USER = 'kubernetes-admin'  # lab/control_plane.py IDENTITIES["admin"]
SHIPPED_CLUSTERROLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                   'roles', 'gpuready', 'files', 'clusterrole.yml')
PATCH_TYPES = {'merge': 'application/merge-patch+json', 'strategic': 'application/strategic-merge-patch+json',
               'json': 'application/json-patch+json'}


class Identity(object):
    """A user's credentials: ``username``, ``token`` and/or ``cert``/``key`` (paths), ``kubeconfig``;
    ``subject``, the RBAC subject that names it."""

    def __init__(self, username, token=None, cert=None, key=None, kubeconfig=None, subject=None):
        self.username, self.token, self.cert, self.key, self.kubeconfig = username, token, cert, key, kubeconfig
        self.subject = subject or {'kind': 'User', 'name': username, 'apiGroup': 'rbac.authorization.k8s.io'}


class ClusterApi(object):
    """``ClusterApi(plane, admin_kubeconfig)``: plane is a running ``ControlPlane``."""

    def __init__(self, plane, admin_kubeconfig):
        self.kubernetes = require.module('kubernetes')
        self.plane = plane
        self.url, self.ca_cert = plane.server, plane.ca.cert_path
        self.server_url = plane.server  # the real server itself
        self.client = self.kubernetes.config.new_client_from_config(admin_kubeconfig)
        self.dynamic = self.kubernetes.dynamic.DynamicClient(self.client)
        self.core = self.kubernetes.client.CoreV1Api(self.client)

    def _resource(self, api_version, kind):
        return self.dynamic.resources.get(api_version=api_version, kind=kind)

    def get(self, api_version, kind, name, namespace=None):
        return self._resource(api_version, kind).get(name=name, namespace=namespace).to_dict()

    def exists(self, api_version, kind, name, namespace=None):
        try:
            self.get(api_version, kind, name, namespace)
        except self.kubernetes.dynamic.exceptions.NotFoundError:
            return False
        return True

    def list(self, api_version, kind, namespace=None, label_selector=None, field_selector=None):
        found = self._resource(api_version, kind).get(namespace=namespace, label_selector=label_selector,
                                                      field_selector=field_selector)
        return [item.to_dict() for item in found.items]

    def create(self, obj):
        namespace = obj.get('metadata', {}).get('namespace')
        return self._resource(obj['apiVersion'], obj['kind']).create(body=obj, namespace=namespace).to_dict()

    def patch(self, api_version, kind, name, patch, namespace=None, patch_type='merge', subresource=None):
        resource = self._resource(api_version, kind)
        if subresource:
            resource = resource.subresources[subresource]
        return resource.patch(body=patch, name=name, namespace=namespace,
                              content_type=PATCH_TYPES[patch_type]).to_dict()

    def delete(self, api_version, kind, name, namespace=None):
        self._resource(api_version, kind).delete(name=name, namespace=namespace)

    def bind_cluster_role(self, name, rules, subjects):
        """A ClusterRole `name` of exactly these rules, bound to subjects (RBAC subject dicts) by a
        ClusterRoleBinding of the same name."""
        rbac = 'rbac.authorization.k8s.io'
        self.create({'apiVersion': rbac + '/v1', 'kind': 'ClusterRole', 'metadata': {'name': name}, 'rules': rules})
        self.create({'apiVersion': rbac + '/v1', 'kind': 'ClusterRoleBinding', 'metadata': {'name': name},
                     'roleRef': {'apiGroup': rbac, 'kind': 'ClusterRole', 'name': name}, 'subjects': list(subjects)})

    # -- users of a test's own ------------------------------------------------------------------
    def user_with_certificate(self, name, work_dir, groups=()):
        """A client certificate for the user `name` (CN) signed by the lab's CA, and a kubeconfig carrying it
        inline, as kubeadm writes them."""
        cert, key = (os.path.join(work_dir, '%s.%s' % (name, ext)) for ext in ('crt', 'key'))
        self.plane.ca.issue(cert, key, common_name=name, organizations=list(groups))
        kubeconfig = os.path.join(work_dir, '%s.kubeconfig' % name)

        def inline(path):
            with open(path, 'rb') as handle:
                return base64.b64encode(handle.read()).decode()
        with open(kubeconfig, 'w') as handle:
            json.dump({'apiVersion': 'v1', 'kind': 'Config', 'current-context': 'lab',
                       'clusters': [{'name': 'lab', 'cluster': {'server': self.server_url,
                                                                'certificate-authority': self.ca_cert}}],
                       'users': [{'name': name, 'user': {'client-certificate-data': inline(cert),
                                                         'client-key-data': inline(key)}}],
                       'contexts': [{'name': 'lab', 'context': {'cluster': 'lab', 'user': name}}]}, handle)
        os.chmod(kubeconfig, 0o600)
        return Identity(name, cert=cert, key=key, kubeconfig=kubeconfig)

    def service_account_token(self, name, namespace='default', seconds=7200):
        """A ServiceAccount `name` (made when missing) and a token for it from the TokenRequest API."""
        if not self.exists('v1', 'ServiceAccount', name, namespace):
            self.create({'apiVersion': 'v1', 'kind': 'ServiceAccount', 'metadata': {'name': name, 'namespace': namespace}})
        request = self.kubernetes.client.AuthenticationV1TokenRequest(
            spec=self.kubernetes.client.V1TokenRequestSpec(audiences=[], expiration_seconds=seconds))
        token = self.core.create_namespaced_service_account_token(name, namespace, request).status.token
        return Identity('system:serviceaccount:%s:%s' % (namespace, name), token=token,
                        subject={'kind': 'ServiceAccount', 'name': name, 'namespace': namespace})

    # -- what was asked ---------------------------------------------------------------------------
    def requests(self):
        """Every audited request so far: lab/control_plane.py ControlPlane.requests()."""
        return self.plane.requests()


class ApiWithFaults(ClusterApi):
    """ClusterApi with tests/api_fault_proxy.py in front of the real server: ``url`` is the proxy's, and users
    with a token (``add_identity``) reach the server through it, so ``inject`` can fail their requests.
    ``requests()`` lists what users asked since ``clear_requests()``: the audit log's entries (the lab's admin,
    who sets tests up, left out) and the answers the proxy gave itself, in the order they were asked."""

    IDENTITY_NAMESPACE = 'gpuready-test-users'

    def __init__(self, plane, admin_kubeconfig, work_dir):
        super(ApiWithFaults, self).__init__(plane, admin_kubeconfig)
        from api_fault_proxy import FaultProxy
        self.work_dir, self.admin_kubeconfig = work_dir, admin_kubeconfig
        self.proxy = FaultProxy(self.server_url, plane.ca, work_dir, admin=plane.client_pair('admin')).start()
        self.url = self.proxy.url
        self.users_by_token, self.since = {}, 0.0
        self.create({'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': self.IDENTITY_NAMESPACE}})

    def stop(self):
        self.proxy.stop()

    def kubeconfig(self):
        """The lab admin's kubeconfig (straight to the server)."""
        return self.admin_kubeconfig

    def add_identity(self, name, client_cert=False, groups=()):
        """A user of the test's own: a ServiceAccount `name` with a token, through the proxy; or, with
        client_cert, the user `name` (in `groups`) with a certificate, straight to the server."""
        if client_cert:
            return self.user_with_certificate(name, self.work_dir, groups)
        identity = self.service_account_token(name, self.IDENTITY_NAMESPACE)
        identity.kubeconfig = os.path.join(self.work_dir, '%s-token.kubeconfig' % name)
        with open(identity.kubeconfig, 'w') as handle:
            json.dump({'apiVersion': 'v1', 'kind': 'Config', 'current-context': 'lab',
                       'clusters': [{'name': 'lab', 'cluster': {'server': self.url, 'certificate-authority': self.ca_cert}}],
                       'users': [{'name': name, 'user': {'token': identity.token}}],
                       'contexts': [{'name': 'lab', 'context': {'cluster': 'lab', 'user': name}}]}, handle)
        os.chmod(identity.kubeconfig, 0o600)
        self.users_by_token[identity.token] = identity.username
        return identity

    def inject(self, **spec):
        """tests/api_fault_proxy.py Fault(**spec): the next matching requests through the proxy fail."""
        return self.proxy.inject(**spec)

    def clear_faults(self):
        self.proxy.clear_faults()

    def clear_requests(self):
        self.since = time.time()

    def requests(self):
        admin = self.plane.requests()
        asked = [entry for entry in admin if entry['time'] >= self.since and entry['user'] != ADMIN_USER]
        for entry in self.proxy.answered():
            if entry['time'] >= self.since:
                answered = dict((key, value) for key, value in entry.items() if key != 'token')
                asked.append(dict(answered, user=self.users_by_token.get(entry['token'])))
        return sorted(asked, key=lambda entry: entry['time'])


def shipped_rules():
    """The rules of roles/gpuready/files/clusterrole.yml, the ClusterRole the collection ships."""
    import yaml
    with open(SHIPPED_CLUSTERROLE, encoding='utf-8') as handle:
        return yaml.safe_load(handle)['rules']


def install_nfd_crds(api_client):
    """NFD's CustomResourceDefinitions (NodeFeature, ...) from the NFD module lab/go pins, once, and served."""
    import yaml
    kubernetes = require.module('kubernetes')
    gobuild = lab_scripts.script('lab/go/gobuild.py', 'gpuready_gobuild')
    crds = gobuild.upstream_dir('nfd') / 'deployment' / 'base' / 'nfd-crds' / 'nfd-api-crds.yaml'
    extensions = kubernetes.client.ApiextensionsV1Api(api_client)
    for crd in yaml.safe_load_all(crds.read_text()):
        if crd and not extensions.list_custom_resource_definition(
                field_selector='metadata.name=' + crd['metadata']['name']).items:
            extensions.create_custom_resource_definition(crd)
    wait_for('the NodeFeature CRD to be served', lambda: any(
        c.type == 'Established' and c.status == 'True'
        for c in extensions.read_custom_resource_definition('nodefeatures.nfd.k8s-sigs.io').status.conditions or []))
    custom = kubernetes.client.CustomObjectsApi(api_client)

    def listed():
        # Established comes before the server's cache of the new type is ready; until then a list is a 429.
        try:
            return custom.list_cluster_custom_object('nfd.k8s-sigs.io', 'v1alpha1', 'nodefeatures') is not None
        except kubernetes.client.ApiException as err:
            if err.status != 429:
                raise
            return False
    wait_for('NodeFeature objects to be listed', listed)


def wait_for(what, check, timeout=120, interval=0.5, report=None):
    """check() until it returns something truthy; fails with the last value and what report() says."""
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError('timed out after %ss waiting for %s; last: %r%s' % (
        timeout, what, value, '\n' + report() if report else ''))


def admission_refusal(core, pod):
    """None when the API server would admit pod (a server-side dry run: nothing is created), else the
    status and message refusing it. core: a CoreV1Api."""
    kubernetes = require.module('kubernetes')
    try:
        core.create_namespaced_pod(pod['metadata']['namespace'], pod, dry_run='All')
    except kubernetes.client.ApiException as err:
        return '%s %s' % (err.status, json.loads(err.body)['message'])
    return None


def wait_until_pod_security_enforces(core, namespace, level, timeout=30):
    """After a change of namespace's PodSecurity label: until the admission enforces level there. It reads
    namespaces from the API server's informer cache, which follows the change a moment later, so a pod
    created at once can still be judged by the old level. The probe, a privileged container, is refused
    at every level but privileged."""
    probe = {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': 'pod-security-probe', 'namespace': namespace},
             'spec': {'containers': [{'name': 'probe', 'image': 'pause', 'securityContext': {'privileged': True}}]}}
    wanted = 'violates PodSecurity "%s:latest"' % level
    wait_for('PodSecurity to enforce %s in %s' % (level, namespace),
             lambda: wanted in (admission_refusal(core, probe) or ''), timeout=timeout, interval=0.1,
             report=lambda: 'the probe: %s' % admission_refusal(core, probe))
