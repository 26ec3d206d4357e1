# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab (lab/lab.py): GPU nodes in podman whose containers get GPUs only through the nvidia
runtime, the real nvidia-container-runtime of the toolkit's packages. Pods run by each node's real kubelet
through its containerd; see lab/README.md."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import re
import subprocess
import sys
import time

import pytest

from cluster_api import wait_for

WORKLOAD = 'localhost/gpuready-lab/workload:1'
PROBE = '/usr/local/bin/nvml-probe'


def pod_run(api, handler, command, env=None, node='gpu-p4'):
    """Runs one pod on the node with the real kubelet, through containerd's `handler` (nvidia: the RuntimeClass
    nvidia; runc: the seed's default, none), until it ends; returns {'output': its log}. (A CRI pod made beside
    the kubelet is one it does not want, and it stops it.)"""
    name = 'lab-probe-%d' % int(time.time() * 1000)
    container = {'name': 'probe', 'image': WORKLOAD, 'imagePullPolicy': 'Never', 'command': ['/bin/sh', '-c', command],
                 'env': [{'name': key, 'value': value} for key, value in sorted((env or {}).items())]}
    spec = {'nodeName': node, 'restartPolicy': 'Never', 'containers': [container]}
    if handler != 'runc':
        spec['runtimeClassName'] = handler
    api.create({'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': name, 'namespace': 'default'}, 'spec': spec})
    try:
        wait_for('pod %s to end' % name,
                 lambda: api.get('v1', 'Pod', name, 'default')['status'].get('phase') in ('Succeeded', 'Failed'))
        return {'output': api.core.read_namespaced_pod_log(name, 'default')}
    finally:
        api.delete('v1', 'Pod', name, 'default')


def with_nvidia_class(api):
    """The RuntimeClass nvidia (handler nvidia), which the seed's containerd config already has a runtime for."""
    if not api.exists('node.k8s.io/v1', 'RuntimeClass', 'nvidia'):
        api.create({'apiVersion': 'node.k8s.io/v1', 'kind': 'RuntimeClass', 'metadata': {'name': 'nvidia'},
                    'handler': 'nvidia'})
    return api


@pytest.fixture(scope='module')
def nvidia_class(lab_api):
    return with_nvidia_class(lab_api)


GPU_SCRIPT = ('nvidia-smi -L; echo "smi-rc=$?"; %s; echo "probe-rc=$?"; ls /dev/ | grep nvidia || true; '
              'head -2 /proc/driver/nvidia-caps/mig-minors' % PROBE)


def test_nvidia_handler_all_gpus(nvidia_class):
    report = pod_run(nvidia_class, 'nvidia', GPU_SCRIPT, {'NVIDIA_VISIBLE_DEVICES': 'all'})
    out = report['output']
    assert len(re.findall(r'^GPU \d: Tesla P4 \(UUID: GPU-[0-9a-f-]+\)$', out, re.M)) == 4, out
    assert 'probe: 4 GPU(s) visible' in out
    assert 'smi-rc=0' in out and 'probe-rc=0' in out
    for dev in ('nvidia0', 'nvidia1', 'nvidia2', 'nvidia3', 'nvidiactl', 'nvidia-uvm', 'nvidia-uvm-tools'):
        assert re.search(r'^%s$' % dev, out, re.M), (dev, out)
    # The driver's /proc/driver entries, which the kernel module shows in every procfs (here driver-procfs-runc)
    assert out.endswith('config 1\nmonitor 2\n'), out


def test_the_nodes_nvidia_runtime_is_the_toolkits_from_its_package(lab):
    """The runtime containerd's nvidia entry names is the real one, installed by the toolkit's packages at
    lab/go's pin, in the mode its package's default configuration gives (auto: just-in-time CDI)."""
    container = lab.container('gpu-p4')
    version = lab.node_exec(container, 'nvidia-container-runtime', '--version')
    assert version.splitlines()[0] == 'NVIDIA Container Runtime version 1.20.2', version
    owner = lab.node_exec(container, 'dpkg', '-S', '/usr/bin/nvidia-container-runtime')
    assert owner.strip() == 'nvidia-container-toolkit-base: /usr/bin/nvidia-container-runtime', owner
    config = lab.node_exec(container, 'cat', '/etc/nvidia-container-runtime/config.toml')
    assert re.search(r'^mode = "auto"$', config, re.M), config


def test_nvidia_handler_one_gpu(lab, nvidia_class):
    node_list = lab.node_exec(lab.container('gpu-p4'), 'nvidia-smi', '-L')
    second_uuid = re.findall(r'UUID: (GPU-[0-9a-f-]+)', node_list)[1]
    report = pod_run(nvidia_class, 'nvidia', GPU_SCRIPT, {'NVIDIA_VISIBLE_DEVICES': '1'})
    out = report['output']
    assert re.findall(r'^GPU \d: .*$', out, re.M) == ['GPU 0: Tesla P4 (UUID: %s)' % second_uuid], out
    assert 'probe: 1 GPU(s) visible' in out
    assert re.search(r'^nvidia1$', out, re.M) and not re.search(r'^nvidia[023]$', out, re.M), out


@pytest.mark.parametrize('value', ['void', ''])
def test_nvidia_handler_no_visible_devices(nvidia_class, value):
    report = pod_run(nvidia_class, 'nvidia', 'ls /usr/bin/nvidia-smi 2>&1; %s' % PROBE,
                     {'NVIDIA_VISIBLE_DEVICES': value})
    assert 'NVML library not found' in report['output'], report


def test_nvidia_handler_none_gives_the_driver_and_no_gpu(nvidia_class):
    """`none`, as the toolkit documents it: the driver's files without any GPU."""
    report = pod_run(nvidia_class, 'nvidia', '%s; ls /dev/ | grep "^nvidia[0-9]" || echo no-gpu-dev' % PROBE,
                     {'NVIDIA_VISIBLE_DEVICES': 'none'})
    out = report['output']
    assert 'probe: 0 GPU(s) visible' in out and 'no-gpu-dev' in out, out


def test_runc_handler_sees_no_gpu(lab_api):
    script = 'ls /usr/bin/nvidia-smi 2>&1; %s; echo "probe-rc=$?"; ls /dev/ | grep nvidia || echo no-nvidia-dev' % PROBE
    report = pod_run(lab_api, 'runc', script, {'NVIDIA_VISIBLE_DEVICES': 'all'})
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


def test_nodes_registered_by_their_kubelets(lab, lab_api):
    for name, hostname_label in (('gpu-p4', 'gpu-p4'), ('gpu-h100', 'gpu-h100')):
        node = lab_api.get('v1', 'Node', name)
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


def test_ansible_reaches_every_node_through_the_inventory(lab, tmp_path):
    """The inventory works as users will use it: the lab_node connection (lab/connection_plugins), the node
    names apart from the inventory names, and become for the node reached as the non-root user, who gets
    their own home and groups, and owns a file the connection copies in as them."""
    exports = lab.exports()
    env = dict(os.environ, ANSIBLE_NOCOLOR='1', ANSIBLE_LOAD_CALLBACK_PLUGINS='1',
               ANSIBLE_STDOUT_CALLBACK='ansible.builtin.json', ANSIBLE_LOCAL_TEMP=str(tmp_path / 'l'),
               **lab.ansible_env())

    def adhoc(module, args, *extra):
        cmd = [os.path.join(os.path.dirname(sys.executable), 'ansible'), 'gpu_nodes', '-i',
               exports['GPUREADY_LAB_INVENTORY'], '-m', module, '-a', args] + list(extra)
        proc = subprocess.run(cmd, env=env, cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, timeout=600, check=False)
        assert proc.returncode == 0, proc.stdout
        return json.loads(proc.stdout[proc.stdout.index('{'):])['plays'][0]['tasks'][0]['hosts']

    def stdout(args, *extra):
        results = adhoc('ansible.builtin.command', args, *extra)
        return dict((host, result['stdout']) for host, result in results.items())

    assert stdout('id -un') == {'p4.lab.internal': 'root', 'h100.lab.internal': 'root'}  # ops becomes root
    as_login_user = ('-e', 'ansible_become=false')
    assert stdout('id -un', *as_login_user) == {'p4.lab.internal': 'root', 'h100.lab.internal': 'ops'}
    homes = stdout('sh -c "echo $HOME; id -Gn"', *as_login_user)
    assert homes == {'p4.lab.internal': '/root\nroot', 'h100.lab.internal': '/home/ops\nops'}
    # A file goes in (copy) and comes back (fetch) through the connection, owned by the login user
    source = tmp_path / 'put.txt'
    source.write_text('through the lab_node connection\n')
    copied = adhoc('ansible.builtin.copy', 'src=%s dest=~/put.txt mode=0600' % source, *as_login_user)
    assert all(result['changed'] for result in copied.values()), copied
    owners = stdout('sh -c "stat -c %U ~/put.txt"', *as_login_user)
    assert owners == {'p4.lab.internal': 'root', 'h100.lab.internal': 'ops'}
    adhoc('ansible.builtin.fetch', 'src=~/put.txt dest=%s/' % (tmp_path / 'back'), *as_login_user)
    for host in ('p4.lab.internal', 'h100.lab.internal'):
        home = '/home/ops' if host.startswith('h100') else '/root'
        assert (tmp_path / 'back' / host / home.lstrip('/') / 'put.txt').read_text() == source.read_text()


# -- the containerd 2.x variant (config version 3) -------------------------------------------------
V3_NODE = 'gpu-p4-v3'
V3_PREFIX = 'gpuready-labv3-'


def test_up_down_leaves_nothing(lab, lab_module, tmp_path):
    """A second, separate lab (own prefix, own control plane) comes up and goes away without a trace: no
    container, volume, process in its PID namespace, conmon, control plane process or network namespace; and
    the session lab's nodes stay reachable (each node's systemd keeps to its own cgroups)."""
    other = lab_module.Lab(nodes=['gpu-p4'], prefix='gpuready-labtest-', run_dir=str(tmp_path / 'run'))
    try:
        other.up()
        assert other.node_exec('gpuready-labtest-gpu-p4', 'nvidia-smi', '-L').count('Tesla P4') == 4
        plane = other.control_plane.state
    finally:
        problems = other.down(count_zombies=True)
    assert problems == []
    assert other.podman('ps', '-a', '--filter', 'name=^gpuready-labtest-', '--format', '{{.ID}}').strip() == ''
    assert [name for name, pid in plane['pids'].items() if lab_module.control_plane._alive(pid)] == []  # pylint: disable=protected-access
    namespaces = subprocess.run(['ip', 'netns', 'list'], stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout
    assert plane['network']['name'] not in namespaces.split(), namespaces
    for name in ('gpu-p4', 'gpu-h100'):
        assert lab.node_exec(lab.container(name), 'systemctl', 'is-active', 'containerd').strip() == 'active'
    print('lab timings: %s' % other.timings)


def test_a_failed_up_leaves_nothing(lab, lab_module, tmp_path, monkeypatch):  # pylint: disable=unused-argument
    """A node that fails after the control plane is up (as a podman start can): up raises and leaves no
    container, control plane process or network namespace, though it wrote no state.json for down()."""
    other = lab_module.Lab(nodes=['gpu-p4'], prefix='gpuready-labfail-', run_dir=str(tmp_path / 'run'))
    seen = {}

    def fail(name):
        seen.update(other.control_plane.state)
        raise lab_module.LabError('%s: podman start failed (injected by the test)' % name)

    monkeypatch.setattr(other, '_wait_node', fail)
    with pytest.raises(lab_module.LabError, match='injected'):
        other.up()
    assert seen['pids'] and not os.path.exists(other.state_path)
    assert [name for name, pid in seen['pids'].items() if lab_module.control_plane._alive(pid)] == []  # pylint: disable=protected-access
    namespaces = subprocess.run(['ip', 'netns', 'list'], stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout
    assert [ns for ns in namespaces.split() if ns.startswith(seen['network']['name'])] == [], namespaces
    assert other.podman('ps', '-a', '--filter', 'name=^gpuready-labfail-', '--format', '{{.ID}}').strip() == ''


@pytest.fixture(scope='module')
def lab_v3(lab_module, tmp_path_factory):
    """The containerd 2.x node alone, with its own prefix, run dir and control plane, its real kubelet on
    containerd 2.x; torn down after this module's tests, then checked to leave nothing."""
    instance = lab_module.Lab(nodes=[V3_NODE], prefix=V3_PREFIX, run_dir=str(tmp_path_factory.mktemp('lab-v3-run')))
    try:
        instance.state = instance.up()
        yield instance
    finally:
        problems = instance.down()
        left = instance.podman('ps', '-a', '--filter', 'name=^' + V3_PREFIX, '--format', '{{.Names}}').strip()
        print('lab v3 timings: %s' % instance.timings)
        assert problems == [] and left == '', (problems, left)


@pytest.fixture(scope='module')
def v3_api(lab_v3):
    from cluster_api import ClusterApi
    return ClusterApi(lab_v3.control_plane, lab_v3.state['kubeconfig'])


def test_v3_node_is_not_started_by_default(lab_module, lab):
    assert V3_NODE in lab_module.NODES and V3_NODE not in lab_module.DEFAULT_NODES
    assert V3_NODE not in lab.state['nodes']


def test_v3_node_runs_containerd_2_with_a_version_3_seed(lab_v3, v3_api):
    container = lab_v3.container(V3_NODE)
    for binary in ('containerd', 'ctr'):
        version = lab_v3.node_exec(container, binary, '--version')
        assert re.match(r'2\.\d+\.\d+', version.split()[2]), version
    assert re.search(r'\b2\.\d+\.\d+', lab_v3.node_exec(container, 'containerd-shim-runc-v2', '-v')), 'shim is not 2.x'
    assert lab_v3.node_exec(container, 'systemctl', 'is-active', 'containerd').strip() == 'active'
    config = lab_v3.node_exec(container, 'cat', '/etc/containerd/config.toml')
    assert re.search(r'^version = 3$', config, re.M), config
    assert 'default_runtime_name = "runc"' in config and 'BinaryName = "/usr/bin/nvidia-container-runtime"' in config
    node = v3_api.get('v1', 'Node', V3_NODE)
    assert re.match(r'containerd://2\.', node['status']['nodeInfo']['containerRuntimeVersion']), node['status']['nodeInfo']
    assert lab_v3.state['nodes'][V3_NODE]['containerd'] == '2'
    with open(lab_v3.state['inventory']) as handle:
        inventory = handle.read()
    assert 'p4-v3.lab.internal:' in inventory and 'ansible_host: %s' % container in inventory


def test_v3_nvidia_handler_all_gpus(v3_api):
    report = pod_run(with_nvidia_class(v3_api), 'nvidia', GPU_SCRIPT, {'NVIDIA_VISIBLE_DEVICES': 'all'}, node=V3_NODE)
    out = report['output']
    assert len(re.findall(r'^GPU \d: Tesla P4 \(UUID: GPU-[0-9a-f-]+\)$', out, re.M)) == 4, out
    assert 'probe: 4 GPU(s) visible' in out and 'smi-rc=0' in out and 'probe-rc=0' in out, out


def test_v3_runc_handler_sees_no_gpu(v3_api):
    report = pod_run(v3_api, 'runc', '%s; echo "probe-rc=$?"' % PROBE, {'NVIDIA_VISIBLE_DEVICES': 'all'}, node=V3_NODE)
    out = report['output']
    assert 'NVML library not found' in out and 'probe-rc=12' in out, out
