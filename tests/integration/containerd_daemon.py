# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run a real containerd in the background for tests, privately, and ask it what it loaded.

    with ContainerdDaemon('/usr/bin/containerd', '/tmp/gr-x/config.toml', '/tmp/gr-x') as d:
        assert ('io.containerd.grpc.v1', 'cri', 'ok') in d.plugins()
        assert d.cri_status()['default_runtime_name'] == 'nvidia'

The config under test is used as it is (no wrapper, no ``imports``: both change semantics).
Privacy comes from the command line and from namespaces, not from editing the config:

* ``--root``, ``--state`` and ``--address`` flags put the data, state and socket under
  ``workdir``; the flags win over ``root``/``state``/``grpc.address`` in the file (checked on
  1.6.20, 1.7.24 and 2.1.9).
* With ``isolate=True`` (default) the daemon runs in its own mount and network namespace
  (``unshare``): private tmpfs on ``/run/containerd`` (runc and shim state, which ignore
  ``--state``) and ``/run/nri`` (2.x serves NRI on ``/run/nri/nri.sock`` by default), and its own
  loopback, so configs that listen on TCP (AKS: ``metrics.address = "0.0.0.0:10257"``, k3s:
  ``stream_server_port = "10010"``) neither collide nor face the network. An existing
  ``/etc/cni/net.d`` gets an empty tmpfs too, so the host's CNI networks (podman installs one)
  never make the network condition ready. Use ``ctr()`` to run
  ctr inside those namespaces (ctr's stdio FIFOs live under ``/run/containerd/fifo``).
* Left alone because they come from the config and only create empty folders: the ``opt``
  plugin's path (``/opt/containerd``, Debian: ``/var/lib/containerd/opt``) and the CRI CNI
  ``conf_dir``. ``stop()`` removes such folders again when this daemon created them and they
  hold no files. The empty mount points ``/run/containerd`` and ``/run/nri`` stay.
* ``stop()`` kills and deletes every task (so shims remove their rootfs mounts), sends SIGTERM
  (SIGKILL after ``timeout``), SIGKILLs shims still serving this socket and their containers,
  and lazily unmounts anything left under workdir. With ``isolate=False`` it also runs
  ``runc delete --force`` for runc states pointing into workdir and removes the shim sockets
  in ``/run/containerd/s``; 2.x then leaves a stale ``/run/nri/nri.sock`` unless NRI is disabled.

Nothing here imports Ansible; the CRI client is the collection's own module_utils.
"""

from __future__ import absolute_import, division, print_function

import glob
import hashlib
import os
import re
import shutil
import signal
import stat
import subprocess
import time
import tomllib

from ansible_collections.gpuready.nvidia.plugins.module_utils import cri

try:
    import tomllib
except ImportError:  # pragma: no cover - Python < 3.11
    tomllib = None

SERIES = ('1.6', '1.7', '2')
# AF_UNIX sun_path is 108 bytes with the NUL; containerd also binds SOCKET + '.ttrpc'
_MAX_SOCKET = 107 - len('.ttrpc')
_ISOLATE_SCRIPT = r'''
set -e
mount --make-rprivate /
for d in /run/containerd /run/nri; do
    mkdir -p "$d"
    mount -t tmpfs -o mode=0711 gpuready-test "$d"
done
# The host's CNI networks (podman installs one) are not the config under test's.
if [ -d /etc/cni/net.d ]; then mount -t tmpfs -o mode=0755 gpuready-test /etc/cni/net.d; fi
if command -v ip >/dev/null 2>&1; then ip link set lo up; fi
exec "$@"
'''


class ContainerdError(RuntimeError):
    """The daemon did not start (or did not answer); the message ends with its log."""

    def __init__(self, message, log=''):
        super().__init__('%s\n--- containerd log (tail) ---\n%s' % (message, _tail(log)))
        self.log = log


def _tail(text, lines=40):
    return '\n'.join(text.splitlines()[-lines:])


def binary_version(binary):
    """``containerd --version`` → e.g. ``'1.6.20~ds1'`` or ``'2.1.9+unknown'``."""
    out = subprocess.run([binary, '--version'], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         universal_newlines=True, timeout=30, check=True).stdout
    match = re.search(r'\sv?(\d+\.\d+\.\d+\S*)', out)
    if not match:
        raise ContainerdError('cannot read the version of %s from %r' % (binary, out))
    return match.group(1)


def config_dump(binary, config_path):
    """``containerd --config FILE config dump`` → CompletedProcess (rc 0 does NOT mean CRI loads)."""
    return subprocess.run([binary, '--config', config_path, 'config', 'dump'], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=60, check=False)


# The plugin table that holds the loaded CRI runtime settings in each series' `config dump` (any config version).
CRI_RUNTIME_TABLE = {'1.6': 'io.containerd.grpc.v1.cri', '1.7': 'io.containerd.grpc.v1.cri',
                     '2': 'io.containerd.cri.v1.runtime'}


def loaded_cri_runtime(binary, config_path, series):
    """(the CRI runtime settings containerd of series loads from config_path, None), or (None, the last line
    containerd printed) when it refuses the file."""
    proc = config_dump(binary, config_path)
    if proc.returncode != 0:
        return None, (proc.stderr.strip().splitlines() or ['?'])[-1]
    return tomllib.loads(proc.stdout).get('plugins', {}).get(CRI_RUNTIME_TABLE[series], {}), None


def parse_plugins(text):
    """``ctr plugins ls`` → ``[(type, id, status)]``; columns: TYPE ID PLATFORMS STATUS."""
    plugins = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[0] != 'TYPE':
            plugins.append((fields[0], fields[1], fields[3]))
    return plugins


def _config_dirs(config_path):
    """Folders outside workdir that the daemon creates from this config (opt path, CNI conf dir)."""
    dirs = {'/opt/containerd', '/etc/cni/net.d'}
    try:
        with open(config_path, 'rb') as handle:
            data = tomllib.load(handle) if tomllib else {}
    except (OSError, ValueError):  # a broken config is a legitimate test input
        data = {}
    plugins = data.get('plugins') if isinstance(data.get('plugins'), dict) else {}
    for name, section in plugins.items():
        if not isinstance(section, dict):
            continue
        if name == 'io.containerd.internal.v1.opt' and isinstance(section.get('path'), str):
            dirs.add(section['path'])
        cni = section.get('cni')
        if name in ('io.containerd.grpc.v1.cri', 'io.containerd.cri.v1.runtime') and isinstance(cni, dict):
            if isinstance(cni.get('conf_dir'), str):
                dirs.add(cni['conf_dir'])
    return sorted(d for d in dirs if os.path.isabs(d))


def _first_missing(path):
    """The top-most ancestor of ``path`` that does not exist yet (None if ``path`` exists)."""
    missing = None
    while path not in ('/', '') and not os.path.lexists(path):
        missing = path
        path = os.path.dirname(path)
    return missing


def _only_empty_dirs(top):
    for dummy, dummy2, files in os.walk(top):
        if files:
            return False
    return True


def _proc_cmdline(pid):
    try:
        with open('/proc/%s/cmdline' % pid, 'rb') as handle:
            return handle.read().split(b'\0')
    except OSError:
        return []


def _pids():
    return [int(entry) for entry in os.listdir('/proc') if entry.isdigit()]


def _proc_stat(pid):
    """(state, ppid) from /proc/PID/stat, or None when the process is gone."""
    try:
        with open('/proc/%s/stat' % pid) as handle:
            fields = handle.read().rsplit(')', 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1])


def _alive(pid):
    info = _proc_stat(pid)
    return info is not None and info[0] not in ('Z', 'X')  # a zombie has exited


def _proc_children():
    """{ppid: [pid, ...]} for every live process now."""
    children = {}
    for pid in _pids():
        info = _proc_stat(pid)
        if info is not None:
            children.setdefault(info[1], []).append(pid)
    return children


class ContainerdDaemon:
    """One containerd process with its own root, state, socket (and namespaces) under workdir."""

    def __init__(self, binary, config_path, workdir, start_timeout=30.0, isolate=True, extra_args=None):
        self.binary = os.path.abspath(binary)
        self.bindir = os.path.dirname(self.binary)
        self.config_path = os.path.abspath(config_path)
        self.workdir = os.path.abspath(workdir)
        self.socket = os.path.join(self.workdir, 'containerd.sock')
        self.log_path = os.path.join(self.workdir, 'containerd.log')
        self.start_timeout = start_timeout
        self.isolate = isolate
        self.extra_args = list(extra_args or [])
        self.proc = None
        self.startup_seconds = None
        self._created = []
        self._log_offset = 0
        if len(self.socket.encode()) > _MAX_SOCKET:
            raise ValueError('socket path %s is longer than %d bytes (unix socket limit); use a short '
                             'workdir such as /tmp/gr-XXXX' % (self.socket, _MAX_SOCKET))
        ctr = os.path.join(self.bindir, 'ctr')
        self.ctr_binary = ctr if os.access(ctr, os.X_OK) else shutil.which('ctr')
        if not self.ctr_binary:
            raise ValueError('no ctr next to %s nor on PATH' % self.binary)
        # the binary's own folder first: 2.x must find its own containerd-shim-runc-v2, not 1.6's
        path = [self.bindir] + os.environ.get('PATH', '').split(os.pathsep)
        path += [d for d in ('/usr/local/sbin', '/usr/sbin', '/sbin') if d not in path]  # runc
        self.env = dict(os.environ, PATH=os.pathsep.join(p for p in path if p))

    # --- lifecycle --------------------------------------------------------------------------

    def start(self):
        """Start the daemon and wait until its socket answers ``ctr version``; returns self."""
        if self.proc is not None:
            raise RuntimeError('already started')
        os.makedirs(self.workdir, exist_ok=True)
        self._created = [d for d in (_first_missing(p) for p in _config_dirs(self.config_path)) if d]
        cmd = [self.binary, '--config', self.config_path, '--root', os.path.join(self.workdir, 'root'),
               '--state', os.path.join(self.workdir, 'state'), '--address', self.socket] + self.extra_args
        if self.isolate:
            cmd = ['unshare', '--mount', '--net', 'sh', '-c', _ISOLATE_SCRIPT, 'sh'] + cmd
        started = time.monotonic()
        # log() shows this start only; earlier starts in the same workdir stay in the file
        self._log_offset = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
        with open(self.log_path, 'ab') as log:
            # own session: a Ctrl-C in the test run must not reach containerd before stop() does
            self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=self.env, cwd=self.workdir,
                start_new_session=True)
        deadline = started + self.start_timeout
        while True:
            if self.proc.poll() is not None:
                raise ContainerdError('containerd (%s) exited with rc %s before answering on %s'
                                      % (self.binary, self.proc.returncode, self.socket), self.log())
            if os.path.exists(self.socket) and self._ctr_quiet('version'):
                break
            if time.monotonic() > deadline:
                log_text = self.log()
                self.stop()
                raise ContainerdError('containerd did not answer on %s within %ss' % (self.socket, self.start_timeout),
                                      log_text)
            time.sleep(0.05)
        self.startup_seconds = time.monotonic() - started
        return self

    def stop(self, timeout=10.0):
        """Stop containers (tasks), then the daemon (SIGTERM, then SIGKILL), then tidy up."""
        if self.proc is None:
            return
        was_running = self.proc.poll() is None
        if was_running:
            self._kill_tasks()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        # shims exit by themselves after their task is deleted; without a daemon nobody asks them
        self._kill_leftover_shims(grace=5.0 if was_running else 0.0)
        if not self.isolate:  # isolated runc state sits on a tmpfs that died with the namespace
            self._delete_runc_state()
        self._unmount_workdir()
        for path in self._created:
            if os.path.isdir(path) and _only_empty_dirs(path):
                shutil.rmtree(path, ignore_errors=True)
        self.proc = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.stop()

    @property
    def running(self):
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    # --- questions ----------------------------------------------------------------------------

    def log(self):
        """The daemon's output (stdout and stderr) since the last start()."""
        try:
            with open(self.log_path, 'rb') as handle:
                handle.seek(self._log_offset)
                return handle.read().decode('utf-8', 'replace')
        except OSError:
            return ''

    def ctr(self, *args, **kwargs):
        """Run ``ctr --address SOCK ARGS`` (inside the daemon's namespaces when isolated)."""
        cmd = [self.ctr_binary, '--address', self.socket] + list(args)
        if self.isolate and self.running:
            cmd = ['nsenter', '--target', str(self.proc.pid), '--mount', '--net'] + cmd
        check = kwargs.pop('check', True)
        kwargs.setdefault('timeout', 60)
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                              env=self.env, check=False, **kwargs)
        if check and proc.returncode != 0:
            raise ContainerdError('`%s` failed with rc %d: %s' % (' '.join(cmd), proc.returncode, proc.stderr.strip()),
                                  self.log())
        return proc

    def plugins(self):
        """``[(type, id, status)]`` from ``ctr plugins ls``; status is ok, error or skip."""
        return parse_plugins(self.ctr('plugins', 'ls').stdout)

    def plugin_status(self, plugin_type, plugin_id):
        """Status of one plugin, e.g. ``plugin_status('io.containerd.grpc.v1', 'cri')``; None if absent."""
        for ptype, pid, status in self.plugins():
            if (ptype, pid) == (plugin_type, plugin_id):
                return status
        return None

    def cri_status(self, timeout=cri.DEFAULT_TIMEOUT, transport='auto', settle=5.0):
        """The CRI client's answer for this daemon (see plugins/module_utils/cri.py).

        Asks again for up to ``settle`` seconds while CRI is still initialising (1.7/2.x can say
        'server is not initialized yet' right after the socket answers). Raises cri.CriError.
        """
        return cri.cri_status(self.socket, timeout=timeout, transport=transport, retry_for=settle)

    # --- cleanup helpers ----------------------------------------------------------------------

    def _ctr_quiet(self, *args):
        try:
            return self.ctr(*args, check=False, timeout=10).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def _kill_tasks(self):
        """Kill and delete every task, so the shims clean up runc state and rootfs mounts."""
        try:
            namespaces = self.ctr('namespaces', 'ls', '-q', check=False, timeout=10).stdout.split()
            for ns in namespaces:
                for task in self.ctr('-n', ns, 'tasks', 'ls', '-q', check=False, timeout=10).stdout.split():
                    self.ctr('-n', ns, 'tasks', 'kill', '-s', 'SIGKILL', task, check=False, timeout=10)
                    self.ctr('-n', ns, 'tasks', 'delete', '--force', task, check=False, timeout=20)
        except subprocess.TimeoutExpired:
            pass  # the shim sweep below still catches what is left

    def _shims(self):
        """Live shim processes started for this socket (found by their -address argument)."""
        address = self.socket.encode()
        return [pid for pid in _pids() if _alive(pid) and address in _proc_cmdline(pid)
                and os.path.basename(_proc_cmdline(pid)[0]).startswith(b'containerd-shim')]

    def _kill_leftover_shims(self, grace=5.0):
        """Give shims a moment to exit on their own (they do after task delete), then SIGKILL
        them and their children (the container inits, pid 1 of their pid namespaces)."""
        deadline = time.monotonic() + grace
        shims = self._shims()
        while shims and time.monotonic() < deadline:
            time.sleep(0.05)
            shims = self._shims()
        children = _proc_children()
        victims = [pid for shim in shims for pid in children.get(shim, []) + [shim]]
        for victim in victims:
            try:
                os.kill(victim, signal.SIGKILL)
            except OSError:
                pass
        deadline = time.monotonic() + 5.0  # SIGKILL is asynchronous: wait until they are gone
        while any(_alive(pid) for pid in victims) and time.monotonic() < deadline:
            time.sleep(0.02)

    def _delete_runc_state(self):
        """Remove what runc and killed shims leave in /run/containerd for our bundles (they use
        it whatever --state says): ``runc delete --force`` for runc states that point into
        workdir, and the shim sockets /run/containerd/s/sha256(ADDRESS/NS/ID)."""
        tasks = os.path.join(self.workdir, 'state', 'io.containerd.runtime.v2.task')
        for bundle in glob.glob(os.path.join(tasks, '*', '*')):
            namespace, task = bundle.split(os.sep)[-2:]
            shim_socket = os.path.join('/run/containerd/s', hashlib.sha256(
                ('%s/%s/%s' % (self.socket, namespace, task)).encode()).hexdigest())
            if os.path.exists(shim_socket) and stat.S_ISSOCK(os.lstat(shim_socket).st_mode):
                os.unlink(shim_socket)
            root = os.path.join('/run/containerd/runc', namespace)
            try:
                with open(os.path.join(root, task, 'state.json'), 'rb') as handle:
                    ours = (self.workdir + '/').encode() in handle.read()
            except OSError:
                continue
            if ours:
                subprocess.run(['runc', '--root', root, 'delete', '--force', task], env=self.env, check=False,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)

    def _unmount_workdir(self):
        """Lazily unmount anything still mounted under workdir (non-isolated daemons only)."""
        try:
            with open('/proc/self/mountinfo') as handle:
                points = [line.split()[4] for line in handle]
        except OSError:
            return
        prefix = self.workdir.rstrip('/') + '/'
        for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
            subprocess.run(['umount', '-l', point], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           check=False)
