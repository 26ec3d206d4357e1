# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""API errors as meta/v1 Status objects, with the reasons and message shapes of the real API server."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

# HTTP code -> the StatusReason the API server uses for it.
REASONS = {
    400: 'BadRequest', 401: 'Unauthorized', 403: 'Forbidden', 404: 'NotFound', 405: 'MethodNotAllowed',
    406: 'NotAcceptable', 409: 'Conflict', 410: 'Expired', 413: 'RequestEntityTooLarge',
    415: 'UnsupportedMediaType', 422: 'Invalid', 429: 'TooManyRequests', 500: 'InternalError',
    503: 'ServiceUnavailable', 504: 'Timeout',
}


class ApiError(Exception):
    """An error answer: raise it anywhere below the HTTP handler."""

    def __init__(self, code, message, reason=None, details=None, headers=None):
        super(ApiError, self).__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or REASONS.get(code, 'Unknown')
        self.details = details
        self.headers = dict(headers or {})

    def status(self):
        body = {'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Failure',
                'message': self.message, 'reason': self.reason, 'code': self.code}
        if self.details:
            body['details'] = self.details
        return body


def _details(rtype, name=None):
    details = {'kind': rtype.resource}
    if name:
        details['name'] = name
    if rtype.group:
        details['group'] = rtype.group
    return details


def not_found(rtype, name):
    return ApiError(404, '%s "%s" not found' % (rtype.qualified, name), details=_details(rtype, name))


def namespace_not_found(namespace):
    return ApiError(404, 'namespaces "%s" not found' % namespace, details={'name': namespace, 'kind': 'namespaces'})


def already_exists(rtype, name):
    return ApiError(409, '%s "%s" already exists' % (rtype.qualified, name), reason='AlreadyExists',
                    details=_details(rtype, name))


def conflict(rtype, name, why='the object has been modified; please apply your changes to the latest version '
                              'and try again'):
    return ApiError(409, 'Operation cannot be fulfilled on %s "%s": %s' % (rtype.qualified, name, why),
                    details=_details(rtype, name))


def invalid(rtype, name, causes, kind=None, group=''):
    """422 with one cause per (field, message) pair, e.g. ('metadata.name', 'Invalid value: "A": ...').
    kind and group name the body's type where it is not rtype's (a Binding, a TokenRequest)."""
    text = ', '.join('%s: %s' % (field, msg) for field, msg in causes)
    group = group if kind else rtype.group
    details = {'name': name or '', 'kind': kind or rtype.kind,
               'causes': [{'reason': _cause_reason(msg), 'message': msg, 'field': field} for field, msg in causes]}
    if group:
        details['group'] = group
    what = ('%s.%s' % (kind, group) if group else kind) if kind else rtype.kind
    return ApiError(422, '%s "%s" is invalid: %s' % (what, name or '', text), details=details)


def _cause_reason(message):
    if message.startswith('Required value'):
        return 'FieldValueRequired'
    if message.startswith('Forbidden'):
        return 'FieldValueForbidden'
    if message.startswith('Unsupported value'):
        return 'FieldValueNotSupported'
    return 'FieldValueInvalid'


def bad_request(message):
    return ApiError(400, message)


def method_not_allowed():
    return ApiError(405, 'the server does not allow this method on the requested resource')


def unsupported_media_type(content_type, accepted):
    return ApiError(415, 'the body of the request was in an unknown format - accepted media types include: %s'
                    % ', '.join(accepted))


def unauthorized():
    # Never echo the presented credentials.
    return ApiError(401, 'Unauthorized')


def path_not_found():
    return ApiError(404, 'the server could not find the requested resource', details={})


def forbidden(user, verb, rtype, namespace, name=None, subresource=None):
    """The authorizer's denial, worded as kube-apiserver words it."""
    what = rtype.resource + ('/' + subresource if subresource else '')
    scope = 'in the namespace "%s"' % namespace if namespace else 'at the cluster scope'
    subject = '%s "%s"' % (rtype.qualified, name) if name else rtype.qualified
    message = '%s is forbidden: User "%s" cannot %s resource "%s" in API group "%s" %s' % (
        subject, user, verb, what, rtype.group, scope)
    return ApiError(403, message, details=_details(rtype, name))


def fault(code, message=None):
    """An injected failure: a Status with the reason that goes with the code."""
    return ApiError(code, message or 'injected fault (HTTP %d)' % code)
