# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An HTTPS proxy in front of the lab's real kube-apiserver that fails requests on demand: what a real server
will not do when a test asks (a burst of 5xx or 429, a dropped connection, a slow answer, a 410, a write by
someone else between a client's GET and its PATCH). Everything else is forwarded unchanged, watches streamed,
and answered by the real server; the proxy decides nothing about Kubernetes objects.

    proxy = FaultProxy(upstream='https://127.0.0.1:6443', ca=lab_ca, work_dir=d, admin=(cert, key)).start()
    proxy.inject(verb='patch', resource='nodes', name='n1', status=409, count=1)
    ... a client with a bearer token and proxy.url ...
    proxy.answered()   # what the proxy answered itself: one dict per injected answer

Clients authenticate with bearer tokens, which the proxy passes on; a client certificate ends at the proxy
(TLS terminates here), so users with certificates talk to the real server directly. The proxy's own
certificate is issued by the lab's CA for 127.0.0.1, so a client trusts both with one CA file."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import http.client
import http.server
import json
import os
import socket
import ssl
import threading
import time
from urllib.parse import parse_qs, urlsplit

REASONS = {400: 'BadRequest', 401: 'Unauthorized', 403: 'Forbidden', 404: 'NotFound', 409: 'Conflict',
           410: 'Expired', 429: 'TooManyRequests', 500: 'InternalError', 503: 'ServiceUnavailable',
           504: 'Timeout'}
# Headers that belong to one hop, not to the request or answer (RFC 9110 7.6.1).
HOP_HEADERS = {'connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'te', 'trailer', 'upgrade'}
NAMESPACE_SUBRESOURCES = ('status', 'finalize')


def describe(method, target):
    """What a request asks, in the words of kube-apiserver's audit log: verb, group, resource, subresource,
    namespace, name (None where the request has none, as for /version)."""
    url = urlsplit(target)
    parts = [p for p in url.path.split('/') if p]
    info = {'verb': method.lower(), 'group': None, 'resource': None, 'subresource': None, 'namespace': None,
            'name': None}
    if parts[:1] == ['api'] and len(parts) >= 3:
        info['group'], rest = '', parts[2:]
    elif parts[:1] == ['apis'] and len(parts) >= 4:
        info['group'], rest = parts[1], parts[3:]
    else:
        return info
    if rest[0] == 'namespaces' and len(rest) >= 2:
        info['namespace'] = rest[1]
        if len(rest) > 2 and rest[2] not in NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    info['resource'] = rest[0]
    info['name'] = rest[1] if len(rest) > 1 else None
    info['subresource'] = rest[2] if len(rest) > 2 else None
    query = parse_qs(url.query)
    verbs = {'get': 'get' if info['name'] else 'list', 'post': 'create', 'put': 'update', 'patch': 'patch',
             'delete': 'delete' if info['name'] else 'deletecollection'}
    info['verb'] = verbs.get(info['verb'], info['verb'])
    if info['verb'] in ('get', 'list') and query.get('watch', [''])[0] in ('1', 'true'):
        info['verb'] = 'watch'
    return info


class Fault:
    """One rule: the next `count` requests matching it (None: every one) get what it says."""

    FIELDS = ('verb', 'resource', 'name', 'namespace', 'subresource')

    def __init__(self, count=1, status=None, delay=None, drop=False, modify=None, message=None, **match):
        unknown = set(match) - set(self.FIELDS)
        if unknown:
            raise TypeError('unknown match fields: %s' % ', '.join(sorted(unknown)))
        if not (status or delay or drop or modify):
            raise ValueError('a fault needs status, delay, drop or modify')
        self.match, self.remaining, self.hits = match, count, 0
        self.status, self.delay, self.drop, self.modify = status, delay, drop, modify
        self.message = message

    def matches(self, info):
        if self.remaining == 0:
            return False
        for field, wanted in self.match.items():
            if wanted is None:
                continue
            have = info[field]
            if field == 'subresource' and wanted == '':
                if have:
                    return False
            elif have != wanted:
                return False
        return True

    def status_body(self, info):
        """The Status kube-apiserver sends with that code, worded as it words it."""
        code = self.status
        what = info['resource'] + ('.' + info['group'] if info['group'] else '') if info['resource'] else None
        if self.message:
            message = self.message
        elif code == 409 and info['name']:
            message = ('Operation cannot be fulfilled on %s "%s": the object has been modified; please apply your '
                       'changes to the latest version and try again' % (what, info['name']))
        elif code == 410:
            message = 'too old resource version'
        else:
            message = 'injected fault (HTTP %d)' % code
        body = {'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Failure', 'message': message,
                'reason': REASONS.get(code, 'Unknown'), 'code': code}
        if info['name'] and what:
            body['details'] = {'name': info['name'], 'kind': info['resource']}
        return body


class FaultProxy:
    """The proxy; ``start()`` listens on 127.0.0.1 (a free port) in threads of its own, ``stop()`` ends it."""

    def __init__(self, upstream, ca, work_dir, admin):
        self.upstream = urlsplit(upstream)
        self.admin_cert, self.admin_key = admin
        cert, key = os.path.join(work_dir, 'fault-proxy.crt'), os.path.join(work_dir, 'fault-proxy.key')
        ca.issue(cert, key, common_name='gpuready-fault-proxy', server_names=['127.0.0.1', 'localhost'])
        self.server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.server_context.load_cert_chain(cert, key)
        self.ca_path = ca.cert_path
        self.upstream_context = ssl.create_default_context(cafile=ca.cert_path)
        self.lock = threading.Lock()
        self.faults, self.records = [], []
        self.server = self.thread = None
        self.url = None

    # -- the test's side --------------------------------------------------------------------
    def start(self):
        proxy = self

        class Handler(_Handler):
            owner = proxy
        self.server = _Server(('127.0.0.1', 0), Handler)
        self.server.socket = self.server_context.wrap_socket(self.server.socket, server_side=True,
                                                             do_handshake_on_connect=False)
        self.url = 'https://127.0.0.1:%d' % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name='fault-proxy', daemon=True)
        self.thread.start()
        return self

    def stop(self):
        if self.server:
            self.server.shutdown()
            self.server.server_close()
            self.thread.join(10)

    def inject(self, **spec):
        """Adds a Fault (its arguments); returns it, so that a test can read its hits."""
        fault = Fault(**spec)
        with self.lock:
            self.faults.append(fault)
        return fault

    def clear_faults(self):
        with self.lock:
            self.faults = []

    def answered(self):
        """What the proxy answered itself (injected status or dropped connection), oldest first: describe()'s
        fields plus code (None for a drop), time (epoch) and token (the bearer token the client sent)."""
        with self.lock:
            return list(self.records)

    # -- the proxy's side -------------------------------------------------------------------
    def take_fault(self, info):
        with self.lock:
            for fault in self.faults:
                if fault.matches(info):
                    fault.hits += 1
                    if fault.remaining is not None:
                        fault.remaining -= 1
                    return fault
        return None

    def record(self, info, code, token, received):
        with self.lock:
            self.records.append(dict(info, code=code, time=received, token=token))

    def upstream_connection(self):
        return http.client.HTTPSConnection(self.upstream.hostname, self.upstream.port, context=self.upstream_context,
                                           timeout=300)

    def write_meanwhile(self, info, patch):
        """Someone else's write: merge-patch the object the client just read, as the lab's admin."""
        context = ssl.create_default_context(cafile=self.ca_path)
        context.load_cert_chain(self.admin_cert, self.admin_key)
        connection = http.client.HTTPSConnection(self.upstream.hostname, self.upstream.port, context=context,
                                                 timeout=30)
        try:
            connection.request('PATCH', urlsplit(info['path']).path, body=json.dumps(patch),
                               headers={'Content-Type': 'application/merge-patch+json', 'Accept': 'application/json'})
            answer = connection.getresponse()
            body = answer.read()
            if answer.status != 200:
                raise RuntimeError('the write between GET and PATCH failed: %d %s' % (answer.status, body[:500]))
        finally:
            connection.close()


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def get_request(self):
        sock, address = super(_Server, self).get_request()
        sock.settimeout(60)
        return sock, address


class _Handler(http.server.BaseHTTPRequestHandler):
    """One client connection; each request is answered by a fault or by the real server."""

    protocol_version = 'HTTP/1.1'
    owner = None  # the FaultProxy, set by FaultProxy.start

    def setup(self):
        try:
            self.request.do_handshake()
        except (ssl.SSLError, OSError):
            self.close_connection = True
        super(_Handler, self).setup()
        self.upstream = None

    def log_message(self, format, *args):  # pylint: disable=redefined-builtin
        pass  # the tests read the audit log and answered(), not the proxy's access log

    def do_GET(self):
        self._serve()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_GET

    def _serve(self):
        received = time.time()
        info = describe(self.command, self.path)
        length = int(self.headers.get('Content-Length') or 0)
        body = self.rfile.read(length) if length else None
        auth = self.headers.get('Authorization') or ''
        token = auth[len('Bearer '):] if auth.startswith('Bearer ') else None
        fault = self.owner.take_fault(info)
        if fault and fault.delay:
            time.sleep(fault.delay)  # the slow answer is the fault itself
        if fault and fault.drop:
            self.owner.record(info, None, token, received)
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if fault and fault.status:
            self.owner.record(info, fault.status, token, received)
            self._reply(fault.status, json.dumps(fault.status_body(info)).encode(), {'Content-Type': 'application/json'})
            return
        self._forward(body, fault, info)

    def _reply(self, code, payload, headers):
        self.send_response(code)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header('Content-Length', str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _forward(self, body, fault, info):
        headers = dict((k, v) for k, v in self.headers.items() if k.lower() not in HOP_HEADERS | {'host'})
        if self.upstream is None:
            self.upstream = self.owner.upstream_connection()
        try:
            self.upstream.request(self.command, self.path, body=body, headers=headers)
            answer = self.upstream.getresponse()
        except (OSError, http.client.HTTPException):
            self.upstream.close()
            self.upstream = self.owner.upstream_connection()
            self.upstream.request(self.command, self.path, body=body, headers=headers)
            answer = self.upstream.getresponse()
        streamed = answer.getheader('Content-Length') is None
        if not streamed:
            payload = answer.read()
            if fault and fault.modify and answer.status == 200:
                self.owner.write_meanwhile(dict(info, path=self.path), fault.modify)
            self._reply(answer.status, payload, dict((k, v) for k, v in answer.getheaders()
                                                     if k.lower() not in HOP_HEADERS | {'content-length'}))
            return
        self.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in HOP_HEADERS:
                self.send_header(name, value)
        self.send_header('Transfer-Encoding', 'chunked')
        self.end_headers()
        try:
            while True:
                chunk = answer.read1(65536)
                if not chunk:
                    break
                self.wfile.write(b'%x\r\n%s\r\n' % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b'0\r\n\r\n')
        except OSError:
            self.close_connection = True
            answer.close()
            self.upstream.close()
            self.upstream = None

    def finish(self):
        if getattr(self, 'upstream', None) is not None:
            self.upstream.close()
        super(_Handler, self).finish()
