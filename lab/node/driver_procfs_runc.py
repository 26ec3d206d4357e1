# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kernel's part of the lab's fake driver: its /proc/driver entries in containers. Installed in a GPU node
as /usr/local/sbin/driver-procfs-runc (python3 shebang added by lab/build-image.sh) and named as the low-level runtime
in the real nvidia-container-runtime's configuration (`[nvidia-container-runtime] runtimes`), so it runs for
every container of containerd's handler nvidia, after the real runtime has edited the bundle.

On a real node the NVIDIA kernel modules put /proc/driver/nvidia-caps/mig-minors (MIG's capability minors,
which the device plugin and NVML read) into every procfs. A node of the lab has the host's kernel: the node
itself sees the driver's entries because lab-init binds /var/lib/nvidia-fake/proc-driver over its /proc/driver,
but runc mounts a fresh procfs in each container and refuses spec mounts under /proc. So for runc's `create`
this adds a createContainer hook (this file, called with `proc-driver-hook`) that binds the node's folder over
/proc/driver in the container before it starts, as the toolkit's own hooks bind files under /proc/driver/nvidia;
then it execs runc with the original arguments. It touches nothing else: the GPUs are the real runtime's work.
"""

import json
import os
import subprocess
import sys

RUNC = "/usr/sbin/runc"
PROC_DRIVER = "/var/lib/nvidia-fake/proc-driver"
SELF = "/usr/local/sbin/driver-procfs-runc"
HOOK_ARG = "proc-driver-hook"


def create_bundle(argv):
    """The bundle folder when argv is a runc `create`, else None."""
    if "create" not in argv:
        return None
    rest = argv[argv.index("create") + 1:]
    for i, arg in enumerate(rest):
        if arg in ("--bundle", "-b"):
            return rest[i + 1]
        if arg.startswith("--bundle="):
            return arg.split("=", 1)[1]
    return os.getcwd()


def add_hook(bundle):
    """Adds the proc-driver hook to the bundle's config.json when the node has driver entries."""
    if not os.path.isdir(PROC_DRIVER):
        return
    path = os.path.join(bundle, "config.json")
    with open(path) as handle:
        spec = json.load(handle)
    hook = {"path": SELF, "args": [os.path.basename(SELF), HOOK_ARG]}
    spec.setdefault("hooks", {}).setdefault("createContainer", []).append(hook)
    with open(path + ".tmp", "w") as handle:
        json.dump(spec, handle)
    os.rename(path + ".tmp", path)


def proc_driver_hook(state):
    """runc's createContainer hook: in the container's mount namespace, before pivot_root, so the node's
    folder is still reachable. Binds it over the container's /proc/driver, read-only."""
    with open(os.path.join(state["bundle"], "config.json")) as handle:
        root = json.load(handle)["root"]["path"]
    target = os.path.join(state["bundle"], root, "proc", "driver")
    subprocess.run(["/bin/mount", "--bind", "-o", "ro", PROC_DRIVER, target], check=True)


def main(argv):
    if argv == [HOOK_ARG]:
        try:
            proc_driver_hook(json.load(sys.stdin))
        except (OSError, ValueError, KeyError, subprocess.CalledProcessError) as err:
            sys.stderr.write("driver-procfs-runc hook: %s\n" % err)
            return 1
        return 0
    bundle = create_bundle(argv)
    if bundle:
        try:
            add_hook(bundle)
        except (OSError, ValueError) as err:
            sys.stderr.write("driver-procfs-runc: %s\n" % err)
            return 1
    os.execv(RUNC, [RUNC] + argv)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
