# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's stand-in for NVIDIA's k8s-device-plugin v0.20.0 (`nvidia-device-plugin`).

It runs inside the plugin's real container (image nvcr.io/nvidia/k8s-device-plugin:v0.20.0 in the
lab) and finds GPUs the way the real plugin does: it loads libnvidia-ml.so.1 (through pynvml)
from inside the container, so it sees GPUs only when the container runtime injected them. It then
advertises what the real plugin would for the options it was given (flags, environment, config
file: MIG strategy, time-slicing/MPS replicas, renameByDefault), computed by the collection's own
rules (plugins/module_utils/gpu_labels.py ``plugin_devices``), serves one socket per resource in
/var/lib/kubelet/device-plugins and registers with the kubelet (lab/control/plugin_api.py).

Not modelled: health checks from XID events (every device is Healthy), CDI and the volume-mounts
list strategy, GetPreferredAllocation, MPS daemons, IMEX, SIGHUP reloads.
"""

import ctypes
import json
import os
import signal
import socket
import sys
import threading
import time

import gpu_labels
import nvml
import plugin_api
import pynvml
import yaml

START = time.time()
HINTS = ("If this is a GPU node, did you configure the NVIDIA Container Toolkit?",
         "You can check the prerequisites at: https://github.com/NVIDIA/k8s-device-plugin#prerequisites",
         "You can learn how to set the runtime at: https://github.com/NVIDIA/k8s-device-plugin#quick-start",
         "If this is not a GPU node, you should set up a toleration or nodeSelector to only deploy this plugin "
         "on GPU nodes")


def klog(level, where, message):
    """A line in klog's format, as the real plugin writes them."""
    stamp = time.time()
    when = time.strftime("%m%d %H:%M:%S", time.gmtime(stamp))
    sys.stderr.write("%s%s.%06d %7d %s] %s\n" % (level, when, int(stamp % 1 * 1e6), os.getpid(), where, message))
    sys.stderr.flush()


def _bool(value):
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def sharing_from_config(config):
    """The ``sharing`` section of a plugin/GFD config file in gpu_labels' form (None: no sharing)."""
    raw_sharing = config.get("sharing") or {}
    for strategy, key in (("mps", "mps"), ("time-slicing", "timeSlicing")):
        section = raw_sharing.get(key)
        if section and section.get("resources"):
            return {"strategy": strategy, "rename_by_default": bool(section.get("renameByDefault", False)),
                    "fail_requests_greater_than_one": bool(section.get("failRequestsGreaterThanOne", False)),
                    "resources": [{"name": r["name"], "replicas": r["replicas"]} for r in section["resources"]]}
    return None


def load_config(path):
    if not path:
        return {}
    with open(path) as handle:
        return yaml.safe_load(handle) or {}


def parse_flags(argv, booleans=()):
    """--key=value and --key value flags, and the boolean flags named in ``booleans`` alone (the
    real binaries use urfave/cli, which knows each flag's type)."""
    flags, pending = {}, None
    for arg in argv:
        if pending:
            flags[pending], pending = arg, None
        elif arg.startswith("--") and "=" in arg:
            key, value = arg[2:].split("=", 1)
            flags[key] = value
        elif arg[2:] in booleans:
            flags[arg[2:]] = "true"
        elif arg.startswith("--"):
            pending = arg[2:]
    return flags


def choose(flags, environ, flag, envs, from_file, default):
    """A setting's value: its flag, else the first of its environment variables, else the config file."""
    if flag in flags:
        return flags[flag]
    for env in envs:
        if env in environ:
            return environ[env]
    return default if from_file is None else from_file


def options(argv, environ):
    """Flags override the environment, which overrides the config file (as upstream documents)."""
    flags = parse_flags(argv, booleans=("fail-on-init-error", "pass-device-specs"))
    config_file = flags.get("config-file", environ.get("CONFIG_FILE"))
    config = load_config(config_file)
    file_flags = config.get("flags") or {}
    plugin_flags = file_flags.get("plugin") or {}

    def pick(flag, env, from_file, default):
        return choose(flags, environ, flag, (env,), from_file, default)

    sharing = sharing_from_config(config)
    return {
        "mig_strategy": pick("mig-strategy", "MIG_STRATEGY", file_flags.get("migStrategy"), "none"),
        "fail_on_init_error": _bool(pick("fail-on-init-error", "FAIL_ON_INIT_ERROR",
                                         file_flags.get("failOnInitError"), "true")),
        "device_id_strategy": pick("device-id-strategy", "DEVICE_ID_STRATEGY",
                                   plugin_flags.get("deviceIDStrategy"), "uuid"),
        "kubelet_socket": pick("kubelet-socket", "KUBELET_SOCKET", None, plugin_api.KUBELET_SOCKET),
        "sharing": sharing,
        "config_file": config_file,
    }


def load_nvml():
    """(facts, None) or (None, why NVML is unusable), with the reasons the real plugin logs."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        if err.value == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
            try:
                ctypes.CDLL("libnvidia-ml.so.1")
                detail = "libnvidia-ml.so.1: library loaded but NVML symbols are missing"
            except OSError as exc:
                detail = str(exc)
            return None, "could not load NVML library: %s" % detail
        return None, "failed to initialize NVML: %s" % err
    pynvml.nvmlShutdown()
    facts = nvml.nvml_facts(pynvml, {})
    if not facts["nvml_ok"]:
        return None, facts["error"]
    return facts, None


class Resource:
    """One advertised resource: its socket server and its kubelet registration."""

    def __init__(self, name, device_ids, opts):
        self.name = name
        self.devices = device_ids
        self.opts = opts
        self.endpoint = "nvidia-%s.sock" % name.split("/", 1)[1]
        self.path = os.path.join(os.path.dirname(opts["kubelet_socket"]), self.endpoint)
        self.server = None

    def serve(self):
        if os.path.exists(self.path):
            os.unlink(self.path)
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(16)
        klog("I", "server.go:195", "Starting GRPC server for '%s'" % self.name)
        klog("I", "server.go:139", "Starting to serve '%s' on %s" % (self.name, self.path))
        threading.Thread(target=self._accept, daemon=True).start()

    def register(self):
        plugin_api.call(self.opts["kubelet_socket"], {
            "method": "Register", "version": plugin_api.VERSION, "endpoint": self.endpoint,
            "resource_name": self.name, "options": {"get_preferred_allocation_available": False}})
        klog("I", "server.go:146", "Registered device plugin for '%s' with Kubelet" % self.name)

    def _accept(self):
        while True:
            try:
                conn, _addr = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve_one, args=(plugin_api.Channel(conn),), daemon=True).start()

    def _serve_one(self, channel):
        try:
            request = channel.receive()
            method = (request or {}).get("method")
            if method == "ListAndWatch":
                channel.send({"devices": [{"id": d, "health": plugin_api.HEALTHY} for d in self.devices]})
                channel.receive()  # held open until the kubelet goes away: nothing changes health here
            elif method == "GetDevicePluginOptions":
                channel.send({"options": {"get_preferred_allocation_available": False}})
            elif method == "Allocate":
                channel.send(self.allocate(request.get("container_requests") or []))
            else:
                channel.send({"error": "unknown method %r" % method})
        except (OSError, ValueError):
            pass
        finally:
            channel.close()

    def allocate(self, requests):
        responses = []
        for request in requests:
            ids = request.get("devices_ids") or []
            unknown = [i for i in ids if i not in self.devices]
            if unknown:
                return {"error": "invalid allocation request for '%s': unknown device: %s" % (self.name, unknown[0])}
            sharing = self.opts["sharing"] or {}
            if sharing.get("fail_requests_greater_than_one") and len(ids) > 1 and "::" in ids[0]:
                return {"error": "invalid request for sharing.%s: requested %d devices, only 1 allowed" % (
                    "timeSlicing" if sharing["strategy"] == "time-slicing" else "mps", len(ids))}
            physical = []
            for device_id in ids:
                base = device_id.split("::", 1)[0]
                if base not in physical:
                    physical.append(base)
            responses.append({"envs": {"NVIDIA_VISIBLE_DEVICES": ",".join(physical)}})
        return {"container_responses": responses}


def index_ids(devices, facts):
    """deviceIDStrategy index: full GPUs are named by their NVML index instead of their UUID."""
    by_uuid = dict((d["uuid"], str(d["index"])) for d in facts["devices"])
    renamed = {}
    for name, ids in devices.items():
        renamed[name] = []
        for device_id in ids:
            base, sep, replica = device_id.partition("::")
            renamed[name].append(by_uuid.get(base, base) + sep + replica)
    return renamed


def _wait_forever():
    while True:
        time.sleep(3600)


def _kubelet_socket_id(path):
    try:
        stat = os.stat(path)
        return (stat.st_ino, stat.st_ctime)
    except OSError:
        return None


def main(argv, environ):
    klog("I", "main.go:235", "Starting FS watcher.")
    klog("I", "main.go:242", "Starting OS watcher.")
    klog("I", "main.go:257", "Starting Plugins.")
    klog("I", "main.go:314", "Loading configuration.")
    try:
        opts = options(argv, environ)
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as err:
        klog("E", "main.go:132", "error starting plugins: unable to load config: %s" % err)
        return 1
    shown = {"flags": {"migStrategy": opts["mig_strategy"], "failOnInitError": opts["fail_on_init_error"],
                       "plugin": {"deviceIDStrategy": opts["device_id_strategy"], "deviceListStrategy": ["envvar"]}},
             "sharing": opts["sharing"] or {}}
    klog("I", "main.go:343", "\nRunning with config:\n%s" % json.dumps(shown, indent=2))
    klog("I", "main.go:346", "Retrieving plugins.")
    facts, why = load_nvml()
    if facts is None:
        if why.startswith("could not load NVML library"):
            klog("I", "factory.go:48", "Detected non-NVML platform: %s" % why)
            klog("I", "factory.go:48", "Detected non-Tegra platform: /sys/devices/soc0/family file not found")
            klog("E", "factory.go:112", "Incompatible strategy detected auto")
        else:
            klog("E", "factory.go:100", "Failed to initialize NVML: %s." % why)
        for hint in HINTS:
            klog("E", "factory.go:113", hint)
        if opts["fail_on_init_error"]:
            klog("E", "main.go:132", "error starting plugins: error creating plugin manager: unable to create "
                 "plugin manager: invalid device discovery strategy")
            return 1
        klog("I", "main.go:358", "No devices found. Waiting indefinitely.")
        _wait_forever()
    try:
        devices = gpu_labels.plugin_devices(facts, opts["mig_strategy"], opts["sharing"])
    except gpu_labels.LabelError as err:
        klog("E", "main.go:132", "error starting plugins: %s" % err)
        return 1
    if opts["device_id_strategy"] == "index":
        devices = index_ids(devices, facts)
    if not devices:
        klog("I", "main.go:358", "No devices found. Waiting indefinitely.")
        _wait_forever()
    resources = [Resource(name, ids, opts) for name, ids in sorted(devices.items())]

    def stop(signum, _frame):
        klog("I", "main.go:290", "Received signal \"%s\", shutting down." % signal.Signals(signum).name)
        for resource in resources:
            if os.path.exists(resource.path):
                os.unlink(resource.path)
        os._exit(0)  # pylint: disable=protected-access

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for resource in resources:
        resource.serve()
    registered = None
    while True:
        # Register again whenever kubelet.sock is re-created (a kubelet restart), as the real
        # plugin's fsnotify watcher does; retry every 30 s while the kubelet is not there.
        current = _kubelet_socket_id(opts["kubelet_socket"])
        if current is not None and current != registered:
            if registered is not None:
                klog("I", "main.go:269", "inotify: %s created, restarting." % opts["kubelet_socket"])
            try:
                for resource in resources:
                    resource.register()
                registered = current
            except (OSError, RuntimeError) as err:
                klog("E", "main.go:132", "Could not register device plugin: %s" % err)
                klog("I", "main.go:276", "Failed to start one or more plugins. Retrying in 30s...")
                time.sleep(30)
                continue
        time.sleep(1)
