#!/usr/bin/env bash
# Builds what the lab needs, each piece cached under .cache/lab/ and rebuilt only when missing:
#   * the node image localhost/gpuready-lab-node:bookworm (debootstrap rootfs tarball,
#     `podman import`ed only when the image is missing or was built from another tarball),
#   * the GPU node image localhost/gpuready-lab-gpunode:bookworm: the node image plus the NVIDIA
#     Container Toolkit's packages at lab/go's pin (tests/apt_repo.py builds them from the real
#     binaries; dpkg installs them, their postinst writes the runtime's default config, in which only the
#     low-level runtime changes: driver-procfs-runc, the fake driver's /proc/driver in containers), the
#     driver's nvidia-smi stand-in (the fake NVML library differs per node: lab/lab.py installs it), the seed's
#     containerd config, the kubelet's config and unit (the binary is bind-mounted by lab/lab.py) and
#     the user `ops` (passwordless sudo); one `podman commit` layer, rebuilt when its inputs change,
#   * artifacts/ (mounted read-only at /opt/lab in a node): OCI archives of a pause image,
#     a busybox workload image (with the NVML probe; also named as a CUDA base image), the real
#     device plugin image and the real NFD image (from the binaries make go-build made), a
#     dynamically linked test binary and the CRI client (cri.py + grpcio/protobuf + code generated
#     from the CRI api.proto).
set -euo pipefail
# shellcheck source=lab/podman-env.sh
. "$(dirname "$0")/podman-env.sh"

# containernetworking-plugins, iptables, conntrack: pod networks (CNI bridge) and kube-proxy for the real kubelet
NODE_PACKAGES="systemd,systemd-sysv,dbus,containerd,runc,python3,iproute2,sudo,ca-certificates,procps,containernetworking-plugins,iptables,conntrack"
# Bump to force a new rootfs when the customisation below changes.
NODE_RECIPE=2
# Bump to force a new GPU layer when gpu_node_image changes.
GPU_RECIPE=2
PAUSE_REF="localhost/gpuready-lab/pause:1"
WORKLOAD_REF="localhost/gpuready-lab/workload:1"
# Names pods use; the lab has no registry, so these name images imported into every node.
WORKLOAD_REFS="$WORKLOAD_REF,nvcr.io/nvidia/cuda:12.2.0-base-ubuntu22.04"
LAB_PYTHON="${LAB_PYTHON:-python3}"   # lab.py passes its own (lab/go/gobuild.py runs with it)

T_START="$(lab_now)"
lab_need_apt podman=podman debootstrap=debootstrap gcc=gcc

# ---------------------------------------------------------------- node image
node_image() {
    local key tarball tmpdir mirror have t0
    key="$(printf '%s %s %s\n' "$LAB_SUITE" "$NODE_PACKAGES" "$NODE_RECIPE" | sha256sum | cut -c1-12)"
    tarball="$LAB_CACHE/node-$LAB_SUITE-$key.tar"
    if [ -s "$tarball" ]; then
        lab_log "node rootfs: cached $(basename "$tarball")"
    else
        mirror="$(lab_debian_mirror)"
        tmpdir="$LAB_CACHE/rootfs.tmp"
        rm -rf "$tmpdir"
        lab_log "node rootfs: debootstrap $LAB_SUITE from $mirror ($NODE_PACKAGES)"
        t0="$(lab_now)"
        debootstrap --variant=minbase --include="$NODE_PACKAGES" "$LAB_SUITE" "$tmpdir" "$mirror" \
            >"$LAB_CACHE/debootstrap.log" 2>&1 ||
            { tail -n 30 "$LAB_CACHE/debootstrap.log" >&2; lab_die "debootstrap failed (log: $LAB_CACHE/debootstrap.log)"; }
        lab_log "node rootfs: debootstrap took $(lab_since "$t0") s"
        # Customise: no apt caches, no machine-id (systemd makes one at boot), nothing
        # that needs real hardware or a console.
        rm -rf "$tmpdir"/var/cache/apt/archives/*.deb "$tmpdir"/var/lib/apt/lists/*
        : >"$tmpdir/etc/machine-id"
        rm -f "$tmpdir/var/lib/dbus/machine-id"
        ln -sf /dev/null "$tmpdir/etc/systemd/system/getty.target"
        ln -sf /dev/null "$tmpdir/etc/systemd/system/console-getty.service"
        ln -sf /dev/null "$tmpdir/etc/systemd/system/systemd-remount-fs.service"
        ln -sf /dev/null "$tmpdir/etc/systemd/system/sys-kernel-config.mount"
        ln -sf /dev/null "$tmpdir/etc/systemd/system/sys-kernel-debug.mount"
        ln -sf /dev/null "$tmpdir/etc/systemd/system/sys-kernel-tracing.mount"
        # containerd looks for CNI plugins in /opt/cni/bin; Debian installs them in /usr/lib/cni
        mkdir -p "$tmpdir/opt/cni"
        ln -sfn /usr/lib/cni "$tmpdir/opt/cni/bin"
        t0="$(lab_now)"
        tar -C "$tmpdir" --numeric-owner -cf "$tarball.tmp" .
        mv "$tarball.tmp" "$tarball"
        rm -rf "$tmpdir"
        lab_log "node rootfs: $(basename "$tarball") $(du -h "$tarball" | cut -f1), tar took $(lab_since "$t0") s"
    fi
    have="$(podman image inspect --format '{{ index .Config.Labels "gpuready.lab.rootfs" }}' "$LAB_NODE_IMAGE" 2>/dev/null || true)"
    if [ "$have" = "$key" ]; then
        lab_log "node image: $LAB_NODE_IMAGE present (rootfs $key)"
    else
        t0="$(lab_now)"
        podman rmi -f "$LAB_NODE_IMAGE" >/dev/null 2>&1 || true
        podman import --change 'CMD ["/sbin/init"]' --change "LABEL gpuready.lab.rootfs=$key" \
            "$tarball" "$LAB_NODE_IMAGE" >/dev/null
        lab_log "node image: imported $LAB_NODE_IMAGE in $(lab_since "$t0") s"
        # drop older tarballs
        find "$LAB_CACHE" -maxdepth 1 -name "node-$LAB_SUITE-*.tar" ! -name "$(basename "$tarball")" -delete
    fi
}

# ---------------------------------------------------------------- OCI images
oci_images() {
    local debs="$LAB_CACHE/debs" tree="$LAB_CACHE/trees" deb applet t0
    mkdir -p "$debs" "$tree"
    t0="$(lab_now)"
    # pause: a static binary that sleeps until SIGTERM
    if [ ! -s "$LAB_ARTIFACTS/pause.oci.tar" ] || [ "$LAB_DIR/src/pause.c" -nt "$LAB_ARTIFACTS/pause.oci.tar" ] ||
        [ "$LAB_DIR/oci_image.py" -nt "$LAB_ARTIFACTS/pause.oci.tar" ]; then
        rm -rf "$tree/pause" && mkdir -p "$tree/pause"
        gcc -static -O2 -Wall -Wextra -o "$tree/pause/pause" "$LAB_DIR/src/pause.c"
        strip "$tree/pause/pause"
        python3 "$LAB_DIR/oci_image.py" "$tree/pause" "$LAB_ARTIFACTS/pause.oci.tar" "$PAUSE_REF" --entrypoint /pause
    fi
    # workload: static busybox + the host's dynamic loader and libc
    if [ ! -s "$LAB_ARTIFACTS/workload.oci.tar" ] || [ "$LAB_DIR/oci_image.py" -nt "$LAB_ARTIFACTS/workload.oci.tar" ] ||
        [ "$LAB_DIR/build-image.sh" -nt "$LAB_ARTIFACTS/workload.oci.tar" ] ||
        [ "$LAB_DIR/src/nvml-probe.c" -nt "$LAB_ARTIFACTS/workload.oci.tar" ] ||
        [ "$LAB_DIR/src/nvml_dl.h" -nt "$LAB_ARTIFACTS/workload.oci.tar" ]; then
        deb="$(find "$debs" -maxdepth 1 -name 'busybox-static_*.deb' | head -n1)"
        if [ -z "$deb" ]; then
            if ! (cd "$debs" && apt-get download -qq busybox-static/"$LAB_SUITE" >/dev/null 2>&1); then
                apt-get update -qq
                (cd "$debs" && apt-get download -qq busybox-static/"$LAB_SUITE")
            fi
            deb="$(find "$debs" -maxdepth 1 -name 'busybox-static_*.deb' | head -n1)"
        fi
        rm -rf "$tree/busybox-deb" "$tree/workload"
        dpkg-deb -x "$deb" "$tree/busybox-deb"
        mkdir -p "$tree/workload"/{bin,lib/x86_64-linux-gnu,lib64,etc,tmp,proc,sys,dev}
        chmod 1777 "$tree/workload/tmp"
        cp "$tree/busybox-deb/bin/busybox" "$tree/workload/bin/busybox"
        for applet in $("$tree/workload/bin/busybox" --list); do
            [ "$applet" = busybox ] || ln -s busybox "$tree/workload/bin/$applet"
        done
        cp -L /lib/x86_64-linux-gnu/libc.so.6 /lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$tree/workload/lib/x86_64-linux-gnu/"
        ln -s ../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$tree/workload/lib64/ld-linux-x86-64.so.2"
        # what a CUDA application does first: dlopen libnvidia-ml.so.1 (only the nvidia runtime binds it in)
        mkdir -p "$tree/workload/usr/local/bin"
        gcc -O2 -Wall -Wextra -Werror -o "$tree/workload/usr/local/bin/nvml-probe" "$LAB_DIR/src/nvml-probe.c"
        strip "$tree/workload/usr/local/bin/nvml-probe"
        printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$tree/workload/etc/passwd"
        printf 'root:x:0:\nnogroup:x:65534:\n' >"$tree/workload/etc/group"
        python3 "$LAB_DIR/oci_image.py" "$tree/workload" "$LAB_ARTIFACTS/workload.oci.tar" "$WORKLOAD_REFS" --cmd /bin/sh
        rm -rf "$tree/busybox-deb"
    fi
    # a dynamically linked binary, mounted into a workload container by the spike
    if [ ! -x "$LAB_ARTIFACTS/hello-dynamic" ] || [ "$LAB_DIR/src/hello.c" -nt "$LAB_ARTIFACTS/hello-dynamic" ]; then
        gcc -O2 -Wall -Wextra -o "$LAB_ARTIFACTS/hello-dynamic" "$LAB_DIR/src/hello.c"
    fi
    printf '%s\n%s\n' "$PAUSE_REF" "$WORKLOAD_REFS" | tr ',' '\n' >"$LAB_ARTIFACTS/image-refs"
    lab_log "OCI images: pause $(du -h "$LAB_ARTIFACTS/pause.oci.tar" | cut -f1), workload $(du -h "$LAB_ARTIFACTS/workload.oci.tar" | cut -f1) ($(lab_since "$t0") s)"
}

# ---------------------------------------------------------------- CRI client
# crictl (cri-tools) is in none of the Debian indices (bookworm, trixie, sid), so the lab
# uses lab/cri.py with the CRI proto from sid's golang-k8s-cri-api-dev.
cri_client() {
    local apt_dir="$LAB_CACHE/apt" mirror venv="$LAB_CACHE/venv" pylib="$LAB_ARTIFACTS/pylib" deb proto t0
    local -a apt_opts=(
        -o "Dir::Etc::SourceList=$apt_dir/sources.list"
        -o "Dir::Etc::SourceParts=$apt_dir/sources.list.d"
        -o "Dir::Etc::Preferences=$apt_dir/preferences"
        -o "Dir::Etc::PreferencesParts=$apt_dir/preferences.d"
        -o "Dir::State::Lists=$apt_dir/lists"
        -o "Dir::Cache=$apt_dir/cache"
        -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache="
        -o "APT::Sandbox::User=root"
        -o "Acquire::Languages=none"
    )
    t0="$(lab_now)"
    install -m 0755 "$LAB_DIR/cri.py" "$LAB_ARTIFACTS/cri.py"
    if [ -f "$pylib/api_pb2.py" ] && [ -f "$pylib/.stamp" ]; then
        lab_log "CRI client: cached ($(cat "$pylib/.stamp"))"
        return 0
    fi
    deb="$(find "$apt_dir/debs" -maxdepth 1 -name 'golang-k8s-cri-api-dev_*.deb' 2>/dev/null | head -n1 || true)"
    if [ -z "$deb" ]; then
        mirror="$(lab_debian_mirror)"
        mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/sources.list.d" \
            "$apt_dir/preferences.d" "$apt_dir/debs"
        printf 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s sid main\n' "$mirror" >"$apt_dir/sources.list"
        apt-get "${apt_opts[@]}" update -qq
        (cd "$apt_dir/debs" && apt-get "${apt_opts[@]}" download -qq golang-k8s-cri-api-dev/sid)
        deb="$(find "$apt_dir/debs" -maxdepth 1 -name 'golang-k8s-cri-api-dev_*.deb' | head -n1)"
    fi
    rm -rf "$apt_dir/x" && dpkg-deb -x "$deb" "$apt_dir/x"
    proto="$(find "$apt_dir/x" -path '*/runtime/v1/api.proto' | head -n1)"
    [ -n "$proto" ] || lab_die "no runtime/v1/api.proto in $deb"
    if [ ! -x "$venv/bin/python" ]; then
        python3 -m venv "$venv"
        "$venv/bin/python" -m pip install -q grpcio-tools
    fi
    rm -rf "$pylib" && mkdir -p "$pylib"
    "$venv/bin/python" -m grpc_tools.protoc -I "$(dirname "$proto")" --python_out="$pylib" \
        --grpc_python_out="$pylib" "$proto"
    # The node's python3 is Debian's 3.11: install wheels for it, the same versions the
    # code was generated with.
    local grpc_ver pb_ver
    grpc_ver="$("$venv/bin/python" -c 'import grpc; print(grpc.__version__)')"
    pb_ver="$("$venv/bin/python" -c 'import google.protobuf as p; print(p.__version__)')"
    "$venv/bin/python" -m pip install -q --target "$pylib" --only-binary=:all: --python-version 3.11 \
        --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        "grpcio==$grpc_ver" "protobuf==$pb_ver"
    printf '%s grpcio %s protobuf %s\n' "$(basename "$deb")" "$grpc_ver" "$pb_ver" >"$pylib/.stamp"
    lab_log "CRI client: built ($(cat "$pylib/.stamp")) in $(lab_since "$t0") s"
}

# ---------------------------------------------------------------- GPU node image
# What a container toolkit install and the driver's tools would place on a GPU node, as one layer over
# the node image. The driver's library (the fake NVML with the node's inventory built in), the inventory,
# the fake sysfs and the device nodes differ per node: lab/lab.py copies them in before the node starts.
gpu_node_image() {
    local layer="$LAB_CACHE/trees/gpu-layer" key have t0 build=gpuready-lab-build
    local base_key toolkit repo="$LAB_CACHE/trees/apt-repo" node_files
    base_key="$(podman image inspect --format '{{ index .Config.Labels "gpuready.lab.rootfs" }}' "$LAB_NODE_IMAGE")"
    toolkit="$("$LAB_PYTHON" "$LAB_DIR/go/gobuild.py" version container-toolkit)" ||
        lab_die "lab/go/gobuild.py version container-toolkit failed"
    # The node's files only: a __pycache__ left by a test that imported driver_procfs_runc is not one
    mapfile -t node_files < <(find "$LAB_DIR/node" -maxdepth 1 -type f | sort)
    key="$(cat "$LAB_DIR/src/nvidia-smi.c" "$LAB_DIR/src/nvml_dl.h" "${node_files[@]}" "$LAB_ROOT/tests/apt_repo.py" \
        <(printf '%s %s %s\n' "$base_key" "$GPU_RECIPE" "$toolkit") | sha256sum | cut -c1-12)"
    have="$(podman image inspect --format '{{ index .Config.Labels "gpuready.lab.gpulayer" }}' "$LAB_GPU_IMAGE" 2>/dev/null || true)"
    if [ "$have" = "$key" ]; then
        lab_log "GPU node image: $LAB_GPU_IMAGE present (layer $key)"
        return 0
    fi
    t0="$(lab_now)"
    rm -rf "$layer"
    mkdir -p "$layer/usr/bin" "$layer/etc/containerd" "$layer/etc/sudoers.d" "$layer/var/lib/kubelet" \
        "$layer/etc/nvidia-fake" "$layer/var/lib/nvidia-fake" "$layer/lab-debs"
    "$LAB_PYTHON" "$LAB_ROOT/tests/apt_repo.py" build "$repo" >/dev/null ||
        lab_die "tests/apt_repo.py could not build the toolkit's packages: run make go-build"
    cp "$repo/repo/"*"_${toolkit#v}-1_amd64.deb" "$layer/lab-debs/"
    gcc -O2 -Wall -Wextra -Werror -o "$layer/usr/bin/nvidia-smi" "$LAB_DIR/src/nvidia-smi.c"
    mkdir -p "$layer/usr/local/sbin"
    { printf '#!/usr/bin/python3\n'; cat "$LAB_DIR/node/driver_procfs_runc.py"; } >"$layer/usr/local/sbin/driver-procfs-runc"
    chmod 0755 "$layer/usr/bin/nvidia-smi" "$layer/usr/local/sbin/driver-procfs-runc"
    install -m 0644 "$LAB_DIR/node/containerd-seed.toml" "$layer/etc/containerd/config.toml"
    install -m 0644 "$LAB_DIR/node/kubelet-config.yaml" "$layer/var/lib/kubelet/config.yaml"
    mkdir -p "$layer/etc/systemd/system/multi-user.target.wants"
    install -m 0644 "$LAB_DIR/node/kubelet.service" "$layer/etc/systemd/system/kubelet.service"
    ln -sf /etc/systemd/system/kubelet.service "$layer/etc/systemd/system/multi-user.target.wants/kubelet.service"
    printf 'ops ALL=(ALL) NOPASSWD:ALL\n' >"$layer/etc/sudoers.d/ops"
    chmod 0440 "$layer/etc/sudoers.d/ops"
    podman rm -f "$build" >/dev/null 2>&1 || true
    podman run --name "$build" --network host -v "$layer:/lab-layer:ro" "$LAB_NODE_IMAGE" \
        /bin/sh -ec 'cp -a /lab-layer/. / && dpkg -i /lab-debs/*.deb && rm -r /lab-debs && useradd -m -s /bin/bash ops
            nvidia-ctk --quiet config --config-file=/etc/nvidia-container-runtime/config.toml --in-place \
                --set nvidia-container-runtime.runtimes=/usr/local/sbin/driver-procfs-runc' >/dev/null
    podman image rm -f "$LAB_GPU_IMAGE" >/dev/null 2>&1 || true
    podman commit -q --change 'CMD ["/sbin/init"]' --change "LABEL gpuready.lab.gpulayer=$key" "$build" "$LAB_GPU_IMAGE" >/dev/null
    podman rm "$build" >/dev/null
    lab_log "GPU node image: $LAB_GPU_IMAGE built (layer $key, NVIDIA Container Toolkit $toolkit) in $(lab_since "$t0") s"
}

# ---------------------------------------------------------------- the real NVIDIA image
# nvidia-device-plugin, gpu-feature-discovery, mps-control-daemon and config-manager as built by
# make go-build (lab/go/device-plugin), in one image named as upstream names it, at the version
# lab/go pins; with the glibc they link and nothing else (NVML comes from the nvidia runtime).
nvidia_image() {
    local tree="$LAB_CACHE/trees/nvidia" archive="$LAB_ARTIFACTS/nvidia-device-plugin.oci.tar" program path
    local version key t0
    version="$("$LAB_PYTHON" "$LAB_DIR/go/gobuild.py" version device-plugin)" ||
        lab_die "lab/go/gobuild.py version device-plugin failed"
    key="$version $(cat "$LAB_DIR/oci_image.py" "$0" | sha256sum | cut -c1-12)"
    if [ -s "$archive" ] && [ "$(cat "$archive.key" 2>/dev/null)" = "$key" ]; then
        lab_log "NVIDIA image: cached ($key)"
        return 0
    fi
    t0="$(lab_now)"
    rm -rf "$tree" && mkdir -p "$tree/usr/bin" "$tree/lib/x86_64-linux-gnu" "$tree/lib64" "$tree/etc" "$tree/tmp"
    chmod 1777 "$tree/tmp"
    for program in nvidia-device-plugin gpu-feature-discovery mps-control-daemon config-manager; do
        path="$("$LAB_PYTHON" "$LAB_DIR/go/gobuild.py" path "$program")" || lab_die "$program is not built: run make go-build"
        install -m 0755 "$path" "$tree/usr/bin/$program"
    done
    cp -L /lib/x86_64-linux-gnu/libc.so.6 /lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$tree/lib/x86_64-linux-gnu/"
    ln -s ../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$tree/lib64/ld-linux-x86-64.so.2"
    printf 'root:x:0:0:root:/root:/bin/false\n' >"$tree/etc/passwd"
    # the upstream image's environment: the nvidia runtime gives it every GPU and the driver's utilities
    python3 "$LAB_DIR/oci_image.py" "$tree" "$archive" "nvcr.io/nvidia/k8s-device-plugin:$version" \
        --entrypoint nvidia-device-plugin --env NVIDIA_VISIBLE_DEVICES=all --env NVIDIA_DRIVER_CAPABILITIES=utility
    printf '%s\n' "$key" >"$archive.key"
    lab_log "NVIDIA image: nvcr.io/nvidia/k8s-device-plugin:$version $(du -h "$archive" | cut -f1) ($(lab_since "$t0") s)"
}

# ---------------------------------------------------------------- the real NFD image
# nfd-master and nfd-worker as built by make go-build (lab/go/nfd, static Go binaries), named as
# upstream names the image, at the version lab/go pins.
nfd_image() {
    local tree="$LAB_CACHE/trees/nfd" archive="$LAB_ARTIFACTS/node-feature-discovery.oci.tar" program path
    local version key t0
    version="$("$LAB_PYTHON" "$LAB_DIR/go/gobuild.py" version nfd)" || lab_die "lab/go/gobuild.py version nfd failed"
    key="$version $(cat "$LAB_DIR/oci_image.py" "$0" | sha256sum | cut -c1-12)"
    if [ -s "$archive" ] && [ "$(cat "$archive.key" 2>/dev/null)" = "$key" ]; then
        lab_log "NFD image: cached ($key)"
        return 0
    fi
    t0="$(lab_now)"
    rm -rf "$tree" && mkdir -p "$tree/usr/bin" "$tree/etc" "$tree/tmp"
    chmod 1777 "$tree/tmp"
    for program in nfd-master nfd-worker; do
        path="$("$LAB_PYTHON" "$LAB_DIR/go/gobuild.py" path "$program")" || lab_die "$program is not built: run make go-build"
        install -m 0755 "$path" "$tree/usr/bin/$program"
    done
    printf 'root:x:0:0:root:/root:/bin/false\n' >"$tree/etc/passwd"
    python3 "$LAB_DIR/oci_image.py" "$tree" "$archive" "registry.k8s.io/nfd/node-feature-discovery:$version" \
        --entrypoint nfd-master
    printf '%s\n' "$key" >"$archive.key"
    lab_log "NFD image: registry.k8s.io/nfd/node-feature-discovery:$version $(du -h "$archive" | cut -f1) ($(lab_since "$t0") s)"
}

node_image
oci_images
cri_client
nvidia_image
nfd_image
gpu_node_image
lab_log "build-image: done in $(lab_since "$T_START") s"
