#!/usr/bin/env bash
# Usage: tools/stage.sh NAME COMMAND [ARG...]
# Runs one stage of `make test` and prints its wall time; keeps the command's exit code.
set -uo pipefail

name="$1"
shift
start="$(date +%s)"
printf '==> stage %s: start\n' "$name"
"$@"
rc=$?
secs=$(( $(date +%s) - start ))
if [ "$rc" -eq 0 ]; then
    printf '==> stage %s: %ss\n' "$name" "$secs"
else
    printf '==> stage %s: FAILED (exit %s) after %ss\n' "$name" "$rc" "$secs"
fi
exit "$rc"
