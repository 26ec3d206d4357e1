"""Write a single-layer OCI image archive (what `ctr images import` reads) from a directory.

Usage: oci_image.py ROOTFS_DIR OUT.tar IMAGE_REF[,IMAGE_REF...] [--entrypoint ARG ...] [--cmd ARG ...]
                    [--env K=V ...]

Several references (comma-separated) name the same image, as tags do: `ctr images import`
creates one image per name.

The archive holds oci-layout, index.json and blobs/sha256/{layer,config,manifest}.
The layer is an uncompressed tar, so its digest is also its diff_id. Timestamps,
owners and the order of entries are fixed, so the same tree gives the same digests.
"""

import argparse
import hashlib
import io
import json
import os
import tarfile

EPOCH = 0


def layer_tar(root):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(dirnames) + sorted(filenames):
                full = os.path.join(dirpath, name)
                arc = os.path.relpath(full, root)
                info = tar.gettarinfo(full, arcname=arc)
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mtime = EPOCH
                if info.isfile():
                    with open(full, "rb") as fh:
                        tar.addfile(info, fh)
                else:
                    tar.addfile(info)
    return buf.getvalue()


def blob(data):
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def add_bytes(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = EPOCH
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("rootfs")
    ap.add_argument("out")
    ap.add_argument(
        "ref", help="full image reference(s), e.g. localhost/gpuready-lab/pause:1"
    )
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--entrypoint", nargs="*", default=[])
    ap.add_argument("--cmd", nargs="*", default=[])
    args = ap.parse_args()

    layer_digest, layer = blob(layer_tar(args.rootfs))
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {
            "Env": [
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
            ] + args.env,
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [
            {"created": "1970-01-01T00:00:00Z", "created_by": "lab/oci_image.py"}
        ],
    }
    if args.entrypoint:
        config["config"]["Entrypoint"] = args.entrypoint
    if args.cmd:
        config["config"]["Cmd"] = args.cmd
    config_digest, config_bytes = blob(json.dumps(config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": len(config_bytes),
        },
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": layer_digest,
                "size": len(layer),
            }
        ],
    }
    manifest_digest, manifest_bytes = blob(
        json.dumps(manifest, sort_keys=True).encode()
    )
    refs = args.ref.split(",")
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest,
                "size": len(manifest_bytes),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    # ctr import names the image after this annotation
                    "io.containerd.image.name": ref,
                    "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1]
                    if ":" in ref.rsplit("/", 1)[-1] else "latest",
                },
            }
            for ref in refs
        ],
    }
    tmp = args.out + ".tmp"
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        add_bytes(
            tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()
        )
        add_bytes(tar, "index.json", json.dumps(index, sort_keys=True).encode())
        for digest, data in (
            (layer_digest, layer),
            (config_digest, config_bytes),
            (manifest_digest, manifest_bytes),
        ):
            add_bytes(tar, "blobs/sha256/" + digest.split(":", 1)[1], data)
    os.replace(tmp, args.out)
    print(f"{args.out}: {args.ref} manifest {manifest_digest} layer {len(layer)} bytes")


if __name__ == "__main__":
    main()
