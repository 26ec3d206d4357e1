# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Test owned: whether gpuready.nvidia deployed a Kubernetes object, the rule of
module_utils/k8s/workloads.py (docs in owned.yml)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s import workloads


def owned(obj):
    return workloads.owned(obj)


class TestModule(object):
    def tests(self):
        return {"owned": owned}
