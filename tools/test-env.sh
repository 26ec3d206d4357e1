# shellcheck shell=bash
# The environment of every pytest run (make units / make integration). Other scripts and
# developers source it:   . tools/test-env.sh   (then cd "$COLLECTION_DIR"; python -m pytest ...)
#
#   PATH                      starts with .venv/bin
#   PYTHONPATH                .build (absolute), so ansible_collections.gpuready.nvidia.* imports
#   ANSIBLE_COLLECTIONS_PATH  .build : the ansible bundle's site-packages (kubernetes.core & co.)
#   GPUREADY_SHARED_DIR       ../shared of the repo root, only where it exists
#   GPUREADY_CONTAINERD_1_6   /usr/bin/containerd (Debian 12)
#   GPUREADY_CONTAINERD_1_7   .cache/containerd/1.7/usr/bin/containerd (Debian trixie .deb)
#   GPUREADY_CONTAINERD_2     .cache/containerd/2/usr/bin/containerd (Debian sid .deb)
#   LAB_CACHE                 .cache/lab of the repo root (the lab's images, podman storage, run state)
#   GPUREADY_GO_BIN_DIR       .cache/bin of the repo root (make go-build: the lab's Go programs)
#   GPUREADY_REQUIRE_REAL=1   tests fail instead of skipping when a daemon or tool is missing

# shellcheck source=tools/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

_gpuready_site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

export PATH="$VENV/bin:$PATH"
export VIRTUAL_ENV="$VENV"
export PYTHONPATH="$BUILD_ROOT${PYTHONPATH:+:$PYTHONPATH}"
export ANSIBLE_COLLECTIONS_PATH="$BUILD_ROOT:$_gpuready_site"
unset _gpuready_site

if [ -d "$ROOT/../shared" ]; then
    GPUREADY_SHARED_DIR="$(cd "$ROOT/../shared" && pwd)"
    export GPUREADY_SHARED_DIR
else
    unset GPUREADY_SHARED_DIR
fi

export GPUREADY_CONTAINERD_1_6=/usr/bin/containerd
export GPUREADY_CONTAINERD_1_7="$CACHE/containerd/1.7/usr/bin/containerd"
export GPUREADY_CONTAINERD_2="$CACHE/containerd/2/usr/bin/containerd"
export LAB_CACHE="$CACHE/lab"
export GPUREADY_GO_BIN_DIR="$CACHE/bin"
export GPUREADY_REQUIRE_REAL=1
