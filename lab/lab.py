# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab: GPU nodes in podman (see lab/README.md).

    python lab/lab.py up [--nodes gpu-p4,gpu-h100]   build/use the cached images, start the real control plane
                                                     (lab/control_plane.py) and the nodes, each with the real
                                                     kubelet; write inventory + kubeconfig (gpu-p4-v3, on
                                                     containerd 2.x, only when named)
    python lab/lab.py down                           remove everything, check that nothing is left
    python lab/lab.py env                            print the exports for Ansible and kubectl
    python lab/lab.py user --name N [--group G]      print the path of a new kubeconfig for the user N (a client
                                                     certificate from the lab's CA; no rights until bound)
    python lab/lab.py requests                       print what users and workloads asked the API server (JSON,
                                                     from its audit log; ControlPlane.requests)
    ... --prefix P --run-dir D                       a second lab beside the first (Molecule scenarios)

Run it with the project's .venv python (the lab's CA needs `cryptography`); `make lab-up`,
`make lab-down` and `make lab-env` do. Tests use the ``Lab`` class (tests/integration/conftest.py).
Everything lives under .cache/lab/ (``$LAB_CACHE``); run state under .cache/lab/run/.
"""

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

LAB_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(LAB_DIR)
TESTS = os.path.join(ROOT, "tests")
PREFIX = "gpuready-lab-"
GPU_IMAGE = "localhost/gpuready-lab-gpunode:bookworm"
# The inventory's connection to the nodes (lab/connection_plugins/lab_node.py: nsenter and pipelining)
CONNECTION_PLUGINS = os.path.join(LAB_DIR, "connection_plugins")
GFD_CASES = [os.path.join(TESTS, "fixtures", "gfd", "gfd_label_cases.%s.json" % kind) for kind in ("public", "own")]
# Kubernetes Node name -> GFD label case, Ansible inventory name, Ansible user (None: root),
# and optionally: "containerd" ("1.6", Debian's, the
# default; "2": the 2.x binaries bind-mounted over it, with the config version 3 seed) and
# "default" (False: started only when asked for, `up --nodes ...` or ``Lab(nodes=[...])``).
NODES = {
    "gpu-p4": {"case": "seed-4x-tesla-p4-driver-535", "inventory": "p4.lab.internal", "user": None},
    "gpu-h100": {"case": "dgx-h100-8x-h100-mig-capable-single", "inventory": "h100.lab.internal", "user": "ops"},
    "gpu-p4-v3": {"case": "seed-4x-tesla-p4-driver-535", "inventory": "p4-v3.lab.internal", "user": None,
                  "containerd": "2", "default": False},
    # MIG enabled: one A100 in seven 1g.5gb instances (the MIG strategies on the real plugin and GFD)
    "gpu-a100-mig": {"case": "dgx-a100-mig-single-time-slicing", "inventory": "a100-mig.lab.internal", "user": None,
                     "default": False},
}
DEFAULT_NODES = [name for name, spec in NODES.items() if spec.get("default", True)]
# The containerd 2.x node: these binaries replace Debian's 1.6 ones (read-only bind mounts), and
# this seed replaces /etc/containerd/config.toml.
CONTAINERD_2_BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr")
CONTAINERD_SEEDS = {"1.6": None, "2": os.path.join(LAB_DIR, "node", "containerd-seed-v3.toml")}
# Where a GPU node keeps its fake PCI sysfs and DMI product name (its own /sys is the host's); the inventory
# tells the collection (gpuready_sysfs_root, gpuready_dmi_product_file)
FAKE_SYSFS_ROOT = "/var/lib/nvidia-fake/sys"
FAKE_DMI_PRODUCT_FILE = "/var/lib/nvidia-fake/product_name"
FAKE_PROC_DRIVER = "/var/lib/nvidia-fake/proc-driver"
# The driver's NVML library on a node, as a driver install names it (+ the libnvidia-ml.so.1 link)
NVML_DIR = "/usr/lib/x86_64-linux-gnu"
NVML_INVENTORY = "/etc/nvidia-fake/gpus.json"
CRI = ["env", "PYTHONPATH=/opt/lab/pylib", "python3", "/opt/lab/cri.py"]
# Imported into every node's containerd: the pause and workload images, the real device plugin, GFD, MPS
# daemon and config manager, and NFD (lab/go)
IMAGE_ARCHIVES = ("pause.oci.tar", "workload.oci.tar", "nvidia-device-plugin.oci.tar", "node-feature-discovery.oci.tar")
# Every lab node carries this label (value "true"), set by its kubelet.
LAB_NODE_LABEL = "gpuready.lab/node"
# The pod network of a node on the real control plane: its podCIDR (node IPAM), as kind's kindnetd writes it.
CNI_CONFIG = "/etc/cni/net.d/10-lab.conflist"


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


control_plane = _load("lab_control_plane", os.path.join(LAB_DIR, "control_plane.py"))


def log(message):
    sys.stderr.write("==> [lab %s] %s\n" % (time.strftime("%H:%M:%S"), message))
    sys.stderr.flush()


class LabError(RuntimeError):
    pass


class Lab:
    """``Lab().up()`` / ``.down()``: the nodes around the real control plane (its state under
    <run_dir>/control-plane), each with the real kubelet."""

    def __init__(self, cache=None, nodes=None, prefix=PREFIX, run_dir=None):
        self.cache = os.path.abspath(cache or os.environ.get("LAB_CACHE") or os.path.join(ROOT, ".cache", "lab"))
        self.prefix = prefix
        self.run_dir = run_dir or os.path.join(self.cache, "run")
        self.state_path = os.path.join(self.run_dir, "state.json")
        self.names = list(nodes or DEFAULT_NODES)
        unknown = [name for name in self.names if name not in NODES]
        if unknown:
            raise LabError("unknown node(s) %s; known: %s" % (", ".join(unknown), ", ".join(NODES)))
        self.control_plane = None
        self.timings = {}
        self.env = dict(os.environ, LAB_CACHE=self.cache, **self.ansible_env())

    # -- helpers ---------------------------------------------------------------------------
    def ansible_env(self):
        """What podman and an Ansible run against the lab's inventory need in their environment: the lab's
        podman configuration and where the inventory's connection (lab_node) is."""
        return {"CONTAINERS_CONF": os.path.join(self.cache, "etc", "containers.conf"),
                "CONTAINERS_STORAGE_CONF": os.path.join(self.cache, "etc", "storage.conf"),
                "ANSIBLE_CONNECTION_PLUGINS": CONNECTION_PLUGINS}

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
    def build_images(self):
        """build-image.sh: the images and artifacts, built when missing, else taken from the cache."""
        build = subprocess.run(["bash", os.path.join(LAB_DIR, "build-image.sh")],
                               env=dict(self.env, LAB_PYTHON=sys.executable),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, check=False)
        if build.returncode != 0:
            raise LabError("build-image.sh failed:\n" + build.stdout[-4000:])

    def up(self):
        t_start = time.monotonic()
        if any(NODES[name].get("containerd") == "2" for name in self.names):
            self.containerd_2_dir()  # fail before anything starts
        self.build_images()
        self.timings["build_image_s"] = round(time.monotonic() - t_start, 1)
        self._remove_nodes()
        os.makedirs(self.run_dir, exist_ok=True)
        state = {"nodes": {}}
        try:
            self.control_plane = control_plane.ControlPlane(os.path.join(self.run_dir, "control-plane")).up()
        except control_plane.ControlPlaneError as err:
            raise LabError(str(err))
        state["control_plane"] = self.control_plane.run_dir
        harness = _load("lab_fake_nvml_harness", os.path.join(TESTS, "fake_nvml", "harness.py"))
        cases = {}
        for path in GFD_CASES:
            with open(path) as handle:
                cases.update((case["name"], case) for case in json.load(handle))
        t0 = time.monotonic()
        try:
            with tempfile.TemporaryDirectory(prefix="gpuready-lab-") as tmp:
                for index, name in enumerate(self.names):
                    state["nodes"][name] = self._create_node(name, cases[NODES[name]["case"]], harness, tmp, index)
            for name in self.names:
                self._wait_node(name)
        except BaseException:
            # No state.json yet, so down() would not find this control plane: a failed up stops its own.
            self._remove_nodes()
            self.control_plane.down()
            raise
        self.timings["nodes_s"] = round(time.monotonic() - t0, 1)
        state["kubeconfig"] = os.path.join(self.run_dir, "kubeconfig")
        shutil.copyfile(self.control_plane.kubeconfig_path("admin"), state["kubeconfig"])
        state["inventory"] = self._write_inventory()
        # Where the nodes reach this machine (a mirror served here for them listens there)
        state["host_address"] = self.control_plane.state["network"]["machine_ip"]
        with open(self.state_path, "w") as handle:
            json.dump(state, handle, indent=1)
        self.timings["up_s"] = round(time.monotonic() - t_start, 1)
        log("up: %s" % self.timings)
        return state

    def _node_tree(self, name, case, harness, tmp, node_ip=None):
        """What a driver install puts on this node: inventory, sysfs, device nodes (tmpfiles)."""
        fake = harness.node_from_case(case, os.path.join(tmp, name + "-fake"))
        tree = os.path.join(tmp, name)
        os.makedirs(os.path.join(tree, "etc", "nvidia-fake"))
        os.makedirs(os.path.join(tree, "etc", "tmpfiles.d"))
        os.makedirs(os.path.join(tree, "etc", "containerd"))
        os.makedirs(os.path.join(tree, os.path.dirname(FAKE_SYSFS_ROOT).lstrip("/")))
        os.makedirs(os.path.join(tree, "usr", "local", "sbin"))
        shutil.copy(os.path.join(LAB_DIR, "node", "lab-init.sh"), os.path.join(tree, "usr", "local", "sbin", "lab-init"))
        with open(fake["config"]) as handle:
            inventory = json.load(handle)
        if "kernel_module" in inventory:  # the loaded module, at its place on the node
            inventory["kernel_module"] = FAKE_SYSFS_ROOT + "/module/nvidia"
        with open(os.path.join(tree, NVML_INVENTORY.lstrip("/")), "w") as handle:
            json.dump(inventory, handle, indent=1)
        self._install_nvml(tree, inventory, harness, tmp, name)
        shutil.copytree(fake["sysfs_root"], os.path.join(tree, FAKE_SYSFS_ROOT.lstrip("/")))
        # The driver's /proc/driver entries (MIG capability minors): lab-init binds them over the node's /proc/driver,
        # driver-procfs-runc over each container's
        shutil.copytree(fake["proc_driver_root"], os.path.join(tree, FAKE_PROC_DRIVER.lstrip("/")))
        if os.path.exists(fake["dmi_product_file"]):
            shutil.copyfile(fake["dmi_product_file"], os.path.join(tree, FAKE_DMI_PRODUCT_FILE.lstrip("/")))
            # also where GFD reads it: the roles mount gpuready_sysfs_root as its /sys
            dmi = os.path.join(tree, FAKE_SYSFS_ROOT.lstrip("/"), "class", "dmi", "id")
            os.makedirs(dmi)
            shutil.copyfile(fake["dmi_product_file"], os.path.join(dmi, "product_name"))
        count = len(inventory["devices"])
        lines = ["# Written by lab/lab.py: the device nodes the NVIDIA driver (nvidia-modprobe/udev) would",
                 "# create. They only need to exist; nothing behind them answers."]
        devices = harness.device_nodes(inventory)
        if any(name.startswith("nvidia-caps/") for name in devices):
            lines.append("d /dev/nvidia-caps 0755 root root -")
        lines += ["c! /dev/%s 0666 root root - %d:%d" % (name, major, minor)
                  for name, (major, minor) in sorted(devices.items())]
        with open(os.path.join(tree, "etc", "tmpfiles.d", "nvidia-fake-devices.conf"), "w") as handle:
            handle.write("\n".join(lines) + "\n")
        self._kubelet_files(name, tree, node_ip)
        return tree, count

    @staticmethod
    def _install_nvml(tree, inventory, harness, tmp, name):
        """The node's NVML library: the fake, reading the node's inventory file, and carrying a copy of it for
        containers, where the real nvidia-container-runtime mounts the library alone (tests/fake_nvml/README.md);
        under its versioned name with the libnvidia-ml.so.1 link, as a driver install puts it."""
        build_dir = os.path.join(tmp, name + "-nvml")
        os.makedirs(build_dir)
        library = harness.build(build_dir, default_config=NVML_INVENTORY, builtin_config=inventory)
        library_dir = os.path.join(tree, NVML_DIR.lstrip("/"))
        os.makedirs(library_dir, exist_ok=True)
        versioned = "libnvidia-ml.so." + inventory["driver_version"]
        shutil.copyfile(library, os.path.join(library_dir, versioned))
        os.symlink(versioned, os.path.join(library_dir, "libnvidia-ml.so.1"))

    def _create_node(self, name, case, harness, tmp, index):
        container = self.container(name)
        series = NODES[name].get("containerd", "1.6")
        # A network namespace of its own on the control plane's segment, as a machine has.
        netns, node_ip = control_plane.attach_node(self.control_plane.state["network"], index)
        # podman writes no /etc/hosts line for the hostname in a network namespace it did not make, and
        # sudo (the become of Ansible) resolves its own host name: 20 s of DNS timeouts per task without it.
        network = ["--network", "ns:/run/netns/" + netns, "--add-host", "%s:%s" % (name, node_ip)]
        mounts = []
        for program in ("kubelet", "kube-proxy"):
            mounts += ["-v", "%s:/usr/bin/%s:ro" % (self._go_binary(program), program)]
        tree, count = self._node_tree(name, case, harness, tmp, node_ip)
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
                  "--systemd=always", "--cgroupns=private"] + network
        create += ["--label", "gpuready.lab=1", "-v", container + "-containerd:/var/lib/containerd",
                   "-v", os.path.join(self.cache, "artifacts") + ":/opt/lab:ro"]
        cid = self.podman(*(create + mounts + [GPU_IMAGE, "/usr/local/sbin/lab-init"])).strip()
        self.podman("cp", tree + "/.", container + ":/")
        self.podman("start", container)
        log("node %s: container %s (%s), %d fake GPUs, containerd %s" % (name, container, cid[:12], count, series))
        return {"container": container, "id": cid, "gpus": count, "case": case["name"], "containerd": series,
                "ip": node_ip}

    def _wait_node(self, name):
        container = self.container(name)

        def booted():
            state = self.node_exec(container, "systemctl", "is-system-running", check=False).strip()
            return state in ("running", "degraded")

        def cri_ok():
            out = self.node_exec(container, "ctr", "plugins", "ls", check=False)
            return re.search(r"io\.containerd\.grpc\.v1 +cri +.* ok", out) is not None

        def node_ready():
            node = self._get_node(name)
            ready = [c for c in ((node or {}).get("status") or {}).get("conditions", []) if c["type"] == "Ready"]
            return bool(ready) and ready[0]["status"] == "True"

        self._wait("%s to boot" % name, booted)
        self._wait("containerd's CRI plugin in %s" % name, cri_ok)
        for archive in IMAGE_ARCHIVES:
            self.node_exec(container, "ctr", "-n", "k8s.io", "images", "import", "/opt/lab/" + archive)
        self._wait("the kubelet of %s to register its Node and node IPAM to give it a podCIDR" % name,
                   lambda: ((self._get_node(name) or {}).get("spec") or {}).get("podCIDR"))
        self._write_cni_config(name, self._get_node(name)["spec"]["podCIDR"])
        self._wait("the kubelet of %s to register a Ready Node" % name, node_ready)

    def _get_node(self, name):
        """The Node as the API server has it, or None."""
        proc = subprocess.run([self._go_binary("kubectl"), "--kubeconfig", self.control_plane.kubeconfig_path("admin"),
                               "get", "node", name, "-o", "json", "--ignore-not-found"],
                              capture_output=True, text=True, check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout.strip() else None

    def _write_cni_config(self, name, pod_cidr):
        """The node's pod network: a bridge on its podCIDR, masquerading to the lab segment."""
        config = {"cniVersion": "1.0.0", "name": "lab", "plugins": [
            {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": True, "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": pod_cidr}]], "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "portmap", "capabilities": {"portMappings": True}}]}
        self.node_exec(self.container(name), "mkdir", "-p", os.path.dirname(CNI_CONFIG))
        self.podman("exec", "-i", self.container(name), "sh", "-c", "cat > %s" % CNI_CONFIG, stdin=json.dumps(config))

    @staticmethod
    def _go_binary(program):
        try:
            return control_plane.binary(program)
        except control_plane.ControlPlaneError as err:
            raise LabError(str(err))

    def _kubelet_files(self, name, tree, node_ip):
        """What kubeadm join leaves on a node: kubelet.conf (a certificate for system:node:NAME), the
        cluster CA, the kubelet's unit and its flags; and kube-proxy with its own identity."""
        kubeconfig = self.control_plane.issue_kubeconfig("node-" + name, "system:node:" + name,
                                                         ["system:nodes"], embed=True)
        proxy_kubeconfig = self.control_plane.issue_kubeconfig("kube-proxy-" + name, "system:kube-proxy", embed=True)
        for folder in ("etc/kubernetes/pki", "etc/default", "etc/systemd/system/multi-user.target.wants",
                       "var/lib/kube-proxy"):
            os.makedirs(os.path.join(tree, folder), exist_ok=True)
        for source, dest, mode in (
                (kubeconfig, "etc/kubernetes/kubelet.conf", 0o600),
                (self.control_plane.ca.cert_path, "etc/kubernetes/pki/ca.crt", 0o644),
                (proxy_kubeconfig, "var/lib/kube-proxy/kubeconfig.conf", 0o600),
                (os.path.join(LAB_DIR, "node", "kube-proxy-config.yaml"), "var/lib/kube-proxy/config.conf", 0o644),
                (os.path.join(LAB_DIR, "node", "kube-proxy.service"), "etc/systemd/system/kube-proxy.service", 0o644)):
            shutil.copyfile(source, os.path.join(tree, dest))
            os.chmod(os.path.join(tree, dest), mode)
        os.symlink("/etc/systemd/system/kube-proxy.service",
                   os.path.join(tree, "etc/systemd/system/multi-user.target.wants/kube-proxy.service"))
        with open(os.path.join(tree, "etc", "default", "kubelet"), "w") as handle:
            handle.write("KUBELET_NODE_NAME=%s\nKUBELET_NODE_IP=%s\nKUBELET_NODE_LABELS=%s=true\n"
                         % (name, node_ip, LAB_NODE_LABEL))

    def _write_inventory(self):
        path = os.path.join(self.run_dir, "inventory.yml")
        lines = ["# Written by lab/lab.py up. The lab_node connection needs the lab's podman configuration and its",
                 "# own path: eval \"$(make -s lab-env)\" exports CONTAINERS_CONF, CONTAINERS_STORAGE_CONF and",
                 "# ANSIBLE_CONNECTION_PLUGINS (and KUBECONFIG, which the collection's Kubernetes tasks read when",
                 "# gpuready_k8s_kubeconfig is unset).",
                 "all:", "  children:", "    gpu_nodes:", "      vars:",
                 "        # The nodes' GPUs are in a fake sysfs and DMI file (lab/README.md); their own /sys is the host's",
                 "        gpuready_sysfs_root: %s" % FAKE_SYSFS_ROOT,
                 "        gpuready_dmi_product_file: %s" % FAKE_DMI_PRODUCT_FILE]
        lines += ["        # The images the lab built from the Go modules lab/go pins (lab/go/README.md says why these)",
                  "        gpuready_device_plugin_version: %s" % control_plane.gobuild.component("device-plugin").version,
                  "        gpuready_nfd_version: %s" % control_plane.gobuild.component("nfd").version]
        lines += ["      hosts:"]
        for name in self.names:
            spec = NODES[name]
            lines += ["        %s:" % spec["inventory"],
                      "          ansible_connection: lab_node",
                      "          ansible_host: %s" % self.container(name),
                      "          ansible_python_interpreter: /usr/bin/python3",
                      "          k8s_node_name: %s" % name,
                      "          gpuready_node_name: %s" % name]
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
            pid, conmon = (self.podman("inspect", "--format", "{{.State.Pid}} {{.State.ConmonPid}}", cid,
                                       check=False).split() + ["", ""])[:2]
            try:
                pidns = os.readlink("/proc/%s/ns/pid" % pid) if pid not in ("", "0") else None
            except OSError:
                pidns = None
            found.append((cid, name, pidns, conmon))
            self.podman("stop", "-t", "30", cid, check=False)
            self.podman("rm", "-f", cid, check=False)
        for volume in self._lab_volumes():
            self.podman("volume", "rm", "-f", volume, check=False)
        return found

    def down(self, wait_s=15, count_zombies=False):
        """Remove the nodes, their volumes and the control plane; returns the problems left.

        Defunct conmons (podman's double-forked monitors, reaped late by this machine's PID 1) are
        problems only with ``count_zombies`` (the teardown test); otherwise they are logged."""
        t0 = time.monotonic()
        state = {}
        if os.path.exists(self.state_path):
            with open(self.state_path) as handle:
                state = json.load(handle)
        if not os.path.exists(os.path.join(self.cache, "etc", "containers.conf")):
            removed = []
        else:
            removed = self._remove_nodes()
        if state.get("control_plane"):
            left_running = control_plane.ControlPlane(state["control_plane"]).down()
        else:
            left_running = []
        problems = []
        deadline = time.monotonic() + wait_s
        while True:
            problems = ["control plane: %s still running" % what for what in left_running]
            if removed or os.path.exists(os.path.join(self.cache, "etc", "containers.conf")):
                problems += ["container %s left" % " ".join(c) for c in self._lab_containers()]
                problems += ["volume %s left" % v for v in self._lab_volumes()]
            for cid, name, pidns, _conmon in removed:
                if pidns:
                    left = [p for p in _pids() if _readlink("/proc/%s/ns/pid" % p) == pidns]
                    if left:
                        problems.append("%s: processes left in its PID namespace: %s" % (name, left))
                conmons = [line for line in _ps("pid=,args=") if "conmon" in line and cid in line]
                if conmons:
                    problems.append("%s: conmon left: %s" % (name, conmons))
            # The conmons of this lab's nodes only: other labs (Molecule's, beside the tests) leave their own.
            new_zombies = sorted(set(_zombie_conmons()) & set(conmon for _cid, _name, _ns, conmon in removed))
            if new_zombies and count_zombies:
                problems.append("defunct conmon(s) left: %s" % new_zombies)
            if not problems or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        if not problems:
            for path in (self.state_path, os.path.join(self.run_dir, "inventory.yml"),
                         os.path.join(self.run_dir, "kubeconfig")):
                if os.path.exists(path):
                    os.unlink(path)
        self.timings["down_s"] = round(time.monotonic() - t0, 1)
        if new_zombies and not count_zombies:
            log("down: defunct conmon(s) not reaped yet by PID 1 (harmless): %s" % new_zombies)
        left = "; LEFT: " + "; ".join(problems) if problems else ""
        log("down: %d node(s) removed in %ss%s" % (len(removed), self.timings["down_s"], left))
        return problems

    def _running_control_plane(self):
        with open(self.state_path) as handle:
            return control_plane.ControlPlane(json.load(handle)["control_plane"])

    def add_user(self, name, groups=()):
        """A client certificate for the user `name` (CN; O = groups) from the lab's CA, in a kubeconfig that
        carries it inline; returns the kubeconfig's path. The user has no rights until bound to a role."""
        return self._running_control_plane().issue_kubeconfig("user-" + name, name, groups, embed=True)

    def requests(self):
        """What users and workloads asked the API server, from its audit log (ControlPlane.requests)."""
        return self._running_control_plane().requests()

    def exports(self):
        with open(self.state_path) as handle:
            state = json.load(handle)
        nodes = " ".join("%s=%s" % (name, info["container"]) for name, info in state["nodes"].items())
        return {"KUBECONFIG": state["kubeconfig"], "GPUREADY_LAB_INVENTORY": state["inventory"],
                "GPUREADY_LAB_NODES": nodes, "GPUREADY_LAB_HOST_ADDRESS": state["host_address"],
                **self.ansible_env()}


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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("up", "down", "env", "user", "requests"))
    parser.add_argument("--nodes", default=",".join(DEFAULT_NODES),
                        help="comma-separated, of: %s (default: %s)" % (", ".join(NODES), ",".join(DEFAULT_NODES)))
    parser.add_argument("--prefix", default=PREFIX,
                        help="container name prefix (default %s); labs with other prefixes run beside it" % PREFIX)
    parser.add_argument("--run-dir", help="run state folder (default .cache/lab/run); one per prefix")
    parser.add_argument("--name", help="user: the user's name (the certificate's CN)")
    parser.add_argument("--group", action="append", default=[], help="user: a group (the certificate's O); repeatable")
    args = parser.parse_args()
    try:
        lab = Lab(nodes=[n for n in args.nodes.split(",") if n], prefix=args.prefix, run_dir=args.run_dir)
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
    if args.what == "user":
        if not args.name:
            log("user: --name is required")
            return 2
        print(lab.add_user(args.name, args.group))
        return 0
    if args.what == "requests":
        json.dump(lab.requests(), sys.stdout)
        return 0
    for key, value in lab.exports().items():
        print("export %s=%s" % (key, _quote(value)))
    return 0


def _quote(value):
    return "'%s'" % value.replace("'", "'\\''")


if __name__ == "__main__":
    sys.exit(main())
