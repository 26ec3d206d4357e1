# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's control plane: what kube-controller-manager and kube-scheduler would do, on the
test machine, against the API server (tests/k8s_emulator) through kube.py.

    python3 lab/control/controllers.py --kubeconfig PATH [--interval 0.5]
                                       [--node-selector SEL] [--namespace-selector SEL]

Every ``--interval`` seconds each component lists what it needs and acts (no watches, no
caches, so a restart loses nothing). One line per action goes to stderr. An API error is
logged (once while it repeats) and the component simply tries again next round. SIGTERM or
SIGINT stops the loop after the current step. ``--node-selector`` and ``--namespace-selector``
(label selectors) limit the Nodes and namespaces the components see, so that tests sharing one
API server do not touch each other's objects; without them everything is managed.

Components, modelled on Kubernetes 1.31 (behaviour, reasons and messages):

* node lifecycle: the ``node.kubernetes.io/not-ready`` or ``unreachable`` NoSchedule taint (the
  conditions are not rewritten to Unknown, no NoExecute taints, no evictions);
* DaemonSet controller: one pod per eligible node, rolling update (or OnDelete), status, events;
* Deployment controller, **simplified**: no ReplicaSets. It keeps ``spec.replicas`` pods of the
  current template itself (named ``<deploy>-<pod-template-hash>-<suffix>``, owned by the
  Deployment) and replaces the pods of an older template Recreate-like (all old pods go first);
  ``strategy``, ``maxSurge``/``maxUnavailable``, ``paused``, revision history and status
  conditions are not modelled;
* default scheduler: filters NodeUnschedulable, TaintToleration, NodeAffinity (nodeSelector and
  required node affinity), NodeResourcesFit; scores by free cpu and memory (least allocated);
  binds through ``pods/binding``. No preemption, pod (anti-)affinity, topology spread, host ports
  or volumes;
* ServiceAccount controller: ``default`` in every namespace;
* garbage collector: pods whose DaemonSet/Deployment owners are gone (pods bound to a deleted
  Node stay: there is no pod GC).

The decisions are pure functions of plain dicts (tests/unit/harness/test_lab_control_decisions.py); the
classes only fetch, call them and write. Only the standard library and kube.py are used.
"""

import argparse
import collections
import copy
import datetime
import decimal
import hashlib
import json
import re
import signal
import sys
import time

import kube

NOT_READY = "node.kubernetes.io/not-ready"
UNREACHABLE = "node.kubernetes.io/unreachable"
UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
LIFECYCLE_TAINTS = (NOT_READY, UNREACHABLE)
HEARTBEAT_GRACE_S = 40  # kube-controller-manager's --node-monitor-grace-period
# What the DaemonSet controller adds to every daemon pod (and network-unavailable for hostNetwork).
DAEMON_TOLERATIONS = ((NOT_READY, "NoExecute"), (UNREACHABLE, "NoExecute"),
                      ("node.kubernetes.io/disk-pressure", "NoSchedule"),
                      ("node.kubernetes.io/memory-pressure", "NoSchedule"),
                      ("node.kubernetes.io/pid-pressure", "NoSchedule"), (UNSCHEDULABLE, "NoSchedule"))
HOST_NETWORK_TOLERATION = ("node.kubernetes.io/network-unavailable", "NoSchedule")
REVISION_LABEL = "controller-revision-hash"
GENERATION_LABEL = "pod-template-generation"
POD_TEMPLATE_HASH = "pod-template-hash"
SCHEDULER_NAME = "default-scheduler"
FAILED_POD_BACKOFF = (1.0, 900.0)  # the DaemonSet controller's failed-pod back-off: start, cap

# Scheduler reasons, word for word.
REASON_UNSCHEDULABLE = "node(s) were unschedulable"
REASON_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
REASON_TAINT = "node(s) had untolerated taint {%s: %s}"
REASON_TOO_MANY_PODS = "Too many pods"
NO_NODES = "no nodes available to schedule pods"
PREEMPTION_NO_VICTIMS = "No preemption victims found for incoming pod"
PREEMPTION_NOT_HELPFUL = "Preemption is not helpful for scheduling"
# Requests the scheduler assumes for scoring when a container sets none (not for fitting).
SCORE_DEFAULT_CPU = decimal.Decimal("0.1")
SCORE_DEFAULT_MEMORY = decimal.Decimal(200 * 2 ** 20)


def log(component, message):
    sys.stderr.write("%s %s: %s\n" % (time.strftime("%H:%M:%S"), component, message))
    sys.stderr.flush()


def utcnow():
    return datetime.datetime.now(datetime.timezone.utc)


def parse_time(value):
    """An API timestamp as an aware datetime, None when absent or unreadable."""
    if not value:
        return None
    try:
        return kube.parse_time(value)
    except ValueError:
        pass
    try:  # fractional seconds (RFC 3339 allows them)
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def meta(obj):
    return obj.get("metadata") or {}


def full_name(obj):
    return "%s/%s" % (meta(obj).get("namespace"), meta(obj).get("name"))


def by_age(objects):
    """Oldest first; the name breaks ties so that the order is stable."""
    return sorted(objects, key=lambda o: (meta(o).get("creationTimestamp") or "", meta(o).get("name") or ""))


# -- quantities -------------------------------------------------------------------------------

_BINARY_SUFFIXES = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60}
_DECIMAL_SUFFIXES = {"n": decimal.Decimal("1e-9"), "u": decimal.Decimal("1e-6"), "m": decimal.Decimal("1e-3"),
                     "": 1, "k": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12, "P": 10 ** 15, "E": 10 ** 18}
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?[0-9]+|[numkMGTPE]?)$")


def parse_quantity(value):
    """A resource quantity ("100m", "4Gi", "1e3", 2) as a Decimal in base units (cores, bytes)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return decimal.Decimal(str(value))
    match = _QUANTITY.match(str(value).strip())
    if not match:
        raise ValueError("invalid quantity %r" % (value,))
    number, suffix = decimal.Decimal(match.group(1)), match.group(2)
    if suffix in _BINARY_SUFFIXES:
        return number * _BINARY_SUFFIXES[suffix]
    if len(suffix) > 1:  # an exponent: 1e3; a lone "E" is exa
        return number.scaleb(int(suffix[1:]))
    return number * _DECIMAL_SUFFIXES[suffix]


def _add(total, name, value):
    total[name] = total.get(name, 0) + value


def container_requests(container):
    """A container's requests; a limit without a request is the request (the API server's defaulting)."""
    resources = container.get("resources") or {}
    out = {}
    for source in (resources.get("limits") or {}, resources.get("requests") or {}):
        for name, value in source.items():
            out[name] = parse_quantity(value)
    return out


def pod_requests(pod):
    """What the scheduler reserves for a pod: the containers' sum or the largest init container,
    whichever is more, per resource, plus the pod overhead."""
    spec = pod.get("spec") or {}
    total = {}
    for container in spec.get("containers") or []:
        for name, value in container_requests(container).items():
            _add(total, name, value)
    for container in spec.get("initContainers") or []:
        for name, value in container_requests(container).items():
            total[name] = max(total.get(name, 0), value)
    for name, value in (spec.get("overhead") or {}).items():
        _add(total, name, parse_quantity(value))
    return total


def pod_score_requests(pod):
    """(cpu, memory) for scoring: a container without a cpu or memory request counts as 100m and
    200Mi, so that pods without requests still spread (the scheduler's non-zero requests)."""
    cpu = memory = decimal.Decimal(0)
    for container in (pod.get("spec") or {}).get("containers") or []:
        requests = container_requests(container)
        cpu += requests.get("cpu", SCORE_DEFAULT_CPU)
        memory += requests.get("memory", SCORE_DEFAULT_MEMORY)
    return cpu, memory


# -- pods -------------------------------------------------------------------------------------

def condition(obj, kind):
    for entry in (obj.get("status") or {}).get("conditions") or []:
        if entry.get("type") == kind:
            return entry
    return None


def pod_ready(pod):
    entry = condition(pod, "Ready")
    return bool(entry) and entry.get("status") == "True"


def pod_available(pod, min_ready_seconds=0, now=None):
    """Ready, and for minReadySeconds already (the controllers' notion of available)."""
    if not pod_ready(pod):
        return False
    if not min_ready_seconds:
        return True
    since = parse_time(condition(pod, "Ready").get("lastTransitionTime"))
    return since is not None and since + datetime.timedelta(seconds=min_ready_seconds) < (now or utcnow())


def deleting(obj):
    return bool(meta(obj).get("deletionTimestamp"))


def terminated(pod):
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def controller_of(obj):
    """The ownerReference with controller: true, or None."""
    for ref in meta(obj).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref
    return None


def owned_by(pods, owner):
    """The pods whose controller is ``owner`` (same uid), in its namespace."""
    uid = meta(owner).get("uid")
    return [p for p in pods if meta(p).get("namespace") == meta(owner).get("namespace")
            and (controller_of(p) or {}).get("uid") == uid]


def owner_reference(owner):
    return {"apiVersion": owner.get("apiVersion"), "kind": owner.get("kind"), "name": meta(owner)["name"],
            "uid": meta(owner)["uid"], "controller": True, "blockOwnerDeletion": True}


# -- node selectors, affinity, taints ---------------------------------------------------------

class InvalidRequirement(ValueError):
    """A selector requirement the API would refuse; its whole term then matches nothing."""


def _integer(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def label_requirement_matches(requirement, labels):
    """One matchExpressions entry (In, NotIn, Exists, DoesNotExist, Gt, Lt) against node labels."""
    key, operator = requirement.get("key"), requirement.get("operator")
    values = requirement.get("values") or []
    present, value = key in labels, labels.get(key)
    if operator in ("In", "NotIn"):
        if not values:
            raise InvalidRequirement("%s: values must be non-empty for %s" % (key, operator))
        return (present and value in values) == (operator == "In")
    if operator in ("Exists", "DoesNotExist"):
        if values:
            raise InvalidRequirement("%s: values must be empty for %s" % (key, operator))
        return present == (operator == "Exists")
    if operator in ("Gt", "Lt"):
        if len(values) != 1 or _integer(values[0]) is None:
            raise InvalidRequirement("%s: %s needs exactly one integer value" % (key, operator))
        have = _integer(value) if present else None
        if have is None:
            return False
        return have > _integer(values[0]) if operator == "Gt" else have < _integer(values[0])
    raise InvalidRequirement("%s: unknown operator %r" % (key, operator))


def field_requirement_matches(requirement, node):
    """One matchFields entry: only metadata.name, In or NotIn, one value (as the API allows)."""
    key, operator = requirement.get("key"), requirement.get("operator")
    values = requirement.get("values") or []
    if key != "metadata.name" or operator not in ("In", "NotIn") or len(values) != 1:
        raise InvalidRequirement("matchFields: %s %s %s is not supported" % (key, operator, values))
    return (meta(node).get("name") in values) == (operator == "In")


def node_matches_term(term, node):
    """A nodeSelectorTerm: all its expressions and fields; an empty or invalid term matches nothing."""
    expressions, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not expressions and not fields:
        return False
    labels = meta(node).get("labels") or {}
    try:
        return (all(label_requirement_matches(r, labels) for r in expressions)
                and all(field_requirement_matches(r, node) for r in fields))
    except InvalidRequirement:
        return False


def required_node_affinity(spec):
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {})
    return affinity.get("requiredDuringSchedulingIgnoredDuringExecution")


def node_matches_pod(spec, node):
    """The pod spec's nodeSelector (every label equal) and required node affinity (terms ORed)."""
    labels = meta(node).get("labels") or {}
    for key, value in (spec.get("nodeSelector") or {}).items():
        if key not in labels or labels[key] != value:
            return False
    required = required_node_affinity(spec)
    if required is None:
        return True
    return any(node_matches_term(term, node) for term in required.get("nodeSelectorTerms") or [])


def tolerates(toleration, taint):
    """Does one toleration tolerate one taint? An empty effect or key matches any; Exists ignores
    the value; Equal (the default operator) compares it."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    if operator == "Equal":
        return (toleration.get("value") or "") == (taint.get("value") or "")
    return False


def untolerated_taint(taints, tolerations, effects=("NoSchedule", "NoExecute")):
    """The first taint with one of ``effects`` that no toleration tolerates, or None."""
    for taint in taints or []:
        if taint.get("effect") in effects and not any(tolerates(t, taint) for t in tolerations or []):
            return taint
    return None


# -- node lifecycle ---------------------------------------------------------------------------

def lifecycle_taint(node, now):
    """The taint key a Node should carry: None when Ready, ``unreachable`` when its Ready heartbeat
    is older than the grace period (or the kubelet reports Unknown), ``not-ready`` otherwise."""
    ready = condition(node, "Ready")
    beat = parse_time((ready or {}).get("lastHeartbeatTime")) or parse_time(meta(node).get("creationTimestamp"))
    if beat is None or (now - beat).total_seconds() > HEARTBEAT_GRACE_S:
        return UNREACHABLE
    status = (ready or {}).get("status")
    if status == "True":
        return None
    return UNREACHABLE if status == "Unknown" else NOT_READY


def lifecycle_taints_update(node, now):
    """The Node's new spec.taints, or None when they are right. Only the NoSchedule taints
    not-ready and unreachable are ours; every other taint is kept as it is, in place."""
    taints = (node.get("spec") or {}).get("taints") or []
    want = lifecycle_taint(node, now)
    ours = [t for t in taints if t.get("key") in LIFECYCLE_TAINTS and t.get("effect") == "NoSchedule"]
    if [t.get("key") for t in ours] == ([want] if want else []):
        return None
    kept = [t for t in taints if t not in ours]
    return kept + ([{"key": want, "effect": "NoSchedule"}] if want else [])


# -- template hashes, status patches ----------------------------------------------------------

_SAFE_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # no vowels, no 0/1/3: hashes never spell words


def template_hash(template):
    """A short stable hash of a pod template: the same template gives the same hash on every run
    and machine (not Python's hash()), key order does not matter. 48 bits in base 27: <= 10 chars."""
    canonical = json.dumps(template, sort_keys=True, separators=(",", ":")).encode()
    number = int.from_bytes(hashlib.sha256(canonical).digest()[:6], "big")
    chars = []
    while True:
        number, digit = divmod(number, len(_SAFE_CHARS))
        chars.append(_SAFE_CHARS[digit])
        if not number:
            return "".join(chars)


def status_patch(old, new):
    """A merge patch turning status ``old`` into ``new`` (None when equal): fields missing from
    ``new`` (zero values the API omits) are removed."""
    old = old or {}
    patch = dict((k, v) for k, v in new.items() if old.get(k) != v)
    patch.update((k, None) for k in old if k not in new)
    return patch or None


def _omit_zero(status, *keys):
    """Drop the keys whose value is 0: those status fields are omitempty in the API."""
    for key in keys:
        if not status.get(key):
            status.pop(key, None)
    return status


# -- DaemonSets -------------------------------------------------------------------------------

def _same_toleration(a, b):
    return all((a.get(k) or d) == (b.get(k) or d) for k, d in (("key", ""), ("operator", "Equal"),
                                                               ("value", ""), ("effect", "")))


def daemon_pod_tolerations(spec):
    """The template's tolerations plus the ones the DaemonSet controller adds to every daemon pod;
    a user toleration equal in key, operator, value and effect is replaced by ours."""
    tolerations = [dict(t) for t in spec.get("tolerations") or []]
    extra = list(DAEMON_TOLERATIONS) + ([HOST_NETWORK_TOLERATION] if spec.get("hostNetwork") else [])
    for key, effect in extra:
        ours = {"key": key, "operator": "Exists", "effect": effect}
        same = [i for i, t in enumerate(tolerations) if _same_toleration(t, ours)]
        if same:
            tolerations[same[0]] = ours
        else:
            tolerations.append(ours)
    return tolerations


def should_run_daemon_pod(ds, node):
    """(should run, should continue running): a daemon pod belongs on a node whose labels and name
    match the template and whose NoSchedule/NoExecute taints it tolerates; an existing one stays
    on a node with only untolerated NoSchedule taints."""
    spec = ((ds.get("spec") or {}).get("template") or {}).get("spec") or {}
    name = meta(node).get("name")
    if spec.get("nodeName") and spec["nodeName"] != name:
        return False, False
    if not node_matches_pod(spec, node):
        return False, False
    tolerations = daemon_pod_tolerations(spec)
    taints = (node.get("spec") or {}).get("taints") or []
    if untolerated_taint(taints, tolerations) is None:
        return True, True
    return False, untolerated_taint(taints, tolerations, ("NoExecute",)) is None


def target_node(pod):
    """The node a daemon pod is for: spec.nodeName, else its matchFields metadata.name In [node]."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return spec["nodeName"]
    for term in (required_node_affinity(spec) or {}).get("nodeSelectorTerms") or []:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and field.get("operator") == "In" and \
                    len(field.get("values") or []) == 1:
                return field["values"][0]
    return None


def pods_by_node(pods):
    """{node: [pods, oldest first]} by target node; pods without one are left out."""
    grouped = collections.defaultdict(list)
    for pod in by_age(pods):
        node = target_node(pod)
        if node:
            grouped[node].append(pod)
    return dict(grouped)


def new_daemon_pod(ds, node_name, revision):
    """The pod the DaemonSet controller creates for a node (the scheduler then binds it)."""
    template = (ds.get("spec") or {}).get("template") or {}
    template_meta = template.get("metadata") or {}
    spec = copy.deepcopy(template.get("spec") or {})
    spec["tolerations"] = daemon_pod_tolerations(spec)
    # Since 1.12 daemon pods are placed by the default scheduler: the required node affinity becomes
    # this one node (the controller already checked the template's own terms against it).
    affinity = spec.get("affinity") or {}
    node_affinity = affinity.get("nodeAffinity") or {}
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}]}
    affinity["nodeAffinity"] = node_affinity
    spec["affinity"] = affinity
    labels = dict(template_meta.get("labels") or {})
    labels[REVISION_LABEL] = revision
    labels[GENERATION_LABEL] = str(meta(ds).get("generation") or 1)
    pod_meta = {"generateName": "%s-" % meta(ds)["name"], "namespace": meta(ds).get("namespace"), "labels": labels,
                "ownerReferences": [owner_reference(ds)]}
    if template_meta.get("annotations"):
        pod_meta["annotations"] = dict(template_meta["annotations"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": spec}


def plan_daemonset(ds, nodes, grouped):
    """What the DaemonSet needs now, from its pods grouped by node (pods_by_node):
    {"create": [node names], "delete": [(pod, why)], "failed": [(pod, node)], "succeeded": [(pod, node)]}.
    Finished pods are listed apart: they get an event, and failed ones are deleted under a back-off."""
    plan = {"create": [], "delete": [], "failed": [], "succeeded": []}
    names = set()
    for node in sorted(nodes, key=lambda n: meta(n).get("name")):
        name = meta(node).get("name")
        names.add(name)
        should_run, should_continue = should_run_daemon_pod(ds, node)
        here = grouped.get(name) or []
        if should_run and not here:
            plan["create"].append(name)
        elif should_continue:
            running = []
            for pod in here:
                if deleting(pod):
                    continue
                phase = (pod.get("status") or {}).get("phase")
                if phase in ("Failed", "Succeeded"):
                    plan[phase.lower()].append((pod, name))
                else:
                    running.append(pod)
            # More than one: keep the oldest.
            plan["delete"].extend((pod, "duplicate on node %s" % name) for pod in running[1:])
        else:
            plan["delete"].extend((pod, "node %s is not eligible" % name) for pod in here if not deleting(pod))
    # Pods not bound yet whose node is gone would never be scheduled.
    for node_name, pods in sorted(grouped.items()):
        if node_name not in names:
            plan["delete"].extend((pod, "node %s is gone" % node_name) for pod in pods
                                  if not (pod.get("spec") or {}).get("nodeName") and not deleting(pod))
    return plan


def scaled_value(value, total):
    """An int-or-percent (``maxUnavailable``) against ``total``; percentages round up."""
    if isinstance(value, bool):
        raise ValueError("invalid value for IntOrString: %r" % (value,))
    if isinstance(value, int):
        return value
    text = str(value)
    percent = _integer(text[:-1]) if text.endswith("%") else None
    if percent is None:
        raise ValueError("invalid value for IntOrString: invalid type: string is not a percentage")
    return (percent * total + 99) // 100


def daemonset_max_unavailable(ds, desired):
    """maxUnavailable of a RollingUpdate DaemonSet (default 1, never 0: there is no surge here)."""
    rolling = ((ds.get("spec") or {}).get("updateStrategy") or {}).get("rollingUpdate") or {}
    return max(scaled_value(rolling.get("maxUnavailable", 1), desired), 1)


def daemon_pod_updated(pod, ds, revision):
    """Built from the current template: same revision hash, or same template generation."""
    labels = meta(pod).get("labels") or {}
    return labels.get(REVISION_LABEL) == revision or \
        labels.get(GENERATION_LABEL) == str(meta(ds).get("generation") or 1)


def rolling_update_deletions(ds, grouped, revision, max_unavailable, now=None):
    """The old pods a RollingUpdate deletes this round. Nodes by name: a node counts as unavailable
    when its new pod is not available (or its pods are in an odd state); old pods that are not
    available anyway always go; available old pods go while fewer than maxUnavailable are."""
    min_ready = (ds.get("spec") or {}).get("minReadySeconds") or 0
    unavailable, replace, candidates = 0, [], []
    for node in sorted(grouped):
        new = [p for p in grouped[node] if not deleting(p) and daemon_pod_updated(p, ds, revision)]
        old = [p for p in grouped[node] if not deleting(p) and not daemon_pod_updated(p, ds, revision)]
        if len(new) > 1 or len(old) > 1 or bool(new) == bool(old):
            unavailable += 1  # nothing, or both, or duplicates: the manage step sorts it out first
        elif new:
            if not pod_available(new[0], min_ready, now):
                unavailable += 1
        elif not pod_available(old[0], min_ready, now):
            replace.append(old[0])
        elif unavailable < max_unavailable:
            candidates.append(old[0])
    room = max(0, max_unavailable - unavailable)
    return replace + candidates[:room]


def daemonset_status(ds, nodes, grouped, revision, now=None):
    """The DaemonSet's status counters; on each node only the oldest daemon pod counts."""
    min_ready = (ds.get("spec") or {}).get("minReadySeconds") or 0
    desired = current = misscheduled = ready = available = updated = 0
    for node in nodes:
        should_run = should_run_daemon_pod(ds, node)[0]
        here = grouped.get(meta(node).get("name")) or []
        if not should_run:
            misscheduled += 1 if here else 0
            continue
        desired += 1
        if here:
            current += 1
            pod = here[0]
            ready += 1 if pod_ready(pod) else 0
            available += 1 if pod_available(pod, min_ready, now) else 0
            updated += 1 if daemon_pod_updated(pod, ds, revision) else 0
    status = {"desiredNumberScheduled": desired, "currentNumberScheduled": current,
              "numberMisscheduled": misscheduled, "numberReady": ready, "numberAvailable": available,
              "numberUnavailable": desired - available, "updatedNumberScheduled": updated,
              "observedGeneration": meta(ds).get("generation")}
    return _omit_zero(status, "numberAvailable", "numberUnavailable", "updatedNumberScheduled",
                      "observedGeneration")


# -- Deployments (simplified: no ReplicaSets) -------------------------------------------------

def deployment_replicas(deploy):
    replicas = (deploy.get("spec") or {}).get("replicas")
    return 1 if replicas is None else replicas


def new_deployment_pod(deploy, template_hash_value):
    template = (deploy.get("spec") or {}).get("template") or {}
    template_meta = template.get("metadata") or {}
    labels = dict(template_meta.get("labels") or {})
    labels[POD_TEMPLATE_HASH] = template_hash_value
    pod_meta = {"generateName": "%s-%s-" % (meta(deploy)["name"], template_hash_value),
                "namespace": meta(deploy).get("namespace"), "labels": labels,
                "ownerReferences": [owner_reference(deploy)]}
    if template_meta.get("annotations"):
        pod_meta["annotations"] = dict(template_meta["annotations"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": copy.deepcopy(template.get("spec") or {})}


def plan_deployment(deploy, pods, template_hash_value):
    """{"create": count, "delete": [pods]} for the Deployment's own pods. Pods of an older template
    are all deleted first, and new ones come only once they are gone (Recreate-like). Scaling
    down removes unscheduled, then not ready, then the newest pods first."""
    live = [p for p in pods if not terminated(p)]
    old = [p for p in live if (meta(p).get("labels") or {}).get(POD_TEMPLATE_HASH) != template_hash_value]
    if old:
        return {"create": 0, "delete": [p for p in old if not deleting(p)]}
    active = [p for p in live if not deleting(p)]
    want = deployment_replicas(deploy)
    if len(active) < want:
        return {"create": want - len(active), "delete": []}
    ranked = sorted(reversed(by_age(active)), key=lambda p: (bool((p.get("spec") or {}).get("nodeName")),
                                                             pod_ready(p)))
    return {"create": 0, "delete": ranked[:len(active) - want]}


def deployment_status(deploy, pods, template_hash_value, now=None):
    min_ready = (deploy.get("spec") or {}).get("minReadySeconds") or 0
    active = [p for p in pods if not terminated(p) and not deleting(p)]
    available = sum(1 for p in active if pod_available(p, min_ready, now))
    status = {"observedGeneration": meta(deploy).get("generation"), "replicas": len(active),
              "updatedReplicas": sum(1 for p in active
                                     if (meta(p).get("labels") or {}).get(POD_TEMPLATE_HASH) == template_hash_value),
              "readyReplicas": sum(1 for p in active if pod_ready(p)), "availableReplicas": available,
              "unavailableReplicas": max(0, deployment_replicas(deploy) - available)}
    return _omit_zero(status, *list(status))


# -- the scheduler ----------------------------------------------------------------------------

def node_allocatable(node):
    return dict((name, parse_quantity(value))
                for name, value in ((node.get("status") or {}).get("allocatable") or {}).items())


def node_usage(node_name, pods):
    """What the non-terminated pods bound to a node hold: {"requests", "pods", "score": (cpu, mem)}."""
    usage = {"requests": {}, "pods": 0, "score": [decimal.Decimal(0), decimal.Decimal(0)]}
    for pod in pods:
        if (pod.get("spec") or {}).get("nodeName") == node_name and not terminated(pod):
            add_to_usage(usage, pod)
    return usage


def add_to_usage(usage, pod):
    for name, value in pod_requests(pod).items():
        _add(usage["requests"], name, value)
    usage["pods"] += 1
    cpu, memory = pod_score_requests(pod)
    usage["score"][0] += cpu
    usage["score"][1] += memory


def fit_reasons(requests, allocatable, usage):
    """NodeResourcesFit: "Too many pods", then "Insufficient NAME" for cpu, memory,
    ephemeral-storage and every other requested resource, against allocatable minus what is held."""
    reasons = []
    if usage["pods"] + 1 > allocatable.get("pods", 0):
        reasons.append(REASON_TOO_MANY_PODS)
    ordered = ["cpu", "memory", "ephemeral-storage"] + sorted(
        n for n in requests if n not in ("cpu", "memory", "ephemeral-storage", "pods"))
    for name in ordered:
        want = requests.get(name, 0)
        if want > 0 and want > allocatable.get(name, 0) - usage["requests"].get(name, 0):
            reasons.append("Insufficient %s" % name)
    return reasons


def filter_node(pod, node, usage):
    """The filter plugins in the scheduler's order; the first that fails decides.
    Returns (reasons, preemption might help): empty reasons when the pod fits."""
    spec = pod.get("spec") or {}
    tolerations = spec.get("tolerations") or []
    node_spec = node.get("spec") or {}
    if node_spec.get("unschedulable") and not any(
            tolerates(t, {"key": UNSCHEDULABLE, "effect": "NoSchedule"}) for t in tolerations):
        return [REASON_UNSCHEDULABLE], False
    taint = untolerated_taint(node_spec.get("taints"), tolerations)
    if taint is not None:
        return [REASON_TAINT % (taint.get("key"), taint.get("value") or "")], False
    if not node_matches_pod(spec, node):
        return [REASON_AFFINITY], False
    reasons = fit_reasons(pod_requests(pod), node_allocatable(node), usage)
    return reasons, True


def histogram(reasons):
    """"COUNT reason" entries, sorted as strings (as the scheduler does), joined by ", "."""
    counts = collections.Counter(reasons)
    return ", ".join(sorted("%d %s" % (count, reason) for reason, count in counts.items()))


def unschedulable_message(total_nodes, failures, preemption_policy=None):
    """The FailedScheduling message. ``failures``: (reasons, preemption might help) per node; a
    node counts once per reason. Preemption is not modelled: where it might help (resources) no
    victims are found, as in a cluster where every pod has the same priority."""
    if total_nodes == 0:
        return NO_NODES
    reasons = []
    for node_reasons, _helps in failures:
        reasons.extend(set(node_reasons))
    message = "0/%d nodes are available: %s." % (total_nodes, histogram(reasons))
    if preemption_policy == "Never":
        return message + " preemption: not eligible due to preemptionPolicy=Never."
    preemption = [PREEMPTION_NO_VICTIMS if helps else PREEMPTION_NOT_HELPFUL for _reasons, helps in failures]
    return message + " preemption: 0/%d nodes are available: %s." % (total_nodes, histogram(preemption))


def node_score(pod, node, usage):
    """Least allocated: the mean free share of cpu and memory once the pod is there (0..100)."""
    allocatable = node_allocatable(node)
    total = decimal.Decimal(0)
    for index, (resource, request) in enumerate(zip(("cpu", "memory"), pod_score_requests(pod))):
        capacity = allocatable.get(resource, 0)
        if capacity > 0:
            total += max(decimal.Decimal(0), (capacity - usage["score"][index] - request) * 100 / capacity)
    return total / 2


def schedule(pod, nodes, usages):
    """(node name, None) for the best feasible node (highest score, then name), or (None, message)."""
    failures, feasible = [], []
    for node in nodes:
        name = meta(node).get("name")
        reasons, helps = filter_node(pod, node, usages[name])
        if reasons:
            failures.append((reasons, helps))
        else:
            feasible.append((-node_score(pod, node, usages[name]), name))
    if feasible:
        return min(feasible)[1], None
    return None, unschedulable_message(len(nodes), failures, (pod.get("spec") or {}).get("preemptionPolicy"))


def wants_default_scheduler(pod):
    spec = pod.get("spec") or {}
    return (not spec.get("nodeName") and (spec.get("schedulerName") or SCHEDULER_NAME) == SCHEDULER_NAME
            and not deleting(pod) and not terminated(pod) and not spec.get("schedulingGates"))


# -- garbage collection -----------------------------------------------------------------------

OWNER_KINDS = {"DaemonSet": "daemonsets", "Deployment": "deployments"}


def dangling_owners(pod, owners):
    """The pod's owner references when every one is a DaemonSet/Deployment that is gone (absent,
    or present with another uid); None otherwise. ``owners``: {(namespace, kind, name): uid}. An
    owner of another kind keeps the pod: it is not ours to judge."""
    refs = meta(pod).get("ownerReferences") or []
    if not refs:
        return None
    for ref in refs:
        if ref.get("kind") not in OWNER_KINDS or (ref.get("apiVersion") or "").split("/")[0] != "apps":
            return None
        if owners.get((meta(pod).get("namespace"), ref["kind"], ref.get("name"))) == ref.get("uid"):
            return None
    return refs


# -- controllers ------------------------------------------------------------------------------

class Scope:
    """The Nodes and namespaces the components manage (label selectors; None: all)."""

    def __init__(self, api, node_selector=None, namespace_selector=None):
        self.api = api
        self.node_selector = node_selector
        self.namespace_selector = namespace_selector

    def nodes(self):
        return self.api.list(kube.path("v1", "nodes"), label_selector=self.node_selector)

    def namespaces(self):
        return self.api.list(kube.path("v1", "namespaces"), label_selector=self.namespace_selector)

    def namespace_names(self):
        """The managed namespaces' names, or None for all."""
        if not self.namespace_selector:
            return None
        return set(meta(ns)["name"] for ns in self.namespaces())

    def select(self, objects):
        names = self.namespace_names()
        return [o for o in objects if names is None or meta(o).get("namespace") in names]


class Controller:
    name = "controller"

    def __init__(self, api, scope):
        self.api = api
        self.scope = scope
        self.failures = {}  # object -> last error message

    def log(self, message):
        log(self.name, message)

    def guarded(self, key, action, *args):
        """Runs action(*args) for one object: its failure is logged (once while it repeats) and
        does not hold up the other objects; the next round tries again."""
        try:
            action(*args)
        except (kube.ApiError, ValueError, KeyError, TypeError) as err:
            text = "%s: %s: %s" % (key, type(err).__name__, err)
            if self.failures.get(key) != text:
                self.log(text)
            self.failures[key] = text
        else:
            self.failures.pop(key, None)

    def sync(self):
        raise NotImplementedError


class NodeLifecycleController(Controller):
    name = "node-lifecycle-controller"

    def sync(self):
        now = utcnow()
        for node in self.scope.nodes():
            taints = lifecycle_taints_update(node, now)
            if taints is not None:
                self.guarded("node %s" % meta(node)["name"], self.update, node, taints)

    def update(self, node, taints):
        name = meta(node)["name"]
        try:
            # The resourceVersion makes this a compare-and-swap: a kubelet heartbeat in between (409)
            # only means the next round decides again, on fresh data.
            self.api.patch(kube.path("v1", "nodes", name=name),
                           {"metadata": {"resourceVersion": meta(node).get("resourceVersion")},
                            "spec": {"taints": taints or None}})
        except kube.ApiError as err:
            if err.code == 409:
                return
            raise
        wanted = [t["key"] for t in taints if t.get("key") in LIFECYCLE_TAINTS]
        self.log("node %s: lifecycle taint now %s" % (name, "%s:NoSchedule" % wanted[0] if wanted else "none"))


class DaemonSetController(Controller):
    name = "daemonset-controller"

    def __init__(self, api, scope):
        super().__init__(api, scope)
        self.backoff = {}  # (ds uid, node) -> (last failed-pod deletion, delay)

    def event(self, ds, reason, message, warning=False):
        self.api.event(ds, reason, message, "Warning" if warning else "Normal", component=self.name)

    def sync(self):
        daemonsets = self.scope.select(self.api.list(kube.path("apps/v1", "daemonsets")))
        if not daemonsets:
            return
        nodes = self.scope.nodes()
        pods = self.api.list(kube.path("v1", "pods"))
        for ds in daemonsets:
            if not deleting(ds):
                self.guarded(full_name(ds), self.sync_one, ds, nodes, owned_by(pods, ds))

    def _in_backoff(self, key, now):
        last, delay = self.backoff.get(key, (None, 0))
        return last is not None and now - last < delay

    def _delete(self, ds, pod, why):
        name = meta(pod)["name"]
        try:
            if not self.api.delete(kube.path("v1", "pods", meta(pod)["namespace"], name)):
                return  # already gone
        except kube.ApiError as err:
            self.event(ds, "FailedDelete", "Error deleting: %s" % err.message, warning=True)
            raise
        self.event(ds, "SuccessfulDelete", "Deleted pod: %s" % name)
        self.log("%s: deleted pod %s (%s)" % (full_name(ds), name, why))

    def _create(self, ds, node_name, revision):
        try:
            pod = self.api.create(kube.path("v1", "pods", meta(ds)["namespace"]),
                                  new_daemon_pod(ds, node_name, revision))
        except kube.ApiError as err:
            self.event(ds, "FailedCreate", "Error creating: %s" % err.message, warning=True)
            raise
        self.event(ds, "SuccessfulCreate", "Created pod: %s" % meta(pod)["name"])
        self.log("%s: created pod %s for node %s" % (full_name(ds), meta(pod)["name"], node_name))

    def sync_one(self, ds, nodes, pods):
        revision = template_hash((ds.get("spec") or {}).get("template") or {})
        grouped = pods_by_node(pods)
        plan = plan_daemonset(ds, nodes, grouped)
        acted = False
        for pod, why in plan["delete"]:
            self._delete(ds, pod, why)
            acted = True
        clock = time.monotonic()
        for pod, node_name in plan["failed"]:
            key = (meta(ds)["uid"], node_name)
            if self._in_backoff(key, clock):
                continue
            last, delay = self.backoff.get(key, (None, 0))
            self.backoff[key] = (clock, min(delay * 2, FAILED_POD_BACKOFF[1]) if last else FAILED_POD_BACKOFF[0])
            self.event(ds, "FailedDaemonPod", "Found failed daemon pod %s on node %s, will try to kill it"
                       % (full_name(pod), node_name), warning=True)
            self._delete(ds, pod, "failed")
            acted = True
        for pod, node_name in plan["succeeded"]:
            self.event(ds, "SucceededDaemonPod", "Found succeeded daemon pod %s on node %s, will try to delete it"
                       % (full_name(pod), node_name))
            self._delete(ds, pod, "succeeded")
            acted = True
        for node_name in plan["create"]:
            self._create(ds, node_name, revision)
            acted = True
        strategy = ((ds.get("spec") or {}).get("updateStrategy") or {}).get("type") or "RollingUpdate"
        if not acted and strategy == "RollingUpdate":
            # Only from a settled state: missing pods were created in an earlier round.
            desired = sum(1 for n in nodes if should_run_daemon_pod(ds, n)[0])
            for pod in rolling_update_deletions(ds, grouped, revision, daemonset_max_unavailable(ds, desired)):
                self._delete(ds, pod, "rolling update to %s" % revision)
                acted = True
        if acted:
            pods = owned_by(self.api.list(kube.path("v1", "pods", meta(ds)["namespace"])), ds)
            grouped = pods_by_node(pods)
        status = daemonset_status(ds, nodes, grouped, revision)
        patch = status_patch(ds.get("status"), status)
        if patch:
            self.api.patch(kube.path("apps/v1", "daemonsets", meta(ds)["namespace"], meta(ds)["name"], "status"),
                           {"status": patch})


class DeploymentController(Controller):
    name = "deployment-controller"

    def sync(self):
        deployments = self.scope.select(self.api.list(kube.path("apps/v1", "deployments")))
        if not deployments:
            return
        pods = self.api.list(kube.path("v1", "pods"))
        for deploy in deployments:
            if not deleting(deploy):
                self.guarded(full_name(deploy), self.sync_one, deploy, owned_by(pods, deploy))

    def sync_one(self, deploy, pods):
        namespace = meta(deploy)["namespace"]
        current = template_hash((deploy.get("spec") or {}).get("template") or {})
        plan = plan_deployment(deploy, pods, current)
        for pod in plan["delete"]:
            if not self.api.delete(kube.path("v1", "pods", namespace, meta(pod)["name"])):
                continue
            self.api.event(deploy, "SuccessfulDelete", "Deleted pod: %s" % meta(pod)["name"], component=self.name)
            self.log("%s: deleted pod %s" % (full_name(deploy), meta(pod)["name"]))
        for _count in range(plan["create"]):
            pod = self.api.create(kube.path("v1", "pods", namespace), new_deployment_pod(deploy, current))
            self.api.event(deploy, "SuccessfulCreate", "Created pod: %s" % meta(pod)["name"], component=self.name)
            self.log("%s: created pod %s" % (full_name(deploy), meta(pod)["name"]))
        if plan["delete"] or plan["create"]:
            pods = owned_by(self.api.list(kube.path("v1", "pods", namespace)), deploy)
        patch = status_patch(deploy.get("status"), deployment_status(deploy, pods, current))
        if patch:
            self.api.patch(kube.path("apps/v1", "deployments", namespace, meta(deploy)["name"], "status"),
                           {"status": patch})


class Scheduler(Controller):
    name = SCHEDULER_NAME

    def sync(self):
        pods = self.api.list(kube.path("v1", "pods"))
        pending = [p for p in self.scope.select(pods) if wants_default_scheduler(p)]
        if not pending:
            return
        # Higher priority first, then first come first served.
        pending = sorted(by_age(pending), key=lambda p: -((p.get("spec") or {}).get("priority") or 0))
        nodes = sorted(self.scope.nodes(), key=lambda n: meta(n)["name"])
        usages = dict((meta(n)["name"], node_usage(meta(n)["name"], pods)) for n in nodes)
        for pod in pending:
            self.guarded(full_name(pod), self.schedule_one, pod, nodes, usages)

    def schedule_one(self, pod, nodes, usages):
        namespace, name = meta(pod)["namespace"], meta(pod)["name"]
        node_name, message = schedule(pod, nodes, usages)
        if node_name:
            self.api.create(kube.path("v1", "pods", namespace, name, "binding"),
                            {"apiVersion": "v1", "kind": "Binding",
                             # The uid, as the real binder sends it: never bind a new pod of the same name.
                             "metadata": {"name": name, "namespace": namespace, "uid": meta(pod).get("uid")},
                             "target": {"apiVersion": "v1", "kind": "Node", "name": node_name}})
            add_to_usage(usages[node_name], pod)
            self.api.event(pod, "Scheduled", "Successfully assigned %s/%s to %s" % (namespace, name, node_name),
                           component=self.name)
            self.log("%s/%s: bound to %s" % (namespace, name, node_name))
            return
        old = condition(pod, "PodScheduled") or {}
        if (old.get("status"), old.get("reason"), old.get("message")) == ("False", "Unschedulable", message):
            return  # already said: no new event every round
        stamp = old.get("lastTransitionTime") if old.get("status") == "False" else None
        entry = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
                 "lastTransitionTime": stamp or kube.now()}
        self.api.patch(kube.path("v1", "pods", namespace, name, "status"), {"status": {"conditions": [entry]}},
                       "strategic")
        self.api.event(pod, "FailedScheduling", message, "Warning", component=self.name)
        self.log("%s/%s: unschedulable: %s" % (namespace, name, message))


class ServiceAccountController(Controller):
    name = "serviceaccount-controller"

    def sync(self):
        namespaces = [ns for ns in self.scope.namespaces()
                      if not deleting(ns) and (ns.get("status") or {}).get("phase") != "Terminating"]
        defaults = self.api.list(kube.path("v1", "serviceaccounts"), field_selector="metadata.name=default")
        have = set(meta(sa).get("namespace") for sa in defaults)
        for ns in namespaces:
            name = meta(ns)["name"]
            if name in have:
                continue
            try:
                self.api.create(kube.path("v1", "serviceaccounts", name),
                                {"apiVersion": "v1", "kind": "ServiceAccount",
                                 "metadata": {"name": "default", "namespace": name}})
            except kube.ApiError as err:
                if err.code != 409:  # someone else made it meanwhile: fine
                    raise
                continue
            self.log("created serviceaccount %s/default" % name)


class GarbageCollector(Controller):
    name = "garbage-collector"

    def sync(self):
        # Pods first, owners second: an owner created after this pod list cannot own a listed pod.
        pods = [p for p in self.scope.select(self.api.list(kube.path("v1", "pods"))) if meta(p).get("ownerReferences")]
        if not pods:
            return
        owners = {}
        for kind, resource in OWNER_KINDS.items():
            for obj in self.api.list(kube.path("apps/v1", resource)):
                owners[(meta(obj).get("namespace"), kind, meta(obj)["name"])] = meta(obj).get("uid")
        for pod in pods:
            refs = dangling_owners(pod, owners)
            if refs and self.confirm_gone(pod, refs):
                self.delete(pod, refs)

    def confirm_gone(self, pod, refs):
        """A fresh read of each owner, as the real collector does before deleting."""
        for ref in refs:
            owner = self.api.get(kube.path("apps/v1", OWNER_KINDS[ref["kind"]], meta(pod)["namespace"], ref["name"]))
            if owner is not None and meta(owner).get("uid") == ref.get("uid"):
                return False
        return True

    def delete(self, pod, refs):
        url = kube.path("v1", "pods", meta(pod)["namespace"], meta(pod)["name"])
        try:
            # The uid precondition: never delete a new pod that took the old one's name.
            self.api.call("DELETE", url, {"apiVersion": "v1", "kind": "DeleteOptions",
                                          "preconditions": {"uid": meta(pod).get("uid")},
                                          "propagationPolicy": "Background"})
        except kube.ApiError as err:
            if err.code in (404, 409):
                return
            raise
        self.log("deleted pod %s: owner %s gone" % (full_name(pod), ", ".join(
            "%s %s (uid %s)" % (r["kind"], r.get("name"), r.get("uid")) for r in refs)))


COMPONENTS = (ServiceAccountController, NodeLifecycleController, GarbageCollector, DaemonSetController,
              DeploymentController, Scheduler)


class Stop:
    """Set by SIGTERM/SIGINT; the loop checks it between steps (a handler never blocks on a lock)."""

    def __init__(self):
        self.requested = False

    def __call__(self, _signum, _frame):
        self.requested = True

    def sleep(self, seconds):
        deadline = time.monotonic() + seconds
        while not self.requested and time.monotonic() < deadline:
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


def run(controllers, interval, stop):
    """Every component once per round until stopped; a failure is logged once while it repeats."""
    last_error = {}
    while not stop.requested:
        for controller in controllers:
            if stop.requested:
                break
            try:
                controller.sync()
            except Exception as err:  # the loop must outlive API errors, dropped connections and odd objects
                text = "%s: %s" % (type(err).__name__, err)
                if last_error.get(controller.name) != text:
                    controller.log("sync failed, retrying every round: %s" % text)
                last_error[controller.name] = text
            else:
                if last_error.pop(controller.name, None):
                    controller.log("sync works again")
        stop.sleep(interval)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between rounds (default 0.5)")
    parser.add_argument("--node-selector", help="label selector: the Nodes to manage (default: all)")
    parser.add_argument("--namespace-selector", help="label selector: the namespaces to manage (default: all)")
    args = parser.parse_args(argv)
    stop = Stop()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    api = kube.Client.from_kubeconfig(args.kubeconfig)
    scope = Scope(api, args.node_selector, args.namespace_selector)
    log("controllers", "started against %s (nodes: %s, namespaces: %s)"
        % (api.server, args.node_selector or "all", args.namespace_selector or "all"))
    run([component(api, scope) for component in COMPONENTS], args.interval, stop)
    log("controllers", "stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
