# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A small Kubernetes REST client on the Python standard library, for the lab's simulated
components: the kubelet (inside a node, Debian's python3), the controllers (on the test
machine) and the stand-ins running in pods (GFD, NFD). They talk to the API server over HTTPS
with a bearer token, like the real components; nothing here reads the emulator's internals.

    api = Client.from_kubeconfig("/etc/kubernetes/kubelet.conf")    # or Client.in_cluster()
    node = api.get(path("v1", "nodes", name="gpu-p4"))              # None when absent (404)
    pods = api.list(path("v1", "pods"), field_selector="spec.nodeName=gpu-p4")
    api.patch(path("v1", "nodes", name="gpu-p4", sub="status"), {"status": {...}})
    api.event(pod, "Started", "Started container x", component="kubelet", host="gpu-p4")
"""

import datetime
import http.client
import json
import os
import re
import ssl
import threading
import urllib.parse
import uuid

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
PATCH_TYPES = {"merge": "application/merge-patch+json", "strategic": "application/strategic-merge-patch+json",
               "json": "application/json-patch+json"}


class ApiError(Exception):
    """A non-2xx answer: ``code``, ``reason`` and ``message`` from the Status object."""

    def __init__(self, code, reason, message):
        super().__init__("%s %s: %s" % (code, reason, message))
        self.code = code
        self.reason = reason
        self.message = message


def path(api_version, resource, namespace=None, name=None, sub=None):
    """The REST path: path("apps/v1", "daemonsets", "kube-system", "x", "status")."""
    base = "/api/v1" if api_version == "v1" else "/apis/" + api_version
    parts = [base]
    if namespace:
        parts += ["namespaces", namespace]
    parts.append(resource)
    if name:
        parts.append(name)
    if sub:
        parts.append(sub)
    return "/".join(parts)


def now():
    """An RFC 3339 timestamp, as the API uses."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def duration_seconds(interval):
    """A Go duration as the components take them ("60s", "1m30s", "500ms") in seconds; None for "infinite"."""
    if interval == "infinite":
        return None
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", interval)
    total = sum(float(number) * units[unit] for number, unit in parts)
    if total <= 0 or "".join(n + u for n, u in parts) != interval:
        raise ValueError("invalid duration %r" % interval)
    return total


def parse_time(value):
    return datetime.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc)


class Client:
    """One keep-alive HTTPS connection, serialised by a lock (one client per thread is cheaper)."""

    def __init__(self, server, token, ca_file, timeout=30):
        url = urllib.parse.urlsplit(server)
        self.host, self.port = url.hostname, url.port or 443
        self.server = server
        self.token = token
        self.timeout = timeout
        self.context = ssl.create_default_context(cafile=ca_file)
        self._conn = None
        self._lock = threading.Lock()

    @classmethod
    def from_kubeconfig(cls, kubeconfig_path):
        """Token and CA from a kubeconfig written as JSON (JSON is YAML), current context."""
        with open(kubeconfig_path) as handle:
            config = json.load(handle)
        context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
        token = user.get("token")
        if token is None and user.get("tokenFile"):
            with open(user["tokenFile"]) as handle:
                token = handle.read().strip()
        ca_file = cluster.get("certificate-authority")
        return cls(cluster["server"], token, ca_file)

    @classmethod
    def in_cluster(cls):
        """What client-go's rest.InClusterConfig reads: the service env and the mounted token."""
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
        with open(os.path.join(SA_DIR, "token")) as handle:
            token = handle.read().strip()
        return cls("https://%s:%s" % (host, port), token, os.path.join(SA_DIR, "ca.crt"))

    def _connection(self):
        if self._conn is None:
            self._conn = http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=self.timeout)
        return self._conn

    def request(self, method, url, body=None, content_type="application/json"):
        """(status code, decoded JSON or text). Retries once on a dropped keep-alive connection."""
        headers = {"Accept": "application/json", "Authorization": "Bearer %s" % self.token}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        with self._lock:
            for attempt in (1, 2):
                try:
                    conn = self._connection()
                    conn.request(method, url, body=data, headers=headers)
                    response = conn.getresponse()
                    raw = response.read()
                    break
                except (OSError, http.client.HTTPException):
                    if self._conn is not None:
                        self._conn.close()
                    self._conn = None
                    if attempt == 2:
                        raise
        text = raw.decode("utf-8", "replace")
        if response.getheader("Content-Type", "").startswith("application/json"):
            return response.status, json.loads(text) if text else None
        return response.status, text

    def call(self, method, url, body=None, content_type="application/json"):
        code, answer = self.request(method, url, body, content_type)
        if code >= 300:
            if isinstance(answer, dict):
                raise ApiError(code, answer.get("reason", ""), answer.get("message", ""))
            raise ApiError(code, "", str(answer))
        return answer

    def get(self, url):
        """The object, or None when it does not exist."""
        try:
            return self.call("GET", url)
        except ApiError as err:
            if err.code == 404:
                return None
            raise

    def list(self, url, label_selector=None, field_selector=None):
        query = {}
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        if query:
            url += "?" + urllib.parse.urlencode(query)
        answer = self.call("GET", url)
        items = answer.get("items") or []
        # Items of built-in types come without apiVersion/kind; events and owner references need them.
        kind = answer.get("kind", "")[:-len("List")]
        for item in items:
            item.setdefault("kind", kind)
            item.setdefault("apiVersion", answer.get("apiVersion"))
        return items

    def create(self, url, obj):
        return self.call("POST", url, obj)

    def put(self, url, obj):
        return self.call("PUT", url, obj)

    def patch(self, url, patch, patch_type="merge"):
        return self.call("PATCH", url, patch, PATCH_TYPES[patch_type])

    def delete(self, url):
        """True when something was deleted, False when it was already gone."""
        try:
            self.call("DELETE", url)
            return True
        except ApiError as err:
            if err.code == 404:
                return False
            raise

    def event(self, obj, reason, message, event_type="Normal", component="", host=None, field_path=None):
        """A core/v1 Event about ``obj``, as the real components record them (best effort)."""
        meta = obj["metadata"]
        namespace = meta.get("namespace") or "default"
        involved = {"kind": obj.get("kind"), "apiVersion": obj.get("apiVersion"), "name": meta["name"],
                    "namespace": meta.get("namespace"), "uid": meta.get("uid"),
                    "resourceVersion": meta.get("resourceVersion")}
        if field_path:
            involved["fieldPath"] = field_path
        stamp = now()
        source = {"component": component}
        if host:
            source["host"] = host
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": "%s.%s" % (meta["name"], uuid.uuid4().hex[:16]), "namespace": namespace},
                "involvedObject": dict((k, v) for k, v in involved.items() if v is not None),
                "reason": reason, "message": message, "type": event_type, "count": 1,
                "firstTimestamp": stamp, "lastTimestamp": stamp, "source": source,
                "reportingComponent": component, "reportingInstance": host or ""}
        try:
            self.create(path("v1", "events", namespace), body)
        except (ApiError, OSError):
            pass  # events are best effort, as in client-go's recorder
