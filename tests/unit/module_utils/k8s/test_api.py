# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""k8s.api.call_api without an API server: which failures are retried and how often, the
messages, and that no message carries the credentials. The same against a real kube-apiserver behind
the fault-injecting proxy, through the modules: tests/integration/test_api_faults.py."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import functools
import json

import pytest
import urllib3
from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s import api, auth

SECRET = "sekret-token-4f1c9e"
HOST = "https://api.example.test:6443"


def _status(code, message, reason="Reason"):
    """A real ApiException as the client raises it for an HTTP answer carrying a Status."""
    return ApiException(status=code, reason=reason, body=json.dumps(
        {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code}))


class _Answers(object):
    """A client method: raises or returns the given answers in turn, recording each call's kwargs."""

    def __init__(self, *answers):
        self.answers, self.calls = list(answers), []

    def __call__(self, *args, **kwargs):
        self.calls.append(kwargs)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.fixture
def slept(monkeypatch):
    """The backoff delays call_api waited, without waiting."""
    delays = []
    monkeypatch.setattr(api.time, "sleep", delays.append)
    return delays


def test_the_retry_budget_is_bounded():
    assert len(api.RETRY_DELAYS) + 1 == 5
    assert sum(api.RETRY_DELAYS) == 7.5
    assert list(api.RETRY_DELAYS) == sorted(api.RETRY_DELAYS)  # backing off, never hammering


@pytest.mark.parametrize("code", [429, 500, 502, 503, 504])
def test_a_short_burst_of_server_errors_is_retried_with_backoff(slept, code):
    call = _Answers(_status(code, "busy"), _status(code, "busy"), "answer")
    assert api.call_api("listing the nodes", call, host=HOST) == "answer"
    assert len(call.calls) == 3 and slept == [0.5, 1]


def test_a_burst_longer_than_the_budget_fails_saying_how_many_attempts(slept):
    call = _Answers(*[_status(503, "injected fault (HTTP 503)", "Service Unavailable")] * 6)
    with pytest.raises(api.ApiError) as failed:
        api.call_api("listing the nodes", call, host=HOST)
    assert (failed.value.status, failed.value.attempts, len(call.calls)) == (503, 5, 5)
    assert slept == list(api.RETRY_DELAYS)
    assert str(failed.value) == ("listing the nodes: the API server at %s answered 503 (injected fault (HTTP 503)) to "
                                 "all 5 attempts over 7.5 s" % HOST)


@pytest.mark.parametrize("code", [400, 401, 403, 404, 409, 410, 422])
def test_refusals_fail_at_once(slept, code):
    call = _Answers(_status(code, "refused"), "never reached")
    with pytest.raises(api.ApiError) as failed:
        api.call_api("reading node n1", call, host=HOST)
    assert (failed.value.status, failed.value.attempts, len(call.calls), slept) == (code, 1, 1, [])
    assert str(failed.value).startswith("reading node n1: ")


def test_401_says_the_credentials_were_rejected_and_never_shows_them(slept):
    refused = _status(401, "Unauthorized", "Unauthorized")
    refused.headers = {"Authorization": "Bearer %s" % SECRET}  # as an echoing proxy might
    assert SECRET in str(refused)  # the exception's own text would leak it
    with pytest.raises(api.ApiError) as failed:
        api.call_api("listing the nodes", _Answers(refused), host=HOST)
    assert str(failed.value) == ("listing the nodes: the API server at %s rejected the credentials (401 Unauthorized); "
                                 "check the token, client certificate or kubeconfig" % HOST)
    assert slept == []


def test_403_quotes_the_server_naming_verb_and_resource():
    denial = ('daemonsets.apps is forbidden: User "doctor" cannot list resource "daemonsets" in API group "apps" at '
              'the cluster scope')
    with pytest.raises(api.ApiError) as failed:
        api.call_api("listing DaemonSets in all namespaces", _Answers(_status(403, denial, "Forbidden")), host=HOST)
    assert str(failed.value) == "listing DaemonSets in all namespaces: forbidden (403) by the API server at %s: %s" % (
        HOST, denial)


def test_404_with_missing_ok_answers_none_and_409_stays_a_conflict():
    assert api.call_api("reading node n1", _Answers(_status(404, 'nodes "n1" not found')), missing_ok=True) is None
    with pytest.raises(api.ApiError) as conflict:
        api.call_api("patching node n1", _Answers(_status(409, "Operation cannot be fulfilled")))
    assert conflict.value.status == 409
    assert str(conflict.value) == "patching node n1: conflict (409): Operation cannot be fulfilled"


def test_every_request_gets_a_timeout_unless_it_sets_one():
    call = _Answers("plain", "watch")
    api.call_api("reading node n1", call, "n1", _preload_content=False)
    api.call_api("watching the nodes", call, watch=True, _request_timeout=(10, 330))
    assert [c["_request_timeout"] for c in call.calls] == [(10, 60), (10, 330)]
    assert call.calls[0]["_preload_content"] is False


def test_a_dropped_connection_is_retried(slept):
    reset = urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionResetError(104, "Connection reset by peer"))
    call = _Answers(reset, urllib3.exceptions.MaxRetryError(None, "/api/v1/nodes", reset), "answer")
    assert api.call_api("listing the nodes", call, host=HOST) == "answer"
    assert slept == [0.5, 1]


def test_tls_failures_and_read_timeouts_are_not_retried(slept):
    tls = ApiException(status=0, reason="SSLError\n[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
    with pytest.raises(api.ApiError) as failed:
        api.call_api("reading node n1", _Answers(tls), host=HOST)
    assert failed.value.status is None
    assert str(failed.value).startswith("reading node n1: TLS verification of the API server at %s failed" % HOST)
    slow = urllib3.exceptions.ReadTimeoutError(None, "/api/v1/nodes", "Read timed out. (read timeout=60)")
    with pytest.raises(api.ApiError) as failed:
        api.call_api("listing the nodes", _Answers(urllib3.exceptions.MaxRetryError(None, "/api/v1/nodes", slow)),
                     host=HOST)
    assert str(failed.value).startswith("listing the nodes: the API server at %s did not answer in time" % HOST)
    assert slept == []


def test_an_unreachable_server_is_named_from_the_client_and_the_token_never_shown(slept):
    # A real client with a token, against a port where nothing listens: the host comes from the
    # client behind the (bound, or partial) method; the message names it and not the token.
    client = auth.api_client({"host": "https://127.0.0.1:9", "api_key": SECRET, "validate_certs": False})
    core = CoreV1Api(client)
    for function in (core.list_node, functools.partial(core.list_node, label_selector="a=b")):
        with pytest.raises(api.ApiError) as failed:
            api.call_api("listing the nodes", function, _request_timeout=(2, 2))
        message = str(failed.value)
        assert message.startswith("listing the nodes: the API server at https://127.0.0.1:9 is unreachable (5 attempts)")
        assert SECRET not in message and failed.value.attempts == 5
    assert slept == list(api.RETRY_DELAYS) * 2
