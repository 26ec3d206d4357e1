# The lab's connection to its nodes: a task's command entered straight into the node container's
# namespaces with nsenter, its module piped on stdin. containers.podman.podman runs about four
# `podman exec`/`podman mount` per task (no pipelining), and those podman processes were most of the CPU
# that Molecule spent on 2 cores; this does one nsenter. Test infrastructure, not part of the collection.
from __future__ import annotations

DOCUMENTATION = """
name: lab_node
short_description: Run tasks in a gpuready lab node (a local podman container), as podman exec would
description:
  - Enters the namespaces of the node container's first process (mount, UTS, IPC, network, PID, cgroup) with
    C(nsenter), with the container's configured environment and the remote user's identity, home and groups,
    as C(podman exec --user) gives them. Modules are piped to the node's Python (pipelining).
  - Needs root on the controller (as the lab's rootful podman does) and C(setpriv) in the node image.
  - Files are copied by C(cat) inside the node, as the remote user, so absolute symlinks resolve inside it.
author: gpuready
options:
  remote_addr:
    description: The node's container name or ID.
    default: inventory_hostname
    type: str
    vars:
      - name: inventory_hostname
      - name: ansible_host
  remote_user:
    description: The user commands run as in the node; root when unset.
    type: str
    vars:
      - name: ansible_user
  podman_executable:
    description: The podman that runs the lab (its CONTAINERS_CONF comes from the environment).
    default: podman
    type: str
    env:
      - name: ANSIBLE_PODMAN_EXECUTABLE
  pipelining:
    description: Pipe modules to the node's Python instead of copying them first.
    default: true
    type: boolean
    env:
      - name: ANSIBLE_PIPELINING
    vars:
      - name: ansible_pipelining
"""

import json
import shlex
import subprocess

from ansible.errors import AnsibleConnectionFailure, AnsibleError
from ansible.module_utils.common.text.converters import to_bytes, to_text
from ansible.plugins.connection import ConnectionBase
from ansible.utils.display import Display

display = Display()

# Every namespace `podman exec` joins; the node keeps its own view of mounts, hostname, network and PIDs.
_NAMESPACES = ["--mount", "--uts", "--ipc", "--net", "--pid", "--cgroup"]


class Connection(ConnectionBase):
    transport = "lab_node"
    has_pipelining = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._prefix = None

    def _connect(self):
        if self._connected:
            return self
        container = self.get_option("remote_addr")
        proc = subprocess.run([self.get_option("podman_executable"), "inspect", "--type", "container",
                               "--format", "{{.State.Pid}}\t{{json .Config.Env}}", container],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
        if proc.returncode != 0:
            raise AnsibleConnectionFailure("lab node %s: podman inspect failed: %s"
                                           % (container, to_text(proc.stderr).strip()))
        pid, env_json = to_text(proc.stdout).strip().split("\t", 1)
        if pid in ("", "0"):
            raise AnsibleConnectionFailure("lab node %s is not running" % container)
        env = dict(item.split("=", 1) for item in json.loads(env_json))
        user = self.get_option("remote_user") or "root"
        identity = []
        if user != "root":
            uid, gid, home = self._account(pid, container, user)
            identity = ["setpriv", "--reuid", uid, "--regid", gid, "--init-groups", "--"]
            env["HOME"] = home
        display.vvv("LAB NODE %s: pid %s, user %s" % (container, pid, user), host=container)
        self._prefix = (["nsenter", "--target", pid] + _NAMESPACES + ["--wd=/", "--"] + identity
                        + ["env", "-i"] + ["%s=%s" % item for item in sorted(env.items())])
        self._connected = True
        return self

    @staticmethod
    def _account(pid, container, user):
        # The node's own account database, read through its root as the kernel sees it
        try:
            with open("/proc/%s/root/etc/passwd" % pid, encoding="utf-8") as handle:
                for line in handle:
                    fields = line.rstrip("\n").split(":")
                    if len(fields) >= 6 and fields[0] == user:
                        return fields[2], fields[3], fields[5]
        except OSError as err:
            raise AnsibleConnectionFailure("lab node %s: cannot read its /etc/passwd: %s" % (container, err))
        raise AnsibleConnectionFailure("lab node %s has no user %s" % (container, user))

    def _run(self, argv, stdin=None, stdout=subprocess.PIPE, in_data=None):
        self._connect()
        display.vvv("LAB NODE EXEC %s" % argv, host=self.get_option("remote_addr"))
        proc = subprocess.run(self._prefix + [to_bytes(arg) for arg in argv], input=in_data,
                              stdin=stdin if in_data is None else None, stdout=stdout,
                              stderr=subprocess.PIPE, check=False)
        return proc.returncode, proc.stdout, proc.stderr

    def exec_command(self, cmd, in_data=None, sudoable=True):
        super().exec_command(cmd, in_data=in_data, sudoable=sudoable)
        return self._run(shlex.split(to_text(cmd)), stdin=subprocess.DEVNULL, in_data=in_data)

    def put_file(self, in_path, out_path):
        super().put_file(in_path, out_path)
        with open(in_path, "rb") as source:
            rc, dummy, stderr = self._run(["/bin/sh", "-c", 'cat > "$1"', "put_file", out_path], stdin=source)
        if rc != 0:
            raise AnsibleError("lab node: cannot write %s: %s" % (out_path, to_text(stderr).strip()))

    def fetch_file(self, in_path, out_path):
        super().fetch_file(in_path, out_path)
        with open(out_path, "wb") as target:
            rc, dummy, stderr = self._run(["cat", in_path], stdout=target)
        if rc != 0:
            raise AnsibleError("lab node: cannot read %s: %s" % (in_path, to_text(stderr).strip()))

    def close(self):
        self._connected = False
