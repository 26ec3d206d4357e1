# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The three PATCH flavours: JSON merge patch (RFC 7386), strategic merge patch and JSON patch (RFC 6902).

None of the functions mutates its inputs: results share untouched subtrees with the original,
and the store deep-copies what it keeps.

Strategic merge patch is modelled for the built-in types by field name: the lists below merge by
their Kubernetes patchMergeKey, ``finalizers`` merge as a set of strings, every other list is
replaced. Directives supported: ``$patch: replace|delete`` (in maps and list items),
``$deleteFromPrimitiveList/<field>``, ``$retainKeys``; ``$setElementOrder/<field>`` is accepted and
ignored (the merged list keeps the stored order, new items appended).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import jsonpatch
import jsonpointer

# Field name -> patchMergeKey in the built-in types (k8s.io/api, `patchMergeKey` struct tags).
MERGE_KEYS = {
    'containers': 'name', 'initContainers': 'name', 'ephemeralContainers': 'name', 'env': 'name',
    'volumes': 'name', 'volumeMounts': 'mountPath', 'volumeDevices': 'devicePath', 'imagePullSecrets': 'name',
    'conditions': 'type', 'addresses': 'type', 'ownerReferences': 'uid', 'hostAliases': 'ip',
    'topologySpreadConstraints': 'topologyKey', 'resourceClaims': 'name', 'ports': None,  # see _merge_key
}
# Lists of strings merged as sets (patchStrategy "merge" without a key).
PRIMITIVE_MERGE = frozenset(['finalizers'])


class PatchError(Exception):
    """The patch cannot be applied; ``code`` is the HTTP status the API server answers (400 or 422)."""

    def __init__(self, message, code=422):
        super(PatchError, self).__init__(message)
        self.code = code


def merge_patch(target, patch):
    """RFC 7386: maps merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target, operations):
    if not isinstance(operations, list):
        raise PatchError('json: cannot unmarshal object into Go value of type jsonpatch.Patch', code=400)
    try:
        return jsonpatch.apply_patch(target, operations, in_place=False)
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
        raise PatchError('the server rejected our request due to an error in our request: %s' % exc)
    except (TypeError, ValueError, KeyError, IndexError) as exc:
        raise PatchError('invalid JSON patch: %s' % exc, code=400)


_DELETE = object()  # a map that `$patch: delete` removed


def strategic_merge_patch(target, patch):
    if not isinstance(patch, dict):
        raise PatchError('strategic merge patch must be a JSON object', code=400)
    result = _merge_map(target if isinstance(target, dict) else {}, patch)
    return {} if result is _DELETE else result


def _strip_directives(value):
    """A replacement value without $-directives (they must not end up stored)."""
    if isinstance(value, dict):
        return dict((k, _strip_directives(v)) for k, v in value.items() if not k.startswith('$'))
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return value


def _merge_map(original, patch):
    directive = patch.get('$patch')
    if directive == 'delete':
        return _DELETE
    if directive == 'replace':
        return _strip_directives(patch)
    if directive is not None:
        raise PatchError('Unknown patch type: %s in map: %r' % (directive, patch), code=400)
    result = dict(original)
    for key, value in patch.items():
        if key.startswith('$'):
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = _merge_map(result.get(key) if isinstance(result.get(key), dict) else {}, value)
            if merged is _DELETE:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        else:
            result[key] = value
    for key, value in patch.items():
        if key.startswith('$deleteFromPrimitiveList/'):
            field = key.split('/', 1)[1]
            if isinstance(result.get(field), list):
                result[field] = [item for item in result[field] if item not in value]
    retain = patch.get('$retainKeys')
    if isinstance(retain, list):
        result = dict((k, v) for k, v in result.items() if k in retain)
    return result


def _merge_key(field, items):
    if field == 'ports':
        # Container ports merge on containerPort, Service ports on port.
        return 'containerPort' if any(isinstance(i, dict) and 'containerPort' in i for i in items) else 'port'
    return MERGE_KEYS.get(field)


def _merge_list(field, original, patch):
    original = original if isinstance(original, list) else []
    if field in PRIMITIVE_MERGE:
        result = list(original)
        result.extend(item for item in patch if item not in result)
        return result
    if field not in MERGE_KEYS:
        return _strip_directives(patch)
    key = _merge_key(field, original + patch)
    if any(isinstance(i, dict) and i.get('$patch') == 'replace' for i in patch):
        return _strip_directives([i for i in patch if not (isinstance(i, dict) and i.get('$patch') == 'replace')])
    result = list(original)
    for item in patch:
        if not isinstance(item, dict):
            raise PatchError('%s: list items must be objects with the merge key "%s"' % (field, key), code=400)
        if key not in item:
            raise PatchError('map: %r does not contain declared merge key: %s' % (item, key), code=400)
        index = next((n for n, old in enumerate(result) if isinstance(old, dict) and old.get(key) == item[key]), None)
        if item.get('$patch') == 'delete':
            if index is not None:
                del result[index]
            continue
        if index is None:
            result.append(_strip_directives(item))
        else:
            merged = _merge_map(result[index], item)
            if merged is _DELETE:
                del result[index]
            else:
                result[index] = merged
    return result
