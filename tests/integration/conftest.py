# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fixtures for tests against real containerd daemons (1.6, 1.7, 2.x). No Ansible imports.

``make test`` exports the binaries as GPUREADY_CONTAINERD_1_6, GPUREADY_CONTAINERD_1_7 and
GPUREADY_CONTAINERD_2. Missing one skips the test, or fails it when GPUREADY_REQUIRE_REAL=1
(CI must not go green by skipping). For a hand run, 1.6 falls back to a containerd 1.6 on PATH.

    def test_x(containerd_daemon):
        d = containerd_daemon('2', config_text='version = 3\\n...')
        assert d.cri_status()['runtime_ready']
"""

from __future__ import absolute_import, division, print_function

import os
import shutil
import subprocess
import tempfile

import pytest

import lab_scripts
import require
from ansible_collections.gpuready.nvidia.tests.integration.containerd_daemon import (
    SERIES, ContainerdDaemon, binary_version)

ENV_VARS = {'1.6': 'GPUREADY_CONTAINERD_1_6', '1.7': 'GPUREADY_CONTAINERD_1_7', '2': 'GPUREADY_CONTAINERD_2'}


def _find_binary(series):
    """(path, None) or (None, why not)."""
    env = ENV_VARS[series]
    path = os.environ.get(env)
    if path:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path, None
        return None, '%s=%s is not an executable file' % (env, path)
    system = shutil.which('containerd')
    if series == '1.6' and system and binary_version(system).startswith('1.6.'):
        return system, None
    return None, '%s is not set (run through `make test`, or export it)' % env


def _missing(why):
    require.missing('real containerd: %s' % why)


def _check_root():
    if os.geteuid() != 0:
        _missing('containerd daemons need root')


@pytest.fixture(scope='session')
def containerd_binaries():
    """{"1.6": path, "1.7": path, "2": path}; skips (or fails) unless all three are there."""
    found = {}
    for series in SERIES:
        path, why = _find_binary(series)
        if not path:
            _missing('containerd %s: %s' % (series, why))
        found[series] = path
    return found


@pytest.fixture(scope='session')
def containerd_binary():
    """``containerd_binary(series)`` → path; skips (or fails) only when that series is missing."""
    def get(series):
        path, why = _find_binary(series)
        if not path:
            _missing('containerd %s: %s' % (series, why))
        return path
    return get


@pytest.fixture
def short_tmp():
    """A short folder (/tmp/gr-XXXXXX): unix socket paths must stay under 108 bytes."""
    path = tempfile.mkdtemp(prefix='gr-', dir='/tmp')
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def containerd_daemon(request, containerd_binary, short_tmp):  # pylint: disable=redefined-outer-name
    """Factory: ``containerd_daemon(series, config_text=None, config_path=None, **kwargs)``.

    Writes ``config_text`` to ``<workdir>/config.toml`` (or uses ``config_path`` as is), starts
    the daemon in ``<short_tmp>/dN`` and returns the started ContainerdDaemon (kwargs go to it,
    e.g. ``isolate=False``). Every daemon is stopped after the test; a failed test gets the tail
    of each daemon's log in its report.
    """
    _check_root()
    daemons = []

    def start(series, config_text=None, config_path=None, **kwargs):
        if (config_text is None) == (config_path is None):
            raise ValueError('give exactly one of config_text and config_path')
        workdir = os.path.join(short_tmp, 'd%d' % len(daemons))
        os.makedirs(workdir)
        if config_text is not None:
            config_path = os.path.join(workdir, 'config.toml')
            with open(config_path, 'w') as handle:
                handle.write(config_text)
        daemon = ContainerdDaemon(containerd_binary(series), config_path, workdir, **kwargs)
        daemons.append(daemon)
        return daemon.start()

    request.node.gpuready_daemons = daemons  # read by pytest_runtest_makereport below
    yield start
    for daemon in daemons:
        daemon.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # pylint: disable=unused-argument
    """Attach the tail of each daemon's log to a failed test's report."""
    outcome = yield
    report = outcome.get_result()
    if report.when == 'call' and report.failed:
        for daemon in getattr(item, 'gpuready_daemons', []):
            report.sections.append(('containerd log %s' % daemon.workdir, daemon.log()[-20000:]))


def _lab_unavailable():
    """Why the lab cannot run on this machine, or None."""
    if os.geteuid() != 0:
        return 'the lab needs root'
    for tool in ('podman', 'debootstrap', 'gcc'):
        if not shutil.which(tool):
            return 'the lab needs %s (make bootstrap installs it)' % tool
    return None


@pytest.fixture(scope='session')
def lab_module():
    """lab/lab.py as a module; skips (or fails with GPUREADY_REQUIRE_REAL=1) without root and podman."""
    why = _lab_unavailable()
    if why:
        _missing(why)
    return lab_scripts.script('lab/lab.py', 'gpuready_lab')


LAB_FIXTURES = ('lab', 'lab_v3')


def pytest_collection_modifyitems(items):
    """Tests that use the session lab or the containerd 2.x lab run after all others, so that their nodes and
    control planes (memory, and CPU while they settle) are held only at the end of the run. Stable, so files
    keep their order within each group."""
    items.sort(key=lambda item: any(name in LAB_FIXTURES for name in getattr(item, 'fixturenames', ())))


def _molecule_items(session):
    return [item for item in getattr(session, 'items', []) if item.path.name == 'test_molecule.py']


def pytest_collection_finish(session):
    """The Molecule scenarios (test_molecule.py) start before the first test and run beside the others:
    they have lab nodes and control planes of their own, and mostly wait."""
    items = _molecule_items(session)
    if items and _lab_unavailable() is None:
        items[0].module.start_scenarios(session.config, lab_scripts.script('lab/lab.py', 'gpuready_lab'), items)


def pytest_sessionfinish(session):
    items = _molecule_items(session)
    if items:
        items[0].module.cancel_scenarios(session.config)


def _real_components(lab_module):
    """Fails clearly (or skips by hand) when make go-build has not built the real components."""
    try:
        for program in lab_module.control_plane.PROCESSES + ('kubelet', 'kube-proxy', 'kubectl'):
            lab_module.control_plane.binary(program)
    except lab_module.control_plane.ControlPlaneError as err:
        require.missing(str(err))


@pytest.fixture(scope='session')
def lab(lab_module, tmp_path_factory):  # pylint: disable=redefined-outer-name
    """One lab per pytest run (lab/lab.py, nodes gpu-p4 and gpu-h100) on the real control plane, each node
    with the real kubelet. Yields the Lab; ``lab.state`` is what ``up`` returned."""
    _real_components(lab_module)
    # GPUREADY_LAB_PREFIX lets two pytest runs on one machine keep their labs apart (own containers, run dir).
    prefix = os.environ.get('GPUREADY_LAB_PREFIX')
    instance = lab_module.Lab(**({'prefix': prefix, 'run_dir': str(tmp_path_factory.mktemp('lab-run'))} if prefix else {}))
    try:
        instance.state = instance.up()
        yield instance
    finally:
        problems = instance.down()
        if problems:
            raise AssertionError('lab down left: %s' % '; '.join(problems))


@pytest.fixture(scope='session')
def lab_api(lab):  # pylint: disable=redefined-outer-name
    """The session lab's kube-apiserver as its admin (tests/cluster_api.py)."""
    from cluster_api import ClusterApi
    return ClusterApi(lab.control_plane, lab.state['kubeconfig'])


def _running_control_plane(run_dir, apiserver_args=(), controller_manager_args=()):
    """Yields lab/control_plane.py's control plane, up in run_dir, and stops it afterwards."""
    module = lab_scripts.script('lab/control_plane.py', 'gpuready_control_plane')
    try:
        for program in module.PROCESSES:
            module.binary(program)
    except module.ControlPlaneError as err:
        require.missing(str(err))
    plane = module.ControlPlane(run_dir, apiserver_args=apiserver_args, controller_manager_args=controller_manager_args)
    try:
        yield plane.up()
    finally:
        left = plane.down()
        if left:
            raise AssertionError('control plane down left: %s' % ', '.join(left))


@pytest.fixture(scope='session')
def control_plane(tmp_path_factory):
    """The lab's real control plane (lab/control_plane.py: etcd, kube-apiserver, controller-manager,
    scheduler from lab/go), one per pytest run, in a run dir of its own."""
    yield from _running_control_plane(str(tmp_path_factory.mktemp('control-plane')))


@pytest.fixture(scope='session')
def k8s_api(tmp_path_factory):
    """The modules' tests' API server: a real control plane of its own, whose controllers leave Nodes alone
    (node IPAM and node lifecycle would write the Nodes a test made between its client's GET and PATCH),
    behind the fault-injecting proxy (tests/cluster_api.py ApiWithFaults). Tests use names of their own."""
    from cluster_api import ApiWithFaults
    for plane in _running_control_plane(str(tmp_path_factory.mktemp('api-plane')), controller_manager_args=[
            '--controllers=*,bootstrapsigner,tokencleaner,-node-ipam-controller,-node-lifecycle-controller']):
        api = ApiWithFaults(plane, plane.kubeconfig_path('admin'), str(tmp_path_factory.mktemp('k8s-api')))
        try:
            yield api
        finally:
            api.stop()


@pytest.fixture
def uncached_control_plane(tmp_path):
    """A control plane of its own whose kube-apiserver has no watch cache: it asks etcd for every watch,
    as it does with a cache once the requested revision has left the cache's window (minutes on a busy
    cluster); that is what makes a compaction answer 410 in a test's time."""
    yield from _running_control_plane(str(tmp_path / 'uncached'), apiserver_args=['--watch-cache=false'])


@pytest.fixture(scope='session')
def real_lab(lab_module, tmp_path_factory):
    """A lab of gpu-p4 alone, in the seed's state, for test_real_cluster.py (the session ``lab`` is fixed by
    site.yml): own prefix, run dir, control plane and network namespaces."""
    _real_components(lab_module)
    instance = lab_module.Lab(nodes=['gpu-p4'], prefix='gpuready-real-', run_dir=str(tmp_path_factory.mktemp('real-lab')))
    try:
        instance.state = instance.up()
        yield instance
    finally:
        problems = instance.down()
        if problems:
            raise AssertionError('real lab down left: %s' % '; '.join(problems))


@pytest.fixture(scope='module')
def node_files(containerd_binaries):
    """Files the real configs reference and their nodes have (base runtime specs, Talos' imported
    part); made for the test when missing and removed afterwards."""
    ctr = os.path.join(os.path.dirname(containerd_binaries['1.6']), 'ctr')
    spec = subprocess.run([ctr, 'oci', 'spec'], stdout=subprocess.PIPE, check=True,
                          universal_newlines=True).stdout
    wanted = {'/etc/containerd/cri-base.json': spec, '/etc/containerd/base-runtime-spec.json': spec,
              '/etc/cri/conf.d/cri.toml': 'version = 3\n'}
    created_files, created_dirs = [], []
    for path, content in wanted.items():
        if os.path.exists(path):
            continue
        missing = os.path.dirname(path)
        while not os.path.exists(missing):
            created_dirs.insert(0, missing)
            missing = os.path.dirname(missing)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, 'w') as handle:
            handle.write(content)
        created_files.append(path)
    yield
    for path in created_files:
        os.unlink(path)
    for folder in reversed(created_dirs):
        os.rmdir(folder)
