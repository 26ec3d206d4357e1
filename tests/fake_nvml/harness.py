# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Build the fake libnvidia-ml.so.1 (fake_nvml.c) and write its configuration and a fake sysfs tree.

A JSON-like dict is turned into the key=value file the C code reads (FAKE_NVML_CONFIG)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import shutil
import subprocess

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'fake_nvml.c')
MIB = 1024 * 1024


def build(directory):
    """Compile the fake NVML into directory; returns the .so path."""
    gcc = shutil.which('gcc')
    if not gcc:
        raise RuntimeError('gcc is needed to build the fake NVML')
    target = os.path.join(directory, 'libnvidia-ml.so.1')
    subprocess.run([gcc, '-shared', '-fPIC', '-O2', '-Wall', '-Wextra', '-Werror', '-Wl,-soname,libnvidia-ml.so.1',
                    '-o', target, SOURCE], check=True)
    return target


def write_config(path, config):
    """config: {init_rc, driver, nvml, cuda, devices: [{name, uuid, bus_id, minor, memory (bytes),
    compute_capability [major, minor], mig_mode [current, pending] , max_mig, not_supported [symbols]}]}."""
    lines = ['init_rc=%d' % config.get('init_rc', 0), 'driver=%s' % config.get('driver', '535.183.01'),
             'nvml=%s' % config.get('nvml', '12.%s' % config.get('driver', '535.183.01')),
             'cuda=%d' % config.get('cuda', 12020), 'count=%d' % len(config.get('devices', []))]
    for index, dev in enumerate(config.get('devices', [])):
        values = {
            'name': dev['name'], 'uuid': dev['uuid'], 'bus_id': dev['bus_id'], 'minor': dev.get('minor', index),
            'memory': dev['memory'], 'cc_major': dev['compute_capability'][0],
            'cc_minor': dev['compute_capability'][1], 'mig_current': dev.get('mig_mode', [0, 0])[0],
            'mig_pending': dev.get('mig_mode', [0, 0])[1], 'max_mig': dev.get('max_mig', 0),
            'not_supported': ','.join(dev.get('not_supported', [])),
        }
        lines.extend('dev%d.%s=%s' % (index, key, value) for key, value in values.items())
    with open(path, 'w') as handle:
        handle.write('\n'.join(lines) + '\n')
    return path


def write_sysfs(root, functions, modules=()):
    """functions: {sysfs bus id: (vendor, class)}; modules: names under <root>/module."""
    for bus_id, (vendor, pci_class) in functions.items():
        path = os.path.join(root, 'bus', 'pci', 'devices', bus_id)
        os.makedirs(path)
        for name, value in (('vendor', vendor), ('class', pci_class), ('device', '0x1bb3')):
            with open(os.path.join(path, name), 'w') as handle:
                handle.write(value + '\n')
    os.makedirs(os.path.join(root, 'bus', 'pci', 'devices'), exist_ok=True)
    for name in modules:
        os.makedirs(os.path.join(root, 'module', name))
    return root
