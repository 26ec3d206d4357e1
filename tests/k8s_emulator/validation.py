# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The validation the emulator does on writes: object names, label and annotation keys, label values.

The messages are kube-apiserver's (k8s.io/apimachinery/pkg/util/validation), so a test that
matches on them here matches on a real cluster too. Nothing else in an object is validated.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

_LABEL = r'[a-z0-9]([-a-z0-9]*[a-z0-9])?'
_SUBDOMAIN = _LABEL + r'(\.' + _LABEL + r')*'
_DNS1035 = r'[a-z]([-a-z0-9]*[a-z0-9])?'
_QUALIFIED = r'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]'

_LABEL_RE = re.compile('^%s$' % _LABEL)
_SUBDOMAIN_RE = re.compile('^%s$' % _SUBDOMAIN)
_DNS1035_RE = re.compile('^%s$' % _DNS1035)
_QUALIFIED_RE = re.compile('^%s$' % _QUALIFIED)

LABEL_MSG = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start "
             "and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
             "'%s')" % _LABEL)
SUBDOMAIN_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and "
                 "must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation "
                 "is '%s')" % _SUBDOMAIN)
DNS1035_MSG = ("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic "
               "character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for "
               "validation is '%s')" % _DNS1035)
QUALIFIED_MSG = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
                 "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
                 "'%s')" % _QUALIFIED)
VALUE_MSG = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must "
             "start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used "
             "for validation is '%s')" % _QUALIFIED)


def _quote(value):
    return '"%s"' % value


def name_errors(name, rule):
    """Messages for an invalid metadata.name under rule ('subdomain', 'label', 'dns1035', 'path')."""
    if rule == 'path':
        if name in ('.', '..'):
            return ['may not be \'%s\'' % name]
        return ['may not contain \'%s\'' % c for c in ('/', '%') if c in name]
    errors = []
    if rule == 'label':
        if len(name) > 63:
            errors.append('must be no more than 63 characters')
        if not _LABEL_RE.match(name):
            errors.append(LABEL_MSG)
    elif rule == 'dns1035':
        if len(name) > 63:
            errors.append('must be no more than 63 characters')
        if not _DNS1035_RE.match(name):
            errors.append(DNS1035_MSG)
    else:
        if len(name) > 253:
            errors.append('must be no more than 253 characters')
        if not _SUBDOMAIN_RE.match(name):
            errors.append(SUBDOMAIN_MSG)
    return errors


def qualified_name_errors(key):
    """Messages for a label or annotation key: optional DNS subdomain prefix + '/' + name (<= 63)."""
    parts = key.split('/')
    if len(parts) == 1:
        prefix, name = '', parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            return ['prefix part must be non-empty']
    else:
        return ["a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
                "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
                "validation is '%s') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
                % _QUALIFIED]
    errors = []
    if prefix:
        if len(prefix) > 253:
            errors.append('prefix part must be no more than 253 characters')
        if not _SUBDOMAIN_RE.match(prefix):
            errors.append('prefix part ' + SUBDOMAIN_MSG)
    if not name:
        errors.append('name part must be non-empty')
    else:
        if len(name) > 63:
            errors.append('name part must be no more than 63 characters')
        if not _QUALIFIED_RE.match(name):
            errors.append(QUALIFIED_MSG)
    return errors


def label_value_errors(value):
    errors = []
    if len(value) > 63:
        errors.append('must be no more than 63 characters')
    if value and not _QUALIFIED_RE.match(value):
        errors.append(VALUE_MSG)
    return errors


def metadata_causes(meta, rtype, check_name=True):
    """[(field, message)] for metadata: name (unless generated later), labels, annotations."""
    causes = []
    name = meta.get('name')
    if check_name:
        if not name:
            causes.append(('metadata.name', 'Required value: name or generateName is required'))
        else:
            for msg in name_errors(name, rtype.name_rule):
                causes.append(('metadata.name', 'Invalid value: %s: %s' % (_quote(name), msg)))
    for key, value in sorted((meta.get('labels') or {}).items()):
        for msg in qualified_name_errors(key):
            causes.append(('metadata.labels', 'Invalid value: %s: %s' % (_quote(key), msg)))
        for msg in label_value_errors(value):
            causes.append(('metadata.labels', 'Invalid value: %s: %s' % (_quote(value), msg)))
    for key in sorted((meta.get('annotations') or {})):
        for msg in qualified_name_errors(key):
            causes.append(('metadata.annotations', 'Invalid value: %s: %s' % (_quote(key), msg)))
    return causes


def string_map_problem(meta, field):
    """Why metadata.<field> cannot be decoded (not a map of strings), like Go's JSON decoder; or None."""
    value = meta.get(field)
    if value is None:
        return None
    if not isinstance(value, dict):
        return 'json: cannot unmarshal %s into Go struct field ObjectMeta.metadata.%s of type map[string]string' % (
            _json_type(value), field)
    for item in value.values():
        if not isinstance(item, str):
            return 'json: cannot unmarshal %s into Go struct field ObjectMeta.metadata.%s of type string' % (
                _json_type(item), field)
    return None


def _json_type(value):
    if isinstance(value, bool):
        return 'bool'
    if isinstance(value, (int, float)):
        return 'number'
    if isinstance(value, list):
        return 'array'
    if isinstance(value, dict):
        return 'object'
    return 'string'
