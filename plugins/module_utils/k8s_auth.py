# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kubernetes API authentication shared by every gpuready.nvidia module that talks to the API.

The option names, aliases and K8S_AUTH_* environment variables are kubernetes.core's, so one
``module_defaults: group/gpuready.nvidia.k8s`` block (or the same environment) serves both
collections. Plain Python apart from the argument spec; the doc fragment is
``gpuready.nvidia.k8s_auth``.

``call_api`` makes every request of those modules: a bounded retry with backoff for what passes
(5xx, 429, a dropped connection), an ``ApiError`` at once for what does not (401, 403, 404, 409,
TLS), with a message that says what was asked and never carries the credentials.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import time

from ansible.module_utils.basic import env_fallback

try:
    import urllib3
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException
    HAS_KUBERNETES = True
    KUBERNETES_IMPORT_ERROR = None
except ImportError as exc:  # pragma: no cover - depends on the controller
    HAS_KUBERNETES = False
    KUBERNETES_IMPORT_ERROR = exc

AUTH_ARG_SPEC = dict(
    kubeconfig=dict(type='raw', no_log=True, fallback=(env_fallback, ['K8S_AUTH_KUBECONFIG'])),
    context=dict(type='str', fallback=(env_fallback, ['K8S_AUTH_CONTEXT'])),
    host=dict(type='str', fallback=(env_fallback, ['K8S_AUTH_HOST'])),
    api_key=dict(type='str', no_log=True, fallback=(env_fallback, ['K8S_AUTH_API_KEY'])),
    validate_certs=dict(type='bool', aliases=['verify_ssl'], fallback=(env_fallback, ['K8S_AUTH_VERIFY_SSL'])),
    ca_cert=dict(type='path', aliases=['ssl_ca_cert'], fallback=(env_fallback, ['K8S_AUTH_SSL_CA_CERT'])),
    client_cert=dict(type='path', aliases=['cert_file'], fallback=(env_fallback, ['K8S_AUTH_CERT_FILE'])),
    client_key=dict(type='path', aliases=['key_file'], no_log=False, fallback=(env_fallback, ['K8S_AUTH_KEY_FILE'])),
    proxy=dict(type='str', fallback=(env_fallback, ['K8S_AUTH_PROXY'])),
    no_proxy=dict(type='str', fallback=(env_fallback, ['K8S_AUTH_NO_PROXY'])),
    proxy_headers=dict(type='dict', options=dict(
        proxy_basic_auth=dict(type='str', no_log=True),
        basic_auth=dict(type='str', no_log=True),
        user_agent=dict(type='str'),
    )),
    persist_config=dict(type='bool', fallback=(env_fallback, ['K8S_AUTH_PERSIST_CONFIG'])),
)


# Seconds to wait before each retry of a 5xx, a 429 or a dropped connection: 5 attempts, 7.5 s of
# backoff in all, enough for an API server restart or a leader election, short enough to fail a play soon.
RETRY_DELAYS = (0.5, 1, 2, 4)
REQUEST_TIMEOUT = (10, 60)  # connect, read (seconds) of every request that sets none


class K8sAuthError(Exception):
    """The client cannot be configured (no kubeconfig, bad context, missing library)."""


def _kubeconfig(params, configuration):
    """Load the kubeconfig (a path, a dict, or $KUBECONFIG / ~/.kube/config) into configuration.
    As in kubernetes.core, none is read when host and credentials are given without one."""
    kubeconfig = params.get('kubeconfig')
    if not kubeconfig and params.get('host') and (params.get('api_key') or params.get('client_cert')):
        return
    persist = bool(params.get('persist_config'))
    try:
        if isinstance(kubeconfig, dict):
            k8s_config.load_kube_config_from_dict(kubeconfig, context=params.get('context'),
                                                  client_configuration=configuration, persist_config=persist)
        else:
            path = kubeconfig or os.environ.get('KUBECONFIG', '~/.kube/config').split(os.pathsep)[0]
            k8s_config.load_kube_config(config_file=os.path.expanduser(path), context=params.get('context'),
                                        client_configuration=configuration, persist_config=persist)
    except (ConfigException, IOError, OSError, ValueError, TypeError) as exc:
        raise K8sAuthError('cannot load kubeconfig %s: %s' % (
            'from the given dict' if isinstance(kubeconfig, dict) else kubeconfig or '(default)', exc))


def api_client(params):
    """A kubernetes.client.ApiClient from the AUTH_ARG_SPEC options (explicit options win over the
    kubeconfig, as in kubernetes.core). Certificates are verified unless validate_certs is false or,
    with validate_certs unset, the kubeconfig says insecure-skip-tls-verify."""
    if not HAS_KUBERNETES:
        raise K8sAuthError('the kubernetes Python library is not installed: %s' % KUBERNETES_IMPORT_ERROR)
    configuration = k8s_client.Configuration()
    _kubeconfig(params, configuration)
    if params.get('host'):
        configuration.host = params['host']
    if params.get('api_key'):
        configuration.api_key = {'authorization': 'Bearer %s' % params['api_key']}
        # The kubeconfig loader re-sets its own token before every request through this hook.
        configuration.refresh_api_key_hook = None
    if params.get('ca_cert'):
        configuration.ssl_ca_cert = params['ca_cert']
    if params.get('client_cert'):
        configuration.cert_file = params['client_cert']
    if params.get('client_key'):
        configuration.key_file = params['client_key']
    if params.get('validate_certs') is not None:
        configuration.verify_ssl = params['validate_certs']
    if params.get('proxy'):
        configuration.proxy = params['proxy']
    if params.get('no_proxy'):
        configuration.no_proxy = params['no_proxy']
    if params.get('proxy_headers'):
        headers = dict((k, v) for k, v in params['proxy_headers'].items() if v is not None)
        configuration.proxy_headers = urllib3.util.make_headers(**headers)
    if not configuration.host or configuration.host == 'http://localhost':
        raise K8sAuthError('no API server: give host or a kubeconfig with a current context')
    return k8s_client.ApiClient(configuration)


# --- making requests --------------------------------------------------------------------------


class ApiError(Exception):
    """A request failed for good. status is the HTTP status (None: no answer); the message says what
    was asked and why, never the credentials."""

    def __init__(self, message, status=None, attempts=1):
        super(ApiError, self).__init__(message)
        self.status = status
        self.attempts = attempts


def status_message(exc):
    """The message of the Status an ApiException carries, else its reason."""
    try:
        return json.loads(exc.body).get("message") or exc.reason
    except (TypeError, ValueError, AttributeError):
        return exc.reason


def retriable_status(status):
    """Whether an HTTP status is worth another try: the server was busy or failing, not refusing."""
    return bool(status) and (status == 429 or status >= 500)


def _retriable_connection(reason):
    """A connection refused, reset or dropped passes; TLS failures and read time-outs do not (urllib3
    already retried a timed-out GET, and a retried write could apply twice)."""
    if isinstance(reason, urllib3.exceptions.MaxRetryError):
        reason = reason.reason
    if isinstance(reason, (urllib3.exceptions.SSLError, urllib3.exceptions.ReadTimeoutError)):
        return False
    return isinstance(reason, (urllib3.exceptions.ProtocolError, urllib3.exceptions.NewConnectionError,
                               ConnectionError))


def _host_of(function):
    """The API server a (bound, maybe partial) client method talks to, for messages."""
    api = getattr(getattr(function, "func", function), "__self__", None)
    return getattr(getattr(getattr(api, "api_client", None), "configuration", None), "host", None)


def api_error_message(what, status, message, host=None, attempts=1):
    """What a failed request means for people. message is the server's Status message: the server
    never echoes the credentials, and neither does this."""
    server = "the API server at %s" % host if host else "the API server"
    if status == 401:
        return "%s: %s rejected the credentials (401 Unauthorized); check the token, client certificate or kubeconfig" % (
            what, server)
    if status == 403:
        return "%s: forbidden (403) by %s: %s" % (what, server, message)
    if status == 404:
        return "%s: not found (404): %s" % (what, message)
    if status == 409:
        return "%s: conflict (409): %s" % (what, message)
    if retriable_status(status) and attempts > 1:
        return "%s: %s answered %s (%s) to all %d attempts over %g s" % (
            what, server, status, message, attempts, sum(RETRY_DELAYS[:attempts - 1]))
    return "%s: %s answered %s: %s" % (what, server, status, message)


def connection_error_message(what, reason, host=None, attempts=1):
    server = "the API server at %s" % host if host else "the API server"
    if isinstance(reason, urllib3.exceptions.SSLError) or "CERTIFICATE_VERIFY_FAILED" in str(reason):
        return ("%s: TLS verification of %s failed (%s); give ca_cert (the cluster CA) or, only for a test "
                "cluster, validate_certs: false" % (what, server, reason))
    if isinstance(reason, urllib3.exceptions.ReadTimeoutError):
        return "%s: %s did not answer in time (%s)" % (what, server, reason)
    tries = " (%d attempts)" % attempts if attempts > 1 else ""
    return "%s: %s is unreachable%s: %s" % (what, server, tries, reason)


def call_api(what, function, *args, host=None, missing_ok=False, **kwargs):
    """function(*args, **kwargs), a kubernetes client method, with REQUEST_TIMEOUT unless kwargs set
    _request_timeout. 5xx, 429 and dropped connections are tried again after each of RETRY_DELAYS;
    anything else fails at once. Failures raise ApiError, whose message starts with what (the
    request, for people) and names host (default: the client's). With missing_ok, 404 answers None."""
    host = host or _host_of(function)
    kwargs.setdefault("_request_timeout", REQUEST_TIMEOUT)
    for attempt, delay in enumerate(RETRY_DELAYS + (None,), 1):
        try:
            return function(*args, **kwargs)
        except ApiException as exc:
            if not exc.status:  # the client's wrapping of a TLS failure
                raise ApiError(connection_error_message(what, exc.reason, host))
            if exc.status == 404 and missing_ok:
                return None
            if not retriable_status(exc.status) or delay is None:
                raise ApiError(api_error_message(what, exc.status, status_message(exc), host, attempt),
                               exc.status, attempt)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            reason = exc.reason if isinstance(exc, urllib3.exceptions.MaxRetryError) else exc
            if not _retriable_connection(reason) or delay is None:
                raise ApiError(connection_error_message(what, reason, host, attempt), None, attempt)
        time.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover
