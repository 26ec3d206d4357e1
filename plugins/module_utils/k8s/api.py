# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Asking the Kubernetes API: one request, one object, a whole list, a watch.

Plain Python over the kubernetes client (the client comes from ``k8s.auth.api_client``).

* ``call_api`` makes every request of the collection's modules: a bounded retry with backoff for
  what passes (5xx, 429, a dropped connection), an ``ApiError`` at once for what does not (401, 403,
  404, 409, TLS), with a message that says what was asked and never carries the credentials.
* Objects are read as raw JSON (``_preload_content=False``, ``json_body``) so a list page, a watch
  event and a test's fixture are the same dicts.
* ``list_objects`` LISTs page by page (an expired continue token starts the list again);
  ``follow`` LISTs, then WATCHes from that list's resourceVersion until a condition holds or a
  deadline passes (an expired watch, 410, is answered by listing again, as informers do).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import functools
import json
import math
import time

# Seconds to wait before each retry of a 5xx, a 429 or a dropped connection: 5 attempts, 7.5 s of
# backoff in all, enough for an API server restart or a leader election, short enough to fail a play soon.
RETRY_DELAYS = (0.5, 1, 2, 4)
REQUEST_TIMEOUT = (10, 60)  # connect, read (seconds) of every request that sets none
RELIST_ATTEMPTS = 5          # an expired continue token: start the list again, at most this often


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


def _urllib3_errors():
    """urllib3.exceptions, imported on first use, as the kubernetes client is: filters import this file on the
    controller (through the doctor's checks and node_labels), where Ansible loads every filter file of the
    collection again for each task that uses one of them, and these imports cost a third of a second."""
    import urllib3.exceptions
    return urllib3.exceptions


def retriable_status(status):
    """Whether an HTTP status is worth another try: the server was busy or failing, not refusing."""
    return bool(status) and (status == 429 or status >= 500)


def _retriable_connection(reason):
    """A connection refused, reset or dropped passes; TLS failures and read time-outs do not (urllib3
    already retried a timed-out GET, and a retried write could apply twice)."""
    errors = _urllib3_errors()
    if isinstance(reason, errors.MaxRetryError):
        reason = reason.reason
    if isinstance(reason, (errors.SSLError, errors.ReadTimeoutError)):
        return False
    return isinstance(reason, (errors.ProtocolError, errors.NewConnectionError,
                               ConnectionError))


def _host_of(function):
    """The API server a (bound, maybe partial) client method talks to, for messages: a typed API's
    api_client, or a client that carries its configuration itself (RawClient)."""
    api = getattr(getattr(function, "func", function), "__self__", None)
    configuration = getattr(getattr(api, "api_client", None), "configuration", None) or getattr(api, "configuration", None)
    return getattr(configuration, "host", None)


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
    errors = _urllib3_errors()
    if isinstance(reason, errors.SSLError) or "CERTIFICATE_VERIFY_FAILED" in str(reason):
        return ("%s: TLS verification of %s failed (%s); give ca_cert (the cluster CA) or, only for a test "
                "cluster, validate_certs: false" % (what, server, reason))
    if isinstance(reason, errors.ReadTimeoutError):
        return "%s: %s did not answer in time (%s)" % (what, server, reason)
    tries = " (%d attempts)" % attempts if attempts > 1 else ""
    return "%s: %s is unreachable%s: %s" % (what, server, tries, reason)


def call_api(what, function, *args, host=None, missing_ok=False, **kwargs):
    """function(*args, **kwargs), a kubernetes client method, with REQUEST_TIMEOUT unless kwargs set
    _request_timeout. 5xx, 429 and dropped connections are tried again after each of RETRY_DELAYS;
    anything else fails at once. Failures raise ApiError, whose message starts with what (the
    request, for people) and names host (default: the client's). With missing_ok, 404 answers None."""
    from kubernetes.client.exceptions import ApiException  # not at the top: see _urllib3_errors

    errors = _urllib3_errors()
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
        except (errors.HTTPError, OSError) as exc:
            reason = exc.reason if isinstance(exc, errors.MaxRetryError) else exc
            if not _retriable_connection(reason) or delay is None:
                raise ApiError(connection_error_message(what, reason, host, attempt), None, attempt)
        time.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover


# --- reading objects ---------------------------------------------------------------------------


class _NoDiscovery(object):
    """A DynamicClient discoverer that reads nothing: RawClient's requests name their paths."""

    def __init__(self, client, cache_file=None):
        pass


class RawClient(object):
    """get(path, **params) sends one GET to an API path (such as /apis/apps/v1/daemonsets) with the query
    parameters list_objects and call_api pass (limit, _continue, label_selector, _request_timeout) and returns
    the raw response (json_body reads it). It is the kubernetes client's DynamicClient.request without
    discovery or deserialising: the typed APIs (CoreV1Api, ...) cost a module more than a second of imports,
    and DynamicClient.request speaks to the ApiClient of every client version."""

    def __init__(self, api_client):
        from kubernetes.dynamic import DynamicClient
        self.configuration = api_client.configuration
        self._client = DynamicClient(api_client, discoverer=_NoDiscovery)

    def get(self, path, **params):
        params.pop('_preload_content', None)  # always raw
        return self._client.request('GET', path, serialize=False, **params)


def path_of(api_version, plural, name=None, namespace=None):
    """The API path of a resource (core group under /api, the others under /apis), in a namespace or not,
    one object by name or the whole collection."""
    group = '/api/%s' % api_version if '/' not in api_version else '/apis/%s' % api_version
    where = '/namespaces/%s' % namespace if namespace else ''
    return '%s%s/%s%s' % (group, where, plural, '/%s' % name if name else '')


class ListWatchError(Exception):
    """A list or a watch could not be completed (a list that kept expiring, a watch's ERROR event)."""


def json_body(response):
    """The JSON of a raw response (a request made with _preload_content=False), its connection released."""
    try:
        return json.loads(response.data)
    finally:
        response.release_conn()


def read_object(what, func, *args, **kwargs):
    """One object as a dict through call_api (retries, messages); None where missing_ok and 404."""
    response = call_api(what, func, *args, _preload_content=False, **kwargs)
    return None if response is None else json_body(response)


def list_all(what, list_func, **kwargs):
    """Every object list_func (with kwargs such as a namespace or a field selector) returns."""
    return list_objects(functools.partial(list_func, **kwargs), what=what)[0]


def _name(obj):
    return (obj.get("metadata") or {}).get("name")


# --- list and watch -------------------------------------------------------------------------


def list_objects(list_func, label_selector=None, page_size=500, what="listing"):
    """Every object list_func returns for the selector, page_size per request; (objects, the
    resourceVersion of the first page). A continue token that expired (410) starts the list again.
    what names the list in messages."""
    for _attempt in range(RELIST_ATTEMPTS):
        objects, token, resource_version = [], None, None
        try:
            while True:
                kwargs = dict(limit=page_size, _preload_content=False)
                if label_selector:
                    kwargs["label_selector"] = label_selector
                if token:
                    kwargs["_continue"] = token
                page = json_body(call_api(what, list_func, **kwargs))
                metadata = page.get("metadata") or {}
                # Later pages are a snapshot of the first one's revision: watching from it misses nothing.
                resource_version = resource_version or metadata.get("resourceVersion")
                objects.extend(page.get("items") or [])
                token = metadata.get("continue")
                if not token:
                    return objects, resource_version
        except ApiError as exc:
            if exc.status != 410 or token is None:
                raise
    raise ListWatchError("%s: the list kept expiring between pages (%d attempts)" % (what, RELIST_ATTEMPTS))


class _Expired(Exception):
    pass


def _lines(response):
    """The newline-separated lines of a streamed (chunked) response."""
    pending = b""
    for chunk in response.stream(4096):
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line.strip():
                yield line
    if pending.strip():
        yield pending


def follow(list_func, label_selector, page_size, deadline, done, what="the objects"):
    """LIST, then WATCH from the list's resourceVersion, keeping {name: object} current, until
    done(objects) is true or the deadline passes; returns the objects last seen. A watch that
    expired (410, as an HTTP answer or an ERROR event) is replaced by a fresh LIST. what names the
    objects in messages."""
    items, resource_version = list_objects(list_func, label_selector, page_size, "listing %s" % what)
    objects = dict((_name(o), o) for o in items)
    while not done(objects):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        kwargs = dict(watch=True, resource_version=resource_version, allow_watch_bookmarks=True,
                      timeout_seconds=max(1, int(math.ceil(remaining))), _preload_content=False,
                      _request_timeout=(REQUEST_TIMEOUT[0], remaining + 30))
        if label_selector:
            kwargs["label_selector"] = label_selector
        try:
            response = call_api("watching %s" % what, list_func, **kwargs)
            try:
                for line in _lines(response):
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        if obj.get("code") == 410:
                            raise _Expired()
                        raise ListWatchError("watching %s failed: %s" % (what, obj.get("message")))
                    resource_version = (obj.get("metadata") or {}).get("resourceVersion") or resource_version
                    if event.get("type") == "DELETED":
                        objects.pop(_name(obj), None)
                    elif event.get("type") in ("ADDED", "MODIFIED"):
                        objects[_name(obj)] = obj
                    if done(objects):
                        break
            finally:
                response.close()  # a watch cut short must not go back to the pool half read
                response.release_conn()
        except (_Expired, ApiError) as exc:
            if isinstance(exc, ApiError) and exc.status != 410:
                raise
            items, resource_version = list_objects(list_func, label_selector, page_size, "listing %s" % what)
            objects = dict((_name(o), o) for o in items)
        except _urllib3_errors().HTTPError:
            time.sleep(1)  # the stream broke; watch again from the last resourceVersion seen
    return objects
