#!/usr/bin/env bash
# `make go-build`: the lab's real components (Kubernetes, etcd, the NVIDIA device plugin and GFD, NFD,
# the NVIDIA Container Toolkit) built from their Go modules at the versions lab/go/*/go.mod pin, into
# .cache/bin/<program>-<version>.
# A program already there is not built again; Go's own build and module caches (~/.cache/go-build,
# ~/go/pkg/mod) make a rebuild after a version change cheap.
set -euo pipefail
# shellcheck source=tools/common.sh
. "$(dirname "$0")/common.sh"

command -v go >/dev/null 2>&1 || die "no go command: the lab builds its components with Go (Go 1.26 or newer)"
log "$(go version)"
"$VENV/bin/python" "$ROOT/lab/go/gobuild.py" build
