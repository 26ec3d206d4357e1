# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's control plane (lab/control/controllers.py) against the run's API emulator: the
controllers run as a subprocess with an admin kubeconfig; this file plays the kubelets (Node
heartbeats, pod Ready conditions). Nodes ctl-a and ctl-b and the namespaces ctl-* are ours; these
controllers are limited to objects labelled ctl.test/scope=yes, so other tests' objects in the
shared emulator are never touched (and do not change the scheduler's node count), and our
namespaces carry the label that keeps the lab's own controllers (lab/lab.py) out of them."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
import subprocess
import sys
import threading
import time

import pytest

CONTROLLERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', '..', 'lab', 'control', 'controllers.py')
SCOPE = {'ctl.test/scope': 'yes'}
# The lab's own controllers (lab/lab.py, running when a lab fixture is up) skip namespaces with this label.
FOREIGN = 'gpuready.lab/foreign-controllers'
NS = 'ctl-test'
IMAGE = 'localhost/gpuready-lab/workload:1'
NODES = ('ctl-a', 'ctl-b')
GPU = 'ctl.test/gpu'
TAINT = {'key': 'ctl.test/maintenance', 'value': 'yes', 'effect': 'NoSchedule'}
DAEMON_TOLERATION_KEYS = {'node.kubernetes.io/not-ready', 'node.kubernetes.io/unreachable',
                          'node.kubernetes.io/disk-pressure', 'node.kubernetes.io/memory-pressure',
                          'node.kubernetes.io/pid-pressure', 'node.kubernetes.io/unschedulable'}


def now(seconds_ago=0):
    return time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(time.time() - seconds_ago))


class Heartbeat:
    """Posts each Node's Ready condition every 2 s, as a kubelet would (status None: silent)."""

    def __init__(self, api):
        self.api = api
        self.status = dict((name, 'True') for name in NODES)
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def post(self, name, status, seconds_ago=0):
        reason = 'KubeletReady' if status == 'True' else 'KubeletNotReady'
        condition = {'type': 'Ready', 'status': status, 'reason': reason, 'lastHeartbeatTime': now(seconds_ago),
                     'lastTransitionTime': now(seconds_ago)}
        self.api.patch('v1', 'Node', name, {'status': {'conditions': [condition]}}, patch_type='strategic',
                       subresource='status')

    def set(self, name, status, seconds_ago=0):
        """Post now; status None stops the heartbeats after this one."""
        with self.lock:
            self.status[name] = status
            self.post(name, status or 'True', seconds_ago)

    def _loop(self):
        while not self.done.wait(2):
            with self.lock:
                for name, status in self.status.items():
                    if status:
                        self.post(name, status)


class Cluster:
    def __init__(self, api, process, log_path, heartbeat):
        self.api = api
        self.process = process
        self.log_path = log_path
        self.heartbeat = heartbeat

    def log(self):
        with open(self.log_path) as handle:
            return handle.read()

    def wait(self, what, predicate, timeout=20):
        """Polls predicate() until it returns something truthy, which is returned."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                pytest.fail('timed out waiting for %s; controllers said:\n%s' % (what, self.log()[-4000:]))
            if self.process.poll() is not None:
                pytest.fail('controllers exited with %s:\n%s' % (self.process.returncode, self.log()[-4000:]))
            time.sleep(0.1)

    def pods(self, app):
        return sorted(self.api.list('v1', 'Pod', namespace=NS, label_selector='app=%s' % app),
                      key=lambda p: p['spec'].get('nodeName') or '')

    def bound(self, app, count):
        """The app's pods when there are ``count`` and all are bound, else None."""
        pods = self.pods(app)
        return pods if len(pods) == count and all(p['spec'].get('nodeName') for p in pods) else None

    def pod(self, name):
        return self.api.get('v1', 'Pod', name, namespace=NS)

    def mark_ready(self, pod):
        """What the kubelet reports once the pod's containers run."""
        self.api.patch('v1', 'Pod', pod['metadata']['name'],
                       {'status': {'phase': 'Running', 'conditions': [
                           {'type': 'Ready', 'status': 'True', 'lastTransitionTime': now()}]}},
                       namespace=NS, patch_type='strategic', subresource='status')

    def events(self, name, reason):
        return self.api.list('v1', 'Event', namespace=NS,
                             field_selector='involvedObject.name=%s,reason=%s' % (name, reason))

    def set_node(self, name, gpu=False, pool=None, taints=()):
        labels = {GPU: 'yes' if gpu else None, 'ctl.test/pool': pool}
        self.api.patch('v1', 'Node', name, {'metadata': {'labels': labels}, 'spec': {'taints': list(taints) or None}})

    def daemonset(self, name, node_selector=None, tolerations=None):
        spec = {'containers': [{'name': 'main', 'image': IMAGE}],
                'nodeSelector': node_selector or {GPU: 'yes'}}
        if tolerations:
            spec['tolerations'] = tolerations
        return self.api.create({'apiVersion': 'apps/v1', 'kind': 'DaemonSet',
                                'metadata': {'name': name, 'namespace': NS},
                                'spec': {'selector': {'matchLabels': {'app': name}},
                                         'template': {'metadata': {'labels': {'app': name}}, 'spec': spec}}})

    def ds_status(self, name):
        return self.api.get('apps/v1', 'DaemonSet', name, namespace=NS).get('status') or {}


def _node(name):
    resources = {'cpu': '8', 'memory': '32Gi', 'pods': '110', 'nvidia.com/gpu': '4'}
    return {'apiVersion': 'v1', 'kind': 'Node',
            'metadata': {'name': name, 'labels': dict(SCOPE, **{'kubernetes.io/hostname': name})},
            'spec': {},
            'status': {'capacity': resources, 'allocatable': dict(resources),
                       'conditions': [{'type': 'Ready', 'status': 'True', 'reason': 'KubeletReady',
                                       'lastHeartbeatTime': now(), 'lastTransitionTime': now()}]}}


def _namespace(name, scoped=True):
    labels = dict(SCOPE) if scoped else {}
    labels[FOREIGN] = 'true'
    return {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': name, 'labels': labels}}


def _cleanup(api):
    for name in (NS, 'ctl-sa', 'ctl-sa-out'):
        if api.exists('v1', 'Namespace', name):
            api.delete('v1', 'Namespace', name)
    for name in NODES:
        if api.exists('v1', 'Node', name):
            api.delete('v1', 'Node', name)


@pytest.fixture(scope='module')
def cluster(k8s_api, tmp_path_factory):
    _cleanup(k8s_api)
    k8s_api.create(_namespace(NS))
    for name in NODES:
        k8s_api.create(_node(name))
    heartbeat = Heartbeat(k8s_api)
    heartbeat.thread.start()
    log_path = str(tmp_path_factory.mktemp('controllers') / 'controllers.log')
    with open(log_path, 'w') as log:
        process = subprocess.Popen([sys.executable, CONTROLLERS, '--kubeconfig', k8s_api.kubeconfig(),
                                    '--interval', '0.2', '--node-selector', 'ctl.test/scope=yes',
                                    '--namespace-selector', 'ctl.test/scope=yes'],
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    instance = Cluster(k8s_api, process, log_path, heartbeat)
    try:
        yield instance
    finally:
        process.terminate()
        try:
            code = process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
        heartbeat.done.set()
        heartbeat.thread.join(10)
        _cleanup(k8s_api)
    assert code == 0 and 'controllers: stopped' in instance.log(), instance.log()[-4000:]


def test_default_service_account_in_every_managed_namespace(cluster):
    api = cluster.api
    api.create(_namespace('ctl-sa-out', scoped=False))  # outside the scope: left alone
    api.create(_namespace('ctl-sa'))
    sa = cluster.wait('serviceaccount ctl-sa/default', lambda: api.exists('v1', 'ServiceAccount', 'default', 'ctl-sa'))
    assert sa and api.exists('v1', 'ServiceAccount', 'default', NS)
    assert not api.exists('v1', 'ServiceAccount', 'default', 'ctl-sa-out')


def test_daemonset_one_bound_pod_per_matching_node_with_status(cluster):
    cluster.set_node('ctl-a', gpu=True)
    cluster.set_node('ctl-b')
    ds = cluster.daemonset('ctl-gfd')
    pod = cluster.wait('a bound ctl-gfd pod', lambda: cluster.bound('ctl-gfd', 1))[0]
    assert pod['spec']['nodeName'] == 'ctl-a'
    name, labels = pod['metadata']['name'], pod['metadata']['labels']
    assert re.match(r'^ctl-gfd-[a-z0-9]{5}$', name)
    assert set(labels) == {'app', 'controller-revision-hash', 'pod-template-generation'}
    assert labels['pod-template-generation'] == '1' and labels['controller-revision-hash']
    assert pod['metadata']['ownerReferences'] == [{'apiVersion': 'apps/v1', 'kind': 'DaemonSet', 'name': 'ctl-gfd',
                                                   'uid': ds['metadata']['uid'], 'controller': True,
                                                   'blockOwnerDeletion': True}]
    assert {t['key'] for t in pod['spec']['tolerations']} == DAEMON_TOLERATION_KEYS
    assert pod['spec']['affinity']['nodeAffinity']['requiredDuringSchedulingIgnoredDuringExecution'] == {
        'nodeSelectorTerms': [{'matchFields': [{'key': 'metadata.name', 'operator': 'In', 'values': ['ctl-a']}]}]}
    assert [e['message'] for e in cluster.events('ctl-gfd', 'SuccessfulCreate')] == ['Created pod: %s' % name]
    scheduled = cluster.wait('the Scheduled event', lambda: cluster.events(name, 'Scheduled'))
    assert scheduled[0]['message'] == 'Successfully assigned %s/%s to ctl-a' % (NS, name)
    assert scheduled[0]['source']['component'] == 'default-scheduler'
    status = cluster.wait('status counters', lambda: cluster.ds_status('ctl-gfd').get('currentNumberScheduled'))
    assert cluster.ds_status('ctl-gfd') == {'desiredNumberScheduled': 1, 'currentNumberScheduled': 1,
                                            'numberMisscheduled': 0, 'numberReady': 0, 'numberUnavailable': 1,
                                            'updatedNumberScheduled': 1, 'observedGeneration': 1}, status
    cluster.mark_ready(pod)
    cluster.wait('numberReady 1', lambda: cluster.ds_status('ctl-gfd').get('numberAvailable') == 1)
    assert cluster.ds_status('ctl-gfd') == {'desiredNumberScheduled': 1, 'currentNumberScheduled': 1,
                                            'numberMisscheduled': 0, 'numberReady': 1, 'numberAvailable': 1,
                                            'updatedNumberScheduled': 1, 'observedGeneration': 1}


def test_daemonset_follows_node_labels_and_taints(cluster):
    # ctl-gfd from the test above runs on ctl-a. ctl-b gets the label, but is tainted first.
    cluster.set_node('ctl-b', gpu=True, taints=[TAINT])
    cluster.wait('desired 1 with ctl-b tainted',
                 lambda: cluster.ds_status('ctl-gfd').get('desiredNumberScheduled') == 1)
    time.sleep(1)  # five more rounds: still nothing on ctl-b
    assert [p['spec'].get('nodeName') for p in cluster.pods('ctl-gfd')] == ['ctl-a']
    # A DaemonSet that tolerates the taint runs there.
    cluster.daemonset('ctl-tolerant', tolerations=[{'key': TAINT['key'], 'operator': 'Exists'}])
    cluster.wait('ctl-tolerant on both nodes', lambda: [p['spec'].get('nodeName') for p in cluster.pods('ctl-tolerant')]
                 == ['ctl-a', 'ctl-b'])
    cluster.api.delete('apps/v1', 'DaemonSet', 'ctl-tolerant', namespace=NS)
    # Untainted, ctl-b gets its ctl-gfd pod; unlabelled, loses it.
    cluster.set_node('ctl-b', gpu=True)
    cluster.wait('ctl-gfd on ctl-b', lambda: [p['spec'].get('nodeName') for p in cluster.pods('ctl-gfd')]
                 == ['ctl-a', 'ctl-b'])
    on_b = cluster.pods('ctl-gfd')[1]['metadata']['name']
    cluster.wait('desired 2', lambda: cluster.ds_status('ctl-gfd').get('desiredNumberScheduled') == 2)
    cluster.set_node('ctl-b')
    cluster.wait('ctl-gfd off ctl-b', lambda: [p['spec'].get('nodeName') for p in cluster.pods('ctl-gfd')] == ['ctl-a'])
    assert [e['message'] for e in cluster.events('ctl-gfd', 'SuccessfulDelete')] == ['Deleted pod: %s' % on_b]
    cluster.wait('desired 1 again', lambda: cluster.ds_status('ctl-gfd').get('desiredNumberScheduled') == 1)


def test_deleting_a_daemonset_collects_its_pods(cluster):
    assert cluster.pods('ctl-gfd')
    cluster.api.delete('apps/v1', 'DaemonSet', 'ctl-gfd', namespace=NS)
    cluster.wait('ctl-gfd pods collected', lambda: not cluster.pods('ctl-gfd') and not cluster.pods('ctl-tolerant'))
    assert 'garbage-collector: deleted pod %s/ctl-gfd-' % NS in cluster.log()


def test_template_change_rolls_one_pod_at_a_time(cluster):
    for name in NODES:
        cluster.set_node(name, gpu=True)
    cluster.daemonset('ctl-roll')
    old = cluster.wait('two ctl-roll pods bound', lambda: cluster.bound('ctl-roll', 2))
    for pod in old:
        cluster.mark_ready(pod)
    cluster.wait('both available', lambda: cluster.ds_status('ctl-roll').get('numberAvailable') == 2)
    old_hash = old[0]['metadata']['labels']['controller-revision-hash']
    cluster.api.patch('apps/v1', 'DaemonSet', 'ctl-roll', {'spec': {'template': {'metadata': {
        'annotations': {'ctl.test/revision': '2'}}}}}, namespace=NS)

    def new_pods():
        return [p for p in cluster.pods('ctl-roll') if p['metadata']['labels']['controller-revision-hash'] != old_hash]

    first = cluster.wait('the first new pod, bound', lambda: [p for p in new_pods() if p['spec'].get('nodeName')])
    assert [p['spec']['nodeName'] for p in first] == ['ctl-a']  # nodes go in name order
    assert first[0]['metadata']['annotations'] == {'ctl.test/revision': '2'}
    assert first[0]['metadata']['labels']['pod-template-generation'] == '2'
    time.sleep(1)  # the new pod is not Ready: the old one on ctl-b stays
    names = [p['metadata']['name'] for p in cluster.pods('ctl-roll')]
    assert names == [first[0]['metadata']['name'], old[1]['metadata']['name']]
    assert cluster.ds_status('ctl-roll')['updatedNumberScheduled'] == 1
    cluster.mark_ready(first[0])
    second = cluster.wait('the second new pod', lambda: [p for p in new_pods() if p['spec'].get('nodeName') == 'ctl-b'])
    cluster.mark_ready(second[0])
    cluster.wait('rolled out', lambda: cluster.ds_status('ctl-roll') == {
        'desiredNumberScheduled': 2, 'currentNumberScheduled': 2, 'numberMisscheduled': 0, 'numberReady': 2,
        'numberAvailable': 2, 'updatedNumberScheduled': 2, 'observedGeneration': 2})
    deleted = [e['message'] for e in cluster.events('ctl-roll', 'SuccessfulDelete')]
    assert sorted(deleted) == sorted('Deleted pod: %s' % p['metadata']['name'] for p in old)
    cluster.api.delete('apps/v1', 'DaemonSet', 'ctl-roll', namespace=NS)
    cluster.wait('ctl-roll pods collected', lambda: not cluster.pods('ctl-roll'))


EXPECTED = ("0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't match Pod's node "
            "affinity/selector. preemption: 0/2 nodes are available: 1 No preemption victims found for incoming pod, "
            "1 Preemption is not helpful for scheduling.")


def _gpu_pod(name, gpus, node_selector=None):
    spec = {'containers': [{'name': 'main', 'image': IMAGE,
                            'resources': {'limits': {'nvidia.com/gpu': gpus}}}]}
    if node_selector:
        spec['nodeSelector'] = node_selector
    return {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': name, 'namespace': NS, 'labels': {'app': name}},
            'spec': spec}


def _scheduled_condition(pod):
    return next((c for c in pod['status'].get('conditions') or [] if c['type'] == 'PodScheduled'), None)


def test_scheduler_places_by_gpu_requests_and_explains_failures(cluster):
    cluster.set_node('ctl-a', pool='a')
    cluster.set_node('ctl-b')
    cluster.api.create(_gpu_pod('ctl-gpu5', 5, {'ctl.test/pool': 'a'}))
    condition = cluster.wait('PodScheduled=False', lambda: _scheduled_condition(cluster.pod('ctl-gpu5')))
    assert {k: condition[k] for k in ('status', 'reason', 'message')} == {
        'status': 'False', 'reason': 'Unschedulable', 'message': EXPECTED}
    time.sleep(1)  # retried every round, but the event is not repeated
    events = cluster.events('ctl-gpu5', 'FailedScheduling')
    assert [(e['type'], e['message'], e['source']['component']) for e in events] == [
        ('Warning', EXPECTED, 'default-scheduler')]
    assert not cluster.pod('ctl-gpu5')['spec'].get('nodeName')

    cluster.api.create(_gpu_pod('ctl-gpu1', 1))
    bound = cluster.wait('ctl-gpu1 bound', lambda: cluster.pod('ctl-gpu1')['spec'].get('nodeName'))
    assert _scheduled_condition(cluster.pod('ctl-gpu1'))['status'] == 'True'
    assert [e['message'] for e in cluster.events('ctl-gpu1', 'Scheduled')] == [
        'Successfully assigned %s/ctl-gpu1 to %s' % (NS, bound)]
    # Its GPU is taken: 4 more do not fit on that node.
    cluster.api.create(_gpu_pod('ctl-gpu4', 4, {'kubernetes.io/hostname': bound}))
    condition = cluster.wait('ctl-gpu4 unschedulable', lambda: _scheduled_condition(cluster.pod('ctl-gpu4')))
    assert condition['message'] == EXPECTED
    for name in ('ctl-gpu5', 'ctl-gpu1', 'ctl-gpu4'):
        cluster.api.delete('v1', 'Pod', name, namespace=NS)


def test_deployment_gets_its_pod(cluster):
    deploy = cluster.api.create({
        'apiVersion': 'apps/v1', 'kind': 'Deployment', 'metadata': {'name': 'ctl-web', 'namespace': NS},
        'spec': {'selector': {'matchLabels': {'app': 'ctl-web'}},
                 'template': {'metadata': {'labels': {'app': 'ctl-web'}},
                              'spec': {'containers': [{'name': 'main', 'image': IMAGE}]}}}})
    pods = cluster.wait('a bound ctl-web pod', lambda: cluster.bound('ctl-web', 1))
    template_hash = pods[0]['metadata']['labels']['pod-template-hash']
    assert re.match(r'^ctl-web-%s-[a-z0-9]{5}$' % template_hash, pods[0]['metadata']['name'])
    assert pods[0]['metadata']['ownerReferences'][0]['uid'] == deploy['metadata']['uid']
    cluster.mark_ready(pods[0])

    def status():
        return cluster.api.get('apps/v1', 'Deployment', 'ctl-web', namespace=NS).get('status') or {}

    cluster.wait('ctl-web available', lambda: status().get('availableReplicas') == 1)
    assert status() == {'observedGeneration': 1, 'replicas': 1, 'updatedReplicas': 1, 'readyReplicas': 1,
                        'availableReplicas': 1}
    cluster.api.delete('apps/v1', 'Deployment', 'ctl-web', namespace=NS)
    cluster.wait('ctl-web pods collected', lambda: not cluster.pods('ctl-web'))


def test_survives_api_errors(cluster):
    api = cluster.api
    api.inject(verb='list', resource='pods', status=500, count=6)
    try:
        cluster.wait('the faults used up', lambda: all(f['remaining'] == 0 for f in api.faults()) or not api.faults())
    finally:
        api.clear_faults()
    api.create(_gpu_pod('ctl-after-errors', 1))
    cluster.wait('ctl-after-errors bound', lambda: cluster.pod('ctl-after-errors')['spec'].get('nodeName'))
    log = cluster.log()
    assert 'sync failed, retrying every round: ApiError: 500' in log and 'sync works again' in log
    api.delete('v1', 'Pod', 'ctl-after-errors', namespace=NS)


def _lifecycle_taints(cluster, name):
    taints = cluster.api.get('v1', 'Node', name)['spec'].get('taints') or []
    return [(t['key'], t['effect']) for t in taints]


def test_node_lifecycle_taints(cluster):
    cluster.set_node('ctl-b', taints=[TAINT])
    cluster.heartbeat.set('ctl-b', 'False')
    mine = (TAINT['key'], 'NoSchedule')
    cluster.wait('not-ready taint', lambda: _lifecycle_taints(cluster, 'ctl-b') == [
        mine, ('node.kubernetes.io/not-ready', 'NoSchedule')])
    cluster.heartbeat.set('ctl-b', None, seconds_ago=60)  # Ready, but the last heartbeat is a minute old
    cluster.wait('unreachable taint', lambda: _lifecycle_taints(cluster, 'ctl-b') == [
        mine, ('node.kubernetes.io/unreachable', 'NoSchedule')])
    cluster.heartbeat.set('ctl-b', 'True')
    cluster.wait('lifecycle taints gone', lambda: _lifecycle_taints(cluster, 'ctl-b') == [mine])
    assert _lifecycle_taints(cluster, 'ctl-a') == []
    cluster.set_node('ctl-b')
