# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The doctor (playbooks/doctor.yml) on the session lab: playbooks/site.yml fixes both nodes, the doctor
finds every link ok, then each fault changes one real artefact on gpu-p4 (a file, a unit, a device node, an
image, an API object), the doctor names the expected link and cause and its evidence quotes the artefact,
and the fault is reverted before the next one.

Every playbook here runs as one user bound only to (a copy of) the shipped ClusterRole: site.yml with a bearer
token (gpuready_k8s_api_key), the doctor and validate with a client key inline in a kubeconfig. The last tests
check that neither secret appears in any output (site.yml and the first doctor and validate runs at -vvv),
the Ansible log, a report or a backup; that every rule of the ClusterRole was needed; and that without any
one rule the playbook that needs it fails naming the verb and the resource.

The README's own commands run too, as a user types them against the lab (`eval "$(make -s lab-env)"`, then
`ansible-playbook -i "$GPUREADY_LAB_INVENTORY" gpuready.nvidia.doctor`, no -e): the lab's inventory says where
its nodes' GPUs are (gpuready_sysfs_root, gpuready_dmi_product_file) and KUBECONFIG reaches the API. The doctor
and validate find the fixed lab healthy. The fixed state is left behind: pytest runs the files in name order
and this is the last one that uses the session lab (test_molecule.py starts labs of its own)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import json
import os
import re
import subprocess
import sys
import time

import pytest
import yaml

import lab_scripts
from cluster_api import wait_for, wait_until_pod_security_enforces
from ansible_collections.gpuready.nvidia.tests import apt_repo, offline_wheels

NODE, HOST = 'gpu-p4', 'p4.lab.internal'
OTHER = 'gpu-h100'
NAMESPACE = 'nvidia-device-plugin'
NFD_NAMESPACE = 'node-feature-discovery'
PLUGIN = 'nvidia-device-plugin'
PLUGIN_LABEL = 'app.kubernetes.io/name=nvidia-device-plugin'
FAKE_SYS = '/var/lib/nvidia-fake/sys'
CONFIG = '/etc/containerd/config.toml'
SAVED_CONFIG = '/root/doctor-saved-config.toml'
NVML = '/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1'
RUNTIME = '/usr/bin/nvidia-container-runtime'
# The image the lab built and imported (lab/go/device-plugin), which the lab's inventory has site.yml deploy
PLUGIN_VERSION = lab_scripts.script('lab/go/gobuild.py', 'gpuready_gobuild').component('device-plugin').version
PLUGIN_IMAGE = 'nvcr.io/nvidia/k8s-device-plugin:' + PLUGIN_VERSION
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MANIFESTS = os.path.join(ROOT, 'tests', 'fixtures', 'manifests')
TEST_LABEL = {'gpuready.test': 'doctor'}
with open(os.path.join(ROOT, 'roles', 'gpuready', 'files', 'clusterrole.yml')) as _clusterrole:
    SHIPPED_RULES = yaml.safe_load(_clusterrole)['rules']
DEPLOYER = 'gpuready-lab-deployer'
# site.yml authenticates with a bearer token: the deployer's ServiceAccount's (the name kube-apiserver gives it)
DEPLOYER_SA = 'system:serviceaccount:default:' + DEPLOYER
RBAC = 'rbac.authorization.k8s.io/v1'
CLUSTER_ROLES = os.path.join(ROOT, 'tests', 'integration', 'cluster_roles.yml')
# Cheapest first: the playbook a rule's removal is shown with is the first of these that needed it
PLAYBOOKS = ('gpuready.nvidia.doctor', 'gpuready.nvidia.validate', CLUSTER_ROLES, 'gpuready.nvidia.site')
# Rules the lab cannot exercise, and why (none since k8s_gpu_cluster_info lists ClusterPolicies whether or not
# the GPU Operator's CRD exists: RBAC answers before the API server finds no such resource)
NOT_IN_THE_LAB = {}


class Deployer(object):
    """The user every playbook here runs as, bound only to a ClusterRole holding the shipped rules: a client
    certificate (user DEPLOYER) and a ServiceAccount's bearer token (DEPLOYER_SA), both to grep for
    afterwards. Keeps each run's output and time span."""

    def __init__(self, api, work):
        self.api, self.work = api, work
        person = api.user_with_certificate(DEPLOYER, str(work))
        self.kubeconfig = person.kubeconfig
        with open(person.key) as handle:
            self.key_pem = handle.read()
        self.token = api.service_account_token(DEPLOYER).token
        role = {'apiVersion': RBAC, 'kind': 'ClusterRole', 'metadata': {'name': DEPLOYER}, 'rules': SHIPPED_RULES}
        binding = {'apiVersion': RBAC, 'kind': 'ClusterRoleBinding', 'metadata': {'name': DEPLOYER},
                   'roleRef': {'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'ClusterRole', 'name': DEPLOYER},
                   'subjects': [{'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'User', 'name': DEPLOYER},
                                {'kind': 'ServiceAccount', 'name': DEPLOYER, 'namespace': 'default'}]}
        for obj in (role, binding):
            if api.exists(RBAC, obj['kind'], DEPLOYER):
                api.delete(RBAC, obj['kind'], DEPLOYER)
            api.create(obj)
        self.runs = []  # (playbook, started, ended, output)

    def requests(self):
        """The API requests the deployer made (kube-apiserver's audit log), oldest first."""
        return [entry for entry in self.api.requests() if entry['user'] in (DEPLOYER, DEPLOYER_SA)]

    def grant(self, rules):
        self.api.patch(RBAC, 'ClusterRole', DEPLOYER, {'rules': rules})

    def auth(self, playbook):
        if playbook == 'gpuready.nvidia.site':
            return {'gpuready_k8s_kubeconfig': None, 'gpuready_k8s_host': self.api.url,
                    'gpuready_k8s_api_key': self.token, 'gpuready_k8s_ca_cert': self.api.ca_cert}
        return {'gpuready_k8s_kubeconfig': self.kubeconfig}

    def secrets(self):
        """The token, every line of the key's PEM body, and the key as a kubeconfig carries it."""
        body = [line for line in self.key_pem.splitlines() if line and not line.startswith('-----')]
        return [self.token, base64.b64encode(self.key_pem.encode()).decode()[:64]] + body


def _playbook(lab, work, playbook, extra_vars, limit=None, check=True, verbose=False):
    exports = lab.exports()
    env = dict(os.environ, ANSIBLE_NOCOLOR='1', ANSIBLE_LOG_PATH=str(work / 'ansible.log'), **lab.ansible_env())
    deployer = lab.deployer
    # Where the nodes' GPUs are comes from the lab's inventory (gpuready_sysfs_root), as for any user
    extra = dict(extra_vars, **deployer.auth(playbook))
    command = [os.path.join(os.path.dirname(sys.executable), 'ansible-playbook'), '-i',
               exports['GPUREADY_LAB_INVENTORY'], playbook, '-e', json.dumps(extra)]
    if limit:
        command += ['--limit', limit]
    if verbose:
        command.append('-vvv')
    started = time.time()
    proc = subprocess.run(command, cwd=str(work), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=1200, check=False)
    deployer.runs.append((playbook, started, time.time(), proc.stdout))
    if check:
        assert proc.returncode == 0, proc.stdout[-8000:]
    return proc


class Lab(object):
    """The session lab seen from the faults: the node gpu-p4, the API, a work folder."""

    def __init__(self, lab, api, work):
        self.lab, self.api, self.work = lab, api, work
        self.container = lab.container(NODE)
        self.deployer = lab.deployer
        self.runs = 0

    def sh(self, script):
        return self.lab.node_exec(self.container, 'sh', '-c', script)

    def doctor(self, limit=HOST, verbose=False, **extra):
        """The doctor playbook on limit; {Node name: report} from its JSON report."""
        self.runs += 1
        path = str(self.work / ('doctor-%d.json' % self.runs))
        variables = {'doctor_fail_when_broken': False}
        variables.update(extra, doctor_report_path=path)
        proc = _playbook(self.lab, self.work, 'gpuready.nvidia.doctor', variables, limit, verbose=verbose)
        with open(path) as handle:
            return json.load(handle)['nodes'], proc.stdout

    def node(self):
        return self.api.get('v1', 'Node', NODE)

    def plugin_pods(self):
        return [p for p in self.api.list('v1', 'Pod', namespace=NAMESPACE, label_selector=PLUGIN_LABEL)
                if p['spec'].get('nodeName') == NODE and not p['metadata'].get('deletionTimestamp')]

    def no_plugin_pod(self):
        wait_for('no device plugin pod on %s' % NODE, lambda: not self.plugin_pods(), timeout=120)

    def restart_plugin(self):
        for pod in self.plugin_pods():
            self.api.delete('v1', 'Pod', pod['metadata']['name'], namespace=NAMESPACE)

    def healthy(self):
        """Wait until gpu-p4's plugin runs, no earlier plugin pod is still stopping (the DaemonSet controller
        starts the new pod while the old one stops) and the Node advertises and can allocate its 4 GPUs."""
        def ready():
            pods = self.plugin_pods()
            stopping = [p for p in self.api.list('v1', 'Pod', namespace=NAMESPACE, label_selector=PLUGIN_LABEL)
                        if p['spec'].get('nodeName') == NODE and p['metadata'].get('deletionTimestamp')]
            statuses = [s for p in pods for s in p.get('status', {}).get('containerStatuses') or []]
            status = self.node()['status']
            return (len(pods) == 1 and not stopping and statuses and all(s.get('ready') for s in statuses)
                    and status['capacity'].get('nvidia.com/gpu') == '4'
                    and status['allocatable'].get('nvidia.com/gpu') == '4')
        wait_for('gpu-p4 healthy again', ready, timeout=240, interval=1)

    def restart_containerd(self):
        self.sh('systemctl restart containerd')
        wait_for('CRI answers', lambda: 'active' in self.sh('systemctl is-active containerd || true'), timeout=60)


@pytest.fixture(scope='module')
def fixed(lab, lab_api, tmp_path_factory):
    """Both lab nodes after playbooks/site.yml, run as `make demo` runs it: the nodes reach no index, so the
    wheels and a signed toolkit mirror come from this machine (served until the module ends: the tests
    without one ClusterRole rule run site.yml again)."""
    work = tmp_path_factory.mktemp('doctor')
    lab.deployer = Deployer(lab_api, work)
    wheels = str(work / 'wheels')
    offline_wheels.build(wheels)
    repo = str(work / 'apt-repo')
    apt_repo.build(repo)
    # Where the nodes reach this machine: each node has a network namespace of its own
    url, stop = apt_repo.serve(repo, host=lab.exports()['GPUREADY_LAB_HOST_ADDRESS'])
    try:
        site_vars = {
            'node_python_wheels_dir': wheels, 'node_python_update_cache': False,
            'container_toolkit_apt_repo_url': url + '/repo', 'container_toolkit_gpg_key': repo + '/gpgkey.asc'}
        _playbook(lab, work, 'gpuready.nvidia.site', site_vars, verbose=True)
        _playbook(lab, work, CLUSTER_ROLES, {}, limit=HOST)  # for the rule tests: what it needs on its own
        state = Lab(lab, lab_api, work)
        state.site_vars = site_vars
        state.sh('cp -p %s %s' % (CONFIG, SAVED_CONFIG))
        state.healthy()
        yield state
    finally:
        stop()


def test_a_healthy_lab_is_ok_on_every_link_and_runs_a_test_pod(fixed):
    reports, output = fixed.doctor(limit=None, verbose=True, doctor_run_workload=True, doctor_fail_when_broken=True)
    assert sorted(reports) == [OTHER, NODE]
    for name, report in reports.items():
        assert report['status'] == 'ok', (name, report)
        assert set(report['links'].values()) <= {'ok', 'not_applicable'}, (name, report)
        assert report['links']['runtime_class'] == 'not_applicable'  # nvidia is containerd's default
        assert report['links']['workload'] == 'ok'
    assert 'gpu-p4: ok' in output
    # The test pod was labelled, and deleted (the kubelet may still be stopping it: it has a deletionTimestamp)
    assert not [pod for pod in fixed.api.list('v1', 'Pod', namespace=NAMESPACE,
                                              label_selector='app.kubernetes.io/name=gpuready-gpu-test')
                if not pod['metadata'].get('deletionTimestamp')]


def _as_the_readme_says(lab, playbook, work):
    """`eval "$(make -s lab-env)"; ansible-playbook -i "$GPUREADY_LAB_INVENTORY" PLAYBOOK`: the lab's exports
    (KUBECONFIG, the podman configuration, ...) and nothing else, no -e, as the lab's admin."""
    exports = lab.exports()
    env = dict(os.environ, ANSIBLE_NOCOLOR='1', **exports)
    command = [os.path.join(os.path.dirname(sys.executable), 'ansible-playbook'), '-i',
               exports['GPUREADY_LAB_INVENTORY'], playbook]
    return subprocess.run(command, cwd=str(work), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=900, check=False)


def test_the_readme_doctor_and_validate_find_the_healthy_lab_healthy(fixed, tmp_path):
    # Before gpuready_sysfs_root the doctor read the nodes' own /sys, found no NVIDIA PCI device and called both
    # healthy nodes BROKEN at driver (no_nvidia_gpu) unless given the lab's sysfs with -e.
    doctor = _as_the_readme_says(fixed.lab, 'gpuready.nvidia.doctor', tmp_path)
    assert doctor.returncode == 0, doctor.stdout[-6000:]  # doctor_fail_when_broken: any broken link fails it
    for name in (NODE, OTHER):
        assert '%s: ok' % name in doctor.stdout, doctor.stdout[-6000:]
    assert 'BROKEN' not in doctor.stdout and 'no_nvidia_gpu' not in doctor.stdout
    validate = _as_the_readme_says(fixed.lab, 'gpuready.nvidia.validate', tmp_path)
    assert validate.returncode == 0, validate.stdout[-6000:]
    for name in (NODE, OTHER):  # the per-node table: node, GPUs, expected, capacity, allocatable, test pod
        assert re.search(r'"%s +[1-9].*passed' % name, validate.stdout), validate.stdout[-6000:]


# -- the faults: (inject, revert) on the Lab ----------------------------------------------------------


def _file_fault(script):
    """A change to containerd's config file, left unloaded; reverted byte for byte (mtime too)."""
    return (lambda s: s.sh(script), lambda s: s.sh('cp -p %s %s' % (SAVED_CONFIG, CONFIG)))


def _move(path):
    return (lambda s: s.sh('mv %s %s.doctor-off' % (path, path)), lambda s: s.sh('mv %s.doctor-off %s' % (path, path)))


def _device_node(path):
    return (lambda s: s.sh('rm %s' % path),
            lambda s: s.sh('systemd-tmpfiles --create --boot /etc/tmpfiles.d/nvidia-fake-devices.conf'))


def _runc_default_loaded(s):
    s.sh("sed -i 's/default_runtime_name = \"nvidia\"/default_runtime_name = \"runc\"/' %s" % CONFIG)
    s.restart_containerd()


def _config_back_loaded(s):
    s.sh('cp -p %s %s' % (SAVED_CONFIG, CONFIG))
    s.restart_containerd()
    s.healthy()


def _stop_containerd(s):
    s.sh('systemctl stop containerd')


def _start_containerd(s):
    s.sh('systemctl start containerd')
    s.healthy()


# The plugin's process (its whole command line, so that the shell running pkill does not match)
PLUGIN_PROCESS = "-x -f nvidia-device-plugin"


def _plugin_misses_kubelet_restart(s):
    """A kubelet restart empties its device-plugins folder and forgets its registrations; a plugin that cannot
    answer then (stopped) does not register again, and the kubelet holds none of its GPUs. (Removing the socket
    file alone does not do it: the real kubelet keeps the connection it opened.)"""
    s.sh('pkill -STOP %s && systemctl restart kubelet' % PLUGIN_PROCESS)
    wait_for('the restarted kubelet to hold no GPU of %s' % NODE,
             lambda: s.node()['status'].get('allocatable', {}).get('nvidia.com/gpu') in (None, '0'), timeout=120)


def _plugin_resumes(s):
    # It sees the new kubelet.sock and registers again
    s.sh('pkill -CONT %s' % PLUGIN_PROCESS)
    s.healthy()


PSA_ENFORCE = 'pod-security.kubernetes.io/enforce'


def _enforce_baseline(s):
    """PodSecurity one level stricter on the plugin's namespace: the DaemonSet controller's new pod is refused."""
    s.saved = s.api.get('v1', 'Namespace', NAMESPACE)['metadata']['labels'][PSA_ENFORCE]
    s.api.patch('v1', 'Namespace', NAMESPACE, {'metadata': {'labels': {PSA_ENFORCE: 'baseline'}}})
    wait_until_pod_security_enforces(s.api.core, NAMESPACE, 'baseline')
    s.restart_plugin()
    wait_for('the DaemonSet controller refused by PodSecurity', lambda: [
        e for e in s.api.list('v1', 'Event', namespace=NAMESPACE, field_selector='reason=FailedCreate')
        if 'PodSecurity' in (e.get('message') or '')], timeout=120)
    s.no_plugin_pod()


def _enforce_as_before(s):
    s.api.patch('v1', 'Namespace', NAMESPACE, {'metadata': {'labels': {PSA_ENFORCE: s.saved}}})
    s.healthy()


def _delete_plugin_daemonset(s):
    s.saved = s.api.get('apps/v1', 'DaemonSet', PLUGIN, namespace=NAMESPACE)
    s.api.delete('apps/v1', 'DaemonSet', PLUGIN, namespace=NAMESPACE)
    s.no_plugin_pod()


def _recreate_plugin_daemonset(s):
    obj = s.saved
    obj['metadata'] = dict((k, v) for k, v in obj['metadata'].items()
                           if k in ('name', 'namespace', 'labels', 'annotations'))
    obj.pop('status', None)
    s.api.create(obj)
    s.healthy()


def _require_absent_label(s):
    s.saved = s.api.get('apps/v1', 'DaemonSet', PLUGIN, namespace=NAMESPACE)['spec']['template']['spec']['affinity']
    affinity = {'nodeAffinity': {'requiredDuringSchedulingIgnoredDuringExecution': {'nodeSelectorTerms': [
        {'matchExpressions': [{'key': 'gpuready.test/doctor', 'operator': 'In', 'values': ['never']}]}]}}}
    s.api.patch('apps/v1', 'DaemonSet', PLUGIN, {'spec': {'template': {'spec': {'affinity': affinity}}}},
                namespace=NAMESPACE, patch_type='strategic')
    s.no_plugin_pod()


def _restore_affinity(s):
    s.api.patch('apps/v1', 'DaemonSet', PLUGIN, {'spec': {'template': {'spec': {'affinity': s.saved}}}},
                namespace=NAMESPACE, patch_type='merge')
    s.healthy()


TAINT = {'key': 'gpuready.test/doctor', 'value': 'fault', 'effect': 'NoExecute'}


def _taint(s):
    taints = s.node()['spec'].get('taints') or []
    s.api.patch('v1', 'Node', NODE, {'spec': {'taints': taints + [TAINT]}})
    s.no_plugin_pod()


def _untaint(s):
    taints = [t for t in s.node()['spec'].get('taints') or [] if t.get('key') != TAINT['key']]
    s.api.patch('v1', 'Node', NODE, {'spec': {'taints': taints}})
    s.healthy()


def _remove_plugin_image(s):
    s.sh('ctr -n k8s.io images rm %s' % PLUGIN_IMAGE)
    s.restart_plugin()

    def pulling():
        for pod in s.plugin_pods():
            for status in pod.get('status', {}).get('containerStatuses') or []:
                if (status.get('state') or {}).get('waiting', {}).get('reason') in ('ErrImagePull', 'ImagePullBackOff'):
                    return True
        return False
    wait_for('the new plugin pod failing to pull', pulling, timeout=120)


def _import_plugin_image(s):
    s.sh('ctr -n k8s.io images import /opt/lab/nvidia-device-plugin.oci.tar >/dev/null')
    s.restart_plugin()
    s.healthy()


def _second_plugin(s):
    with open(os.path.join(MANIFESTS, 'nvidia-device-plugin-v0.20.0.yml')) as handle:
        manifest = yaml.safe_load(handle)
    container = manifest['spec']['template']['spec']['containers'][0]
    container['image'] = PLUGIN_IMAGE  # the upstream static DaemonSet, at the version the lab has
    s.api.create(manifest)
    wait_for('the second plugin on gpu-p4', lambda: [
        p for p in s.api.list('v1', 'Pod', namespace='kube-system', label_selector='name=nvidia-device-plugin-ds')
        if p['spec'].get('nodeName') == NODE], timeout=120)


def _remove_second_plugin(s):
    s.api.delete('apps/v1', 'DaemonSet', 'nvidia-device-plugin-daemonset', namespace='kube-system')
    wait_for('the second plugin gone', lambda: not s.api.list(
        'v1', 'Pod', namespace='kube-system', label_selector='name=nvidia-device-plugin-ds'), timeout=120)
    # It took over the kubelet registration: ours registers again from a new pod
    s.restart_plugin()
    s.healthy()


def _unschedulable_pod(s):
    pod = {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': 'doctor-five-gpus', 'namespace': 'default',
                                                           'labels': TEST_LABEL},
           'spec': {'nodeSelector': {'kubernetes.io/hostname': NODE}, 'containers': [
               {'name': 'cuda', 'image': 'nvcr.io/nvidia/cuda:12.2.0-base-ubuntu22.04', 'command': ['nvidia-smi'],
                'resources': {'limits': {'nvidia.com/gpu': 5}}}]}}
    s.api.create(pod)
    wait_for('FailedScheduling', lambda: s.api.list('v1', 'Event', namespace='default',
                                                    field_selector='involvedObject.name=doctor-five-gpus'), timeout=60)


def _delete_unschedulable_pod(s):
    s.api.delete('v1', 'Pod', 'doctor-five-gpus', namespace='default')


FAULTS = [
    # (cause, link, inject/revert, what the evidence quotes)
    ('nouveau_loaded', 'driver', (lambda s: s.sh('mkdir %s/module/nouveau' % FAKE_SYS),
                                  lambda s: s.sh('rmdir %s/module/nouveau' % FAKE_SYS)), 'module/nouveau'),
    ('nvidia_module_not_loaded', 'driver', _move(FAKE_SYS + '/module/nvidia'), 'module/nvidia is missing'),
    ('nvml_library_missing', 'nvml', _move(NVML), 'libnvidia-ml.so.1'),
    # The loaded module is another version than the library (a driver upgrade without a reboot): NVML itself
    # refuses to start with NVML_ERROR_LIB_RM_VERSION_MISMATCH, which nvidia-ml-py words as quoted
    ('driver_library_version_mismatch', 'nvml',
     (lambda s: s.sh('echo 535.216.01 > %s/module/nvidia/version' % FAKE_SYS),
      lambda s: s.sh('rm %s/module/nvidia/version' % FAKE_SYS)),
     '(RM has detected an NVML/RM version mismatch.); reboot or reload the driver; loaded kernel module: 535.216.01'),
    ('device_nodes_missing', 'device_nodes', _device_node('/dev/nvidia2'), '/dev/nvidia2 does not exist'),
    ('nvidia_uvm_missing', 'device_nodes', _device_node('/dev/nvidia-uvm'), '/dev/nvidia-uvm does not exist'),
    ('runtime_binary_missing', 'toolkit', _move(RUNTIME), 'BinaryName = "/usr/bin/nvidia-container-runtime"'),
    ('containerd_config_invalid', 'containerd_config', _file_fault('echo "[plugins" >> %s' % CONFIG), CONFIG),
    ('cri_plugin_disabled', 'containerd_config',
     _file_fault("sed -i '1i disabled_plugins = [\"cri\"]' %s" % CONFIG), 'disabled_plugins = ["cri"]'),
    ('nvidia_runtime_not_configured', 'containerd_config', _file_fault('echo "version = 2" > %s' % CONFIG),
     'no [plugins.*.containerd.runtimes.nvidia] table'),
    ('runtime_in_wrong_table', 'containerd_config',
     _file_fault("sed -i 's/io.containerd.grpc.v1.cri/io.containerd.cri.v1.runtime/' %s" % CONFIG),
     'plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia'),
    ('systemd_cgroup_mismatch', 'containerd_config',
     _file_fault("sed -i 's/SystemdCgroup = true/SystemdCgroup = false/' %s" % CONFIG), 'SystemdCgroup = false'),
    ('containerd_not_restarted', 'containerd_runtime_loaded',
     _file_fault("sed -i 's/default_runtime_name = \"nvidia\"/default_runtime_name = \"runc\"/' %s" % CONFIG),
     'default_runtime_name = "runc"'),
    ('containerd_not_running', 'containerd_runtime_loaded', (_stop_containerd, _start_containerd),
     'containerd is inactive'),
    ('cri_unreachable', 'containerd_runtime_loaded', _move('/run/containerd/containerd.sock'),
     '/run/containerd/containerd.sock'),
    ('default_runtime_not_nvidia', 'runtime_class', (_runc_default_loaded, _config_back_loaded),
     'DaemonSet nvidia-device-plugin/nvidia-device-plugin has no spec.template.spec.runtimeClassName'),
    ('plugin_not_registered', 'kubelet_registration', (_plugin_misses_kubelet_restart, _plugin_resumes),
     'and no nvidia-gpu.sock'),
    ('plugin_pod_not_created', 'plugin_scheduled', (_enforce_baseline, _enforce_as_before),
     'violates PodSecurity "baseline:latest"'),
    ('device_plugin_not_deployed', 'plugin_scheduled', (_delete_plugin_daemonset, _recreate_plugin_daemonset),
     'no DaemonSet'),
    ('plugin_affinity_no_match', 'plugin_scheduled', (_require_absent_label, _restore_affinity),
     'gpuready.test/doctor In'),
    ('taint_not_tolerated', 'plugin_scheduled', (_taint, _untaint), 'taint gpuready.test/doctor=fault:NoExecute'),
    ('plugin_image_pull_failed', 'plugin_running', (_remove_plugin_image, _import_plugin_image), PLUGIN_IMAGE),
    ('two_device_plugins', 'plugin_scheduled', (_second_plugin, _remove_second_plugin),
     'kube-system/nvidia-device-plugin-daemonset'),
    ('gpu_request_unschedulable', 'workload', (_unschedulable_pod, _delete_unschedulable_pod),
     'Insufficient nvidia.com/gpu'),
]


def test_at_least_twenty_causes_are_reproduced():
    assert len(set(cause for cause, _link, _change, _quoted in FAULTS)) >= 20


@pytest.mark.parametrize('cause, link, change, quoted', FAULTS, ids=[f[0] for f in FAULTS])
def test_a_fault_is_named_with_its_evidence(fixed, cause, link, change, quoted):
    inject, revert = change
    inject(fixed)
    try:
        reports, output = fixed.doctor()
    finally:
        revert(fixed)
    report = reports[NODE]
    assert (report['first_broken_link'], report['cause']) == (link, cause), output[-6000:]
    assert any(quoted in line for line in report['evidence']), report['evidence']
    assert report['links'][link] == 'broken' and report['fix']
    assert 'gpu-p4: BROKEN at %s (%s)' % (link, cause) in output


def test_a_failed_validation_ends_with_the_doctor(fixed):
    # Settings that promise 4 replicas per GPU, which the deployed plugin does not give: validation fails
    # at capacity, and the doctor, run by the validate role, names that link before the play fails.
    sharing = {'strategy': 'time-slicing', 'resources': [{'name': 'nvidia.com/gpu', 'replicas': 4}]}
    proc = _playbook(fixed.lab, fixed.work, 'gpuready.nvidia.validate',
                     {'gpuready_sharing': sharing, 'validate_timeout': 5, 'validate_test_pod': False,
                      'validate_report_path': str(fixed.work / 'validate.json')},
                     limit=HOST, check=False, verbose=True)
    assert proc.returncode != 0
    assert 'gpu-p4: BROKEN at capacity (capacity_mismatch)' in proc.stdout, proc.stdout[-6000:]
    assert 'evidence: Node gpu-p4 status.capacity nvidia.com/gpu: 4; expected 16 (4 GPUs)' in proc.stdout
    assert proc.stdout.index('BROKEN at capacity') < proc.stdout.index('Fail as validation did')


# -- secrets and least privilege, over every run above ------------------------------------------------


def test_no_secret_in_any_output_log_report_or_backup(fixed):
    runs = fixed.deployer.runs
    assert sum(1 for run in runs if 'ESTABLISH LOCAL CONNECTION' in run[3]) >= 3  # site.yml, doctor, validate at -vvv
    places = dict(('%s run %d' % (run[0], number), run[3]) for number, run in enumerate(runs))
    for name in sorted(os.listdir(str(fixed.work))):
        if name == 'ansible.log' or name.endswith('.json'):
            with open(str(fixed.work / name), errors='replace') as handle:
                places[name] = handle.read()
    assert 'ansible.log' in places and 'validate.json' in places and 'doctor-1.json' in places
    for node in (NODE, OTHER):
        # containerd's config, its backups and the rollback record (/var/lib/gpuready)
        places['%s /etc/containerd, /var/lib/gpuready' % node] = fixed.lab.node_exec(
            fixed.lab.container(node), 'sh', '-c', 'find /etc/containerd /var/lib/gpuready -type f -exec cat {} +')
    leaks = [(place, secret[:6] + '...') for place, text in sorted(places.items())
             for secret in fixed.deployer.secrets() if secret in text]
    assert not leaks


def _covers(rule, entry):
    """Whether rule grants the logged request. The escalate/bind rule counts for writes of the roles
    and bindings it names (the API checks it when they grant more than the writer holds)."""
    if entry['resource'] is None:  # discovery, /version: open to every user
        return False
    resource = entry['resource'] + ('/' + entry['subresource'] if entry.get('subresource') else '')
    if entry['group'] not in rule['apiGroups']:
        return False
    if rule.get('resourceNames'):
        return entry['verb'] in ('create', 'patch', 'update') and entry.get('name') in rule['resourceNames']
    return resource in rule['resources'] and entry['verb'] in rule['verbs']


PASSING_RUNS = {}


def _passing_requests(fixed):
    """{playbook: the deployer's requests during its runs}, taken once, before any rule is removed."""
    if not PASSING_RUNS:
        log = fixed.deployer.requests()
        for playbook, started, ended, dummy in fixed.deployer.runs:
            PASSING_RUNS.setdefault(playbook, []).extend(e for e in log if started <= e['time'] <= ended)
    return PASSING_RUNS


def test_every_rule_was_needed_and_nothing_refused(fixed):
    by_playbook = _passing_requests(fixed)
    assert set(by_playbook) == set(PLAYBOOKS)
    requests = [entry for entries in by_playbook.values() for entry in entries]
    assert [(e['verb'], e['path']) for e in requests if e['code'] == 403] == []
    unused = [rule for rule in SHIPPED_RULES if not any(_covers(rule, e) for e in requests)]
    assert [rule['resources'][0] for rule in unused] == list(NOT_IN_THE_LAB)


def _rule_id(rule):
    return '%s:%s' % (','.join(rule['resources']), ','.join(rule['verbs']))


def _delete_roles_and_bindings(api, names):
    """The (Cluster)Roles of those names and the bindings the roles' templates give the same names."""
    for name in names:
        for kind, namespace in (('ClusterRole', None), ('ClusterRoleBinding', None),
                                ('Role', NFD_NAMESPACE), ('RoleBinding', NFD_NAMESPACE)):
            if api.exists(RBAC, kind, name, namespace):
                api.delete(RBAC, kind, name, namespace)


@pytest.mark.parametrize('index', [i for i, r in enumerate(SHIPPED_RULES) if r['resources'][0] not in NOT_IN_THE_LAB],
                         ids=[_rule_id(r) for r in SHIPPED_RULES if r['resources'][0] not in NOT_IN_THE_LAB])
def test_without_one_rule_the_playbook_that_needs_it_fails_naming_it(fixed, index):
    rule = SHIPPED_RULES[index]
    by_playbook = _passing_requests(fixed)
    playbook = next(p for p in PLAYBOOKS if any(_covers(rule, e) for e in by_playbook.get(p, [])))
    variables = {'gpuready.nvidia.doctor': {}, 'gpuready.nvidia.validate': {},
                 CLUSTER_ROLES: {}, 'gpuready.nvidia.site': fixed.site_vars}[playbook]
    if rule.get('resourceNames'):
        # kube-apiserver checks escalate and bind only where a write changes the role or binding
        # (IsOnlyMutatingGCFields lets an unchanged one through): the run must create them again
        _delete_roles_and_bindings(fixed.api, rule['resourceNames'])
    fixed.deployer.grant(SHIPPED_RULES[:index] + SHIPPED_RULES[index + 1:])
    started = time.time()
    try:
        proc = _playbook(fixed.lab, fixed.work, playbook, variables, limit=HOST, check=False)
    finally:
        fixed.deployer.grant(SHIPPED_RULES)
        if rule.get('resourceNames'):
            _playbook(fixed.lab, fixed.work, CLUSTER_ROLES, {}, limit=HOST)  # the roles and bindings back
    refused = [e for e in fixed.deployer.requests() if e['code'] == 403 and e['time'] >= started]
    assert proc.returncode != 0 and refused, proc.stdout[-6000:]
    # The failed task quotes the API's refusal (through one or more layers of JSON quoting)
    failure = '\n'.join(line for line in proc.stdout.splitlines() if line.startswith(('fatal:', 'failed:')))
    failure = failure.replace('\\', '')
    first = refused[0]
    named = first['resource'] + ('/' + first['subresource'] if first.get('subresource') else '')
    if rule.get('resourceNames'):
        assert 'is attempting to grant RBAC permissions not currently held' in failure, failure[-4000:]
    else:
        assert 'cannot %s resource "%s"' % (first['verb'], named) in failure, (first, failure[-4000:])
    assert 'Traceback' not in failure
