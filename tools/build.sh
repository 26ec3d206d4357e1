#!/usr/bin/env bash
# `make build`: a fresh copy of the git-tracked and untracked-not-ignored files in
# .build/ansible_collections/gpuready/nvidia (ansible-test needs that path and a git
# repository), plus copies of the dependency collections (galaxy.yml `dependencies`)
# from the ansible bundle in .venv, so that ansible-test finds them beside ours.
set -euo pipefail
# shellcheck source=tools/common.sh
. "$(dirname "$0")/common.sh"

[ -x "$VENV/bin/python" ] || die "no $VENV: run make bootstrap"

rm -rf "$BUILD_ROOT"
mkdir -p "$COLLECTION_DIR"

cd "$ROOT"
git ls-files -z -co --exclude-standard |
    while IFS= read -r -d '' f; do
        # tracked files deleted from the work tree are still listed by -c
        if [ -e "$f" ] || [ -L "$f" ]; then
            printf '%s\0' "$f"
        fi
    done |
    tar --null --no-recursion -T - -cf - | tar -xf - -C "$COLLECTION_DIR"

(cd "$COLLECTION_DIR" && git init -q && git add -A)
log "collection copy: $COLLECTION_DIR ($(cd "$COLLECTION_DIR" && git ls-files | wc -l) files)"

"$VENV/bin/python" - "$ROOT/galaxy.yml" <<'PY' |
import json
import os
import sys
import sysconfig

import yaml

site = sysconfig.get_paths()["purelib"]
with open(sys.argv[1], encoding="utf-8") as f:
    deps = yaml.safe_load(f).get("dependencies") or {}
for name in deps:
    path = os.path.join(site, "ansible_collections", *name.split("."))
    try:
        with open(os.path.join(path, "MANIFEST.json"), encoding="utf-8") as f:
            version = json.load(f)["collection_info"]["version"]
    except OSError:
        version = "MISSING"
    print(name, version, path)
PY
    while read -r dep version src; do
        [ "$version" != MISSING ] || die "dependency collection $dep not found in the ansible bundle ($src)"
        ns="${dep%%.*}"
        mkdir -p "$BUILD_ROOT/ansible_collections/$ns"
        cp -a "$src" "$BUILD_ROOT/ansible_collections/$ns/"
        log "dependency $dep $version: copied from the ansible bundle"
    done
