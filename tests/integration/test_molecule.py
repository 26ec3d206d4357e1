# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Molecule scenarios (molecule/*/molecule.yml) as `make test` runs them: `molecule test -s NAME`
in the collection's root. Each scenario's create/destroy start and remove its own lab nodes from the
cached lab images (molecule/shared/create.yml)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MOLECULE_DIR = os.path.join(ROOT, 'molecule')
SCENARIOS = sorted(name for name in os.listdir(MOLECULE_DIR)
                   if os.path.exists(os.path.join(MOLECULE_DIR, name, 'molecule.yml')))


def test_scenarios_found():
    assert 'node_default' in SCENARIOS


@pytest.mark.parametrize('scenario', SCENARIOS)
def test_scenario(scenario, lab_module):  # pylint: disable=unused-argument  # lab_module: root, podman
    molecule = os.path.join(os.path.dirname(sys.executable), 'molecule')
    env = dict(os.environ, ANSIBLE_NOCOLOR='1', PY_COLORS='0', ANSIBLE_FORCE_COLOR='0')
    started = time.monotonic()
    proc = subprocess.run([molecule, 'test', '-s', scenario], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, timeout=1500, check=False)
    print('molecule %s: rc %d in %.0f s' % (scenario, proc.returncode, time.monotonic() - started))
    assert proc.returncode == 0, proc.stdout[-12000:]
