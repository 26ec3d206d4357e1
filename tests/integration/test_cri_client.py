# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The CRI client and the daemon harness against real containerd 1.6, 1.7 and 2.x daemons."""

from __future__ import absolute_import, division, print_function

import hashlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import threading
import time

import pytest

import require
from ansible_collections.gpuready.nvidia.plugins.module_utils import cri
from ansible_collections.gpuready.nvidia.tests.integration.containerd_daemon import (
    SERIES, ContainerdDaemon, ContainerdError)

BINARY = '/usr/local/nvidia/toolkit/nvidia-container-runtime'

# version 2 (1.6, 1.7): the CRI plugin with its runtimes; root/state/address as on a real node,
# to prove the harness flags win over them
V2_NVIDIA_DEFAULT = '''version = 2
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "nvidia"

  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = true

  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
      BinaryName = "%s"
      SystemdCgroup = true
''' % BINARY

# version 3 (2.x): the runtime half of CRI is its own plugin; runc comes from the defaults
V3_NVIDIA_DEFAULT = '''version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = "nvidia"

  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]
      BinaryName = "%s"
      SystemdCgroup = true
''' % BINARY

# /etc/containerd/config.toml as shipped by Debian's containerd package (bookworm 1.6.20)
DEBIAN_MINIMAL = '''version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.internal.v1.opt"]
    path = "/var/lib/containerd/opt"
'''

NVIDIA_ONLY_TABLE = '''
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
    BinaryName = "%s"
''' % BINARY

RUNC_TABLE = '''
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
'''

CRI = ('io.containerd.grpc.v1', 'cri')


@pytest.mark.parametrize('series', SERIES)
def test_nvidia_as_default_runtime(containerd_daemon, series):
    daemon = containerd_daemon(series, config_text=V3_NVIDIA_DEFAULT if series == '2' else V2_NVIDIA_DEFAULT)
    assert daemon.plugin_status(*CRI) == 'ok'

    status = daemon.cri_status()

    assert status['transport'] == 'grpc'
    assert status['runtime_name'] == 'containerd'
    assert status['runtime_version'].startswith(series + '.')
    assert status['runtime_api_version'] == 'v1'
    assert status['runtime_ready'] is True
    assert status['conditions']['RuntimeReady']['status'] is True
    # no CNI config on a test machine: the network condition is real and false
    assert status['conditions']['NetworkReady'] == {
        'status': False, 'reason': 'NetworkPluginNotReady',
        'message': 'Network plugin returns error: cni plugin not initialized'}
    assert status['default_runtime_name'] == 'nvidia'
    assert set(status['runtimes']) == {'nvidia', 'runc'}
    nvidia = status['runtimes']['nvidia']
    assert nvidia['runtime_type'] == 'io.containerd.runc.v2'
    assert nvidia['options']['BinaryName'] == BINARY
    assert nvidia['options']['SystemdCgroup'] is True
    assert status['runtimes']['runc']['runtime_type'] == 'io.containerd.runc.v2'
    assert status['runtimes']['runc']['options'].get('BinaryName', '') == ''
    # --root wins over root = "/var/lib/containerd" in the file
    assert status['raw_config']['containerdRootDir'] == os.path.join(daemon.workdir, 'root')
    assert status['raw_config']['containerdEndpoint'] == daemon.socket
    if series == '1.6':
        assert status['enable_cdi'] is None  # 1.6 has no CDI setting
    else:
        assert status['enable_cdi'] is (series == '2')  # the default changed in 2.0
    # only 2.x (CRI API >= 1.30) lists its runtime handlers
    assert status['runtime_handlers'] == (['nvidia', 'runc'] if series == '2' else [])


@pytest.mark.parametrize('series,cri_loads', [('1.6', False), ('1.7', False), ('2', True)])
def test_d5_trap_nvidia_table_only(containerd_daemon, series, cri_loads):
    """Debian's minimal v2 config plus only a runtimes.nvidia table, default left as runc.

    1.6 and 1.7 replace the built-in runtimes map with the user's one, so "runc" is gone and the
    CRI plugin refuses to load; 2.x merges and keeps its default runc.
    """
    daemon = containerd_daemon(series, config_text=DEBIAN_MINIMAL + NVIDIA_ONLY_TABLE)

    if cri_loads:
        assert daemon.plugin_status(*CRI) == 'ok'
        status = daemon.cri_status()
        assert status['default_runtime_name'] == 'runc'
        assert set(status['runtimes']) == {'nvidia', 'runc'}
        return
    assert daemon.plugin_status(*CRI) == 'error'
    assert ('no corresponding runtime configured in `containerd.runtimes` for `containerd` '
            '`default_runtime_name = \\"runc\\"') in daemon.log()
    with pytest.raises(cri.CriError) as err:
        daemon.cri_status()
    assert err.value.kind == 'unimplemented'
    assert err.value.socket == daemon.socket
    assert daemon.socket in str(err.value)
    assert 'CRI plugin is not loaded' in str(err.value)


@pytest.mark.parametrize('series', ['1.6', '1.7'])
def test_d5_trap_avoided_by_declaring_runc(containerd_daemon, series):
    daemon = containerd_daemon(series, config_text=DEBIAN_MINIMAL + RUNC_TABLE + NVIDIA_ONLY_TABLE)

    assert daemon.plugin_status(*CRI) == 'ok'
    status = daemon.cri_status()
    assert status['runtime_ready'] is True
    assert status['default_runtime_name'] == 'runc'
    assert set(status['runtimes']) == {'nvidia', 'runc'}
    assert status['runtimes']['nvidia']['options'] == {'BinaryName': BINARY}


@pytest.mark.parametrize('series', SERIES)
def test_default_runtime_without_table(containerd_daemon, series):
    """default_runtime_name pointing at no runtime: `config dump` is happy, CRI is not."""
    config = V2_NVIDIA_DEFAULT.replace('default_runtime_name = "nvidia"', 'default_runtime_name = "missing"')
    daemon = containerd_daemon(series, config_text=config)

    assert daemon.plugin_status(*CRI) == 'error'
    with pytest.raises(cri.CriError) as err:
        daemon.cri_status()
    assert err.value.kind == 'unimplemented'


# --- error paths ------------------------------------------------------------------------------

def test_socket_that_does_not_exist(short_tmp):
    path = os.path.join(short_tmp, 'nothing-here.sock')
    with pytest.raises(cri.CriError) as err:
        cri.cri_status(path)
    assert err.value.kind == 'missing'
    assert err.value.socket == path
    assert path in str(err.value)


def test_unix_endpoint_form_is_accepted(short_tmp):
    path = os.path.join(short_tmp, 'nothing-here.sock')
    with pytest.raises(cri.CriError) as err:
        cri.cri_status('unix://' + path)
    assert err.value.socket == path


def test_path_that_is_not_a_socket(short_tmp):
    path = os.path.join(short_tmp, 'plain-file')
    with open(path, 'w') as handle:
        handle.write('x')
    with pytest.raises(cri.CriError, match='is not a unix socket') as err:
        cri.cri_status(path)
    assert err.value.socket == path


def test_connection_refused(short_tmp):
    path = os.path.join(short_tmp, 'stale.sock')
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(path)  # bound, never listening: what a crashed daemon leaves behind
    try:
        with pytest.raises(cri.CriError) as err:
            cri.cri_status(path, timeout=2)
    finally:
        sock.close()
    assert err.value.kind == 'unavailable'
    assert path in str(err.value)


def test_retry_for_gives_up(short_tmp):
    path = os.path.join(short_tmp, 'never.sock')
    started = time.monotonic()
    with pytest.raises(cri.CriError) as err:
        cri.cri_status(path, retry_for=0.6)
    assert err.value.kind == 'missing'
    assert 0.5 < time.monotonic() - started < 5


def test_silent_listener_times_out(short_tmp):
    path = os.path.join(short_tmp, 'silent.sock')
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(path)
    sock.listen(5)  # accepts, never speaks HTTP/2
    started = time.monotonic()
    try:
        with pytest.raises(cri.CriError) as err:
            cri.cri_status(path, timeout=1)
    finally:
        sock.close()
    assert err.value.kind == 'timeout'
    assert path in str(err.value)
    assert time.monotonic() - started < 5


def test_stopped_daemon_times_out(containerd_daemon):
    daemon = containerd_daemon('1.6', config_text=V2_NVIDIA_DEFAULT)
    os.kill(daemon.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(cri.CriError) as err:
            cri.cri_status(daemon.socket, timeout=1)
        assert time.monotonic() - started < 5
    finally:
        os.kill(daemon.pid, signal.SIGCONT)
    assert err.value.kind == 'timeout'
    assert daemon.socket in str(err.value)
    assert daemon.cri_status()['runtime_ready'] is True  # and it answers again


def test_socket_gone_after_stop(containerd_daemon):
    daemon = containerd_daemon('1.6', config_text=V2_NVIDIA_DEFAULT)
    assert daemon.cri_status()['runtime_ready']
    daemon.stop()
    with pytest.raises(cri.CriError) as err:
        cri.cri_status(daemon.socket)
    assert err.value.kind in ('missing', 'unavailable')
    assert daemon.socket in str(err.value)


def test_retry_for_waits_for_a_starting_daemon(containerd_daemon):
    """retry_for bridges the gap between `restart containerd` and a socket that answers."""
    daemon = containerd_daemon('1.6', config_text=V2_NVIDIA_DEFAULT)
    daemon.stop()
    assert not os.path.exists(daemon.socket)
    later = threading.Timer(0.5, daemon.start)
    later.start()
    try:
        assert cri.cri_status(daemon.socket, retry_for=15)['default_runtime_name'] == 'nvidia'
    finally:
        later.join()


def test_no_transport(monkeypatch, short_tmp):
    monkeypatch.setattr(cri, 'HAS_GRPC', False)
    monkeypatch.setattr(cri, 'GRPC_IMPORT_ERROR', ImportError("No module named 'grpc'"))
    monkeypatch.setenv('PATH', short_tmp)
    with pytest.raises(cri.CriError) as err:
        cri.cri_status(os.path.join(short_tmp, 'x.sock'))
    assert err.value.kind == 'no-transport'
    assert 'grpcio' in str(err.value) and 'crictl' in str(err.value)
    assert 'pip install grpcio' in str(err.value)


# --- the harness itself -----------------------------------------------------------------------

@pytest.mark.parametrize('series', SERIES)
def test_broken_toml_fails_start_with_log(containerd_daemon, series):
    with pytest.raises(ContainerdError) as err:
        containerd_daemon(series, config_text='version = 2\n[plugins."io.containerd.grpc.v1.cri"\n')
    assert 'exited with rc 1' in str(err.value)
    assert 'toml' in str(err.value).lower()  # the daemon's own message is in the error


@pytest.mark.parametrize('series', SERIES)
def test_plugins_and_timings(containerd_daemon, series):
    daemon = containerd_daemon(series, config_text=V3_NVIDIA_DEFAULT if series == '2' else V2_NVIDIA_DEFAULT)
    plugins = daemon.plugins()
    assert ('io.containerd.internal.v1', 'opt', 'ok') in plugins
    assert ('io.containerd.grpc.v1', 'cri', 'ok') in plugins
    if series == '2':
        assert ('io.containerd.cri.v1', 'runtime', 'ok') in plugins
    assert all(status in ('ok', 'error', 'skip') for dummy, dummy2, status in plugins)
    assert 0 < daemon.startup_seconds < 15
    started = time.monotonic()
    daemon.cri_status()
    assert time.monotonic() - started < 2


def test_socket_path_limit():
    with pytest.raises(ValueError, match='unix socket limit'):
        ContainerdDaemon('/usr/bin/containerd', '/dev/null', '/tmp/' + 'x' * 100)


def _oci_archive(path, binary, name):
    """A one-layer OCI image archive holding one static binary as /app (for `ctr images import`)."""
    def blob(tar, data, media_type):
        digest = 'sha256:' + hashlib.sha256(data).hexdigest()
        info = tarfile.TarInfo('blobs/sha256/' + digest[7:])
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        return {'mediaType': media_type, 'digest': digest, 'size': len(data)}

    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode='w') as ltar:
        ltar.add(binary, arcname='app')
    layer = layer.getvalue()
    config = json.dumps({
        'architecture': 'amd64', 'os': 'linux', 'config': {'Entrypoint': ['/app']},
        'rootfs': {'type': 'layers', 'diff_ids': ['sha256:' + hashlib.sha256(layer).hexdigest()]},
    }).encode()
    with tarfile.open(path, 'w') as tar:
        manifest = json.dumps({
            'schemaVersion': 2, 'mediaType': 'application/vnd.oci.image.manifest.v1+json',
            'config': blob(tar, config, 'application/vnd.oci.image.config.v1+json'),
            'layers': [blob(tar, layer, 'application/vnd.oci.image.layer.v1.tar')],
        }).encode()
        desc = blob(tar, manifest, 'application/vnd.oci.image.manifest.v1+json')
        desc['annotations'] = {'io.containerd.image.name': name, 'org.opencontainers.image.ref.name': 'latest'}
        for fname, data in (('oci-layout', b'{"imageLayoutVersion": "1.0.0"}'),
                            ('index.json', json.dumps({'schemaVersion': 2, 'manifests': [desc]}).encode())):
            info = tarfile.TarInfo(fname)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _alive(pid):
    try:
        with open('/proc/%d/stat' % pid) as handle:
            return handle.read().rsplit(')', 1)[1].split()[0] not in ('Z', 'X')
    except OSError:
        return False


def _shims_for(daemon):
    found = []
    for entry in os.listdir('/proc'):
        try:
            with open('/proc/%s/cmdline' % entry, 'rb') as handle:
                argv = handle.read().split(b'\0')
        except (OSError, ValueError):
            continue
        if argv and b'containerd-shim' in argv[0] and daemon.socket.encode() in argv and _alive(int(entry)):
            found.append(int(entry))
    return found


@pytest.fixture(scope='module')
def app_image():
    """An OCI archive of a static binary that pauses forever (built with gcc, no registry)."""
    if not shutil.which('gcc'):
        require.missing('gcc is needed to build the static test binary')
    tmp = tempfile.mkdtemp(prefix='gr-img-')
    src = os.path.join(tmp, 'app.c')
    with open(src, 'w') as handle:
        handle.write('#include <unistd.h>\nint main(void) { for (;;) pause(); }\n')
    binary = os.path.join(tmp, 'app')
    if subprocess.run(['gcc', '-static', '-o', binary, src], check=False).returncode != 0:
        require.missing('cannot link statically (libc6-dev missing?)')
    archive = os.path.join(tmp, 'app.tar')
    _oci_archive(archive, binary, 'localhost/gr-app:latest')
    yield archive
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.parametrize('isolate', [True, False], ids=['isolated', 'shared-ns'])
@pytest.mark.parametrize('daemon_killed', [False, True], ids=['graceful', 'daemon-killed'])
@pytest.mark.parametrize('series', SERIES)
def test_stop_reaps_a_running_container(containerd_daemon, app_image, series, daemon_killed, isolate):
    """stop() leaves no shim, no container process, no runc state and no mount behind, also
    when the daemon died first (then only the shim sweep and runc state cleanup can help)."""
    config = V3_NVIDIA_DEFAULT if series == '2' else V2_NVIDIA_DEFAULT
    if series == '2' and not isolate:  # else 2.x leaves a stale /run/nri/nri.sock on the host
        config += "\n[plugins.'io.containerd.nri.v1.nri']\n  disable = true\n"
    daemon = containerd_daemon(series, config_text=config, isolate=isolate)
    daemon.ctr('images', 'import', app_image)
    daemon.ctr('run', '-d', '--null-io', 'localhost/gr-app:latest', 'sleeper')
    task = daemon.ctr('tasks', 'ls').stdout.splitlines()[1].split()
    assert task[0] == 'sleeper' and task[2] == 'RUNNING'
    app_pid = int(task[1])
    shims = _shims_for(daemon)
    assert shims, 'no shim found for %s' % daemon.socket
    if daemon_killed:
        os.kill(daemon.pid, signal.SIGKILL)
        daemon.proc.wait()

    daemon.stop()

    assert not daemon.running
    assert not _alive(app_pid)
    assert [pid for pid in shims if _alive(pid)] == []
    assert _shims_for(daemon) == []
    with open('/proc/self/mountinfo') as handle:
        assert [line for line in handle if daemon.workdir + '/' in line] == []
    assert not os.path.exists('/run/containerd/runc/default/sleeper')
    shim_socket = hashlib.sha256(('%s/default/sleeper' % daemon.socket).encode()).hexdigest()
    assert not os.path.exists(os.path.join('/run/containerd/s', shim_socket))
