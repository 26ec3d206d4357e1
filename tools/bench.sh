#!/usr/bin/env bash
# make bench: bench/bench.py in the built collection with tools/test-env.sh; the results go to the
# tree's bench/results (committed after a full run).   tools/bench.sh [--smoke] [NAME ...]
set -euo pipefail
# shellcheck source=tools/test-env.sh
. "$(dirname "$0")/test-env.sh"

[ -d "$COLLECTION_DIR" ] || die "no $COLLECTION_DIR: run make build"
cd "$COLLECTION_DIR"
exec python bench/bench.py --out "$ROOT/bench/results" "$@"
