# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Label selectors (equality and set based) and field selectors, parsed once, matched per object.

Both raise ApiError(400) on malformed input, as the API server does. Field selectors accept only
the field labels the resource supports (ResourceType.field_labels), as the API server does:
"field label not supported: spec.foo".
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

from .errors import bad_request
from .validation import label_value_errors, qualified_name_errors

_KEY = r'[^\s=!<>(),]+'
_VALUE = r'[^\s=!<>(),]*'
_NOT_EXISTS = re.compile(r'^\s*!\s*(%s)\s*$' % _KEY)
_SET = re.compile(r'^\s*(%s)\s+(in|notin)\s*\((.*)\)\s*$' % _KEY)
_COMPARE = re.compile(r'^\s*(%s)\s*(==|=|!=|>|<)\s*(%s)\s*$' % (_KEY, _VALUE))
_EXISTS = re.compile(r'^\s*(%s)\s*$' % _KEY)

# Field labels whose value is not at the same dotted path.
_FIELD_ALIASES = {'source': 'source.component'}


def _split_top_level(text):
    """Split on commas outside parentheses."""
    parts, depth, current = [], 0, []
    for char in text:
        if char == '(':
            depth += 1
        elif char == ')':
            depth -= 1
        if char == ',' and depth == 0:
            parts.append(''.join(current))
            current = []
        else:
            current.append(char)
    parts.append(''.join(current))
    return parts


class LabelSelector:
    """A parsed labelSelector; ``matches(labels)``."""

    def __init__(self, text):
        self.text = text or ''
        self.requirements = []
        if not self.text.strip():
            return
        for part in _split_top_level(self.text):
            self.requirements.append(self._parse(part))

    @staticmethod
    def _check(key, values):
        problems = ['key %s: %s' % (key, m) for m in qualified_name_errors(key)]
        for value in values:
            problems.extend('value %s: %s' % (value, m) for m in label_value_errors(value))
        if problems:
            raise bad_request('unable to parse requirement: %s' % '; '.join(problems))

    def _parse(self, part):
        match = _NOT_EXISTS.match(part)
        if match:
            self._check(match.group(1), ())
            return ('!', match.group(1), None)
        match = _SET.match(part)
        if match:
            values = [v.strip() for v in match.group(3).split(',')]
            if values == ['']:
                raise bad_request('unable to parse requirement: for \'in\', \'notin\' operators, values set '
                                  'can\'t be empty')
            self._check(match.group(1), values)
            return (match.group(2), match.group(1), frozenset(values))
        match = _COMPARE.match(part)
        if match:
            key, op, value = match.groups()
            if op in ('>', '<'):
                if not re.match(r'^-?\d+$', value):
                    raise bad_request('unable to parse requirement: for \'Gt\', \'Lt\' operators, the value must be '
                                      'an integer')
                self._check(key, ())
                return (op, key, int(value))
            self._check(key, (value,))
            return ('!=' if op == '!=' else '=', key, value)
        match = _EXISTS.match(part)
        if match:
            self._check(match.group(1), ())
            return ('exists', match.group(1), None)
        raise bad_request('unable to parse requirement: found \'%s\', expected: identifier' % part.strip())

    def matches(self, labels):
        labels = labels or {}
        for op, key, arg in self.requirements:
            present = key in labels
            value = labels.get(key)
            if op == 'exists' and not present:
                return False
            if op == '!' and present:
                return False
            if op == '=' and (not present or value != arg):
                return False
            if op == '!=' and present and value == arg:
                return False
            if op == 'in' and (not present or value not in arg):
                return False
            if op == 'notin' and present and value in arg:
                return False
            if op in ('>', '<'):
                try:
                    number = int(value)
                except (TypeError, ValueError):
                    return False
                if (op == '>' and not number > arg) or (op == '<' and not number < arg):
                    return False
        return True

    def __bool__(self):
        return bool(self.requirements)


def _unescape_split(text, sep):
    """Split text on an unescaped sep; backslash escapes the next character (fields.ParseSelector)."""
    parts, current, escaped = [], [], False
    for char in text:
        if escaped:
            current.append(char)
            escaped = False
        elif char == '\\':
            escaped = True
        elif char == sep:
            parts.append(''.join(current))
            current = []
        else:
            current.append(char)
    parts.append(''.join(current))
    return parts


class FieldSelector:
    """A parsed fieldSelector (=, ==, !=) restricted to the resource's supported field labels."""

    def __init__(self, text, rtype):
        self.text = text or ''
        self.rtype = rtype
        self.requirements = []
        if not self.text.strip():
            return
        for part in _unescape_split(self.text, ','):
            match = re.match(r'^([^=!]+)(==|!=|=)(.*)$', part)
            if not match:
                raise bad_request('invalid selector: \'%s\'; can\'t understand \'%s\'' % (self.text, part))
            field, op, value = match.group(1).strip(), match.group(2), match.group(3)
            if field not in rtype.field_labels:
                raise bad_request('field label not supported: %s' % field)
            self.requirements.append((field, op != '!=', value))

    def value(self, obj, field):
        node = obj
        for step in _FIELD_ALIASES.get(field, field).split('.'):
            node = node.get(step) if isinstance(node, dict) else None
        if node is None:
            return self.rtype.field_defaults.get(field, '')
        if isinstance(node, bool):
            return 'true' if node else 'false'
        return str(node)

    def matches(self, obj):
        for field, equal, expected in self.requirements:
            if (self.value(obj, field) == expected) != equal:
                return False
        return True

    def __bool__(self):
        return bool(self.requirements)
