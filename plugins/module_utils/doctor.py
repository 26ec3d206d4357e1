# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The doctor: per node, the first broken link between the driver and a schedulable GPU pod.

Plain Python, no Ansible. ``diagnose`` judges one node from two dicts: what the node said
(module_utils/doctor_node.py, through the gpu_node_evidence module) and what the API says
(``api_evidence``, read here with the kubernetes client). The links are checked in ``LINKS`` order
and the first broken one stops the chain: the links after it are ``not_checked``. Every finding
carries a cause from ``CAUSES`` (the documented vocabulary), the evidence it saw, quoted, and the fix.
README.md ("Troubleshooting") lists the causes. Every read goes through ``k8s.api.call_api`` (its
retries of 5xx, 429 and dropped connections; its messages).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import re

from ansible_collections.gpuready.nvidia.plugins.module_utils import containerd_config as cc
from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s.api import (
    ApiError, ListWatchError, call_api, list_all, read_object)
from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s.pods import waiting_reason
from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s.workloads import (
    DEVICE_PLUGIN, GFD, NFD_MASTER, classify, gpu_requests, owner_daemonset, placement_problem)

LINKS = ('driver', 'nvml', 'device_nodes', 'toolkit', 'containerd_config', 'containerd_runtime_loaded',
         'runtime_class', 'plugin_scheduled', 'plugin_running', 'kubelet_registration', 'capacity',
         'allocatable', 'labels', 'workload')
OK, BROKEN, NOT_CHECKED, NOT_APPLICABLE = 'ok', 'broken', 'not_checked', 'not_applicable'

# cause -> (link, what it means, the fix). Fixes name a command or a variable of this collection.
CAUSES = {
    'node_not_inspected': ('driver', 'the node evidence could not be read (unreachable host or failed module)',
                           'make the host reachable for Ansible (inventory, SSH, become) and run the doctor again'),
    'no_nvidia_gpu': ('driver', 'no NVIDIA PCI device (vendor 0x10de) on the node',
                      'check the inventory group: this host has no NVIDIA GPU'),
    'nouveau_loaded': ('driver', 'the nouveau driver owns the GPUs',
                       'blacklist nouveau in /etc/modprobe.d, rebuild the initramfs (update-initramfs -u) and reboot'),
    'nvidia_module_not_loaded': ('driver', 'the nvidia kernel module is not loaded',
                                 'modprobe nvidia; if it fails, install the headers for `uname -r` and rebuild the '
                                 'module (dkms autoinstall), or use signed/precompiled driver packages (Secure Boot)'),
    'pynvml_missing': ('nvml', 'the node\'s Python cannot import pynvml (nvidia-ml-py)',
                       'run playbooks/site.yml (role node_python) or install nvidia-ml-py for the interpreter'),
    'nvml_library_missing': ('nvml', 'libnvidia-ml.so.1 cannot be loaded: the driver\'s user-space part is missing',
                             'install the driver\'s utility/NVML package (libnvidia-ml) matching the kernel module'),
    'driver_library_version_mismatch': ('nvml', 'the loaded kernel module and the NVML library differ in version',
                                        'reboot (or unload and reload the nvidia modules); hold the driver packages '
                                        '(apt-mark hold / dnf versionlock) against unattended upgrades'),
    'nvml_init_failed': ('nvml', 'NVML does not initialise', 'read the NVML error; `nvidia-smi` on the node shows it'),
    'gpus_missing_from_nvml': ('nvml', 'NVML sees fewer GPUs than the PCI bus has',
                               'check `dmesg | grep -i xid` and `nvidia-smi -q`; reset or repair the missing GPU'),
    'device_nodes_missing': ('device_nodes', '/dev/nvidiactl or a /dev/nvidia<N> is missing',
                             'nvidia-ctk system create-device-nodes --control-devices --load-kernel-modules'),
    'nvidia_uvm_missing': ('device_nodes', '/dev/nvidia-uvm is missing: nvidia_uvm not loaded',
                           'modprobe nvidia-uvm (add it to /etc/modules-load.d) or nvidia-modprobe -u -c=0'),
    'toolkit_not_installed': ('toolkit', 'the NVIDIA Container Toolkit is not installed',
                              'run playbooks/site.yml (role container_toolkit, gpuready_container_toolkit_version)'),
    'runtime_binary_missing': ('toolkit', 'the nvidia runtime\'s BinaryName is not an executable file',
                               'install nvidia-container-toolkit (role container_toolkit) or correct BinaryName'),
    'containerd_config_invalid': ('containerd_config', 'containerd\'s config file is not valid TOML',
                                  'fix the line the parser names; containerd refuses to start with it'),
    'cri_plugin_disabled': ('containerd_config', 'disabled_plugins switches the CRI plugin off',
                            'remove "cri" from disabled_plugins (containerd_nvidia_runtime refuses such a file)'),
    'nvidia_runtime_not_configured': ('containerd_config', 'containerd\'s config declares no nvidia runtime',
                                      'run playbooks/site.yml (role containerd_runtime) or '
                                      'nvidia-ctk runtime configure --runtime=containerd --set-as-default'),
    'runtime_in_wrong_table': ('containerd_config', 'the nvidia runtime is in a table this config version or '
                               'containerd does not read',
                               'containerd_nvidia_runtime writes the table of the file\'s version; version 2: '
                               'io.containerd.grpc.v1.cri, version 3: io.containerd.cri.v1.runtime'),
    'systemd_cgroup_mismatch': ('containerd_config', 'the nvidia runtime\'s SystemdCgroup disagrees with the '
                                'kubelet\'s cgroupDriver',
                                'containerd_nvidia_runtime with systemd_cgroup matching the kubelet (it reads '
                                '/var/lib/kubelet/config.yaml), then restart containerd'),
    'containerd_not_running': ('containerd_runtime_loaded', 'the containerd service is not active',
                               'systemctl start containerd; journalctl -u containerd says why it stopped'),
    'cri_unreachable': ('containerd_runtime_loaded', 'containerd runs but its CRI socket does not answer',
                        'check the socket path (k3s/RKE2: /run/k3s/containerd/containerd.sock) and '
                        'journalctl -u containerd'),
    'containerd_not_restarted': ('containerd_runtime_loaded', 'the config file says something the running '
                                 'containerd has not loaded',
                                 'systemctl restart containerd (the containerd_runtime role restarts it when needed)'),
    'runtime_not_loaded': ('containerd_runtime_loaded', 'the running containerd lacks the nvidia runtime its config '
                           'declares, and the file is older than the service: another config or instance',
                           'check `containerd config dump`, the imports, and which containerd the kubelet uses'),
    'default_runtime_not_nvidia': ('runtime_class', 'runc is containerd\'s default and the device plugin has no '
                                   'runtimeClassName, so it gets no driver',
                                   'gpuready_set_as_default: true (nvidia-ctk ... --set-as-default), or false, '
                                   'which deploys RuntimeClass nvidia and sets runtimeClassName'),
    'runtime_class_missing': ('runtime_class', 'the device plugin names a RuntimeClass that does not exist',
                              'create it (role device_plugin with gpuready_set_as_default: false)'),
    'runtime_class_handler_unknown': ('runtime_class', 'the RuntimeClass handler is not a runtime of the running '
                                      'containerd', 'set handler: nvidia, or configure that runtime in containerd'),
    'node_not_registered': ('plugin_scheduled', 'no Node of that name in the API: the kubelet has not registered it, '
                            'or gpuready_node_name is not the Node name',
                            'set gpuready_node_name (or k8s_node_name) to the name `kubectl get nodes` shows'),
    'device_plugin_not_deployed': ('plugin_scheduled', 'no NVIDIA device plugin DaemonSet in the cluster',
                                   'run playbooks/site.yml (role device_plugin)'),
    'two_device_plugins': ('plugin_scheduled', 'two NVIDIA device plugins target the node: they fight over '
                           'kubelet registration', 'keep one: remove the other DaemonSet (the device_plugin role '
                           'refuses to deploy beside a foreign one unless device_plugin_existing: replace)'),
    'plugin_affinity_no_match': ('plugin_scheduled', 'the device plugin\'s nodeSelector/affinity does not match the '
                                 'node\'s labels', 'label the node nvidia.com/gpu.present=true (role '
                                 'node_labels) or deploy NFD so feature.node.kubernetes.io/pci-10de.present is set'),
    'taint_not_tolerated': ('plugin_scheduled', 'the node has a taint the device plugin does not tolerate',
                            'add a toleration (device_plugin_tolerations) or remove the taint'),
    'plugin_pod_not_created': ('plugin_scheduled', 'the DaemonSet targets the node but has no pod there',
                               'read the DaemonSet events (PodSecurity: label the namespace '
                               'pod-security.kubernetes.io/enforce=privileged)'),
    'plugin_image_pull_failed': ('plugin_running', 'the device plugin image cannot be pulled',
                                 'gpuready_registry for a mirror, or import the image on air-gapped nodes'),
    'runtime_handler_not_configured': ('plugin_running', 'the pod sandbox names a runtime handler containerd does '
                                       'not have', 'configure the runtime and restart containerd'),
    'plugin_nvml_load_failed': ('plugin_running', 'the device plugin cannot load NVML inside its container',
                                'make nvidia containerd\'s default runtime or give the plugin its RuntimeClass, '
                                'then delete the plugin pod'),
    'plugin_crashing': ('plugin_running', 'the device plugin container keeps exiting',
                        'read its log (kubectl logs --previous)'),
    'plugin_not_ready': ('plugin_running', 'the device plugin pod is not ready', 'read its log and events'),
    'kubelet_socket_missing': ('kubelet_registration', 'no kubelet.sock in the device-plugins folder the plugin '
                               'uses: the kubelet root dir differs',
                               'mount the kubelet\'s real <root-dir>/device-plugins into the plugin'),
    'plugin_not_registered': ('kubelet_registration', 'the device plugin serves no socket in the kubelet\'s '
                              'device-plugins folder', 'delete the device plugin pod so it registers again'),
    'no_gpu_capacity': ('kubelet_registration', 'the node advertises no nvidia.com resource',
                        'read the device plugin log for its registration with the kubelet'),
    'sharing_renamed_resource': ('capacity', 'sharing renames the resource (renameByDefault), so nvidia.com/gpu '
                                 'is not what the node advertises',
                                 'request the .shared resource, or gpuready_sharing.rename_by_default: false'),
    'mig_strategy_mismatch': ('capacity', 'the MIG resources do not match gpuready_mig_strategy',
                              'use one migStrategy for the plugin and GFD (gpuready_mig_strategy)'),
    'capacity_mismatch': ('capacity', 'the node advertises a different number of GPUs than its GPUs give',
                          'check sharing replicas (gpuready_sharing) and GPU health'),
    'gpus_unhealthy': ('allocatable', 'allocatable is below capacity: the plugin marked GPUs unhealthy, or it '
                       'stopped', 'look for Xid errors (dmesg | grep -i xid); drain and reset or repair the GPU'),
    'gfd_not_deployed': ('labels', 'no GPU Feature Discovery: the node has no nvidia.com/gpu.* labels',
                         'run playbooks/site.yml (role feature_discovery) or label nodes (role node_labels)'),
    'nfd_not_deployed': ('labels', 'GFD runs but no NFD master turns its features into labels',
                         'deploy NFD (feature_discovery_deploy_nfd: true)'),
    'gpu_labels_missing': ('labels', 'GFD and NFD run but the node lacks nvidia.com/gpu.product',
                           'read the GFD pod log on the node'),
    'gpu_labels_stale': ('labels', 'nvidia.com/gpu.count or mig.strategy disagrees with the GPUs or settings',
                         'restart GFD on the node; one gpuready_mig_strategy for the plugin and GFD'),
    'gpu_request_unschedulable': ('workload', 'a pod requesting GPUs cannot be scheduled',
                                  'request no more than a node\'s allocatable GPUs, free GPUs, or check selectors'),
    'workload_failed': ('workload', 'a pod requesting GPUs failed on the node',
                        'read the pod\'s log and events'),
    'test_pod_failed': ('workload', 'the doctor\'s test pod did not run nvidia-smi', 'read the evidence'),
}

NVML_LOG_RE = re.compile(r'.*(could not load NVML|Failed to initialize NVML|Incompatible strategy detected|'
                         r'invalid device discovery strategy).*')
UNHEALTHY_LOG_RE = re.compile(r'.*unhealthy.*', re.IGNORECASE)
PULL_REASONS = ('ErrImagePull', 'ImagePullBackOff', 'InvalidImageName', 'ErrImageNeverPull')
LOG_TAIL_LINES = 50
RECENT_PODS = 20  # GPU-requesting pods looked at per node by the workload link


class DoctorError(Exception):
    """The API refused or could not answer; the message says what was asked, never credentials."""


class Finding(Exception):
    """A broken link: raised by a check, so the first one stops the chain."""

    def __init__(self, cause, evidence, fix=None):
        super(Finding, self).__init__(cause)
        self.cause = cause
        self.evidence = [evidence] if isinstance(evidence, str) else list(evidence)
        self.fix = fix or CAUSES[cause][2]


class NotApplicable(Exception):
    """The link does not apply to this node (runtime_class when nvidia is containerd's default)."""


# ---------------------------------------------------------------- reading the API

def _pod_log(core, pod, previous=False):
    meta = pod['metadata']
    try:
        response = call_api('reading the log of pod %s/%s' % (meta['namespace'], meta['name']),
                            core.read_namespaced_pod_log, meta['name'], meta['namespace'], tail_lines=LOG_TAIL_LINES,
                            previous=previous, _preload_content=False)
    except ApiError as exc:
        if exc.status in (401, 403):
            raise  # without the permission nothing it could not read may be judged ok
        return ''  # a log that cannot be read (not started, no previous one) is no evidence; the rest still is
    try:
        return response.data.decode('utf-8', 'replace')
    finally:
        response.release_conn()


def _events(core, obj):
    meta = obj['metadata']
    selector = 'involvedObject.name=%s' % meta['name']
    namespace = meta.get('namespace') or 'default'
    try:
        return list_all('listing the events of %s/%s' % (namespace, meta['name']), core.list_namespaced_event,
                    namespace=namespace, field_selector=selector)
    except ApiError as exc:
        if exc.status in (401, 403):
            raise
        return []


def api_evidence(core, apps, node_api, node_names):
    """{cluster: {...}, nodes: {name: {...}}}: what the API says, read once for all nodes."""
    try:
        cluster = {
            'daemonsets': list_all('listing DaemonSets in all namespaces', apps.list_daemon_set_for_all_namespaces),
            'deployments': list_all('listing Deployments in all namespaces', apps.list_deployment_for_all_namespaces),
            'runtime_classes': list_all('listing RuntimeClasses', node_api.list_runtime_class),
            'namespaces': {},
            'events': {},
        }
        for ds in cluster['daemonsets']:
            if classify(ds) == DEVICE_PLUGIN:
                namespace = ds['metadata']['namespace']
                if namespace not in cluster['namespaces']:
                    cluster['namespaces'][namespace] = read_object('reading namespace %s' % namespace, core.read_namespace,
                                                             namespace)
                cluster['events']['%s/%s' % (namespace, ds['metadata']['name'])] = _events(core, ds)
        pending = [p for p in list_all('listing pending pods', core.list_pod_for_all_namespaces,
                                   field_selector='status.phase=Pending')
                   if gpu_requests(p) and not (p.get('spec') or {}).get('nodeName')]
        for pod in pending[:RECENT_PODS]:
            pod['events'] = _events(core, pod)
        cluster['unscheduled_gpu_pods'] = pending
        nodes = {}
        for name in node_names:
            node = read_object('reading node %s' % name, core.read_node, name, missing_ok=True)
            pods = list_all('listing the pods on node %s' % name, core.list_pod_for_all_namespaces,
                        field_selector='spec.nodeName=%s' % name)
            for pod in pods:
                component = classify(pod)
                if component == DEVICE_PLUGIN or (gpu_requests(pod) and component is None):
                    restarted = any(s.get('restartCount') for s in (pod.get('status') or {}).get('containerStatuses') or [])
                    pod['log'] = _pod_log(core, pod)
                    pod['previous_log'] = _pod_log(core, pod, previous=True) if restarted else ''
                    pod['events'] = _events(core, pod)
            nodes[name] = {'node': node, 'pods': pods}
        cluster['nodes'] = nodes
        return cluster
    except (ApiError, ListWatchError) as exc:
        raise DoctorError(str(exc))


# ---------------------------------------------------------------- the checks, one per link

class _Node(object):
    """One node's evidence and the settings it is judged against."""

    def __init__(self, name, host, api, expected, settings):
        self.name = name
        self.host = host
        self.api = api
        self.node = api['nodes'].get(name, {}).get('node')
        self.pods = api['nodes'].get(name, {}).get('pods') or []
        self.expected = expected or {}
        self.runtime_name = settings.get('runtime_name') or 'nvidia'
        self.mig_strategy = settings.get('mig_strategy') or 'none'
        self.parsed = {}  # config path -> plain data or ConfigError (_parsed)
        # device_nodes() keys its answer by the paths it looked at, under the node's /dev
        self.dev_root = os.path.dirname(next(iter(host['gpu']['device_nodes']), '/dev/x')) if host else '/dev'

    @property
    def gpu(self):
        return self.host['gpu']

    @property
    def containerd(self):
        return self.host['containerd']

    def plugin_daemonsets(self):
        return [ds for ds in self.api['daemonsets'] if classify(ds) == DEVICE_PLUGIN]

    def plugin_pods(self):
        return [p for p in self.pods if classify(p) == DEVICE_PLUGIN
                and not (p.get('metadata') or {}).get('deletionTimestamp')]


def _ds_name(ds):
    return '%s/%s' % (ds['metadata']['namespace'], ds['metadata']['name'])


def check_driver(n):
    if n.host is None:
        raise Finding('node_not_inspected', 'no node evidence for %s' % n.name)
    module = n.gpu['kernel_module']
    if module.get('nouveau_loaded'):
        raise Finding('nouveau_loaded', 'the nouveau module is loaded (<sysfs>/module/nouveau exists)')
    if not n.gpu.get('present'):
        raise Finding('no_nvidia_gpu', 'no PCI device with vendor 0x10de under <sysfs>/bus/pci/devices')
    if not module.get('loaded'):
        raise Finding('nvidia_module_not_loaded', 'the nvidia module is not loaded (<sysfs>/module/nvidia is missing)')


def check_nvml(n):
    gpu = n.gpu
    if not n.host['pynvml']['present']:
        raise Finding('pynvml_missing', 'import pynvml: %s' % n.host['pynvml']['error'])
    error = gpu.get('error') or ''
    kernel = n.gpu['kernel_module'].get('version')
    if 'versions differ' in error or (gpu.get('nvml_ok') and kernel and gpu.get('driver_version')
                                      and kernel != gpu['driver_version']):
        raise Finding('driver_library_version_mismatch', error or 'kernel module %s, NVML library %s'
                      % (kernel, gpu['driver_version']))
    if error.startswith('NVML library not found'):
        raise Finding('nvml_library_missing', error)
    if not gpu.get('nvml_ok'):
        raise Finding('nvml_init_failed', error)
    pci = len(n.host['pci_gpus'])
    if gpu['count'] < pci:
        raise Finding('gpus_missing_from_nvml', 'NVML counts %d GPUs, PCI has %d' % (gpu['count'], pci))


def check_device_nodes(n):
    nodes = n.gpu['device_nodes']
    # /dev/nvidia<minor> for each GPU NVML counts (the minor number where NVML gives it)
    minors = [d.get('minor_number') for d in n.gpu.get('devices') or []]
    wanted = ['/dev/nvidia%d' % (m if m is not None else i) for i, m in enumerate(minors)]
    wanted = [os.path.join(n.dev_root, os.path.basename(p)) for p in ['/dev/nvidiactl'] + wanted]
    missing = [p for p in wanted if not nodes.get(p, {}).get('exists')]
    if missing:
        raise Finding('device_nodes_missing', '%s does not exist (%d GPUs)' % (', '.join(missing), n.gpu['count']))
    uvm = os.path.join(n.dev_root, 'nvidia-uvm')
    if not nodes.get(uvm, {}).get('exists'):
        raise Finding('nvidia_uvm_missing', '%s does not exist' % uvm)


def _parsed(n, entry):
    """The entry's TOML as plain data, parsed once per node (tomlkit is slow on big files); a
    ConfigError is raised again on every call."""
    if entry['path'] not in n.parsed:
        try:
            n.parsed[entry['path']] = cc.plain(cc.parse(entry['text'], entry['path']))
        except cc.ConfigError as exc:
            n.parsed[entry['path']] = exc
    found = n.parsed[entry['path']]
    if isinstance(found, cc.ConfigError):
        raise found
    return found


def _runtime_tables(doc, runtime_name):
    """[(cri table name, ctr table, runtime table)] for every CRI table holding the runtime."""
    found = []
    plugins = doc.get('plugins') or {}
    for name in cc.CRI_TABLES:
        ctr = (plugins.get(name) or {}).get('containerd') or {}
        runtime = (ctr.get('runtimes') or {}).get(runtime_name)
        if runtime is not None:
            found.append((name, ctr, runtime))
    return found


def _line(text, pattern):
    """The first line of text matching a regex, stripped (the evidence quotes it)."""
    for line in (text or '').splitlines():
        if re.search(pattern, line):
            return line.strip()
    return None


def _config_files(n):
    return [e for e in [n.containerd['config']] + n.containerd['drop_ins'] if e['text'] is not None]


def _file_runtime(n):
    """(path, text, version, cri table, ctr, runtime) of the file that declares the nvidia runtime, or None."""
    for entry in _config_files(n):
        doc = _parsed(n, entry)
        version = doc.get('version', 1) if doc else 2
        for table, ctr, runtime in _runtime_tables(doc, n.runtime_name):
            return entry['path'], entry['text'], version, table, ctr, runtime
    return None


def check_toolkit(n):
    binaries = n.host['executables']
    try:
        found = _file_runtime(n)
    except cc.ConfigError:
        found = None  # containerd_config names it
    binary = ((found[5].get('options') or {}).get('BinaryName') if found else None)
    if binary:
        if not binaries.get(binary):
            raise Finding('runtime_binary_missing', '%s: %s, which is not an executable file on the node'
                          % (found[0], _line(found[1], r'BinaryName') or 'BinaryName = "%s"' % binary))
        return
    if not any(binaries.get(path) for path in ('/usr/bin/nvidia-container-runtime', '/usr/bin/nvidia-ctk')):
        raise Finding('toolkit_not_installed', 'neither /usr/bin/nvidia-container-runtime nor /usr/bin/nvidia-ctk '
                      'exists on the node')


def _kubelet_cgroup_driver(n):
    text = n.host['kubelet']['config']['text']
    if text is None:
        return None, None
    line = _line(text, r'^cgroupDriver\s*:')
    driver = line.split(':', 1)[1].strip().strip('"\'') if line else 'cgroupfs'
    return driver, line or 'no cgroupDriver (the kubelet default, cgroupfs)'


def _containerd_major(n):
    cri = n.containerd.get('cri') or {}
    match = re.match(r'v?(\d+)\.', cri.get('runtime_version') or '')
    return int(match.group(1)) if match else None


def check_containerd_config(n):
    config = n.containerd['config']
    for entry in _config_files(n):
        try:
            _parsed(n, entry)
        except cc.ConfigError as exc:
            raise Finding('containerd_config_invalid', str(exc))
        if cc.cri_disabled(entry['text']):
            raise Finding('cri_plugin_disabled', '%s: %s' % (entry['path'], _line(entry['text'], r'^disabled_plugins')))
    found = _file_runtime(n)
    if found is None:
        raise Finding('nvidia_runtime_not_configured', '%s: no [plugins.*.containerd.runtimes.%s] table'
                      % (config['path'], n.runtime_name) if config['exists'] else
                      '%s does not exist (containerd runs on its defaults)' % config['path'])
    path, text, version, table, _ctr, runtime = found
    major = _containerd_major(n)
    implied = cc.CRI_TABLE_BY_VERSION.get(version)
    header = _line(text, r'runtimes\.%s\]' % re.escape(n.runtime_name)) or table
    if table != implied:
        raise Finding('runtime_in_wrong_table', '%s (version = %s) declares %s; that version reads plugins."%s"'
                      % (path, version, header, implied))
    if major is not None and major < 2 and version >= 3:
        raise Finding('runtime_in_wrong_table', '%s is a version %d config (%s); containerd %s ignores it'
                      % (path, version, header, (n.containerd['cri'] or {}).get('runtime_version')))
    driver, driver_line = _kubelet_cgroup_driver(n)
    if driver is not None:
        systemd = bool((runtime.get('options') or {}).get('SystemdCgroup', False))
        if systemd != (driver == 'systemd'):
            raise Finding('systemd_cgroup_mismatch', [
                '%s: %s' % (path, _line(text, r'SystemdCgroup') or 'no SystemdCgroup in the %s runtime (false)'
                            % n.runtime_name),
                '%s: %s' % (n.host['kubelet']['config']['path'], driver_line)])


def check_containerd_runtime_loaded(n):
    service = n.containerd['service']
    if service['active_state'] != 'active':
        raise Finding('containerd_not_running', 'systemctl: %s is %s' % (service['name'], service['active_state']))
    cri = n.containerd.get('cri')
    if cri is None:
        raise Finding('cri_unreachable', n.containerd.get('cri_error') or 'no CRI status')
    path, text, _version, _table, ctr, _runtime = _file_runtime(n)
    newer = [f for f in n.containerd['config_files'] if f['exists'] and service['started_at'] is not None
             and f['mtime'] > service['started_at']]
    loaded = sorted(cri['runtimes'])
    if n.runtime_name not in cri['runtimes']:
        cause = 'containerd_not_restarted' if newer else 'runtime_not_loaded'
        raise Finding(cause, ['%s declares runtime %r' % (path, n.runtime_name),
                              'CRI status: runtimes %s' % ', '.join(loaded)] + _newer_evidence(newer, service))
    file_default = ctr.get('default_runtime_name') or 'runc'
    running_default = cri.get('default_runtime_name') or 'runc'
    if file_default != running_default:
        raise Finding('containerd_not_restarted', [
            '%s: %s' % (path, _line(text, r'default_runtime_name') or 'no default_runtime_name (runc)'),
            'CRI status: defaultRuntimeName = %r' % running_default] + _newer_evidence(newer, service))


def _newer_evidence(newer, service):
    return ['%s changed %d s after %s started' % (f['path'], f['mtime'] - service['started_at'], service['name'])
            for f in newer]


def check_runtime_class(n):
    cri = n.containerd['cri']
    default = cri.get('default_runtime_name') or 'runc'
    if default == n.runtime_name:
        raise NotApplicable()
    classes = dict((rc['metadata']['name'], rc) for rc in n.api['runtime_classes'])
    plugins = n.plugin_daemonsets()
    for ds in plugins:
        name = ((ds['spec'].get('template') or {}).get('spec') or {}).get('runtimeClassName')
        if not name:
            raise Finding('default_runtime_not_nvidia', [
                'CRI status: defaultRuntimeName = %r' % default,
                'DaemonSet %s has no spec.template.spec.runtimeClassName' % _ds_name(ds)])
        _check_runtime_class(n, classes, name, 'DaemonSet %s' % _ds_name(ds))
    if not plugins:
        if not any(rc.get('handler') == n.runtime_name for rc in classes.values()):
            raise Finding('default_runtime_not_nvidia', [
                'CRI status: defaultRuntimeName = %r' % default,
                'no RuntimeClass has handler %r' % n.runtime_name])


def _check_runtime_class(n, classes, name, user):
    if name not in classes:
        raise Finding('runtime_class_missing', '%s has runtimeClassName %r; RuntimeClass %r does not exist'
                      % (user, name, name))
    handler = classes[name].get('handler')
    if handler not in n.containerd['cri']['runtimes']:
        raise Finding('runtime_class_handler_unknown', ['RuntimeClass %s: handler %r' % (name, handler),
                                                        'CRI status: runtimes %s'
                                                        % ', '.join(sorted(n.containerd['cri']['runtimes']))])


def check_plugin_scheduled(n):
    if n.node is None:
        raise Finding('node_not_registered', 'GET /api/v1/nodes/%s: 404 Not Found' % n.name)
    plugins = n.plugin_daemonsets()
    if not plugins:
        raise Finding('device_plugin_not_deployed', 'no DaemonSet in any namespace runs the k8s-device-plugin image '
                      'or nvidia-device-plugin')
    owners = sorted(set(owner_daemonset(p) or p['metadata']['name'] for p in n.plugin_pods()))
    targeting = [ds for ds in plugins if placement_problem(ds['spec']['template']['spec'], n.node) is None]
    if len(owners) > 1 or len(targeting) > 1:
        raise Finding('two_device_plugins', 'device plugin DaemonSets targeting %s: %s' % (
            n.name, ', '.join(_ds_name(ds) for ds in targeting) or ', '.join(owners)))
    if n.plugin_pods():
        return
    if not targeting:
        ds = plugins[0]
        kind, why = placement_problem(ds['spec']['template']['spec'], n.node)
        raise Finding('plugin_affinity_no_match' if kind == 'affinity' else 'taint_not_tolerated',
                      'DaemonSet %s: %s' % (_ds_name(ds), why))
    ds = targeting[0]
    namespace = n.api['namespaces'].get(ds['metadata']['namespace']) or {}
    enforce = ((namespace.get('metadata') or {}).get('labels') or {}).get('pod-security.kubernetes.io/enforce')
    events = ['%s: %s' % (e.get('reason'), e.get('message')) for e in n.api['events'].get(_ds_name(ds), [])
              if e.get('type') == 'Warning']
    evidence = ['DaemonSet %s: desired %s, current %s; no pod on %s' % (
        _ds_name(ds), (ds.get('status') or {}).get('desiredNumberScheduled'),
        (ds.get('status') or {}).get('currentNumberScheduled'), n.name)] + events[-3:]
    if enforce and enforce != 'privileged':
        evidence.append('namespace %s: pod-security.kubernetes.io/enforce=%s' % (ds['metadata']['namespace'], enforce))
    raise Finding('plugin_pod_not_created', evidence)


def _log_line(pod, regex):
    for text in (pod.get('log') or '', pod.get('previous_log') or ''):
        for line in reversed(text.splitlines()):
            if regex.match(line):
                return line.strip()
    return None


def check_plugin_running(n):
    pod = n.plugin_pods()[0]
    name = '%s/%s' % (pod['metadata']['namespace'], pod['metadata']['name'])
    status = pod.get('status') or {}
    for event in pod.get('events') or []:
        message = event.get('message') or ''
        if event.get('reason') == 'FailedCreatePodSandBox' and ('no runtime for' in message or 'handler' in message):
            raise Finding('runtime_handler_not_configured', 'pod %s event FailedCreatePodSandBox: %s' % (name, message))
    container = (status.get('containerStatuses') or [{}])[0]
    waiting = (container.get('state') or {}).get('waiting') or {}
    if waiting.get('reason') in PULL_REASONS:
        raise Finding('plugin_image_pull_failed', 'pod %s: %s: %s (image %s)' % (
            name, waiting['reason'], waiting.get('message') or '', container.get('image')))
    nvml_line = _log_line(pod, NVML_LOG_RE)
    if nvml_line:
        raise Finding('plugin_nvml_load_failed', 'pod %s log: %s' % (name, nvml_line))
    if waiting.get('reason') == 'CrashLoopBackOff' or (container.get('state') or {}).get('terminated'):
        last = (pod.get('previous_log') or pod.get('log') or '').strip().splitlines()
        raise Finding('plugin_crashing', 'pod %s: %s; last log line: %s' % (
            name, waiting_reason(pod), last[-1] if last else '(empty)'))
    if status.get('phase') != 'Running' or not container.get('ready'):
        raise Finding('plugin_not_ready', 'pod %s: %s' % (name, waiting_reason(pod)))


def _nvidia_resources(status, key):
    return dict((k, int(v)) for k, v in ((status or {}).get(key) or {}).items() if k.startswith('nvidia.com/'))


def check_kubelet_registration(n):
    folder = n.host['kubelet']['device_plugins']
    if not folder['exists'] or 'kubelet.sock' not in folder['sockets']:
        raise Finding('kubelet_socket_missing', '%s: %s' % (
            folder['dir'], 'sockets %s, no kubelet.sock' % folder['sockets'] if folder['exists'] else 'does not exist'))
    # The plugin serves one socket per resource, nvidia-<name>.sock (nvidia-gpu.sock, nvidia-gpu.shared.sock,
    # nvidia-mig-1g.10gb.sock); a stale one of an earlier plugin does not stand for the expected resource.
    wanted = sorted('nvidia-%s.sock' % r.split('/', 1)[1] for r in n.expected)
    present = [s for s in folder['sockets'] if s.startswith('nvidia')]
    missing = [w for w in wanted if w not in present] if wanted else ([] if present else ['nvidia*.sock'])
    if missing:
        raise Finding('plugin_not_registered', '%s holds %s and no %s' % (
            folder['dir'], ', '.join(folder['sockets']), ', '.join(missing)))
    if not _nvidia_resources((n.node or {}).get('status'), 'capacity'):
        raise Finding('no_gpu_capacity', 'Node %s status.capacity has no nvidia.com/ resource' % n.name)


def check_capacity(n):
    capacity = _nvidia_resources(n.node['status'], 'capacity')
    expected = dict((k, int(v)) for k, v in n.expected.items())
    if not expected:
        return
    seen = ', '.join('%s: %d' % item for item in sorted(capacity.items()))
    for resource, count in sorted(expected.items()):
        if resource not in capacity:
            shared = resource + '.shared'
            if shared in capacity:
                cause = 'sharing_renamed_resource'
            elif any('mig-' in k for k in list(capacity) + [resource]):
                cause = 'mig_strategy_mismatch'
            else:
                cause = 'capacity_mismatch'
            raise Finding(cause, 'Node %s status.capacity: %s; expected %s: %d' % (n.name, seen, resource, count))
        if capacity[resource] != count:
            raise Finding('capacity_mismatch', 'Node %s status.capacity %s: %d; expected %d (%d GPUs)' % (
                n.name, resource, capacity[resource], count, n.gpu['count']))


def check_allocatable(n):
    capacity = _nvidia_resources(n.node['status'], 'capacity')
    allocatable = _nvidia_resources(n.node['status'], 'allocatable')
    for resource in sorted(set(n.expected) or set(capacity)):
        if allocatable.get(resource, 0) < capacity.get(resource, 0):
            evidence = ['Node %s %s: capacity %d, allocatable %d' % (
                n.name, resource, capacity[resource], allocatable.get(resource, 0))]
            for pod in n.plugin_pods():
                line = _log_line(pod, UNHEALTHY_LOG_RE)
                if line:
                    evidence.append('device plugin log: %s' % line)
            raise Finding('gpus_unhealthy', evidence)


def check_labels(n):
    labels = (n.node.get('metadata') or {}).get('labels') or {}
    if 'nvidia.com/gpu.product' not in labels:
        gfd = [ds for ds in n.api['daemonsets'] if classify(ds) == GFD]
        evidence = 'Node %s has no label nvidia.com/gpu.product' % n.name
        if not gfd:
            raise Finding('gfd_not_deployed', [evidence, 'no DaemonSet runs gpu-feature-discovery'])
        masters = [obj for obj in n.api['daemonsets'] + n.api['deployments'] if classify(obj) == NFD_MASTER]
        if not masters:
            raise Finding('nfd_not_deployed', [evidence, 'GFD %s runs, but no nfd-master' % _ds_name(gfd[0])])
        raise Finding('gpu_labels_missing', evidence)
    count = labels.get('nvidia.com/gpu.count')
    if count is not None and n.gpu['nvml_ok'] and count != str(n.gpu['count']):
        raise Finding('gpu_labels_stale', 'label nvidia.com/gpu.count=%s; NVML counts %d' % (count, n.gpu['count']))
    strategy = labels.get('nvidia.com/mig.strategy')
    if strategy is not None and strategy != n.mig_strategy and n.mig_strategy != 'none':
        raise Finding('gpu_labels_stale', 'label nvidia.com/mig.strategy=%s; gpuready_mig_strategy is %s'
                      % (strategy, n.mig_strategy))


def check_workload(n, test_result=None):
    for pod in n.api['unscheduled_gpu_pods']:
        if placement_problem(pod['spec'], n.node) is not None:
            continue  # it could not go here anyway
        messages = [e.get('message') for e in pod.get('events') or [] if e.get('reason') == 'FailedScheduling']
        conditions = [c.get('message') for c in (pod.get('status') or {}).get('conditions') or []
                      if c.get('type') == 'PodScheduled' and c.get('status') == 'False']
        if messages or conditions:
            raise Finding('gpu_request_unschedulable', 'pod %s/%s requests %s: %s' % (
                pod['metadata']['namespace'], pod['metadata']['name'], json.dumps(gpu_requests(pod), sort_keys=True),
                (messages or conditions)[-1]))
    for pod in n.pods:
        if not gpu_requests(pod) or classify(pod) is not None:
            continue
        status = pod.get('status') or {}
        if status.get('phase') == 'Failed':
            line = _log_line(pod, NVML_LOG_RE) or (pod.get('log') or '').strip().splitlines()[-1:] or ['']
            raise Finding('workload_failed', 'pod %s/%s: %s; log: %s' % (
                pod['metadata']['namespace'], pod['metadata']['name'],
                status.get('message') or status.get('reason') or 'Failed', line if isinstance(line, str) else line[0]))
    if test_result is not None and not test_result.get('ok'):
        raise Finding('test_pod_failed', 'test pod %s: %s' % (test_result.get('pod'), test_result.get('problem')))


CHECKS = dict((name, globals()['check_' + name]) for name in LINKS)


def diagnose(name, host, api, expected=None, settings=None, test_result=None):
    """{status, first_broken_link, cause, evidence, fix, links} for one Kubernetes Node."""
    n = _Node(name, host, api, expected, settings or {})
    links = dict((link, NOT_CHECKED) for link in LINKS)
    report = {'status': OK, 'first_broken_link': None, 'cause': None, 'summary': None, 'evidence': [], 'fix': None,
              'links': links}
    for link in LINKS:
        try:
            if link == 'workload':
                check_workload(n, test_result)
            else:
                CHECKS[link](n)
            links[link] = OK
        except NotApplicable:
            links[link] = NOT_APPLICABLE
        except Finding as finding:
            links[link] = BROKEN
            report.update(status=BROKEN, first_broken_link=link, cause=finding.cause, evidence=finding.evidence,
                          fix=finding.fix, summary=CAUSES[finding.cause][1])
            break
    return report


def format_chain(reports):
    """One line per link and node, for people."""
    lines = []
    for name in sorted(reports):
        report = reports[name]
        lines.append('%s: %s' % (name, 'ok' if report['status'] == OK else 'BROKEN at %s (%s)'
                                 % (report['first_broken_link'], report['cause'])))
        for link in LINKS:
            state = report['links'][link]
            lines.append('  %-26s %s' % (link, state))
            if link == report['first_broken_link']:
                lines.extend('      evidence: %s' % e for e in report['evidence'])
                lines.append('      fix: %s' % report['fix'])
    return lines
