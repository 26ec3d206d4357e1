# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Is the running containerd the one its config files describe?

A config written but never loaded is the seed problem again. This answers from running state,
not from what a play remembers: the CRI plugin's view (module_utils/cri.py), the service's start
time, and the config files' modification times. Plain Python, no Ansible.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import subprocess
import time
from urllib.error import HTTPError, URLError

from ansible.module_utils.urls import ConnectionError as UrlsConnectionError, open_url

from ansible_collections.gpuready.nvidia.plugins.module_utils import cri

# The options of the modules that read the running containerd (doc fragment containerd_state).
STATE_ARGS = dict(
    service=dict(type='str', default='containerd'),
    socket=dict(type='str', default='/run/containerd/containerd.sock'),
    config_paths=dict(type='list', elements='path', default=['/etc/containerd/config.toml']),
    runtime_name=dict(type='str', default='nvidia'),
    set_as_default=dict(type='bool'),
    check_runtime=dict(type='bool', default=True),
    timeout=dict(type='float', default=5.0),
    transport=dict(type='str', choices=['auto', 'grpc', 'crictl'], default='auto'),
)


def _clock_ticks():
    return os.sysconf(os.sysconf_names['SC_CLK_TCK'])


def process_start_time(pid, proc='/proc'):
    """Epoch seconds at which process ``pid`` started (from /proc, so it survives a lost play).

    /proc gives clock ticks after boot; converted with the boot-time clock read now rather than
    /proc/stat's btime, a whole second that the kernel re-derives and that moves by a second or two."""
    with open(os.path.join(proc, str(pid), 'stat')) as handle:
        fields = handle.read().rsplit(')', 1)[1].split()
    ticks = int(fields[19])  # field 22 of stat(5): starttime, in clock ticks after boot
    return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / float(_clock_ticks()))


def service_state(unit, run=subprocess.run):
    """{name, active_state, main_pid, started_at} of a systemd unit (started_at None when not running)."""
    # plain Python (no AnsibleModule here), as cri.py's crictl call
    proc = run(['systemctl', 'show', '--property=ActiveState,MainPID', unit],  # pylint: disable=ansible-bad-function
               stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, check=False)
    props = dict(line.split('=', 1) for line in proc.stdout.splitlines() if '=' in line)
    pid = int(props.get('MainPID') or 0)
    started = None
    if pid:
        try:
            started = process_start_time(pid)
        except (OSError, ValueError, IndexError):
            started = None
    return {'name': unit, 'active_state': props.get('ActiveState', 'unknown'), 'main_pid': pid,
            'started_at': started}


def config_files(paths):
    """[{path, exists, mtime}] for the config files containerd reads."""
    out = []
    for path in paths:
        try:
            out.append({'path': path, 'exists': True, 'mtime': os.stat(path).st_mtime})
        except OSError:
            out.append({'path': path, 'exists': False, 'mtime': None})
    return out


def restart_reasons(service, status, status_error, files, runtime_name, set_as_default, check_runtime=True):
    """Why containerd must restart to run what its files say; [] when it already does.

    ``status`` is cri.cri_status()'s dict or None (then ``status_error`` says why). ``set_as_default``
    None means the default runtime is not checked; ``check_runtime`` False checks neither the runtime nor
    the default (after the change was undone, the files say what the runtimes were before)."""
    reasons = []
    if service['active_state'] != 'active':
        reasons.append('%s is %s' % (service['name'], service['active_state']))
        return reasons
    started = service['started_at']
    for entry in files:
        if entry['exists'] and started is not None and entry['mtime'] > started:
            reasons.append('%s changed after %s started' % (entry['path'], service['name']))
    if status is None:
        reasons.append('the CRI plugin does not answer: %s' % status_error)
        return reasons
    if not check_runtime:
        return reasons
    if runtime_name not in status['runtimes']:
        reasons.append('the running CRI plugin has no runtime %r (it has: %s)'
                       % (runtime_name, ', '.join(sorted(status['runtimes'])) or 'none'))
    default = status['default_runtime_name'] or 'runc'
    if set_as_default is True and default != runtime_name:
        reasons.append('the running CRI plugin\'s default runtime is %r, not %r' % (default, runtime_name))
    if set_as_default is False and default == runtime_name:
        reasons.append('the running CRI plugin still has %r as its default runtime' % runtime_name)
    return reasons


def gather(unit, socket, paths, runtime_name, set_as_default, timeout=cri.DEFAULT_TIMEOUT, wait=0.0,
           transport='auto', check_runtime=True):
    """Everything the role and the doctor need to decide on, and to verify, a restart."""
    service = service_state(unit)
    status, status_error = None, None
    if service['active_state'] == 'active':
        try:
            status = cri.cri_status(socket, timeout=timeout, transport=transport, retry_for=wait)
        except cri.CriError as exc:
            status_error = str(exc)
    else:
        status_error = '%s is %s' % (unit, service['active_state'])
    files = config_files(paths)
    reasons = restart_reasons(service, status, status_error, files, runtime_name, set_as_default, check_runtime)
    if status is not None:
        status = dict(status)
        status.pop('raw_config', None)
    return {'service': service, 'cri': status, 'cri_error': status_error, 'config_files': files,
            'restart_needed': bool(reasons), 'restart_reasons': reasons,
            'healthy': status is not None and status['runtime_ready'] and not reasons}


def restart_service(unit, run=subprocess.run):
    """systemctl restart; None, or why it failed."""
    proc = run(['systemctl', 'restart', unit],  # pylint: disable=ansible-bad-function
               stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, check=False)
    if proc.returncode == 0:
        return None
    return proc.stderr.strip() or 'systemctl restart %s exited with %d' % (unit, proc.returncode)


def api_ready(url, wait, ca_file=None, cert_file=None, key_file=None, interval=1.0,
              clock=time.monotonic, sleep=time.sleep):
    """Ask the API server's /readyz until it answers 200 or ``wait`` seconds pass: (ready, last error)."""
    deadline = clock() + wait
    while True:
        try:
            open_url(url.rstrip('/') + '/readyz', ca_path=ca_file, client_cert=cert_file, client_key=key_file,
                     timeout=5, use_proxy=False, use_netrc=False).close()
            return True, None
        except HTTPError as exc:
            error = '%s/readyz answered %d %s' % (url.rstrip('/'), exc.code, exc.reason)
        except (URLError, UrlsConnectionError, OSError) as exc:
            error = '%s/readyz: %s' % (url.rstrip('/'), getattr(exc, 'reason', exc))
        if clock() >= deadline:
            return False, error
        sleep(interval)


def restart(unit, socket, paths, runtime_name, set_as_default, wait, api=None, api_wait=300.0,
            timeout=cri.DEFAULT_TIMEOUT, transport='auto', check_runtime=True, run=subprocess.run):
    """Restart the unit and wait until CRI answers (``wait`` seconds); then gather() again.

    ``api`` (api_ready()'s url and TLS files) marks a node that serves the Kubernetes API (a k3s or RKE2
    server): it is restarted only while the API is ready, and only reported done once the API is ready
    again, so that restarting the servers one after another never takes the control plane down."""
    result = {'restarted': False, 'restart_error': None, 'restarted_at': time.time(), 'api_ready': None,
              'api_error': None}
    if api:
        ready, error = api_ready(wait=0, **api)
        if not ready:
            result.update(gather(unit, socket, paths, runtime_name, set_as_default, timeout=timeout,
                                 transport=transport, check_runtime=check_runtime),
                          api_ready=False, api_error=error,
                          restart_error='not restarting %s while the Kubernetes API is not ready (%s)' % (unit, error))
            result['finished_at'] = time.time()
            return result
    result['restart_error'] = restart_service(unit, run=run)
    result['restarted'] = result['restart_error'] is None
    result.update(gather(unit, socket, paths, runtime_name, set_as_default,
                         timeout=timeout, wait=wait if result['restarted'] else 0, transport=transport,
                         check_runtime=check_runtime))
    if api and result['restarted'] and result['healthy']:
        result['api_ready'], result['api_error'] = api_ready(wait=api_wait, **api)
    result['finished_at'] = time.time()
    return result
