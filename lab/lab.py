# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab: GPU nodes in podman (see lab/README.md).

    python lab/lab.py up [--nodes gpu-p4,gpu-h100]   build/use the cached images, start the nodes,
                                                     the API emulator, write inventory + kubeconfig
                                                     (gpu-p4-v3, on containerd 2.x, only when named)
    python lab/lab.py down                           remove everything, check that nothing is left
    python lab/lab.py env                            print the exports for Ansible and kubectl

Run it with the project's .venv python (the API emulator needs `cryptography`); `make lab-up`,
`make lab-down` and `make lab-env` do. Tests use the ``Lab`` class (tests/integration/conftest.py).
Everything lives under .cache/lab/ (``$LAB_CACHE``); run state under .cache/lab/run/.
"""

import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

LAB_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(LAB_DIR)
TESTS = os.path.join(ROOT, "tests")
PREFIX = "gpuready-lab-"
GPU_IMAGE = "localhost/gpuready-lab-gpunode:bookworm"
GFD_CASES = os.path.join(TESTS, "fixtures", "gfd", "gfd_label_cases.public.json")
# Kubernetes Node name -> GFD label case, Ansible inventory name, Ansible user (None: root),
# what a kubelet would report as capacity, and optionally: "containerd" ("1.6", Debian's, the
# default; "2": the 2.x binaries bind-mounted over it, with the config version 3 seed) and
# "default" (False: started only when asked for, `up --nodes ...` or ``Lab(nodes=[...])``).
NODES = {
    "gpu-p4": {"case": "seed-4x-tesla-p4-driver-535", "inventory": "p4.lab.internal", "user": None,
               "cpu": "32", "memory": "263844260Ki"},
    "gpu-h100": {"case": "dgx-h100-8x-h100-mig-capable-single", "inventory": "h100.lab.internal", "user": "ops",
                 "cpu": "224", "memory": "2113645304Ki"},
    "gpu-p4-v3": {"case": "seed-4x-tesla-p4-driver-535", "inventory": "p4-v3.lab.internal", "user": None,
                  "cpu": "32", "memory": "263844260Ki", "containerd": "2", "default": False},
}
DEFAULT_NODES = [name for name, spec in NODES.items() if spec.get("default", True)]
# The containerd 2.x node: these binaries replace Debian's 1.6 ones (read-only bind mounts), and
# this seed replaces /etc/containerd/config.toml.
CONTAINERD_2_BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr")
CONTAINERD_SEEDS = {"1.6": None, "2": os.path.join(LAB_DIR, "node", "containerd-seed-v3.toml")}
NVIDIA_MAJOR, UVM_MAJOR = 195, 508  # nvidia-uvm's major is dynamic on a real node
CRI = ["env", "PYTHONPATH=/opt/lab/pylib", "python3", "/opt/lab/cri.py"]


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def log(message):
    sys.stderr.write("==> [lab %s] %s\n" % (time.strftime("%H:%M:%S"), message))
    sys.stderr.flush()


class LabError(RuntimeError):
    pass


class Lab:
    """``Lab(emulator=None).up()`` / ``.down()``. With ``emulator`` (a running
    k8s_emulator.client.Emulator) the nodes are registered there; without, the lab starts its own
    emulator in the background (pid file .cache/lab/run/k8s-api.pid)."""

    def __init__(self, cache=None, emulator=None, nodes=None, prefix=PREFIX, run_dir=None):
        self.cache = os.path.abspath(cache or os.environ.get("LAB_CACHE") or os.path.join(ROOT, ".cache", "lab"))
        self.prefix = prefix
        self.run_dir = run_dir or os.path.join(self.cache, "run")
        self.state_path = os.path.join(self.run_dir, "state.json")
        self.emulator = emulator
        self.names = list(nodes or DEFAULT_NODES)
        unknown = [name for name in self.names if name not in NODES]
        if unknown:
            raise LabError("unknown node(s) %s; known: %s" % (", ".join(unknown), ", ".join(NODES)))
        self.timings = {}
        self.env = dict(os.environ, LAB_CACHE=self.cache,
                        CONTAINERS_CONF=os.path.join(self.cache, "etc", "containers.conf"),
                        CONTAINERS_STORAGE_CONF=os.path.join(self.cache, "etc", "storage.conf"))

    # -- helpers ---------------------------------------------------------------------------
    def podman(self, *args, check=True, stdin=None):
        proc = subprocess.run(["podman"] + list(args), env=self.env, input=stdin, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, check=False)
        if check and proc.returncode != 0:
            raise LabError("podman %s: exit %d: %s" % (" ".join(args), proc.returncode, proc.stderr.strip()))
        return proc.stdout

    def node_exec(self, container, *args, check=True):
        return self.podman("exec", container, *args, check=check)

    def container(self, name):
        return self.prefix + name

    def containerd_2_dir(self):
        """Where the containerd 2.x binaries are: the folder of $GPUREADY_CONTAINERD_2 (tools/test-env.sh),
        else .cache/containerd/2/usr/bin next to the lab's cache (tools/bootstrap.sh puts them there)."""
        binary = os.environ.get("GPUREADY_CONTAINERD_2")
        if binary:
            folder = os.path.realpath(os.path.dirname(binary))
        else:
            folder = os.path.realpath(os.path.join(os.path.dirname(self.cache), "containerd", "2", "usr", "bin"))
        missing = [name for name in CONTAINERD_2_BINARIES if not os.access(os.path.join(folder, name), os.X_OK)]
        if missing:
            raise LabError("containerd 2.x: no %s in %s (make bootstrap downloads them)" % (", ".join(missing), folder))
        return folder

    def _wait(self, what, predicate, timeout=60, interval=0.2):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(interval)
        raise LabError("timed out after %ss waiting for %s" % (timeout, what))

    # -- up --------------------------------------------------------------------------------
    def up(self):
        t_start = time.monotonic()
        if any(NODES[name].get("containerd") == "2" for name in self.names):
            self.containerd_2_dir()  # fail before anything starts
        build = subprocess.run(["bash", os.path.join(LAB_DIR, "build-image.sh")], env=self.env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, check=False)
        if build.returncode != 0:
            raise LabError("build-image.sh failed:\n" + build.stdout[-4000:])
        self.timings["build_image_s"] = round(time.monotonic() - t_start, 1)
        self._remove_nodes()
        os.makedirs(self.run_dir, exist_ok=True)
        state = {"nodes": {}, "own_emulator": self.emulator is None}
        if self.emulator is None:
            client = _load("lab_k8s_emulator_client", os.path.join(TESTS, "k8s_emulator", "client.py"))
            self.emulator = client.Emulator.start(os.path.join(self.run_dir, "k8s-api"), python=sys.executable)
            with open(os.path.join(self.run_dir, "k8s-api.pid"), "w") as handle:
                handle.write("%d\n" % self.emulator.process.pid)
            state["emulator_pid"] = self.emulator.process.pid
        harness = _load("lab_fake_nvml_harness", os.path.join(TESTS, "fake_nvml", "harness.py"))
        with open(GFD_CASES) as handle:
            cases = dict((case["name"], case) for case in json.load(handle))
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="gpuready-lab-") as tmp:
            for name in self.names:
                state["nodes"][name] = self._create_node(name, cases[NODES[name]["case"]], harness, tmp)
        for name in self.names:
            self._wait_node(name)
        self.timings["nodes_s"] = round(time.monotonic() - t0, 1)
        for name in self.names:
            self._register(name)
        state["kubeconfig"] = os.path.join(self.run_dir, "kubeconfig")
        shutil.copyfile(self.emulator.kubeconfig(), state["kubeconfig"])
        state["inventory"] = self._write_inventory()
        state["emulator_url"] = self.emulator.url
        with open(self.state_path, "w") as handle:
            json.dump(state, handle, indent=1)
        self.timings["up_s"] = round(time.monotonic() - t_start, 1)
        log("up: %s" % self.timings)
        return state

    def _node_tree(self, name, case, harness, tmp):
        """What a driver install puts on this node: inventory, sysfs, device nodes (tmpfiles)."""
        fake = harness.node_from_case(case, os.path.join(tmp, name + "-fake"))
        tree = os.path.join(tmp, name)
        os.makedirs(os.path.join(tree, "etc", "nvidia-fake"))
        os.makedirs(os.path.join(tree, "etc", "tmpfiles.d"))
        os.makedirs(os.path.join(tree, "etc", "containerd"))
        os.makedirs(os.path.join(tree, "var", "lib", "nvidia-fake"))
        os.makedirs(os.path.join(tree, "usr", "local", "sbin"))
        shutil.copy(os.path.join(LAB_DIR, "node", "lab-init.sh"), os.path.join(tree, "usr", "local", "sbin", "lab-init"))
        shutil.copyfile(fake["config"], os.path.join(tree, "etc", "nvidia-fake", "gpus.json"))
        shutil.copytree(fake["sysfs_root"], os.path.join(tree, "var", "lib", "nvidia-fake", "sys"))
        if os.path.exists(fake["dmi_product_file"]):
            shutil.copyfile(fake["dmi_product_file"], os.path.join(tree, "var", "lib", "nvidia-fake", "product_name"))
        with open(fake["config"]) as handle:
            count = len(json.load(handle)["devices"])
        lines = ["# Written by lab/lab.py: the device nodes the NVIDIA driver (nvidia-modprobe/udev) would",
                 "# create. They only need to exist; nothing behind them answers.",
                 "c! /dev/nvidiactl 0666 root root - %d:255" % NVIDIA_MAJOR,
                 "c! /dev/nvidia-uvm 0666 root root - %d:0" % UVM_MAJOR,
                 "c! /dev/nvidia-uvm-tools 0666 root root - %d:1" % UVM_MAJOR]
        lines += ["c! /dev/nvidia%d 0666 root root - %d:%d" % (i, NVIDIA_MAJOR, i) for i in range(count)]
        with open(os.path.join(tree, "etc", "tmpfiles.d", "nvidia-fake-devices.conf"), "w") as handle:
            handle.write("\n".join(lines) + "\n")
        return tree, count

    def _create_node(self, name, case, harness, tmp):
        container = self.container(name)
        series = NODES[name].get("containerd", "1.6")
        tree, count = self._node_tree(name, case, harness, tmp)
        mounts = []
        if series == "2":
            # Bind mounts, not an image layer: nothing to build or cache (80 MB of binaries), and the
            # node runs exactly the binaries the tests' GPUREADY_CONTAINERD_2 names.
            folder = self.containerd_2_dir()
            for binary in CONTAINERD_2_BINARIES:
                mounts += ["-v", "%s:/usr/bin/%s:ro" % (os.path.join(folder, binary), binary)]
        if CONTAINERD_SEEDS[series]:
            shutil.copyfile(CONTAINERD_SEEDS[series], os.path.join(tree, "etc", "containerd", "config.toml"))
        self.podman("volume", "create", container + "-containerd")
        create = ["create", "--name", container, "--hostname", name, "--privileged",
                  "--systemd=always", "--cgroupns=private", "--network", "host",
                  "--label", "gpuready.lab=1", "-v", container + "-containerd:/var/lib/containerd",
                  "-v", os.path.join(self.cache, "artifacts") + ":/opt/lab:ro"]
        cid = self.podman(*(create + mounts + [GPU_IMAGE, "/usr/local/sbin/lab-init"])).strip()
        self.podman("cp", tree + "/.", container + ":/")
        self.podman("start", container)
        log("node %s: container %s (%s), %d fake GPUs, containerd %s" % (name, container, cid[:12], count, series))
        return {"container": container, "id": cid, "gpus": count, "case": case["name"], "containerd": series}

    def _wait_node(self, name):
        container = self.container(name)

        def booted():
            state = self.node_exec(container, "systemctl", "is-system-running", check=False).strip()
            return state in ("running", "degraded")

        def cri_ok():
            out = self.node_exec(container, "ctr", "plugins", "ls", check=False)
            return re.search(r"io\.containerd\.grpc\.v1 +cri +.* ok", out) is not None

        self._wait("%s to boot" % name, booted)
        self._wait("containerd's CRI plugin in %s" % name, cri_ok)
        for archive in ("pause.oci.tar", "workload.oci.tar"):
            self.node_exec(container, "ctr", "-n", "k8s.io", "images", "import", "/opt/lab/" + archive)

    def _register(self, name):
        """Create the Node as a kubelet registers it: Ready, capacity, no nvidia.com/gpu."""
        spec = NODES[name]
        version = self.node_exec(self.container(name), "containerd", "--version").split()
        resources = {"cpu": spec["cpu"], "memory": spec["memory"], "pods": "110",
                     "ephemeral-storage": "102400000Ki", "hugepages-1Gi": "0", "hugepages-2Mi": "0"}
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        conditions = [{"type": kind, "status": "False", "reason": reason, "lastHeartbeatTime": now,
                       "lastTransitionTime": now, "message": "kubelet has sufficient resources"}
                      for kind, reason in (("MemoryPressure", "KubeletHasSufficientMemory"),
                                           ("DiskPressure", "KubeletHasNoDiskPressure"),
                                           ("PIDPressure", "KubeletHasSufficientPID"))]
        conditions.append({"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now,
                           "lastTransitionTime": now, "message": "kubelet is posting ready status"})
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {
                    "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                    "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64"}},
                "spec": {}}
        if self.emulator.exists("v1", "Node", name):
            self.emulator.delete("v1", "Node", name)
        self.emulator.create(node)
        status = {"capacity": resources, "allocatable": dict(resources), "conditions": conditions,
                  "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
                  "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux",
                               "osImage": "Debian GNU/Linux 12 (bookworm)", "kubeletVersion": "v1.31.0",
                               "kubeProxyVersion": "v1.31.0",
                               "containerRuntimeVersion": "containerd://" + version[2].lstrip("v")}}
        self.emulator.patch("v1", "Node", name, {"status": status}, subresource="status")

    def _write_inventory(self):
        path = os.path.join(self.run_dir, "inventory.yml")
        lines = ["# Written by lab/lab.py up. The podman connection needs the lab's podman configuration:",
                 "# eval \"$(make -s lab-env)\" exports CONTAINERS_CONF and CONTAINERS_STORAGE_CONF.",
                 "all:", "  children:", "    gpu_nodes:", "      hosts:"]
        for name in self.names:
            spec = NODES[name]
            lines += ["        %s:" % spec["inventory"],
                      "          ansible_connection: containers.podman.podman",
                      "          ansible_host: %s" % self.container(name),
                      "          ansible_python_interpreter: /usr/bin/python3",
                      "          k8s_node_name: %s" % name]
            if spec["user"]:
                lines += ["          ansible_user: %s" % spec["user"], "          ansible_become: true"]
        with open(path, "w") as handle:
            handle.write("\n".join(lines) + "\n")
        return path

    # -- down ------------------------------------------------------------------------------
    def _lab_containers(self):
        out = self.podman("ps", "-a", "--filter", "name=^" + self.prefix, "--format", "{{.ID}} {{.Names}}", check=False)
        return [line.split() for line in out.splitlines() if line.strip()]

    def _lab_volumes(self):
        out = self.podman("volume", "ls", "--format", "{{.Name}}", check=False)
        return [v for v in out.split() if v.startswith(self.prefix)]

    def _remove_nodes(self):
        found = []
        for cid, name in self._lab_containers():
            pid = self.podman("inspect", "--format", "{{.State.Pid}}", cid, check=False).strip()
            try:
                pidns = os.readlink("/proc/%s/ns/pid" % pid) if pid not in ("", "0") else None
            except OSError:
                pidns = None
            found.append((cid, name, pidns))
            self.podman("stop", "-t", "30", cid, check=False)
            self.podman("rm", "-f", cid, check=False)
        for volume in self._lab_volumes():
            self.podman("volume", "rm", "-f", volume, check=False)
        return found

    def down(self, wait_s=15):
        """Remove nodes, volumes, Node objects and the lab's own emulator; returns the problems left."""
        t0 = time.monotonic()
        zombies_before = _zombie_conmons()
        state = {}
        if os.path.exists(self.state_path):
            with open(self.state_path) as handle:
                state = json.load(handle)
        if self.emulator is not None:
            for name in state.get("nodes", self.names):
                if self.emulator.exists("v1", "Node", name):
                    self.emulator.delete("v1", "Node", name)
        if not os.path.exists(os.path.join(self.cache, "etc", "containers.conf")):
            removed = []
        else:
            removed = self._remove_nodes()
        pid_file = os.path.join(self.run_dir, "k8s-api.pid")
        emulator_pid = None
        if os.path.exists(pid_file):
            with open(pid_file) as handle:
                emulator_pid = int(handle.read().strip())
            if _alive(emulator_pid) and _is_emulator(emulator_pid):
                os.kill(emulator_pid, signal.SIGTERM)
            process = getattr(self.emulator, "process", None)
            if process is not None and process.pid == emulator_pid:
                process.wait(10)  # started by this process: reap it
        problems = []
        deadline = time.monotonic() + wait_s
        while True:
            problems = []
            if removed or os.path.exists(os.path.join(self.cache, "etc", "containers.conf")):
                problems += ["container %s left" % " ".join(c) for c in self._lab_containers()]
                problems += ["volume %s left" % v for v in self._lab_volumes()]
            for cid, name, pidns in removed:
                if pidns:
                    left = [p for p in _pids() if _readlink("/proc/%s/ns/pid" % p) == pidns]
                    if left:
                        problems.append("%s: processes left in its PID namespace: %s" % (name, left))
                conmons = [line for line in _ps("pid=,args=") if "conmon" in line and cid in line]
                if conmons:
                    problems.append("%s: conmon left: %s" % (name, conmons))
            new_zombies = sorted(set(_zombie_conmons()) - set(zombies_before))
            if new_zombies:
                problems.append("defunct conmon(s) left: %s" % new_zombies)
            if emulator_pid and _alive(emulator_pid) and _is_emulator(emulator_pid):
                problems.append("API emulator (pid %d) still running" % emulator_pid)
            if not problems or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        if not problems:
            for path in (self.state_path, pid_file, os.path.join(self.run_dir, "inventory.yml"),
                         os.path.join(self.run_dir, "kubeconfig")):
                if os.path.exists(path):
                    os.unlink(path)
            shutil.rmtree(os.path.join(self.run_dir, "k8s-api"), ignore_errors=True)
        self.timings["down_s"] = round(time.monotonic() - t0, 1)
        left = "; LEFT: " + "; ".join(problems) if problems else ""
        log("down: %d node(s) removed in %ss%s" % (len(removed), self.timings["down_s"], left))
        return problems

    def exports(self):
        with open(self.state_path) as handle:
            state = json.load(handle)
        nodes = " ".join("%s=%s" % (name, info["container"]) for name, info in state["nodes"].items())
        return {"KUBECONFIG": state["kubeconfig"], "GPUREADY_LAB_INVENTORY": state["inventory"],
                "GPUREADY_LAB_NODES": nodes, "CONTAINERS_CONF": self.env["CONTAINERS_CONF"],
                "CONTAINERS_STORAGE_CONF": self.env["CONTAINERS_STORAGE_CONF"]}


def _ps(fields):
    return subprocess.run(["ps", "-eo", fields], stdout=subprocess.PIPE, universal_newlines=True,
                          check=False).stdout.splitlines()


def _zombie_conmons():
    out = []
    for line in _ps("pid=,stat=,comm="):
        parts = line.split()
        if len(parts) == 3 and parts[1].startswith("Z") and parts[2] == "conmon":
            out.append(parts[0])
    return out


def _pids():
    return [p for p in os.listdir("/proc") if p.isdigit()]


def _readlink(path):
    try:
        return os.readlink(path)
    except OSError:
        return None


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _is_emulator(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return b"k8s_emulator" in handle.read()
    except OSError:
        return False


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("up", "down", "env"))
    parser.add_argument("--nodes", default=",".join(DEFAULT_NODES),
                        help="comma-separated, of: %s (default: %s)" % (", ".join(NODES), ",".join(DEFAULT_NODES)))
    args = parser.parse_args()
    try:
        lab = Lab(nodes=[n for n in args.nodes.split(",") if n])
    except LabError as err:
        log(str(err))
        return 1
    if args.what == "up":
        try:
            lab.up()
        except LabError as err:
            log("up failed: %s" % err)
            return 1
        for key, value in lab.exports().items():
            print("export %s=%s" % (key, _quote(value)))
        return 0
    if args.what == "down":
        return 1 if lab.down() else 0
    if not os.path.exists(lab.state_path):
        log("no lab is up (%s is missing)" % lab.state_path)
        return 1
    for key, value in lab.exports().items():
        print("export %s=%s" % (key, _quote(value)))
    return 0


def _quote(value):
    return "'%s'" % value.replace("'", "'\\''")


if __name__ == "__main__":
    sys.exit(main())
