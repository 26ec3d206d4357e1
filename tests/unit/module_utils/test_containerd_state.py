# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""containerd_state: deciding a restart from running state (the daemon side is covered by the
Molecule scenarios and test_containerd_nvidia_runtime's real daemons)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

import lab_scripts

from ansible_collections.gpuready.nvidia.plugins.module_utils import containerd_state as state

CertificateAuthority = lab_scripts.script('lab/pki.py', 'gpuready_lab_pki').CertificateAuthority
ACTIVE = {'name': 'containerd', 'active_state': 'active', 'main_pid': 42, 'started_at': 1000.0}


def cri(default='nvidia', runtimes=('runc', 'nvidia'), ready=True):
    return {'default_runtime_name': default, 'runtimes': dict((r, {}) for r in runtimes), 'runtime_ready': ready}


def files(mtime=900.0):
    return [{'path': '/etc/containerd/config.toml', 'exists': True, 'mtime': mtime}]


def test_nothing_to_do_when_containerd_runs_its_files():
    assert state.restart_reasons(ACTIVE, cri(), None, files(), 'nvidia', True) == []
    assert state.restart_reasons(ACTIVE, cri(default=''), None, files(), 'nvidia', False) == []
    assert state.restart_reasons(ACTIVE, cri(default='runc'), None, files(), 'nvidia', None) == []


def test_a_file_newer_than_the_service_needs_a_restart():
    assert state.restart_reasons(ACTIVE, cri(), None, files(mtime=1000.5), 'nvidia', True) == [
        '/etc/containerd/config.toml changed after containerd started']
    missing = [{'path': '/etc/containerd/conf.d/99-nvidia.toml', 'exists': False, 'mtime': None}]
    assert state.restart_reasons(ACTIVE, cri(), None, missing, 'nvidia', True) == []


def test_what_cri_loaded_decides_even_when_the_files_look_old():
    """A run killed after the write, with an mtime older than a restart for another reason, or a
    config containerd rejected: the running state shows it."""
    assert state.restart_reasons(ACTIVE, cri(default='runc'), None, files(), 'nvidia', True) == [
        "the running CRI plugin's default runtime is 'runc', not 'nvidia'"]
    assert state.restart_reasons(ACTIVE, cri(default='', runtimes=('runc',)), None, files(), 'nvidia', True) == [
        "the running CRI plugin has no runtime 'nvidia' (it has: runc)",
        "the running CRI plugin's default runtime is 'runc', not 'nvidia'"]
    assert state.restart_reasons(ACTIVE, cri(), None, files(), 'nvidia', False) == [
        "the running CRI plugin still has 'nvidia' as its default runtime"]


def test_a_stopped_service_or_a_silent_cri():
    stopped = dict(ACTIVE, active_state='failed', main_pid=0, started_at=None)
    assert state.restart_reasons(stopped, None, 'containerd is failed', files(), 'nvidia', True) == [
        'containerd is failed']
    assert state.restart_reasons(ACTIVE, None, 'no socket', files(), 'nvidia', True) == [
        'the CRI plugin does not answer: no socket']


def test_process_start_time_of_this_process():
    started = state.process_start_time(os.getpid())
    assert abs(started - state.process_start_time(os.getpid())) < 0.05  # stable, unlike btime
    assert time.time() - 3600 < started <= time.time() + 0.05


def test_service_state_reads_systemctl_show():
    def fake_run(args, **_kwargs):
        assert args == ['systemctl', 'show', '--property=ActiveState,MainPID', 'containerd']
        return subprocess.CompletedProcess(args, 0, stdout='MainPID=%d\nActiveState=active\n' % os.getpid())

    found = state.service_state('containerd', run=fake_run)
    assert found['active_state'] == 'active' and found['main_pid'] == os.getpid()
    assert abs(found['started_at'] - state.process_start_time(os.getpid())) < 0.05

    def stopped(args, **_kwargs):
        return subprocess.CompletedProcess(args, 0, stdout='MainPID=0\nActiveState=inactive\n')

    assert state.service_state('containerd', run=stopped) == {
        'name': 'containerd', 'active_state': 'inactive', 'main_pid': 0, 'started_at': None}


def test_config_files(tmp_path):
    present = tmp_path / 'config.toml'
    present.write_text('version = 2\n')
    found = state.config_files([str(present), str(tmp_path / 'missing.toml')])
    assert found[0]['exists'] and found[0]['mtime'] == os.stat(str(present)).st_mtime
    assert found[1] == {'path': str(tmp_path / 'missing.toml'), 'exists': False, 'mtime': None}


class _Readyz(BaseHTTPRequestHandler):
    """/readyz as k3s serves it: 200 to a client certificate, 401 to anonymous requests; 503 while starting."""
    starting = False

    def do_GET(self):  # pylint: disable=invalid-name
        if self.path != '/readyz':
            code = 404
        elif self.starting:
            code = 503
        else:
            code = 200 if self.connection.getpeercert() else 401
        self.send_response(code)
        self.end_headers()

    def log_message(self, *_args):  # pylint: disable=arguments-differ
        pass


@pytest.fixture(name='api')
def api_fixture(tmp_path):
    """A real TLS server that asks for client certificates, with a CA, server and client certificate."""
    ca = CertificateAuthority.create(str(tmp_path))
    server_cert, server_key = ca.issue(str(tmp_path / 'server.crt'), str(tmp_path / 'server.key'), 'kube-apiserver',
                                       server_names=['127.0.0.1'])
    client_cert, client_key = ca.issue(str(tmp_path / 'admin.crt'), str(tmp_path / 'admin.key'), 'system:admin',
                                       organizations=['system:masters'])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(server_cert, server_key)
    context.load_verify_locations(ca.cert_path)
    context.verify_mode = ssl.CERT_OPTIONAL
    handler = type('Readyz', (_Readyz,), {'starting': False})
    server = HTTPServer(('127.0.0.1', 0), handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield {'url': 'https://127.0.0.1:%d' % server.server_port, 'ca_file': ca.cert_path, 'cert_file': client_cert,
           'key_file': client_key, 'handler': handler}
    server.shutdown()
    server.server_close()


def test_api_ready_with_a_client_certificate(api):
    handler = api.pop('handler')
    assert state.api_ready(wait=0, **api) == (True, None)
    handler.starting = True
    ready, error = state.api_ready(wait=0, **api)
    assert not ready and error == '%s/readyz answered 503 Service Unavailable' % api['url']


def test_api_ready_refused_without_one_or_with_an_unknown_ca(api, tmp_path):
    ready, error = state.api_ready(api['url'], wait=0, ca_file=api['ca_file'])
    assert not ready and 'answered 401' in error
    (tmp_path / 'other').mkdir()
    other = CertificateAuthority.create(str(tmp_path / 'other'))
    ready, error = state.api_ready(api['url'], wait=0, ca_file=other.cert_path, cert_file=api['cert_file'],
                                   key_file=api['key_file'])
    assert not ready and 'CERTIFICATE_VERIFY_FAILED' in error


def test_api_ready_keeps_asking_until_the_deadline(api):
    handler = api.pop('handler')
    handler.starting = True
    now = [0.0]
    asked = []

    def sleep(seconds):
        asked.append(now[0])
        now[0] += seconds
        if now[0] >= 3:
            handler.starting = False

    assert state.api_ready(wait=10, interval=1, clock=lambda: now[0], sleep=sleep, **api) == (True, None)
    assert asked == [0.0, 1.0, 2.0]
    handler.starting = True
    now[0] = 0.0
    ready, error = state.api_ready(wait=2, interval=1, clock=lambda: now[0],
                                   sleep=lambda seconds: now.__setitem__(0, now[0] + seconds), **api)
    assert not ready and '503' in error


def _restart_with(monkeypatch, healthy=True, ready_before=True, ready_after=True, restart_rc=0):
    """restart() over a fake systemctl, gather() and api_ready(); returns (result, calls)."""
    calls = []

    def gather(unit, *_args, **kwargs):
        calls.append(('gather', kwargs.get('wait', 0.0)))
        return {'service': dict(ACTIVE, name=unit), 'healthy': healthy, 'restart_needed': not healthy,
                'restart_reasons': [] if healthy else ['no runtime'], 'cri': None, 'cri_error': None,
                'config_files': []}

    def api_ready(wait, **_api):
        calls.append(('api', wait))
        ready = ready_before if wait == 0 else ready_after
        return ready, None if ready else 'answered 503'

    def run(args, **_kwargs):
        calls.append(tuple(args))
        return subprocess.CompletedProcess(args, restart_rc, stdout='', stderr='' if restart_rc == 0 else 'Job failed')

    monkeypatch.setattr(state, 'gather', gather)
    monkeypatch.setattr(state, 'api_ready', api_ready)
    api = {'url': 'https://127.0.0.1:6443'}
    result = state.restart('k3s', '/run/k3s/containerd/containerd.sock', [], 'nvidia', True, wait=60, api=api,
                           api_wait=300, run=run)
    return result, calls


def test_restart_an_api_server_between_two_ready_apis(monkeypatch):
    result, calls = _restart_with(monkeypatch)
    assert calls == [('api', 0), ('systemctl', 'restart', 'k3s'), ('gather', 60), ('api', 300)]
    assert result['restarted'] and result['api_ready'] is True and result['restart_error'] is None
    assert result['restarted_at'] <= result['finished_at']


def test_no_restart_while_the_api_is_not_ready(monkeypatch):
    result, calls = _restart_with(monkeypatch, ready_before=False)
    assert calls == [('api', 0), ('gather', 0)]
    assert not result['restarted'] and result['api_ready'] is False
    assert result['restart_error'] == 'not restarting k3s while the Kubernetes API is not ready (answered 503)'


def test_no_api_wait_when_containerd_came_back_unhealthy_or_did_not_restart(monkeypatch):
    result, calls = _restart_with(monkeypatch, healthy=False)
    assert calls == [('api', 0), ('systemctl', 'restart', 'k3s'), ('gather', 60)]
    assert result['restarted'] and result['api_ready'] is None and not result['healthy']
    result, calls = _restart_with(monkeypatch, restart_rc=1)
    assert calls == [('api', 0), ('systemctl', 'restart', 'k3s'), ('gather', 0)]
    assert not result['restarted'] and result['restart_error'] == 'Job failed'


def test_the_api_not_ready_after_the_restart(monkeypatch):
    result, _calls = _restart_with(monkeypatch, ready_after=False)
    assert result['restarted'] and result['healthy'] and result['api_ready'] is False
    assert result['api_error'] == 'answered 503'


def test_without_the_runtime_check_only_the_files_and_cri_decide():
    """After state=absent the files hold whatever runtimes they had before us."""
    for loaded in (cri(default='nvidia'), cri(default='', runtimes=('runc',))):
        assert state.restart_reasons(ACTIVE, loaded, None, files(), 'nvidia', True, check_runtime=False) == []
    assert state.restart_reasons(ACTIVE, cri(), None, files(mtime=1000.5), 'nvidia', None, check_runtime=False) == [
        '/etc/containerd/config.toml changed after containerd started']
    assert state.restart_reasons(ACTIVE, None, 'no socket', files(), 'nvidia', None, check_runtime=False) == [
        'the CRI plugin does not answer: no socket']
