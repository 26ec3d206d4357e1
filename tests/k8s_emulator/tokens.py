# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Service account tokens: the TokenRequest API (serviceaccounts/token) and their authentication.

A token is a JWT with the claims the real server puts in one (iss, sub, aud, exp, jti, and
``kubernetes.io`` with the namespace, the service account and the bound object, each with its
uid), signed HS256 with a key of this process (the real server signs RS256 with its service
account key). Nothing is stored and nothing is written to disk: a token is valid while its
signature and expiry hold and its service account and bound object still exist with the uids it
names, which is what the real authenticator checks. So any number of tokens of one service account
are valid side by side, and deleting the service account, its namespace or the bound pod ends them.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import hashlib
import hmac
import json
import secrets
import time
import uuid

from . import errors
from .errors import ApiError

ISSUER = 'https://kubernetes.default.svc.cluster.local'  # kubeadm's --service-account-issuer
DEFAULT_EXPIRATION = 3600
MIN_EXPIRATION = 600
BOUND_KINDS = {'Pod': 'pods', 'Secret': 'secrets', 'Node': 'nodes'}  # what a token can be bound to
TOKEN_REQUEST = ('authentication.k8s.io', 'v1', 'TokenRequest')


def _b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b'=').decode('ascii')


def _rfc3339(seconds):
    return time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(seconds))


class ServiceAccountTokens:
    """``request(namespace, name, body)`` answers a TokenRequest; ``user(token)`` authenticates one."""

    def __init__(self, store):
        self.store = store
        self._key = secrets.token_bytes(32)

    def _rtype(self, resource):
        return self.store.table.by_path('', 'v1', resource)

    def _sign(self, claims):
        header = _b64(json.dumps({'alg': 'HS256', 'typ': 'JWT'}, separators=(',', ':')).encode('utf-8'))
        payload = _b64(json.dumps(claims, separators=(',', ':')).encode('utf-8'))
        signature = hmac.new(self._key, ('%s.%s' % (header, payload)).encode('ascii'), hashlib.sha256).digest()
        return '%s.%s.%s' % (header, payload, _b64(signature))

    def _claims(self, token):
        """The verified claims of a token of ours, else None."""
        parts = token.split('.')
        if len(parts) != 3:
            return None
        expected = hmac.new(self._key, ('%s.%s' % (parts[0], parts[1])).encode('ascii', 'replace'),
                            hashlib.sha256).digest()
        if not hmac.compare_digest(_b64(expected).encode('ascii'), parts[2].encode('ascii', 'replace')):
            return None
        return json.loads(base64.urlsafe_b64decode(parts[1] + '=' * (-len(parts[1]) % 4)).decode('utf-8'))

    def request(self, namespace, name, body):
        """The TokenRequest answer (spec defaulted, status with the token), as TokenREST.Create gives it."""
        kind, group = TOKEN_REQUEST[2], TOKEN_REQUEST[0]
        sa_type = self._rtype('serviceaccounts')
        if body is not None and not isinstance(body, dict):
            raise errors.bad_request('the body of the request must be a TokenRequest object')
        body = body or {}
        if body.get('kind') not in (None, kind):
            raise errors.bad_request('the kind in the data (%s) does not match the expected kind (%s)'
                                     % (body['kind'], kind))
        meta = dict(body.get('metadata') or {})
        for field, value in (('name', name), ('namespace', namespace)):
            if meta.get(field) and meta[field] != value:
                raise errors.invalid(sa_type, name, [('metadata.%s' % field, 'Invalid value: "%s": must match the '
                                                      'service account %s if specified' % (meta[field], field))],
                                     kind=kind, group=group)
        account = self.store.get(sa_type, namespace, name)
        spec = dict(body.get('spec') or {})
        spec['audiences'] = spec.get('audiences') or [ISSUER]  # the API server's own audience
        spec['expirationSeconds'] = int(spec.get('expirationSeconds') or DEFAULT_EXPIRATION)
        spec['boundObjectRef'] = spec.get('boundObjectRef') or None
        if spec['expirationSeconds'] < MIN_EXPIRATION:
            raise errors.invalid(sa_type, '', [('spec.expirationSeconds', 'Invalid value: %d: may not specify a '
                                                'duration less than 10 minutes' % spec['expirationSeconds'])],
                                 kind=kind, group=group)
        refs = {'serviceaccount': {'name': name, 'uid': account['metadata']['uid']}}
        if spec['boundObjectRef']:
            refs.update(self._bound(namespace, name, spec['boundObjectRef']))
        now = int(time.time())
        jti = str(uuid.uuid4())
        token = self._sign({'iss': ISSUER, 'sub': 'system:serviceaccount:%s:%s' % (namespace, name),
                            'aud': spec['audiences'], 'iat': now, 'nbf': now,
                            'exp': now + spec['expirationSeconds'], 'jti': jti,
                            'kubernetes.io': dict(refs, namespace=namespace)})
        meta.update(name=name, namespace=namespace, creationTimestamp=_rfc3339(now))
        return {'kind': kind, 'apiVersion': '%s/%s' % (group, TOKEN_REQUEST[1]), 'metadata': meta, 'spec': spec,
                'status': {'token': token, 'expirationTimestamp': _rfc3339(now + spec['expirationSeconds'])}}

    def _bound(self, namespace, account, ref):
        """{claim: {name, uid}} for the object a token is bound to (it must exist, with ref's uid if given)."""
        api_version, kind = ref.get('apiVersion') or 'v1', ref.get('kind')
        if api_version != 'v1' or kind not in BOUND_KINDS:
            group, dummy, version = api_version.rpartition('/')
            raise errors.bad_request('cannot bind token to object of type %s/%s, Kind=%s' % (group, version, kind))
        obj = self.store.get(self._rtype(BOUND_KINDS[kind]), namespace, ref.get('name'))
        uid = obj['metadata']['uid']
        # Admission defaults a pod's serviceAccountName to "default"; the emulator has none.
        if kind == 'Pod' and ((obj.get('spec') or {}).get('serviceAccountName') or 'default') != account:
            raise errors.bad_request('cannot bind token for serviceaccount "%s" to pod running with different '
                                     'serviceaccount name.' % account)
        if ref.get('uid') and ref['uid'] != uid:
            raise ApiError(409, 'Operation cannot be fulfilled on %s "%s": the UID in the bound object reference (%s) '
                                'does not match the UID in record. The object might have been deleted and then '
                                'recreated' % (kind, ref.get('name'), ref['uid']),
                           details={'name': ref.get('name'), 'kind': kind})
        return {kind.lower(): {'name': ref.get('name'), 'uid': uid}}

    def user(self, token):
        """(username, groups, uid, extra) of a valid token, else None."""
        try:
            claims = self._claims(token)
        except (ValueError, UnicodeError):
            return None
        if not claims or claims.get('exp', 0) <= time.time():
            return None
        info = claims['kubernetes.io']
        namespace = info['namespace']
        for claim, resource in (('serviceaccount', 'serviceaccounts'), ('pod', 'pods'), ('secret', 'secrets'),
                                ('node', 'nodes')):
            ref = info.get(claim)
            found = ref and self.store.find(self._rtype(resource), namespace, ref['name'])
            if ref and (not found or found['metadata']['uid'] != ref['uid']):
                return None
        account = info['serviceaccount']
        extra = {'authentication.kubernetes.io/credential-id': ['JTI=%s' % claims['jti']]}
        if info.get('pod'):
            extra['authentication.kubernetes.io/pod-name'] = [info['pod']['name']]
            extra['authentication.kubernetes.io/pod-uid'] = [info['pod']['uid']]
        if info.get('node'):
            extra['authentication.kubernetes.io/node-name'] = [info['node']['name']]
            extra['authentication.kubernetes.io/node-uid'] = [info['node']['uid']]
        return ('system:serviceaccount:%s:%s' % (namespace, account['name']),
                ('system:serviceaccounts', 'system:serviceaccounts:%s' % namespace), account['uid'], extra)
