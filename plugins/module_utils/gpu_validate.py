# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prove that GPU nodes advertise what their GPUs allow: the logic of the k8s_gpu_validate module.

Plain Python over a ``kubernetes.client.CoreV1Api`` and ``k8s_auth.call_api``. Objects are read as raw JSON
(``_preload_content=False``) so a list page, a watch event and a test's fixture are the same dicts.

* ``wait_for_resources`` LISTs the nodes (paginated), then WATCHes from that list's resourceVersion
  until every expected node's capacity and allocatable equal the expected counts, or the deadline.
  An expired watch (410) is answered by listing again, as informers do.
* ``run_test_pods`` starts one pod per node that asks for one unit of a GPU resource and runs
  ``nvidia-smi -L``, waits for it to finish, reads its log and deletes it, also when it failed or
  timed out. A pod of that name that is there already (409) is deleted and created again.
* Every request goes through ``k8s_auth.call_api``: 5xx, 429 and dropped connections are retried
  with backoff, anything else fails at once with a message that never carries the credentials.
* ``node_row``, ``problem`` and ``format_table`` turn what was seen into rows and sentences.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import functools
import json
import math
import os
import tempfile
import time

from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s_auth import REQUEST_TIMEOUT, ApiError, call_api

try:
    import urllib3
except ImportError:  # pragma: no cover - k8s_auth reports the missing library
    pass

NVIDIA_PREFIX = "nvidia.com/"
DEFAULT_SELECTOR = "nvidia.com/gpu.present=true"
TEST_POD_PREFIX = "gpuready-gpu-test-"
TEST_POD_LABELS = {"app.kubernetes.io/name": "gpuready-gpu-test", "app.kubernetes.io/managed-by": "gpuready.nvidia"}
TEST_CONTAINER = "gpu-test"
TEST_COMMAND = ["nvidia-smi", "-L"]
FINISHED = ("Succeeded", "Failed")
RELIST_ATTEMPTS = 5          # an expired continue token: start the list again, at most this often
LOG_LIMIT = 64 * 1024        # bytes of a test pod's log kept


class ValidationError(Exception):
    """The API refused or could not answer; the message says what was asked, never credentials."""


def _json(response):
    try:
        return json.loads(response.data)
    finally:
        response.release_conn()


def _name(obj):
    return (obj.get("metadata") or {}).get("name")


# --- list and watch -------------------------------------------------------------------------


def list_objects(list_func, label_selector=None, page_size=500, what="listing"):
    """Every object list_func returns for the selector, page_size per request; (objects, the
    resourceVersion of the first page). A continue token that expired (410) starts the list again.
    what names the list in messages."""
    for _attempt in range(RELIST_ATTEMPTS):
        objects, token, resource_version = [], None, None
        try:
            while True:
                kwargs = dict(limit=page_size, _preload_content=False)
                if label_selector:
                    kwargs["label_selector"] = label_selector
                if token:
                    kwargs["_continue"] = token
                page = _json(call_api(what, list_func, **kwargs))
                metadata = page.get("metadata") or {}
                # Later pages are a snapshot of the first one's revision: watching from it misses nothing.
                resource_version = resource_version or metadata.get("resourceVersion")
                objects.extend(page.get("items") or [])
                token = metadata.get("continue")
                if not token:
                    return objects, resource_version
        except ApiError as exc:
            if exc.status != 410 or token is None:
                raise
    raise ValidationError("%s: the list kept expiring between pages (%d attempts)" % (what, RELIST_ATTEMPTS))


def list_nodes(api, label_selector=DEFAULT_SELECTOR, page_size=500):
    """All nodes matching the selector, page_size per request: (nodes, resourceVersion)."""
    return list_objects(api.list_node, label_selector, page_size, "listing the nodes")


class _Expired(Exception):
    pass


def _lines(response):
    """The newline-separated lines of a streamed (chunked) response."""
    pending = b""
    for chunk in response.stream(4096):
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line.strip():
                yield line
    if pending.strip():
        yield pending


def follow(list_func, label_selector, page_size, deadline, done, what="the objects"):
    """LIST, then WATCH from the list's resourceVersion, keeping {name: object} current, until
    done(objects) is true or the deadline passes; returns the objects last seen. A watch that
    expired (410, as an HTTP answer or an ERROR event) is replaced by a fresh LIST. what names the
    objects in messages."""
    items, resource_version = list_objects(list_func, label_selector, page_size, "listing %s" % what)
    objects = dict((_name(o), o) for o in items)
    while not done(objects):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        kwargs = dict(watch=True, resource_version=resource_version, allow_watch_bookmarks=True,
                      timeout_seconds=max(1, int(math.ceil(remaining))), _preload_content=False,
                      _request_timeout=(REQUEST_TIMEOUT[0], remaining + 30))
        if label_selector:
            kwargs["label_selector"] = label_selector
        try:
            response = call_api("watching %s" % what, list_func, **kwargs)
            try:
                for line in _lines(response):
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        if obj.get("code") == 410:
                            raise _Expired()
                        raise ValidationError("watching %s failed: %s" % (what, obj.get("message")))
                    resource_version = (obj.get("metadata") or {}).get("resourceVersion") or resource_version
                    if event.get("type") == "DELETED":
                        objects.pop(_name(obj), None)
                    elif event.get("type") in ("ADDED", "MODIFIED"):
                        objects[_name(obj)] = obj
                    if done(objects):
                        break
            finally:
                response.close()  # a watch cut short must not go back to the pool half read
                response.release_conn()
        except (_Expired, ApiError) as exc:
            if isinstance(exc, ApiError) and exc.status != 410:
                raise
            items, resource_version = list_objects(list_func, label_selector, page_size, "listing %s" % what)
            objects = dict((_name(o), o) for o in items)
        except urllib3.exceptions.HTTPError:
            time.sleep(1)  # the stream broke; watch again from the last resourceVersion seen
    return objects


# --- what a node advertises -------------------------------------------------------------------


def _count(value):
    """An extended resource quantity as an int (they are whole numbers); other text stays as it is."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return value


def _resources(status, key, names):
    advertised = (status or {}).get(key) or {}
    return dict((name, _count(value)) for name, value in advertised.items()
                if name in names or name.startswith(NVIDIA_PREFIX))


def node_resources(node, expected):
    """(capacity, allocatable) of a Node object: the expected resources and every nvidia.com/ one."""
    status = node.get("status") or {}
    return _resources(status, "capacity", expected), _resources(status, "allocatable", expected)


def _listing(resources):
    return ", ".join("%s=%s" % item for item in sorted(resources.items())) or "nothing"


def problem(name, expected, capacity, allocatable):
    """What is wrong with a node's advertised resources, as one sentence naming the node and each
    missing or unhealthy resource; None when capacity and allocatable equal the expected counts.
    Unexpected nvidia.com/ resources count only while allocatable: the kubelet keeps the capacity of a
    plugin that went away (allocatable 0) for a while."""
    faults = []
    for resource, want in sorted(expected.items()):
        have, usable = capacity.get(resource), allocatable.get(resource, 0)
        if have is None:
            faults.append("no %s (expected %d)" % (resource, want))
        elif have != want:
            faults.append("%s capacity %s, expected %d" % (resource, have, want))
        elif isinstance(usable, int) and usable < have:
            faults.append("%d of %d %s unhealthy (allocatable %d)" % (have - usable, have, resource, usable))
        elif usable != want:
            faults.append("%s allocatable %s, expected %d" % (resource, usable, want))
    extra = dict((r, n) for r, n in allocatable.items()
                 if r not in expected and r.startswith(NVIDIA_PREFIX) and n not in (0, "0"))
    if extra:
        faults.append("unexpected %s" % _listing(extra))
    if not faults:
        return None
    if any(r not in capacity for r in expected) and not any(r.startswith(NVIDIA_PREFIX) for r in capacity):
        faults.append("the NVIDIA device plugin has not registered there")
    return "node %s: %s" % (name, "; ".join(faults))


def node_row(name, expected, node=None, gpus=None, missing=None):
    """One row of the report for a node: the Node object as last seen (None when it was not among
    the listed nodes; missing then says why)."""
    if node is None:
        capacity, allocatable = {}, {}
        trouble = "node %s: %s" % (name, missing or "not found")
    else:
        capacity, allocatable = node_resources(node, expected)
        trouble = problem(name, expected, capacity, allocatable)
    unhealthy = dict((r, capacity[r] - allocatable.get(r, 0)) for r in expected
                     if isinstance(capacity.get(r), int) and isinstance(allocatable.get(r, 0), int)
                     and capacity[r] > allocatable.get(r, 0))
    return {"node": name, "gpus": gpus, "expected": dict(expected), "capacity": capacity, "allocatable": allocatable,
            "unhealthy": unhealthy, "ok": trouble is None, "problem": trouble}


def _advertises(node, expected):
    capacity, allocatable = node_resources(node, expected)
    return problem("", expected, capacity, allocatable) is None


def wait_for_resources(api, expected, label_selector=DEFAULT_SELECTOR, timeout=300, page_size=500, gpus=None):
    """Wait until every node of expected ({node: {resource: count}}) advertises exactly those counts
    in capacity and allocatable, or timeout seconds; one row per node (sorted by name, see node_row).
    A node that was never seen is looked up by name to tell "missing" from "not selected"."""
    deadline = time.monotonic() + timeout

    def done(nodes):
        return all(name in nodes and _advertises(nodes[name], want) for name, want in expected.items())

    try:
        nodes = follow(api.list_node, label_selector, page_size, deadline, done, "the nodes")
        rows = []
        for name in sorted(expected):
            missing = None
            if name not in nodes:
                missing = _why_not_listed(api, name, label_selector)
            rows.append(node_row(name, expected[name], nodes.get(name), (gpus or {}).get(name), missing))
    except ApiError as exc:
        raise ValidationError("reading the nodes failed: %s" % exc)
    return rows


def _why_not_listed(api, name, label_selector):
    response = call_api("reading node %s" % name, api.read_node, name, _preload_content=False, missing_ok=True)
    if response is None:
        return "no such Node in the cluster"
    response.release_conn()
    return "the Node does not match the label selector %s" % label_selector


# --- the test pod ------------------------------------------------------------------------------


def pod_name_for(node):
    """The test pod's name for a node (a DNS subdomain of at most 253 characters)."""
    return (TEST_POD_PREFIX + node)[:253].rstrip("-.")


def gpu_test_pod(name, namespace, image, resource, node=None, runtime_class=None, pull_policy="IfNotPresent"):
    """A pod asking for one unit of resource that runs nvidia-smi -L once. With node, it is pinned to
    that Node by name through a node-affinity term, so the scheduler still checks the request."""
    spec = {
        "restartPolicy": "Never",
        "tolerations": [{"key": resource, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{"name": TEST_CONTAINER, "image": image, "imagePullPolicy": pull_policy,
                        "command": list(TEST_COMMAND), "resources": {"limits": {resource: "1"}}}],
    }
    if node:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(TEST_POD_LABELS)}, "spec": spec}


def _delete_pod(core_api, namespace, name):
    """Delete the pod at once; True when there was one."""
    response = call_api("deleting pod %s/%s" % (namespace, name), core_api.delete_namespaced_pod, name, namespace,
                        grace_period_seconds=0, _preload_content=False, missing_ok=True)
    if response is None:
        return False
    response.release_conn()
    return True


def _gone(core_api, namespace, name, deadline):
    """Wait (until deadline) for a deleted pod to leave the API; a kubelet may take a moment."""
    while time.monotonic() < deadline:
        response = call_api("reading pod %s/%s" % (namespace, name), core_api.read_namespaced_pod, name, namespace,
                            _preload_content=False, missing_ok=True)
        if response is None:
            return True
        response.release_conn()
        time.sleep(0.5)
    return False


def _create_pod(core_api, namespace, manifest, deadline):
    """Create the pod; its uid. A pod of that name that appeared since the leftovers were deleted
    (409: an overlapping run, or our own create whose answer was lost) is deleted and created again, once."""
    name = manifest["metadata"]["name"]
    what = "creating pod %s/%s" % (namespace, name)
    try:
        return _json(call_api(what, core_api.create_namespaced_pod, namespace, manifest,
                              _preload_content=False))["metadata"]["uid"]
    except ApiError as exc:
        if exc.status != 409:
            raise
    if _delete_pod(core_api, namespace, name) and not _gone(core_api, namespace, name, deadline):
        raise ValidationError("%s: a pod of that name is in the way and did not go away when deleted" % what)
    return _json(call_api(what, core_api.create_namespaced_pod, namespace, manifest,
                          _preload_content=False))["metadata"]["uid"]


def waiting_reason(pod):
    """Why a pod has not finished: the scheduler's or the kubelet's message, else its phase."""
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return "not scheduled: %s" % (condition.get("message") or condition.get("reason"))
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting:
            return ("%s: %s" % (waiting.get("reason"), waiting.get("message") or "")).rstrip(": ")
    return "phase %s" % (status.get("phase") or "Pending")


def failure_reason(pod):
    """Why a pod failed, from its status: the kubelet's message (an admission error) or how its
    container ended."""
    status = (pod or {}).get("status") or {}
    if status.get("message"):
        return "%s: %s" % (status.get("reason") or "Failed", status["message"])
    for container in status.get("containerStatuses") or []:
        ended = (container.get("state") or {}).get("terminated")
        if ended:
            return "%s, exit code %s%s" % (ended.get("reason") or "terminated", ended.get("exitCode"),
                                           ": %s" % ended["message"] if ended.get("message") else "")
    return None


def _log(core_api, namespace, name):
    """(the container's log, None) or ("", why it could not be read)."""
    try:
        response = call_api("reading the log of pod %s/%s" % (namespace, name), core_api.read_namespaced_pod_log, name,
                            namespace, container=TEST_CONTAINER, limit_bytes=LOG_LIMIT, _preload_content=False)
    except ApiError as exc:
        return "", str(exc)
    try:
        return response.data.decode("utf-8", "replace"), None
    finally:
        response.release_conn()


def outcome(test, pod, log="", log_error=None):
    """The result of one test pod from the pod as last seen (None: gone) and its log:
    {node, pod, resource, phase, log, ok, product_found, product (the name found), problem}."""
    phase = ((pod or {}).get("status") or {}).get("phase") or ("Pending" if pod else None)
    result = {"node": test.get("node"), "pod": test["name"], "resource": test["resource"], "phase": phase,
              "log": log, "ok": False, "product_found": None, "product": None, "problem": None}
    where = "%stest pod %s/%s" % ("node %s: " % test["node"] if test.get("node") else "", test["namespace"],
                                  test["name"])
    products = [p for p in test.get("products") or [] if p]
    if products and phase in FINISHED:
        found = [p for p in products if p in log]
        result["product_found"], result["product"] = bool(found), (found or [None])[0]
    if phase not in FINISHED:
        result["problem"] = "%s asking for 1 %s did not finish within %d s (%s)" % (
            where, test["resource"], test["timeout"], waiting_reason(pod) if pod else "it was deleted")
    elif phase == "Failed":
        result["problem"] = "%s failed: %s" % (where, log.strip() or failure_reason(pod) or log_error or "no log")
    elif log_error:
        result["problem"] = "%s succeeded but its log could not be read: %s" % (where, log_error)
    elif result["product_found"] is False:
        result["problem"] = "%s ran nvidia-smi but its log does not name %s: %s" % (
            where, " or ".join(products), log.strip() or "(empty)")
    result["ok"] = result["problem"] is None
    return result


def run_test_pods(core_api, tests, namespace, image, runtime_class=None, timeout=300, pull_policy="IfNotPresent",
                  page_size=500):
    """Run one test pod per entry of tests (dicts with resource, and optionally node to pin it to,
    name (default from the node) and products, names of which one must appear in the log), all at
    the same time; a result per entry, in order (see outcome). A pod of the same name left by an
    earlier run is deleted first; every pod is deleted at the end, finished or not."""
    deadline = time.monotonic() + timeout
    tests = [dict(t, name=t.get("name") or pod_name_for(t["node"]), namespace=namespace, timeout=timeout)
             for t in tests]
    created = {}
    try:
        leftovers = [t["name"] for t in tests if _delete_pod(core_api, namespace, t["name"])]
        for name in leftovers:
            if not _gone(core_api, namespace, name, deadline):
                raise ValidationError("the test pod %s/%s left by an earlier run did not go away within %d s"
                                      % (namespace, name, timeout))
        for test in tests:
            manifest = gpu_test_pod(test["name"], namespace, image, test["resource"], test.get("node"),
                                    runtime_class, pull_policy)
            created[test["name"]] = _create_pod(core_api, namespace, manifest, deadline)

        def ours(pods, name):
            pod = pods.get(name)
            return pod if pod and pod["metadata"].get("uid") == created[name] else None

        def done(pods):
            return all(((ours(pods, n) or {}).get("status") or {}).get("phase") in FINISHED for n in created)

        selector = ",".join("%s=%s" % item for item in sorted(TEST_POD_LABELS.items()))
        pods = follow(functools.partial(core_api.list_namespaced_pod, namespace), selector, page_size, deadline, done,
                      "the test pods in namespace %s" % namespace)
        results = []
        for test in tests:
            pod = ours(pods, test["name"])
            finished = ((pod or {}).get("status") or {}).get("phase") in FINISHED
            log, log_error = _log(core_api, namespace, test["name"]) if finished else ("", None)
            results.append(outcome(test, pod, log, log_error))
        return results
    except ApiError as exc:
        raise ValidationError("running the test pods in namespace %s failed: %s" % (namespace, exc))
    finally:
        for name in created:
            try:
                _delete_pod(core_api, namespace, name)
            except ApiError:
                pass  # the error that brought us here is the one worth reporting


def run_test_pod(core_api, namespace, name, image, resource, runtime_class=None, node_name=None, timeout=300,
                 pull_policy="IfNotPresent", products=None):
    """One test pod called name (see run_test_pods), pinned to node_name when given."""
    return run_test_pods(core_api, [{"node": node_name, "name": name, "resource": resource, "products": products}],
                         namespace, image, runtime_class, timeout, pull_policy)[0]


# --- the report --------------------------------------------------------------------------------


def _cell(value):
    if value is None:
        return "-"
    if isinstance(value, dict):
        return _listing(value) if value else "-"
    return str(value)


def pod_cell(result):
    """The test pod column: passed (with the product), failed, or why it did not run."""
    if result is None:
        return "-"
    if isinstance(result, str):
        return result
    if result["ok"]:
        return "passed" + (": %s" % result["product"] if result.get("product") else "")
    return "failed (%s)" % (result.get("phase") or "not run")


TABLE_COLUMNS = ("node", "GPUs", "expected", "capacity", "allocatable", "test pod")


def format_table(rows):
    """Rows (node_row, with an optional "test_pod" result) as aligned text lines, a header first."""
    table = [TABLE_COLUMNS]
    for row in rows:
        table.append((row["node"], _cell(row.get("gpus")), _cell(row["expected"]), _cell(row["capacity"]),
                      _cell(row["allocatable"]), pod_cell(row.get("test_pod"))))
    widths = [max(len(line[i]) for line in table) for i in range(len(TABLE_COLUMNS))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in table]


def check_expected(expected):
    """expected (Node name -> resource -> count) with whole counts, or ValueError naming the bad entry."""
    for node, resources in expected.items():
        if not isinstance(resources, dict):
            raise ValueError("expected.%s must be a dict of resource name to count, got %r" % (node, resources))
        for resource, count in resources.items():
            try:
                if int(count) < 0 or int(count) != float(count):
                    raise ValueError()
            except (TypeError, ValueError):
                raise ValueError("expected.%s.%s must be a whole number, got %r" % (node, resource, count))
    return dict((node, dict((r, int(c)) for r, c in resources.items())) for node, resources in expected.items())


def write_report(path, report):
    """Write the report atomically (a reader never sees half of it)."""
    folder = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(prefix=".gpuready-report-", dir=folder)
    try:
        with os.fdopen(handle, "w") as stream:
            json.dump(report, stream, indent=2, sort_keys=True)
            stream.write("\n")
        os.chmod(temporary, 0o644)
        os.rename(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
