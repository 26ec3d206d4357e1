"""A tiny CRI client (the lab's stand-in for crictl, which Debian does not ship).

Runs inside a node with PYTHONPATH=/opt/lab/pylib (grpcio, protobuf and the Python
code generated from the CRI api.proto of Debian's golang-k8s-cri-api-dev).

  cri.py info                       CRI Status(verbose) as JSON (like `crictl info`)
  cri.py images                     image references known to CRI
  cri.py run --handler H --image I [--mount HOST:CTR] [--env K=V] -- CMD...
        host-network pod sandbox + one container, waits for it to exit, prints
        a JSON report (exit code, output, ids), then stops and removes the pod
  cri.py pods                       pod sandboxes left (JSON list of ids)
  cri.py rmall                      stop and remove every pod sandbox
"""

import argparse
import json
import os
import sys
import time
import uuid

import grpc
from google.protobuf import json_format

import api_pb2 as pb
import api_pb2_grpc as pb_grpc

SOCK = os.environ.get("CRI_ENDPOINT", "unix:///run/containerd/containerd.sock")


def clients():
    channel = grpc.insecure_channel(SOCK)
    return pb_grpc.RuntimeServiceStub(channel), pb_grpc.ImageServiceStub(channel)


def cmd_info(rt, _img, _args):
    resp = rt.Status(pb.StatusRequest(verbose=True), timeout=10)
    out = {"status": json_format.MessageToDict(resp.status)}
    for key, val in resp.info.items():
        try:
            out[key] = json.loads(val)
        except ValueError:
            out[key] = val
    out["version"] = json_format.MessageToDict(
        rt.Version(pb.VersionRequest(), timeout=10)
    )
    print(json.dumps(out, indent=1, sort_keys=True))


def cmd_images(_rt, img, _args):
    resp = img.ListImages(pb.ListImagesRequest(), timeout=10)
    for image in resp.images:
        for tag in image.repo_tags:
            print(tag)


def cmd_pods(rt, _img, _args):
    resp = rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=10)
    print(json.dumps([p.id for p in resp.items]))


def cmd_rmall(rt, _img, _args):
    for pod in rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=10).items:
        rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod.id), timeout=60)
        rt.RemovePodSandbox(
            pb.RemovePodSandboxRequest(pod_sandbox_id=pod.id), timeout=60
        )
        print("removed", pod.id)


def read_cri_log(path):
    """CRI log lines are 'TIMESTAMP STREAM P|F MESSAGE'; returns the joined messages."""
    lines = []
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.rstrip("\n").split(" ", 3)
                lines.append(parts[3] if len(parts) == 4 else line.rstrip("\n"))
    except FileNotFoundError:
        pass
    return "\n".join(lines)


def cmd_run(rt, _img, args):
    report = {"handler": args.handler, "image": args.image, "step": "RunPodSandbox"}
    t0 = time.monotonic()
    name = args.name or "lab-" + uuid.uuid4().hex[:8]
    logdir = os.path.join(args.log_root, name)
    os.makedirs(logdir, exist_ok=True)
    sandbox = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(
            name=name, uid=uuid.uuid4().hex, namespace="lab", attempt=0
        ),
        # no hostname: a host-network pod shares the node's UTS namespace, and runc
        # refuses "unable to set hostname without a private UTS namespace"
        log_directory=logdir,
        labels={"gpuready.lab": "spike"},
        linux=pb.LinuxPodSandboxConfig(
            # what kubelet with cgroupDriver: systemd passes (a slice, not a path)
            cgroup_parent=args.cgroup_parent,
            security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=pb.NamespaceOption(
                    network=pb.NODE, pid=pb.CONTAINER, ipc=pb.POD
                ),
            ),
        ),
    )
    try:
        pod_id = rt.RunPodSandbox(
            pb.RunPodSandboxRequest(config=sandbox, runtime_handler=args.handler),
            timeout=120,
        ).pod_sandbox_id
    except grpc.RpcError as err:
        report.update(error=err.code().name, details=err.details())
        print(json.dumps(report, sort_keys=True))
        return 1
    report["pod_id"] = pod_id
    report["t_sandbox_s"] = round(time.monotonic() - t0, 3)
    try:
        report["step"] = "CreateContainer"
        mounts = []
        for spec in args.mount:
            host, ctr = spec.split(":", 1)
            mounts.append(pb.Mount(host_path=host, container_path=ctr, readonly=True))
        cfg = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name="work", attempt=0),
            image=pb.ImageSpec(image=args.image),
            command=args.command,
            mounts=mounts,
            envs=[pb.KeyValue(key=kv.split("=", 1)[0], value=kv.split("=", 1)[1].encode()) for kv in args.env],
            log_path="work.log",
            linux=pb.LinuxContainerConfig(),
        )
        ctr_id = rt.CreateContainer(
            pb.CreateContainerRequest(
                pod_sandbox_id=pod_id, config=cfg, sandbox_config=sandbox
            ),
            timeout=120,
        ).container_id
        report["container_id"] = ctr_id
        report["step"] = "StartContainer"
        rt.StartContainer(pb.StartContainerRequest(container_id=ctr_id), timeout=120)
        deadline = time.monotonic() + args.wait
        while True:
            st = rt.ContainerStatus(
                pb.ContainerStatusRequest(container_id=ctr_id), timeout=10
            ).status
            if st.state == pb.CONTAINER_EXITED or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        report["step"] = "done"
        report["state"] = pb.ContainerState.Name(st.state)
        report["exit_code"] = st.exit_code
        report["reason"] = st.reason
        report["message"] = st.message
        report["output"] = read_cri_log(os.path.join(logdir, "work.log"))
        report["t_container_s"] = round(time.monotonic() - t0, 3)
    except grpc.RpcError as err:
        report["error"] = err.code().name
        report["details"] = err.details()
    finally:
        if not args.keep:
            rt.StopPodSandbox(
                pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=60
            )
            rt.RemovePodSandbox(
                pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=60
            )
            report["t_total_s"] = round(time.monotonic() - t0, 3)
    print(json.dumps(report, sort_keys=True))
    return (
        0
        if report.get("state") == "CONTAINER_EXITED" and report.get("exit_code") == 0
        else 1
    )


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="what", required=True)
    for name in ("info", "images", "pods", "rmall"):
        sub.add_parser(name)
    run = sub.add_parser("run")
    run.add_argument("--handler", default="")
    run.add_argument("--image", required=True)
    run.add_argument("--name")
    run.add_argument(
        "--mount", action="append", default=[], help="HOST:CONTAINER, read-only"
    )
    run.add_argument("--env", action="append", default=[], help="KEY=VALUE")
    run.add_argument("--cgroup-parent", default="kubepods.slice")
    run.add_argument("--log-root", default="/var/log/pods")
    run.add_argument("--wait", type=float, default=30)
    run.add_argument("--keep", action="store_true", help="do not remove the pod")
    run.add_argument("command", nargs="+")
    args = ap.parse_args()
    rt, img = clients()
    try:
        rc = globals()["cmd_" + args.what](rt, img, args)
    except grpc.RpcError as err:
        print(
            json.dumps({"error": err.code().name, "details": err.details()}),
            file=sys.stderr,
        )
        return 2
    return rc or 0


if __name__ == "__main__":
    sys.exit(main())
