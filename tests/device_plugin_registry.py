# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where a real device plugin registers when no kubelet runs: the kubelet's Registration service of the
device plugin API v1beta1 (its api.proto, from the k8s.io/kubelet module the plugin was built with,
compiled here by grpc_tools), on a kubelet.sock in a folder of the test's own. For each registration it
asks the plugin's own endpoint for its device list (ListAndWatch, first answer) and records it. It
schedules nothing and allocates nothing: it only reads what the plugin advertises, which is what the
kubelet turns into the Node's capacity (one unit per healthy device)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import subprocess
import sys
import threading
from concurrent import futures

import lab_scripts

gobuild = lab_scripts.script("lab/go/gobuild.py", "gpuready_gobuild")
KUBELET_MODULE = "k8s.io/kubelet"
PROTO_DIR = os.path.join("pkg", "apis", "deviceplugin", "v1beta1")


def compile_api(out_dir):
    """api_pb2 and api_pb2_grpc of the device plugin API the pinned plugin uses."""
    proto_dir = str(gobuild.dependency_dir("device-plugin", KUBELET_MODULE) / PROTO_DIR)
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", proto_dir, "--python_out=" + out_dir,
                    "--grpc_python_out=" + out_dir, os.path.join(proto_dir, "api.proto")], check=True)
    # api_pb2_grpc imports api_pb2 by that name.
    pb2 = sys.modules["api_pb2"] = lab_scripts.script(os.path.join(out_dir, "api_pb2.py"), "api_pb2")
    return pb2, lab_scripts.script(os.path.join(out_dir, "api_pb2_grpc.py"), "api_pb2_grpc")


class Registry:
    """The Registration service on <folder>/kubelet.sock. `registered` maps each resource name to the
    device IDs its plugin listed as Healthy."""

    def __init__(self, folder, api):
        self.folder = folder
        self.pb2, self.grpc_api = api
        self.registered = {}
        self.changed = threading.Condition()
        self._server = None

    def __enter__(self):
        import grpc
        registry = self

        class Registration(self.grpc_api.RegistrationServicer):
            def Register(self, request, context):  # noqa: N802 (the API's name)
                registry._record(request)
                return registry.pb2.Empty()

        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.grpc_api.add_RegistrationServicer_to_server(Registration(), self._server)
        self._server.add_insecure_port("unix://" + os.path.join(self.folder, "kubelet.sock"))
        self._server.start()
        return self

    def __exit__(self, *exc):
        self._server.stop(grace=None)

    def _record(self, request):
        import grpc
        # The plugin serves its endpoint before it registers, and expects the kubelet to call it back.
        with grpc.insecure_channel("unix://" + os.path.join(self.folder, request.endpoint)) as channel:
            stream = self.grpc_api.DevicePluginStub(channel).ListAndWatch(self.pb2.Empty(), timeout=30)
            first = next(stream)
            stream.cancel()
        with self.changed:
            self.registered[request.resource_name] = sorted(d.ID for d in first.devices if d.health == "Healthy")
            self.changed.notify_all()

    def run_plugin(self, argv, env, done, timeout):
        """Run the plugin `argv` until done(registered, output) holds, it exits or `timeout` seconds pass,
        then stop it: (its exit code, None if it was still running; registrations; its output)."""
        output = []
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

        def follow():
            for line in proc.stdout:
                with self.changed:
                    output.append(line)
                    self.changed.notify_all()
            proc.wait()
            with self.changed:
                self.changed.notify_all()
        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        try:
            with self.changed:
                self.changed.wait_for(lambda: done(self.registered, "".join(output)) or proc.poll() is not None,
                                      timeout=timeout)
                returncode = proc.poll()
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
            reader.join(timeout=30)
        with self.changed:
            return returncode, dict(self.registered), "".join(output)
