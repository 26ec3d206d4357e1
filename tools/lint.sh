#!/usr/bin/env bash
# `make lint`: ansible-lint (production profile, offline, strict) in the built collection.
set -euo pipefail
# shellcheck source=tools/test-env.sh
. "$(dirname "$0")/test-env.sh"

[ -d "$COLLECTION_DIR/.git" ] || die "no $COLLECTION_DIR: run make build"
cd "$COLLECTION_DIR"
ansible-lint --nocolor --version
exec ansible-lint --nocolor --profile production --offline --strict
