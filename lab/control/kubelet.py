# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's kubelet: a systemd service inside each node (kubelet.service).

It registers the Node, runs the pods bound to it as real containers through the node's
containerd (CRI over /run/containerd/containerd.sock), reports their status, serves their logs
(/containerLogs, which the API server proxies pods/log to), restarts crashing containers with
CrashLoopBackOff back-off, and runs a device manager: device plugins register on
/var/lib/kubelet/device-plugins/kubelet.sock (lab/control/plugin_api.py), their devices become
the Node's capacity (all) and allocatable (healthy), and containers that request them get what
the plugin's Allocate answers. Everything it reports comes from containerd, the plugin sockets
and the node's own files. lab/README.md lists what it does not model.

    kubelet.py --node-name gpu-p4 --kubeconfig /etc/kubernetes/kubelet.conf --port 10250
"""

import argparse
import base64
import http.server
import json
import os
import random
import socket
import sys
import threading
import time
import traceback
import urllib.parse

import grpc

import api_pb2 as pb
import api_pb2_grpc as pb_grpc
import kube
import plugin_api

CRI_ENDPOINT = "unix:///run/containerd/containerd.sock"
POD_ROOT = "/var/lib/kubelet/pods"
LOG_ROOT = "/var/log/pods"
CHECKPOINT = os.path.join(plugin_api.DEVICE_PLUGIN_DIR, "kubelet_internal_checkpoint")
CGROUP_PARENT = "kubepods.slice"  # what kubelet with cgroupDriver: systemd passes
BACKOFF_START, BACKOFF_MAX = 10.0, 300.0  # kubelet's container restart back-off
PLUGIN_GRACE_S = 300  # a stopped plugin's resource is kept this long (endpointStopGracePeriod)
SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
# The node's /sys is the test machine's, without the GPUs; their simulated PCI sysfs and DMI name
# are here (lab/lab.py), and hostPath volumes of /sys get it, as GFD and nfd-worker would read a GPU node's.
HOST_PATH_ALIASES = {"/sys": "/var/lib/nvidia-fake/sys"}
NATIVE_RESOURCES = ("cpu", "memory", "ephemeral-storage", "pods")


def log(message):
    sys.stderr.write("%s\n" % message)
    sys.stderr.flush()


def _rfc3339(nanoseconds):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(nanoseconds / 1e9)) if nanoseconds else None


def _rpc_error(err):
    return "rpc error: code = %s desc = %s" % (err.code().name.title().replace("_", ""), err.details())


def extended_requests(container):
    """{resource: count} of the extended resources a container asks for (limits imply requests)."""
    resources = container.get("resources") or {}
    wanted = dict(resources.get("limits") or {})
    wanted.update(resources.get("requests") or {})
    out = {}
    for name, value in wanted.items():
        if name in NATIVE_RESOURCES or name.startswith("hugepages-") or "/" not in name:
            continue
        out[name] = int(str(value))
    return out


# -- device manager ------------------------------------------------------------------------------


class AdmissionError(Exception):
    pass


class DeviceManager:
    """Registration server, one ListAndWatch stream per plugin, allocations with a checkpoint."""

    def __init__(self):
        self.lock = threading.Lock()
        self.resources = {}  # name -> {"endpoint", "devices": {id: health}, "stopped_at"}
        self.allocations = {}  # pod uid -> {container: {"devices": {res: [ids]}, "envs": {...}}}
        self._load_checkpoint()

    def _load_checkpoint(self):
        try:
            with open(CHECKPOINT) as handle:
                self.allocations = json.load(handle).get("allocations", {})
        except (OSError, ValueError):
            self.allocations = {}

    def _save_checkpoint(self):
        tmp = CHECKPOINT + ".tmp"
        with open(tmp, "w") as handle:
            json.dump({"allocations": self.allocations}, handle)
        os.replace(tmp, CHECKPOINT)

    def start(self):
        os.makedirs(plugin_api.DEVICE_PLUGIN_DIR, exist_ok=True)
        if os.path.exists(plugin_api.KUBELET_SOCKET):
            os.unlink(plugin_api.KUBELET_SOCKET)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(plugin_api.KUBELET_SOCKET)
        server.listen(16)
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def _accept(self, server):
        while True:
            conn, _addr = server.accept()
            threading.Thread(target=self._register, args=(plugin_api.Channel(conn),), daemon=True).start()

    def _register(self, channel):
        try:
            request = channel.receive() or {}
            name = request.get("resource_name", "")
            if request.get("method") != "Register":
                channel.send({"error": "unknown method %r" % request.get("method")})
            elif request.get("version") != plugin_api.VERSION:
                channel.send({"error": "Unsupported device plugin version %r" % request.get("version")})
            elif "/" not in name or name.split("/")[0].endswith("kubernetes.io"):
                channel.send({"error": "invalid extended resource name %r" % name})
            else:
                channel.send({})
                endpoint = os.path.join(plugin_api.DEVICE_PLUGIN_DIR, request["endpoint"])
                log("device plugin registered: %s at %s" % (name, endpoint))
                threading.Thread(target=self._list_and_watch, args=(name, endpoint), daemon=True).start()
        except (OSError, ValueError) as err:
            log("plugin registration failed: %s" % err)
        finally:
            channel.close()

    def _list_and_watch(self, name, endpoint):
        with self.lock:
            self.resources[name] = {"endpoint": endpoint, "devices": {}, "stopped_at": None}
        try:
            channel = plugin_api.Channel.connect(endpoint)
            channel.send({"method": "ListAndWatch"})
            while True:
                update = channel.receive()
                if update is None:
                    break
                with self.lock:
                    if self.resources.get(name, {}).get("endpoint") != endpoint:
                        return  # re-registered meanwhile
                    self.resources[name]["devices"] = dict((d["id"], d["health"]) for d in update["devices"])
        except (OSError, ValueError, KeyError) as err:
            log("ListAndWatch %s: %s" % (name, err))
        with self.lock:
            entry = self.resources.get(name)
            if entry and entry["endpoint"] == endpoint:
                # The plugin is gone: its devices stay in capacity but are no longer allocatable.
                entry["devices"] = dict((d, plugin_api.UNHEALTHY) for d in entry["devices"])
                entry["stopped_at"] = time.monotonic()
                log("device plugin %s stopped" % name)

    def capacity(self):
        """{resource: (capacity, allocatable)}; resources of plugins stopped past the grace period go."""
        out = {}
        with self.lock:
            for name, entry in list(self.resources.items()):
                if entry["stopped_at"] and time.monotonic() - entry["stopped_at"] > PLUGIN_GRACE_S:
                    del self.resources[name]
                    continue
                devices = entry["devices"]
                out[name] = (len(devices), sum(1 for h in devices.values() if h == plugin_api.HEALTHY))
        return out

    def allocate(self, uid, containers):
        """Devices and the plugin's Allocate answer for every container of a pod (at admission)."""
        with self.lock:
            if uid in self.allocations:
                return self.allocations[uid]
            used = set()
            for pod in self.allocations.values():
                for entry in pod.values():
                    for ids in entry["devices"].values():
                        used.update(ids)
            plan = {}
            for container in containers:
                for resource, count in extended_requests(container).items():
                    entry = self.resources.get(resource)
                    healthy = [] if entry is None else sorted(
                        d for d, h in entry["devices"].items() if h == plugin_api.HEALTHY and d not in used)
                    if entry is None or not any(h == plugin_api.HEALTHY for h in entry["devices"].values()):
                        raise AdmissionError("Allocate failed due to no healthy devices present; cannot allocate "
                                             "unhealthy devices %s, which is unexpected" % resource)
                    if count > len(healthy):
                        raise AdmissionError("Allocate failed due to requested number of devices unavailable for "
                                             "%s. Requested: %d, Available: %d, which is unexpected"
                                             % (resource, count, len(healthy)))
                    chosen = healthy[:count]
                    used.update(chosen)
                    plan.setdefault(container["name"], {})[resource] = (chosen, entry["endpoint"])
        result = {}
        for name, by_resource in plan.items():
            envs = {}
            for resource, (ids, endpoint) in by_resource.items():
                try:
                    answer = plugin_api.call(endpoint, {"method": "Allocate",
                                                        "container_requests": [{"devices_ids": ids}]})
                except (OSError, RuntimeError) as err:
                    raise AdmissionError("Allocate failed: rpc error: %s" % err)
                envs.update(answer["container_responses"][0].get("envs") or {})
            result[name] = {"devices": dict((r, ids) for r, (ids, _e) in by_resource.items()), "envs": envs}
        if result:
            with self.lock:
                self.allocations[uid] = result
                self._save_checkpoint()
        return result

    def release(self, uid):
        with self.lock:
            if self.allocations.pop(uid, None) is not None:
                self._save_checkpoint()


# -- pods ----------------------------------------------------------------------------------------


class Container:
    """One container of a pod as the kubelet tracks it (the latest attempt)."""

    def __init__(self, name):
        self.name = name
        self.id = None
        self.attempt = -1
        self.state = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state = {}
        self.image_id = ""
        self.backoff = 0.0
        self.retry_at = 0.0
        self.started = False
        self.exited_id = None  # the id of the attempt whose exit was handled
        self.last_exit = None  # its "terminated" state
        self.exited_ok = False
        self.log_paths = []  # of every attempt, oldest first


class PodState:
    def __init__(self, pod):
        meta = pod["metadata"]
        self.uid = meta["uid"]
        self.namespace = meta["namespace"]
        self.name = meta["name"]
        self.sandbox_id = None
        self.sandbox_attempt = -1
        self.sandbox_retry_at = 0.0
        self.sandbox_backoff = 0.0
        self.sandbox_stopped = False
        self.log_dir = os.path.join(LOG_ROOT, "%s_%s_%s" % (self.namespace, self.name, self.uid))
        self.containers = {}
        self.admitted = None
        self.rejected = None  # (reason, message) when admission failed
        self.phase = "Pending"
        self.start_time = kube.now()
        self.last_status = None
        self.events = {}  # (reason, message) -> when sent, to send a repeated event at most every 30 s

    def container(self, name):
        if name not in self.containers:
            self.containers[name] = Container(name)
        return self.containers[name]


class Kubelet:
    def __init__(self, node_name, kubeconfig, port, node_labels=None):
        self.node = node_name
        self.node_labels = dict(node_labels or {})
        self.kubeconfig = kubeconfig
        self.port = port
        self.api = kube.Client.from_kubeconfig(kubeconfig)
        self.status_api = kube.Client.from_kubeconfig(kubeconfig)
        channel = grpc.insecure_channel(CRI_ENDPOINT)
        self.runtime = pb_grpc.RuntimeServiceStub(channel)
        self.images = pb_grpc.ImageServiceStub(channel)
        self.devices = DeviceManager()
        self.pods = {}  # uid -> PodState
        self.lock = threading.Lock()
        self.ready_since = None
        self.ready = None
        self.runtime_error = "container runtime status check may not have completed yet"
        with open(self.api_ca()) as handle:
            self.ca_pem = handle.read()

    def api_ca(self):
        with open(self.kubeconfig) as handle:
            config = json.load(handle)
        return config["clusters"][0]["cluster"]["certificate-authority"]

    # -- events -------------------------------------------------------------------------------
    def event(self, state, pod, reason, message, warning=False, field_path=None):
        key = (reason, message)
        if time.monotonic() - state.events.get(key, -1e9) < 30:
            return
        state.events[key] = time.monotonic()
        self.api.event(pod, reason, message, "Warning" if warning else "Normal", "kubelet", self.node, field_path)

    # -- node -----------------------------------------------------------------------------------
    def register(self):
        labels = {"kubernetes.io/hostname": self.node, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                  "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64"}
        labels.update(self.node_labels)
        url = kube.path("v1", "nodes", name=self.node)
        if self.api.get(url) is None:
            self.api.create(kube.path("v1", "nodes"), {"apiVersion": "v1", "kind": "Node",
                                                       "metadata": {"name": self.node, "labels": labels}})
            log("registered node %s" % self.node)
        else:
            self.api.patch(url, {"metadata": {"labels": labels}})

    def node_status(self):
        try:
            status = self.runtime.Status(pb.StatusRequest(), timeout=5).status
            version = self.runtime.Version(pb.VersionRequest(), timeout=5)
            conditions = dict((c.type, c) for c in status.conditions)
            runtime_ready = conditions.get("RuntimeReady")
            if runtime_ready is None or not runtime_ready.status:
                self.runtime_error = "container runtime not ready: RuntimeReady=false reason:%s message:%s" % (
                    runtime_ready.reason if runtime_ready else "", runtime_ready.message if runtime_ready else "")
            else:
                self.runtime_error = None
            runtime_version = "%s://%s" % (version.runtime_name, version.runtime_version)
        except grpc.RpcError as err:
            self.runtime_error = "container runtime is down: %s" % _rpc_error(err)
            runtime_version = None
        ready = self.runtime_error is None
        stamp = kube.now()
        if ready != self.ready:
            self.ready, self.ready_since = ready, stamp
        meminfo = dict(line.split(":", 1) for line in open("/proc/meminfo"))
        disk = os.statvfs("/var/lib/kubelet")
        capacity = {"cpu": str(os.cpu_count()), "memory": meminfo["MemTotal"].split()[0] + "Ki", "pods": "110",
                    "ephemeral-storage": "%dKi" % (disk.f_blocks * disk.f_frsize // 1024),
                    "hugepages-1Gi": "0", "hugepages-2Mi": "0"}
        allocatable = dict(capacity)
        for name, (total, healthy) in self.devices.capacity().items():
            capacity[name], allocatable[name] = str(total), str(healthy)
        condition = {"type": "Ready", "status": "True" if ready else "False",
                     "reason": "KubeletReady" if ready else "KubeletNotReady",
                     "message": "kubelet is posting ready status" if ready else self.runtime_error,
                     "lastHeartbeatTime": stamp, "lastTransitionTime": self.ready_since}
        pressure = [{"type": kind, "status": "False", "reason": reason, "message": message,
                     "lastHeartbeatTime": stamp, "lastTransitionTime": self.started_at}
                    for kind, reason, message in (
                        ("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                        ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                        ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"))]
        os_release = dict(line.rstrip("\n").split("=", 1) for line in open("/etc/os-release") if "=" in line)
        info = {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "v1.31.0",
                "kubeProxyVersion": "v1.31.0", "kernelVersion": os.uname().release,
                "osImage": os_release.get("PRETTY_NAME", "").strip('"'),
                "machineID": open("/etc/machine-id").read().strip(),
                "bootID": open("/proc/sys/kernel/random/boot_id").read().strip()}
        if runtime_version:
            info["containerRuntimeVersion"] = runtime_version
        return {"capacity": capacity, "allocatable": allocatable, "conditions": pressure + [condition],
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": self.node}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}}, "nodeInfo": info}

    def status_loop(self):
        last, last_sent = None, 0.0
        while True:
            try:
                status = self.node_status()
                comparable = json.dumps([status["capacity"], status["allocatable"], status["nodeInfo"],
                                         [(c["type"], c["status"], c["message"]) for c in status["conditions"]]])
                if comparable != last or time.monotonic() - last_sent > 10:
                    self.status_api.patch(kube.path("v1", "nodes", name=self.node, sub="status"),
                                          {"status": status}, "strategic")
                    last, last_sent = comparable, time.monotonic()
            except (kube.ApiError, OSError) as err:
                log("node status: %s" % err)
            time.sleep(1)

    # -- pods -----------------------------------------------------------------------------------
    def sync_loop(self):
        self.recover()
        while True:
            try:
                self.sync_once()
            except (kube.ApiError, OSError) as err:
                log("sync: %s" % err)
            time.sleep(0.5)

    def recover(self):
        """After a kubelet restart: adopt the sandboxes and containers containerd still has."""
        try:
            sandboxes = self.runtime.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=10).items
            containers = self.runtime.ListContainers(pb.ListContainersRequest(), timeout=10).containers
        except grpc.RpcError as err:
            log("recover: %s" % _rpc_error(err))
            return
        for sandbox in sandboxes:
            uid = sandbox.labels.get("io.kubernetes.pod.uid")
            if not uid or sandbox.state != pb.SANDBOX_READY:
                continue
            state = PodState({"metadata": {"uid": uid, "namespace": sandbox.metadata.namespace,
                                           "name": sandbox.metadata.name}})
            state.sandbox_id, state.sandbox_attempt = sandbox.id, sandbox.metadata.attempt
            state.admitted = self.devices.allocations.get(uid, {})
            for item in sorted(containers, key=lambda c: c.metadata.attempt):
                if item.pod_sandbox_id == sandbox.id:
                    record = state.container(item.metadata.name)
                    record.id, record.attempt, record.started = item.id, item.metadata.attempt, True
            self.pods[uid] = state
            log("recovered pod %s/%s" % (state.namespace, state.name))

    def sync_once(self):
        pods = self.api.list(kube.path("v1", "pods"), field_selector="spec.nodeName=%s" % self.node)
        seen = set()
        for pod in pods:
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            with self.lock:
                state = self.pods.get(uid)
                if state is None:
                    state = self.pods[uid] = PodState(pod)
            if pod["metadata"].get("deletionTimestamp"):
                continue
            try:
                self.sync_pod(pod, state)
            except grpc.RpcError as err:
                log("pod %s/%s: %s" % (state.namespace, state.name, _rpc_error(err)))
            except Exception:  # pylint: disable=broad-except
                # One pod's surprise must not stop the others (the real kubelet has a worker per pod).
                log("pod %s/%s: %s" % (state.namespace, state.name, traceback.format_exc()))
            self.report(pod, state)
        for uid in [u for u in self.pods if u not in seen]:
            # As the kubelet's pod cleanup does: a pod gone from the API whose sandbox containerd could not
            # stop (containerd restarting, say) is tried again on the next pass, its devices held until then.
            if self.kill(self.pods[uid]):
                with self.lock:
                    del self.pods[uid]
                self.devices.release(uid)

    def kill(self, state):
        """Stop and remove the pod's sandbox; False when containerd refused (the pod is kept for a retry)."""
        if state.sandbox_id:
            try:
                self.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=state.sandbox_id), timeout=60)
                self.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=state.sandbox_id), timeout=60)
            except grpc.RpcError as err:
                log("kill %s/%s: %s" % (state.namespace, state.name, _rpc_error(err)))
                if err.code() != grpc.StatusCode.NOT_FOUND:
                    return False
        log("pod %s/%s removed" % (state.namespace, state.name))
        return True

    def admit(self, pod, state):
        spec = pod["spec"]
        try:
            state.admitted = self.devices.allocate(state.uid, spec.get("initContainers", []) + spec["containers"])
        except AdmissionError as err:
            state.rejected = ("UnexpectedAdmissionError", str(err))
            state.phase = "Failed"
            self.event(state, pod, "UnexpectedAdmissionError", str(err), warning=True)

    def sync_pod(self, pod, state):
        if state.admitted is None and state.rejected is None:
            self.admit(pod, state)
        if state.rejected or state.phase in ("Succeeded", "Failed"):
            self.devices.release(state.uid)  # a finished pod's devices go back to the pool
            if state.sandbox_id and not state.sandbox_stopped:
                # As kubelet does: the sandbox of a finished pod is stopped, its containers kept for logs.
                self.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=state.sandbox_id), timeout=60)
                state.sandbox_stopped = True
            return
        if not self.ensure_sandbox(pod, state):
            return
        spec = pod["spec"]
        policy = spec.get("restartPolicy", "Always")
        for container in spec.get("initContainers", []):
            record = state.container(container["name"])
            self.refresh(record)
            if record.exited_ok:
                continue
            self.step(pod, state, container, record, "Never" if policy == "Never" else "OnFailure")
            return  # init containers run one at a time, each to completion
        for container in spec["containers"]:
            record = state.container(container["name"])
            self.refresh(record)
            self.step(pod, state, container, record, policy)
        records = [state.container(c["name"]) for c in spec["containers"]]
        if all("terminated" in r.state for r in records):
            if policy == "Never" or (policy == "OnFailure" and all(r.exited_ok for r in records)):
                state.phase = "Succeeded" if all(r.exited_ok for r in records) else "Failed"
                return
        state.phase = "Running" if all(r.started for r in records) else "Pending"

    def ensure_sandbox(self, pod, state):
        if state.sandbox_id:
            try:
                status = self.runtime.PodSandboxStatus(
                    pb.PodSandboxStatusRequest(pod_sandbox_id=state.sandbox_id), timeout=10).status
                if status.state == pb.SANDBOX_READY:
                    return True
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.NOT_FOUND:
                    raise
            self.event(state, pod, "SandboxChanged", "Pod sandbox changed, it will be killed and re-created.")
            state.sandbox_id = None
        if time.monotonic() < state.sandbox_retry_at:
            return False
        spec = pod["spec"]
        handler = ""
        if spec.get("runtimeClassName"):
            runtime_class = self.api.get(kube.path("node.k8s.io/v1", "runtimeclasses", name=spec["runtimeClassName"]))
            if runtime_class is None:
                self._sandbox_failed(pod, state, 'runtimeclass.node.k8s.io "%s" not found' % spec["runtimeClassName"])
                return False
            handler = runtime_class["handler"]
        state.sandbox_attempt += 1
        os.makedirs(state.log_dir, exist_ok=True)
        config = self.sandbox_config(pod, state)
        try:
            state.sandbox_id = self.runtime.RunPodSandbox(
                pb.RunPodSandboxRequest(config=config, runtime_handler=handler), timeout=120).pod_sandbox_id
        except grpc.RpcError as err:
            self._sandbox_failed(pod, state, _rpc_error(err))
            return False
        state.sandbox_backoff = 0
        return True

    def _sandbox_failed(self, pod, state, message):
        backoff = min(max(state.sandbox_backoff * 2, 1.0), 30.0)
        state.sandbox_backoff = backoff
        state.sandbox_retry_at = time.monotonic() + backoff
        self.event(state, pod, "FailedCreatePodSandBox", "Failed to create pod sandbox: %s" % message, warning=True)

    def sandbox_config(self, pod, state):
        meta, spec = pod["metadata"], pod["spec"]
        # containerd refuses a privileged container in a sandbox that is not privileged itself
        privileged = any(((c.get("securityContext") or {}).get("privileged"))
                         for c in spec.get("initContainers", []) + spec["containers"])
        return pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=state.name, uid=state.uid, namespace=state.namespace,
                                           attempt=state.sandbox_attempt),
            log_directory=state.log_dir,
            labels={"io.kubernetes.pod.name": state.name, "io.kubernetes.pod.namespace": state.namespace,
                    "io.kubernetes.pod.uid": state.uid},
            annotations=dict((k, v) for k, v in (meta.get("annotations") or {}).items()),
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=CGROUP_PARENT,
                security_context=pb.LinuxSandboxSecurityContext(
                    # host network only: the lab has no CNI; a host-network pod gets no hostname of its own
                    namespace_options=pb.NamespaceOption(network=pb.NODE, pid=pb.CONTAINER, ipc=pb.POD),
                    privileged=privileged)))

    def refresh(self, record):
        """Read the container's state from containerd; an exit is handled once."""
        if not record.id or record.id == record.exited_id:
            return
        try:
            status = self.runtime.ContainerStatus(pb.ContainerStatusRequest(container_id=record.id), timeout=10).status
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.NOT_FOUND:
                raise
            self.exited(record, {"exitCode": 137, "reason": "ContainerStatusUnknown",
                                 "message": "The container could not be located when the pod was terminated"}, 0)
            return
        record.image_id = status.image_ref
        if not record.log_paths and status.log_path:
            record.log_paths.append(status.log_path)  # a container adopted after a kubelet restart
        if status.state == pb.CONTAINER_RUNNING:
            record.state = {"running": {"startedAt": _rfc3339(status.started_at)}}
        elif status.state == pb.CONTAINER_EXITED:
            terminated = {"exitCode": status.exit_code,
                          "reason": status.reason or ("Completed" if status.exit_code == 0 else "Error"),
                          "startedAt": _rfc3339(status.started_at), "finishedAt": _rfc3339(status.finished_at),
                          "containerID": "containerd://" + record.id}
            if status.message:
                terminated["message"] = status.message
            self.exited(record, terminated, (status.finished_at - status.started_at) / 1e9)

    @staticmethod
    def exited(record, terminated, ran_s):
        record.exited_id = record.id
        record.last_exit = terminated
        record.exited_ok = terminated["exitCode"] == 0
        record.state = {"terminated": terminated}
        if ran_s > 600:
            record.backoff = 0.0  # kubelet forgets the back-off after a long healthy run
        # The first restart is immediate, then 10 s, 20 s, ... up to 5 min.
        record.retry_at = time.monotonic() + record.backoff
        record.backoff = BACKOFF_START if not record.backoff else min(record.backoff * 2, BACKOFF_MAX)

    @staticmethod
    def hold(record, reason, message):
        """A container that cannot start yet (image, configuration, create error) waits and is
        retried under the same back-off as a crashing one."""
        record.state = {"waiting": {"reason": reason, "message": message}}
        record.retry_at = time.monotonic() + (record.backoff or 1.0)
        record.backoff = BACKOFF_START if not record.backoff else min(record.backoff * 2, BACKOFF_MAX)

    def step(self, pod, state, container, record, policy):
        """Start the container if it has never run, or restart it when its policy and back-off allow."""
        if record.id and record.id != record.exited_id:
            return  # running
        if not record.exited_id and "waiting" in record.state and time.monotonic() < record.retry_at:
            return  # held (image, configuration or create error)
        if record.exited_id:
            if policy == "Never" or (policy == "OnFailure" and record.exited_ok):
                return
            if time.monotonic() < record.retry_at:
                wait = max(int(round(record.retry_at - time.monotonic())), 1)
                record.last_state = {"terminated": record.last_exit}
                record.state = {"waiting": {"reason": "CrashLoopBackOff", "message": (
                    "back-off %ds restarting failed container=%s pod=%s_%s(%s)" % (
                        wait, record.name, state.name, state.namespace, state.uid))}}
                self.event(state, pod, "BackOff", "Back-off restarting failed container %s in pod %s_%s(%s)" % (
                    record.name, state.name, state.namespace, state.uid), warning=True,
                    field_path="spec.containers{%s}" % record.name)
                return
        self.start_container(pod, state, container, record)

    def start_container(self, pod, state, container, record):
        image = container["image"]
        field_path = "spec.containers{%s}" % container["name"]
        try:
            present = self.images.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=image)),
                                              timeout=10).image.id
        except grpc.RpcError as err:
            present = None
            log("ImageStatus %s: %s" % (image, _rpc_error(err)))
        if not present:
            message = ('Failed to pull image "%s": failed to pull and unpack image "%s": the lab has no registry '
                       '(only images imported into the node exist)' % (image, image))
            waiting = record.state.get("waiting", {}).get("reason")
            self.hold(record, "ImagePullBackOff" if waiting in ("ErrImagePull", "ImagePullBackOff") else "ErrImagePull",
                      message)
            self.event(state, pod, "Failed", message, warning=True, field_path=field_path)
            return
        self.event(state, pod, "Pulled", 'Container image "%s" already present on machine' % image,
                   field_path=field_path)
        try:
            config = self.container_config(pod, state, container, record.attempt + 1)
        except (kube.ApiError, OSError, ValueError) as err:
            self.hold(record, "CreateContainerConfigError", str(err))
            self.event(state, pod, "Failed", "Error: %s" % err, warning=True, field_path=field_path)
            return
        sandbox = self.sandbox_config(pod, state)
        if record.last_exit:
            record.last_state = {"terminated": record.last_exit}
        previous = record.id
        try:
            new_id = self.runtime.CreateContainer(pb.CreateContainerRequest(
                pod_sandbox_id=state.sandbox_id, config=config, sandbox_config=sandbox), timeout=60).container_id
        except grpc.RpcError as err:
            self.hold(record, "CreateContainerError", _rpc_error(err))
            self.event(state, pod, "Failed", "Error: %s" % _rpc_error(err), warning=True, field_path=field_path)
            return
        record.id, record.attempt = new_id, record.attempt + 1
        record.log_paths.append(os.path.join(state.log_dir, config.log_path))
        self.event(state, pod, "Created", "Created container %s" % container["name"], field_path=field_path)
        try:
            self.runtime.StartContainer(pb.StartContainerRequest(container_id=new_id), timeout=60)
        except grpc.RpcError as err:
            # As the real kubelet: the container is terminated with StartError and restarts under back-off.
            self.exited(record, {"exitCode": 128, "reason": "StartError", "message": err.details(),
                                 "containerID": "containerd://" + new_id}, 0)
            self.event(state, pod, "Failed", "Error: %s" % _rpc_error(err), warning=True, field_path=field_path)
        else:
            record.started = True
            record.state = {"running": {"startedAt": kube.now()}}
            self.event(state, pod, "Started", "Started container %s" % container["name"], field_path=field_path)
        if previous:
            self._remove_older(previous)

    def _remove_older(self, container_id):
        """The replaced attempt's container goes, as kubelet's container GC soon removes it; its log
        file stays (RemoveContainer leaves it), so logs --previous still works."""
        try:
            self.runtime.RemoveContainer(pb.RemoveContainerRequest(container_id=container_id), timeout=30)
        except grpc.RpcError as err:
            log("remove container %s: %s" % (container_id[:12], _rpc_error(err)))

    # -- container configuration -------------------------------------------------------------------
    def container_config(self, pod, state, container, attempt):
        spec = pod["spec"]
        envs = self.environment(pod, container)
        allocation = (state.admitted or {}).get(container["name"], {})
        envs.update(allocation.get("envs") or {})
        mounts = self.mounts(pod, state, container)
        security = container.get("securityContext") or {}
        capabilities = security.get("capabilities") or {}
        context = pb.LinuxContainerSecurityContext(
            privileged=bool(security.get("privileged")),
            capabilities=pb.Capability(add_capabilities=capabilities.get("add") or [],
                                       drop_capabilities=capabilities.get("drop") or []),
            no_new_privs=security.get("allowPrivilegeEscalation") is False,
            namespace_options=pb.NamespaceOption(network=pb.NODE, pid=pb.CONTAINER, ipc=pb.POD))
        user = security.get("runAsUser", (spec.get("securityContext") or {}).get("runAsUser"))
        if user is not None:
            context.run_as_user.value = int(user)
        return pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=container["name"], attempt=attempt),
            image=pb.ImageSpec(image=container["image"]),
            command=container.get("command") or [], args=container.get("args") or [],
            working_dir=container.get("workingDir", ""),
            envs=[pb.KeyValue(key=k, value=v.encode()) for k, v in envs.items()],
            mounts=mounts, log_path="%s/%d.log" % (container["name"], attempt),
            labels={"io.kubernetes.container.name": container["name"], "io.kubernetes.pod.uid": state.uid,
                    "io.kubernetes.pod.name": state.name, "io.kubernetes.pod.namespace": state.namespace},
            linux=pb.LinuxContainerConfig(security_context=context))

    def environment(self, pod, container):
        server = urllib.parse.urlsplit(self.api.server)
        envs = {"KUBERNETES_SERVICE_HOST": server.hostname, "KUBERNETES_SERVICE_PORT": str(server.port),
                "KUBERNETES_SERVICE_PORT_HTTPS": str(server.port)}
        namespace = pod["metadata"]["namespace"]
        for source in container.get("envFrom") or []:
            ref = source.get("configMapRef") or source.get("secretRef")
            data = self._config_data("configmaps" if "configMapRef" in source else "secrets", namespace, ref["name"],
                                     ref.get("optional"))
            for key, value in data.items():
                envs[source.get("prefix", "") + key] = value
        for item in container.get("env") or []:
            if "valueFrom" not in item:
                envs[item["name"]] = str(item.get("value", ""))
                continue
            source = item["valueFrom"]
            if "fieldRef" in source:
                envs[item["name"]] = self.field(pod, source["fieldRef"]["fieldPath"])
            elif "configMapKeyRef" in source or "secretKeyRef" in source:
                ref = source.get("configMapKeyRef") or source.get("secretKeyRef")
                data = self._config_data("configmaps" if "configMapKeyRef" in source else "secrets", namespace,
                                         ref["name"], ref.get("optional"))
                if ref["key"] in data:
                    envs[item["name"]] = data[ref["key"]]
                elif not ref.get("optional"):
                    kind = "ConfigMap" if "configMapKeyRef" in source else "Secret"
                    raise ValueError("couldn't find key %s in %s %s/%s" % (ref["key"], kind, namespace, ref["name"]))
        return envs

    def _config_data(self, resource, namespace, name, optional):
        obj = self.api.get(kube.path("v1", resource, namespace, name))
        if obj is None:
            if optional:
                return {}
            raise ValueError('%s "%s" not found' % ("configmap" if resource == "configmaps" else "secret", name))
        if resource == "secrets":
            return dict((k, base64.b64decode(v).decode()) for k, v in (obj.get("data") or {}).items())
        return dict(obj.get("data") or {})

    def field(self, pod, field_path):
        meta, spec = pod["metadata"], pod["spec"]
        simple = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"], "metadata.uid": meta["uid"],
                  "spec.nodeName": spec.get("nodeName", ""), "spec.serviceAccountName": spec.get(
                      "serviceAccountName", "default"), "status.hostIP": "127.0.0.1", "status.podIP": "127.0.0.1"}
        if field_path in simple:
            return simple[field_path]
        for prefix, values in (("metadata.labels", meta.get("labels")), ("metadata.annotations",
                                                                         meta.get("annotations"))):
            if field_path.startswith(prefix + "['") and field_path.endswith("']"):
                return (values or {}).get(field_path[len(prefix) + 2:-2], "")
        raise ValueError("unsupported fieldPath %r" % field_path)

    def mounts(self, pod, state, container):
        volumes = dict((v["name"], v) for v in pod["spec"].get("volumes") or [])
        mounts = []
        for mount in container.get("volumeMounts") or []:
            volume = volumes.get(mount["name"])
            if volume is None:
                raise ValueError('volume "%s" not found in the pod spec' % mount["name"])
            host = self.volume_path(pod, state, volume)
            if mount.get("subPath"):
                host = os.path.join(host, mount["subPath"])
            mounts.append(pb.Mount(container_path=mount["mountPath"], host_path=host,
                                   readonly=bool(mount.get("readOnly"))))
        if pod["spec"].get("automountServiceAccountToken", True) and container.get("automountServiceAccountToken",
                                                                                   True):
            if not any(m.container_path == SA_MOUNT for m in mounts):
                mounts.append(pb.Mount(container_path=SA_MOUNT, host_path=self.token_volume(pod, state),
                                       readonly=True))
        return mounts

    def volume_path(self, pod, state, volume):
        name = volume["name"]
        if "hostPath" in volume:
            path, kind = volume["hostPath"]["path"], volume["hostPath"].get("type", "")
            path = HOST_PATH_ALIASES.get(path.rstrip("/") or "/", path)
            if kind == "DirectoryOrCreate":
                os.makedirs(path, exist_ok=True)
            elif kind == "Directory" and not os.path.isdir(path):
                raise ValueError('MountVolume.SetUp failed for volume "%s" : hostPath type check failed: %s is not '
                                 'a directory' % (name, path))
            elif kind == "FileOrCreate" and not os.path.exists(path):
                open(path, "a").close()
            elif kind in ("File", "Socket", "CharDevice") and not os.path.exists(path):
                raise ValueError('MountVolume.SetUp failed for volume "%s" : hostPath type check failed: %s is not '
                                 'a %s' % (name, path, kind.lower()))
            return path
        base = os.path.join(POD_ROOT, state.uid, "volumes")
        if "emptyDir" in volume:
            path = os.path.join(base, "kubernetes.io~empty-dir", name)
            os.makedirs(path, exist_ok=True)
            return path
        for kind, resource, key in (("configMap", "configmaps", "name"), ("secret", "secrets", "secretName")):
            if kind in volume:
                source = volume[kind]
                try:
                    data = self._config_data(resource, state.namespace, source[key], source.get("optional"))
                except ValueError as err:
                    raise ValueError('MountVolume.SetUp failed for volume "%s" : %s' % (name, err))
                path = os.path.join(base, "kubernetes.io~%s" % kind.lower(), name)
                os.makedirs(path, exist_ok=True)
                items = source.get("items") or [{"key": k, "path": k} for k in data]
                for item in items:
                    if item["key"] in data:
                        target = os.path.join(path, item["path"])
                        os.makedirs(os.path.dirname(target), exist_ok=True)
                        with open(target, "w") as handle:
                            handle.write(data[item["key"]])
                return path
        raise ValueError('volume "%s": only hostPath, emptyDir, configMap and secret volumes are modelled' % name)

    def token_volume(self, pod, state):
        """The projected service-account volume: a bound token from TokenRequest, the CA, the namespace."""
        account = pod["spec"].get("serviceAccountName") or "default"
        url = kube.path("v1", "serviceaccounts", state.namespace, account, "token")
        try:
            answer = self.api.create(url, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                           "spec": {"expirationSeconds": 3607, "boundObjectRef": {
                                               "kind": "Pod", "apiVersion": "v1", "name": state.name,
                                               "uid": state.uid}}})
        except kube.ApiError as err:
            raise ValueError('MountVolume.SetUp failed for volume "kube-api-access" : failed to fetch token: %s'
                             % err.message)
        path = os.path.join(POD_ROOT, state.uid, "volumes", "kubernetes.io~projected", "kube-api-access")
        os.makedirs(path, exist_ok=True)
        for name, text in (("token", answer["status"]["token"]), ("ca.crt", self.ca_pem),
                           ("namespace", state.namespace)):
            with open(os.path.join(path, name), "w") as handle:
                handle.write(text)
        return path

    # -- status ---------------------------------------------------------------------------------
    def report(self, pod, state):
        spec = pod["spec"]
        statuses = []
        for container in spec["containers"]:
            record = state.container(container["name"])
            entry = {"name": record.name, "image": container["image"], "imageID": record.image_id,
                     "ready": "running" in record.state, "started": "running" in record.state,
                     "restartCount": max(record.attempt, 0), "state": record.state, "lastState": record.last_state}
            if record.id:
                entry["containerID"] = "containerd://" + record.id
            statuses.append(entry)
        ready = bool(statuses) and all(s["ready"] for s in statuses) and state.phase == "Running"
        stamp = kube.now()
        conditions = [c for c in (pod.get("status") or {}).get("conditions", []) if c["type"] == "PodScheduled"]
        for kind, value in (("PodReadyToStartContainers", state.sandbox_id is not None),
                            ("Initialized", all(state.container(c["name"]).exited_ok
                                                for c in spec.get("initContainers", []))),
                            ("ContainersReady", ready), ("Ready", ready)):
            conditions.append({"type": kind, "status": "True" if value else "False"})
        status = {"phase": state.phase, "conditions": conditions, "hostIP": "127.0.0.1",
                  "hostIPs": [{"ip": "127.0.0.1"}], "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
                  "startTime": state.start_time, "containerStatuses": statuses}
        if spec.get("initContainers"):
            status["initContainerStatuses"] = [
                {"name": c["name"], "image": c["image"], "ready": state.container(c["name"]).exited_ok,
                 "restartCount": max(state.container(c["name"]).attempt, 0),
                 "state": state.container(c["name"]).state} for c in spec["initContainers"]]
        if state.rejected:
            status = {"phase": "Failed", "reason": state.rejected[0], "message": state.rejected[1],
                      "conditions": conditions, "startTime": state.start_time}
        comparable = json.dumps(status, sort_keys=True)
        if comparable == state.last_status:
            return
        for condition in status["conditions"]:
            condition.setdefault("lastTransitionTime", stamp)
        try:
            self.api.patch(kube.path("v1", "pods", state.namespace, state.name, "status"), {"status": status})
            state.last_status = comparable
        except kube.ApiError as err:
            if err.code != 404:
                raise

    # -- logs -----------------------------------------------------------------------------------
    def container_log(self, namespace, name, container, query):
        """(HTTP code, text) for GET /containerLogs/NS/POD/CONTAINER."""
        with self.lock:
            state = next((s for s in self.pods.values() if s.namespace == namespace and s.name == name), None)
        if state is None or container not in state.containers:
            return 404, 'container "%s" in pod "%s" is not known to the kubelet' % (container, name)
        record = state.containers[container]
        paths = record.log_paths
        if query.get("previous", ["false"])[0] == "true":
            if len(paths) < 2:
                return 400, 'previous terminated container "%s" in pod "%s" not found' % (container, name)
            path = paths[-2]
        elif not paths:
            reason = record.state.get("waiting", {}).get("reason", "ContainerCreating")
            return 400, 'container "%s" in pod "%s" is waiting to start: %s' % (container, name, reason)
        else:
            path = paths[-1]
        lines = []
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                partial = ""
                for line in handle:
                    # CRI log format: TIMESTAMP STREAM P|F MESSAGE
                    parts = line.rstrip("\n").split(" ", 3)
                    if len(parts) < 4:
                        continue
                    partial += parts[3]
                    if parts[2] == "F":
                        lines.append(partial + "\n")
                        partial = ""
        except OSError:
            pass
        tail = query.get("tailLines", [None])[0]
        if tail is not None:
            lines = lines[-int(tail):] if int(tail) > 0 else []
        return 200, "".join(lines)

    def serve_logs(self):
        kubelet = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # pylint: disable=invalid-name
                url = urllib.parse.urlsplit(self.path)
                parts = url.path.strip("/").split("/")
                if len(parts) == 4 and parts[0] == "containerLogs":
                    code, text = kubelet.container_log(parts[1], parts[2], parts[3], urllib.parse.parse_qs(url.query))
                elif url.path == "/healthz":
                    code, text = 200, "ok"
                else:
                    code, text = 404, "404 page not found"
                body = text.encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()

    def run(self):
        self.started_at = kube.now()
        self.serve_logs()
        self.devices.start()
        while True:
            try:
                self.register()
                break
            except (kube.ApiError, OSError) as err:
                log("register: %s" % err)
                time.sleep(1 + random.random())
        threading.Thread(target=self.status_loop, daemon=True).start()
        log("kubelet %s: serving logs on 127.0.0.1:%d" % (self.node, self.port))
        self.sync_loop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--node-name", required=True)
    parser.add_argument("--kubeconfig", default="/etc/kubernetes/kubelet.conf")
    parser.add_argument("--port", type=int, default=10250)
    parser.add_argument("--node-labels", default="", help="k=v,... added to the Node at registration")
    args = parser.parse_args()
    labels = dict(item.split("=", 1) for item in args.node_labels.split(",") if item)
    Kubelet(args.node_name, args.kubeconfig, args.port, labels).run()


if __name__ == "__main__":
    main()
