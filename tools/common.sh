# shellcheck shell=bash
# Shared settings for the build scripts in tools/ (sourced, not run).
# shellcheck disable=SC2034  # the variables are used by the scripts that source this file

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="$ROOT/.cache"
VENV="$ROOT/.venv"
VENV_LATEST="$ROOT/.venv-latest"
BUILD_ROOT="$ROOT/.build"
COLLECTION_DIR="$BUILD_ROOT/ansible_collections/gpuready/nvidia"
PYTHON_OLDEST="${PYTHON_OLDEST:-python3.11}"
export LC_ALL="${LC_ALL:-C.UTF-8}"

log() {
    printf '==> %s\n' "$*"
}

die() {
    printf 'ERROR: %s\n' "$*" >&2
    exit 1
}

# Prints the newest Python >= 3.12 found on PATH or in ~/.pyenv/versions, or nothing.
# Each candidate must really start and have venv and ssl (a pyenv shim whose version
# is not selected fails here and is skipped).
find_python_latest() {
    local best="" best_ver=0 cand ver
    local -a cands=()
    for cand in python3.14 python3.13 python3.12; do
        if command -v "$cand" >/dev/null 2>&1; then
            cands+=("$(command -v "$cand")")
        fi
    done
    for cand in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/*/bin/python3.1[2-9]; do
        [ -x "$cand" ] && cands+=("$cand")
    done
    for cand in "${cands[@]}"; do
        ver="$("$cand" -c 'import sys, ssl, venv; v = sys.version_info; print(v[0] * 100 + v[1] if v >= (3, 12) else 0)' 2>/dev/null)" || continue
        if [ -n "$ver" ] && [ "$ver" -gt "$best_ver" ]; then
            best="$cand"
            best_ver="$ver"
        fi
    done
    [ -n "$best" ] && printf '%s\n' "$best"
    return 0
}

# Checksum of the given files (stamp for "is this venv up to date").
files_hash() {
    cat "$@" | sha256sum | cut -d' ' -f1
}

# The pip version that the ansible-test of the given venv bootstraps its sanity venvs with.
ansible_test_pip_version() {
    "$1/bin/python" - <<'PY'
import os
import re

import ansible_test

path = os.path.join(os.path.dirname(ansible_test.__file__), "_internal", "python_requirements.py")
with open(path, encoding="utf-8") as f:
    print(re.search(r"\bpip='([0-9.]+)'", f.read()).group(1))
PY
}
