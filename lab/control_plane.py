# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's real Kubernetes control plane: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler, built from their Go modules (lab/go), run as processes of the test machine inside
a network namespace of the lab's own.

    python lab/control_plane.py up RUN_DIR     start one (the binaries must be built: make go-build)
    python lab/control_plane.py down RUN_DIR   stop it and remove its processes

The API server serves TLS with the lab's own CA and authenticates clients by certificate
(CN = user, O = groups), authorizes with Node,RBAC, runs the default admission plugins
(PodSecurity, ServiceAccount, RuntimeClass, ...) plus NodeRestriction, and signs service
account tokens. etcd listens on plain HTTP on the namespace's loopback: only the API server talks
to it.

The network namespace: the API server must advertise an address that is not loopback (the
`kubernetes` Service's endpoint, which pods will reach), and the lab must not add addresses,
bridges or iptables rules to the test machine's own network. So each control plane gets a
namespace `gpuready-cp<N>` holding a bridge, the lab's segment 10.213.N.0/24: this machine is
joined to it by a veth pair as .1, the API server listens on the bridge as .2, and each node gets
a namespace of its own on it as .10, .11, ... (`attach_node`). Traffic to it never leaves the
machine.

State (pids, ports, credentials) lives under RUN_DIR, so `down` works from another process.
"""

import argparse
import base64
import calendar
import datetime
import importlib.util
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

from cryptography.hazmat.primitives import serialization

LAB_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(LAB_DIR)
NETWORK_PREFIX = "gpuready-cp"
NETWORK_SUBNET = "10.213.%d.%d"
API_PORT = 6443
SERVICE_CIDR = "10.96.0.0/16"
CLUSTER_CIDR = "10.244.0.0/16"
# The first address of SERVICE_CIDR: the `kubernetes` Service, which the serving certificate names.
API_SERVICE_IP = "10.96.0.1"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
# Who the control plane's own clients are, as the API server's bootstrap RBAC policy expects them.
IDENTITIES = {
    "admin": ("kubernetes-admin", ["system:masters"]),
    "controller-manager": ("system:kube-controller-manager", []),
    "scheduler": ("system:kube-scheduler", []),
    "kube-proxy": ("system:kube-proxy", []),
}
PROCESSES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
# The API server's audit log (logs/audit.log, JSON lines): every request of a user or workload, at the
# Metadata level (who, verb, object, answer code), which is how a test sees what a playbook needed. The
# cluster's own components are left out: their tens of thousands of requests say nothing about ours.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "users": ["system:kube-scheduler", "system:kube-controller-manager", "system:apiserver"]},
        {"level": "None", "userGroups": ["system:nodes", "system:serviceaccounts:kube-system"]},
        {"level": "Metadata"},
    ],
}


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gobuild = _load("gobuild", os.path.join(LAB_DIR, "go", "gobuild.py"))
pki = _load("lab_pki", os.path.join(LAB_DIR, "pki.py"))


def _epoch(timestamp):
    """2026-12-06T05:30:50.123456Z -> seconds since the epoch."""
    whole, _dot, fraction = timestamp.rstrip("Z").partition(".")
    return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + float("0." + (fraction or "0"))


class ControlPlaneError(RuntimeError):
    pass


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _ip(*args, check=True):
    proc = subprocess.run(["ip"] + list(args), capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise ControlPlaneError("ip %s: %s" % (" ".join(args), proc.stderr.strip()))
    return proc


def create_network():
    """A new network namespace holding the lab's segment, a bridge, with a veth pair to this
    machine; returns (name, machine_ip, lab_ip). Creating the namespace is what claims an index
    (it fails where one exists), and the pair is made with its far end already inside it, so
    concurrent labs cannot collide."""
    for index in range(256):
        name = "%s%d" % (NETWORK_PREFIX, index)
        if _ip("netns", "add", name, check=False).returncode != 0:
            continue
        machine_ip, lab_ip = NETWORK_SUBNET % (index, 1), NETWORK_SUBNET % (index, 2)
        try:
            _ip("link", "add", name, "type", "veth", "peer", "name", "uplink", "netns", name)
            _ip("-n", name, "link", "set", "lo", "up")
            _ip("-n", name, "link", "add", "br0", "type", "bridge")
            _ip("-n", name, "addr", "add", lab_ip + "/24", "dev", "br0")
            _ip("-n", name, "link", "set", "br0", "up")
            _ip("-n", name, "link", "set", "uplink", "master", "br0", "up")
            _ip("addr", "add", machine_ip + "/24", "dev", name)
            _ip("link", "set", name, "up")
        except ControlPlaneError:
            delete_network(name)
            raise
        return name, machine_ip, lab_ip
    raise ControlPlaneError("no free %sN network (0-255 taken)" % NETWORK_PREFIX)


def attach_node(network, node_index):
    """A network namespace for one node, on the lab's segment as 10.213.N.(10 + node_index); returns
    (namespace name, node ip). The node's containerd gives its pods their own namespaces (CNI)."""
    lab_ns = network["name"]
    name = "%s-n%d" % (lab_ns, node_index)
    node_ip = ".".join(network["lab_ip"].split(".")[:3] + [str(10 + node_index)])
    port = "n%d" % node_index
    _ip("netns", "add", name)
    _ip("-n", lab_ns, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", name)
    _ip("-n", lab_ns, "link", "set", port, "master", "br0", "up")
    _ip("-n", name, "link", "set", "lo", "up")
    _ip("-n", name, "addr", "add", node_ip + "/24", "dev", "eth0")
    _ip("-n", name, "link", "set", "eth0", "up")
    _ip("-n", name, "route", "add", "default", "via", network["lab_ip"])
    return name, node_ip


def delete_network(name):
    """Removes the lab's namespace and its nodes' (their ends of each pair go with them)."""
    for netns in os.listdir("/run/netns") if os.path.isdir("/run/netns") else ():
        if netns.startswith(name + "-n"):
            _ip("netns", "del", netns, check=False)
    _ip("netns", "del", name, check=False)
    _ip("link", "del", name, check=False)


def binary(program):
    """The cached build of `program` at the version lab/go pins; a clear error when not built."""
    try:
        path = gobuild.find_binary(program)
    except gobuild.GoModError as exc:
        raise ControlPlaneError(str(exc))
    if not os.access(str(path), os.X_OK):
        raise ControlPlaneError("%s is not built (%s): run make go-build" % (program, path))
    return str(path)


def kubeconfig(server, ca_file, cert_file, key_file, user, embed=False):
    """A kubeconfig naming the files, or with `embed` carrying their content (for a node)."""
    if embed:
        def data(path):
            with open(path, "rb") as handle:
                return base64.b64encode(handle.read()).decode()
        cluster = {"server": server, "certificate-authority-data": data(ca_file)}
        credentials = {"client-certificate-data": data(cert_file), "client-key-data": data(key_file)}
    else:
        cluster = {"server": server, "certificate-authority": ca_file}
        credentials = {"client-certificate": cert_file, "client-key": key_file}
    return {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "lab", "cluster": cluster}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": user}}],
        "current-context": "lab",
    }


class ControlPlane:
    """`ControlPlane(run_dir).up()` / `.down()`; `.kubeconfig_path("admin")` after up. `apiserver_args`:
    more kube-apiserver flags (a test's, e.g. --watch-cache=false); `controller_manager_args`: more
    kube-controller-manager flags (a later flag wins over ours, e.g. --controllers)."""

    def __init__(self, run_dir, apiserver_args=(), controller_manager_args=()):
        self.run_dir = os.path.abspath(run_dir)
        self.apiserver_args = list(apiserver_args)
        self.controller_manager_args = list(controller_manager_args)
        self.pki_dir = os.path.join(self.run_dir, "pki")
        self.state_path = os.path.join(self.run_dir, "control-plane.json")
        self.state = self._read_state()
        # Another process's control plane (lab.py user): its CA still issues client certificates.
        self.ca = (pki.CertificateAuthority.load(self.pki_dir)
                   if os.path.exists(os.path.join(self.pki_dir, "ca.key")) else None)

    def _read_state(self):
        try:
            with open(self.state_path) as handle:
                return json.load(handle)
        except FileNotFoundError:
            return {"pids": {}}

    def _save(self):
        tmp = self.state_path + ".tmp"
        with open(tmp, "w") as handle:
            json.dump(self.state, handle, indent=1, sort_keys=True)
        os.replace(tmp, self.state_path)

    @property
    def server(self):
        return "https://%s:%d" % (self.state["network"]["lab_ip"], API_PORT)

    def kubeconfig_path(self, identity):
        return os.path.join(self.run_dir, "%s.kubeconfig" % identity)

    @property
    def audit_log_path(self):
        return os.path.join(self.run_dir, "logs", "audit.log")

    def _audit_policy(self):
        path = os.path.join(self.run_dir, "audit-policy.json")
        with open(path, "w") as handle:
            json.dump(AUDIT_POLICY, handle, indent=1)
        return path

    def audit_events(self):
        """The audit log's events so far (AUDIT_POLICY says which), oldest first."""
        try:
            with open(self.audit_log_path) as handle:
                return [json.loads(line) for line in handle if line.strip()]
        except FileNotFoundError:
            return []

    def requests(self):
        """Every audited request so far (users and workloads, not the cluster's own components), oldest
        first, as dicts: user, verb, group, resource, subresource, namespace, name, code, path, time (epoch).
        A watch is logged when its answer starts and again when it ends; it is listed once."""
        latest = {}
        for event in self.audit_events():
            latest[event["auditID"]] = event  # dicts keep the first event's place
        entries = []
        for event in latest.values():
            ref = event.get("objectRef") or {}
            entries.append({
                "user": event["user"].get("username"), "verb": event["verb"], "group": ref.get("apiGroup", ""),
                "resource": ref.get("resource"), "subresource": ref.get("subresource"),
                "namespace": ref.get("namespace"), "name": ref.get("name"),
                "code": (event.get("responseStatus") or {}).get("code"), "path": event["requestURI"],
                "time": _epoch(event["requestReceivedTimestamp"])})
        return entries

    # -- credentials -------------------------------------------------------------------------
    def _pki(self):
        os.makedirs(self.pki_dir, exist_ok=True)
        ca = pki.CertificateAuthority.create(self.pki_dir, common_name="gpuready-lab-ca")
        self.ca = ca
        ca.issue(*self._pair("apiserver"), common_name="kube-apiserver",
                 server_names=[self.state["network"]["lab_ip"], "127.0.0.1", API_SERVICE_IP, "localhost", "kubernetes", "kubernetes.default",
                               "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"])
        # The API server's identity towards kubelets (logs, exec, port-forward).
        ca.issue(*self._pair("apiserver-kubelet-client"), common_name="kube-apiserver-kubelet-client",
                 organizations=["system:masters"])
        for identity in IDENTITIES:
            self.issue_kubeconfig(identity, *IDENTITIES[identity])
        # Service account tokens are signed with a key of their own; the API server verifies them
        # with its public half.
        key_path = ca.issue(*self._pair("sa"), common_name="service-accounts")[1]
        with open(key_path, "rb") as handle:
            key = serialization.load_pem_private_key(handle.read(), password=None)
        with open(os.path.join(self.pki_dir, "sa.pub"), "wb") as handle:
            handle.write(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                       serialization.PublicFormat.SubjectPublicKeyInfo))

    def client_pair(self, identity):
        """(certificate, key) paths of one of IDENTITIES."""
        return self._pair("client-" + identity)

    def _pair(self, name):
        return os.path.join(self.pki_dir, name + ".crt"), os.path.join(self.pki_dir, name + ".key")

    def issue_kubeconfig(self, identity, user, groups=(), embed=False):
        """A client certificate for `user` in `groups` and a kubeconfig using it; returns its path."""
        cert, key = self._pair("client-" + identity)
        self.ca.issue(cert, key, common_name=user, organizations=list(groups))
        path = self.kubeconfig_path(identity)
        with open(path, "w") as handle:
            json.dump(kubeconfig(self.server, self.ca.cert_path, cert, key, user, embed), handle, indent=1)
        os.chmod(path, 0o600)
        return path

    # -- processes ---------------------------------------------------------------------------
    def _start(self, name, args):
        log_path = os.path.join(self.run_dir, "logs", name + ".log")
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(["ip", "netns", "exec", self.state["network"]["name"], binary(name)] + args,
                                    stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.state["pids"][name] = proc.pid
        self._save()
        return proc

    def _wait(self, name, url, timeout, context=None):
        """Polls url until it answers 200 (or the process dies, or time runs out)."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if not _alive(self.state["pids"][name]):
                raise ControlPlaneError("%s exited; see %s" % (name, self._log_tail(name)))
            try:
                with urllib.request.urlopen(url, timeout=5, context=context) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError) as err:
                last = err
            time.sleep(0.25)
        raise ControlPlaneError("%s not ready after %ss (%s); see %s" % (name, timeout, last, self._log_tail(name)))

    def _log_tail(self, name):
        path = os.path.join(self.run_dir, "logs", name + ".log")
        try:
            with open(path, errors="replace") as handle:
                return "%s:\n%s" % (path, "".join(handle.readlines()[-15:]))
        except OSError:
            return path

    def _tls_context(self, identity):
        cert, key = self._pair("client-" + identity)
        context = ssl.create_default_context(cafile=self.ca.cert_path)
        context.load_cert_chain(cert, key)
        return context

    def up(self, timeout=180):
        """Starts everything and waits until it serves; on failure stops what it started."""
        if any(_alive(pid) for pid in self.state.get("pids", {}).values()):
            raise ControlPlaneError("a control plane is already running from %s" % self.run_dir)
        os.makedirs(self.run_dir, exist_ok=True)
        try:
            return self._up(timeout)
        except BaseException:
            self.down()
            raise

    def _up(self, timeout):
        started = time.monotonic()
        self.state = {"pids": {}, "started": datetime.datetime.now(datetime.timezone.utc).isoformat()}
        # A new cluster each time: nothing of an earlier run's etcd survives.
        shutil.rmtree(os.path.join(self.run_dir, "etcd"), ignore_errors=True)
        name, machine_ip, lab_ip = create_network()
        self.state["network"] = {"name": name, "machine_ip": machine_ip, "lab_ip": lab_ip}
        self._save()
        self._pki()
        etcd_url, peer_url = "http://127.0.0.1:2379", "http://127.0.0.1:2380"
        self._start("etcd", [
            "--name=lab", "--data-dir=%s" % os.path.join(self.run_dir, "etcd"),
            "--listen-client-urls=" + etcd_url, "--advertise-client-urls=" + etcd_url,
            "--listen-peer-urls=" + peer_url, "--initial-advertise-peer-urls=" + peer_url,
            "--initial-cluster=lab=" + peer_url, "--log-level=warn",
            # A lab's data need not survive a power cut; fsync dominates etcd's time on a small disk.
            "--unsafe-no-fsync"])
        p = self._pair
        self._start("kube-apiserver", [
            "--etcd-servers=" + etcd_url,
            "--bind-address=0.0.0.0", "--advertise-address=" + lab_ip, "--secure-port=%d" % API_PORT,
            "--tls-cert-file=%s" % p("apiserver")[0], "--tls-private-key-file=%s" % p("apiserver")[1],
            "--client-ca-file=%s" % self.ca.cert_path,
            "--kubelet-client-certificate=%s" % p("apiserver-kubelet-client")[0],
            "--kubelet-client-key=%s" % p("apiserver-kubelet-client")[1],
            "--kubelet-preferred-address-types=InternalIP",  # node names resolve nowhere
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            "--service-cluster-ip-range=" + SERVICE_CIDR,
            "--service-account-issuer=" + SA_ISSUER,
            "--service-account-key-file=%s" % os.path.join(self.pki_dir, "sa.pub"),
            "--service-account-signing-key-file=%s" % p("sa")[1],
            "--audit-policy-file=%s" % self._audit_policy(), "--audit-log-path=%s" % self.audit_log_path,
            "--profiling=false"] + self.apiserver_args)
        self._wait("kube-apiserver", self.server + "/readyz", timeout, self._tls_context("admin"))
        common = ["--bind-address=" + lab_ip, "--leader-elect=false"]
        cm = self.kubeconfig_path("controller-manager")
        self._start("kube-controller-manager", common + [
            "--kubeconfig=" + cm, "--authentication-kubeconfig=" + cm, "--authorization-kubeconfig=" + cm,
            "--use-service-account-credentials=true",
            "--service-account-private-key-file=%s" % p("sa")[1],
            "--root-ca-file=%s" % self.ca.cert_path,
            "--cluster-signing-cert-file=%s" % self.ca.cert_path,
            "--cluster-signing-key-file=%s" % os.path.join(self.pki_dir, "ca.key"),
            "--allocate-node-cidrs=true", "--cluster-cidr=" + CLUSTER_CIDR,
            "--service-cluster-ip-range=" + SERVICE_CIDR,
            "--controllers=*,bootstrapsigner,tokencleaner"] + self.controller_manager_args)
        sched = self.kubeconfig_path("scheduler")
        self._start("kube-scheduler", common + [
            "--kubeconfig=" + sched, "--authentication-kubeconfig=" + sched, "--authorization-kubeconfig=" + sched])
        insecure = ssl._create_unverified_context()  # their serving certificates are self-signed
        # Their default secure ports
        self._wait("kube-controller-manager", "https://%s:10257/healthz" % lab_ip, timeout, insecure)
        self._wait("kube-scheduler", "https://%s:10259/healthz" % lab_ip, timeout, insecure)
        # Until the service account controller has made it, admission rejects every pod in `default`.
        self._wait("kube-controller-manager", self.server + "/api/v1/namespaces/default/serviceaccounts/default",
                   timeout, self._tls_context("admin"))
        self.state["up_seconds"] = round(time.monotonic() - started, 1)
        self._save()
        return self

    def down(self, timeout=20):
        """Stops every process this run dir started (TERM, then KILL) and removes the network
        namespace; returns what is left (names of processes still alive)."""
        pids = self.state.get("pids", {})
        # One at a time, clients before the API server before etcd, so none waits on a dead peer.
        for name in reversed(PROCESSES):
            pid = pids.get(name)
            if not pid or not _alive(pid):
                continue
            for sig, wait_s in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5)):
                os.killpg(pid, sig)
                deadline = time.monotonic() + wait_s
                while time.monotonic() < deadline and _alive(pid):
                    time.sleep(0.1)
                if not _alive(pid):
                    break
        left = [name for name, pid in pids.items() if _alive(pid)]
        network = self.state.get("network")
        if network and not left:
            delete_network(network["name"])
            if os.path.exists("/run/netns/" + network["name"]):
                left.append("network namespace " + network["name"])
        self.state["pids"] = {}
        if os.path.isdir(self.run_dir):
            self._save()
        return left


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("up", "down"))
    parser.add_argument("run_dir")
    args = parser.parse_args()
    plane = ControlPlane(args.run_dir)
    try:
        if args.what == "up":
            plane.up()
            print("export KUBECONFIG=%s" % plane.kubeconfig_path("admin"))
            return 0
        left = plane.down()
        if left:
            print("still running: %s" % ", ".join(left), file=sys.stderr)
        return 1 if left else 0
    except ControlPlaneError as err:
        print("control_plane: %s" % err, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
