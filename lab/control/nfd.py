# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's stand-ins for Node Feature Discovery v0.17: `nfd-worker` and `nfd-master`.

nfd-worker (a DaemonSet pod) reads two feature sources on its node and publishes them as the
NodeFeature object named after the node, in its namespace:
  * local: every file in /etc/kubernetes/node-feature-discovery/features.d (``key=value``
    lines; a bare ``key`` means ``true``; ``#`` comments), as GFD's file output;
  * pci: /sys/bus/pci/devices/*/{class,vendor} (hostPath /sys mounted at /host-sys, as the
    real manifests do), labelled ``feature.node.kubernetes.io/pci-<fields>.present=true`` for the
    device classes in ``sources.pci.deviceClassWhitelist`` (default 03, 0b40, 12) with the
    ``deviceLabelFields`` (default class, vendor), read from /etc/kubernetes/node-feature-discovery/
    nfd-worker.conf, which also gives ``core.sleepInterval`` (default 60s) between rounds.
nfd-master (a Deployment pod) merges every NodeFeature object of a node (by the label
nfd.node.kubernetes.io/node-name) into that Node's labels, keeps the list it manages in the
annotation nfd.node.kubernetes.io/feature-labels (names without the default
feature.node.kubernetes.io/ prefix) and removes the labels it had set that no NodeFeature carries
any more. Labels in kubernetes.io / k8s.io namespaces are refused, except their feature. and
profile. subdomains. Other sources (cpu, kernel, usb, ...), NodeFeatureRule, taints and extended
resources are not modelled.
"""

import glob
import os
import signal
import sys
import time

import kube
import yaml

NODE_NAME_LABEL = "nfd.node.kubernetes.io/node-name"
FEATURE_LABELS = "nfd.node.kubernetes.io/feature-labels"
DEFAULT_NS = "feature.node.kubernetes.io/"
FEATURES_D = "/etc/kubernetes/node-feature-discovery/features.d"
WORKER_CONF = "/etc/kubernetes/node-feature-discovery/nfd-worker.conf"
NODEFEATURES = ("nfd.k8s-sigs.io/v1alpha1", "nodefeatures")


def log(message):
    sys.stderr.write("I%s %s\n" % (time.strftime("%m%d %H:%M:%S", time.gmtime()), message))
    sys.stderr.flush()


def local_labels(folder=FEATURES_D):
    found = {}
    for path in sorted(glob.glob(os.path.join(folder, "*"))):
        if not os.path.isfile(path):
            continue
        with open(path) as handle:
            for line in handle:
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                key, _sep, value = line.partition("=")
                key = key if "/" in key else DEFAULT_NS + key
                found[key] = value if _sep else "true"
    return found


def worker_conf(path=WORKER_CONF):
    if not os.path.exists(path):
        return {}
    with open(path) as handle:
        return yaml.safe_load(handle) or {}


def pci_labels(conf, sysfs="/host-sys"):
    pci = ((conf.get("sources") or {}).get("pci") or {})
    classes = pci.get("deviceClassWhitelist") or ["03", "0b40", "12"]
    fields = pci.get("deviceLabelFields") or ["class", "vendor"]
    found = {}
    for device in sorted(glob.glob(os.path.join(sysfs, "bus", "pci", "devices", "*"))):
        attrs = {}
        for field in ("class", "vendor", "device", "subsystem_vendor", "subsystem_device"):
            try:
                with open(os.path.join(device, field)) as handle:
                    attrs[field] = handle.read().strip().replace("0x", "")
            except OSError:
                attrs[field] = ""
        attrs["class"] = attrs["class"][:4]
        if not any(attrs["class"].startswith(c) for c in classes):
            continue
        found[DEFAULT_NS + "pci-%s.present" % "_".join(attrs[f] for f in fields)] = "true"
    return found


def _exit_on_signals():
    # PID 1 of its container: without a handler SIGTERM would be ignored and every stop would
    # wait for the kill timeout.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: sys.exit(0))


def worker(_argv, environ):
    _exit_on_signals()
    node = environ["NODE_NAME"]
    namespace = environ.get("POD_NAMESPACE") or environ.get("KUBERNETES_NAMESPACE") or "node-feature-discovery"
    api = kube.Client.in_cluster()
    url = kube.path(NODEFEATURES[0], NODEFEATURES[1], namespace, node)
    while True:
        conf = worker_conf()
        interval = kube.duration_seconds((conf.get("core") or {}).get("sleepInterval") or "60s")
        found = pci_labels(conf)
        found.update(local_labels())
        body = {"apiVersion": NODEFEATURES[0], "kind": "NodeFeature",
                "metadata": {"name": node, "namespace": namespace, "labels": {NODE_NAME_LABEL: node}},
                "spec": {"labels": found}}
        try:
            current = api.get(url)
            if current is None:
                api.create(kube.path(NODEFEATURES[0], NODEFEATURES[1], namespace), body)
                log("created NodeFeature %s/%s (%d labels)" % (namespace, node, len(found)))
            elif current.get("spec", {}).get("labels") != found:
                body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                api.put(url, body)
                log("updated NodeFeature %s/%s (%d labels)" % (namespace, node, len(found)))
        except (kube.ApiError, OSError) as err:
            log("error: %s" % err)
        time.sleep(interval)


def allowed(key):
    prefix = key.split("/", 1)[0] if "/" in key else ""
    if prefix.endswith("kubernetes.io") or prefix.endswith("k8s.io"):
        return prefix.startswith("feature.") or prefix.startswith("profile.")
    return True


def desired_labels(features):
    """{node: labels} from NodeFeature objects (later objects, by name, win on conflicts)."""
    out = {}
    for feature in sorted(features, key=lambda f: (f["metadata"]["namespace"], f["metadata"]["name"])):
        node = (feature["metadata"].get("labels") or {}).get(NODE_NAME_LABEL)
        if node:
            labels = out.setdefault(node, {})
            labels.update((k, v) for k, v in ((feature.get("spec") or {}).get("labels") or {}).items() if allowed(k))
    return out


def node_patch(node, wanted):
    """The merge patch that brings a Node's NFD labels to ``wanted``, or None."""
    meta = node["metadata"]
    current = meta.get("labels") or {}
    managed = [n for n in ((meta.get("annotations") or {}).get(FEATURE_LABELS) or "").split(",") if n]
    managed = [n if "/" in n else DEFAULT_NS + n for n in managed]
    changes = dict((k, v) for k, v in wanted.items() if current.get(k) != v)
    changes.update((k, None) for k in managed if k not in wanted and k in current)
    annotation = ",".join(sorted(k[len(DEFAULT_NS):] if k.startswith(DEFAULT_NS) else k for k in wanted))
    if not changes and (meta.get("annotations") or {}).get(FEATURE_LABELS, "") == annotation:
        return None
    return {"metadata": {"labels": changes, "annotations": {FEATURE_LABELS: annotation or None}}}


def master(_argv, _environ):
    _exit_on_signals()
    api = kube.Client.in_cluster()
    while True:
        try:
            wanted = desired_labels(api.list(kube.path(*NODEFEATURES)))
            for node in api.list(kube.path("v1", "nodes")):
                patch = node_patch(node, wanted.get(node["metadata"]["name"], {}))
                if patch:
                    api.patch(kube.path("v1", "nodes", name=node["metadata"]["name"]), patch)
                    log("node %s: labels updated" % node["metadata"]["name"])
        except (kube.ApiError, OSError) as err:
            log("error: %s" % err)
        time.sleep(1)  # the real nfd-master watches; once a second is close enough here
