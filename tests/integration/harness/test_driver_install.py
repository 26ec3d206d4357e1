# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fake driver is a driver install as the NVIDIA Container Toolkit sees one: for each GFD case's node
without MIG enabled, the real `nvidia-ctk cdi generate` (lab/go, at the lab's pin) reads the fake NVML and
the files `harness.driver_install` writes, and its CDI spec names every GPU by index and UUID, with that GPU's
device node, and mounts the versioned NVML library; and the real nvidia-container-runtime, in its default
mode, gives a container the GPUs its NVIDIA_VISIBLE_DEVICES names from the same files, and with the real runc
a process in that container finds through NVML exactly those GPUs (and MIG devices). This is how the lab's
nodes run the real runtime; the expected values are the case's own."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import select
import shutil
import subprocess
import sys
import uuid

import pytest
import yaml

import gfd_cases as cases
import lab_scripts
from fake_nvml import harness

gobuild = lab_scripts.script('lab/go/gobuild.py', 'gpuready_gobuild')
# MIG-enabled GPUs need the driver's nvidia-caps devices and /proc/driver/nvidia-caps, not installed here.
CASES = [(source, case) for source, case in cases.all_cases()
         if case['devices'] and not any(d['mig_enabled'] for d in case['devices'])]
# go-nvlib, which the toolkit enumerates GPUs with, leaves out DGX Station display boards (the cases say so)
DISPLAY_BOARDS = ('DGX Display', 'NVIDIA DGX Display')


@pytest.fixture(scope='module')
def library(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.fail('the device nodes of a driver install need root (mknod)')
    folder = str(tmp_path_factory.mktemp('fake-nvml'))
    return harness.build(folder)


def _installed_node(case, library, tmp_path):
    """The case's fake node and a driver install for its GPUs: (node, its NVML config, root, library folder)."""
    node = harness.node_from_case(case, str(tmp_path / 'node'))
    with open(node['config']) as handle:
        config = json.load(handle)
    root = str(tmp_path / 'root')
    return node, config, root, harness.driver_install(root, library, config)


@pytest.mark.parametrize('index', range(len(CASES)), ids=[cases.case_id(c) for c in CASES])
def test_nvidia_ctk_cdi_generate_names_every_gpu_of_the_node(library, tmp_path, index):
    case = CASES[index][1]
    node, config, root, library_dir = _installed_node(case, library, tmp_path)
    spec_path = str(tmp_path / 'nvidia.yaml')
    proc = subprocess.run(
        [str(gobuild.find_binary('nvidia-ctk')), 'cdi', 'generate', '--driver-root=' + root, '--dev-root=' + root,
         '--nvidia-cdi-hook-path=/usr/bin/nvidia-cdi-hook', '--output=' + spec_path],
        env=dict(os.environ, LD_LIBRARY_PATH=library_dir, FAKE_NVML_CONFIG=node['config']),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:]
    with open(spec_path) as handle:
        spec = yaml.safe_load(handle)

    assert spec['kind'] == 'nvidia.com/gpu'
    devices = dict((d['name'], d['containerEdits']) for d in spec['devices'])
    gpus = [gpu for gpu in config['devices'] if gpu['name'] not in DISPLAY_BOARDS]
    assert case['expected_labels'].get('nvidia.com/gpu.count', str(len(gpus))) == str(len(gpus))
    assert sorted(devices) == sorted([str(i) for i in range(len(gpus))] + [g['uuid'] for g in gpus] + ['all'])
    for position, gpu in enumerate(gpus):
        node_path = '/dev/nvidia%d' % gpu['minor_number']
        for name in (str(position), gpu['uuid']):
            assert [(n['path'], n['hostPath']) for n in devices[name]['deviceNodes']] == [
                (node_path, root + node_path)], name
    assert sorted(n['path'] for n in devices['all']['deviceNodes']) == sorted(
        '/dev/nvidia%d' % g['minor_number'] for g in gpus)
    common = spec['containerEdits']
    assert {'/dev/nvidiactl', '/dev/nvidia-uvm', '/dev/nvidia-uvm-tools'} <= set(
        n['path'] for n in common['deviceNodes'])
    versioned = '/%s/libnvidia-ml.so.%s' % (harness.LIBRARY_DIR, case['driver_version'])
    assert (versioned, root + versioned) in [(m['containerPath'], m['hostPath']) for m in common['mounts']]


# containerd's part: the OCI spec of a container to create, with the image's environment
SPEC = {'ociVersion': '1.0.2', 'root': {'path': 'rootfs'}, 'mounts': [],
        'process': {'args': ['sh'], 'cwd': '/', 'env': ['PATH=/usr/bin']}, 'linux': {'namespaces': [{'type': 'mount'}]}}
# Stands for runc, the low-level runtime the real runtime hands the edited bundle to: it records its arguments.
LOW_LEVEL = '#!/bin/sh\necho "$@" >> "$(dirname "$0")/low-level.log"\n'


@pytest.mark.parametrize('visible, gpus', [('1', [1]), ('all', [0, 1, 2, 3]), ('GPU-UUID-OF-3', [3]), (None, [])])
def test_real_runtime_gives_a_container_the_gpus_it_names(library, tmp_path, visible, gpus):
    """The real nvidia-container-runtime in its default mode (v1.20: `auto`, which is just-in-time CDI on a
    machine with NVML) edits a container's OCI spec from the fake driver: the device node of each GPU that
    NVIDIA_VISIBLE_DEVICES names and the control devices, the versioned NVML library; nothing without it."""
    case = next(c for _s, c in cases.all_cases() if c['name'] == 'seed-4x-tesla-p4-driver-535')
    node, config, root, library_dir = _installed_node(case, library, tmp_path)
    low_level = tmp_path / 'runc'
    low_level.write_text(LOW_LEVEL)
    low_level.chmod(0o755)
    (tmp_path / 'xdg' / 'nvidia-container-runtime').mkdir(parents=True)
    (tmp_path / 'xdg' / 'nvidia-container-runtime' / 'config.toml').write_text(
        '[nvidia-container-cli]\nroot = "%s"\n\n[nvidia-container-runtime]\nruntimes = ["%s"]\n' % (root, low_level))
    bundle = tmp_path / 'bundle'
    (bundle / 'rootfs').mkdir(parents=True)
    spec = json.loads(json.dumps(SPEC))
    if visible:
        uuid = config['devices'][3]['uuid']
        spec['process']['env'].append('NVIDIA_VISIBLE_DEVICES=' + visible.replace('GPU-UUID-OF-3', uuid))
    (bundle / 'config.json').write_text(json.dumps(spec))

    proc = subprocess.run(
        [str(gobuild.find_binary('nvidia-container-runtime')), 'create', '--bundle', str(bundle), 'ctr-1'],
        env=dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / 'xdg'), LD_LIBRARY_PATH=library_dir,
                 FAKE_NVML_CONFIG=node['config']),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert (tmp_path / 'low-level.log').read_text() == 'create --bundle %s ctr-1\n' % bundle
    edited = json.loads((bundle / 'config.json').read_text())
    devices = sorted(d['path'] for d in edited['linux'].get('devices') or [])
    mounts = [m['destination'] for m in edited.get('mounts') or []]
    if not gpus:
        assert (devices, mounts) == ([], [])
        return
    minors = [config['devices'][i]['minor_number'] for i in gpus]
    assert devices == sorted(['/dev/nvidia%d' % m for m in minors] + ['/dev/nvidiactl', '/dev/nvidia-uvm',
                                                                      '/dev/nvidia-uvm-tools'])
    assert '/%s/libnvidia-ml.so.%s' % (harness.LIBRARY_DIR, case['driver_version']) in mounts


TOOLKIT = ('nvidia-container-runtime', 'nvidia-ctk', 'nvidia-cdi-hook')
RUNC = '/usr/sbin/runc'
PROCFS_RUNC = os.path.join(lab_scripts.ROOT, 'lab', 'node', 'driver_procfs_runc.py')


@pytest.fixture(scope='module')
def toolkit(tmp_path_factory):
    """The toolkit's binaries under the names they are installed with (the runtime tells the nvidia-ctk of
    its hooks from nvidia-cdi-hook by the file's name), and the lab's driver-procfs-runc with this test's paths
    for the node's /proc/driver entries and for itself."""
    folder = tmp_path_factory.mktemp('toolkit')
    for program in TOOLKIT:
        os.symlink(str(gobuild.find_binary(program)), str(folder / program))
    with open(PROCFS_RUNC) as handle:
        source = handle.read()
    for constant, value in (('PROC_DRIVER', str(folder / 'proc-driver')), ('SELF', str(folder / 'procfs-runc'))):
        line = next(line for line in source.splitlines() if line.startswith(constant + ' = '))
        source = source.replace(line, '%s = %r' % (constant, value))
    (folder / 'procfs-runc').write_text('#!%s\n%s' % (sys.executable, source))
    (folder / 'procfs-runc').chmod(0o755)
    harness.write_mig_minors(str(folder / 'proc-driver'))
    return folder


@pytest.fixture(scope='module')
def probe(tmp_path_factory):
    """The lab workload image's NVML probe (lab/src/nvml-probe.c), built here."""
    source = os.path.join(lab_scripts.ROOT, 'lab', 'src')
    target = str(tmp_path_factory.mktemp('probe') / 'nvml-probe')
    subprocess.run(['gcc', '-O2', '-I', source, '-o', target, os.path.join(source, 'nvml-probe.c')], check=True)
    return target


def _bundle(path, probe, visible):
    """A bundle as containerd hands one to the runtime: the probe and the glibc it links in the root file
    system, and `runc spec`'s configuration running it, with the image's NVIDIA_VISIBLE_DEVICES (or none)."""
    rootfs = path / 'rootfs'
    for folder in ('usr/local/bin', 'lib/x86_64-linux-gnu', 'lib64', harness.LIBRARY_DIR, 'etc'):
        (rootfs / folder).mkdir(parents=True, exist_ok=True)
    shutil.copy(probe, str(rootfs / 'usr/local/bin/nvml-probe'))
    for library in ('libc.so.6', 'ld-linux-x86-64.so.2'):
        shutil.copy(os.path.join('/lib/x86_64-linux-gnu', library), str(rootfs / 'lib/x86_64-linux-gnu'))
    os.symlink('../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2', str(rootfs / 'lib64/ld-linux-x86-64.so.2'))
    subprocess.run([RUNC, 'spec'], cwd=str(path), check=True)
    spec = json.loads((path / 'config.json').read_text())
    spec['process'].update(terminal=False, args=['/usr/local/bin/nvml-probe'])
    if visible is not None:
        spec['process']['env'].append('NVIDIA_VISIBLE_DEVICES=' + visible)
    spec['root']['readonly'] = False  # the runtime's hooks write links and the ld cache into it
    (path / 'config.json').write_text(json.dumps(spec))


def _run_container(create, bundle, env, output):
    """create (a command line that creates the container as runc's create would), runc start, a wait for the
    container's process to end: returns what it printed."""
    name = 'gpuready-test-' + uuid.uuid4().hex[:12]
    pid_file = bundle / 'container.pid'
    with open(str(output), 'w') as handle:
        proc = subprocess.run(create + ['create', '--bundle', str(bundle), '--pid-file', str(pid_file), name],
                              env=env, stdout=handle, stderr=subprocess.STDOUT, timeout=120, check=False)
    try:
        assert proc.returncode == 0, output.read_text()[-3000:]
        pidfd = os.pidfd_open(int(pid_file.read_text()))
        try:
            subprocess.run([RUNC, 'start', name], check=True, timeout=60)
            # the descriptor turns readable when the process ends
            assert select.select([pidfd], [], [], 60)[0], 'the container %s did not stop in 60 s' % name
        finally:
            os.close(pidfd)
    finally:
        subprocess.run([RUNC, 'delete', '--force', name], stderr=subprocess.DEVNULL, check=False, timeout=60)
    return output.read_text()


P4 = 'seed-4x-tesla-p4-driver-535'
A100_MIG = 'dgx-a100-mig-single-time-slicing'
RUNS = [(P4, '1', [1], None), (P4, 'all', [0, 1, 2, 3], None), (P4, 'none', [], None), (P4, None, None, None),
        (A100_MIG, 'MIG of slot 1', [0], [1]), (A100_MIG, 'all', [0], list(range(7)))]


@pytest.mark.parametrize('case_name, visible, gpus, migs', RUNS,
                         ids=['%s-%s' % (run[0], str(run[1]).replace(' ', '-')) for run in RUNS])
def test_real_runtime_and_runc_run_a_container_whose_nvml_sees_the_gpus_it_names(
        tmp_path, toolkit, probe, case_name, visible, gpus, migs):
    """The whole way a GPU reaches a process on a node: the real runtime (default mode, its hooks through
    the real nvidia-ctk) edits the bundle, the real runc creates the container (through the lab's
    driver-procfs-runc, which gives it the driver's /proc/driver entries, as the lab's nodes run it), and the
    NVML probe in it loads the driver's library the runtime mounted (the node's own copy, which carries the
    node's inventory) and finds exactly the named GPUs, in order, and of a MIG-enabled GPU the MIG devices
    named (all of them for `all`); `none` gives the library and no GPU, and without the variable the
    container has no NVML at all, as under runc alone. The runtime runs in a mount namespace where the
    node's /proc/driver entries are at /proc/driver, as lab-init puts them on a lab node."""
    if os.geteuid() != 0:
        pytest.fail('runc, mount namespaces and the device nodes of a driver install need root')
    case = next(c for _s, c in cases.all_cases() if c['name'] == case_name)
    node = harness.node_from_case(case, str(tmp_path / 'node'))
    with open(node['config']) as handle:
        config = json.load(handle)
    if visible == 'MIG of slot 1':
        visible = config['devices'][0]['mig_devices'][1]['uuid']
    (tmp_path / 'library').mkdir()
    library = harness.build(str(tmp_path / 'library'), builtin_config=config)
    root = str(tmp_path / 'root')
    library_dir = harness.driver_install(root, library, config)
    (tmp_path / 'xdg' / 'nvidia-container-runtime').mkdir(parents=True)
    (tmp_path / 'xdg' / 'nvidia-container-runtime' / 'config.toml').write_text(
        '[nvidia-container-cli]\nroot = "%s"\n\n[nvidia-container-runtime]\nruntimes = ["%s"]\n\n'
        '[nvidia-ctk]\npath = "%s"\n' % (root, toolkit / 'procfs-runc', toolkit / 'nvidia-ctk'))
    _bundle(tmp_path / 'bundle', probe, visible)
    in_node_namespace = ['unshare', '--mount', '--propagation', 'private', 'sh', '-ec',
                         'mount --bind "$0" /proc/driver; exec "$@"', str(toolkit / 'proc-driver')]

    printed = _run_container(
        in_node_namespace + [str(toolkit / 'nvidia-container-runtime')], tmp_path / 'bundle',
        dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / 'xdg'), LD_LIBRARY_PATH=library_dir,
             FAKE_NVML_CONFIG=node['config']), tmp_path / 'container.log')

    if gpus is None:
        assert printed.startswith('NVML library not found'), printed
        return
    expected = []
    for position, i in enumerate(gpus):
        expected.append('probe: GPU %d %s %s' % (position, config['devices'][i]['name'], config['devices'][i]['uuid']))
        expected += ['probe: GPU %d MIG device %d %s' % (position, slot, config['devices'][i]['mig_devices'][slot]['uuid'])
                     for slot in migs or ()]
    assert printed.splitlines() == expected + ['probe: %d GPU(s) visible' % len(gpus)]
