# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The device-plugin API between the lab's kubelet and a device plugin, over the real sockets.

The calls, their order and their fields follow deviceplugin/v1beta1: the plugin serves
``/var/lib/kubelet/device-plugins/<endpoint>``, registers with the kubelet on ``kubelet.sock``
(Register: version, endpoint, resource_name, options), and the kubelet then calls ListAndWatch
(a stream of full device lists) and Allocate on the plugin's socket. The encoding is not gRPC:
one JSON object per line (a request, then one answer, or a stream of answers for ListAndWatch),
so that both sides need only the Python standard library.
"""

import json
import os
import socket

DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET = os.path.join(DEVICE_PLUGIN_DIR, "kubelet.sock")
VERSION = "v1beta1"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"


class Channel:
    """One connection: JSON lines both ways."""

    def __init__(self, sock):
        self.sock = sock
        self.reader = sock.makefile("r", encoding="utf-8")

    @classmethod
    def connect(cls, path, timeout=5):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect(path)
        sock.settimeout(None)
        return cls(sock)

    def send(self, message):
        self.sock.sendall((json.dumps(message, sort_keys=True) + "\n").encode())

    def receive(self):
        """The next message; None when the other side closed the connection."""
        line = self.reader.readline()
        return json.loads(line) if line else None

    def close(self):
        try:
            self.reader.close()
            self.sock.close()
        except OSError:
            pass


def call(path, message, timeout=10):
    """One request and its answer; raises OSError (socket) or RuntimeError (an ``error`` answer)."""
    channel = Channel.connect(path, timeout)
    try:
        channel.sock.settimeout(timeout)
        channel.send(message)
        answer = channel.receive()
    finally:
        channel.close()
    if answer is None:
        raise RuntimeError("%s closed the connection without an answer" % path)
    if answer.get("error"):
        raise RuntimeError(answer["error"])
    return answer
