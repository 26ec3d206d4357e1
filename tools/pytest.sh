#!/usr/bin/env bash
# `make units` / `make integration`: pytest in the built collection with tools/test-env.sh.
#   tools/pytest.sh units | integration | soak | tomlkit-oldest VERSION
# pytest's own exit code is kept: 5 ("no tests collected") fails the stage.
set -euo pipefail
# shellcheck source=tools/test-env.sh
. "$(dirname "$0")/test-env.sh"

[ -d "$COLLECTION_DIR" ] || die "no $COLLECTION_DIR: run make build"
cd "$COLLECTION_DIR"
PYTEST=(python -m pytest -p no:cacheprovider --durations=10 -ra)

case "${1:-}" in
    units)
        exec "${PYTEST[@]}" tests/unit
        ;;
    integration)
        exec "${PYTEST[@]}" tests/integration
        ;;
    soak)
        # The property tests with 1,500 examples each (tests/conftest.py), and the counts to show it.
        GPUREADY_HYPOTHESIS_PROFILE=soak exec "${PYTEST[@]}" --hypothesis-show-statistics \
            tests/unit/module_utils/test_containerd_config_properties.py
        ;;
    tomlkit-oldest)
        version="${2:?tomlkit version}"
        grep -qx "tomlkit>=$version" "$ROOT/requirements.txt" ||
            die "requirements.txt does not say tomlkit>=$version (TOMLKIT_OLDEST): keep the two equal"
        target="$CACHE/tomlkit-$version"
        if [ ! -f "$target/.complete" ]; then
            rm -rf "$target"
            python -m pip install -q --target "$target" "tomlkit==$version"
            touch "$target/.complete"
        fi
        export PYTHONPATH="$target:$PYTHONPATH"
        imported="$(python -c 'import tomlkit; print(tomlkit.__version__, "from", tomlkit.__file__)')"
        log "tomlkit imported: $imported"
        case "$imported" in
            "$version from $target/"*) ;;
            *) die "expected tomlkit $version from $target" ;;
        esac
        exec "${PYTEST[@]}" tests/unit/module_utils
        ;;
    *)
        die "usage: $0 units | integration | soak | tomlkit-oldest VERSION"
        ;;
esac
