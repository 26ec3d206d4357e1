# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The HTTPS front of the emulator: routing, authentication, RBAC, the request log, fault
injection, watches and the control API under /_emulator/.

One thread per connection (ThreadingHTTPServer); the TLS handshake runs in that thread, so a slow
or broken client never blocks the accept loop. HTTP/1.1 keep-alive, JSON everywhere, chunked
transfer for watches.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hmac
import http.client
import itertools
import json
import os
import re
import secrets
import select
import socket
import ssl
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from . import errors
from .errors import ApiError
from .rbac import RBAC as RBAC_GROUP, Authorizer
from .resources import SUBRESOURCE_VERBS
from .selectors import FieldSelector, LabelSelector
from .store import APPLY_PATCH, PATCH_TYPES, Expired, MERGE_PATCH, deep_copy
from .tokens import ServiceAccountTokens

VERSION_INFO = {
    'major': '1', 'minor': '31', 'gitVersion': 'v1.31.0', 'gitCommit': '9befc2b8928a9426501d3bf62f72849d5cbcd5a3',
    'gitTreeState': 'clean', 'buildDate': '2024-08-13T07:28:49Z', 'goVersion': 'go1.22.5', 'compiler': 'gc',
    'platform': 'linux/amd64',
}
PUBLIC_PATHS = ('/version', '/version/', '/healthz', '/livez', '/readyz')  # system:public-info-viewer
BODY_TYPES = ('application/json', 'application/yaml')
DEFAULT_WATCH_TIMEOUT = 1800  # the real server picks 30-60 minutes when the client gives none
_SAFE_NAME = re.compile(r'[^A-Za-z0-9._-]')
KUBELET_TIMEOUT = 10
# pods/log options the real server passes on to the kubelet (follow is not: answers are not streamed).
KUBELET_LOG_PARAMS = ('tailLines', 'previous', 'timestamps', 'sinceSeconds', 'sinceTime', 'limitBytes')


class Principal:
    """An authenticated user: name, groups (system:authenticated included), and for service account
    tokens the uid and extra the real authenticator adds."""

    def __init__(self, name, groups, uid=None, extra=None):
        self.name = name
        self.groups = tuple(groups) + (() if 'system:authenticated' in groups else ('system:authenticated',))
        self.uid = uid
        self.extra = extra


ANONYMOUS = Principal('system:anonymous', ('system:unauthenticated',))


class Route:
    """Where a request goes: kind is 'version', 'health', 'discovery', 'resource' or 'log'."""

    def __init__(self, kind, rtype=None, namespace=None, name=None, subresource=None, verb=None, document=None):
        self.kind = kind
        self.rtype = rtype
        self.namespace = namespace
        self.name = name
        self.subresource = subresource
        self.verb = verb
        self.document = document

    @property
    def resource(self):
        return self.rtype.resource if self.rtype else None


class Identities:
    """Users known to the server (bearer tokens) and the files that let clients be them."""

    def __init__(self, directory, ca, url):
        self.directory = directory
        self.ca = ca
        self.url = url
        self._lock = threading.Lock()
        self._tokens = {}
        self._issued = {}

    def add(self, name, groups=(), token=True, client_cert=False):
        if not name or not (token or client_cert):
            raise errors.bad_request('an identity needs a name and a token or a client certificate')
        groups = [str(g) for g in groups]
        folder = os.path.join(self.directory, 'identities', _SAFE_NAME.sub('_', name))
        os.makedirs(folder, exist_ok=True)
        user = {}
        issued = {'name': name, 'groups': groups, 'token': None, 'token_file': None, 'cert': None, 'key': None}
        if client_cert:
            cert, key = self.ca.issue(os.path.join(folder, 'client.crt'), os.path.join(folder, 'client.key'),
                                      name, groups)
            user.update({'client-certificate': cert, 'client-key': key})
            issued.update(cert=cert, key=key)
        if token:
            value = secrets.token_urlsafe(32)
            token_file = os.path.join(folder, 'token')
            _write_text(token_file, value + '\n', 0o600)
            user['token'] = value
            issued.update(token=value, token_file=token_file)
        kubeconfig = os.path.join(folder, 'kubeconfig')
        context = '%s@emulator' % name
        _write_text(kubeconfig, json.dumps({
            'apiVersion': 'v1', 'kind': 'Config', 'preferences': {},
            'clusters': [{'name': 'emulator', 'cluster': {'server': self.url, 'certificate-authority': self.ca.cert_path}}],
            'users': [{'name': name, 'user': user}],
            'contexts': [{'name': context, 'context': {'cluster': 'emulator', 'user': name, 'namespace': 'default'}}],
            'current-context': context}, indent=2) + '\n', 0o600)
        issued['kubeconfig'] = kubeconfig
        with self._lock:
            self._tokens = dict((t, p) for t, p in self._tokens.items() if p.name != name)
            if token:
                self._tokens[issued['token']] = Principal(name, groups)
            self._issued[name] = issued
        return issued

    def by_token(self, token):
        with self._lock:
            for known, principal in self._tokens.items():
                if hmac.compare_digest(known.encode('utf-8'), token.encode('utf-8')):
                    return principal
        return None

    def get(self, name):
        with self._lock:
            return self._issued.get(name)


def _write_text(path, text, mode):
    tmp = path + '.tmp'
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, 'w') as handle:
        handle.write(text)
    os.replace(tmp, path)


class Faults:
    """Injected failures: rules matched against each API request, each good for `count` requests."""

    _FIELDS = ('verb', 'resource', 'name', 'namespace', 'subresource')

    def __init__(self):
        self._lock = threading.Lock()
        self._rules = []
        self._ids = itertools.count(1)

    def add(self, spec):
        rule = dict((f, spec.get(f)) for f in self._FIELDS)
        count = spec.get('count', 1)
        rule.update(id=next(self._ids), remaining=None if count is None else int(count), status=spec.get('status'),
                    delay=spec.get('delay'), modify=spec.get('modify'), message=spec.get('message'),
                    retry_after=spec.get('retry_after'), hits=0)
        if rule['status'] is None and rule['delay'] is None and rule['modify'] is None:
            raise errors.bad_request('a fault needs status, delay or modify')
        with self._lock:
            self._rules.append(rule)
        return rule['id']

    def take(self, route):
        """The rules this request triggers (their counts are used up)."""
        found = []
        with self._lock:
            for rule in self._rules:
                if rule['remaining'] is not None and rule['remaining'] <= 0:
                    continue
                wanted = {'verb': route.verb, 'resource': route.resource, 'name': route.name,
                          'namespace': route.namespace, 'subresource': route.subresource or ''}
                if any(rule[f] is not None and rule[f] != wanted[f] for f in self._FIELDS):
                    continue
                if rule['remaining'] is not None:
                    rule['remaining'] -= 1
                rule['hits'] += 1
                found.append(dict(rule))
        return found

    def remove(self, rule_id=None):
        with self._lock:
            self._rules = [] if rule_id is None else [r for r in self._rules if r['id'] != rule_id]

    def describe(self):
        with self._lock:
            return [dict(r) for r in self._rules]


class RequestLog:
    def __init__(self):
        self._lock = threading.Lock()
        self._entries = []

    def add(self, entry):
        with self._lock:
            self._entries.append(entry)

    def entries(self, clear=False):
        with self._lock:
            found = list(self._entries)
            if clear:
                self._entries = []
        return found


class Request:
    """What the handler read: method, path, query (last value wins), headers, body bytes."""

    def __init__(self, handler, body):
        parts = urlsplit(handler.path)
        self.method = handler.command
        self.path = unquote(parts.path)
        self.query = dict((k, v[-1]) for k, v in parse_qs(parts.query, keep_blank_values=True).items())
        self.headers = handler.headers
        self.body = body
        self.content_type = (handler.headers.get('Content-Type') or '').split(';')[0].strip().lower()

    def json(self):
        if not self.body:
            return None
        if self.content_type in ('application/yaml', APPLY_PATCH):
            import yaml  # only YAML bodies need it (PyYAML comes with the kubernetes client)
            try:
                return yaml.safe_load(self.body.decode('utf-8'))
            except (yaml.YAMLError, UnicodeError) as exc:
                raise errors.bad_request('error decoding YAML: %s' % exc)
        try:
            return json.loads(self.body.decode('utf-8'))
        except (ValueError, UnicodeError) as exc:
            raise errors.bad_request("couldn't get version/kind; json parse error: %s" % exc)

    def flag(self, name):
        return self.query.get(name, '').lower() in ('1', 'true')


class Reply:
    """An answer: a JSON body, a text body, or a watch stream (stream is a callable)."""

    def __init__(self, code=200, body=None, text=None, headers=None, stream=None):
        self.code = code
        self.body = body
        self.text = text
        self.headers = dict(headers or {})
        self.stream = stream


class ApiServer:
    """Everything behind the socket: call handle(handler) for each HTTP request."""

    def __init__(self, store, table, identities, control_token, admin, verbose=False):
        self.store = store
        self.table = table
        self.identities = identities
        self.control_token = control_token
        self.admin = admin
        self.verbose = verbose
        self.authorizer = Authorizer(store)
        self.tokens = ServiceAccountTokens(store)
        self.faults = Faults()
        self.log = RequestLog()
        self.stopping = threading.Event()

    # -- HTTP plumbing -----------------------------------------------------------------------

    def handle(self, handler):
        try:
            request = Request(handler, self._read_body(handler))
        except (ValueError, OSError):
            handler.close_connection = True
            return
        if request.path.startswith('/_emulator/'):
            self._write(handler, self._control(request), request)
            return
        route, reply, user, modifies = None, None, None, []
        try:
            user = self.authenticate(handler, request)
            if user is None and request.path not in PUBLIC_PATHS:
                raise errors.unauthorized()
            route = self.route(request.method, request.path, request.query)
            for rule in self.faults.take(route):
                if rule['delay']:
                    time.sleep(float(rule['delay']))
                if rule['status'] and reply is None:
                    reply = self._fault_reply(rule, route)
                if rule['modify'] is not None:
                    modifies.append(rule)
            if reply is None:
                reply = self.dispatch(request, route, user or ANONYMOUS)
        except ApiError as exc:
            reply = Reply(exc.code, exc.status(), headers=exc.headers)
        except Exception as exc:  # pylint: disable=broad-except
            traceback.print_exc(file=sys.stderr)
            reply = Reply(500, ApiError(500, 'Internal error occurred: %s' % exc).status())
        for rule in modifies:
            # Before the answer leaves: the client cannot race the "concurrent" writer.
            self._apply_modify(rule, route)
        self.log.add({
            'verb': route.verb if route else None, 'resource': route.resource if route else None,
            'subresource': route.subresource if route else None, 'namespace': route.namespace if route else None,
            'name': route.name if route else None, 'group': route.rtype.group if route and route.rtype else None,
            'code': reply.code, 'user': user.name if user else None, 'content_type': request.content_type or None,
            'method': request.method, 'path': request.path, 'time': time.time()})
        self._write(handler, reply, request)

    @staticmethod
    def _read_body(handler):
        if 'chunked' in (handler.headers.get('Transfer-Encoding') or '').lower():
            chunks = []
            while True:
                size = int(handler.rfile.readline().split(b';')[0].strip() or b'0', 16)
                if size == 0:
                    handler.rfile.readline()
                    return b''.join(chunks)
                chunks.append(handler.rfile.read(size))
                handler.rfile.readline()
        length = int(handler.headers.get('Content-Length') or 0)
        return handler.rfile.read(length) if length else b''

    def _write(self, handler, reply, request):
        if reply.stream is not None:
            handler.send_response(reply.code)
            handler.send_header('Content-Type', 'application/json')
            handler.send_header('Transfer-Encoding', 'chunked')
            handler.send_header('Cache-Control', 'no-cache, private')
            handler.end_headers()
            try:
                reply.stream(handler)
                handler.wfile.write(b'0\r\n\r\n')
                handler.wfile.flush()
            except (OSError, ValueError):
                handler.close_connection = True
            return
        if reply.text is not None:
            data, content_type = reply.text.encode('utf-8'), 'text/plain'
        else:
            data, content_type = json.dumps(reply.body, separators=(',', ':')).encode('utf-8'), 'application/json'
        handler.send_response(reply.code)
        handler.send_header('Content-Type', content_type)
        handler.send_header('Content-Length', str(len(data)))
        for key, value in reply.headers.items():
            handler.send_header(key, value)
        handler.end_headers()
        if request.method != 'HEAD':
            handler.wfile.write(data)

    # -- routing and authentication ----------------------------------------------------------

    def route(self, method, path, query):
        verb = {'GET': 'get', 'HEAD': 'get', 'POST': 'create', 'PUT': 'update', 'PATCH': 'patch',
                'DELETE': 'delete'}.get(method)
        if path in PUBLIC_PATHS:
            return Route('version' if path.startswith('/version') else 'health', verb='get')
        parts = [p for p in path.split('/') if p]
        if not parts or parts[0] not in ('api', 'apis'):
            raise errors.path_not_found()
        if parts[0] == 'api':
            group, rest = '', parts[1:]
            if not rest:
                return Route('discovery', verb='get', document={'kind': 'APIVersions', 'versions': ['v1'],
                                                                'serverAddressByClientCIDRs': [
                                                                    {'clientCIDR': '0.0.0.0/0',
                                                                     'serverAddress': urlsplit(self.identities.url).netloc}]})
        else:
            if len(parts) == 1:
                return Route('discovery', verb='get', document=self.table.api_group_list())
            group, rest = parts[1], parts[2:]
            if not rest:
                document = self.table.api_group(group)
                if document is None:
                    raise errors.path_not_found()
                return Route('discovery', verb='get', document=dict(document, kind='APIGroup', apiVersion='v1'))
        version, rest = rest[0], rest[1:]
        if not rest:
            document = self.table.api_resource_list(group, version)
            if document is None:
                raise errors.path_not_found()
            return Route('discovery', verb='get', document=document)
        watch_path = rest[0] == 'watch'
        if watch_path:
            rest = rest[1:]
        namespace = None
        if len(rest) >= 3 and rest[0] == 'namespaces' and self.table.by_path(group, version, rest[2]):
            namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            raise errors.path_not_found()
        rtype = self.table.by_path(group, version, rest[0])
        name = rest[1] if len(rest) > 1 else None
        subresource = rest[2] if len(rest) > 2 else None
        if rtype is None or (namespace and not rtype.namespaced) or (subresource and subresource not in rtype.subresources):
            raise errors.path_not_found()
        if rtype.namespaced and not namespace and name:
            raise errors.path_not_found()
        if verb is None:
            raise errors.method_not_allowed()
        if name is None:
            if method == 'GET':
                verb = 'watch' if watch_path or query.get('watch', '').lower() in ('1', 'true') else 'list'
            elif method == 'DELETE':
                verb = 'deletecollection'
            elif method != 'POST' or (rtype.namespaced and not namespace):
                raise errors.method_not_allowed()
        elif method == 'POST' and not subresource:
            raise errors.method_not_allowed()
        elif method == 'GET' and (watch_path or query.get('watch', '').lower() in ('1', 'true')):
            verb = 'watch'
        if verb not in (SUBRESOURCE_VERBS[subresource] if subresource else rtype.verbs):
            raise errors.method_not_allowed()
        return Route('log' if subresource == 'log' else 'resource', rtype, namespace, name, subresource, verb)

    def authenticate(self, handler, request):
        """The user from a verified client certificate (CN, O), else from a bearer token; None when
        neither was presented. A wrong token is a 401 even when a certificate was not sent."""
        try:
            cert = handler.connection.getpeercert()
        except (AttributeError, ValueError):
            cert = None
        if cert:
            common_name, groups = None, []
            for rdn in cert.get('subject', ()):
                for key, value in rdn:
                    if key == 'commonName':
                        common_name = value
                    elif key == 'organizationName':
                        groups.append(value)
            if common_name:
                return Principal(common_name, groups)
        header = request.headers.get('Authorization') or ''
        if not header:
            return None
        if not header.startswith('Bearer '):
            raise errors.unauthorized()
        token = header[len('Bearer '):].strip()
        user = self.identities.by_token(token)
        if user is None:
            account = self.tokens.user(token)
            if account is None:
                raise errors.unauthorized()
            user = Principal(*account)
        return user

    # -- the API -----------------------------------------------------------------------------

    def dispatch(self, request, route, user):
        if route.kind == 'version':
            return Reply(body=dict(VERSION_INFO))
        if route.kind == 'health':
            return Reply(text='ok')
        if route.kind == 'discovery':
            return Reply(body=route.document)  # system:discovery is bound to system:authenticated
        if not self.authorizer.allowed(user.name, user.groups, route.verb, route.rtype.group, route.rtype.resource,
                                       route.namespace, route.name, route.subresource):
            raise errors.forbidden(user.name, route.verb, route.rtype, route.namespace, route.name, route.subresource)
        if route.rtype.group == RBAC_GROUP and route.verb in ('create', 'update', 'patch') and not route.subresource:
            self._prevent_escalation(request, route, user)
        if route.kind == 'log':
            return self._pod_log(request, route)
        if route.subresource == 'binding':
            return self._pod_binding(request, route)
        if route.subresource == 'token':
            return Reply(201, self.tokens.request(route.namespace, route.name, self._body(request)))
        if route.verb == 'create':
            return self._create(request, route, user)
        return getattr(self, '_' + route.verb)(request, route)

    def _prevent_escalation(self, request, route, user):
        """403 for a role or binding write that grants more than the writer holds (rbac.py)."""
        rtype, namespace = route.rtype, route.namespace
        if route.verb == 'patch':
            body = request.json()
            if request.content_type == APPLY_PATCH:
                obj = self.store.apply(rtype, namespace, route.name, body, None, True)
            else:
                obj = self.store.patch(rtype, namespace, route.name, request.content_type, body, None, True)
        else:
            obj = self._body(request) or {}
        why = self.authorizer.escalation(user.name, user.groups, rtype.resource, namespace, obj, route.name)
        if why:
            name = (obj.get('metadata') or {}).get('name') or route.name
            raise ApiError(403, '%s "%s" is forbidden: %s' % (rtype.qualified, name, why), reason='Forbidden')

    def _dry_run(self, request, body=None):
        values = [request.query.get('dryRun')] if 'dryRun' in request.query else []
        if isinstance(body, dict) and body.get('dryRun'):
            values.extend(body['dryRun'])
        for value in values:
            if value != 'All':
                raise errors.bad_request('dryRun: Unsupported value: "%s": supported values: "All"' % value)
        return bool(values)

    def _selectors(self, request, rtype):
        return LabelSelector(request.query.get('labelSelector')), FieldSelector(request.query.get('fieldSelector'), rtype)

    @staticmethod
    def _list_item(rtype, obj):
        # Built-in types come back from a list without apiVersion/kind on each item; custom resources with.
        if rtype.custom:
            return obj
        return dict((k, v) for k, v in obj.items() if k not in ('apiVersion', 'kind'))

    def _get(self, request, route):  # pylint: disable=unused-argument
        return Reply(body=self.store.get(route.rtype, route.namespace, route.name))

    def _list(self, request, route):
        labels, fields = self._selectors(request, route.rtype)
        try:
            limit = int(request.query.get('limit') or 0)
        except ValueError:
            raise errors.bad_request('limit: Invalid value: must be an integer')
        try:
            items, rv, token, remaining = self.store.list(route.rtype, route.namespace, labels, fields, max(limit, 0),
                                                          request.query.get('continue'))
        except Expired as exc:
            raise ApiError(410, str(exc), reason='Expired')
        meta = {'resourceVersion': rv}
        if token:
            meta['continue'] = token
        if remaining is not None:
            meta['remainingItemCount'] = remaining
        return Reply(body={'kind': route.rtype.list_kind, 'apiVersion': route.rtype.api_version, 'metadata': meta,
                           'items': [self._list_item(route.rtype, o) for o in items]})

    def _watch(self, request, route):
        labels, fields = self._selectors(request, route.rtype)
        if route.name:
            fields = FieldSelector('metadata.name=%s' % route.name, route.rtype)
        try:
            timeout = float(request.query.get('timeoutSeconds') or DEFAULT_WATCH_TIMEOUT)
        except ValueError:
            raise errors.bad_request('timeoutSeconds: Invalid value: must be an integer')
        rtype, namespace = route.rtype, route.namespace
        try:
            initial, after = self.store.watch_start(rtype, namespace, request.query.get('resourceVersion'), labels,
                                                    fields)
        except Expired as exc:
            initial, after, expired = [], None, str(exc)
        else:
            expired = None
        deadline = time.monotonic() + timeout

        def matches(obj):
            meta = obj.get('metadata') or {}
            return ((namespace is None or meta.get('namespace') == namespace)
                    and labels.matches(meta.get('labels')) and fields.matches(obj))

        def stream(handler):
            def emit(event_type, obj):
                line = json.dumps({'type': event_type, 'object': obj}, separators=(',', ':')).encode('utf-8') + b'\n'
                handler.wfile.write(b'%x\r\n%s\r\n' % (len(line), line))
                handler.wfile.flush()

            if expired:
                emit('ERROR', ApiError(410, expired, reason='Expired').status())
                return
            for obj in initial:
                emit('ADDED', obj)
            position = after
            while not self.stopping.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0 or _peer_gone(handler):
                    return
                try:
                    events = self.store.events_after(position, min(remaining, 1.0))
                except Expired as exc:
                    emit('ERROR', ApiError(410, str(exc), reason='Expired').status())
                    return
                for rv, key, event_type, old, new in events:
                    position = rv
                    if key != rtype.key:
                        continue
                    was = old is not None and matches(old)
                    now = matches(new)
                    if event_type == 'DELETED':
                        if was:
                            emit('DELETED', new)
                    elif now and was:
                        emit('MODIFIED', new)
                    elif now:
                        emit('ADDED', new)
                    elif was:
                        emit('DELETED', new)

        return Reply(stream=stream)

    @staticmethod
    def _body(request):
        """The decoded body of a create or update (JSON or YAML, as the real server accepts)."""
        if request.content_type and request.content_type not in BODY_TYPES:
            raise errors.unsupported_media_type(request.content_type, BODY_TYPES + ('application/vnd.kubernetes.protobuf',))
        return request.json()

    def _create(self, request, route, user):
        body = self._body(request)
        if route.subresource:
            raise errors.method_not_allowed()
        if route.rtype.review:
            return Reply(201, self._review(route.rtype, body, user))
        obj = self.store.create(route.rtype, route.namespace, body, self._dry_run(request))
        return Reply(201, obj)

    def _review(self, rtype, body, user):
        """SelfSubjectAccessReview / SelfSubjectReview: answered from the authorizer, never stored."""
        answer = {'apiVersion': rtype.api_version, 'kind': rtype.kind, 'metadata': {'creationTimestamp': None}}
        if rtype.review == 'self':
            info = {'username': user.name, 'groups': list(user.groups)}
            if user.uid:
                info['uid'] = user.uid
            if user.extra:
                info['extra'] = user.extra
            answer['status'] = {'userInfo': info}
            return answer
        spec = (body or {}).get('spec') or {}
        attrs = spec.get('resourceAttributes')
        if attrs:
            reason = self.authorizer.allowed(user.name, user.groups, attrs.get('verb'), attrs.get('group', ''),
                                             attrs.get('resource'), attrs.get('namespace') or None, attrs.get('name'),
                                             attrs.get('subresource') or None)
        elif spec.get('nonResourceAttributes'):
            path = spec['nonResourceAttributes'].get('path') or ''
            public = path in PUBLIC_PATHS or path in ('/api', '/apis') or path.startswith(('/api/', '/apis/'))
            reason = 'allowed by system:discovery' if public else (
                'allowed by the system:masters group' if 'system:masters' in user.groups else None)
        else:
            raise errors.invalid(rtype, '', [('spec.resourceAttributes', 'Required value: exactly one of '
                                              'nonResourceAttributes or resourceAttributes must be specified')])
        answer['spec'] = spec
        answer['status'] = {'allowed': bool(reason)}
        if reason:
            answer['status']['reason'] = reason
        return answer

    def _update(self, request, route):
        obj = self.store.update(route.rtype, route.namespace, route.name, self._body(request), route.subresource,
                                self._dry_run(request))
        return Reply(body=obj)

    def _patch(self, request, route):
        content_type, rtype = request.content_type, route.rtype
        accepted = [t for t in PATCH_TYPES if not (rtype.custom and t.startswith('application/strategic'))]
        if content_type not in accepted:
            raise errors.unsupported_media_type(content_type, accepted)
        body, dry_run = request.json(), self._dry_run(request)
        if content_type == APPLY_PATCH:
            if not request.query.get('fieldManager'):
                raise ApiError(422, 'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is '
                                    'required for apply patch', reason='Invalid')
            existed = self.store.find(rtype, route.namespace, route.name) is not None
            obj = self.store.apply(rtype, route.namespace, route.name, body, route.subresource, dry_run)
            return Reply(200 if existed else 201, obj)
        return Reply(body=self.store.patch(rtype, route.namespace, route.name, content_type, body, route.subresource,
                                           dry_run))

    def _delete(self, request, route):
        options = request.json() if request.body else {}
        obj = self.store.delete(route.rtype, route.namespace, route.name, options, self._dry_run(request, options))
        if route.rtype.delete_returns_object:
            return Reply(body=obj)
        details = {'name': route.name, 'kind': route.rtype.resource, 'uid': (obj.get('metadata') or {}).get('uid')}
        if route.rtype.group:
            details['group'] = route.rtype.group
        return Reply(body={'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Success',
                           'details': details})

    def _deletecollection(self, request, route):
        labels, fields = self._selectors(request, route.rtype)
        options = request.json() if request.body else {}
        items = self.store.delete_collection(route.rtype, route.namespace, labels, fields,
                                             self._dry_run(request, options))
        return Reply(body={'kind': route.rtype.list_kind, 'apiVersion': route.rtype.api_version,
                           'metadata': {'resourceVersion': self.store.resource_version},
                           'items': [self._list_item(route.rtype, o) for o in items]})

    def _pod_log(self, request, route):
        """From the pod's kubelet when its Node publishes a kubelet port, else what the control API set."""
        pod = self.store.get(route.rtype, route.namespace, route.name)
        node_name = (pod.get('spec') or {}).get('nodeName')
        node = self.store.find(self.table.by_path('', 'v1', 'nodes'), None, node_name) if node_name else None
        status = (node or {}).get('status') or {}
        port = int(((status.get('daemonEndpoints') or {}).get('kubeletEndpoint') or {}).get('Port') or 0)
        if port <= 0:
            text = self.store.get_log(route.namespace, route.name)
            tail = request.query.get('tailLines')
            if tail:
                lines = text.splitlines(True)
                text = ''.join(lines[-int(tail):]) if int(tail) > 0 else ''
            return Reply(text=text)
        container = _log_container(pod, request.query.get('container'))
        address = next((a.get('address') for a in status.get('addresses') or () if a.get('type') == 'InternalIP'),
                       None) or '127.0.0.1'
        params = []
        for key in KUBELET_LOG_PARAMS:
            value = request.query.get(key)
            if key in ('previous', 'timestamps'):  # re-encoded as the real server does: "true" or left out
                value = 'true' if (value or '').lower() in ('1', 't', 'true') else None
            if value:
                params.append((key, value))
        query = urlencode(params)
        path = '/containerLogs/%s/%s/%s' % tuple(quote(p, safe='') for p in (route.namespace, route.name, container))
        code, text = _kubelet_get(address, port, path + ('?' + query if query else ''))
        if not 200 <= code <= 206:  # what the real server's response checker lets through
            raise ApiError(code, text.strip())
        return Reply(text=text)

    def _pod_binding(self, request, route):
        """pods/binding: what a scheduler posts. Answers a Success Status (201), as the real one does."""
        body = self._body(request)
        if not isinstance(body, dict) or body.get('kind') not in (None, 'Binding'):
            raise errors.bad_request('not a Binding object: %s' % json.dumps(body))
        meta, target = body.get('metadata') or {}, body.get('target') or {}
        if meta.get('name') != route.name:
            raise errors.bad_request('name in URL does not match name in Binding object')
        causes = []
        if target.get('kind') not in (None, '', 'Node'):
            causes.append(('target.kind', 'Unsupported value: "%s": supported values: "Node", "<empty>"'
                           % target['kind']))
        if not target.get('name'):
            # The real server answers this one with a bare 500 (its validation error is no Status).
            causes.append(('target.name', 'Required value'))
        if causes:
            raise errors.invalid(route.rtype, route.name, causes, kind='Binding')
        self.store.bind(route.namespace, route.name, target['name'], meta.get('annotations'), meta,
                        self._dry_run(request, body))
        return Reply(201, {'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Success', 'code': 201})

    # -- faults ------------------------------------------------------------------------------

    def _fault_reply(self, rule, route):
        """The Status a real server would send with that code for this request."""
        code = int(rule['status'])
        if code == 409 and route.rtype and route.name:
            error = errors.conflict(route.rtype, route.name)
        elif code == 404 and route.rtype and route.name:
            error = errors.not_found(route.rtype, route.name)
        elif code == 401:
            error = errors.unauthorized()
        elif code == 403 and route.rtype:
            error = errors.forbidden('injected', route.verb, route.rtype, route.namespace, route.name, route.subresource)
        else:
            error = errors.fault(code)
        if rule.get('message'):
            error.message = rule['message']
        if rule.get('retry_after') is not None:
            error.headers['Retry-After'] = str(rule['retry_after'])
            error.details = dict(error.details or {}, retryAfterSeconds=int(rule['retry_after']))
        return Reply(code, error.status(), headers=error.headers)

    def _apply_modify(self, rule, route):
        """A concurrent writer: merge-patch the object the request was about (or the rule's name)."""
        name = rule.get('name') or (route.name if route else None)
        if not route or not route.rtype or not name:
            return
        try:
            self.store.patch(route.rtype, route.namespace, name, MERGE_PATCH, deep_copy(rule['modify']))
        except ApiError as exc:
            sys.stderr.write('k8s_emulator: modify fault %s failed: %s\n' % (rule['id'], exc.message))

    # -- control API -------------------------------------------------------------------------

    def _control(self, request):
        header = request.headers.get('Authorization') or ''
        if not hmac.compare_digest(header.encode('utf-8'), ('Bearer %s' % self.control_token).encode('utf-8')):
            return Reply(401, errors.unauthorized().status())
        try:
            return self._control_dispatch(request)
        except ApiError as exc:
            return Reply(exc.code, exc.status(), headers=exc.headers)
        except Exception as exc:  # pylint: disable=broad-except
            traceback.print_exc(file=sys.stderr)
            return Reply(500, ApiError(500, 'control API error: %s' % exc).status())

    def _control_dispatch(self, request):
        path = request.path[len('/_emulator'):]
        method = request.method
        if path.startswith('/admin/'):
            # The API itself as cluster admin, outside the request log and the faults.
            api_path = path[len('/admin'):]
            route = self.route(method, api_path, request.query)
            return self.dispatch(request, route, self.admin)
        if path == '/resources' and method == 'GET':
            return Reply(body=self.table.describe())
        if path == '/identities' and method == 'POST':
            spec = request.json() or {}
            return Reply(201, self.identities.add(spec.get('name'), spec.get('groups') or (), spec.get('token', True),
                                                  spec.get('client_cert', False)))
        if path.startswith('/identities/') and method == 'GET':
            found = self.identities.get(path[len('/identities/'):])
            if not found:
                raise ApiError(404, 'no identity %s' % path[len('/identities/'):])
            return Reply(body=found)
        if path == '/requests':
            if method == 'GET':
                return Reply(body=self.log.entries(clear=request.flag('clear')))
            if method == 'DELETE':
                self.log.entries(clear=True)
                return Reply(body={})
        if path == '/faults':
            if method == 'POST':
                return Reply(201, {'id': self.faults.add(request.json() or {})})
            if method == 'GET':
                return Reply(body=self.faults.describe())
            if method == 'DELETE':
                self.faults.remove()
                return Reply(body={})
        if path.startswith('/faults/') and method == 'DELETE':
            self.faults.remove(int(path[len('/faults/'):]))
            return Reply(body={})
        match = re.match(r'^/logs/([^/]+)/([^/]+)$', path)
        if match and method == 'PUT':
            self.store.set_log(match.group(1), match.group(2), request.body.decode('utf-8'))
            return Reply(body={})
        if path == '/nodes' and method == 'POST':
            spec = request.json() or {}
            created = self.store.add_nodes(int(spec.get('count', 1)), spec.get('prefix', 'node-'), spec.get('labels'),
                                           int(spec.get('start', 0)))
            return Reply(201, {'names': [o['metadata']['name'] for o in created],
                               'resourceVersion': self.store.resource_version})
        if path == '/reset' and method == 'POST':
            self.store.reset()
            self.faults.remove()
            self.log.entries(clear=True)
            return Reply(body={'resourceVersion': self.store.resource_version})
        raise ApiError(404, 'no control endpoint %s %s' % (method, path))


def _log_container(pod, name):
    """The container pods/log reads: the one named (it must exist) or the pod's only one."""
    spec = pod.get('spec') or {}
    every = [c.get('name') for key in ('initContainers', 'containers', 'ephemeralContainers')
             for c in spec.get(key) or ()]
    pod_name = pod['metadata']['name']
    if name:
        if name not in every:
            raise errors.bad_request('container %s is not valid for pod %s' % (name, pod_name))
        return name
    containers = spec.get('containers') or ()
    if len(containers) == 1:
        return containers[0].get('name')
    if not containers:
        raise errors.bad_request('a container name must be specified for pod %s' % pod_name)
    raise errors.bad_request('a container name must be specified for pod %s, choose one of: [%s]'
                             % (pod_name, ' '.join(every)))


def _kubelet_get(address, port, path):
    """(status, text) of GET http://address:port/path; a failure to connect is a 500 worded as Go's
    net/http words it, which is what the real server relays."""
    host = '[%s]' % address if ':' in address else address
    url = 'http://%s:%d%s' % (host, port, path)
    conn = http.client.HTTPConnection(address, port, timeout=KUBELET_TIMEOUT)
    try:
        try:
            conn.connect()
        except OSError as exc:
            why = {ConnectionRefusedError: 'connect: connection refused', socket.timeout: 'i/o timeout'}.get(
                type(exc), str(exc))
            raise ApiError(500, 'Get "%s": dial tcp %s:%d: %s' % (url, host, port, why)) from exc
        try:
            conn.request('GET', path)
            response = conn.getresponse()
            return response.status, response.read().decode('utf-8', 'replace')
        except (OSError, http.client.HTTPException) as exc:
            raise ApiError(500, 'Get "%s": %s' % (url, exc)) from exc
    finally:
        conn.close()


def _peer_gone(handler):
    """True once a watching client closed its connection (checked between events, so that
    abandoned watches do not hold a thread until their timeout)."""
    connection = handler.connection
    try:
        if not select.select([connection], [], [], 0)[0]:
            return False
        connection.settimeout(0.01)
        try:
            data = connection.recv(1)
        finally:
            connection.settimeout(handler.timeout)
    except (socket.timeout, ssl.SSLWantReadError):
        return False  # TLS bytes that were no application data
    except (OSError, ValueError):
        return True
    if data:
        handler.close_connection = True  # the client spoke during a watch: do not reuse the connection
    return not data


class _Handler(BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    server_version = 'k8s-emulator/1'
    timeout = 300  # idle keep-alive connections

    def _serve(self):
        self.server.api.handle(self)

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

    def log_message(self, format, *args):  # pylint: disable=redefined-builtin
        if self.server.api.verbose:
            BaseHTTPRequestHandler.log_message(self, format, *args)


class TLSServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that does the TLS handshake in the connection's own thread."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 128

    def __init__(self, address, api, ssl_context):
        self.api = api
        self.ssl_context = ssl_context
        ThreadingHTTPServer.__init__(self, address, _Handler)

    def finish_request(self, request, client_address):
        request.settimeout(30)
        # Headers and body go out in separate writes: without TCP_NODELAY, Nagle's algorithm and
        # the client's delayed ACK add 40 ms to every response.
        request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            conn = self.ssl_context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            if self.api.verbose:
                sys.stderr.write('k8s_emulator: TLS handshake with %s failed: %s\n' % (client_address, exc))
            return
        try:
            self.RequestHandlerClass(conn, client_address, self)
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def handle_error(self, request, client_address):
        if self.api.verbose:
            ThreadingHTTPServer.handle_error(self, request, client_address)


def ssl_context(cert, key, ca_cert):
    """Server TLS: our certificate; client certificates optional, verified against the CA."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    context.load_verify_locations(ca_cert)
    context.verify_mode = ssl.CERT_OPTIONAL
    return context
