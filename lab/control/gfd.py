# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's stand-in for GPU Feature Discovery v0.20.0 (`gpu-feature-discovery`).

It runs inside GFD's real container, reads NVML there (so it sees GPUs only through the nvidia
runtime), the PCI class from /sys and the machine type from the DMI file, computes the labels
with the collection's label engine (plugins/module_utils/gpu_labels.py, checked against GFD's
rules by the GFD cases) and writes them as GFD does: a NodeFeature object
``nvidia-features-for-<node>`` (NodeFeature API mode, the default since v0.19.0) or a
``key=value`` file in NFD's features.d. Nothing becomes a Node label without NFD.

Options (flag, then environment, then config file): --mig-strategy, --fail-on-init-error,
--oneshot, --no-timestamp, --sleep-interval, --output-file, --machine-type-file, --config-file,
--use-node-feature-api, and NODE_NAME, NAMESPACE, POD_NAME from the downward API.
"""

import os
import signal
import time

import device_plugin
import gpu_labels
import kube
import nvml
import pynvml

klog = device_plugin.klog
DEFAULT_OUTPUT = "/etc/kubernetes/node-feature-discovery/features.d/gfd"
NODE_NAME_LABEL = "nfd.node.kubernetes.io/node-name"


def options(argv, environ):
    flags = device_plugin.parse_flags(argv, booleans=("oneshot", "no-timestamp", "fail-on-init-error",
                                                      "use-node-feature-api"))
    config = device_plugin.load_config(flags.get("config-file") or environ.get("GFD_CONFIG_FILE")
                                       or environ.get("CONFIG_FILE"))
    file_flags = config.get("flags") or {}
    file_gfd = file_flags.get("gfd") or {}

    def pick(flag, envs, from_file, default):
        return device_plugin.choose(flags, environ, flag, envs, from_file, default)

    return {
        "mig_strategy": pick("mig-strategy", ("GFD_MIG_STRATEGY", "MIG_STRATEGY"), file_flags.get("migStrategy"),
                             "none"),
        "fail_on_init_error": device_plugin._bool(pick("fail-on-init-error", ("GFD_FAIL_ON_INIT_ERROR",
                                                                              "FAIL_ON_INIT_ERROR"),
                                                       file_flags.get("failOnInitError"), "true")),
        "oneshot": device_plugin._bool(pick("oneshot", ("GFD_ONESHOT",), file_gfd.get("oneshot"), "false")),
        "no_timestamp": device_plugin._bool(pick("no-timestamp", ("GFD_NO_TIMESTAMP",), file_gfd.get("noTimestamp"),
                                                 "false")),
        "sleep_interval": pick("sleep-interval", ("GFD_SLEEP_INTERVAL",), file_gfd.get("sleepInterval"), "60s"),
        "output_file": pick("output-file", ("GFD_OUTPUT_FILE",), file_gfd.get("outputFile"), DEFAULT_OUTPUT),
        "machine_type_file": pick("machine-type-file", ("GFD_MACHINE_TYPE_FILE",), file_gfd.get("machineTypeFile"),
                                  "/sys/class/dmi/id/product_name"),
        "use_node_feature_api": device_plugin._bool(pick("use-node-feature-api", (
            "GFD_USE_NODE_FEATURE_API", "USE_NODE_FEATURE_API"), file_flags.get("useNodeFeatureAPI"), "true")),
        "sharing": device_plugin.sharing_from_config(config),
        "node_name": environ.get("NODE_NAME"),
        "namespace": environ.get("NAMESPACE") or "default",
        "pod_name": environ.get("POD_NAME"),
    }


def labels(opts):
    facts = nvml.gather(sysfs_root="/sys", dmi_product_file=opts["machine_type_file"], lib=pynvml)
    if not facts["nvml_ok"]:
        raise RuntimeError("failed to initialize NVML: %s" % facts["error"])
    return gpu_labels.gfd_labels(facts, opts["mig_strategy"], opts["sharing"], timestamp=not opts["no_timestamp"])


def write_node_feature(api, opts, found):
    name = "nvidia-features-for-%s" % opts["node_name"]
    url = kube.path("nfd.k8s-sigs.io/v1alpha1", "nodefeatures", opts["namespace"], name)
    body = {"apiVersion": "nfd.k8s-sigs.io/v1alpha1", "kind": "NodeFeature",
            "metadata": {"name": name, "namespace": opts["namespace"],
                         "labels": {NODE_NAME_LABEL: opts["node_name"]}},
            "spec": {"labels": found}}
    if opts["pod_name"]:
        pod = api.get(kube.path("v1", "pods", opts["namespace"], opts["pod_name"]))
        if pod is not None:
            body["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"],
                                                    "uid": pod["metadata"]["uid"]}]
    current = api.get(url)
    if current is None:
        klog("I", "output.go:149", "Creating NodeFeature object %s" % name)
        api.create(kube.path("nfd.k8s-sigs.io/v1alpha1", "nodefeatures", opts["namespace"]), body)
    else:
        klog("I", "output.go:160", "Updating NodeFeature object %s" % name)
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        api.put(url, body)


def write_file(path, found):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = os.path.join(os.path.dirname(path), ".gfd-tmp")
    with open(tmp, "w") as handle:
        handle.write("".join("%s=%s\n" % item for item in sorted(found.items())))
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    klog("I", "output.go:82", "Writing labels to output file %s" % path)


def main(argv, environ):
    klog("I", "main.go:163", "Starting OS watcher.")
    klog("I", "main.go:168", "Loading configuration.")
    try:
        opts = options(argv, environ)
        interval = kube.duration_seconds(opts["sleep_interval"])
    except (OSError, ValueError) as err:
        klog("E", "main.go:100", "error: unable to load config: %s" % err)
        return 1
    api = None
    if opts["use_node_feature_api"]:
        if not opts["node_name"]:
            klog("E", "main.go:100", "error: required flag node-name not set")
            return 1
        api = kube.Client.in_cluster()
    klog("I", "main.go:204", "Start running")
    wrote_file = False

    def stop(_signum, _frame):
        # A long-running GFD that writes a file removes it on exit, so NFD drops the labels.
        if wrote_file and not opts["oneshot"] and interval is not None and os.path.exists(opts["output_file"]):
            os.unlink(opts["output_file"])
        klog("I", "main.go:221", "Exiting")
        os._exit(0)  # pylint: disable=protected-access

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while True:
        klog("I", "main.go:230", "Creating Labels")
        try:
            found = labels(opts)
        except (RuntimeError, gpu_labels.LabelError) as err:
            if opts["fail_on_init_error"]:
                klog("E", "main.go:100", "error: unable to create labeler: %s" % err)
                return 1
            klog("W", "main.go:236", "%s; labelling nothing" % err)
            found = {}
        if api is not None:
            try:
                write_node_feature(api, opts, found)
            except (kube.ApiError, OSError) as err:
                klog("E", "main.go:100", "error: failed to write labels: %s" % err)
                return 1
        else:
            write_file(opts["output_file"], found)
            wrote_file = True
        if opts["oneshot"]:
            return 0
        if interval is None:
            klog("I", "main.go:255", "Sleeping indefinitely")
            while True:
                time.sleep(3600)
        klog("I", "main.go:258", "Sleeping for %ss" % int(interval))
        time.sleep(interval)
