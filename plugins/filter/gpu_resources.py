# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter gpu_resources: what the device plugin advertises, over module_utils/gpu_labels.py (docs in gpu_resources.yml)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleFilterError
from ansible_collections.gpuready.nvidia.plugins.module_utils.gpu_labels import LabelError, expected_node_resources


def gpu_resources(facts, mig_strategy="none", sharing=None):
    try:
        return expected_node_resources(facts, mig_strategy=mig_strategy, sharing=sharing)
    except LabelError as exc:
        raise AnsibleFilterError("gpu_resources: %s" % exc)


class FilterModule(object):
    def filters(self):
        return {"gpu_resources": gpu_resources}
