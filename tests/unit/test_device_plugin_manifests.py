# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The device_plugin role's manifests, rendered by ansible's templating (tests/manifest_render.py):
the config file means to the plugin what gpuready_sharing / gpuready_mig_strategy mean to the label
engine, the checksum follows the config, the runtime class and registry settings reach every pod,
and every object is valid Kubernetes for the versions we claim. Also the preflight's sorting of
foreign objects (the gpuready.nvidia.gpu_components filter, over module_utils/k8s/workloads.py)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy
import hashlib
import os

import kubernetes_validate
import pytest
import yaml

import manifest_render

from ansible_collections.gpuready.nvidia.plugins.filter.gpu_components import gpu_components
from ansible_collections.gpuready.nvidia.plugins.module_utils import gpu_labels

FIXTURES = os.path.join(manifest_render.COLLECTION_ROOT, 'tests', 'fixtures', 'manifests')
ROLE = 'device_plugin'
TEMPLATE = 'device-plugin.yml.j2'

# The support matrix (README.md) says "Kubernetes: any version". kubernetes-validate 1.37.0 ships
# schemas for 1.25 to 1.37, so every one of those is checked; older versions cannot be.
KUBERNETES_VERSIONS = ['1.%d' % minor for minor in range(25, 38)]

SHARING_CASES = {
    'none': None,
    'time-slicing': {'strategy': 'time-slicing', 'resources': [{'name': 'nvidia.com/gpu', 'replicas': 4}]},
    'time-slicing-renamed': {'strategy': 'time-slicing', 'rename_by_default': True,
                             'fail_requests_greater_than_one': True,
                             'resources': [{'name': 'nvidia.com/gpu', 'replicas': 10}]},
    'mps': {'strategy': 'mps', 'resources': [{'name': 'nvidia.com/gpu', 'replicas': 3}]},
}
MIG_STRATEGIES = ['none', 'single', 'mixed']
CASES = [(sharing, mig) for sharing in SHARING_CASES for mig in MIG_STRATEGIES
         if not (sharing == 'mps' and mig == 'mixed')]  # the plugin refuses MPS with mixed; preflight too

# Facts the label engine takes: two full GPUs and two MIG-enabled A100s (one 1g.5gb device each),
# so that every strategy advertises something different.
FULL_GPUS = {'driver_version': '535.183.01', 'cuda_driver_version': 12020, 'machine_type': 'test',
             'vgpu_devices': [],
             'devices': [{'name': 'Tesla T4', 'uuid': 'GPU-%d' % i, 'memory_mib': 15360, 'compute_capability': [7, 5],
                          'mig_capable': False, 'mig_enabled': False, 'pci_class': '0x030200'} for i in range(2)]}
MIG_GPUS = {'driver_version': '535.183.01', 'cuda_driver_version': 12020, 'machine_type': 'test',
            'vgpu_devices': [],
            'devices': [{'name': 'NVIDIA A100-SXM4-40GB', 'uuid': 'GPU-A%d' % i, 'memory_mib': 40960,
                         'compute_capability': [8, 0], 'mig_capable': True, 'mig_enabled': True, 'pci_class': '0x030200',
                         'mig_devices': [{'uuid': 'MIG-A%d' % i, 'profile': '1g.5gb', 'memory_mb': 4864,
                                          'multiprocessors': 14, 'gi_slices': 1, 'ci_slices': 1, 'copy_engines': 1,
                                          'decoders': 0, 'encoders': 0, 'jpeg': 0, 'ofa': 0}]} for i in range(2)]}


def _render(sharing='none', mig='none', **overrides):
    variables = {'gpuready_sharing': copy.deepcopy(SHARING_CASES[sharing]), 'gpuready_mig_strategy': mig}
    variables.update(overrides)
    return manifest_render.render(ROLE, TEMPLATE, variables)


def _by_kind(objects, kind):
    return [obj for obj in objects if obj['kind'] == kind]


def _plugin(objects):
    [daemonset] = [ds for ds in _by_kind(objects, 'DaemonSet') if ds['metadata']['name'] == 'nvidia-device-plugin']
    return daemonset


def _config(objects):
    [configmap] = _by_kind(objects, 'ConfigMap')
    return configmap['data']['config.yaml']


def _pods(objects):
    return [ds['spec']['template'] for ds in _by_kind(objects, 'DaemonSet')]


def _sharing_from_config(config):
    """The plugin config's sharing section in the label engine's form, read the way the plugin reads it:
    mps wins over timeSlicing, only renameByDefault survives, resources keep name and replicas."""
    sections = config.get('sharing') or {}
    for strategy, key in (('mps', 'mps'), ('time-slicing', 'timeSlicing')):
        if sections.get(key):
            section = sections[key]
            return {'strategy': strategy, 'rename_by_default': section['renameByDefault'],
                    'resources': [{'name': r['name'], 'replicas': r['replicas']} for r in section['resources']]}
    return None


@pytest.mark.parametrize('sharing,mig', CASES)
def test_config_means_to_the_plugin_what_the_settings_mean_to_the_label_engine(sharing, mig):
    objects = _render(sharing, mig)
    config = yaml.safe_load(_config(objects))
    assert config['version'] == 'v1' and config['flags'] == {'migStrategy': mig}
    assert set(config) <= {'version', 'flags', 'sharing'}
    section = (config.get('sharing') or {})
    assert list(section) == ([] if sharing == 'none' else ['mps' if sharing == 'mps' else 'timeSlicing'])
    for facts in (FULL_GPUS, MIG_GPUS):
        if sharing == 'mps' and facts is MIG_GPUS:
            continue  # MPS on MIG-enabled GPUs is refused by the plugin (and by plugin_devices)
        from_settings = gpu_labels.plugin_devices(facts, mig, SHARING_CASES[sharing])
        from_config = gpu_labels.plugin_devices(facts, config['flags']['migStrategy'], _sharing_from_config(config))
        assert from_config == from_settings


def test_config_cases_advertise_what_sharing_promises():
    """The cases above differ where they must: replicas multiply, renameByDefault renames."""
    def advertised(sharing):
        config = yaml.safe_load(_config(_render(sharing)))
        return gpu_labels.expected_node_resources(FULL_GPUS, 'none', _sharing_from_config(config))

    assert advertised('none') == {'nvidia.com/gpu': 2}
    assert advertised('time-slicing') == {'nvidia.com/gpu': 8}
    assert advertised('time-slicing-renamed') == {'nvidia.com/gpu.shared': 20}
    assert advertised('mps') == {'nvidia.com/gpu': 6}


def test_fail_requests_greater_than_one_reaches_the_config():
    section = yaml.safe_load(_config(_render('time-slicing-renamed')))['sharing']['timeSlicing']
    assert section == {'renameByDefault': True, 'failRequestsGreaterThanOne': True,
                       'resources': [{'name': 'nvidia.com/gpu', 'replicas': 10}]}
    assert yaml.safe_load(_config(_render('time-slicing')))['sharing']['timeSlicing']['failRequestsGreaterThanOne'] is False


def test_plugin_reads_the_mounted_config_file():
    """CONFIG_FILE names the file the ConfigMap volume puts in the container, and MIG strategy and sharing
    come from that file alone (no MIG_STRATEGY env that would override it)."""
    objects = _render('time-slicing', 'single')
    daemonset = _plugin(objects)
    pod = daemonset['spec']['template']['spec']
    [container] = pod['containers']
    env = dict((e['name'], e.get('value')) for e in container['env'])
    assert 'MIG_STRATEGY' not in env and not container.get('args')
    [mount] = [m for m in container['volumeMounts'] if m['name'] == 'config']
    [volume] = [v for v in pod['volumes'] if v['name'] == 'config']
    [configmap] = _by_kind(objects, 'ConfigMap')
    assert volume['configMap']['name'] == configmap['metadata']['name']
    assert env['CONFIG_FILE'] == mount['mountPath'] + '/config.yaml'
    assert 'config.yaml' in configmap['data']
    assert env['NVIDIA_MIG_MONITOR_DEVICES'] == 'all'
    default_env = _plugin(_render())['spec']['template']['spec']['containers'][0]['env']
    assert 'NVIDIA_MIG_MONITOR_DEVICES' not in [e['name'] for e in default_env]


def _checksums(objects):
    return [pod['metadata']['annotations']['gpuready.nvidia/config-checksum'] for pod in _pods(objects)]


def test_checksum_is_the_sha256_of_the_config():
    for sharing, mig in CASES:
        objects = _render(sharing, mig)
        expected = hashlib.sha256(_config(objects).encode('utf-8')).hexdigest()
        assert _checksums(objects) == [expected] * len(_by_kind(objects, 'DaemonSet'))


def test_checksum_changes_with_the_config_and_only_with_it():
    base = _checksums(_render('time-slicing'))[0]
    more_replicas = _render(gpuready_sharing={'strategy': 'time-slicing',
                                              'resources': [{'name': 'nvidia.com/gpu', 'replicas': 5}]})
    assert _checksums(more_replicas)[0] != base
    assert _checksums(_render('time-slicing', 'single'))[0] != base
    assert _checksums(_render('time-slicing-renamed'))[0] != base
    # Settings outside the config roll the pods through the template itself, not the checksum
    unrelated = _render('time-slicing', gpuready_registry='registry.example.com/mirror', gpuready_set_as_default=False,
                        gpuready_device_plugin_version='v0.19.3', gpuready_image_pull_policy='Always')
    assert _checksums(unrelated)[0] == base
    # The same settings written another way (key order, replicas as a string) give the same config
    reordered = _render(gpuready_sharing={'resources': [{'replicas': '4', 'name': 'nvidia.com/gpu'}],
                                          'strategy': 'time-slicing'})
    assert _checksums(reordered)[0] == base


@pytest.mark.parametrize('set_as_default', [True, False])
@pytest.mark.parametrize('sharing', ['none', 'mps'])
def test_runtime_class_name_only_when_nvidia_is_not_the_default(set_as_default, sharing):
    objects = _render(sharing, gpuready_set_as_default=set_as_default, gpuready_runtime_class='gpu-runtime')
    pods = _pods(objects)
    assert len(pods) == (2 if sharing == 'mps' else 1)
    for pod in pods:
        if set_as_default:
            assert 'runtimeClassName' not in pod['spec']
        else:
            assert pod['spec']['runtimeClassName'] == 'gpu-runtime'


def test_runtime_class_object():
    settings = {'gpuready_runtime_class': 'gpu-runtime', 'gpuready_runtime_name': 'nvidia-cdi'}
    [runtime_class] = manifest_render.render(ROLE, 'runtime-class.yml.j2', settings)
    assert (runtime_class['metadata']['name'], runtime_class['handler']) == ('gpu-runtime', 'nvidia-cdi')
    assert runtime_class['metadata']['labels']['app.kubernetes.io/managed-by'] == 'gpuready.nvidia'


@pytest.mark.parametrize('sharing,mig', CASES)
def test_mps_control_daemon_only_with_mps(sharing, mig):
    objects = _render(sharing, mig)
    daemons = [ds for ds in _by_kind(objects, 'DaemonSet') if ds['metadata']['name'].endswith('-mps-control-daemon')]
    plugin_pod = _plugin(objects)['spec']['template']['spec']
    plugin_env = dict((e['name'], e.get('value')) for e in plugin_pod['containers'][0]['env'])
    if sharing != 'mps':
        assert daemons == [] and 'MPS_ROOT' not in plugin_env
        return
    [daemon] = daemons
    pod = daemon['spec']['template']['spec']
    assert pod['nodeSelector'] == {'nvidia.com/mps.capable': 'true'} and pod['hostPID'] is True
    assert pod['initContainers'][0]['command'] == ['mps-control-daemon', 'mount-shm']
    assert pod['containers'][0]['command'] == ['mps-control-daemon']
    host_paths = dict((v['name'], v['hostPath']['path']) for v in pod['volumes'] if 'hostPath' in v)
    plugin_paths = dict((v['name'], v['hostPath']['path']) for v in plugin_pod['volumes'] if 'hostPath' in v)
    # The daemon and the plugin must share the same host folders, or the plugin never sees the daemon
    assert host_paths['mps-root'] == plugin_paths['mps-root'] == plugin_env['MPS_ROOT'] == '/run/nvidia/mps'
    assert host_paths['mps-shm'] == plugin_paths['mps-shm'] == '/run/nvidia/mps/shm'
    # Both DaemonSets select only their own pods
    selectors = [ds['spec']['selector']['matchLabels'] for ds in _by_kind(objects, 'DaemonSet')]
    assert selectors[0] != selectors[1]


def test_placement_priority_tolerations_and_affinity():
    for pod in _pods(_render('mps')):
        spec = pod['spec']
        assert spec['priorityClassName'] == 'system-node-critical'
        assert {'key': 'nvidia.com/gpu', 'operator': 'Exists', 'effect': 'NoSchedule'} in spec['tolerations']
        terms = spec['affinity']['nodeAffinity']['requiredDuringSchedulingIgnoredDuringExecution']['nodeSelectorTerms']
        keys = [expr['key'] for term in terms for expr in term['matchExpressions']]
        assert keys == ['feature.node.kubernetes.io/pci-10de.present', 'nvidia.com/gpu.present']


def _images(objects):
    return [c['image'] for pod in _pods(objects) for c in pod['spec'].get('initContainers', []) + pod['spec']['containers']]


@pytest.mark.parametrize('sharing', ['none', 'mps'])
def test_private_registry_reaches_every_image(sharing):
    objects = _render(sharing, gpuready_registry='registry.example.com/mirror')
    images = _images(objects)
    assert images and all(image == 'registry.example.com/mirror/k8s-device-plugin:v0.20.0' for image in images)
    assert not [image for image in images if 'nvcr.io' in image or 'registry.k8s.io' in image]
    assert set(_images(_render(sharing))) == {'nvcr.io/nvidia/k8s-device-plugin:v0.20.0'}


def test_upgrade_from_v0_19_changes_only_the_image_and_version_label():
    old, new = _plugin(_render(gpuready_device_plugin_version='v0.19.3')), _plugin(_render())
    assert old['spec']['selector'] == new['spec']['selector']
    assert new['spec']['updateStrategy']['type'] == 'RollingUpdate'
    for daemonset in (old, new):
        daemonset['spec']['template']['spec']['containers'][0].pop('image')
        for meta in (daemonset['metadata'], daemonset['spec']['template']['metadata']):
            meta['labels'].pop('app.kubernetes.io/version')
    assert old == new


def test_every_object_we_own_carries_our_label():
    objects = _render('mps') + manifest_render.render(ROLE, 'namespace.yml.j2') + \
        manifest_render.render(ROLE, 'runtime-class.yml.j2')
    assert len(objects) == 5
    for obj in objects:
        assert obj['metadata']['labels']['app.kubernetes.io/managed-by'] == 'gpuready.nvidia', obj['kind']
    for pod in _pods(objects):
        assert pod['metadata']['labels']['app.kubernetes.io/managed-by'] == 'gpuready.nvidia'


def _all_rendered():
    rendered = [manifest_render.render(ROLE, 'namespace.yml.j2'), manifest_render.render(ROLE, 'runtime-class.yml.j2')]
    rendered += [_render(sharing, mig, gpuready_set_as_default=False) for sharing, mig in CASES]
    return [obj for objects in rendered for obj in objects]


@pytest.mark.parametrize('version', KUBERNETES_VERSIONS)
def test_rendered_objects_are_valid_kubernetes(version):
    for obj in _all_rendered():
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize('version', KUBERNETES_VERSIONS)
def test_upstream_static_manifest_is_valid_kubernetes(version):
    """Positive control: the validator accepts the manifest the plugin's authors ship."""
    with open(os.path.join(FIXTURES, 'nvidia-device-plugin-v0.20.0.yml')) as handle:
        [daemonset] = [doc for doc in yaml.safe_load_all(handle) if doc]
    kubernetes_validate.validate(daemonset, version, strict=True)


def test_validation_can_fail():
    """Negative control: strict mode rejects a misspelt field and a wrong type in our own DaemonSet."""
    daemonset = _plugin(_render())
    misspelt = copy.deepcopy(daemonset)
    misspelt['spec']['template']['spec']['tolerationz'] = misspelt['spec']['template']['spec'].pop('tolerations')
    wrong_type = copy.deepcopy(daemonset)
    wrong_type['spec']['template']['spec']['containers'][0]['env'][0]['value'] = 1
    for broken in (misspelt, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


# --- preflight: what counts as foreign ------------------------------------------------------------


def _fixture_daemonsets(name):
    with open(os.path.join(FIXTURES, name)) as handle:
        docs = [doc for doc in yaml.safe_load_all(handle) if doc]
    items = [item for doc in docs for item in (doc.get('items') or [doc])]
    return [item for item in items if item['kind'] == 'DaemonSet']


def _found(daemonsets, policies=()):
    found = gpu_components({'resources': list(daemonsets)}, {'resources': list(policies), 'api_found': bool(policies)})
    return [(f['component'], f['kind'], f['namespace'], f['name']) for f in found]


def _helm_style(name, app, image, command):
    """A DaemonSet shaped like the Helm charts' (labels app.kubernetes.io/name, managed-by Helm)."""
    labels = {'app.kubernetes.io/name': app, 'app.kubernetes.io/instance': 'nvdp',
              'app.kubernetes.io/managed-by': 'Helm'}
    return {'apiVersion': 'apps/v1', 'kind': 'DaemonSet',
            'metadata': {'name': name, 'namespace': 'nvidia', 'labels': labels},
            'spec': {'selector': {'matchLabels': {'app.kubernetes.io/name': app}},
                     'template': {'metadata': {'labels': labels},
                                  'spec': {'containers': [{'name': 'c', 'image': image, 'command': command}]}}}}


def test_preflight_finds_the_upstream_manifests():
    found = _found(_fixture_daemonsets('nvidia-device-plugin-v0.20.0.yml')
                   + _fixture_daemonsets('gpu-feature-discovery-v0.20.0.yml')
                   + _fixture_daemonsets('nfd-v0.17.3.yml'))
    assert [f[0] for f in found] == ['device-plugin', 'gpu-feature-discovery', 'node-feature-discovery']
    assert found[0] == ('device-plugin', 'DaemonSet', 'kube-system', 'nvidia-device-plugin-daemonset')


def test_preflight_finds_helm_and_renamed_daemonsets_by_image_and_command():
    image = 'nvcr.io/nvidia/k8s-device-plugin:v0.19.3'
    daemonsets = [
        _helm_style('nvdp-nvidia-device-plugin', 'nvidia-device-plugin', image, ['nvidia-device-plugin']),
        _helm_style('nvdp-gpu-feature-discovery', 'gpu-feature-discovery', image, ['gpu-feature-discovery']),
        # renamed, unlabelled: known only by image (and by command where the image is shared)
        _helm_style('gpu-thing', 'x', 'mirror.local/nvidia/k8s-device-plugin@sha256:abc', ['nvidia-device-plugin']),
        _helm_style('labeller', 'y', 'mirror.local/nvidia/k8s-device-plugin:v0.20.0', ['/usr/bin/gpu-feature-discovery']),
        _helm_style('features', 'z', 'mirror.local/nfd/node-feature-discovery:v0.17.3', ['nfd-worker']),
        # unrelated DaemonSets whose names merely resemble ours are not reported
        _helm_style('kube-proxy', 'kube-proxy', 'registry.k8s.io/kube-proxy:v1.31.0', ['kube-proxy']),
        _helm_style('gpu-exporter', 'dcgm-exporter', 'nvcr.io/nvidia/k8s/dcgm-exporter:3.3', ['dcgm-exporter']),
    ]
    assert [(f[0], f[3]) for f in _found(daemonsets)] == [
        ('device-plugin', 'nvdp-nvidia-device-plugin'), ('gpu-feature-discovery', 'nvdp-gpu-feature-discovery'),
        ('device-plugin', 'gpu-thing'), ('gpu-feature-discovery', 'labeller'),
        ('node-feature-discovery', 'features')]


def test_preflight_never_counts_our_own_objects():
    ours = _by_kind(_render('mps'), 'DaemonSet')
    assert len(ours) == 2 and _found(ours) == []
    # the same DaemonSet without our label is foreign
    stripped = copy.deepcopy(ours[0])
    for meta in (stripped['metadata'], stripped['spec']['template']['metadata']):
        del meta['labels']['app.kubernetes.io/managed-by']
    assert _found([stripped]) == [('device-plugin', 'DaemonSet', 'nvidia-device-plugin', 'nvidia-device-plugin')]


def test_preflight_reports_a_cluster_policy_that_deploys_the_plugin():
    policies = [{'apiVersion': 'nvidia.com/v1', 'kind': 'ClusterPolicy', 'metadata': {'name': 'cluster-policy'},
                 'spec': {'devicePlugin': {'enabled': True}}},
                {'apiVersion': 'nvidia.com/v1', 'kind': 'ClusterPolicy', 'metadata': {'name': 'no-plugin'},
                 'spec': {'devicePlugin': {'enabled': False}}}]
    assert _found([], policies) == [('gpu-operator', 'ClusterPolicy', None, 'cluster-policy')]
    assert _found([], []) == []  # no CRD: k8s_info gives no resources
