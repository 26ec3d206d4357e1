# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The smoke runs of two small benchmarks that `make test` includes: bench/bench.py --smoke labels (10
API-only nodes, ours against kubernetes.core.k8s and kubectl) and doctor (20 nodes) write their results in
the documented shape, and the request counts, which do not depend on the machine's speed, meet the goals.
Timings are only reported (bench/README.md), never asserted."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIELDS = {'name', 'figure', 'unit', 'baseline', 'ratio', 'goal', 'met', 'machine', 'date', 'extrapolated', 'details'}


def _smoke(tmp_path, name, result_file):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, 'bench', 'bench.py'), '--smoke', '--out', str(tmp_path),
                           name], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-6000:]
    with open(str(tmp_path / result_file)) as handle:
        return json.load(handle)


def test_the_labels_benchmark_smoke_run(tmp_path):
    result = _smoke(tmp_path, 'labels', 'labels_10_nodes.json')
    assert set(result) == FIELDS
    assert set(result['baseline']) == {'what', 'figure'} and result['baseline']['figure'] > 0
    assert result['ratio'] == round(result['figure'] / result['baseline']['figure'], 4)
    assert result['extrapolated'] is False
    details = result['details']
    assert details['requests_per_changed_node'] == 2 and details['requests_per_unchanged_node'] == 1
    assert details['requests_per_call'] <= 1
    assert details['kubernetes_core_rerun_requests_per_node'] == 2  # a GET and an always-sent PATCH
    assert result['met'] is True
    assert '`labels_10_nodes`' in (tmp_path / 'SUMMARY.md').read_text()
    assert details['10']['ours_first_peak_rss_mib'] > 0


def test_the_doctor_benchmark_smoke_run(tmp_path):
    """The doctor reads 20 nodes' API evidence with one LIST of Nodes and one of pods, nothing per node."""
    result = _smoke(tmp_path, 'doctor', 'doctor_20_nodes.json')
    assert set(result) == FIELDS and result['extrapolated'] is False
    requests = result['details']['ours_requests_by_verb_and_resource']
    assert requests['list nodes'] == 1 and requests['list pods'] == 1
    assert 'get nodes' not in requests and 'get pods' not in requests
    assert result['details']['loop_requests_measured'] >= 2 * 20  # the baseline reads per node
    assert result['met'] is True and result['details']['ours_peak_rss_mib'] > 0


def test_an_unknown_benchmark_is_refused(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, 'bench', 'bench.py'), '--out', str(tmp_path), 'speed'],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, check=False)
    assert proc.returncode == 2 and 'unknown benchmark speed' in proc.stdout
    assert not os.listdir(str(tmp_path))
