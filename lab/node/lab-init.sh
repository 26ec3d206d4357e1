#!/bin/sh
# PID 1 of a lab node before systemd: give the node a name=systemd cgroup hierarchy of its own.
# On a cgroup v1 host a privileged container sees the host's whole name=systemd tree even in a
# private cgroup namespace, so its systemd would manage the host's root of that tree and, when any
# node stops, remove the other nodes' libpod cgroups (podman exec then fails). Binding the node's
# own folder over the hierarchy's mount point confines systemd to it, as kind does for its nodes.
set -eu
hierarchy=/sys/fs/cgroup/systemd
if [ -d "$hierarchy" ]; then
    # Our folder is the one whose cgroup.procs lists this process (PID 1 in our PID namespace).
    own=$(grep -lx 1 "$hierarchy"/*/*/cgroup.procs "$hierarchy"/*/cgroup.procs 2>/dev/null | head -n 1 || true)
    if [ -n "$own" ] && [ "$(dirname "$own")" != "$hierarchy" ]; then
        mount --bind "$(dirname "$own")" "$hierarchy"
    fi
fi
# The driver's /proc/driver entries (MIG's nvidia-caps/mig-minors), which its kernel modules would put into
# procfs: the node's own, for the nvidia runtime (containers get them from driver-procfs-runc).
if [ -d /var/lib/nvidia-fake/proc-driver ]; then
    mount -o bind,ro /var/lib/nvidia-fake/proc-driver /proc/driver
fi
exec /sbin/init "$@"
