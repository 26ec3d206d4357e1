#!/usr/bin/env bash
# The lab spike: one systemd podman "node" running containerd 1.6; a host-network CRI pod
# (pause sandbox + busybox container) runs once with the runtime handler `nvidia` (whose
# BinaryName is a logging stand-in that execs runc) and once with `runc`. Checks the
# output, that the stand-in ran only for `nvidia`, and that nothing is left behind.
#
# Knobs for experiments (defaults are the settings that work):
#   LAB_CGROUPNS=private|host      podman --cgroupns
#   LAB_RESTRICT_OOM=true|false    CRI restrict_oom_score_adj
#   LAB_SYSTEMD_CGROUP=true|false  SystemdCgroup on both runtimes
#   LAB_CGROUP_PARENT=kubepods.slice  sandbox cgroup_parent
#   LAB_VOLUME=true|false          /var/lib/containerd on a podman volume (false: on the node's overlay root)
set -euo pipefail
# shellcheck source=lab/podman-env.sh
. "$(dirname "$0")/podman-env.sh"

NAME="${LAB_NAME:-gpuready-lab-spike}"
VOLUME="$NAME-containerd"
HOSTNAME_="gpu-node-spike"
CGROUPNS="${LAB_CGROUPNS:-private}"
RESTRICT_OOM="${LAB_RESTRICT_OOM:-true}"
SYSTEMD_CGROUP="${LAB_SYSTEMD_CGROUP:-true}"
CGROUP_PARENT="${LAB_CGROUP_PARENT:-kubepods.slice}"
USE_VOLUME="${LAB_VOLUME:-true}"
STANDIN=/usr/local/bin/nvidia-container-runtime-standin
STANDIN_LOG=/var/log/nvidia-container-runtime-standin.log
PAUSE_REF="$(sed -n 1p "$LAB_ARTIFACTS/image-refs" 2>/dev/null || true)"
WORKLOAD_REF="$(sed -n 2p "$LAB_ARTIFACTS/image-refs" 2>/dev/null || true)"

FAILED=0
check() { # check DESCRIPTION COMMAND...
    local what="$1"
    shift
    if "$@"; then
        printf '  ok    %s\n' "$what"
    else
        printf '  FAIL  %s\n' "$what"
        FAILED=$((FAILED + 1))
    fi
}
node() { podman exec "$NAME" "$@"; }
node_i() { podman exec -i "$NAME" "$@"; }

# Everything here is ours: remove a node/volume left by an interrupted earlier run.
remove_node() {
    if podman container exists "$NAME"; then
        podman stop -t 20 "$NAME" >/dev/null 2>&1 || true
        podman rm -f "$NAME" >/dev/null 2>&1 || true
    fi
    if podman volume exists "$VOLUME"; then
        podman volume rm -f "$VOLUME" >/dev/null
    fi
}

iptables_rules() {
    command -v iptables-save >/dev/null 2>&1 || return 0
    { iptables-save 2>/dev/null || true; } | { grep -v '^#' || true; } | sed 's/\[[0-9:]*\]//' | sort
}

T0="$(lab_now)"
bash "$LAB_DIR/build-image.sh" 2>&1 | grep -v "^WARNING: Location 'file:" | sed 's/^/  [build] /'
T_BUILD="$(lab_since "$T0")"
[ -n "$PAUSE_REF" ] || PAUSE_REF="$(sed -n 1p "$LAB_ARTIFACTS/image-refs")"
[ -n "$WORKLOAD_REF" ] || WORKLOAD_REF="$(sed -n 2p "$LAB_ARTIFACTS/image-refs")"

remove_node
IPT_BEFORE="$(iptables_rules)"
ZOMBIES_BEFORE="$(ps -eo pid=,stat=,comm= | awk '$2 ~ /^Z/ && $3 == "conmon" { print $1 }' | sort)"

lab_log "settings: cgroupns=$CGROUPNS volume=$USE_VOLUME restrict_oom_score_adj=$RESTRICT_OOM SystemdCgroup=$SYSTEMD_CGROUP cgroup_parent=$CGROUP_PARENT"
# ------------------------------------------------------------------ node boot
T0="$(lab_now)"
VOLUME_ARGS=()
if [ "$USE_VOLUME" = true ]; then
    podman volume create "$VOLUME" >/dev/null
    VOLUME_ARGS=(-v "$VOLUME:/var/lib/containerd")
fi
CID="$(podman run -d --name "$NAME" --hostname "$HOSTNAME_" \
    --privileged --systemd=always --cgroupns="$CGROUPNS" --network host \
    "${VOLUME_ARGS[@]}" -v "$LAB_ARTIFACTS:/opt/lab:ro" \
    "$LAB_NODE_IMAGE" /sbin/init)"
NODE_PID="$(podman inspect --format '{{ .State.Pid }}' "$NAME")"
NODE_PIDNS="$(readlink "/proc/$NODE_PID/ns/pid")"
lab_log "node $NAME started (${CID:0:12}, pid $NODE_PID, $NODE_PIDNS)"

state=""
for _ in $(seq 1 240); do
    state="$(node systemctl is-system-running 2>/dev/null || true)"
    case "$state" in running | degraded) break ;; esac
    sleep 0.25
done
T_BOOT="$(lab_since "$T0")"
lab_log "node boot: is-system-running=$state after $T_BOOT s"
failed_units="$(node systemctl list-units --failed --no-legend --plain 2>/dev/null || true)"
[ -z "$failed_units" ] || printf '  failed units:\n%s\n' "$failed_units" | sed 's/^/    /'
check "node systemd is running or degraded (got: ${state:-nothing})" \
    test "$state" = running -o "$state" = degraded

# ------------------------------------------------------------------ containerd config
T0="$(lab_now)"
node_i sh -c "cat > $STANDIN && chmod 0755 $STANDIN" <<SH
#!/bin/sh
# Stand-in for nvidia-container-runtime: records the call, then is plain runc.
echo "\$(date +%s.%N) \$*" >> $STANDIN_LOG
exec /usr/sbin/runc "\$@"
SH
node_i sh -c 'cat > /etc/containerd/config.toml' <<TOML
# Written by lab/spike.sh
version = 2

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_REF"
  restrict_oom_score_adj = $RESTRICT_OOM

  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = $SYSTEMD_CGROUP

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
        BinaryName = "$STANDIN"
        SystemdCgroup = $SYSTEMD_CGROUP

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
TOML
node systemctl restart containerd
cri_ok=""
for _ in $(seq 1 80); do
    if node ctr plugins ls 2>/dev/null | grep -Eq 'io\.containerd\.grpc\.v1 +cri +.* ok'; then
        cri_ok=1
        break
    fi
    sleep 0.25
done
T_CTRD="$(lab_since "$T0")"
lab_log "containerd restarted with the lab config in $T_CTRD s"
check "containerd active, CRI plugin ok" test -n "$cri_ok" -a "$(node systemctl is-active containerd || true)" = active

T0="$(lab_now)"
node ctr -n k8s.io images import /opt/lab/pause.oci.tar >/dev/null
node ctr -n k8s.io images import /opt/lab/workload.oci.tar >/dev/null
T_IMPORT="$(lab_since "$T0")"
lab_log "images imported in $T_IMPORT s"
CRI=(env PYTHONPATH=/opt/lab/pylib python3 /opt/lab/cri.py)
images="$(node "${CRI[@]}" images)"
check "CRI sees $PAUSE_REF" grep -qxF "$PAUSE_REF" <<<"$images"
check "CRI sees $WORKLOAD_REF" grep -qxF "$WORKLOAD_REF" <<<"$images"
info="$(node "${CRI[@]}" info)"
nvidia_bin="$(python3 -c 'import json,sys; c=json.load(sys.stdin)["config"]["containerd"]["runtimes"]; print(c.get("nvidia",{}).get("options",{}).get("BinaryName",""))' <<<"$info")"
check "CRI config: runtimes.nvidia BinaryName = $STANDIN" test "$nvidia_bin" = "$STANDIN"

# ------------------------------------------------------------------ pods
standin_calls() { node sh -c "test -f $STANDIN_LOG && wc -l < $STANDIN_LOG || echo 0"; }
run_pod() { # run_pod HANDLER -> sets REPORT, RC
    local handler="$1"
    RC=0
    REPORT="$(node "${CRI[@]}" run --handler "$handler" --name "spike-$handler" --image "$WORKLOAD_REF" \
        --cgroup-parent "$CGROUP_PARENT" --mount /opt/lab/hello-dynamic:/opt/hello -- \
        /bin/sh -c "echo hello-from-handler-$handler; /opt/hello; grep -o 'kubepods.slice[^ ]*' /proc/self/cgroup | head -n1" 2>&1)" || RC=$?
    printf '  %s\n' "$REPORT"
}
field() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1]).get(sys.argv[1], ""))' "$1" <<<"$REPORT" 2>/dev/null || true; }

declare -A T_POD
for handler in nvidia runc; do
    before="$(standin_calls)"
    lab_log "pod with runtime handler '$handler'"
    run_pod "$handler"
    after="$(standin_calls)"
    T_POD[$handler]="$(field t_total_s)"
    output="$(field output)"
    check "$handler: container exited 0 (rc $RC, state $(field state), exit $(field exit_code))" test "$RC" -eq 0
    check "$handler: output has hello-from-handler-$handler" grep -q "hello-from-handler-$handler" <<<"$output"
    check "$handler: dynamically linked binary ran (image loader + libc)" grep -q hello-from-dynamic-binary <<<"$output"
    check "$handler: container cgroup under $CGROUP_PARENT" grep -q "^$CGROUP_PARENT" <<<"$(sed -n 3p <<<"$output")"
    if [ "$handler" = nvidia ]; then
        check "nvidia: stand-in ran ($before -> $after calls)" test "$after" -gt "$before"
        check "nvidia: stand-in saw 'create'" node grep -q ' create ' "$STANDIN_LOG"
        printf '  stand-in calls by runc command: %s\n' "$(node cat "$STANDIN_LOG" 2>/dev/null |
            grep -oE ' (create|start|state|kill|delete|exec|pause|resume|update|events|ps|features) ' |
            sort | uniq -c | awk '{ printf "%s%s=%s", sep, $2, $1; sep = " " }')"
    else
        check "runc: stand-in did not run ($before -> $after calls)" test "$after" -eq "$before"
    fi
done
check "no pod sandbox left in the node" test "$(node "${CRI[@]}" pods)" = "[]"
if [ "$FAILED" -gt 0 ]; then
    lab_log "containerd log (last 20 lines):"
    node journalctl -u containerd --no-pager -n 20 | sed 's/^/    /' || true
fi

# ------------------------------------------------------------------ teardown
T0="$(lab_now)"
podman stop -t 30 "$NAME" >/dev/null
podman rm "$NAME" >/dev/null
if [ "$USE_VOLUME" = true ]; then
    podman volume rm "$VOLUME" >/dev/null
fi
T_DOWN="$(lab_since "$T0")"
lab_log "node stopped and removed in $T_DOWN s"

check "no container $NAME" test -z "$(podman ps -a --filter "name=^$NAME\$" --format '{{.ID}}')"
check "no volume $VOLUME" test -z "$(podman volume ls --filter "name=$VOLUME" --format '{{.Name}}')"
left_pids=""
for ns in /proc/[0-9]*/ns/pid; do
    [ "$(readlink "$ns" 2>/dev/null)" = "$NODE_PIDNS" ] && left_pids+=" $(cut -d/ -f3 <<<"$ns")"
done
check "no process left in the node's PID namespace${left_pids:+ (left:$left_pids)}" test -z "$left_pids"
conmons="$(pgrep -a conmon | grep -F "$CID" || true)"
check "no conmon for the node${conmons:+ ($conmons)}" test -z "$conmons"
# conmon double-forks, so the conmons of the node and of each `podman exec` end up as
# children of this machine's PID 1 (not a real init), which reaps them after 1-2 s.
zombie_conmons() { ps -eo pid=,stat=,comm= | awk '$2 ~ /^Z/ && $3 == "conmon" { print $1 }' | sort; }
new_zombies=""
for _ in $(seq 1 60); do
    new_zombies="$(comm -13 <(printf '%s\n' "$ZOMBIES_BEFORE") <(zombie_conmons) | xargs)"
    [ -z "$new_zombies" ] && break
    sleep 0.25
done
check "no defunct conmon left after 15 s${new_zombies:+ (pids: $new_zombies)}" test -z "$new_zombies"
check "no mount of the node left" test -z "$(grep -F "$CID" /proc/self/mountinfo || true)"
check "no cgroup of the node left" test -z "$(find /sys/fs/cgroup -maxdepth 4 -name "*$CID*" 2>/dev/null | head -n1)"
check "iptables rules unchanged (host network: no netavark rules)" test "$(iptables_rules)" = "$IPT_BEFORE"

printf '\ntimings (s): build-image (cached check) %s, node boot %s, containerd restart %s, image import %s, pod nvidia %s, pod runc %s, teardown %s\n' \
    "$T_BUILD" "$T_BOOT" "$T_CTRD" "$T_IMPORT" "${T_POD[nvidia]:-?}" "${T_POD[runc]:-?}" "$T_DOWN"
if [ "$FAILED" -gt 0 ]; then
    printf 'spike: %d check(s) FAILED\n' "$FAILED"
    exit 1
fi
printf 'spike: all checks passed\n'
