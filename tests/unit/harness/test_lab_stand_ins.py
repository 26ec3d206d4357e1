# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The option handling and decisions of the lab's stand-ins (lab/control/device_plugin.py, gfd.py,
nfd.py) without a cluster, loaded as the image imports them (tests/lab_control.py)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import subprocess
import sys

import pytest

import lab_control

device_plugin = lab_control.load('device_plugin')
gfd = lab_control.load('gfd')
nfd = lab_control.load('nfd')

TIME_SLICING = """
version: v1
flags:
  migStrategy: single
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
      - name: nvidia.com/gpu
        replicas: 4
"""


def test_plugin_defaults_are_the_real_plugins():
    opts = device_plugin.options([], {})
    assert opts['mig_strategy'] == 'none' and opts['fail_on_init_error'] is True
    assert opts['sharing'] is None and opts['device_id_strategy'] == 'uuid'
    assert opts['kubelet_socket'] == '/var/lib/kubelet/device-plugins/kubelet.sock'


def test_plugin_flag_beats_env_beats_config_file(tmp_path):
    config = tmp_path / 'config.yaml'
    config.write_text(TIME_SLICING)
    from_file = device_plugin.options([], {'CONFIG_FILE': str(config)})
    assert from_file['mig_strategy'] == 'single'
    assert from_file['sharing'] == {'strategy': 'time-slicing', 'rename_by_default': True,
                                    'fail_requests_greater_than_one': True,
                                    'resources': [{'name': 'nvidia.com/gpu', 'replicas': 4}]}
    from_env = device_plugin.options([], {'CONFIG_FILE': str(config), 'MIG_STRATEGY': 'mixed'})
    assert from_env['mig_strategy'] == 'mixed'
    from_flag = device_plugin.options(['--mig-strategy', 'none', '--fail-on-init-error=false'],
                                      {'CONFIG_FILE': str(config), 'MIG_STRATEGY': 'mixed'})
    assert from_flag['mig_strategy'] == 'none' and from_flag['fail_on_init_error'] is False


def test_plugin_refuses_a_config_file_it_cannot_read(tmp_path, capsys):
    broken = tmp_path / 'config.yaml'
    broken.write_text('sharing: [unclosed\n')
    assert device_plugin.main([], {'CONFIG_FILE': str(broken)}) == 1
    assert 'unable to load config' in capsys.readouterr().err
    assert device_plugin.main([], {'CONFIG_FILE': str(tmp_path / 'missing.yaml')}) == 1


def test_plugin_without_nvml_fails_with_the_real_messages():
    """A fresh process with the real pynvml, on this machine without libnvidia-ml.so.1, as in a runc container."""
    code = 'import sys; import device_plugin; sys.exit(device_plugin.main([], {}))'
    proc = subprocess.run([sys.executable, '-c', code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=60, check=False, env=lab_control.environment())
    assert proc.returncode == 1, proc.stderr
    assert ('Detected non-NVML platform: could not load NVML library: libnvidia-ml.so.1: cannot open shared '
            'object file') in proc.stderr
    assert 'Incompatible strategy detected auto' in proc.stderr
    assert 'If this is a GPU node, did you configure the NVIDIA Container Toolkit?' in proc.stderr
    assert 'error starting plugins' in proc.stderr
    # FAIL_ON_INIT_ERROR=false: the plugin stays up and advertises nothing.
    waiting = subprocess.Popen([sys.executable, '-c', code.replace('{}', '{"FAIL_ON_INIT_ERROR": "false"}')],
                               stderr=subprocess.PIPE, universal_newlines=True, env=lab_control.environment())
    try:
        lines = []
        for line in waiting.stderr:
            lines.append(line)
            if 'Waiting indefinitely' in line or 'error starting plugins' in line:
                break
        assert 'No devices found. Waiting indefinitely.' in lines[-1], lines
        assert waiting.poll() is None
    finally:
        waiting.kill()
        waiting.wait()


def test_plugin_index_ids_keep_replica_suffixes():
    facts = {'devices': [{'uuid': 'GPU-a', 'index': 0}, {'uuid': 'GPU-b', 'index': 1}]}
    assert device_plugin.index_ids({'nvidia.com/gpu': ['GPU-b::0', 'GPU-a::1', 'GPU-a']}, facts) == {
        'nvidia.com/gpu': ['1::0', '0::1', '0']}


def test_plugin_allocate_names_physical_gpus_and_enforces_one_per_request():
    sharing = {'strategy': 'time-slicing', 'rename_by_default': True, 'fail_requests_greater_than_one': True,
               'resources': []}
    opts = dict(device_plugin.options([], {}), sharing=sharing)
    resource = device_plugin.Resource('nvidia.com/gpu.shared', ['GPU-a::0', 'GPU-a::1', 'GPU-b::0'], opts)
    assert resource.endpoint == 'nvidia-gpu.shared.sock'
    answer = resource.allocate([{'devices_ids': ['GPU-a::1']}])
    assert answer == {'container_responses': [{'envs': {'NVIDIA_VISIBLE_DEVICES': 'GPU-a'}}]}
    assert 'only 1 allowed' in resource.allocate([{'devices_ids': ['GPU-a::0', 'GPU-b::0']}])['error']
    assert 'unknown device: GPU-z' in resource.allocate([{'devices_ids': ['GPU-z']}])['error']


def test_gfd_options_and_intervals(tmp_path):
    opts = gfd.options(['--oneshot', '--output-file=%s' % (tmp_path / 'gfd')],
                       {'NODE_NAME': 'n1', 'GFD_NO_TIMESTAMP': 'true', 'MIG_STRATEGY': 'single'})
    assert opts['oneshot'] is True and opts['no_timestamp'] is True and opts['mig_strategy'] == 'single'
    assert opts['use_node_feature_api'] is True and opts['namespace'] == 'default'
    kube = lab_control.load('kube')
    assert kube.duration_seconds('60s') == 60 and kube.duration_seconds('1m30s') == 90
    assert kube.duration_seconds('500ms') == 0.5 and kube.duration_seconds('infinite') is None
    for bad in ('soon', '10', '5s later', '0s'):
        with pytest.raises(ValueError):
            kube.duration_seconds(bad)


def test_gfd_in_node_feature_mode_needs_a_node_name(capsys):
    assert gfd.main([], {}) == 1
    assert 'required flag node-name not set' in capsys.readouterr().err


def test_gfd_file_output_is_key_value_lines(tmp_path):
    path = tmp_path / 'features.d' / 'gfd'
    gfd.write_file(str(path), {'nvidia.com/gpu.count': '4', 'nvidia.com/gpu.product': 'Tesla-P4'})
    assert path.read_text() == 'nvidia.com/gpu.count=4\nnvidia.com/gpu.product=Tesla-P4\n'
    assert oct(path.stat().st_mode & 0o777) == '0o644'


def test_nfd_worker_sources(tmp_path):
    features = tmp_path / 'features.d'
    features.mkdir()
    (features / 'gfd').write_text('# comment\nnvidia.com/gpu.count=4\nplain\n\n')
    assert nfd.local_labels(str(features)) == {'nvidia.com/gpu.count': '4',
                                               'feature.node.kubernetes.io/plain': 'true'}
    for bdf, klass, vendor in (('0000:37:00.0', '0x030200', '0x10de'), ('0000:00:1f.0', '0x060100', '0x8086')):
        device = tmp_path / 'sys' / 'bus' / 'pci' / 'devices' / bdf
        device.mkdir(parents=True)
        (device / 'class').write_text(klass + '\n')
        (device / 'vendor').write_text(vendor + '\n')
    conf = tmp_path / 'nfd-worker.conf'
    assert nfd.worker_conf(str(conf)) == {}
    assert nfd.pci_labels({}, str(tmp_path / 'sys')) == {'feature.node.kubernetes.io/pci-0302_10de.present': 'true'}
    conf.write_text('sources:\n  pci:\n    deviceClassWhitelist: ["03"]\n    deviceLabelFields: [vendor]\n')
    assert nfd.pci_labels(nfd.worker_conf(str(conf)), str(tmp_path / 'sys')) == {
        'feature.node.kubernetes.io/pci-10de.present': 'true'}


def test_nfd_master_merges_filters_and_takes_back():
    features = [
        {'metadata': {'namespace': 'nfd', 'name': 'n1', 'labels': {nfd.NODE_NAME_LABEL: 'n1'}},
         'spec': {'labels': {'feature.node.kubernetes.io/pci-10de.present': 'true', 'kubernetes.io/evil': 'x'}}},
        {'metadata': {'namespace': 'nfd', 'name': 'nvidia-features-for-n1', 'labels': {nfd.NODE_NAME_LABEL: 'n1'}},
         'spec': {'labels': {'nvidia.com/gpu.count': '4'}}},
        {'metadata': {'namespace': 'nfd', 'name': 'orphan'}, 'spec': {'labels': {'a.io/b': 'c'}}},
    ]
    wanted = nfd.desired_labels(features)
    assert wanted == {'n1': {'feature.node.kubernetes.io/pci-10de.present': 'true', 'nvidia.com/gpu.count': '4'}}
    node = {'metadata': {'name': 'n1', 'labels': {'nvidia.com/gpu.product': 'Tesla-P4', 'keep': 'me'},
                         'annotations': {nfd.FEATURE_LABELS: 'nvidia.com/gpu.product'}}}
    patch = nfd.node_patch(node, wanted['n1'])
    assert patch['metadata']['labels'] == {'feature.node.kubernetes.io/pci-10de.present': 'true',
                                           'nvidia.com/gpu.count': '4', 'nvidia.com/gpu.product': None}
    assert patch['metadata']['annotations'][nfd.FEATURE_LABELS] == 'nvidia.com/gpu.count,pci-10de.present'
    node['metadata']['labels'] = {'keep': 'me', 'feature.node.kubernetes.io/pci-10de.present': 'true',
                                  'nvidia.com/gpu.count': '4'}
    node['metadata']['annotations'] = {nfd.FEATURE_LABELS: 'nvidia.com/gpu.count,pci-10de.present'}
    assert nfd.node_patch(node, wanted['n1']) is None
