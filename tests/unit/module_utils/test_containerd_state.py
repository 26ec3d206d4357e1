# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""containerd_state: deciding a restart from running state (the daemon side is covered by the
Molecule scenarios and test_containerd_nvidia_runtime's real daemons)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import subprocess
import time

from ansible_collections.gpuready.nvidia.plugins.module_utils import containerd_state as state

ACTIVE = {'name': 'containerd', 'active_state': 'active', 'main_pid': 42, 'started_at': 1000.0}


def cri(default='nvidia', runtimes=('runc', 'nvidia'), ready=True):
    return {'default_runtime_name': default, 'runtimes': dict((r, {}) for r in runtimes), 'runtime_ready': ready}


def files(mtime=900.0):
    return [{'path': '/etc/containerd/config.toml', 'exists': True, 'mtime': mtime}]


def test_nothing_to_do_when_containerd_runs_its_files():
    assert state.restart_reasons(ACTIVE, cri(), None, files(), 'nvidia', True) == []
    assert state.restart_reasons(ACTIVE, cri(default=''), None, files(), 'nvidia', False) == []
    assert state.restart_reasons(ACTIVE, cri(default='runc'), None, files(), 'nvidia', None) == []


def test_a_file_newer_than_the_service_needs_a_restart():
    assert state.restart_reasons(ACTIVE, cri(), None, files(mtime=1000.5), 'nvidia', True) == [
        '/etc/containerd/config.toml changed after containerd started']
    missing = [{'path': '/etc/containerd/conf.d/99-nvidia.toml', 'exists': False, 'mtime': None}]
    assert state.restart_reasons(ACTIVE, cri(), None, missing, 'nvidia', True) == []


def test_what_cri_loaded_decides_even_when_the_files_look_old():
    """A run killed after the write, with an mtime older than a restart for another reason, or a
    config containerd rejected: the running state shows it."""
    assert state.restart_reasons(ACTIVE, cri(default='runc'), None, files(), 'nvidia', True) == [
        "the running CRI plugin's default runtime is 'runc', not 'nvidia'"]
    assert state.restart_reasons(ACTIVE, cri(default='', runtimes=('runc',)), None, files(), 'nvidia', True) == [
        "the running CRI plugin has no runtime 'nvidia' (it has: runc)",
        "the running CRI plugin's default runtime is 'runc', not 'nvidia'"]
    assert state.restart_reasons(ACTIVE, cri(), None, files(), 'nvidia', False) == [
        "the running CRI plugin still has 'nvidia' as its default runtime"]


def test_a_stopped_service_or_a_silent_cri():
    stopped = dict(ACTIVE, active_state='failed', main_pid=0, started_at=None)
    assert state.restart_reasons(stopped, None, 'containerd is failed', files(), 'nvidia', True) == [
        'containerd is failed']
    assert state.restart_reasons(ACTIVE, None, 'no socket', files(), 'nvidia', True) == [
        'the CRI plugin does not answer: no socket']


def test_process_start_time_of_this_process():
    started = state.process_start_time(os.getpid())
    assert abs(started - state.process_start_time(os.getpid())) < 0.05  # stable, unlike btime
    assert time.time() - 3600 < started <= time.time() + 0.05


def test_service_state_reads_systemctl_show():
    def fake_run(args, **_kwargs):
        assert args == ['systemctl', 'show', '--property=ActiveState,MainPID', 'containerd']
        return subprocess.CompletedProcess(args, 0, stdout='MainPID=%d\nActiveState=active\n' % os.getpid())

    found = state.service_state('containerd', run=fake_run)
    assert found['active_state'] == 'active' and found['main_pid'] == os.getpid()
    assert abs(found['started_at'] - state.process_start_time(os.getpid())) < 0.05

    def stopped(args, **_kwargs):
        return subprocess.CompletedProcess(args, 0, stdout='MainPID=0\nActiveState=inactive\n')

    assert state.service_state('containerd', run=stopped) == {
        'name': 'containerd', 'active_state': 'inactive', 'main_pid': 0, 'started_at': None}


def test_config_files(tmp_path):
    present = tmp_path / 'config.toml'
    present.write_text('version = 2\n')
    found = state.config_files([str(present), str(tmp_path / 'missing.toml')])
    assert found[0]['exists'] and found[0]['mtime'] == os.stat(str(present)).st_mtime
    assert found[1] == {'path': str(tmp_path / 'missing.toml'), 'exists': False, 'mtime': None}
