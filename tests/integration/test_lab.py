# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab (lab/lab.py): GPU nodes in podman whose containers get GPUs only through the nvidia
runtime. Real CRI pods run through containerd inside the node; see lab/README.md."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import re

import pytest

WORKLOAD = 'localhost/gpuready-lab/workload:1'
PROBE = '/usr/local/bin/nvml-probe'


def cri_run(lab, node, handler, command, env=None):
    """Runs one host-network CRI pod in the node; returns cri.py's JSON report."""
    args = ['env', 'PYTHONPATH=/opt/lab/pylib', 'python3', '/opt/lab/cri.py', 'run', '--handler', handler,
            '--image', WORKLOAD]
    for key, value in sorted((env or {}).items()):
        args += ['--env', '%s=%s' % (key, value)]
    out = lab.node_exec(lab.container(node), *(args + ['--', '/bin/sh', '-c', command]), check=False)
    report = json.loads(out.strip().splitlines()[-1])
    assert report.get('state') == 'CONTAINER_EXITED', report
    return report


GPU_SCRIPT = 'nvidia-smi -L; echo "smi-rc=$?"; %s; echo "probe-rc=$?"; ls /dev/ | grep nvidia || true' % PROBE


def test_nvidia_handler_all_gpus(lab):
    report = cri_run(lab, 'gpu-p4', 'nvidia', GPU_SCRIPT, {'NVIDIA_VISIBLE_DEVICES': 'all'})
    out = report['output']
    assert len(re.findall(r'^GPU \d: Tesla P4 \(UUID: GPU-[0-9a-f-]+\)$', out, re.M)) == 4, out
    assert 'probe: 4 GPU(s) visible' in out
    assert 'smi-rc=0' in out and 'probe-rc=0' in out
    for dev in ('nvidia0', 'nvidia1', 'nvidia2', 'nvidia3', 'nvidiactl', 'nvidia-uvm', 'nvidia-uvm-tools'):
        assert re.search(r'^%s$' % dev, out, re.M), (dev, out)


def test_nvidia_handler_one_gpu(lab):
    node_list = lab.node_exec(lab.container('gpu-p4'), 'nvidia-smi', '-L')
    second_uuid = re.findall(r'UUID: (GPU-[0-9a-f-]+)', node_list)[1]
    report = cri_run(lab, 'gpu-p4', 'nvidia', GPU_SCRIPT, {'NVIDIA_VISIBLE_DEVICES': '1'})
    out = report['output']
    assert re.findall(r'^GPU \d: .*$', out, re.M) == ['GPU 0: Tesla P4 (UUID: %s)' % second_uuid], out
    assert 'probe: 1 GPU(s) visible' in out
    assert re.search(r'^nvidia1$', out, re.M) and not re.search(r'^nvidia[023]$', out, re.M), out


@pytest.mark.parametrize('value', ['void', 'none', ''])
def test_nvidia_handler_no_visible_devices(lab, value):
    report = cri_run(lab, 'gpu-p4', 'nvidia', 'ls /usr/bin/nvidia-smi 2>&1; %s' % PROBE,
                     {'NVIDIA_VISIBLE_DEVICES': value})
    assert 'NVML library not found' in report['output'], report


def test_runc_handler_sees_no_gpu(lab):
    script = 'ls /usr/bin/nvidia-smi 2>&1; %s; echo "probe-rc=$?"; ls /dev/ | grep nvidia || echo no-nvidia-dev' % PROBE
    report = cri_run(lab, 'gpu-p4', 'runc', script, {'NVIDIA_VISIBLE_DEVICES': 'all'})
    out = report['output']
    assert 'NVML library not found' in out and 'probe-rc=12' in out, out
    assert 'No such file or directory' in out.splitlines()[0], out
    assert 'no-nvidia-dev' in out, out


def test_h100_node_as_a_driver_install_leaves_it(lab):
    container = lab.container('gpu-h100')
    listing = lab.node_exec(container, 'nvidia-smi', '-L')
    assert len(re.findall(r'^GPU \d: NVIDIA H100', listing, re.M)) == 8, listing
    assert 'Driver Version' in lab.node_exec(container, 'nvidia-smi')
    devices = lab.node_exec(container, 'sh', '-c', 'ls /dev/nvidia*').split()
    expected = ['/dev/nvidia%d' % i for i in range(8)] + ['/dev/nvidiactl', '/dev/nvidia-uvm', '/dev/nvidia-uvm-tools']
    assert devices == sorted(expected), devices
    pci = lab.node_exec(container, 'ls', '/var/lib/nvidia-fake/sys/bus/pci/devices').split()
    assert len(pci) == 8
    assert 'cgroupDriver: systemd' in lab.node_exec(container, 'cat', '/var/lib/kubelet/config.yaml')
    assert lab.podman('exec', '--user', 'ops', container, 'sudo', '-n', 'id', '-u').strip() == '0'
    config = lab.node_exec(container, 'cat', '/etc/containerd/config.toml')
    assert 'default_runtime_name = "runc"' in config and 'BinaryName = "/usr/bin/nvidia-container-runtime"' in config


def test_nodes_registered_like_kubelet(lab, k8s_api):
    for name, hostname_label in (('gpu-p4', 'gpu-p4'), ('gpu-h100', 'gpu-h100')):
        node = k8s_api.get('v1', 'Node', name)
        assert node['metadata']['labels']['kubernetes.io/hostname'] == hostname_label
        ready = [c for c in node['status']['conditions'] if c['type'] == 'Ready']
        assert ready and ready[0]['status'] == 'True'
        assert 'nvidia.com/gpu' not in node['status']['allocatable']
        assert node['status']['capacity']['cpu'] and node['status']['allocatable']['memory']
    with open(lab.state['inventory']) as handle:
        inventory = handle.read()
    assert 'p4.lab.internal:' in inventory and 'k8s_node_name: gpu-p4' in inventory
    assert 'ansible_host: gpuready-lab-gpu-h100' in inventory and 'ansible_user: ops' in inventory
    assert lab.exports()['GPUREADY_LAB_NODES'] == 'gpu-p4=gpuready-lab-gpu-p4 gpu-h100=gpuready-lab-gpu-h100'


def test_up_down_leaves_nothing(lab_module, tmp_path):
    """A second, separate lab (own prefix, own API emulator process) comes up and goes away
    without a trace: no container, volume, process in its PID namespace, conmon or emulator."""
    other = lab_module.Lab(nodes=['gpu-p4'], prefix='gpuready-labtest-', run_dir=str(tmp_path / 'run'))
    try:
        state = other.up()
        assert other.node_exec('gpuready-labtest-gpu-p4', 'nvidia-smi', '-L').count('Tesla P4') == 4
        emulator_pid = state['emulator_pid']
    finally:
        problems = other.down()
    assert problems == []
    assert other.podman('ps', '-a', '--filter', 'name=^gpuready-labtest-', '--format', '{{.ID}}').strip() == ''
    assert not lab_module._alive(emulator_pid)  # pylint: disable=protected-access
    print('lab timings: %s' % other.timings)
