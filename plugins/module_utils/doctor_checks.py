# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The doctor's checks, one per link of ``doctor_causes.LINKS``: each takes a ``NodeEvidence`` (what
the node said, through doctor_node_evidence, and what the API says, ``doctor_evidence``) and returns
when its link holds, or raises ``Finding`` (a cause, the evidence quoted, the fix) or
``NotApplicable``. Plain Python, no Ansible."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import re

from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_toml import ConfigError, parse, plain
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_versions import CRI_TABLE_BY_VERSION, CRI_TABLES, cri_disabled
from ansible_collections.gpuready.nvidia.plugins.module_utils.doctor_causes import Finding, NotApplicable
from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s.pods import waiting_reason
from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s.workloads import (
    DEVICE_PLUGIN, GFD, NFD_MASTER, classify, gpu_requests, owner_daemonset, placement_problem)

NVML_LOG_RE = re.compile(r'.*(could not load NVML|Failed to initialize NVML|Incompatible strategy detected|'
                         r'invalid device discovery strategy).*')
UNHEALTHY_LOG_RE = re.compile(r'.*unhealthy.*', re.IGNORECASE)
PULL_REASONS = ('ErrImagePull', 'ImagePullBackOff', 'InvalidImageName', 'ErrImageNeverPull')


class NodeEvidence(object):
    """One node's evidence and the settings it is judged against."""

    def __init__(self, name, host, api, expected, settings, test_result=None):
        self.name = name
        self.host = host
        self.api = api
        self.node = api['nodes'].get(name, {}).get('node')
        self.pods = api['nodes'].get(name, {}).get('pods') or []
        self.expected = expected or {}
        self.runtime_name = settings.get('runtime_name') or 'nvidia'
        self.mig_strategy = settings.get('mig_strategy') or 'none'
        self.test_result = test_result  # the doctor's test pod on the node (k8s.pods.outcome), or None
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
        if error:  # NVML's own refusal at init, as a real mismatch gives it
            loaded = '; loaded kernel module: %s' % kernel if kernel else ''
            raise Finding('driver_library_version_mismatch', error + loaded)
        raise Finding('driver_library_version_mismatch', 'kernel module %s, NVML library %s'
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
            n.parsed[entry['path']] = plain(parse(entry['text'], entry['path']))
        except ConfigError as exc:
            n.parsed[entry['path']] = exc
    found = n.parsed[entry['path']]
    if isinstance(found, ConfigError):
        raise found
    return found


def _runtime_tables(doc, runtime_name):
    """[(cri table name, ctr table, runtime table)] for every CRI table holding the runtime."""
    found = []
    plugins = doc.get('plugins') or {}
    for name in CRI_TABLES:
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
    except ConfigError:
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
        except ConfigError as exc:
            raise Finding('containerd_config_invalid', str(exc))
        if cri_disabled(entry['text']):
            raise Finding('cri_plugin_disabled', '%s: %s' % (entry['path'], _line(entry['text'], r'^disabled_plugins')))
    found = _file_runtime(n)
    if found is None:
        raise Finding('nvidia_runtime_not_configured', '%s: no [plugins.*.containerd.runtimes.%s] table'
                      % (config['path'], n.runtime_name) if config['exists'] else
                      '%s does not exist (containerd runs on its defaults)' % config['path'])
    path, text, version, table, _ctr, runtime = found
    major = _containerd_major(n)
    implied = CRI_TABLE_BY_VERSION.get(version)
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
    wanted = dict(('nvidia-%s.sock' % r.split('/', 1)[1], r) for r in n.expected)
    present = [s for s in folder['sockets'] if s.startswith('nvidia')]
    missing = sorted(w for w in wanted if w not in present) if wanted else ([] if present else ['nvidia*.sock'])
    # The kubelet keeps a registration on the connection it opened to the plugin, not on the socket file: a
    # plugin whose file is gone (removed by its previous pod, which stops after the new one has started) stays
    # registered and its devices allocatable until the kubelet restarts, and then it registers again. Only a
    # missing socket whose resource the kubelet does not hold as allocatable is a broken registration.
    allocatable = _nvidia_resources((n.node or {}).get('status'), 'allocatable')
    missing = [m for m in missing if not (allocatable.get(wanted[m], 0) if wanted else sum(allocatable.values()))]
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


def check_workload(n):
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
    if n.test_result is not None and not n.test_result.get('ok'):
        raise Finding('test_pod_failed', 'test pod %s: %s' % (n.test_result.get('pod'), n.test_result.get('problem')))


# ---------------------------------------------------------------- GFD's labels did not come

NO_GFD_POD = ('No GFD pod runs there: the node carries neither feature.node.kubernetes.io/pci-10de.present=true '
              '(nfd-worker\'s PCI scan) nor nvidia.com/gpu.present=true (gpuready.nvidia.node_labels), or it has a '
              'taint feature_discovery_tolerations does not tolerate.')


def _container_state(status):
    state = status.get('state') or {}
    waiting = state.get('waiting')
    reason = ' (%s)' % waiting.get('reason') if waiting is not None else ''
    return ', %s%s, %s restarts' % (next(iter(state), ''), reason, status.get('restartCount', 0))


def why_no_gfd_labels(node, node_name, gfd_pods, namespace, timeout):
    """Why a node has no GFD labels after the feature_discovery role waited timeout seconds, as one
    sentence after "node <name>": the Node is missing (node None), or each GFD pod on it with its
    phase and containers' states and restarts, or that none runs there and why that may be."""
    if node is None:
        return 'node %s does not exist (set gpuready_node_name to the host\'s Kubernetes Node name)' % node_name
    text = 'node %s has no GFD labels after %s s.' % (node_name, timeout)
    for pod in gfd_pods or []:
        name = pod['metadata']['name']
        status = pod.get('status') or {}
        text += ' GFD pod %s: %s%s; its log says why (kubectl -n %s logs %s).' % (
            name, status.get('phase') or 'Pending', ''.join(_container_state(s) for s in status.get('containerStatuses') or []),
            namespace, name)
    return text if gfd_pods else '%s %s' % (text, NO_GFD_POD)
