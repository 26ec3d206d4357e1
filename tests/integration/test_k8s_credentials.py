# -*- coding: utf-8 -*-
"""No credential reaches the output, whichever way it is given and whether the call works or not.

k8s_gpu_labels runs at -vvv (module invocation shown) against a real kube-apiserver once with
each way of giving a credential: an inline kubeconfig dict with a token, with
client-certificate-data/client-key-data, or with an exec plugin whose environment carries the token;
api_key; proxy headers; the K8S_AUTH_* variables of the controller. k8s_gpu_validate and
k8s_gpu_doctor, which share its auth options, run with the inline token. Each is run with
credentials the API accepts and with ones it refuses (or a server that is not there)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import copy
import json
import os
import socket
import stat

import pytest
import yaml

from cluster_api import shipped_rules
from playbook import run_tasks

GPU = "nvidia.com/gpu"
NODE = "cred-node"
USER = "cred-user"
WRONG = "wrong-token-5ec2e7-d00d"
PROXY_SECRET = "proxy-pass-5ec2e7-beef"
CLUSTERROLE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                           "roles", "gpuready", "files", "clusterrole.yml")
MODULES = {
    "gpuready.nvidia.k8s_gpu_labels": {"node": NODE, "labels": {"gpuready.test/cred": "yes"}},
    "gpuready.nvidia.k8s_gpu_validate": {"expected": {NODE: {GPU: 4}}, "test_pod": False, "timeout": 10},
    "gpuready.nvidia.k8s_gpu_doctor": {"nodes": {NODE: None}},
}


@pytest.fixture(scope="module")
def user(k8s_api):
    """An identity with a token and a client certificate, bound to the shipped ClusterRole: the user USER
    (its certificate) and the ServiceAccount USER (its token), both straight to the server."""
    identity = k8s_api.add_identity(USER, client_cert=True)
    token_user = k8s_api.add_identity(USER)
    identity.token = token_user.token
    k8s_api.bind_cluster_role("gpuready-cred", shipped_rules(), [identity.subject, token_user.subject])
    k8s_api.create({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE,
                                                          "nvidia.com/gpu.present": "true"}},
                    "status": {"capacity": {"cpu": "8", GPU: "4"}, "allocatable": {"cpu": "8", GPU: "4"}}})
    return identity


def _closed_port():
    """A loopback URL where nothing listens (the port was just free)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return "https://127.0.0.1:%d" % sock.getsockname()[1]


def _read(path):
    with open(path, "rb") as handle:
        return handle.read()


def _inline(identity, user_entry, server=None):
    """The identity's kubeconfig as a dict, its user replaced by user_entry (and its server, if given)."""
    with open(identity.kubeconfig, encoding="utf-8") as handle:
        config = yaml.safe_load(handle)
    config = copy.deepcopy(config)
    config["users"][0]["user"] = user_entry
    if server:
        config["clusters"][0]["cluster"]["server"] = server
    return config


def _exec_plugin(folder):
    """A client-go exec credential plugin printing the token it is given in GPUREADY_CRED_TOKEN."""
    path = os.path.join(folder, "token-plugin")
    with open(path, "w") as handle:
        handle.write("#!/bin/sh\nprintf '{\"apiVersion\": \"client.authentication.k8s.io/v1beta1\", "
                     "\"kind\": \"ExecCredential\", \"status\": {\"token\": \"%s\"}}' \"$GPUREADY_CRED_TOKEN\"\n")
    os.chmod(path, stat.S_IRWXU)
    return path


def _ways(k8s_api, identity, folder):
    """[(way, works, task arguments)] for every way of giving a credential as module options, and the
    secrets among them."""
    cert = base64.b64encode(_read(identity.cert)).decode()
    key = base64.b64encode(_read(identity.key)).decode()
    plugin = _exec_plugin(folder)
    direct = {"host": k8s_api.server_url, "ca_cert": k8s_api.ca_cert}
    ways = []
    for works in (True, False):
        token = identity.token if works else WRONG
        exec_user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": plugin,
                              "env": [{"name": "GPUREADY_CRED_TOKEN", "value": token}]}}
        ways += [
            ("kubeconfig dict, token", works, {"kubeconfig": _inline(identity, {"token": token})}),
            ("kubeconfig dict, client-key-data", works,
             {"kubeconfig": _inline(identity, {"client-certificate-data": cert, "client-key-data": key},
                                    server=None if works else _closed_port())}),
            ("kubeconfig dict, exec env", works, {"kubeconfig": _inline(identity, exec_user)}),
            ("api_key", works, dict(direct, api_key=token)),
            ("proxy headers", works,
             dict(direct, api_key=token, proxy_headers={"proxy_basic_auth": "gpuready:" + PROXY_SECRET,
                                                        "basic_auth": "gpuready:" + PROXY_SECRET})),
        ]
    return ways, [identity.token, WRONG, PROXY_SECRET, key, base64.b64decode(key).decode().splitlines()[1]]


def _task(name, module, way, works, auth):
    return {"name": "%s with %s (%s)" % (module, way, "accepted" if works else "refused"),
            module: dict(MODULES[module], **auth), "register": name, "ignore_errors": True}


@pytest.fixture(scope="module")
def verbose_runs(tmp_path_factory, k8s_api, user):
    """[(ansible-playbook process, registered results, {register name: (module, way, works)})], secrets."""
    folder = str(tmp_path_factory.mktemp("credentials"))
    ways, secrets = _ways(k8s_api, user, folder)
    tasks, expected = [], {}
    for number, (way, works, auth) in enumerate(ways):
        modules = MODULES if way == "kubeconfig dict, token" else ["gpuready.nvidia.k8s_gpu_labels"]
        for module in modules:
            name = "r%d_%s" % (number, module.rsplit(".", 1)[1])
            tasks.append(_task(name, module, way, works, auth))
            expected[name] = (module, way, works)
    runs = [run_tasks(folder, tasks, env={"ANSIBLE_VERBOSITY": "3"}) + (expected,)]
    # K8S_AUTH_* in the controller's environment, as kubernetes.core documents them. (Given through a
    # task's `environment:` keyword instead, ansible-core itself prints them in its -vvv EXEC line.)
    for works in (True, False):
        environment = {"ANSIBLE_VERBOSITY": "3", "K8S_AUTH_HOST": k8s_api.server_url, "K8S_AUTH_SSL_CA_CERT": k8s_api.ca_cert,
                       "K8S_AUTH_API_KEY": user.token if works else WRONG,
                       "KUBECONFIG": os.path.join(folder, "no-such-kubeconfig")}
        name = "env_%s" % works
        task = _task(name, "gpuready.nvidia.k8s_gpu_labels", "K8S_AUTH_* variables", works, {})
        runs.append(run_tasks(folder, [task], env=environment) + ({name: ("gpuready.nvidia.k8s_gpu_labels", "K8S_AUTH_*", works)},))
    return runs, secrets


def test_every_way_was_tried_and_did_what_was_expected(verbose_runs):
    runs, _secrets = verbose_runs
    outcomes, wanted = {}, {}
    for proc, results, expected in runs:
        assert "ESTABLISH LOCAL CONNECTION" in proc.stdout  # -vvv took effect
        for name, (_module, _way, works) in expected.items():
            outcomes[name] = (not results[name].get("failed"), results[name].get("msg"))
            wanted[name] = works
    assert dict((name, ok) for name, (ok, _msg) in outcomes.items()) == wanted, outcomes
    assert len(wanted) == 2 * (5 + 2 + 1)


def test_no_credential_in_the_output(verbose_runs):
    runs, secrets = verbose_runs
    shown = "".join(proc.stdout + json.dumps(results) for proc, results, _expected in runs)
    assert [secret[:8] + "..." for secret in secrets if secret in shown] == []


ROLE_DEFAULTS = os.path.join(os.path.dirname(CLUSTERROLE), "..", "defaults", "main.yml")
AUTH_TASKS = [
    {"name": "k8s_info", "kubernetes.core.k8s_info": {"kind": "Node", "name": NODE}, "register": "info"},
    {"name": "k8s_gpu_labels", "gpuready.nvidia.k8s_gpu_labels": {"node": NODE, "labels": {"gpuready.test/auth": "once"}},
     "register": "labels"},
]


@pytest.fixture(scope="module")
def auth_once_runs(tmp_path_factory, k8s_api, user):
    """{way: registered results} of a block that sets the roles' module_defaults entry (roles/gpuready's
    gpuready_k8s_auth, read from its defaults file) around a kubernetes.core task and one of ours, the
    second pair through include_tasks as the roles reach theirs. KUBECONFIG points nowhere: a call that
    works got its credentials from the module_defaults."""
    folder = str(tmp_path_factory.mktemp("auth-once"))
    with open(ROLE_DEFAULTS, encoding="utf-8") as handle:
        defaults = yaml.safe_load(handle)
    included = os.path.join(folder, "included.yml")
    with open(included, "w", encoding="utf-8") as handle:
        json.dump([dict(task, register="included_" + task["register"], ignore_errors=True) for task in AUTH_TASKS], handle)
    unset = dict((name, None) for name in defaults if name.startswith("gpuready_k8s_") and name != "gpuready_k8s_auth")
    ways = {
        "kubeconfig": dict(unset, gpuready_k8s_kubeconfig=user.kubeconfig),
        "host and token": dict(unset, gpuready_k8s_host=k8s_api.server_url, gpuready_k8s_ca_cert=k8s_api.ca_cert,
                               gpuready_k8s_api_key=user.token),
        "wrong token": dict(unset, gpuready_k8s_host=k8s_api.server_url, gpuready_k8s_ca_cert=k8s_api.ca_cert,
                            gpuready_k8s_api_key=WRONG),
    }
    runs = {}
    for way, settings in ways.items():
        settings = dict(settings, gpuready_k8s_validate_certs=True, gpuready_k8s_auth=defaults["gpuready_k8s_auth"])
        block = {"name": "the roles' module_defaults", "vars": settings,
                 "module_defaults": {"group/gpuready.nvidia.k8s": "{{ gpuready_k8s_auth }}"},
                 "block": [dict(task, ignore_errors=True) for task in AUTH_TASKS]
                 + [{"name": "included", "ansible.builtin.include_tasks": included}]}
        _proc, results = run_tasks(folder, [block], env={"KUBECONFIG": os.path.join(folder, "no-such-kubeconfig")},
                                   registered=["included_" + task["register"] for task in AUTH_TASKS])
        runs[way] = results
    return runs


def test_the_roles_module_defaults_give_every_kubernetes_task_its_credentials(auth_once_runs):
    outcome = dict((way, dict((name, not result.get("failed")) for name, result in results.items()))
                   for way, results in auth_once_runs.items())
    names = ["info", "labels", "included_info", "included_labels"]
    assert outcome == {"kubeconfig": dict.fromkeys(names, True), "host and token": dict.fromkeys(names, True),
                       "wrong token": dict.fromkeys(names, False)}, auth_once_runs
    assert auth_once_runs["kubeconfig"]["info"]["resources"][0]["metadata"]["name"] == NODE
    assert "401" in json.dumps(auth_once_runs["wrong token"]["labels"]) or "Unauthorized" in json.dumps(
        auth_once_runs["wrong token"]["labels"]), auth_once_runs["wrong token"]["labels"]
