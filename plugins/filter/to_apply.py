# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter to_apply over module_utils/k8s/cluster.py: the rendered objects a role still has to apply, each
with its fingerprint (docs in to_apply.yml)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleFilterError
from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s import cluster


def to_apply(objects, current=None):
    try:
        return cluster.to_apply(objects, current)
    except (AttributeError, TypeError, KeyError) as exc:
        raise AnsibleFilterError("to_apply: expected a list of Kubernetes objects and a list of keys: %s" % exc)


class FilterModule(object):
    def filters(self):
        return {"to_apply": to_apply}
