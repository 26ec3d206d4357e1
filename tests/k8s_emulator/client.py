# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The test side: start the emulator in a subprocess and drive its control API.

Plain synchronous Python on the standard library only, so any test (or another process) can use it::

    with Emulator.start(tmp_path) as emu:
        bob = emu.add_identity('bob', groups=['ops'])          # bob.kubeconfig, bob.token
        emu.create({'apiVersion': 'v1', 'kind': 'Node', 'metadata': {'name': 'n1'}})
        emu.inject(verb='patch', resource='nodes', status=503, count=2)
        ...                                                   # code under test, with bob.kubeconfig
        assert emu.counts()[('patch', 'nodes')] == 3

Object helpers (create/get/list/put/patch/delete) act as cluster admin through the control API:
they are not in the request log and faults do not touch them.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import collections
import http.client
import json
import os
import ssl
import subprocess
import sys
import time
from urllib.parse import quote, urlencode, urlsplit

PATCH_TYPES = {
    'merge': 'application/merge-patch+json',
    'strategic': 'application/strategic-merge-patch+json',
    'json': 'application/json-patch+json',
}
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def https_request(host, port, context, method, path, token=None, body=None, content_type='application/json',
                  timeout=30):
    """One HTTPS request on a fresh connection: (response, raw body bytes). A str body is sent as
    it is, anything else as JSON."""
    conn = http.client.HTTPSConnection(host, port, context=context, timeout=timeout)
    headers = {'Accept': 'application/json'}
    if token:
        headers['Authorization'] = 'Bearer %s' % token
    data = None
    if body is not None:
        data = body.encode('utf-8') if isinstance(body, str) else json.dumps(body).encode('utf-8')
        headers['Content-Type'] = content_type
    try:
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        return response, response.read()
    finally:
        conn.close()


class EmulatorError(Exception):
    """A control call failed: ``code`` is the HTTP status, ``status`` the Status object (a dict)."""

    def __init__(self, code, status, what):
        message = status.get('message') if isinstance(status, dict) else status
        super(EmulatorError, self).__init__('%s: HTTP %s: %s' % (what, code, message))
        self.code = code
        self.status = status
        self.reason = status.get('reason') if isinstance(status, dict) else None


class Identity:
    """A user of the emulated cluster: kubeconfig path, bearer token (and its file), client cert and key."""

    def __init__(self, info):
        self.name = info['name']
        self.groups = list(info.get('groups') or ())
        self.kubeconfig = info['kubeconfig']
        self.token = info.get('token')
        self.token_file = info.get('token_file')
        self.cert = info.get('cert')
        self.key = info.get('key')

    def __repr__(self):
        return 'Identity(%r, groups=%r)' % (self.name, self.groups)


class Emulator:
    """A running emulator (see ``start``): its URL, CA, kubeconfigs and the control API."""

    def __init__(self, info, process=None, directory=None):
        self.info = info
        self.process = process
        self.directory = directory
        self.url = info['url']
        self.ca_cert = info['ca_cert']
        self._control_token = info['control_token']
        self._kubeconfigs = dict(info.get('kubeconfigs') or {})
        self._resources = None
        self._context = ssl.create_default_context(cafile=self.ca_cert)

    # -- process -----------------------------------------------------------------------------

    @classmethod
    def start(cls, directory, nodes=0, timeout=60, verbose=False, python=sys.executable, port=0):
        """Start ``python -m k8s_emulator --dir directory`` and wait until it listens; a
        RuntimeError with the process's output when it exits or times out first."""
        directory = os.path.abspath(str(directory))
        os.makedirs(directory, exist_ok=True)
        info_path = os.path.join(directory, 'emulator.json')
        if os.path.exists(info_path):
            os.unlink(info_path)
        env = dict(os.environ)
        env['PYTHONPATH'] = os.pathsep.join(p for p in (_PACKAGE_PARENT, env.get('PYTHONPATH')) if p)
        cmd = [python, '-m', 'k8s_emulator', '--dir', directory, '--port', str(int(port)), '--nodes', str(int(nodes))]
        if verbose:
            cmd.append('--verbose')
        log_path = os.path.join(directory, 'emulator.log')
        with open(log_path, 'ab') as log:
            process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
        deadline = time.monotonic() + timeout
        while not os.path.exists(info_path):
            if process.poll() is not None or time.monotonic() > deadline:
                if process.poll() is None:
                    process.kill()
                    process.wait()
                with open(log_path, errors='replace') as handle:
                    tail = handle.read()[-4000:]
                raise RuntimeError('k8s emulator did not start (exit code %s) within %ss; its output:\n%s'
                                   % (process.returncode, timeout, tail))
            time.sleep(0.05)
        with open(info_path) as handle:
            info = json.load(handle)
        return cls(info, process, directory)

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.stop()

    # -- HTTP --------------------------------------------------------------------------------

    def ssl_context(self):
        """A client SSL context that trusts the emulator's CA."""
        return ssl.create_default_context(cafile=self.ca_cert)

    def _call(self, method, path, body=None, content_type='application/json', query=None, what=None):
        """One control call; returns the decoded JSON (or text) answer, raises EmulatorError."""
        parts = urlsplit(self.url)
        target = path + ('?' + urlencode(query) if query else '')
        response, raw = https_request(parts.hostname, parts.port, self._context, method, target,
                                      token=self._control_token, body=body, content_type=content_type, timeout=60)
        if response.getheader('Content-Type', '').startswith('application/json'):
            decoded = json.loads(raw.decode('utf-8')) if raw else None
        else:
            decoded = raw.decode('utf-8')
        if response.status >= 400:
            raise EmulatorError(response.status, decoded, what or '%s %s' % (method, path))
        return decoded

    # -- identities --------------------------------------------------------------------------

    def add_identity(self, name, groups=(), token=True, client_cert=False):
        """A new user with a kubeconfig: bearer token and/or client certificate (CN=name, O=groups)."""
        identity = Identity(self._call('POST', '/_emulator/identities', {
            'name': name, 'groups': list(groups), 'token': bool(token), 'client_cert': bool(client_cert)}))
        self._kubeconfigs[name] = identity.kubeconfig
        return identity

    def identity(self, name):
        return Identity(self._call('GET', '/_emulator/identities/%s' % quote(name, safe='')))

    def kubeconfig(self, name='admin'):
        if name not in self._kubeconfigs:
            self._kubeconfigs[name] = self.identity(name).kubeconfig
        return self._kubeconfigs[name]

    # -- request log and faults --------------------------------------------------------------

    def requests(self, clear=False):
        """The API requests served since the last clear: dicts with verb, resource, subresource,
        namespace, name, group, code, user, content_type, method, path, time."""
        return self._call('GET', '/_emulator/requests', query={'clear': '1'} if clear else None)

    def clear_requests(self):
        self._call('DELETE', '/_emulator/requests')

    def counts(self, requests=None):
        """{(verb, resource): number of requests} over requests (default: the log, not cleared)."""
        entries = self.requests() if requests is None else requests
        return collections.Counter((e['verb'], e['resource']) for e in entries)

    def inject(self, verb=None, resource=None, name=None, namespace=None, subresource=None, count=1, status=None,
               delay=None, modify=None, message=None, retry_after=None):
        """Make the next `count` matching requests (None: all) fail with HTTP `status`, wait `delay`
        seconds first, and/or merge-patch the object with `modify` right after answering them.
        None matches anything; subresource='' matches only the main resource. `message` replaces
        the Status message; `retry_after` (seconds) adds a Retry-After header. Returns the rule id."""
        spec = {'verb': verb, 'resource': resource, 'name': name, 'namespace': namespace, 'subresource': subresource,
                'count': count, 'status': status, 'delay': delay, 'modify': modify, 'message': message,
                'retry_after': retry_after}
        return self._call('POST', '/_emulator/faults', spec)['id']

    def faults(self):
        """The rules with what is left of them (remaining, hits)."""
        return self._call('GET', '/_emulator/faults')

    def remove_fault(self, rule_id):
        self._call('DELETE', '/_emulator/faults/%d' % rule_id)

    def clear_faults(self):
        self._call('DELETE', '/_emulator/faults')

    # -- objects, as cluster admin -----------------------------------------------------------

    def resource(self, api_version, kind_or_resource):
        """The resource table entry for (apiVersion, Kind or plural)."""
        if self._resources is None:
            self._resources = self._call('GET', '/_emulator/resources')
        for entry in self._resources:
            if entry['apiVersion'] == api_version and kind_or_resource in (entry['kind'], entry['resource']):
                return entry
        raise KeyError('the emulator does not serve %s %s' % (api_version, kind_or_resource))

    def _path(self, api_version, kind_or_resource, name=None, namespace=None, subresource=None):
        entry = self.resource(api_version, kind_or_resource)
        path = '/_emulator/admin' + ('/api/' if '/' not in api_version else '/apis/') + api_version
        if entry['namespaced'] and namespace:
            path += '/namespaces/' + quote(namespace, safe='')
        path += '/' + entry['resource']
        if name:
            path += '/' + quote(name, safe='')
        if subresource:
            path += '/' + subresource
        return path

    @staticmethod
    def _dry(dry_run):
        return {'dryRun': 'All'} if dry_run else None

    def create(self, obj, dry_run=False):
        meta = obj.get('metadata') or {}
        path = self._path(obj['apiVersion'], obj['kind'], namespace=meta.get('namespace') or 'default')
        return self._call('POST', path, obj, query=self._dry(dry_run))

    def get(self, api_version, kind, name, namespace=None, subresource=None):
        return self._call('GET', self._path(api_version, kind, name, namespace or 'default', subresource))

    def exists(self, api_version, kind, name, namespace=None):
        try:
            self.get(api_version, kind, name, namespace)
            return True
        except EmulatorError as exc:
            if exc.code == 404:
                return False
            raise

    def list(self, api_version, kind, namespace=None, label_selector=None, field_selector=None):
        """The items (namespace None: all namespaces)."""
        query = dict((k, v) for k, v in (('labelSelector', label_selector), ('fieldSelector', field_selector)) if v)
        return self._call('GET', self._path(api_version, kind, namespace=namespace), query=query or None)['items']

    def put(self, obj, subresource=None):
        meta = obj['metadata']
        path = self._path(obj['apiVersion'], obj['kind'], meta['name'], meta.get('namespace') or 'default',
                          subresource)
        return self._call('PUT', path, obj)

    def patch(self, api_version, kind, name, patch, namespace=None, patch_type='merge', subresource=None):
        path = self._path(api_version, kind, name, namespace or 'default', subresource)
        return self._call('PATCH', path, patch, content_type=PATCH_TYPES.get(patch_type, patch_type))

    def delete(self, api_version, kind, name, namespace=None):
        return self._call('DELETE', self._path(api_version, kind, name, namespace or 'default'))

    def set_pod_log(self, namespace, name, text):
        """What GET .../pods/NAME/log answers (text/plain)."""
        self._call('PUT', '/_emulator/logs/%s/%s' % (quote(namespace, safe=''), quote(name, safe='')), text,
                   content_type='text/plain')

    def add_nodes(self, count, prefix='node-', labels=None, start=0):
        """Create Ready Node objects PREFIX00000...; returns their names."""
        return self._call('POST', '/_emulator/nodes', {'count': count, 'prefix': prefix, 'labels': labels or {},
                                                       'start': start})['names']

    def reset(self):
        """Forget every object, fault and logged request (identities stay)."""
        self._call('POST', '/_emulator/reset')
