# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The feature_discovery role's manifests, rendered by ansible's templating (tests/manifest_render.py):
GFD in NodeFeature API mode with what that mode needs, its config and the checksum that follows it,
the runtime class and the registry settings on every pod, NFD's worker labelling what GFD's affinity
asks for, the objects shared with the device_plugin role rendered identically, and every object valid
Kubernetes for the versions we claim."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy
import hashlib

import kubernetes_validate
import pytest
import yaml

import manifest_render

ROLE = 'feature_discovery'
TEMPLATES = ('prerequisites.yml.j2', 'nfd.yml.j2', 'gfd.yml.j2')
MANAGED_BY = 'app.kubernetes.io/managed-by'

# The support matrix (README.md) says "Kubernetes: any version". kubernetes-validate 1.37.0 ships
# schemas for 1.25 to 1.37, so every one of those is checked; older versions cannot be.
KUBERNETES_VERSIONS = ['1.%d' % minor for minor in range(25, 38)]

TIME_SLICING = {'strategy': 'time-slicing', 'resources': [{'name': 'nvidia.com/gpu', 'replicas': 4}]}


def _render(template, **overrides):
    return manifest_render.render(ROLE, template, overrides)


def _all(**overrides):
    return [obj for template in TEMPLATES for obj in _render(template, **overrides)]


def _one(objects, kind, name=None):
    [found] = [o for o in objects if o['kind'] == kind and (name is None or o['metadata']['name'] == name)]
    return found


def _gfd(**overrides):
    return _one(_render('gfd.yml.j2', **overrides), 'DaemonSet')


def _pod_specs(objects):
    return [o['spec']['template']['spec'] for o in objects if o['kind'] in ('DaemonSet', 'Deployment')]


def _images(objects):
    return [c['image'] for spec in _pod_specs(objects) for c in spec.get('initContainers', []) + spec['containers']]


def _gfd_config_text(**overrides):
    return _one(_render('gfd.yml.j2', **overrides), 'ConfigMap')['data']['config.yaml']


def _checksum(**overrides):
    return _gfd(**overrides)['spec']['template']['metadata']['annotations']['gpuready.nvidia/config-checksum']


def test_default_images_are_upstream_and_gfd_runs_from_the_device_plugin_image():
    objects = _all()
    assert _one(objects, 'DaemonSet', 'gpu-feature-discovery')['spec']['template']['spec']['containers'][0]['image'] == \
        'nvcr.io/nvidia/k8s-device-plugin:v0.20.0'
    nfd_images = set(_images([o for o in objects if o['metadata']['name'].startswith('nfd-')]))
    assert nfd_images == {'registry.k8s.io/nfd/node-feature-discovery:v0.19.0'}


def test_private_registry_reaches_every_image():
    objects = _all(gpuready_registry='registry.example.com/mirror')
    images = _images(objects)
    assert len(images) == 3  # GFD, nfd-master, nfd-worker
    assert [i for i in images if 'nvcr.io' in i or 'registry.k8s.io' in i] == []
    assert all(i.startswith('registry.example.com/mirror/') for i in images), images
    assert all(c['imagePullPolicy'] == 'IfNotPresent' for spec in _pod_specs(objects) for c in spec['containers'])


@pytest.mark.parametrize('set_as_default', [True, False])
def test_runtime_class_only_when_nvidia_is_not_the_default(set_as_default):
    objects = _all(gpuready_set_as_default=set_as_default, gpuready_runtime_class='gpu-runtime',
                   gpuready_runtime_name='nvidia-cdi')
    gfd = _one(objects, 'DaemonSet', 'gpu-feature-discovery')['spec']['template']['spec']
    runtime_classes = [o for o in objects if o['kind'] == 'RuntimeClass']
    if set_as_default:
        assert 'runtimeClassName' not in gfd and runtime_classes == []
    else:
        assert gfd['runtimeClassName'] == 'gpu-runtime'
        assert [(r['metadata']['name'], r['handler']) for r in runtime_classes] == [('gpu-runtime', 'nvidia-cdi')]
    # NFD needs no GPU, so never the NVIDIA runtime
    assert [s for s in _pod_specs(objects) if 'runtimeClassName' in s and s is not gfd] == []


def test_gfd_runs_in_node_feature_api_mode_with_what_that_mode_needs():
    objects = _render('gfd.yml.j2')
    pod = _one(objects, 'DaemonSet')['spec']['template']['spec']
    [container] = pod['containers']
    env = dict((e['name'], e['valueFrom']['fieldRef']['fieldPath']) for e in container['env'] if 'valueFrom' in e)
    assert env == {'NODE_NAME': 'spec.nodeName', 'NAMESPACE': 'metadata.namespace', 'POD_NAME': 'metadata.name'}
    config = yaml.safe_load(_gfd_config_text())
    # A top-level flag (CommandLineFlags.UseNodeFeatureAPI in the plugin's api/config/v1/flags.go), not a GFD one
    assert config['flags']['useNodeFeatureAPI'] is True and 'useNodeFeatureAPI' not in config['flags']['gfd']
    # No features.d output: nothing of GFD's is written on the host
    assert [v for v in pod['volumes'] if 'features.d' in v.get('hostPath', {}).get('path', '')] == []
    # The config file GFD is told to read is the one the ConfigMap volume puts there
    [mount] = [m for m in container['volumeMounts'] if m['name'] == 'config']
    [volume] = [v for v in pod['volumes'] if v['name'] == 'config']
    configmap = _one(objects, 'ConfigMap')
    assert volume['configMap']['name'] == configmap['metadata']['name']
    assert container['args'] == ['--config-file=%s/config.yaml' % mount['mountPath']]
    # RBAC: the service account the pod runs as may write NodeFeatures and read its own pod (owner reference)
    account = _one(objects, 'ServiceAccount')
    assert pod['serviceAccountName'] == account['metadata']['name']
    binding = _one(objects, 'ClusterRoleBinding')
    assert binding['subjects'] == [{'kind': 'ServiceAccount', 'name': account['metadata']['name'],
                                    'namespace': 'nvidia-device-plugin'}]
    rules = _one(objects, 'ClusterRole', binding['roleRef']['name'])['rules']
    granted = set((group, resource, verb) for rule in rules for group in rule['apiGroups']
                  for resource in rule['resources'] for verb in rule['verbs'])
    assert {('nfd.k8s-sigs.io', 'nodefeatures', v) for v in ('get', 'create', 'update')} <= granted
    assert ('', 'pods', 'get') in granted
    assert _one(objects, 'DaemonSet')['metadata']['namespace'] == 'nvidia-device-plugin'


def test_gfd_config_follows_the_settings():
    config = yaml.safe_load(_gfd_config_text(gpuready_mig_strategy='mixed', gpuready_sharing=TIME_SLICING,
                                             feature_discovery_gfd_sleep_interval='infinite',
                                             feature_discovery_gfd_no_timestamp=True))
    assert config['version'] == 'v1'
    assert config['flags']['migStrategy'] == 'mixed'
    assert config['flags']['gfd']['sleepInterval'] == 'infinite' and config['flags']['gfd']['noTimestamp'] is True
    assert config['sharing'] == {'timeSlicing': {'renameByDefault': False, 'failRequestsGreaterThanOne': False,
                                                 'resources': [{'name': 'nvidia.com/gpu', 'replicas': 4}]}}
    assert 'sharing' not in yaml.safe_load(_gfd_config_text())
    env = [e['name'] for e in _gfd(gpuready_mig_strategy='single')['spec']['template']['spec']['containers'][0]['env']]
    assert 'NVIDIA_MIG_MONITOR_DEVICES' in env
    assert 'NVIDIA_MIG_MONITOR_DEVICES' not in [e['name'] for e in _gfd()['spec']['template']['spec']['containers'][0]['env']]


def test_checksum_is_the_sha256_of_the_config():
    for overrides in ({}, {'gpuready_sharing': TIME_SLICING, 'gpuready_mig_strategy': 'single'}):
        assert _checksum(**overrides) == hashlib.sha256(_gfd_config_text(**overrides).encode('utf-8')).hexdigest()


def test_checksum_changes_with_the_config_and_only_with_it():
    base = _checksum(gpuready_sharing=TIME_SLICING)
    changed = [
        {'gpuready_sharing': {'strategy': 'time-slicing', 'resources': [{'name': 'nvidia.com/gpu', 'replicas': 5}]}},
        {'gpuready_sharing': dict(TIME_SLICING, rename_by_default=True)},
        {'gpuready_sharing': dict(TIME_SLICING, strategy='mps')},
        {'gpuready_sharing': None},
        {'gpuready_sharing': TIME_SLICING, 'gpuready_mig_strategy': 'single'},
        {'gpuready_sharing': TIME_SLICING, 'feature_discovery_gfd_sleep_interval': '30s'},
    ]
    checksums = [_checksum(**overrides) for overrides in changed]
    assert base not in checksums and len(set(checksums)) == len(changed)
    # Settings outside the config change the pod template itself, not the checksum
    assert _checksum(gpuready_sharing=TIME_SLICING, gpuready_registry='registry.example.com/mirror',
                     gpuready_set_as_default=False, gpuready_image_pull_policy='Always') == base
    # The same settings written another way give the same config
    assert _checksum(gpuready_sharing={'resources': [{'replicas': '4', 'name': 'nvidia.com/gpu'}],
                                       'strategy': 'time-slicing'}) == base


def test_nfd_worker_config_changes_roll_the_worker():
    def worker_checksum(**overrides):
        worker = _one(_render('nfd.yml.j2', **overrides), 'DaemonSet', 'nfd-worker')
        return worker['spec']['template']['metadata']['annotations']['gpuready.nvidia/config-checksum']

    assert worker_checksum() != worker_checksum(feature_discovery_nfd_worker_sleep_interval='2s')
    conf = yaml.safe_load(_one(_render('nfd.yml.j2', feature_discovery_nfd_worker_sleep_interval='2s'),
                               'ConfigMap', 'nfd-worker-conf')['data']['nfd-worker.conf'])
    assert conf['core']['sleepInterval'] == '2s'


def test_nfd_worker_writes_the_label_gfd_is_placed_by():
    """nfd-worker's PCI source names a label pci-<fields joined by _>.present for each whitelisted device
    class: with the vendor field alone, an NVIDIA GPU (vendor 10de, class 0302) gives exactly the key of
    GFD's first affinity term. The other term is the label k8s_gpu_labels sets."""
    objects = _all()
    conf = yaml.safe_load(_one(objects, 'ConfigMap', 'nfd-worker-conf')['data']['nfd-worker.conf'])
    pci = conf['sources']['pci']
    assert any('0302'.startswith(prefix) for prefix in pci['deviceClassWhitelist'])
    nvidia_gpu = {'vendor': '10de', 'class': '0302'}
    key = 'feature.node.kubernetes.io/pci-%s.present' % '_'.join(nvidia_gpu[f] for f in pci['deviceLabelFields'])
    assert 'pci' in conf['core']['labelSources'] and 'local' in conf['core']['labelSources']
    gfd = _one(objects, 'DaemonSet', 'gpu-feature-discovery')['spec']['template']['spec']
    terms = gfd['affinity']['nodeAffinity']['requiredDuringSchedulingIgnoredDuringExecution']['nodeSelectorTerms']
    assert terms == [{'matchExpressions': [{'key': key, 'operator': 'In', 'values': ['true']}]},
                     {'matchExpressions': [{'key': 'nvidia.com/gpu.present', 'operator': 'In', 'values': ['true']}]}]
    # the worker reads the node's PCI devices and features.d where NFD looks for them
    worker = _one(objects, 'DaemonSet', 'nfd-worker')['spec']['template']['spec']
    mounts = dict((m['mountPath'], m['name']) for m in worker['containers'][0]['volumeMounts'])
    paths = dict((v['name'], v['hostPath']['path']) for v in worker['volumes'] if 'hostPath' in v)
    assert paths[mounts['/host-sys']] == '/sys'
    assert paths[mounts['/etc/kubernetes/node-feature-discovery/features.d']] == \
        '/etc/kubernetes/node-feature-discovery/features.d'


def test_placement_tolerations_priority_and_node_selector():
    objects = _all(feature_discovery_gfd_node_selector={'pool': 'gpu'})
    tolerations = [{'key': 'nvidia.com/gpu', 'operator': 'Exists', 'effect': 'NoSchedule'},
                   {'key': 'CriticalAddonsOnly', 'operator': 'Exists'}]
    for spec in _pod_specs(objects):
        assert spec['tolerations'] == tolerations
    gfd = _one(objects, 'DaemonSet', 'gpu-feature-discovery')['spec']['template']['spec']
    worker = _one(objects, 'DaemonSet', 'nfd-worker')['spec']['template']['spec']
    assert gfd['priorityClassName'] == worker['priorityClassName'] == 'system-node-critical'
    assert gfd['nodeSelector'] == {'pool': 'gpu'}
    assert 'nodeSelector' not in _gfd()['spec']['template']['spec']


def test_every_object_carries_our_label_and_selectors_pick_only_their_pods():
    objects = _all(gpuready_set_as_default=False)
    assert len(objects) == 3 + 13 + 5
    for obj in objects:
        assert obj['metadata']['labels'][MANAGED_BY] == 'gpuready.nvidia', (obj['kind'], obj['metadata']['name'])
    workloads = [o for o in objects if o['kind'] in ('DaemonSet', 'Deployment')]
    selectors = [o['spec']['selector']['matchLabels'] for o in workloads]
    assert len(set(tuple(sorted(s.items())) for s in selectors)) == len(workloads)
    for workload, selector in zip(workloads, selectors):
        labels = workload['spec']['template']['metadata']['labels']
        assert dict((k, labels[k]) for k in selector) == selector and labels[MANAGED_BY] == 'gpuready.nvidia'
    # containerd_runtime deletes GFD's pods after a containerd restart by this label
    assert _gfd()['spec']['template']['metadata']['labels']['app.kubernetes.io/name'] == 'gpu-feature-discovery'


@pytest.mark.parametrize('template', ['namespace.yml.j2', 'runtime-class.yml.j2'])
def test_objects_shared_with_the_device_plugin_role_are_rendered_alike(template):
    """Both roles server-side apply these with one field manager: any difference would be removed and
    added again by every run of each role."""
    settings = {'gpuready_set_as_default': False, 'gpuready_namespace': 'gpus', 'gpuready_runtime_class': 'rc'}
    [theirs] = manifest_render.render('device_plugin', template, settings)
    ours = _one(_render('prerequisites.yml.j2', **settings), theirs['kind'], theirs['metadata']['name'])
    assert ours == theirs


def test_nfd_namespace_only_when_we_deploy_nfd():
    def namespaces(**overrides):
        return [o['metadata']['name'] for o in _render('prerequisites.yml.j2', **overrides) if o['kind'] == 'Namespace']

    assert namespaces() == ['nvidia-device-plugin', 'node-feature-discovery']
    assert namespaces(feature_discovery_nfd='existing') == ['nvidia-device-plugin']
    assert namespaces(gpuready_nfd_namespace='nvidia-device-plugin') == ['nvidia-device-plugin']


def test_nfd_crds_serve_what_gfd_and_nfd_use():
    crds = dict((o['spec']['names']['kind'], o) for o in _render('nfd.yml.j2') if o['kind'] == 'CustomResourceDefinition')
    assert sorted(crds) == ['NodeFeature', 'NodeFeatureGroup', 'NodeFeatureRule']
    node_feature = crds['NodeFeature']
    assert node_feature['metadata']['name'] == 'nodefeatures.nfd.k8s-sigs.io'
    assert node_feature['spec']['scope'] == 'Namespaced'
    assert [(v['name'], v['served'], v['storage']) for v in node_feature['spec']['versions']] == [('v1alpha1', True, True)]
    spec_schema = node_feature['spec']['versions'][0]['schema']['openAPIV3Schema']['properties']['spec']
    assert spec_schema['properties']['labels']['additionalProperties'] == {'type': 'string'}
    assert crds['NodeFeatureRule']['spec']['scope'] == 'Cluster'


@pytest.mark.parametrize('version', KUBERNETES_VERSIONS)
def test_rendered_objects_are_valid_kubernetes(version):
    rendered = _all(gpuready_set_as_default=False, gpuready_sharing=TIME_SLICING, gpuready_mig_strategy='single',
                    feature_discovery_gfd_node_selector={'pool': 'gpu'})
    rendered += _all()
    for obj in rendered:
        kubernetes_validate.validate(obj, version, strict=True)


def test_validation_can_fail():
    """Negative control: strict mode rejects a misspelt field and a wrong type in our GFD DaemonSet."""
    daemonset = _gfd()
    misspelt = copy.deepcopy(daemonset)
    misspelt['spec']['template']['spec']['affinty'] = misspelt['spec']['template']['spec'].pop('affinity')
    wrong_type = copy.deepcopy(daemonset)
    wrong_type['spec']['template']['spec']['containers'][0]['securityContext']['privileged'] = 'yes'
    for broken in (misspelt, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)
