# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's nvidia-container-runtime stand-in (lab/node/nvidia_container_runtime.py): which GPUs a
container's NVIDIA_VISIBLE_DEVICES gives it, and the createContainer hook it adds. Its effect inside real pods
is checked by tests/integration/harness/test_lab.py and the Molecule scenario mig."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json

import pytest

import lab_scripts

runtime = lab_scripts.script('lab/node/nvidia_container_runtime.py', 'gpuready_lab_nvidia_container_runtime')

MIG_A, MIG_B = {'uuid': 'MIG-a', 'slot': 0}, {'uuid': 'MIG-b', 'slot': 1}
DEVICES = [{'uuid': 'GPU-0', 'minor_number': 0},
           {'uuid': 'GPU-1', 'minor_number': 1, 'mig_devices': [MIG_A, MIG_B]}]


def test_all_and_indices_and_gpu_uuids():
    assert runtime.select(DEVICES, ['all']) == DEVICES
    assert runtime.select(DEVICES, ['1', 'GPU-0']) == [DEVICES[1], DEVICES[0]]
    assert runtime.select(DEVICES, ['0', 'GPU-0']) == [DEVICES[0]]


def test_a_mig_uuid_gives_its_parent_with_only_that_mig_device():
    assert runtime.select(DEVICES, ['MIG-b']) == [dict(DEVICES[1], mig_devices=[MIG_B])]
    assert runtime.select(DEVICES, ['MIG-a', 'MIG-b']) == [dict(DEVICES[1], mig_devices=[MIG_A, MIG_B])]


def test_an_unknown_device_is_refused():
    with pytest.raises(ValueError, match="unknown device 'MIG-c'"):
        runtime.select(DEVICES, ['MIG-c'])


def test_create_adds_the_proc_driver_hook_when_the_node_has_driver_entries(tmp_path, monkeypatch):
    proc_driver = tmp_path / 'proc-driver'
    bundle = tmp_path / 'bundle'
    bundle.mkdir()
    spec = {'root': {'path': 'rootfs'}, 'process': {'env': ['PATH=/bin']}}
    (bundle / 'config.json').write_text(json.dumps(spec))
    monkeypatch.setattr(runtime, 'LOG', str(tmp_path / 'runtime.log'))
    monkeypatch.setattr(runtime, 'PROC_DRIVER', str(proc_driver))
    runtime.inject(str(bundle), 'c1')  # no driver entries on this node: no hook
    assert 'hooks' not in json.loads((bundle / 'config.json').read_text())
    proc_driver.mkdir()
    runtime.inject(str(bundle), 'c1')
    hooks = json.loads((bundle / 'config.json').read_text())['hooks']
    hook = {'path': runtime.SELF, 'args': ['nvidia-container-runtime', 'proc-driver-hook']}
    assert hooks == {'createContainer': [hook]}
