# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the doctor reads on a GPU node: the host side of the chain, as raw evidence.

Plain Python, no Ansible, and nothing beyond the standard library, pynvml and grpcio (both optional:
their absence is evidence too), because it runs with the node's Python. Nothing is judged here: the
controller (module_utils/doctor.py) parses the TOML and decides, so one place holds every rule.
Only what exists on any node is read: sysfs, /dev, the config files, systemd, the CRI socket, the
kubelet's files.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import glob
import os
import re

from ansible_collections.gpuready.nvidia.plugins.module_utils import containerd_state, cri, nvml

TEXT_LIMIT = 256 * 1024  # bytes of one config file kept: a containerd config is a few KiB
# `imports = [...]` at the top of a containerd config (before any table), read without a TOML parser
IMPORTS_RE = re.compile(r'^imports\s*=\s*\[([^\]]*)\]', re.MULTILINE)
BINARY_NAME_RE = re.compile(r'^\s*BinaryName\s*=\s*["\']([^"\']+)["\']', re.MULTILINE)
TOOLKIT_BINARIES = ('/usr/bin/nvidia-container-runtime', '/usr/bin/nvidia-ctk')


def read_text(path):
    """{path, exists, text, error}: a file as text (first TEXT_LIMIT bytes)."""
    try:
        with open(path, 'rb') as handle:
            data = handle.read(TEXT_LIMIT)
    except OSError as exc:
        exists = os.path.lexists(path)
        return {'path': path, 'exists': exists, 'text': None, 'error': None if not exists else str(exc)}
    return {'path': path, 'exists': True, 'text': data.decode('utf-8', 'replace'), 'error': None}


def imported_files(config_text, config_path):
    """The files a containerd config's `imports` globs match (relative globs are relative to it)."""
    match = IMPORTS_RE.search(config_text or '')
    if not match:
        return []
    files = []
    for pattern in re.findall(r'["\']([^"\']+)["\']', match.group(1)):
        if not os.path.isabs(pattern):
            pattern = os.path.join(os.path.dirname(config_path), pattern)
        files.extend(sorted(glob.glob(pattern)))
    return files


def executables(paths):
    """{path: True when it is an executable file}."""
    return dict((path, os.path.isfile(path) and os.access(path, os.X_OK)) for path in paths)


def device_plugin_sockets(kubelet_root_dir):
    """{dir, exists, sockets}: the kubelet's device-plugins folder and the sockets in it."""
    folder = os.path.join(kubelet_root_dir, 'device-plugins')
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return {'dir': folder, 'exists': False, 'sockets': []}
    return {'dir': folder, 'exists': True, 'sockets': [n for n in names if n.endswith('.sock')]}


def gather(sysfs_root='/sys', dmi_product_file='/sys/class/dmi/id/product_name', dev_root='/dev',
           proc_version=nvml.PROC_VERSION, containerd_unit='containerd',
           containerd_socket='/run/containerd/containerd.sock',
           containerd_config='/etc/containerd/config.toml', kubelet_config='/var/lib/kubelet/config.yaml',
           kubelet_root_dir='/var/lib/kubelet', runtime_name='nvidia', cri_timeout=cri.DEFAULT_TIMEOUT):
    """The node's evidence for every host-side link (see module_utils/doctor.py for the rules)."""
    config = read_text(containerd_config)
    drop_ins = [read_text(path) for path in imported_files(config['text'], containerd_config)]
    binaries = set(TOOLKIT_BINARIES)
    for entry in [config] + drop_ins:
        binaries.update(BINARY_NAME_RE.findall(entry['text'] or ''))
    state = containerd_state.gather(containerd_unit, containerd_socket,
                                    [containerd_config] + [entry['path'] for entry in drop_ins],
                                    runtime_name, None, timeout=cri_timeout)
    return {
        'gpu': nvml.gather(sysfs_root=sysfs_root, dmi_product_file=dmi_product_file, dev_root=dev_root,
                           proc_version=proc_version),
        'pci_gpus': sorted(nvml.sysfs_gpus(sysfs_root)),
        'pynvml': {'present': nvml.HAS_PYNVML, 'error': nvml.PYNVML_IMPORT_ERROR},
        'executables': executables(sorted(binaries)),
        'containerd': {'config': config, 'drop_ins': drop_ins, 'service': state['service'],
                       'cri': state['cri'], 'cri_error': state['cri_error'], 'config_files': state['config_files']},
        'kubelet': {'config': read_text(kubelet_config), 'device_plugins': device_plugin_sockets(kubelet_root_dir)},
    }
