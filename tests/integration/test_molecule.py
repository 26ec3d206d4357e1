# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Molecule scenarios (molecule/*/molecule.yml) as `make test` runs them: `molecule test -s NAME`
in the collection's root. Each scenario's create/destroy start and remove its own lab nodes from the
cached lab images (molecule/shared/create.yml) around a real control plane of their own (a network
namespace each), so scenarios share nothing and GPUREADY_MOLECULE_JOBS of them (2 unless set) run at once: most of a
scenario's time is spent waiting on containerd restarts, rollouts and pod phases, not on CPU. For the
same reason they start when collection ends (conftest.py), beside the other integration tests."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MOLECULE_DIR = os.path.join(ROOT, 'molecule')
SCENARIOS = sorted(name for name in os.listdir(MOLECULE_DIR)
                   if os.path.exists(os.path.join(MOLECULE_DIR, name, 'molecule.yml')))
# Started first so that the last ones to finish are short: the cluster scenarios take longest.
CLUSTER_SCENARIOS = ('sharing', 'default', 'runtimeclass', 'mig')
JOBS = int(os.environ.get('GPUREADY_MOLECULE_JOBS', '2'))
# What a leaked credential looks like in a log: a private key, a kubeconfig's inline key, a bearer token
# (the scenarios' users authenticate with client keys their lab's CA issued)
SECRET_SHAPES = re.compile(r'PRIVATE KEY-----|client-key-data|Bearer [A-Za-z0-9_.-]{20,}')
# (scenario names in start order, {name: future of _run_scenario}), set by start_scenarios
RUNS = pytest.StashKey()


def _run_scenario(scenario):
    molecule = os.path.join(os.path.dirname(sys.executable), 'molecule')
    # Molecule's own choice, ~/.ansible/tmp/molecule.<hash of the checkout's folder NAME>.<scenario>, is
    # shared by every checkout called main and keeps what a killed run left; a fresh one per run is neither.
    ephemeral = tempfile.mkdtemp(prefix='gpuready-mol-%s-' % scenario)
    env = dict(os.environ, ANSIBLE_NOCOLOR='1', PY_COLORS='0', ANSIBLE_FORCE_COLOR='0',
               MOLECULE_EPHEMERAL_DIRECTORY=ephemeral)
    started = time.monotonic()
    try:
        proc = subprocess.run([molecule, 'test', '-s', scenario], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, universal_newlines=True, timeout=1500, check=False)
    finally:
        shutil.rmtree(ephemeral, ignore_errors=True)
    return proc.returncode, proc.stdout, time.monotonic() - started


def start_scenarios(config, lab_module, items):
    """The scenarios of the selected test_scenario items, submitted to a pool of JOBS; the futures in
    config.stash[RUNS]."""
    selected = set(item.callspec.params['scenario'] for item in items if hasattr(item, 'callspec'))
    order = [name for name in CLUSTER_SCENARIOS if name in selected]
    order += [name for name in SCENARIOS if name in selected and name not in order]
    try:
        # Built here once: the scenarios' creates (lab.py up) then find the images cached, none builds them twice.
        lab_module.Lab().build_images()
    except lab_module.LabError as err:
        failed = concurrent.futures.Future()
        failed.set_exception(err)
        config.stash[RUNS] = (order, dict((name, failed) for name in order))
        return
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=JOBS)
    config.stash[RUNS] = (order, dict((name, pool.submit(_run_scenario, name)) for name in order))
    pool.shutdown(wait=False)


def cancel_scenarios(config):
    """At the end of the session (an interrupted one too): the scenarios not started yet never start."""
    for future in config.stash.get(RUNS, ((), {}))[1].values():
        future.cancel()


@pytest.fixture(scope='module')
def scenario_runs(request, lab_module):  # pylint: disable=unused-argument  # lab_module: root, podman
    order, runs = request.config.stash[RUNS]
    yield runs
    concurrent.futures.wait(runs.values())
    # The wall time of each scenario, past pytest's capture (make test reports per stage only)
    with request.config.pluginmanager.getplugin('capturemanager').global_and_fixture_disabled():
        sys.stderr.write('\nmolecule scenarios (%d at a time): %s\n' % (JOBS, ', '.join(
            '%s %s' % (name, 'rc %d %.0f s' % (runs[name].result()[0], runs[name].result()[2])
                       if runs[name].exception() is None else runs[name].exception()) for name in order)))


def test_scenarios_found():
    assert 'node_default' in SCENARIOS
    assert set(CLUSTER_SCENARIOS) <= set(SCENARIOS)


@pytest.mark.parametrize('scenario', SCENARIOS)
def test_scenario(scenario, scenario_runs):  # pylint: disable=redefined-outer-name
    returncode, output, seconds = scenario_runs[scenario].result()
    print('molecule %s: rc %d in %.0f s' % (scenario, returncode, seconds))
    assert returncode == 0, output[-12000:]
    leaked = sorted(set(match.group(0)[:16] for match in SECRET_SHAPES.finditer(output)))
    assert not leaked, 'credential-like text in the Molecule log: %s' % leaked
