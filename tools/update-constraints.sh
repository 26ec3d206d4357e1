#!/usr/bin/env bash
# Regenerates constraints.txt (Python 3.11, the oldest ansible-core line we test) and
# constraints-latest.txt (newest ansible-core, Python >= 3.12) by resolving the
# requirements afresh in throwaway venvs. Run it on purpose, review the diff, commit.
#   tools/update-constraints.sh
set -euo pipefail
# shellcheck source=tools/common.sh
. "$(dirname "$0")/common.sh"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

header() {
    cat <<HEADER
# Exact versions for \`make test\` ($1).
# Updated on purpose only: regenerate with tools/update-constraints.sh, review the diff, commit.
# Resolved with $("$2" --version) on $(date -u +%Y-%m-%d).
HEADER
}

log "resolving constraints.txt with $PYTHON_OLDEST"
"$PYTHON_OLDEST" -m venv "$tmp/oldest"
"$tmp/oldest/bin/python" -m pip install -q -U pip
"$tmp/oldest/bin/python" -m pip install -q -r "$ROOT/requirements-test.txt"
{
    header "requirements-test.txt on Python 3.11" "$PYTHON_OLDEST"
    "$tmp/oldest/bin/python" -m pip freeze --all --exclude setuptools --exclude wheel
} >"$ROOT/constraints.txt"

py="$(find_python_latest)"
if [ -z "$py" ]; then
    log "no Python >= 3.12: constraints-latest.txt left as it is"
else
    log "resolving constraints-latest.txt with $py"
    "$py" -m venv "$tmp/latest"
    "$tmp/latest/bin/python" -m pip install -q -U pip
    "$tmp/latest/bin/python" -m pip install -q ansible-core
    {
        header "newest ansible-core, sanity only" "$py"
        "$tmp/latest/bin/python" -m pip freeze --all --exclude setuptools --exclude wheel
    } >"$ROOT/constraints-latest.txt"
fi
log "done: git diff constraints.txt constraints-latest.txt"
