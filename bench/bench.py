#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""make bench: our figures as ratios against a baseline measured in the same run (bench/README.md).

    python bench/bench.py [--smoke] [--out DIR] [NAME ...]     NAME: site nodes labels validate doctor wait overhead

Each benchmark writes DIR/<name>.json (name, figure, unit, baseline, ratio, goal, met, machine, date,
extrapolated, details) and DIR/SUMMARY.md sums them up. --smoke runs the smallest sizes only (make test).
Run with tools/test-env.sh sourced, as root (the site benchmark starts lab nodes).
"""

from __future__ import absolute_import, division, print_function

import argparse
import concurrent.futures
import datetime
import json
import multiprocessing
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'tests'))

import lab_scripts  # noqa: E402  (tests/ is not a package on the path by default)
from cluster_api import ClusterApi, install_nfd_crds  # noqa: E402
from playbook import run_tasks  # noqa: E402

GPU = 'nvidia.com/gpu'
PRESENT = {'nvidia.com/gpu.present': 'true'}


def _machine():
    return '%s, %d CPUs, Python %s' % (platform.platform(), os.cpu_count() or 0, platform.python_version())


def record(out, name, figure, unit, baseline, baseline_figure, goal, met, extrapolated=False, details=None):
    """Write one result; ratio = ours / baseline; met None: a figure reported, with no goal to meet."""
    result = {'name': name, 'figure': round(figure, 4), 'unit': unit,
              'baseline': {'what': baseline, 'figure': round(baseline_figure, 4)},
              'ratio': round(figure / baseline_figure, 4) if baseline_figure else None,
              'goal': goal, 'met': None if met is None else bool(met), 'machine': _machine(),
              'date': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
              'extrapolated': bool(extrapolated), 'details': details or {}}
    with open(os.path.join(out, name + '.json'), 'w') as handle:
        json.dump(result, handle, indent=2, sort_keys=True)
        handle.write('\n')
    print('%-28s %10.3f %-10s baseline %10.3f  ratio %s  goal: %s  met: %s%s' % (
        name, result['figure'], unit, result['baseline']['figure'], result['ratio'], goal, result['met'],
        '  (baseline extrapolated)' if extrapolated else ''), flush=True)
    return result


def _timed_tasks(work, tasks, **kwargs):
    os.makedirs(work, exist_ok=True)
    started = time.monotonic()
    proc, _results = run_tasks(work, tasks, **kwargs)
    if proc.returncode != 0:
        raise RuntimeError('ansible-playbook failed (rc %d):\n%s' % (proc.returncode, proc.stdout[-4000:]))
    return time.monotonic() - started


def _timed_tasks_rss(work, tasks):
    """(seconds, MiB): _timed_tasks in a fresh forked process, whose RUSAGE_CHILDREN then covers only this
    run: the peak resident memory of its largest process (ansible-playbook, its workers or the module)."""
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context('fork')) as pool:
        return pool.submit(_timed_tasks_with_rss, work, tasks).result()


def _timed_tasks_with_rss(work, tasks):
    seconds = _timed_tasks(work, tasks)
    return seconds, round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0, 1)


def _auth(cluster):
    return {'kubeconfig': cluster.kubeconfig()}


def _requests(cluster):
    return cluster.requests()


# -- 2: labelling N nodes -------------------------------------------------------------------------

def _label_ours(cluster, work, names):
    nodes = [{'name': n, 'labels': PRESENT} for n in names]
    task = {'name': 'label', 'register': 'r', 'gpuready.nvidia.k8s_gpu_labels': dict(_auth(cluster), nodes=nodes)}
    cluster.clear_requests()
    seconds, rss = _timed_tasks_rss(work, [task])
    requests = _requests(cluster)
    # Node requests, and those made once per call (the NodeFeature LIST behind respect_gfd)
    return seconds, len([r for r in requests if r['resource'] == 'nodes']), len(requests), rss


def _label_kubernetes_core(cluster, work, names):
    task = {'name': 'label', 'register': 'r', 'loop': names,
            'kubernetes.core.k8s': dict(_auth(cluster), state='patched', kind='Node', name='{{ item }}',
                                        definition={'metadata': {'labels': PRESENT}})}
    cluster.clear_requests()
    seconds = _timed_tasks(work, [task])
    requests = _requests(cluster)
    # Node requests, and the rest (API discovery, which kubernetes.core repeats per loop iteration or caches)
    nodes = len([r for r in requests if r['resource'] == 'nodes'])
    return seconds, nodes, len(requests) - nodes


def _label_kubectl(cluster, names):
    env = dict(os.environ, KUBECONFIG=cluster.kubeconfig())
    cluster.clear_requests()
    started = time.monotonic()
    for name in names:
        subprocess.run(['kubectl', 'label', 'node', name, '--overwrite', 'nvidia.com/gpu.present=true'], env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True)
    return time.monotonic() - started, len(_requests(cluster))


def bench_labels(out, work, smoke):
    sizes = [10] if smoke else [10, 100, 1000]
    baseline_sizes = [10] if smoke else [10, 100]
    details = {}
    with _Cluster(work, 'labels') as cluster:
        for n in sizes:
            names = cluster.add_nodes(n, prefix='bench-%d-' % n)
            first = _label_ours(cluster, os.path.join(work, 'l%d-1' % n), names)
            again = _label_ours(cluster, os.path.join(work, 'l%d-2' % n), names)
            row = {'ours_first_s': first[0], 'ours_first_node_requests': first[1], 'ours_first_requests': first[2],
                   'ours_first_peak_rss_mib': first[3], 'ours_rerun_s': again[0],
                   'ours_rerun_node_requests': again[1], 'ours_rerun_requests': again[2]}
            if n in baseline_sizes:
                names = cluster.add_nodes(n, prefix='bench-%d-k-' % n)
                kc = _label_kubernetes_core(cluster, os.path.join(work, 'k%d' % n), names)
                kc_again = _label_kubernetes_core(cluster, os.path.join(work, 'k%d-2' % n), names)
                row.update(kubernetes_core_s=kc[0], kubernetes_core_requests=kc[1],
                           kubernetes_core_rerun_requests=kc_again[1], kubernetes_core_discovery_requests=kc[2])
                if shutil.which('kubectl'):
                    names = cluster.add_nodes(n, prefix='bench-%d-c-' % n)
                    ctl = _label_kubectl(cluster, names)
                    row.update(kubectl_s=ctl[0], kubectl_requests=ctl[1])
            details[str(n)] = row
    n = sizes[-1]
    base = baseline_sizes[-1]
    scale = n / base
    baseline_s = details[str(base)]['kubernetes_core_s'] * scale
    ours = details[str(n)]
    per_changed = ours['ours_first_node_requests'] / n
    per_unchanged = ours['ours_rerun_node_requests'] / n
    per_call = max(ours['ours_first_requests'] - ours['ours_first_node_requests'],
                   ours['ours_rerun_requests'] - ours['ours_rerun_node_requests'])
    details['kubernetes_core_requests_per_node'] = details[str(base)]['kubernetes_core_requests'] / base
    details['kubernetes_core_rerun_requests_per_node'] = details[str(base)]['kubernetes_core_rerun_requests'] / base
    details['requests_per_changed_node'] = per_changed
    details['requests_per_unchanged_node'] = per_unchanged
    details['requests_per_call'] = per_call
    details['kubectl'] = ('kubectl label per node, measured at every N where kubernetes.core is (kubectl_*)'
                          if shutil.which('kubectl') else 'not measured: no kubectl on this machine')
    return record(out, 'labels_%d_nodes' % n, ours['ours_first_s'], 's',
                  'kubernetes.core.k8s state=patched, one task iteration per node, at N=%d%s'
                  % (base, ', scaled linearly to %d' % n if scale != 1 else ''), baseline_s,
                  '<= 2 requests per changed node, exactly 1 per unchanged node (plus at most 1 per call)',
                  per_changed <= 2 and per_unchanged == 1 and per_call <= 1, extrapolated=scale != 1, details=details)


# -- 3 and 4: validation across nodes, and how soon it notices --------------------------------------

def _gpu_node(name, allocatable):
    status = {'capacity': {GPU: '4'}, 'allocatable': {GPU: str(allocatable)},
              'conditions': [{'type': 'Ready', 'status': 'True'}]}
    return {'apiVersion': 'v1', 'kind': 'Node', 'metadata': {'name': name, 'labels': dict(PRESENT)}, 'status': status}


def _fleet(cluster, n, allocatable=4):
    names = ['gpu-%04d' % i for i in range(n)]
    for name in names:
        cluster.api.create(_gpu_node(name, allocatable))
    return names


def bench_validate(out, work, smoke):
    n, base = (20, 20) if smoke else (1000, 100)
    with _Cluster(work, 'validate') as cluster:
        names = _fleet(cluster, n)
        expected = dict((name, {GPU: 4}) for name in names)
        task = {'name': 'validate', 'register': 'r', 'gpuready.nvidia.k8s_gpu_validate': dict(
            _auth(cluster), expected=expected, test_pod=False, page_size=500)}
        cluster.clear_requests()
        ours_s, ours_rss = _timed_tasks_rss(os.path.join(work, 'v-ours'), [task])
        requests = _requests(cluster)
        loop = {'name': 'read', 'register': 'r', 'loop': names[:base],
                'kubernetes.core.k8s_info': dict(_auth(cluster), kind='Node', name='{{ item }}')}
        cluster.clear_requests()
        loop_s = _timed_tasks(os.path.join(work, 'v-loop'), [loop])
        loop_requests = len(_requests(cluster))
    lists = [r for r in requests if r['verb'] == 'list']
    watches = [r for r in requests if r['verb'] == 'watch']
    details = {'nodes': n, 'ours_requests': len(requests), 'ours_lists': len(lists), 'ours_watches': len(watches),
               'ours_peak_rss_mib': ours_rss, 'loop_nodes_measured': base, 'loop_s_measured': loop_s, 'loop_requests_measured': loop_requests}
    baseline_s = loop_s * n / base
    return record(out, 'validate_%d_nodes' % n, ours_s, 's',
                  'kubernetes.core.k8s_info per node in a loop, measured at N=%d%s'
                  % (base, ', scaled linearly to %d' % n if n != base else ''), baseline_s,
                  'O(1) paginated label-selected LISTs plus at most one WATCH; wall time < 0.2x the loop',
                  len(lists) <= -(-n // 500) + 1 and len(watches) <= 1 and ours_s < 0.2 * baseline_s,
                  extrapolated=n != base, details=details)


def bench_doctor(out, work, smoke):
    """The doctor's API evidence for N nodes: k8s_gpu_doctor with every node uninspected (the API side of
    the evidence is read all the same), its requests counted per resource and verb."""
    n, base = (20, 20) if smoke else (1000, 50)
    with _Cluster(work, 'doctor') as cluster:
        names = _fleet(cluster, n)
        task = {'name': 'doctor', 'register': 'r', 'gpuready.nvidia.k8s_gpu_doctor': dict(
            _auth(cluster), nodes=dict((name, None) for name in names))}
        cluster.clear_requests()
        ours_s, ours_rss = _timed_tasks_rss(os.path.join(work, 'd-ours'), [task])
        requests = _requests(cluster)
        # What a playbook gathers per node with kubernetes.core: the Node and the pods on it
        loop = [{'name': 'node', 'loop': names[:base],
                 'kubernetes.core.k8s_info': dict(_auth(cluster), kind='Node', name='{{ item }}')},
                {'name': 'pods', 'loop': names[:base], 'kubernetes.core.k8s_info': dict(
                    _auth(cluster), kind='Pod', field_selectors=['spec.nodeName={{ item }}'])}]
        cluster.clear_requests()
        loop_s, loop_rss = _timed_tasks_rss(os.path.join(work, 'd-loop'), loop)
        loop_requests = len(_requests(cluster))
    per_kind = {}
    for r in requests:
        key = '%s %s' % (r['verb'], r['resource'])
        per_kind[key] = per_kind.get(key, 0) + 1
    pages = -(-n // 500)
    details = {'nodes': n, 'ours_requests': len(requests), 'ours_requests_by_verb_and_resource': per_kind,
               'ours_peak_rss_mib': ours_rss, 'loop_nodes_measured': base, 'loop_s_measured': loop_s,
               'loop_requests_measured': loop_requests, 'loop_peak_rss_mib': loop_rss}
    return record(out, 'doctor_%d_nodes' % n, ours_s, 's',
                  'kubernetes.core.k8s_info per node (its Node, its pods), measured at N=%d%s'
                  % (base, ', scaled linearly to %d' % n if n != base else ''), loop_s * n / base,
                  'one paginated LIST per kind (%d page(s) of Nodes, 1 of pods), no request per node' % pages,
                  per_kind.get('list nodes') == pages and per_kind.get('list pods') == 1
                  and not per_kind.get('get nodes'), extrapolated=n != base, details=details)


def _latency(notice, cluster, name, delay=2.0):
    """Seconds between the API server making the node allocatable and notice() returning."""
    changed = {}

    def change():
        time.sleep(delay)  # when the change comes is what is measured against, not a synchronisation
        changed['at'] = time.monotonic()
        cluster.api.patch('v1', 'Node', name, {'status': {'allocatable': {GPU: '4'}}}, subresource='status')
    thread = threading.Thread(target=change)
    thread.start()
    notice()
    noticed = time.monotonic()
    thread.join()
    return noticed - changed['at']


def bench_wait(out, work, smoke):
    from kubernetes import client, config
    from ansible_collections.gpuready.nvidia.plugins.module_utils import gpu_validate
    rounds = 1 if smoke else 3
    poll_delay = 10.0
    ours, polled = [], []
    with _Cluster(work, 'wait') as cluster:
        core = client.CoreV1Api(config.new_client_from_config(cluster.kubeconfig()))
        for i in range(rounds):
            name = 'wait-%d' % i
            cluster.api.create(_gpu_node(name, 0))
            ours.append(_latency(lambda: gpu_validate.wait_for_resources(core, {name: {GPU: 4}}, timeout=60),
                                 cluster, name))
            name = 'poll-%d' % i
            cluster.api.create(_gpu_node(name, 0))

            def poll():
                # DeepOps style: read, and if not there yet, sleep the retry delay
                while core.read_node(name).status.allocatable.get(GPU) != '4':
                    time.sleep(poll_delay)
            polled.append(_latency(poll, cluster, name, delay=2.0 + i * 3.1))
    figure, baseline = max(ours), sum(polled) / len(polled)
    return record(out, 'wait_latency', figure, 's', 'a read-then-sleep(%g s) poll, mean of %d' % (poll_delay, rounds),
                  baseline, '< 1 s from the change to validate noticing', figure < 1.0,
                  details={'ours_s': ours, 'poll_s': polled})


# -- 5: module overhead against ansible.builtin.stat ------------------------------------------------

def _config_2000_lines():
    lines = ['version = 2', '', '[plugins."io.containerd.grpc.v1.cri".containerd]',
             '  default_runtime_name = "nvidia"']
    for name in ['nvidia', 'runc'] + ['extra%03d' % i for i in range(330)]:
        lines += ['  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.%s]' % name,
                  '    runtime_type = "io.containerd.runc.v2"',
                  '    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.%s.options]' % name,
                  '      BinaryName = "/usr/bin/%s"' % ('nvidia-container-runtime' if name == 'nvidia' else 'runc'),
                  '      SystemdCgroup = true', '']
    return '\n'.join(lines[:2000]) + '\n'


def _per_task(work, tasks, repeat):
    """Seconds per task: a play of `repeat` copies minus an empty play, over repeat."""
    empty = _timed_tasks(os.path.join(work, 'empty'), [])
    full = _timed_tasks(os.path.join(work, 'full'), tasks * repeat)
    return max(full - empty, 0.0) / repeat


def _fake_gpus(work, count):
    from fake_nvml import harness
    import gfd_cases
    seed = [case for _name, case in gfd_cases.all_cases() if case['name'] == 'seed-4x-tesla-p4-driver-535'][0]
    case = dict(seed, name='bench-%d' % count, devices=[seed['devices'][0]] * count, vgpu_devices=[])
    lib_dir = os.path.join(work, 'lib')
    os.makedirs(lib_dir, exist_ok=True)
    if not os.path.exists(os.path.join(lib_dir, 'libnvidia-ml.so.1')):
        harness.build(lib_dir)
    node = harness.node_from_case(case, os.path.join(work, 'gpus-%d' % count))
    return lib_dir, node


def bench_overhead(out, work, smoke):
    repeat = 3 if smoke else 10
    os.makedirs(work, exist_ok=True)
    config = os.path.join(work, 'config.toml')
    with open(config, 'w') as handle:
        handle.write(_config_2000_lines())
    stat = {'name': 'stat', 'ansible.builtin.stat': {'path': config}}
    stat_s = _per_task(os.path.join(work, 'o-stat'), [stat], repeat)
    # As the containerd_runtime role calls it: with the applied record, so that a no-op skips the parse.
    args = {'path': config, 'set_as_default': True, 'applied_record': os.path.join(work, 'applied.json')}
    runtime = {'name': 'runtime', 'gpuready.nvidia.containerd_nvidia_runtime': args}
    _timed_tasks(os.path.join(work, 'o-runtime-first'), [runtime])  # the file as the module keeps it: then a no-op
    runtime_s = _per_task(os.path.join(work, 'o-runtime'), [runtime], repeat)
    unrecorded = {'name': 'runtime', 'gpuready.nvidia.containerd_nvidia_runtime': dict(args, applied_record=None)}
    parsed_s = _per_task(os.path.join(work, 'o-runtime-parsed'), [unrecorded], repeat)
    results = [record(out, 'overhead_containerd_nvidia_runtime', runtime_s, 's/task',
                      'ansible.builtin.stat on the same file, same play shape', stat_s, '<= 1.5x stat',
                      runtime_s <= 1.5 * stat_s,
                      details={'config_lines': 2000, 'repeat': repeat, 'with_applied_record': True,
                               'without_applied_record_s_per_task': parsed_s})]
    for count in ([8] if smoke else [8, 16]):
        lib_dir, node = _fake_gpus(work, count)
        facts = {'name': 'facts', 'gpuready.nvidia.nvidia_gpu_facts': {'sysfs_root': node['sysfs_root']},
                 'environment': {'LD_LIBRARY_PATH': lib_dir, 'FAKE_NVML_CONFIG': node['config']}}
        facts_s = _per_task(os.path.join(work, 'o-facts-%d' % count), [facts], repeat)
        results.append(record(out, 'overhead_nvidia_gpu_facts_%d_gpus' % count, facts_s, 's/task',
                              'ansible.builtin.stat, same play shape', stat_s, '<= 1.5x stat',
                              facts_s <= 1.5 * stat_s, details={'gpus': count, 'repeat': repeat}))
    return results


# -- 1: site.yml on the lab, first run and re-run ---------------------------------------------------

def _containerd_state(lab, names):
    return dict((name, lab.node_exec(lab.container(name), 'systemctl', 'show', '-p', 'MainPID',
                                     '-p', 'ExecMainStartTimestampMonotonic', 'containerd').strip())
                for name in names)


def _changed(output):
    return sum(int(m) for m in re.findall(r'changed=(\d+)', output.split('PLAY RECAP', 1)[-1]))


class _SiteLab(object):
    """A fresh lab of its own (prefix gpuready-bench-) with the air-gap sources site.yml needs, as make demo
    gives them: `run(playbook)` runs a playbook against it and returns (seconds, completed process)."""

    def __init__(self, work, nodes=None):
        import importlib.util
        spec = importlib.util.spec_from_file_location('lab', os.path.join(ROOT, 'lab', 'lab.py'))
        lab_module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(lab_module)
        self.work = work
        self.lab = lab_module.Lab(nodes=nodes, prefix='gpuready-bench-', run_dir=os.path.join(work, 'lab'))
        self.stop = self.command = self.env = None

    def __enter__(self):
        import apt_repo
        import offline_wheels
        wheels = os.path.join(self.work, 'wheels')
        offline_wheels.build(wheels)
        repo = os.path.join(self.work, 'apt-repo')
        apt_repo.build(repo)
        url, self.stop = apt_repo.serve(repo)
        try:
            self.lab.up()
        except BaseException:
            self.__exit__()
            raise
        exports = self.lab.exports()
        self.env = dict(os.environ, ANSIBLE_NOCOLOR='1', **self.lab.ansible_env())
        extra = json.dumps({'gpuready_k8s_kubeconfig': exports['KUBECONFIG'], 'node_python_wheels_dir': wheels,
                            'node_python_update_cache': False, 'container_toolkit_apt_repo_url': url + '/repo',
                            'container_toolkit_gpg_key': os.path.join(repo, 'gpgkey.asc')})
        self.command = [os.path.join(os.path.dirname(sys.executable), 'ansible-playbook'), '-i',
                        exports['GPUREADY_LAB_INVENTORY'], '-e', extra, '--forks', str(max(5, len(self.lab.names)))]
        return self

    def __exit__(self, *exc):
        if self.stop:
            self.stop()
        self.lab.down()

    def run(self, playbook, *args):
        started = time.monotonic()
        proc = subprocess.run(self.command + list(args) + [playbook], env=self.env, cwd=self.work,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, check=False)
        seconds = time.monotonic() - started
        if proc.returncode != 0:
            raise RuntimeError('%s failed:\n%s' % (playbook, proc.stdout[-4000:]))
        return seconds, proc


def bench_site(out, work, smoke):
    with _SiteLab(work) as site:
        first_s, _first = site.run('gpuready.nvidia.site')
        before = _containerd_state(site.lab, site.lab.names)
        rerun_s, rerun = site.run('gpuready.nvidia.site')
        after = _containerd_state(site.lab, site.lab.names)
    changed = _changed(rerun.stdout)
    return record(out, 'site_rerun', rerun_s, 's', 'the first site.yml run on the fresh 2-node lab', first_s,
                  're-run: 0 changed, 0 containerd restarts, wall time <= 0.4x the first run',
                  changed == 0 and before == after and rerun_s <= 0.4 * first_s,
                  details={'rerun_changed': changed, 'containerd_before': before, 'containerd_after': after})


def _node_play(work):
    """site.yml's node play alone, as a playbook in work (with the task file it imports)."""
    import yaml
    with open(os.path.join(ROOT, 'playbooks', 'site.yml')) as handle:
        plays = yaml.safe_load(handle)
    node_play = [play for play in plays if play['name'].startswith('GPU nodes')]
    shutil.copytree(os.path.join(ROOT, 'playbooks', 'tasks'), os.path.join(work, 'tasks'), dirs_exist_ok=True)
    path = os.path.join(work, 'node_play.yml')
    with open(path, 'w') as handle:
        json.dump(node_play, handle, indent=1)  # JSON is YAML
    return path


# Lab nodes in the order they join: 1, 2, then 4 (two P4 nodes on containerd 1.6 and 2.x, an H100, a MIG A100)
SCALING_NODES = ['gpu-p4', 'gpu-h100', 'gpu-p4-v3', 'gpu-a100-mig']


def bench_node_scaling(out, work, smoke):
    """site.yml's node play on fresh labs of 1, 2 and 4 GPU nodes (forks >= nodes): first run and re-run."""
    sizes = [1, 2] if smoke else [1, 2, 4]
    details = {}
    for n in sizes:
        folder = os.path.join(work, str(n))
        os.makedirs(folder)
        with _SiteLab(folder, nodes=SCALING_NODES[:n]) as site:
            playbook = _node_play(folder)
            first_s, _first = site.run(playbook)
            rerun_s, rerun = site.run(playbook)
        details[str(n)] = {'nodes': SCALING_NODES[:n], 'first_s': first_s, 'rerun_s': rerun_s,
                           'rerun_changed': _changed(rerun.stdout)}
    low, high = details[str(sizes[0])], details[str(sizes[-1])]
    growth = high['first_s'] / low['first_s']
    details['first_run_growth'] = growth
    details['rerun_growth'] = high['rerun_s'] / low['rerun_s']
    details['note'] = ('different node kinds join as the lab grows (%s), so part of the growth is theirs; '
                       'the machine has 2 cores for every node' % ', '.join(SCALING_NODES[:sizes[-1]]))
    return record(out, 'node_play_%d_nodes' % sizes[-1], high['first_s'], 's',
                  "site.yml's node play, first run on 1 fresh lab node", low['first_s'],
                  'reported: wall time nearly flat as nodes grow (growth factor from 1 to %d nodes)' % sizes[-1],
                  None, details=details)


class _Cluster(object):
    """A real control plane (lab/control_plane.py) in work/NAME for one benchmark, whose controllers leave Nodes
    alone (they have no kubelet), with NFD's CRDs and a user of its own, cluster admin by group, whose requests
    its audit log counts."""

    def __init__(self, work, name):
        self.directory = os.path.join(work, name)
        self.plane = self.api = self.user = None
        self.since = 0.0

    def __enter__(self):
        module = lab_scripts.script('lab/control_plane.py', 'gpuready_control_plane')
        self.plane = module.ControlPlane(self.directory, controller_manager_args=[
            '--controllers=*,bootstrapsigner,tokencleaner,-node-ipam-controller,-node-lifecycle-controller'])
        self.plane.up()
        self.api = ClusterApi(self.plane, self.plane.kubeconfig_path('admin'))
        install_nfd_crds(self.api.client)
        self.user = self.api.user_with_certificate('bench', self.directory, groups=['system:masters'])
        return self

    def __exit__(self, *exc):
        left = self.plane.down()
        if left:
            raise RuntimeError('control plane down left: %s' % ', '.join(left))

    def kubeconfig(self):
        return self.user.kubeconfig

    def clear_requests(self):
        self.since = time.time()

    def requests(self):
        """The bench user's requests since clear_requests(), from the audit log."""
        return [r for r in self.plane.requests() if r['user'] == 'bench' and r['time'] >= self.since]

    def add_nodes(self, count, prefix):
        names = ['%s%04d' % (prefix, i) for i in range(count)]
        for name in names:
            self.api.create({'apiVersion': 'v1', 'kind': 'Node',
                             'metadata': {'name': name, 'labels': {'kubernetes.io/hostname': name}}})
        return names


BENCHMARKS = {'site': bench_site, 'nodes': bench_node_scaling, 'labels': bench_labels, 'validate': bench_validate, 'doctor': bench_doctor,
              'wait': bench_wait, 'overhead': bench_overhead}


def summary(out):
    rows = []
    for name in sorted(os.listdir(out)):
        if name.endswith('.json'):
            with open(os.path.join(out, name)) as handle:
                r = json.load(handle)
            rows.append('| `%s` | %s %s | %s: %s | %s%s | %s | %s |' % (
                r['name'], r['figure'], r['unit'], r['baseline']['what'], r['baseline']['figure'], r['ratio'],
                ' (extrapolated)' if r['extrapolated'] else '', r['goal'], {True: 'yes', False: 'no', None: 'reported'}[r['met']]))
    text = ('# Benchmark results\n\n%s, %s\n\n| Benchmark | Ours | Baseline | Ratio | Goal | Met |\n'
            '|---|---|---|---|---|---|\n%s\n' % (_machine(), datetime.date.today().isoformat(), '\n'.join(rows)))
    with open(os.path.join(out, 'SUMMARY.md'), 'w') as handle:
        handle.write(text)
    return text


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('names', nargs='*', metavar='NAME', help=' '.join(BENCHMARKS))
    parser.add_argument('--smoke', action='store_true', help='smallest sizes only')
    parser.add_argument('--out', default=os.path.join(ROOT, 'bench', 'results'))
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(BENCHMARKS))
    if unknown:
        parser.error('unknown benchmark %s (choose from %s)' % (', '.join(unknown), ', '.join(BENCHMARKS)))
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix='gpuready-bench-')
    for name in args.names or list(BENCHMARKS):
        started = time.monotonic()
        BENCHMARKS[name](args.out, os.path.join(work, name), args.smoke)
        print('==> bench %s: %.0f s' % (name, time.monotonic() - started), flush=True)
    print(summary(args.out))
    return 0


if __name__ == '__main__':
    sys.exit(main())
