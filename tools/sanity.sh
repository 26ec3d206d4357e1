#!/usr/bin/env bash
# `make sanity`: ansible-test sanity in the built collection, offline-safe bootstrap.
#   1. ansible-core from .venv (constraints.txt, Python 3.11)
#   2. the newest ansible-core from .venv-latest (constraints-latest.txt), where a
#      Python >= 3.12 exists; otherwise says it was skipped.
set -euo pipefail
# shellcheck source=tools/common.sh
. "$(dirname "$0")/common.sh"

[ -d "$COLLECTION_DIR/.git" ] || die "no $COLLECTION_DIR: run make build"

# ansible-test fetches get-pip from a server we cannot reach unless a cached script is
# there: recreate the stand-in and its pip wheel each run (CI may start with an empty HOME).
offline_get_pip() {
    local venv="$1" version wheel cache="$HOME/.ansible/test/cache"
    version="$(ansible_test_pip_version "$venv")"
    wheel="$CACHE/wheels/pip-$version-py3-none-any.whl"
    [ -f "$wheel" ] || die "no pip $version wheel in $CACHE/wheels: run make bootstrap"
    mkdir -p "$cache"
    rm -f "$cache/get_pip_${version//./_}.py.download"
    cp "$wheel" "$cache/"
    cp "$ROOT/tools/get_pip_offline.py" "$cache/get_pip_${version//./_}.py"
}

run_sanity() {
    local venv="$1" pyver
    pyver="$("$venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    offline_get_pip "$venv"
    log "ansible-test sanity --python $pyver ($("$venv/bin/ansible" --version 2>/dev/null | sed -n 1p))"
    (
        cd "$COLLECTION_DIR"
        export PATH="$venv/bin:$PATH"
        ansible-test sanity --color no --python "$pyver"
    )
}

run_sanity "$VENV"

if [ -x "$VENV_LATEST/bin/ansible-test" ]; then
    run_sanity "$VENV_LATEST"
else
    log "sanity on newest ansible-core: skipped (no Python >= 3.12)"
fi
