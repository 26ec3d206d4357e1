# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters gpu_components and owned_selectors over module_utils/k8s/workloads.py: what GPU
components gpuready.nvidia did not deploy, and the label selectors of what it did (docs in
gpu_components.yml and owned_selectors.yml)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleFilterError
from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s import workloads


def gpu_components(daemonsets, cluster_policies=None):
    try:
        return workloads.gpu_components(daemonsets, cluster_policies)
    except (AttributeError, TypeError, ValueError) as exc:
        raise AnsibleFilterError("gpu_components: expected k8s_info results or lists of objects: %s" % exc)


def owned_selectors(selectors=None):
    return workloads.owned_selectors(selectors)


class FilterModule(object):
    def filters(self):
        return {"gpu_components": gpu_components, "owned_selectors": owned_selectors}
