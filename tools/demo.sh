#!/usr/bin/env bash
# make demo: the README's main command. The lab (reused when it is already up), then playbooks/site.yml
# against it, ending with validation's per-node table. The lab's nodes reach no package index, so, as an
# air-gapped site would, they get the Python wheels and a signed toolkit mirror from this machine
# (tests/offline_wheels.py, tests/apt_repo.py; both cached under .cache/demo): those -e are the demo's
# air-gap sources. What the lab itself is comes from it, as for any playbook run against it: the inventory
# sets where the nodes' fake sysfs and DMI name are (gpuready_sysfs_root, gpuready_dmi_product_file), and
# the Kubernetes tasks read the exported KUBECONFIG.
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/test-env.sh >/dev/null

if ! .venv/bin/python lab/lab.py env >/dev/null 2>&1; then
    .venv/bin/python lab/lab.py up
fi
eval "$(.venv/bin/python lab/lab.py env)"

demo=.cache/demo
mkdir -p "$demo"
[ -d "$demo/wheels" ] || .venv/bin/python tests/offline_wheels.py "$demo/wheels"
[ -f "$demo/apt-repo/repo/InRelease" ] || .venv/bin/python tests/apt_repo.py build "$demo/apt-repo"

rm -f "$demo/apt-repo.port"
# A fixed port: the mirror's URL lands in the nodes' apt sources, and a new one would change them every run.
# It listens where the nodes reach this machine (GPUREADY_LAB_HOST_ADDRESS).
.venv/bin/python tests/apt_repo.py serve "$demo/apt-repo" --host "$GPUREADY_LAB_HOST_ADDRESS" \
    --port "${DEMO_MIRROR_PORT:-38471}" --port-file "$demo/apt-repo.port" >"$demo/apt-repo.log" 2>&1 &
mirror=$!
trap 'kill "$mirror" 2>/dev/null || true' EXIT
for _ in $(seq 50); do [ -s "$demo/apt-repo.port" ] && break; sleep 0.2; done

ansible-playbook -i "$GPUREADY_LAB_INVENTORY" gpuready.nvidia.site \
    -e node_python_wheels_dir="$PWD/$demo/wheels" -e '{"node_python_update_cache": false}' \
    -e container_toolkit_apt_repo_url="http://$GPUREADY_LAB_HOST_ADDRESS:$(cat "$demo/apt-repo.port")/repo" \
    -e container_toolkit_gpg_key="$PWD/$demo/apt-repo/gpgkey.asc" \
    -e validate_report_path="$PWD/$demo/validation.json" \
    "$@"
