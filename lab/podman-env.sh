# shellcheck shell=bash
# Shared settings for every lab script (sourced, not run).
# One private podman configuration, always the same, so that podman's tmp_dir, runroot
# and graphroot never change between runs (mixing them made every attached
# `podman run` wait 20 s for conmon, see test-environment.md section 4).
# shellcheck disable=SC2034  # the variables are used by the scripts that source this file

LAB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LAB_ROOT="$(cd "$LAB_DIR/.." && pwd)"
LAB_CACHE="${LAB_CACHE:-$LAB_ROOT/.cache/lab}"
LAB_ARTIFACTS="$LAB_CACHE/artifacts"     # mounted read-only at /opt/lab inside a node
LAB_NODE_IMAGE="localhost/gpuready-lab-node:bookworm"
LAB_GPU_IMAGE="localhost/gpuready-lab-gpunode:bookworm"   # the node image + the GPU layer (lab.py)
LAB_SUITE=bookworm
export LC_ALL="${LC_ALL:-C.UTF-8}"

lab_log() { printf '==> [%(%H:%M:%S)T] %s\n' -1 "$*"; }
lab_die() { printf 'ERROR: %s\n' "$*" >&2; exit 1; }

# Seconds since the epoch, with milliseconds, for timings.
lab_now() { date +%s.%3N; }
lab_since() { awk -v a="$1" -v b="$(lab_now)" 'BEGIN { printf "%.1f", b - a }'; }

# podman's configuration: written once, then only rewritten when its content changes.
lab_write_if_changed() {
    local dest="$1" tmp
    tmp="$(mktemp)"
    cat >"$tmp"
    if cmp -s "$tmp" "$dest" 2>/dev/null; then
        rm -f "$tmp"
    else
        mv "$tmp" "$dest"
        chmod 0644 "$dest"
    fi
}

mkdir -p "$LAB_CACHE/etc" "$LAB_CACHE/containers/storage" "$LAB_CACHE/containers/run" \
    "$LAB_CACHE/containers/tmp" "$LAB_ARTIFACTS"

lab_write_if_changed "$LAB_CACHE/etc/containers.conf" <<CONF
# Written by lab/podman-env.sh
[containers]
# The hard limits here are nofile=20000 nproc=96363; podman's defaults exceed them
# ("error setting rlimit type 7").
default_ulimits = ["nofile=1024:20000", "nproc=4096:4096"]

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$LAB_CACHE/containers/events.log"
tmp_dir = "$LAB_CACHE/containers/tmp"
CONF

lab_write_if_changed "$LAB_CACHE/etc/storage.conf" <<CONF
# Written by lab/podman-env.sh
[storage]
driver = "overlay"
graphroot = "$LAB_CACHE/containers/storage"
runroot = "$LAB_CACHE/containers/run"
CONF

export CONTAINERS_CONF="$LAB_CACHE/etc/containers.conf"
export CONTAINERS_STORAGE_CONF="$LAB_CACHE/etc/storage.conf"

# apt-get install the given packages (by command name=package) when a command is missing.
lab_need_apt() {
    local pair cmd pkg missing=()
    for pair in "$@"; do
        cmd="${pair%%=*}"
        pkg="${pair#*=}"
        command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
    done
    [ "${#missing[@]}" -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || lab_die "missing ${missing[*]} and not root"
    lab_log "apt-get install ${missing[*]}"
    local t0
    t0="$(lab_now)"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >"$LAB_CACHE/apt-install.log" 2>&1 ||
        { cat "$LAB_CACHE/apt-install.log" >&2; lab_die "apt-get install ${missing[*]} failed"; }
    lab_log "installed ${missing[*]} in $(lab_since "$t0") s"
}

# The Debian mirror the system's own apt sources use (first deb.debian.org-like bookworm URI).
lab_debian_mirror() {
    local uri
    # shellcheck disable=SC2016  # $(REPO_URI) is apt's format syntax, not the shell's
    uri="$(apt-get indextargets --format '$(REPO_URI)' 'Codename: bookworm' 2>/dev/null | head -n1)"
    printf '%s\n' "${uri%/}"
}
