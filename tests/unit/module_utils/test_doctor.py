# -*- coding: utf-8 -*-
"""The doctor's judgement (module_utils/doctor.py) from evidence dicts shaped as doctor_node_evidence and
the API return them: a healthy node, then one fault per cause, each naming its link, cause and evidence.
The same causes are produced from real artefacts in tests/integration/test_lab_doctor.py."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy
import os

import pytest

from ansible_collections.gpuready.nvidia.plugins.module_utils import doctor

NODE = 'gpu-p4'
CONFIG = '''version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "nvidia"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
      BinaryName = "/usr/bin/nvidia-container-runtime"
      SystemdCgroup = true
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
'''
DEVICES = ['/dev/nvidiactl', '/dev/nvidia-uvm', '/dev/nvidia-uvm-tools'] + ['/dev/nvidia%d' % i for i in range(4)]
PLUGIN_IMAGE = 'nvcr.io/nvidia/k8s-device-plugin:v0.20.0'
PLUGIN_SPEC = {
    'tolerations': [{'key': 'nvidia.com/gpu', 'operator': 'Exists', 'effect': 'NoSchedule'}],
    'affinity': {'nodeAffinity': {'requiredDuringSchedulingIgnoredDuringExecution': {'nodeSelectorTerms': [
        {'matchExpressions': [{'key': 'nvidia.com/gpu.present', 'operator': 'In', 'values': ['true']}]}]}}},
    'containers': [{'name': 'nvidia-device-plugin-ctr', 'image': PLUGIN_IMAGE, 'command': ['nvidia-device-plugin']}],
}
GFD_SPEC = {'containers': [{'name': 'gfd', 'image': PLUGIN_IMAGE, 'command': ['gpu-feature-discovery']}]}
NFD_SPEC = {'containers': [{'name': 'nfd-master', 'image': 'registry.k8s.io/nfd/node-feature-discovery:v0.17.3',
                            'command': ['nfd-master']}]}


def host():
    return {
        'gpu': {'present': True, 'nvml_ok': True, 'error': None, 'count': 4, 'driver_version': '535.183.01',
                'devices': [{'name': 'Tesla P4', 'minor_number': i} for i in range(4)],
                'kernel_module': {'loaded': True, 'version': '535.183.01', 'nouveau_loaded': False},
                'device_nodes': dict((p, {'exists': True, 'mode': '0666', 'owner': 'root:root'}) for p in DEVICES)},
        'pci_gpus': ['0000:3b:00.0', '0000:5e:00.0', '0000:86:00.0', '0000:d8:00.0'],
        'pynvml': {'present': True, 'error': None},
        'executables': {'/usr/bin/nvidia-container-runtime': True, '/usr/bin/nvidia-ctk': True},
        'containerd': {
            'config': {'path': '/etc/containerd/config.toml', 'exists': True, 'text': CONFIG, 'error': None},
            'drop_ins': [],
            'service': {'name': 'containerd', 'active_state': 'active', 'main_pid': 10, 'started_at': 1000.0},
            'cri': {'runtime_version': '1.6.20~ds1', 'default_runtime_name': 'nvidia', 'runtime_ready': True,
                    'runtimes': {'nvidia': {'options': {'BinaryName': '/usr/bin/nvidia-container-runtime'}},
                                 'runc': {'options': {}}}},
            'cri_error': None,
            'config_files': [{'path': '/etc/containerd/config.toml', 'exists': True, 'mtime': 900.0}]},
        'kubelet': {'config': {'path': '/var/lib/kubelet/config.yaml', 'exists': True, 'error': None,
                               'text': 'kind: KubeletConfiguration\ncgroupDriver: systemd\n'},
                    'device_plugins': {'dir': '/var/lib/kubelet/device-plugins', 'exists': True,
                                       'sockets': ['kubelet.sock', 'nvidia-gpu.sock']}},
    }


def _ds(name, namespace, spec):
    return {'metadata': {'name': name, 'namespace': namespace},
            'spec': {'template': {'spec': copy.deepcopy(spec)}},
            'status': {'desiredNumberScheduled': 1, 'currentNumberScheduled': 1}}


def _plugin_pod(ds='nvidia-device-plugin'):
    return {'metadata': {'name': ds + '-x1', 'namespace': 'nvidia-device-plugin',
                         'ownerReferences': [{'kind': 'DaemonSet', 'name': ds}]},
            'spec': dict(copy.deepcopy(PLUGIN_SPEC), nodeName=NODE),
            'status': {'phase': 'Running', 'containerStatuses': [
                {'name': 'nvidia-device-plugin-ctr', 'ready': True, 'restartCount': 0, 'image': PLUGIN_IMAGE,
                 'state': {'running': {}}}]},
            'log': 'Registered device plugin for \'nvidia.com/gpu\' with Kubelet\n', 'previous_log': '', 'events': []}


def api():
    node = {'metadata': {'name': NODE, 'labels': {'nvidia.com/gpu.present': 'true', 'nvidia.com/gpu.product': 'Tesla-P4',
                                                  'nvidia.com/gpu.count': '4'}},
            'spec': {},
            'status': {'capacity': {'cpu': '8', 'nvidia.com/gpu': '4'}, 'allocatable': {'cpu': '8', 'nvidia.com/gpu': '4'}}}
    return {'daemonsets': [_ds('nvidia-device-plugin', 'nvidia-device-plugin', PLUGIN_SPEC),
                           _ds('gpu-feature-discovery', 'nvidia-device-plugin', GFD_SPEC)],
            'deployments': [_ds('nfd-master', 'node-feature-discovery', NFD_SPEC)],
            'runtime_classes': [], 'namespaces': {'nvidia-device-plugin': {'metadata': {'labels': {}}}},
            'events': {}, 'unscheduled_gpu_pods': [],
            'nodes': {NODE: {'node': node, 'pods': [_plugin_pod()]}}}


def judge(h, a, expected=None, **settings):
    return doctor.diagnose(NODE, h, a, {'nvidia.com/gpu': 4} if expected is None else expected, settings)


def test_a_healthy_node_is_ok_on_every_link():
    report = judge(host(), api())
    assert report['status'] == 'ok' and report['first_broken_link'] is None and report['cause'] is None
    assert report['links'] == dict((link, 'not_applicable' if link == 'runtime_class' else 'ok')
                                   for link in doctor.LINKS)


def test_every_cause_belongs_to_a_link_and_has_a_fix():
    for cause, (link, summary, fix) in doctor.CAUSES.items():
        assert link in doctor.LINKS, cause
        assert summary and fix, cause


def _set_config(h, text):
    h['containerd']['config']['text'] = text


def _runc_default(h, a):
    _set_config(h, CONFIG.replace('default_runtime_name = "nvidia"', 'default_runtime_name = "runc"'))
    h['containerd']['cri']['default_runtime_name'] = 'runc'


def _plugin(a):
    return a['nodes'][NODE]['pods'][0]


def _plugin_state(a, state, log=''):
    pod = _plugin(a)
    pod['status']['containerStatuses'][0].update(state=state, ready=False)
    pod['log'] = log


# What nvidia_gpu_facts reports when nvmlInit fails with NVML_ERROR_LIB_RM_VERSION_MISMATCH (18)
MISMATCH = ('NVML library and kernel driver versions differ (RM has detected an NVML/RM version mismatch.); reboot '
            'or reload the driver')

FAULTS = {
    # cause: (change(host, api), link, words the evidence quotes)
    'node_not_inspected': (lambda h, a: h.clear(), 'driver', 'no node evidence'),
    'nouveau_loaded': (lambda h, a: h['gpu']['kernel_module'].update(nouveau_loaded=True), 'driver', 'module/nouveau'),
    'no_nvidia_gpu': (lambda h, a: h['gpu'].update(present=False), 'driver', '0x10de'),
    'nvidia_module_not_loaded': (lambda h, a: h['gpu']['kernel_module'].update(loaded=False), 'driver',
                                 'module/nvidia is missing'),
    'pynvml_missing': (lambda h, a: h['pynvml'].update(present=False, error="No module named 'pynvml'"), 'nvml',
                       "No module named 'pynvml'"),
    'nvml_library_missing': (lambda h, a: h['gpu'].update(nvml_ok=False, count=0, error='NVML library not found '
                                                          '(libnvidia-ml.so.1 could not be loaded: x)'),
                             'nvml', 'libnvidia-ml.so.1'),
    # As on a real node: NVML refuses to start (NVML_ERROR_LIB_RM_VERSION_MISMATCH) next to the other module
    'driver_library_version_mismatch': (lambda h, a: (h['gpu']['kernel_module'].update(version='535.216.01'),
                                                      h['gpu'].update(nvml_ok=False, count=0, error=MISMATCH)),
                                        'nvml', MISMATCH + '; loaded kernel module: 535.216.01'),
    'nvml_init_failed': (lambda h, a: h['gpu'].update(nvml_ok=False, error='NVML initialization failed: Unknown Error'),
                         'nvml', 'Unknown Error'),
    'gpus_missing_from_nvml': (lambda h, a: h['gpu'].update(count=3), 'nvml', 'NVML counts 3 GPUs, PCI has 4'),
    # device_nodes() lists only the numbered nodes that exist
    'device_nodes_missing': (lambda h, a: h['gpu']['device_nodes'].pop('/dev/nvidia2'), 'device_nodes',
                             '/dev/nvidia2 does not exist (4 GPUs)'),
    'nvidia_uvm_missing': (lambda h, a: h['gpu']['device_nodes']['/dev/nvidia-uvm'].update(exists=False),
                           'device_nodes', '/dev/nvidia-uvm does not exist'),
    'runtime_binary_missing': (lambda h, a: h['executables'].update({'/usr/bin/nvidia-container-runtime': False}),
                               'toolkit', 'BinaryName = "/usr/bin/nvidia-container-runtime"'),
    'toolkit_not_installed': (lambda h, a: (_set_config(h, 'version = 2\n'), h['executables'].update(
        {'/usr/bin/nvidia-container-runtime': False, '/usr/bin/nvidia-ctk': False})), 'toolkit', 'nvidia-ctk'),
    'containerd_config_invalid': (lambda h, a: _set_config(h, CONFIG + '\n[plugins\n'), 'containerd_config',
                                  'config.toml'),
    'cri_plugin_disabled': (lambda h, a: _set_config(h, 'disabled_plugins = ["cri"]\n' + CONFIG), 'containerd_config',
                            'disabled_plugins = ["cri"]'),
    'nvidia_runtime_not_configured': (lambda h, a: _set_config(h, 'version = 2\n'), 'containerd_config',
                                      'no [plugins.*.containerd.runtimes.nvidia] table'),
    'runtime_in_wrong_table': (lambda h, a: _set_config(h, CONFIG.replace('io.containerd.grpc.v1.cri',
                                                                          'io.containerd.cri.v1.runtime')),
                               'containerd_config', 'io.containerd.cri.v1.runtime'),
    'systemd_cgroup_mismatch': (lambda h, a: _set_config(h, CONFIG.replace('SystemdCgroup = true',
                                                                           'SystemdCgroup = false')),
                                'containerd_config', 'SystemdCgroup = false'),
    'containerd_not_running': (lambda h, a: h['containerd']['service'].update(active_state='inactive'),
                               'containerd_runtime_loaded', 'containerd is inactive'),
    'cri_unreachable': (lambda h, a: h['containerd'].update(cri=None, cri_error='no socket at /run/x.sock'),
                        'containerd_runtime_loaded', 'no socket'),
    'containerd_not_restarted': (lambda h, a: (h['containerd']['cri'].update(default_runtime_name='runc'),
                                               h['containerd']['config_files'][0].update(mtime=1100.0)),
                                 'containerd_runtime_loaded', "defaultRuntimeName = 'runc'"),
    'runtime_not_loaded': (lambda h, a: h['containerd']['cri']['runtimes'].pop('nvidia'),
                           'containerd_runtime_loaded', 'runtimes runc'),
    'default_runtime_not_nvidia': (_runc_default, 'runtime_class',
                                   'has no spec.template.spec.runtimeClassName'),
    'runtime_class_missing': (lambda h, a: (_runc_default(h, a), a['daemonsets'][0]['spec']['template']['spec'].update(
        runtimeClassName='nvidia')), 'runtime_class', "RuntimeClass 'nvidia' does not exist"),
    'runtime_class_handler_unknown': (lambda h, a: (
        _runc_default(h, a), a['daemonsets'][0]['spec']['template']['spec'].update(runtimeClassName='nvidia'),
        a['runtime_classes'].append({'metadata': {'name': 'nvidia'}, 'handler': 'nvidia-cdi'})),
        'runtime_class', "handler 'nvidia-cdi'"),
    'node_not_registered': (lambda h, a: a['nodes'][NODE].update(node=None), 'plugin_scheduled', '404'),
    'device_plugin_not_deployed': (lambda h, a: (a['daemonsets'].pop(0), a['nodes'][NODE].update(pods=[])),
                                   'plugin_scheduled', 'no DaemonSet'),
    'two_device_plugins': (lambda h, a: (a['daemonsets'].append(_ds('nvidia-device-plugin-daemonset', 'kube-system',
                                                                    PLUGIN_SPEC)),
                                         a['nodes'][NODE]['pods'].append(_plugin_pod('nvidia-device-plugin-daemonset'))),
                           'plugin_scheduled', 'kube-system/nvidia-device-plugin-daemonset'),
    'plugin_affinity_no_match': (lambda h, a: (a['nodes'][NODE]['node']['metadata']['labels'].pop('nvidia.com/gpu.present'),
                                               a['nodes'][NODE].update(pods=[])),
                                 'plugin_scheduled', 'nvidia.com/gpu.present In'),
    'taint_not_tolerated': (lambda h, a: (a['nodes'][NODE]['node']['spec'].update(taints=[
        {'key': 'dedicated', 'value': 'ml', 'effect': 'NoExecute'}]), a['nodes'][NODE].update(pods=[])),
        'plugin_scheduled', 'taint dedicated=ml:NoExecute'),
    'plugin_pod_not_created': (lambda h, a: (a['nodes'][NODE].update(pods=[]), a['namespaces'].update(
        {'nvidia-device-plugin': {'metadata': {'labels': {'pod-security.kubernetes.io/enforce': 'restricted'}}}}),
        a['events'].update({'nvidia-device-plugin/nvidia-device-plugin': [
            {'type': 'Warning', 'reason': 'FailedCreate', 'message': 'violates PodSecurity "restricted:latest"'}]})),
        'plugin_scheduled', 'violates PodSecurity'),
    'plugin_image_pull_failed': (lambda h, a: _plugin_state(a, {'waiting': {'reason': 'ErrImagePull',
                                                                            'message': 'not found'}}),
                                 'plugin_running', 'ErrImagePull'),
    'runtime_handler_not_configured': (lambda h, a: _plugin(a).update(events=[
        {'reason': 'FailedCreatePodSandBox', 'message': 'no runtime for "nvidia" is configured'}]),
        'plugin_running', 'no runtime for "nvidia"'),
    'plugin_nvml_load_failed': (lambda h, a: _plugin_state(a, {'waiting': {'reason': 'CrashLoopBackOff'}},
                                                           'E1 factory.go:112] Incompatible strategy detected auto\n'),
                                'plugin_running', 'Incompatible strategy detected auto'),
    'plugin_crashing': (lambda h, a: _plugin_state(a, {'waiting': {'reason': 'CrashLoopBackOff'}}, 'panic: boom\n'),
                        'plugin_running', 'panic: boom'),
    'plugin_not_ready': (lambda h, a: _plugin_state(a, {'running': {}}), 'plugin_running', 'phase Running'),
    'kubelet_socket_missing': (lambda h, a: h['kubelet']['device_plugins'].update(sockets=['nvidia-gpu.sock']),
                               'kubelet_registration', 'no kubelet.sock'),
    # A stale socket of another resource does not count; the kubelet holds no device (as after its restart)
    'plugin_not_registered': (lambda h, a: (h['kubelet']['device_plugins'].update(
        sockets=['kubelet.sock', 'nvidia-gpu.shared.sock']), a['nodes'][NODE]['node']['status'].update(
            allocatable={'nvidia.com/gpu': '0'})), 'kubelet_registration', 'and no nvidia-gpu.sock'),
    'no_gpu_capacity': (lambda h, a: a['nodes'][NODE]['node']['status'].update(capacity={'cpu': '8'}, allocatable={}),
                        'kubelet_registration', 'no nvidia.com/ resource'),
    'sharing_renamed_resource': (lambda h, a: a['nodes'][NODE]['node']['status'].update(
        capacity={'nvidia.com/gpu.shared': '16'}, allocatable={'nvidia.com/gpu.shared': '16'}),
        'capacity', 'nvidia.com/gpu.shared: 16'),
    'capacity_mismatch': (lambda h, a: a['nodes'][NODE]['node']['status'].update(
        capacity={'nvidia.com/gpu': '2'}, allocatable={'nvidia.com/gpu': '2'}), 'capacity', 'nvidia.com/gpu: 2; expected 4'),
    'gpus_unhealthy': (lambda h, a: (a['nodes'][NODE]['node']['status'].update(allocatable={'nvidia.com/gpu': '3'}),
                                     _plugin(a).update(log='XidCriticalError: Xid=79 on Device=GPU-1, marking unhealthy\n')),
                       'allocatable', 'marking unhealthy'),
    'gfd_not_deployed': (lambda h, a: (a['daemonsets'].pop(1), a['nodes'][NODE]['node']['metadata']['labels'].pop(
        'nvidia.com/gpu.product')), 'labels', 'no label nvidia.com/gpu.product'),
    'nfd_not_deployed': (lambda h, a: (a['deployments'].pop(0), a['nodes'][NODE]['node']['metadata']['labels'].pop(
        'nvidia.com/gpu.product')), 'labels', 'no nfd-master'),
    'gpu_labels_missing': (lambda h, a: a['nodes'][NODE]['node']['metadata']['labels'].pop('nvidia.com/gpu.product'),
                           'labels', 'no label nvidia.com/gpu.product'),
    'gpu_labels_stale': (lambda h, a: a['nodes'][NODE]['node']['metadata']['labels'].update(
        {'nvidia.com/gpu.count': '2'}), 'labels', 'nvidia.com/gpu.count=2'),
    'gpu_request_unschedulable': (lambda h, a: a['unscheduled_gpu_pods'].append(
        {'metadata': {'name': 'big', 'namespace': 'default'},
         'spec': {'containers': [{'resources': {'limits': {'nvidia.com/gpu': '5'}}}]},
         'events': [{'reason': 'FailedScheduling',
                     'message': '0/2 nodes are available: 2 Insufficient nvidia.com/gpu.'}]}),
        'workload', 'Insufficient nvidia.com/gpu'),
    'workload_failed': (lambda h, a: a['nodes'][NODE]['pods'].append(
        {'metadata': {'name': 'train', 'namespace': 'default'},
         'spec': {'containers': [{'image': 'cuda', 'resources': {'limits': {'nvidia.com/gpu': '1'}}}]},
         'status': {'phase': 'Failed'}, 'log': 'Failed to initialize NVML: Unknown Error\n'}),
        'workload', 'Failed to initialize NVML: Unknown Error'),
}


def test_the_faults_cover_every_cause_but_those_of_other_settings():
    assert set(doctor.CAUSES) - set(FAULTS) == {'mig_strategy_mismatch', 'test_pod_failed'}


@pytest.mark.parametrize('cause', sorted(FAULTS))
def test_a_fault_breaks_its_link_with_its_cause_and_quotes_the_evidence(cause):
    change, link, quoted = FAULTS[cause]
    h, a = host(), api()
    change(h, a)
    report = judge(h or None, a)
    assert (report['first_broken_link'], report['cause']) == (link, cause), report
    assert report['status'] == 'broken' and report['fix'] == doctor.CAUSES[cause][2]
    assert any(quoted in line for line in report['evidence']), report['evidence']
    index = doctor.LINKS.index(link)
    assert all(report['links'][later] == 'not_checked' for later in doctor.LINKS[index + 1:])
    assert all(report['links'][earlier] in ('ok', 'not_applicable') for earlier in doctor.LINKS[:index])


def test_mig_resources_where_full_gpus_were_expected_are_a_mig_strategy_mismatch():
    a = api()
    a['nodes'][NODE]['node']['status'].update(capacity={'nvidia.com/mig-1g.10gb': '7'},
                                              allocatable={'nvidia.com/mig-1g.10gb': '7'})
    report = judge(host(), a)
    assert (report['first_broken_link'], report['cause']) == ('capacity', 'mig_strategy_mismatch')


def test_a_failed_test_pod_breaks_the_workload_link():
    report = doctor.diagnose(NODE, host(), api(), {'nvidia.com/gpu': 4}, {},
                             test_result={'ok': False, 'pod': 'gpuready-doctor-gpu-p4', 'problem': 'exit code 12'})
    assert (report['first_broken_link'], report['cause']) == ('workload', 'test_pod_failed')
    assert report['evidence'] == ['test pod gpuready-doctor-gpu-p4: exit code 12']


def test_a_runtime_class_that_works_makes_that_link_ok():
    h, a = host(), api()
    _runc_default(h, a)
    a['daemonsets'][0]['spec']['template']['spec']['runtimeClassName'] = 'nvidia'
    a['runtime_classes'].append({'metadata': {'name': 'nvidia'}, 'handler': 'nvidia'})
    assert judge(h, a)['links']['runtime_class'] == 'ok'


def test_the_chain_has_a_line_per_link_and_the_finding():
    h, a = host(), api()
    h['gpu']['kernel_module']['nouveau_loaded'] = True
    lines = doctor.format_chain({NODE: judge(h, a)})
    assert lines[0] == 'gpu-p4: BROKEN at driver (nouveau_loaded)'
    assert lines[1].split() == ['driver', 'broken']
    assert any(line.strip().startswith('fix: blacklist nouveau') for line in lines)
    assert sum(1 for line in lines if line.split()[-1] == 'not_checked') == len(doctor.LINKS) - 1


def test_the_readme_lists_every_cause_under_its_link():
    readme = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', '..', 'README.md')
    with open(readme) as handle:
        text = handle.read()
    for cause, (link, _summary, _fix) in doctor.CAUSES.items():
        assert '| `%s` | `%s` |' % (link, cause) in text, cause


def test_without_expected_resources_any_nvidia_socket_counts_as_registered():
    h = host()
    assert doctor.diagnose(NODE, h, api(), {}, {})['status'] == 'ok'
    h['kubelet']['device_plugins']['sockets'] = ['kubelet.sock']
    evidence = api()
    evidence['nodes'][NODE]['node']['status']['allocatable'] = {'nvidia.com/gpu': '0'}
    report = doctor.diagnose(NODE, h, evidence, {}, {})
    assert report['cause'] == 'plugin_not_registered' and report['evidence'][0].endswith('and no nvidia*.sock')


@pytest.mark.parametrize('expected', [{}, {'nvidia.com/gpu': 4}])
def test_a_plugin_whose_socket_file_is_gone_is_registered_while_the_kubelet_holds_its_devices(expected):
    # Seen on the real kubelet 1.37: the previous plugin pod, stopping after its replacement started, removes
    # the socket file they share; the kubelet keeps the connection, and the GPUs stay allocatable.
    h = host()
    h['kubelet']['device_plugins']['sockets'] = ['kubelet.sock']
    report = doctor.diagnose(NODE, h, api(), expected, {})
    assert report['status'] == 'ok' and report['links']['kubelet_registration'] == 'ok', report
