# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's stand-in for nvidia-container-runtime on a node with MIG enabled, where the real runtime would
need the driver's nvidia-caps devices, which the lab does not fake yet (lab/lab.py copies it over the
package's /usr/bin/nvidia-container-runtime there, with a python3 shebang; every other node runs the real
runtime).

Like the real runtime (in its "legacy" mode) it is a runc wrapper: for `create` it edits the
bundle's config.json, then it execs runc with the original arguments.

Every container it creates gets the driver's /proc/driver entries (MIG's nvidia-caps/mig-minors), which
on a real node the kernel module puts into every procfs: the node keeps them in
/var/lib/nvidia-fake/proc-driver, and a createContainer hook (this file, called with `proc-driver-hook`)
binds that folder over /proc/driver inside the container before it starts (runc refuses spec mounts
under /proc; libnvidia-container mounts there from its hook too).

The GPU edit happens only when the container's environment has NVIDIA_VISIBLE_DEVICES (`all`, or
comma-separated indices, GPU UUIDs or MIG UUIDs; `void`, `none` or empty: nothing). It then
  * binds in, read-only, the driver's libnvidia-ml.so.1 and nvidia-smi, and the folder that stands for
    the loaded kernel module (the inventory's `kernel_module`), which the fake NVML checks at init,
  * writes the GPU inventory restricted to the visible GPUs (/run/nvidia-fake/containers/ID.json;
    for a MIG UUID: its parent GPU with only the visible MIG devices) and binds it at the fake NVML's
    default path /etc/nvidia-fake/gpus.json,
  * adds /dev/nvidiaN of the visible GPUs (of a MIG device: its parent's), /dev/nvidiactl,
    /dev/nvidia-uvm and /dev/nvidia-uvm-tools to linux.devices and to the device cgroup allow-list.
Every call is logged to /var/log/nvidia-container-runtime.log.
"""

import json
import os
import subprocess
import sys
import time

RUNC = "/usr/sbin/runc"
LOG = "/var/log/nvidia-container-runtime.log"
INVENTORY = "/etc/nvidia-fake/gpus.json"
PER_CONTAINER = "/run/nvidia-fake/containers"
BINDS = ("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "/usr/bin/nvidia-smi")
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
PROC_DRIVER = "/var/lib/nvidia-fake/proc-driver"
SELF = "/usr/bin/nvidia-container-runtime"


def log(message):
    try:
        with open(LOG, "a") as handle:
            handle.write("%.3f %s\n" % (time.time(), message))
    except OSError:
        pass


def create_args(argv):
    """(bundle, container id) when argv is a runc `create`, else None."""
    if "create" not in argv:
        return None
    rest = argv[argv.index("create") + 1:]
    bundle, positional, skip = os.getcwd(), [], False
    for i, arg in enumerate(rest):
        if skip:
            skip = False
            continue
        if arg in ("--bundle", "-b"):
            bundle, skip = rest[i + 1], True
        elif arg.startswith("--bundle="):
            bundle = arg.split("=", 1)[1]
        elif arg in ("--pid-file", "--console-socket", "--preserve-fds"):
            skip = True
        elif not arg.startswith("-"):
            positional.append(arg)
    return bundle, (positional[-1] if positional else "unknown")


def visible_devices(env):
    value = None
    for item in env or ():
        if item.startswith("NVIDIA_VISIBLE_DEVICES="):
            value = item.split("=", 1)[1]
    if value is None or value.strip() in ("", "void", "none"):
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def select(devices, wanted):
    """The visible GPUs; a GPU named by the UUID of one of its MIG devices keeps only the MIG devices named."""
    if wanted == ["all"]:
        return list(devices)
    chosen, migs = [], {}
    for want in wanted:
        for index, device in enumerate(devices):
            mig = [m for m in device.get("mig_devices") or [] if m.get("uuid") == want]
            if want == str(index) or want == device.get("uuid") or mig:
                if mig:
                    migs.setdefault(index, []).extend(mig)
                if index not in [i for i, _d in chosen]:
                    chosen.append((index, device))
                break
        else:
            raise ValueError("unknown device %r" % want)
    return [dict(device, mig_devices=migs[index]) if index in migs else device for index, device in chosen]


def device_entry(path):
    st = os.stat(path)
    return {"path": path, "type": "c", "major": os.major(st.st_rdev), "minor": os.minor(st.st_rdev),
            "fileMode": 0o666, "uid": 0, "gid": 0}


def write_spec(config_path, spec):
    with open(config_path + ".tmp", "w") as handle:
        json.dump(spec, handle)
    os.rename(config_path + ".tmp", config_path)


def inject(bundle, container_id):
    config_path = os.path.join(bundle, "config.json")
    with open(config_path) as handle:
        spec = json.load(handle)
    if os.path.isdir(PROC_DRIVER):
        hook = {"path": SELF, "args": ["nvidia-container-runtime", "proc-driver-hook"]}
        spec.setdefault("hooks", {}).setdefault("createContainer", []).append(hook)
    wanted = visible_devices(spec.get("process", {}).get("env"))
    if wanted is None:
        write_spec(config_path, spec)
        log("create %s: no NVIDIA_VISIBLE_DEVICES, nothing injected" % container_id)
        return
    with open(INVENTORY) as handle:
        inventory = json.load(handle)
    chosen = select(inventory.get("devices", []), wanted)
    restricted = dict(inventory, devices=chosen)
    os.makedirs(PER_CONTAINER, exist_ok=True)
    own = os.path.join(PER_CONTAINER, container_id + ".json")
    with open(own, "w") as handle:
        json.dump(restricted, handle, indent=1)
    mounts = spec.setdefault("mounts", [])
    for path in BINDS:
        mounts.append({"destination": path, "type": "bind", "source": path, "options": ["rbind", "ro", "nosuid"]})
    mounts.append({"destination": INVENTORY, "type": "bind", "source": own, "options": ["rbind", "ro", "nosuid"]})
    # Real NVML asks the loaded kernel module for its version at init (through /dev/nvidiactl); the fake asks
    # the folder that stands for it, so the container sees it where the inventory names it. No folder: no
    # module loaded, and NVML in the container fails as on the node.
    module = inventory.get("kernel_module")
    if module and os.path.isdir(module):
        mounts.append({"destination": module, "type": "bind", "source": module, "options": ["rbind", "ro", "nosuid"]})
    paths = ["/dev/nvidia%d" % device.get("minor_number", i) for i, device in enumerate(chosen)]
    paths += list(CONTROL_DEVICES)
    linux = spec.setdefault("linux", {})
    linux_devices = linux.setdefault("devices", [])
    allow = linux.setdefault("resources", {}).setdefault("devices", [])
    for path in paths:
        entry = device_entry(path)
        linux_devices.append(entry)
        allow.append({"allow": True, "type": "c", "major": entry["major"], "minor": entry["minor"], "access": "rwm"})
    write_spec(config_path, spec)
    log("create %s: NVIDIA_VISIBLE_DEVICES=%s -> %s" % (container_id, ",".join(wanted), " ".join(paths)))


def proc_driver_hook(state):
    """runc's createContainer hook: in the container's mount namespace, before pivot_root, so the node's
    files are still reachable. Binds the driver's /proc/driver entries over the container's, read-only."""
    with open(os.path.join(state["bundle"], "config.json")) as handle:
        root = json.load(handle)["root"]["path"]
    target = os.path.join(state["bundle"], root, "proc", "driver")
    subprocess.run(["/bin/mount", "--bind", "-o", "ro", PROC_DRIVER, target], check=True)
    log("hook %s: %s over %s" % (state.get("id"), PROC_DRIVER, target))


def main(argv):
    if argv == ["proc-driver-hook"]:
        try:
            proc_driver_hook(json.load(sys.stdin))
        except (OSError, ValueError, KeyError, subprocess.CalledProcessError) as err:
            log("hook: failed: %s" % err)
            sys.stderr.write("nvidia-container-runtime hook: %s\n" % err)
            return 1
        return 0
    log("runc %s" % " ".join(argv))
    found = create_args(argv)
    if found:
        try:
            inject(*found)
        except (OSError, ValueError) as err:
            # the real runtime refuses to create the container when injection fails
            log("create %s: failed: %s" % (found[1], err))
            sys.stderr.write("nvidia-container-runtime: %s\n" % err)
            return 1
    os.execv(RUNC, [RUNC] + argv)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
