# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's control plane (lab/control/controllers.py) without an API server: its decisions are
pure functions of plain dicts, loaded as the image imports it (tests/lab_control.py)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy
import datetime
import decimal

import pytest

import lab_control

ctl = lab_control.load('controllers')
D = decimal.Decimal
NOW = datetime.datetime(2026, 12, 3, 12, 0, 0, tzinfo=datetime.timezone.utc)


def stamp(seconds_ago=0):
    return (NOW - datetime.timedelta(seconds=seconds_ago)).strftime('%Y-%m-%dT%H:%M:%SZ')


def node(name, labels=None, taints=None, allocatable=None, ready='True', beat=0, unschedulable=False):
    obj = {'metadata': {'name': name, 'labels': dict({'kubernetes.io/hostname': name}, **(labels or {})),
                        'creationTimestamp': stamp(3600)},
           'spec': {},
           'status': {'allocatable': dict(allocatable or {'cpu': '8', 'memory': '32Gi', 'pods': '110'}),
                      'conditions': [{'type': 'Ready', 'status': ready, 'lastHeartbeatTime': stamp(beat)}]}}
    if taints is not None:
        obj['spec']['taints'] = taints
    if unschedulable:
        obj['spec']['unschedulable'] = True
    return obj


def pod(name, requests=None, limits=None, node_name=None, labels=None, phase='Pending', ready=False, created=0,
        owner=None, **spec):
    resources = {}
    if requests:
        resources['requests'] = requests
    if limits:
        resources['limits'] = limits
    obj = {'metadata': {'name': name, 'namespace': 'ns', 'uid': 'uid-' + name, 'labels': dict(labels or {}),
                        'creationTimestamp': stamp(1000 - created)},
           'spec': dict({'containers': [{'name': 'c', 'image': 'i', 'resources': resources}]}, **spec),
           'status': {'phase': phase, 'conditions': [{'type': 'Ready', 'status': 'True' if ready else 'False',
                                                      'lastTransitionTime': stamp(100)}]}}
    if node_name:
        obj['spec']['nodeName'] = node_name
    if owner:
        obj['metadata']['ownerReferences'] = [ctl.owner_reference(owner)]
    return obj


def daemonset(name='ds', template_spec=None, labels=None, generation=1, strategy=None, uid='ds-uid'):
    obj = {'apiVersion': 'apps/v1', 'kind': 'DaemonSet',
           'metadata': {'name': name, 'namespace': 'ns', 'uid': uid, 'generation': generation},
           'spec': {'selector': {'matchLabels': {'app': name}},
                    'template': {'metadata': {'labels': dict({'app': name}, **(labels or {}))},
                                 'spec': dict({'containers': [{'name': 'c', 'image': 'i'}]}, **(template_spec or {}))}}}
    if strategy is not None:
        obj['spec']['updateStrategy'] = strategy
    return obj


def daemon_pod(ds, node_name, name=None, bound=True, ready=True, revision=None, phase='Running', created=0):
    obj = ctl.new_daemon_pod(ds, node_name, revision or ctl.template_hash(ds['spec']['template']))
    obj['metadata'].update(name=name or 'p-' + node_name, uid='uid-' + (name or node_name),
                           creationTimestamp=stamp(1000 - created))
    if bound:
        obj['spec']['nodeName'] = node_name
    obj['status'] = {'phase': phase, 'conditions': [{'type': 'Ready', 'status': 'True' if ready else 'False',
                                                     'lastTransitionTime': stamp(100)}]}
    return obj


# -- quantities -------------------------------------------------------------------------------

@pytest.mark.parametrize('text, value', [
    ('1', D(1)), ('100m', D('0.1')), ('1.5', D('1.5')), ('0.5', D('0.5')), ('.5', D('0.5')), ('250u', D('0.00025')),
    ('5n', D('5e-9')), ('4Ki', D(4096)), ('512Mi', D(512 * 2 ** 20)), ('2Gi', D(2 * 2 ** 30)), ('1Ti', D(2 ** 40)),
    ('1k', D(1000)), ('1M', D(10 ** 6)), ('3G', D(3 * 10 ** 9)), ('1T', D(10 ** 12)), ('1E', D(10 ** 18)),
    ('1e3', D(1000)), ('1E3', D(1000)), ('5e-1', D('0.5')), ('110', D(110)), (4, D(4)), (0.5, D('0.5')),
    ('263844260Ki', D(263844260 * 1024)), ('+2', D(2)),
])
def test_parse_quantity(text, value):
    assert ctl.parse_quantity(text) == value


@pytest.mark.parametrize('text', ['', 'abc', '1Q', '1.2.3', 'Mi', '1 Gi', '1mi', '1KI', '--1', True])
def test_parse_quantity_refuses_malformed(text):
    with pytest.raises(ValueError):
        ctl.parse_quantity(text)


def test_pod_requests_limits_imply_requests_init_max_and_overhead():
    spec = {'containers': [
        {'name': 'a', 'resources': {'requests': {'cpu': '250m', 'memory': '64Mi'}, 'limits': {'nvidia.com/gpu': 2}}},
        {'name': 'b', 'resources': {'limits': {'cpu': '1', 'memory': '1Gi'}, 'requests': {'cpu': '500m'}}},
        {'name': 'c'}],
        'initContainers': [{'name': 'i', 'resources': {'requests': {'cpu': '2', 'nvidia.com/gpu': '1'}}}],
        'overhead': {'memory': '10Mi'}}
    assert ctl.pod_requests({'spec': spec}) == {
        'cpu': D(2), 'memory': D(64 * 2 ** 20 + 2 ** 30 + 10 * 2 ** 20), 'nvidia.com/gpu': D(2)}


def test_score_requests_default_for_containers_without_requests():
    spec = {'containers': [{'name': 'a'}, {'name': 'b', 'resources': {'requests': {'cpu': '0', 'memory': '1Gi'}}}]}
    assert ctl.pod_score_requests({'spec': spec}) == (D('0.1'), D(200 * 2 ** 20 + 2 ** 30))


# -- selectors and affinity -------------------------------------------------------------------

LABELS = {'zone': 'a', 'gpus': '4', 'tier': 'x'}


@pytest.mark.parametrize('requirement, expected', [
    ({'key': 'zone', 'operator': 'In', 'values': ['a', 'b']}, True),
    ({'key': 'zone', 'operator': 'In', 'values': ['b']}, False),
    ({'key': 'none', 'operator': 'In', 'values': ['a']}, False),
    ({'key': 'zone', 'operator': 'NotIn', 'values': ['b']}, True),
    ({'key': 'zone', 'operator': 'NotIn', 'values': ['a']}, False),
    ({'key': 'none', 'operator': 'NotIn', 'values': ['a']}, True),  # absent is "not in"
    ({'key': 'zone', 'operator': 'Exists'}, True),
    ({'key': 'none', 'operator': 'Exists'}, False),
    ({'key': 'none', 'operator': 'DoesNotExist'}, True),
    ({'key': 'zone', 'operator': 'DoesNotExist'}, False),
    ({'key': 'gpus', 'operator': 'Gt', 'values': ['3']}, True),
    ({'key': 'gpus', 'operator': 'Gt', 'values': ['4']}, False),
    ({'key': 'gpus', 'operator': 'Lt', 'values': ['5']}, True),
    ({'key': 'gpus', 'operator': 'Lt', 'values': ['4']}, False),
    ({'key': 'zone', 'operator': 'Gt', 'values': ['1']}, False),  # not a number: no match
    ({'key': 'none', 'operator': 'Lt', 'values': ['1']}, False),
])
def test_label_requirement_operators(requirement, expected):
    assert ctl.label_requirement_matches(requirement, LABELS) is expected


@pytest.mark.parametrize('requirement', [
    {'key': 'zone', 'operator': 'In', 'values': []}, {'key': 'zone', 'operator': 'NotIn'},
    {'key': 'zone', 'operator': 'Exists', 'values': ['a']},
    {'key': 'zone', 'operator': 'DoesNotExist', 'values': ['a']},
    {'key': 'gpus', 'operator': 'Gt', 'values': ['1', '2']}, {'key': 'gpus', 'operator': 'Lt', 'values': ['x']},
    {'key': 'zone', 'operator': 'Equals', 'values': ['a']},
])
def test_invalid_requirements_are_refused_and_their_term_matches_nothing(requirement):
    with pytest.raises(ctl.InvalidRequirement):
        ctl.label_requirement_matches(requirement, LABELS)
    term = {'matchExpressions': [requirement, {'key': 'zone', 'operator': 'Exists'}]}
    assert ctl.node_matches_term(term, node('n', LABELS)) is False


@pytest.mark.parametrize('requirement, expected', [
    ({'key': 'metadata.name', 'operator': 'In', 'values': ['n1']}, True),
    ({'key': 'metadata.name', 'operator': 'In', 'values': ['n2']}, False),
    ({'key': 'metadata.name', 'operator': 'NotIn', 'values': ['n2']}, True),
    ({'key': 'metadata.name', 'operator': 'NotIn', 'values': ['n1']}, False),
    ({'key': 'metadata.name', 'operator': 'In', 'values': ['n1', 'n2']}, False),  # one value only
    ({'key': 'metadata.uid', 'operator': 'In', 'values': ['n1']}, False),
    ({'key': 'metadata.name', 'operator': 'Exists'}, False),
])
def test_match_fields(requirement, expected):
    assert ctl.node_matches_term({'matchFields': [requirement]}, node('n1')) is expected


def _affinity(*terms):
    return {'affinity': {'nodeAffinity': {'requiredDuringSchedulingIgnoredDuringExecution': {
        'nodeSelectorTerms': list(terms)}}}}


def test_terms_are_ored_requirements_anded_and_node_selector_anded():
    n = node('n1', LABELS)
    zone_b = {'matchExpressions': [{'key': 'zone', 'operator': 'In', 'values': ['b']}]}
    zone_a_and_tier = {'matchExpressions': [{'key': 'zone', 'operator': 'In', 'values': ['a']},
                                            {'key': 'tier', 'operator': 'In', 'values': ['x']}],
                       'matchFields': [{'key': 'metadata.name', 'operator': 'In', 'values': ['n1']}]}
    zone_a_not_tier = {'matchExpressions': [{'key': 'zone', 'operator': 'In', 'values': ['a']},
                                            {'key': 'tier', 'operator': 'NotIn', 'values': ['x']}]}
    assert ctl.node_matches_pod(_affinity(zone_b, zone_a_and_tier), n)
    assert not ctl.node_matches_pod(_affinity(zone_b, zone_a_not_tier), n)
    assert ctl.node_matches_pod(dict(_affinity(zone_a_and_tier), nodeSelector={'tier': 'x'}), n)
    assert not ctl.node_matches_pod(dict(_affinity(zone_a_and_tier), nodeSelector={'tier': 'y'}), n)
    assert not ctl.node_matches_pod({'nodeSelector': {'missing': ''}}, n)
    assert ctl.node_matches_pod({}, n)
    assert ctl.node_matches_pod({'nodeSelector': {'zone': 'a'}, 'affinity': {'nodeAffinity': {}}}, n)
    assert not ctl.node_matches_pod(_affinity(), n)  # required, but no term: nothing matches
    assert not ctl.node_matches_pod(_affinity({}), n)  # an empty term matches nothing


# -- taints and tolerations -------------------------------------------------------------------

TAINT = {'key': 'gpu', 'value': 'busy', 'effect': 'NoSchedule'}


@pytest.mark.parametrize('toleration, expected', [
    ({'operator': 'Exists'}, True),  # empty key + Exists: every taint
    ({'key': 'gpu', 'operator': 'Exists'}, True),  # empty effect: every effect
    ({'key': 'gpu', 'operator': 'Exists', 'effect': 'NoSchedule'}, True),
    ({'key': 'gpu', 'operator': 'Exists', 'effect': 'NoExecute'}, False),
    ({'key': 'other', 'operator': 'Exists'}, False),
    ({'key': 'gpu', 'operator': 'Equal', 'value': 'busy'}, True),
    ({'key': 'gpu', 'value': 'busy', 'effect': 'NoSchedule'}, True),  # Equal is the default operator
    ({'key': 'gpu', 'operator': 'Equal', 'value': 'free'}, False),
    ({'key': 'gpu', 'operator': 'Equal'}, False),  # no value is "", not any value
    ({'key': 'gpu', 'operator': 'Exists', 'value': 'free'}, True),  # Exists ignores the value
    ({'key': 'gpu', 'operator': 'Like', 'value': 'busy'}, False),
])
def test_toleration_rules(toleration, expected):
    assert ctl.tolerates(toleration, TAINT) is expected


def test_untolerated_taint_ignores_prefer_no_schedule_and_returns_the_first():
    taints = [{'key': 'soft', 'effect': 'PreferNoSchedule'}, {'key': 'a', 'effect': 'NoSchedule'},
              {'key': 'b', 'effect': 'NoExecute', 'value': 'v'}]
    assert ctl.untolerated_taint(taints, []) == taints[1]
    assert ctl.untolerated_taint(taints, [{'key': 'a', 'operator': 'Exists'}]) == taints[2]
    assert ctl.untolerated_taint(taints, [{'operator': 'Exists'}]) is None
    assert ctl.untolerated_taint(taints, [], ('NoExecute',)) == taints[2]


# -- node lifecycle ---------------------------------------------------------------------------

OTHER_TAINT = {'key': 'team', 'value': 'ml', 'effect': 'NoSchedule'}
NOT_READY = {'key': ctl.NOT_READY, 'effect': 'NoSchedule'}
UNREACHABLE = {'key': ctl.UNREACHABLE, 'effect': 'NoSchedule'}


@pytest.mark.parametrize('ready, beat, taints, expected', [
    ('True', 5, [], None),
    ('True', 5, [OTHER_TAINT], None),
    ('True', 5, [OTHER_TAINT, NOT_READY], [OTHER_TAINT]),
    ('False', 5, [OTHER_TAINT], [OTHER_TAINT, NOT_READY]),
    ('False', 5, [NOT_READY, OTHER_TAINT], None),
    ('True', 41, [OTHER_TAINT], [OTHER_TAINT, UNREACHABLE]),
    ('False', 60, [NOT_READY, OTHER_TAINT], [OTHER_TAINT, UNREACHABLE]),
    ('Unknown', 5, [], [UNREACHABLE]),
    ('True', 40, [UNREACHABLE], []),
    # A NoExecute taint of the same key is not ours to touch.
    ('True', 5, [{'key': ctl.NOT_READY, 'effect': 'NoExecute'}], None),
])
def test_lifecycle_taints(ready, beat, taints, expected):
    assert ctl.lifecycle_taints_update(node('n', taints=taints, ready=ready, beat=beat), NOW) == expected


def test_lifecycle_without_ready_condition():
    fresh = {'metadata': {'name': 'n', 'creationTimestamp': stamp(5)}, 'status': {}}
    old = {'metadata': {'name': 'n', 'creationTimestamp': stamp(100)}, 'status': {}}
    assert ctl.lifecycle_taint(fresh, NOW) == ctl.NOT_READY
    assert ctl.lifecycle_taint(old, NOW) == ctl.UNREACHABLE


# -- DaemonSets -------------------------------------------------------------------------------

def _tolerations(spec):
    return [(t.get('key'), t.get('operator'), t.get('effect')) for t in ctl.daemon_pod_tolerations(spec)]


def test_daemon_pod_tolerations():
    base = [(ctl.NOT_READY, 'Exists', 'NoExecute'), (ctl.UNREACHABLE, 'Exists', 'NoExecute'),
            ('node.kubernetes.io/disk-pressure', 'Exists', 'NoSchedule'),
            ('node.kubernetes.io/memory-pressure', 'Exists', 'NoSchedule'),
            ('node.kubernetes.io/pid-pressure', 'Exists', 'NoSchedule'),
            ('node.kubernetes.io/unschedulable', 'Exists', 'NoSchedule')]
    assert _tolerations({}) == base
    assert _tolerations({'hostNetwork': True}) == base + [('node.kubernetes.io/network-unavailable', 'Exists',
                                                           'NoSchedule')]
    own = {'key': 'nvidia.com/gpu', 'operator': 'Exists', 'effect': 'NoSchedule'}
    assert _tolerations({'tolerations': [own]}) == [('nvidia.com/gpu', 'Exists', 'NoSchedule')] + base
    # The same toleration with tolerationSeconds is replaced by ours: no duplicate.
    same = {'key': ctl.UNREACHABLE, 'operator': 'Exists', 'effect': 'NoExecute', 'tolerationSeconds': 30}
    result = ctl.daemon_pod_tolerations({'tolerations': [same]})
    assert len(result) == 6 and not any('tolerationSeconds' in t for t in result)


@pytest.mark.parametrize('n, template, expected', [
    (node('n1', {'gpu': 'yes'}), {'nodeSelector': {'gpu': 'yes'}}, (True, True)),
    (node('n1'), {'nodeSelector': {'gpu': 'yes'}}, (False, False)),
    (node('n1', taints=[TAINT]), {}, (False, True)),  # keeps running under a NoSchedule taint
    (node('n1', taints=[dict(TAINT, effect='NoExecute')]), {}, (False, False)),
    (node('n1', taints=[TAINT]), {'tolerations': [{'key': 'gpu', 'operator': 'Exists'}]}, (True, True)),
    (node('n1', taints=[{'key': ctl.NOT_READY, 'effect': 'NoExecute'}]), {}, (True, True)),  # added toleration
    (node('n1', taints=[NOT_READY]), {}, (False, True)),  # the NoSchedule one is not tolerated
    (node('n1', taints=[{'key': ctl.UNSCHEDULABLE, 'effect': 'NoSchedule'}], unschedulable=True), {}, (True, True)),
    (node('n1'), {'nodeName': 'n2'}, (False, False)),
    (node('n1'), _affinity({'matchFields': [{'key': 'metadata.name', 'operator': 'In', 'values': ['n2']}]}),
     (False, False)),
    (node('n1', {'zone': 'a'}), _affinity({'matchExpressions': [{'key': 'zone', 'operator': 'Exists'}]}),
     (True, True)),
])
def test_should_run_daemon_pod(n, template, expected):
    assert ctl.should_run_daemon_pod(daemonset(template_spec=template), n) == expected


def test_new_daemon_pod():
    user_affinity = _affinity({'matchExpressions': [{'key': 'zone', 'operator': 'In', 'values': ['a']}]})
    user_affinity['affinity']['nodeAffinity']['preferredDuringSchedulingIgnoredDuringExecution'] = [
        {'weight': 1, 'preference': {'matchExpressions': [{'key': 'fast', 'operator': 'Exists'}]}}]
    ds = daemonset('gfd', dict(user_affinity, hostNetwork=True, nodeSelector={'gpu': 'yes'}), generation=3)
    ds['spec']['template']['metadata']['annotations'] = {'note': 'x'}
    before = copy.deepcopy(ds)
    p = ctl.new_daemon_pod(ds, 'n1', 'abc')
    assert ds == before  # the template is not changed
    assert p['metadata'] == {
        'generateName': 'gfd-', 'namespace': 'ns',
        'labels': {'app': 'gfd', 'controller-revision-hash': 'abc', 'pod-template-generation': '3'},
        'annotations': {'note': 'x'},
        'ownerReferences': [{'apiVersion': 'apps/v1', 'kind': 'DaemonSet', 'name': 'gfd', 'uid': 'ds-uid',
                             'controller': True, 'blockOwnerDeletion': True}]}
    affinity = p['spec']['affinity']['nodeAffinity']
    assert affinity['requiredDuringSchedulingIgnoredDuringExecution'] == {'nodeSelectorTerms': [
        {'matchFields': [{'key': 'metadata.name', 'operator': 'In', 'values': ['n1']}]}]}
    assert affinity['preferredDuringSchedulingIgnoredDuringExecution']  # kept
    assert p['spec']['nodeSelector'] == {'gpu': 'yes'} and 'nodeName' not in p['spec']
    assert len(p['spec']['tolerations']) == 7
    assert ctl.target_node(p) == 'n1'


def test_template_hash_is_stable_and_short():
    a = {'metadata': {'labels': {'app': 'x', 'b': 'y'}}, 'spec': {'containers': [{'name': 'c', 'image': 'i:1'}]}}
    b = {'spec': {'containers': [{'image': 'i:1', 'name': 'c'}]}, 'metadata': {'labels': {'b': 'y', 'app': 'x'}}}
    c = copy.deepcopy(a)
    c['spec']['containers'][0]['image'] = 'i:2'
    assert ctl.template_hash(a) == ctl.template_hash(b) == ctl.template_hash(copy.deepcopy(a))
    assert ctl.template_hash(a) != ctl.template_hash(c)
    for value in (ctl.template_hash(a), ctl.template_hash(c), ctl.template_hash({})):
        assert 1 <= len(value) <= 10 and set(value) <= set('bcdfghjklmnpqrstvwxz2456789')
    # Fixed across runs and machines (sha256 of canonical JSON, not Python's hash()).
    assert ctl.template_hash({}) == ctl.template_hash({})
    assert ctl.template_hash({}) == 'z2mw6vvb5m'


def test_plan_daemonset():
    ds = daemonset(template_spec={'nodeSelector': {'gpu': 'yes'}})
    nodes = [node('a', {'gpu': 'yes'}), node('b', {'gpu': 'yes'}), node('c'), node('d', {'gpu': 'yes'}),
             node('e', {'gpu': 'yes'}, taints=[TAINT]), node('f', {'gpu': 'yes'}, taints=[TAINT])]
    pods = [daemon_pod(ds, 'b', 'b-old', created=1), daemon_pod(ds, 'b', 'b-new', created=2),
            daemon_pod(ds, 'c', 'c1'), daemon_pod(ds, 'd', 'd1', phase='Failed'),
            daemon_pod(ds, 'f', 'f1', phase='Succeeded'),  # a finished pod goes, even where it could stay
            daemon_pod(ds, 'e', 'e1'),  # keeps running on a tainted node
            daemon_pod(ds, 'gone', 'g1', bound=False), daemon_pod(ds, 'gone2', 'g2', bound=True)]
    plan = ctl.plan_daemonset(ds, nodes, ctl.pods_by_node(pods))
    assert plan['create'] == ['a']
    assert [(p['metadata']['name'], why) for p, why in plan['delete']] == [
        ('b-new', 'duplicate on node b'), ('c1', 'node c is not eligible'), ('g1', 'node gone is gone')]
    assert [(p['metadata']['name'], n) for p, n in plan['failed']] == [('d1', 'd')]
    assert [(p['metadata']['name'], n) for p, n in plan['succeeded']] == [('f1', 'f')]


def test_plan_daemonset_waits_for_a_pod_being_deleted():
    ds = daemonset()
    doomed = daemon_pod(ds, 'a', 'a1')
    doomed['metadata']['deletionTimestamp'] = stamp()
    assert ctl.plan_daemonset(ds, [node('a')], ctl.pods_by_node([doomed])) == {
        'create': [], 'delete': [], 'failed': [], 'succeeded': []}


@pytest.mark.parametrize('value, desired, expected', [
    (None, 10, 1), (2, 10, 2), (0, 10, 1), ('10%', 10, 1), ('25%', 10, 3), ('50%', 3, 2), ('100%', 4, 4),
    ('0%', 4, 1), ('1%', 0, 1),
])
def test_max_unavailable(value, desired, expected):
    strategy = {'type': 'RollingUpdate'}
    if value is not None:
        strategy['rollingUpdate'] = {'maxUnavailable': value}
    assert ctl.daemonset_max_unavailable(daemonset(strategy=strategy), desired) == expected


@pytest.mark.parametrize('value', ['2', 'x%', '%', True])
def test_max_unavailable_refuses_other_strings(value):
    with pytest.raises(ValueError):
        ctl.daemonset_max_unavailable(daemonset(strategy={'rollingUpdate': {'maxUnavailable': value}}), 4)


def _rolling(ds, pods, max_unavailable):
    current = ctl.template_hash(ds['spec']['template'])
    names = ctl.rolling_update_deletions(ds, ctl.pods_by_node(pods), current, max_unavailable)
    return [p['metadata']['name'] for p in names]


def test_rolling_update_choice():
    old_ds = daemonset()
    ds = daemonset(template_spec={'containers': [{'name': 'c', 'image': 'i:2'}]}, generation=2)
    old = [daemon_pod(old_ds, n, 'old-' + n) for n in 'abcd']
    assert _rolling(ds, old, 1) == ['old-a']
    assert _rolling(ds, old, 3) == ['old-a', 'old-b', 'old-c']
    assert _rolling(old_ds, old, 4) == []  # nothing to update
    # A new pod that is not available yet uses the whole budget of 1.
    fresh = [daemon_pod(ds, 'a', 'new-a', ready=False)] + old[1:]
    assert _rolling(ds, fresh, 1) == []
    assert _rolling(ds, fresh, 2) == ['old-b']
    # Once it is available, the next node goes.
    assert _rolling(ds, [daemon_pod(ds, 'a', 'new-a')] + old[1:], 1) == ['old-b']
    # Old pods that are not available anyway are replaced beyond the budget.
    broken = [daemon_pod(old_ds, 'c', 'old-c', ready=False)]
    assert _rolling(ds, fresh[:2] + broken + old[3:], 1) == ['old-c']
    # A node with both an old and a new pod (the manage step sorts it out first) counts as unavailable.
    assert _rolling(ds, old + [daemon_pod(ds, 'a', 'new-a', created=5)], 2) == ['old-b']


def test_rolling_update_respects_min_ready_seconds():
    old_ds = daemonset()
    ds = daemonset(template_spec={'containers': [{'name': 'c', 'image': 'i:2'}]}, generation=2)
    ds['spec']['minReadySeconds'] = 3600  # the new pod has been ready for 100 s only
    pods = [daemon_pod(ds, 'a', 'new-a'), daemon_pod(old_ds, 'b', 'old-b')]
    pods[1]['status']['conditions'][0]['lastTransitionTime'] = stamp(7200)  # old-b is available
    current = ctl.template_hash(ds['spec']['template'])
    assert ctl.rolling_update_deletions(ds, ctl.pods_by_node(pods), current, 1, NOW) == []
    ds['spec']['minReadySeconds'] = 10
    assert ctl.rolling_update_deletions(ds, ctl.pods_by_node(pods), current, 1, NOW) == [pods[1]]


def test_daemonset_status():
    old_ds = daemonset(template_spec={'nodeSelector': {'gpu': 'yes'}})
    ds = daemonset(template_spec={'nodeSelector': {'gpu': 'yes'}, 'hostPID': True}, generation=2)
    nodes = [node('a', {'gpu': 'yes'}), node('b', {'gpu': 'yes'}), node('c', {'gpu': 'yes'}), node('d')]
    pods = [daemon_pod(ds, 'a', 'a1'), daemon_pod(old_ds, 'b', 'b1'), daemon_pod(ds, 'b', 'b2', ready=False, created=5),
            daemon_pod(ds, 'd', 'd1')]
    status = ctl.daemonset_status(ds, nodes, ctl.pods_by_node(pods), ctl.template_hash(ds['spec']['template']))
    assert status == {'desiredNumberScheduled': 3, 'currentNumberScheduled': 2, 'numberMisscheduled': 1,
                      'numberReady': 2, 'numberAvailable': 2, 'numberUnavailable': 1, 'updatedNumberScheduled': 1,
                      'observedGeneration': 2}
    empty = ctl.daemonset_status(ds, [], {}, 'h')
    assert empty == {'desiredNumberScheduled': 0, 'currentNumberScheduled': 0, 'numberMisscheduled': 0,
                     'numberReady': 0, 'observedGeneration': 2}


def test_status_patch_removes_omitted_fields():
    assert ctl.status_patch({'numberReady': 1, 'numberAvailable': 1}, {'numberReady': 0}) == {
        'numberReady': 0, 'numberAvailable': None}
    assert ctl.status_patch({'numberReady': 1}, {'numberReady': 1}) is None
    assert ctl.status_patch(None, {'replicas': 1}) == {'replicas': 1}


# -- Deployments ------------------------------------------------------------------------------

def _deployment(replicas=None, image='i:1'):
    obj = {'apiVersion': 'apps/v1', 'kind': 'Deployment',
           'metadata': {'name': 'web', 'namespace': 'ns', 'uid': 'd-uid', 'generation': 4},
           'spec': {'selector': {'matchLabels': {'app': 'web'}},
                    'template': {'metadata': {'labels': {'app': 'web'}},
                                 'spec': {'containers': [{'name': 'c', 'image': image}]}}}}
    if replicas is not None:
        obj['spec']['replicas'] = replicas
    return obj


def test_new_deployment_pod():
    d = _deployment()
    current = ctl.template_hash(d['spec']['template'])
    p = ctl.new_deployment_pod(d, current)
    assert p['metadata']['generateName'] == 'web-%s-' % current
    assert p['metadata']['labels'] == {'app': 'web', 'pod-template-hash': current}
    assert p['metadata']['ownerReferences'][0]['kind'] == 'Deployment'
    assert p['spec'] == d['spec']['template']['spec']


def test_plan_deployment():
    d = _deployment()
    current = ctl.template_hash(d['spec']['template'])

    def mine(name, template_hash=current, **kwargs):
        return pod(name, labels={'pod-template-hash': template_hash}, **kwargs)

    assert ctl.plan_deployment(d, [], current) == {'create': 1, 'delete': []}
    assert ctl.plan_deployment(_deployment(3), [mine('a')], current) == {'create': 2, 'delete': []}
    assert ctl.plan_deployment(d, [mine('a')], current) == {'create': 0, 'delete': []}
    # A failed pod is replaced, not counted.
    assert ctl.plan_deployment(d, [mine('a', phase='Failed')], current) == {'create': 1, 'delete': []}
    # Old template: every old pod goes first, nothing new yet (Recreate-like).
    old = [mine('o1', 'old'), mine('o2', 'old')]
    assert ctl.plan_deployment(d, old + [mine('n1')], current) == {'create': 0, 'delete': old}
    # Scale down: unscheduled first, then not ready, then the newest.
    pods = [mine('ready-old', node_name='n', ready=True, created=1),
            mine('ready-new', node_name='n', ready=True, created=5),
            mine('unready', node_name='n', created=2), mine('unbound', created=3)]
    plan = ctl.plan_deployment(_deployment(1), pods, current)
    assert [p['metadata']['name'] for p in plan['delete']] == ['unbound', 'unready', 'ready-new']
    assert ctl.plan_deployment(_deployment(0), [mine('a')], current)['delete'] == [mine('a')]


def test_deployment_status():
    d = _deployment(3)
    current = ctl.template_hash(d['spec']['template'])
    pods = [pod('a', labels={'pod-template-hash': current}, ready=True),
            pod('b', labels={'pod-template-hash': current}),
            pod('c', labels={'pod-template-hash': 'old'}, ready=True), pod('d', phase='Failed')]
    assert ctl.deployment_status(d, pods, current) == {
        'observedGeneration': 4, 'replicas': 3, 'updatedReplicas': 2, 'readyReplicas': 2, 'availableReplicas': 2,
        'unavailableReplicas': 1}
    assert ctl.deployment_status(_deployment(0), [], current) == {'observedGeneration': 4}


# -- the scheduler ----------------------------------------------------------------------------

GPU_NODE = {'cpu': '8', 'memory': '32Gi', 'pods': '110', 'nvidia.com/gpu': '4'}


def _usage(n, pods=()):
    return ctl.node_usage(n['metadata']['name'], list(pods))


def test_fit_reasons():
    n = node('a', allocatable={'cpu': '2', 'memory': '1Gi', 'pods': '2', 'nvidia.com/gpu': '4'})
    held = [pod('x', {'cpu': '1500m', 'memory': '512Mi'}, node_name='a', limits={'nvidia.com/gpu': 3}),
            pod('done', {'cpu': '2'}, node_name='a', phase='Succeeded'),  # terminated pods hold nothing
            pod('elsewhere', {'cpu': '2'}, node_name='b')]
    usage = _usage(n, held)
    assert usage['pods'] == 1 and usage['requests'] == {'cpu': D('1.5'), 'memory': D(2 ** 29), 'nvidia.com/gpu': 3}
    alloc = ctl.node_allocatable(n)
    assert ctl.fit_reasons({'cpu': D('0.5'), 'memory': D(2 ** 29), 'nvidia.com/gpu': D(1)}, alloc, usage) == []
    assert ctl.fit_reasons({'cpu': D('0.6'), 'memory': D(2 ** 29 + 1), 'nvidia.com/gpu': D(2), 'example.com/x': D(1)},
                           alloc, usage) == ['Insufficient cpu', 'Insufficient memory', 'Insufficient example.com/x',
                                             'Insufficient nvidia.com/gpu']
    usage['pods'] = 2
    assert ctl.fit_reasons({}, alloc, usage) == ['Too many pods']
    bare = node('z')
    bare['status']['allocatable'] = {}  # no "pods": none fit; a zero request is no request
    assert ctl.fit_reasons({'nvidia.com/gpu': D(0)}, ctl.node_allocatable(bare), _usage(bare)) == ['Too many pods']


def test_filter_order_and_messages():
    p = pod('p', limits={'nvidia.com/gpu': 8}, nodeSelector={'gpu': 'yes'})
    free = _usage(node('n'))

    def reasons(n):
        return ctl.filter_node(p, n, free)

    gpu = {'gpu': 'yes'}
    assert reasons(node('n', gpu, allocatable=GPU_NODE, unschedulable=True, taints=[TAINT])) == (
        ['node(s) were unschedulable'], False)
    assert reasons(node('n', taints=[TAINT, NOT_READY])) == (['node(s) had untolerated taint {gpu: busy}'], False)
    assert reasons(node('n', taints=[NOT_READY])) == (
        ['node(s) had untolerated taint {node.kubernetes.io/not-ready: }'], False)
    assert reasons(node('n')) == (["node(s) didn't match Pod's node affinity/selector"], False)
    assert reasons(node('n', gpu, allocatable=GPU_NODE)) == (['Insufficient nvidia.com/gpu'], True)
    tolerant = pod('t', tolerations=[{'operator': 'Exists'}])
    assert ctl.filter_node(tolerant, node('n', unschedulable=True, taints=[TAINT]), free) == ([], True)


EXAMPLE = ("0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't match Pod's node "
           "affinity/selector. preemption: 0/2 nodes are available: 1 No preemption victims found for incoming pod, "
           "1 Preemption is not helpful for scheduling.")


def test_failed_scheduling_message():
    nodes = [node('ctl-a', {'pool': 'a'}, allocatable=GPU_NODE), node('ctl-b', allocatable=GPU_NODE)]
    p = pod('p', limits={'nvidia.com/gpu': 5}, nodeSelector={'pool': 'a'})
    usages = dict((n['metadata']['name'], _usage(n)) for n in nodes)
    assert ctl.schedule(p, nodes, usages) == (None, EXAMPLE)
    assert ctl.schedule(dict(p, spec=dict(p['spec'], preemptionPolicy='Never')), nodes, usages) == (
        None, "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't match Pod's node "
              "affinity/selector. preemption: not eligible due to preemptionPolicy=Never.")
    assert ctl.schedule(p, [], {}) == (None, 'no nodes available to schedule pods')
    only_affinity = ("0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector. preemption: "
                     "0/1 nodes are available: 1 Preemption is not helpful for scheduling.")
    assert ctl.schedule(p, nodes[1:], usages) == (None, only_affinity)


def test_message_counts_a_node_once_per_reason_and_sorts_as_strings():
    failures = ([(['Insufficient cpu', 'Insufficient memory'], True)] * 10 + [(['Too many pods'], True)] * 2
                + [(['Insufficient cpu', 'Insufficient cpu'], True)])
    assert ctl.unschedulable_message(13, failures) == (
        '0/13 nodes are available: 10 Insufficient memory, 11 Insufficient cpu, 2 Too many pods. '
        'preemption: 0/13 nodes are available: 13 No preemption victims found for incoming pod.')


def test_schedule_picks_the_most_free_node_then_the_name():
    nodes = [node('b', allocatable=GPU_NODE), node('a', allocatable=GPU_NODE), node('c', allocatable=GPU_NODE)]
    usages = dict((n['metadata']['name'], _usage(n)) for n in nodes)
    p = pod('p', {'cpu': '1'})
    assert ctl.schedule(p, nodes, usages) == ('a', None)  # a tie: the first name
    ctl.add_to_usage(usages['a'], p)
    assert ctl.schedule(p, nodes, usages) == ('b', None)
    ctl.add_to_usage(usages['b'], pod('big', {'cpu': '4'}))
    ctl.add_to_usage(usages['c'], pod('none'))  # no requests still counts 100m / 200Mi for scoring
    assert ctl.schedule(p, nodes, usages) == ('c', None)
    gpu = pod('g', limits={'nvidia.com/gpu': 4})
    ctl.add_to_usage(usages['c'], pod('gpus', limits={'nvidia.com/gpu': 1}))
    assert ctl.schedule(gpu, nodes[2:], usages)[1].startswith('0/1 nodes are available: 1 Insufficient nvidia.com/gpu.')


def test_wants_default_scheduler():
    assert ctl.wants_default_scheduler(pod('p'))
    assert ctl.wants_default_scheduler(pod('p', schedulerName='default-scheduler'))
    assert not ctl.wants_default_scheduler(pod('p', schedulerName='other'))
    assert not ctl.wants_default_scheduler(pod('p', node_name='n'))
    assert not ctl.wants_default_scheduler(pod('p', schedulingGates=[{'name': 'g'}]))
    assert not ctl.wants_default_scheduler(pod('p', phase='Failed'))
    doomed = pod('p')
    doomed['metadata']['deletionTimestamp'] = stamp()
    assert not ctl.wants_default_scheduler(doomed)


# -- garbage collection -----------------------------------------------------------------------

def test_dangling_owners():
    ds, other = daemonset('ds'), daemonset('other', uid='other-uid')
    owners = {('ns', 'DaemonSet', 'ds'): 'ds-uid'}
    assert ctl.dangling_owners(pod('p', owner=ds), owners) is None
    assert ctl.dangling_owners(pod('p', owner=other), owners) == [ctl.owner_reference(other)]
    assert ctl.dangling_owners(pod('p', owner=ds), {('ns', 'DaemonSet', 'ds'): 'new-uid'})  # recreated owner
    assert ctl.dangling_owners(pod('p'), owners) is None  # no owner at all
    foreign = pod('p', owner=other)
    foreign['metadata']['ownerReferences'].append({'apiVersion': 'batch/v1', 'kind': 'Job', 'name': 'j', 'uid': 'j'})
    assert ctl.dangling_owners(foreign, owners) is None
    both = pod('p', owner=other)
    both['metadata']['ownerReferences'].append(ctl.owner_reference(ds))
    assert ctl.dangling_owners(both, owners) is None  # one owner is still there


def test_scaled_value_rounds_percentages_up():
    assert [ctl.scaled_value('33%', n) for n in (0, 1, 3, 4, 10)] == [0, 1, 1, 2, 4]
