# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The filter and test plugins import neither the kubernetes client nor urllib3. Ansible loads every filter file
of a collection, in a fresh worker process, for each task that uses one of them: an import of the kubernetes
package there cost each such task about a second and a half (profile_tasks on the lab's site.yml re-run)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import subprocess
import sys

import manifest_render

PLUGINS = os.path.join(manifest_render.COLLECTION_ROOT, 'plugins')


def test_no_plugin_file_imports_the_kubernetes_client():
    names = ['ansible_collections.gpuready.nvidia.plugins.%s.%s' % (kind, name[:-3])
             for kind in ('filter', 'test') for name in sorted(os.listdir(os.path.join(PLUGINS, kind)))
             if name.endswith('.py')]
    assert len(names) >= 8
    probe = ('import importlib, sys\n'
             'for name in sys.argv[1:]:\n'
             '    importlib.import_module(name)\n'
             'print(sorted(m for m in sys.modules if m.split(".")[0] in ("kubernetes", "urllib3")))\n')
    proc = subprocess.run([sys.executable, '-c', probe] + names, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == '[]'
