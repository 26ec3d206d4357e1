#!/usr/bin/env bash
# `make bootstrap`: system packages, containerd 1.7 and 2.x binaries (private apt state,
# never installed system-wide), the pinned virtual environments and the pip wheel that
# the offline ansible-test bootstrap needs. Every step is skipped when already done.
set -euo pipefail
# shellcheck source=tools/common.sh
. "$(dirname "$0")/common.sh"

# podman + debootstrap: the lab (lab/README.md), whose nodes the integration tests start;
# iproute2: the network namespace of its real control plane (lab/control_plane.py)
APT_PACKAGES=(ca-certificates containerd runc gcc libc6-dev git shellcheck podman debootstrap iproute2)

apt_system_packages() {
    local pkg missing=()
    for pkg in "${APT_PACKAGES[@]}"; do
        if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
            missing+=("$pkg")
        fi
    done
    if [ "${#missing[@]}" -eq 0 ]; then
        log "apt: all present (${APT_PACKAGES[*]})"
        return 0
    fi
    [ "$(id -u)" -eq 0 ] || die "apt packages missing (${missing[*]}) and not root: install them first"
    log "apt: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    local aptlog="$CACHE/apt-install.log"
    if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$aptlog" 2>&1; then
        cat "$aptlog" >&2
        die "apt-get install ${missing[*]} failed"
    fi
    log "apt: installed ${missing[*]} (log: $aptlog)"
}

# The Debian mirror the system's own sources use (first bookworm entry), so the private
# apt state below asks the same host. Falls back to deb.debian.org.
system_debian_mirror() {
    local f uri=""
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        uri="$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/ && $i ~ /:\/\//) { if ($(i + 1) ~ /^bookworm(-updates)?$/) { print $i; exit } } }' "$f")"
        [ -n "$uri" ] && break
    done
    if [ -z "$uri" ]; then
        for f in /etc/apt/sources.list.d/*.sources; do
            [ -f "$f" ] || continue
            uri="$(awk -v RS= '/(^|\n)Suites:[^\n]*bookworm([ \n]|$)/ && !/(^|\n)Enabled: *no/ { if (match($0, /(^|\n)URIs: *[^ \n]+/)) { s = substr($0, RSTART, RLENGTH); sub(/^\n?URIs: */, "", s); print s; exit } }' "$f")"
            [ -n "$uri" ] && break
        done
    fi
    printf '%s\n' "${uri:-http://deb.debian.org/debian}"
}

# containerd from other Debian suites: trixie gives 1.7, sid gives 2.x.
containerd_extra() {
    local apt_dir="$CACHE/apt" mirror need=0 want suite dest bin ver deb reported
    local -a debs
    local -a apt_opts=(
        -o "Dir::Etc::SourceList=$apt_dir/etc/sources.list"
        -o "Dir::Etc::SourceParts=$apt_dir/etc/sources.list.d"
        -o "Dir::Etc::Preferences=$apt_dir/etc/preferences"
        -o "Dir::Etc::PreferencesParts=$apt_dir/etc/preferences.d"
        -o "Dir::State::Lists=$apt_dir/lists"
        -o "Dir::Cache=$apt_dir/cache"
        -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache="
        -o "APT::Sandbox::User=root"
        -o "Acquire::Languages=none"
    )
    for want in 1.7:trixie 2:sid; do
        bin="$CACHE/containerd/${want%%:*}/usr/bin/containerd"
        if ! { [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; }; then
            need=1
        fi
    done
    if [ "$need" -eq 1 ]; then
        mirror="$(system_debian_mirror)"
        log "containerd 1.7/2.x: private apt state in $apt_dir, mirror $mirror"
        mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/etc/sources.list.d" \
            "$apt_dir/etc/preferences.d" "$apt_dir/debs"
        printf 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s %s main\n' \
            "$mirror" trixie "$mirror" sid >"$apt_dir/etc/sources.list"
        apt-get "${apt_opts[@]}" update -qq
    fi
    for want in 1.7:trixie 2:sid; do
        ver="${want%%:*}"
        suite="${want#*:}"
        dest="$CACHE/containerd/$ver"
        bin="$dest/usr/bin/containerd"
        if ! { [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; }; then
            rm -rf "$dest" "$apt_dir/debs"/containerd_*.deb
            mkdir -p "$dest"
            (cd "$apt_dir/debs" && apt-get "${apt_opts[@]}" download "containerd/$suite") ||
                die "Debian $suite has no containerd package to download (wanted containerd $ver)"
            debs=("$apt_dir/debs"/containerd_*.deb)
            deb="${debs[0]}"
            dpkg-deb -x "$deb" "$dest"
            basename "$deb" >"$dest/SOURCE"
        fi
        [ -x "$bin" ] || die "no containerd binary at $bin"
        reported="$("$bin" --version)" || die "$bin does not run"
        case "$reported" in
            *" v$ver."* | *" $ver."*) ;;
            *) die "containerd from Debian $suite is not $ver.x: $reported" ;;
        esac
        log "containerd $ver ($suite, $(cat "$dest/SOURCE")): $reported"
    done
    log "containerd 1.6 (system): $(/usr/bin/containerd --version)"
}

venv_oldest() {
    local stamp want
    want="$(files_hash "$ROOT/constraints.txt" "$ROOT/requirements.txt" "$ROOT/requirements-test.txt")"
    stamp="$VENV/.gpuready-stamp"
    if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
        log "venv $VENV: up to date ($("$VENV/bin/ansible" --version 2>/dev/null | sed -n 1p))"
        return 0
    fi
    command -v "$PYTHON_OLDEST" >/dev/null 2>&1 || die "$PYTHON_OLDEST not found"
    log "venv $VENV: creating with $PYTHON_OLDEST"
    rm -rf "$VENV"
    "$PYTHON_OLDEST" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q -c "$ROOT/constraints.txt" pip
    "$VENV/bin/python" -m pip install -q -c "$ROOT/constraints.txt" -r "$ROOT/requirements-test.txt"
    "$VENV/bin/python" -m pip check
    printf '%s\n' "$want" >"$stamp"
    log "venv $VENV: $("$VENV/bin/ansible" --version 2>/dev/null | sed -n 1p)"
}

venv_latest() {
    local py stamp want
    py="$(find_python_latest)"
    if [ -z "$py" ]; then
        log "sanity on newest ansible-core: skipped (no Python >= 3.12)"
        rm -rf "$VENV_LATEST"
        return 0
    fi
    want="$(files_hash "$ROOT/constraints-latest.txt") $py"
    stamp="$VENV_LATEST/.gpuready-stamp"
    if [ -x "$VENV_LATEST/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
        log "venv $VENV_LATEST: up to date ($("$VENV_LATEST/bin/ansible" --version 2>/dev/null | sed -n 1p))"
        return 0
    fi
    log "venv $VENV_LATEST: creating with $py"
    rm -rf "$VENV_LATEST"
    "$py" -m venv "$VENV_LATEST"
    "$VENV_LATEST/bin/python" -m pip install -q -c "$ROOT/constraints-latest.txt" pip
    "$VENV_LATEST/bin/python" -m pip install -q -c "$ROOT/constraints-latest.txt" ansible-core
    "$VENV_LATEST/bin/python" -m pip check
    printf '%s\n' "$want" >"$stamp"
    log "venv $VENV_LATEST: $("$VENV_LATEST/bin/ansible" --version 2>/dev/null | sed -n 1p)"
}

# The pip wheel each ansible-test bootstraps its sanity venvs with (used by tools/sanity.sh).
pip_wheels_for_ansible_test() {
    local dir="$CACHE/wheels" venv version
    local -a have
    mkdir -p "$dir"
    for venv in "$VENV" "$VENV_LATEST"; do
        [ -x "$venv/bin/ansible-test" ] || continue
        version="$(ansible_test_pip_version "$venv")"
        have=("$dir"/pip-"$version"-py3-none-any.whl)
        if [ ! -f "${have[0]}" ]; then
            "$VENV/bin/python" -m pip download -q --no-deps --only-binary=:all: "pip==$version" -d "$dir"
        fi
        log "pip $version wheel for $(basename "$venv")'s ansible-test: present"
    done
}

mkdir -p "$CACHE"
apt_system_packages
containerd_extra
venv_oldest
venv_latest
pip_wheels_for_ansible_test
