# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pods: why one has not finished or failed, and the GPU test pod that k8s_gpu_validate and
k8s_gpu_doctor run.

Plain Python over a ``kubernetes.client.CoreV1Api`` and ``k8s.api``. ``run_test_pods`` starts one pod
per node that asks for one unit of a GPU resource and runs ``nvidia-smi -L``, waits for it to finish
(``k8s.api.follow``), reads its log and deletes it, also when it failed or timed out. A pod of that
name that is there already (409) is deleted and created again.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import functools
import time

from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s.api import ApiError, call_api, follow, json_body
from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s.workloads import OWNED_LABELS

TEST_POD_PREFIX = "gpuready-gpu-test-"
TEST_POD_LABELS = dict(OWNED_LABELS, **{"app.kubernetes.io/name": "gpuready-gpu-test"})
TEST_CONTAINER = "gpu-test"
TEST_COMMAND = ["nvidia-smi", "-L"]
FINISHED = ("Succeeded", "Failed")
LOG_LIMIT = 64 * 1024        # bytes of a test pod's log kept


class PodRunError(Exception):
    """The test pods could not be run: the API refused or could not answer, or a pod in the way did
    not go; the message says what was asked, never credentials."""


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
        return json_body(call_api(what, core_api.create_namespaced_pod, namespace, manifest,
                                  _preload_content=False))["metadata"]["uid"]
    except ApiError as exc:
        if exc.status != 409:
            raise
    if _delete_pod(core_api, namespace, name) and not _gone(core_api, namespace, name, deadline):
        raise PodRunError("%s: a pod of that name is in the way and did not go away when deleted" % what)
    return json_body(call_api(what, core_api.create_namespaced_pod, namespace, manifest,
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
                raise PodRunError("the test pod %s/%s left by an earlier run did not go away within %d s"
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
        raise PodRunError("running the test pods in namespace %s failed: %s" % (namespace, exc))
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
