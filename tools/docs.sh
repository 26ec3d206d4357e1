#!/usr/bin/env bash
# `make docs`: build the collection tarball (.cache/dist), install it offline into a
# scratch collections path and render `ansible-doc` for every plugin in the tarball.
set -euo pipefail
# shellcheck source=tools/test-env.sh
. "$(dirname "$0")/test-env.sh"

[ -d "$COLLECTION_DIR/.git" ] || die "no $COLLECTION_DIR: run make build"
dist="$CACHE/dist"
rm -rf "$dist"
mkdir -p "$dist"
(cd "$COLLECTION_DIR" && ansible-galaxy collection build --force --output-path "$dist")
tarballs=("$dist"/gpuready-nvidia-*.tar.gz)
tarball="${tarballs[0]}"
[ -f "$tarball" ] || die "ansible-galaxy collection build made no tarball in $dist"

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
site="${ANSIBLE_COLLECTIONS_PATH#*:}"
# Only the installed tarball and the bundle: .build must not be found through PYTHONPATH.
unset PYTHONPATH
export ANSIBLE_COLLECTIONS_PATH="$scratch:$site"
ansible-galaxy collection install --offline --no-deps "$tarball" -p "$scratch"
python "$ROOT/tools/check_docs.py" "$tarball" gpuready.nvidia "$scratch/ansible_collections/gpuready/nvidia"
