# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Label Kubernetes nodes for GPU scheduling: the logic of the k8s_gpu_labels module.

Plain Python over the kubernetes client. What a node should carry comes from explicit labels or
from nvidia_gpu facts through the GFD label engine (plus ``nvidia.com/gpu.present``). Requests per
node: one GET, and one merge PATCH carrying the resourceVersion read, only when something changes;
a 409 means someone wrote in between, so read again and redo the plan. Labels we wrote are listed
in the ``gpuready.nvidia/managed-labels`` annotation: pruning only ever removes those.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import re

from ansible_collections.gpuready.nvidia.plugins.module_utils import gpu_labels
from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s.api import ApiError, call_api


OWNER_ANNOTATION = "gpuready.nvidia/managed-labels"
NFD_FEATURE_LABELS_ANNOTATION = "nfd.node.kubernetes.io/feature-labels"
GPU_PRESENT = "nvidia.com/gpu.present"
NVIDIA_PREFIX = "nvidia.com/"
NODE_FEATURE_API = ("nfd.k8s-sigs.io", "v1alpha1", "nodefeatures")
GFD_NODE_FEATURE_PREFIX = "nvidia-features-for-"
MERGE_PATCH = "application/merge-patch+json"
CONFLICT_ATTEMPTS = 5

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_PREFIX_RE = re.compile(r"^%s(\.%s)*$" % (_DNS_LABEL, _DNS_LABEL))
_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


class NodeLabelError(Exception):
    """A node could not be labelled; the message names the node and the reason, never credentials."""


class _Conflict(Exception):
    pass


def nfd_labels(node, prefix=""):
    """The label keys NFD set on a Node (its nfd.node.kubernetes.io/feature-labels annotation), those
    starting with prefix; none for a node that is missing or that NFD has not labelled."""
    annotation = ((node or {}).get("metadata") or {}).get("annotations") or {}
    return [key for key in (annotation.get(NFD_FEATURE_LABELS_ANNOTATION) or "").split(",") if key and key.startswith(prefix)]


# --- what a node should carry ---------------------------------------------------------------


def check_label(key, value, field="labels"):
    """Kubernetes' rules for a label: [prefix/]name with a DNS-subdomain prefix (<= 253) and a
    name of <= 63 alphanumerics, '-', '_', '.'; the value is empty or follows the name rule."""
    if not isinstance(key, str):
        raise ValueError("%s: label key %r must be a string" % (field, key))
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _PREFIX_RE.match(prefix)):
        raise ValueError("%s: label key %r has an invalid prefix (lower-case DNS subdomain, at most 253 characters)"
                         % (field, key))
    if len(name) > 63 or not _NAME_RE.match(name):
        raise ValueError("%s: label key %r has an invalid name (at most 63 characters: letters, digits, '-', '_', '.',"
                         " starting and ending with a letter or digit)" % (field, key))
    if value is None:
        return
    if not isinstance(value, str):
        raise ValueError("%s: the value of %r must be a string, got %r (quote it in YAML)" % (field, key, value))
    if value and (len(value) > 63 or not _NAME_RE.match(value)):
        raise ValueError("%s: the value %r of %r is not a valid label value (at most 63 characters: letters, digits,"
                         " '-', '_', '.', starting and ending with a letter or digit)" % (field, value, key))


def check_labels(labels, field="labels"):
    for key, value in labels.items():
        check_label(key, value, field)
    return labels


def labels_from_facts(facts, mig_strategy="none", sharing=None, field="gpu_facts"):
    """The labels GFD would write for these nvidia_gpu facts (no timestamp) plus gpu.present.
    A node without NVIDIA hardware should carry none. Hardware whose NVML failed is refused: its
    labels would be guesses, and pruning would strip a working node's labels."""
    if not isinstance(facts, dict):
        raise ValueError("%s must be an nvidia_gpu facts dict, got %s" % (field, type(facts).__name__))
    if not facts.get("present"):
        return {}
    if not facts.get("nvml_ok"):
        raise ValueError("%s: NVIDIA GPU hardware is present but NVML failed (%s); refusing to label or prune "
                         "this node until the driver works" % (field, facts.get("error") or "no reason given"))
    try:
        labels = gpu_labels.gfd_labels(facts, mig_strategy=mig_strategy, sharing=sharing, timestamp=False)
    except gpu_labels.LabelError as exc:
        raise ValueError("%s: %s" % (field, exc))
    labels[GPU_PRESENT] = "true"
    return check_labels(labels, field)


def _owned(node):
    text = (node.get("metadata", {}).get("annotations") or {}).get(OWNER_ANNOTATION) or ""
    return set(k for k in text.split(",") if k)


def plan(node, wanted, state="present", prune=True, explicit=True, gfd_keys=frozenset()):
    """What to change on node (a Node as a dict): (labels to set, keys to remove, owned keys after).

    present: set ``wanted``; with prune, remove the keys we own that are no longer wanted.
    absent: remove ``wanted``'s keys (any owner when the user listed them, ``explicit``), or every
    key we own when wanted is empty and not explicit. Keys in ``gfd_keys`` are never touched."""
    current = node.get("metadata", {}).get("labels") or {}
    owned = _owned(node)
    if state == "present":
        to_set = dict((k, v) for k, v in wanted.items() if current.get(k) != v and k not in gfd_keys)
        to_remove = sorted(k for k in owned if k in current and k not in wanted and k not in gfd_keys) if prune else []
    else:
        targets = set(wanted) if (wanted or explicit) else owned
        to_set = {}
        to_remove = sorted(k for k in targets if k in current and k not in gfd_keys and (explicit or k in owned))
    kept = set(k for k in owned if k in current and k not in gfd_keys and k not in to_remove)
    return to_set, to_remove, kept | set(to_set)


# --- talking to the API -----------------------------------------------------------------------


class NodeLabeler(object):
    """Labels nodes through one ApiClient (one connection pool for a whole fleet)."""

    def __init__(self, api_client, check_mode=False, respect_gfd=True):
        # Imported here, not at the top: the nfd_labels filter imports this file on the controller, where
        # Ansible loads every filter file of the collection for each task that uses one of them.
        from kubernetes.client import CoreV1Api, CustomObjectsApi

        self.host = api_client.configuration.host
        self.core = CoreV1Api(api_client)
        self.custom = CustomObjectsApi(api_client)
        self.check_mode = check_mode
        self.respect_gfd = respect_gfd
        self._node_features = None

    def _call(self, what, function, *args, **kwargs):
        """function's answer through k8s.api.call_api (its retries and messages); a 409 is a
        _Conflict, to read again, any other failure a NodeLabelError."""
        try:
            return call_api(what, function, *args, host=self.host, **kwargs)
        except ApiError as exc:
            if exc.status == 409:
                raise _Conflict()
            raise NodeLabelError(str(exc))

    def _get_node(self, name):
        response = self._call("node %s" % name, self.core.read_node, name, _preload_content=False)
        return json.loads(response.data)

    def _gfd_keys(self, node, name):
        """The nvidia.com/ keys GFD manages on this node (NFD's feature-labels annotation, else
        the labels of the NodeFeature GFD writes), or None when GFD does not manage it."""
        keys = set(nfd_labels(node, NVIDIA_PREFIX))
        if keys:
            return keys
        features = self._gfd_node_features()
        return set(features[name]) if name in features else None

    def _gfd_node_features(self):
        """{node name: labels} of GFD's NodeFeature objects, read once per call (no CRD: none)."""
        if self._node_features is None:
            listing = self._call("listing NodeFeatures (for respect_gfd)", self.custom.list_cluster_custom_object,
                                 *NODE_FEATURE_API, missing_ok=True) or {"items": []}
            self._node_features = dict(
                (item["metadata"]["name"][len(GFD_NODE_FEATURE_PREFIX):], (item.get("spec") or {}).get("labels") or {})
                for item in listing.get("items", [])
                if item.get("metadata", {}).get("name", "").startswith(GFD_NODE_FEATURE_PREFIX))
        return self._node_features

    def label(self, name, wanted, state="present", prune=True, explicit=True, facts_mode=False):
        """Bring one node to the wanted labels; returns the per-node result."""
        for dummy in range(CONFLICT_ATTEMPTS):
            node = self._get_node(name)
            to_set, to_remove, owned = plan(node, wanted, state, prune, explicit)
            if (to_set or to_remove) and self.respect_gfd:
                gfd_keys = self._gfd_keys(node, name)
                if gfd_keys is not None:
                    # GFD keeps its own labels current; from facts we only add what GFD never writes.
                    keep = {GPU_PRESENT: wanted[GPU_PRESENT]} if facts_mode and GPU_PRESENT in wanted else wanted
                    to_set, to_remove, owned = plan(node, keep, state, prune, explicit, gfd_keys - {GPU_PRESENT})
            try:
                return self._apply(name, node, to_set, to_remove, owned)
            except _Conflict:
                continue
        raise NodeLabelError("node %s: still changing under us after %d attempts (409 Conflict)"
                             % (name, CONFLICT_ATTEMPTS))

    def _apply(self, name, node, to_set, to_remove, owned):
        metadata = node.get("metadata", {})
        before = dict(metadata.get("labels") or {})
        after = dict(before, **to_set)
        for key in to_remove:
            after.pop(key, None)
        annotation = ",".join(sorted(owned)) or None
        annotation_changes = annotation != (metadata.get("annotations") or {}).get(OWNER_ANNOTATION)
        changed = bool(to_set or to_remove or annotation_changes)
        if changed and not self.check_mode:
            patch = {"metadata": {"resourceVersion": metadata.get("resourceVersion"),
                                  "labels": dict(to_set, **dict((k, None) for k in to_remove))}}
            if annotation_changes:
                patch["metadata"]["annotations"] = {OWNER_ANNOTATION: annotation}
            response = self._call("node %s" % name, self.core.patch_node, name, patch,
                                  _content_type=MERGE_PATCH, _preload_content=False)
            after = json.loads(response.data).get("metadata", {}).get("labels") or {}
        return {"node": name, "changed": changed, "labels": after, "added": to_set, "removed": to_remove,
                "diff": {"before": {"labels": before}, "after": {"labels": after}}}
