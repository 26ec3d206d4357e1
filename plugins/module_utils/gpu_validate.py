# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prove that GPU nodes advertise what their GPUs allow: the logic of the k8s_gpu_validate module.

Plain Python over a ``kubernetes.client.CoreV1Api`` and ``k8s.api`` (every request through its
``call_api``: 5xx, 429 and dropped connections are retried with backoff, anything else fails at once
with a message that never carries the credentials).

* ``wait_for_resources`` follows the nodes (``k8s.api.follow``: LIST, then WATCH) until every
  expected node's capacity and allocatable equal the expected counts, or the deadline.
* The test pods are ``k8s.pods.run_test_pods``.
* ``node_row``, ``problem`` and ``format_table`` turn what was seen into rows and sentences.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import tempfile
import time

from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s.api import ApiError, call_api, follow, list_objects

NVIDIA_PREFIX = "nvidia.com/"
DEFAULT_SELECTOR = "nvidia.com/gpu.present=true"


def list_nodes(api, label_selector=DEFAULT_SELECTOR, page_size=500):
    """All nodes matching the selector, page_size per request: (nodes, resourceVersion)."""
    return list_objects(api.list_node, label_selector, page_size, "listing the nodes")


class ValidationError(Exception):
    """The API refused or could not answer; the message says what was asked, never credentials."""


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
