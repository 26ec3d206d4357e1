# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter gfd_diagnosis: why a node has no GFD labels, over module_utils/doctor_checks.py (docs in
gfd_diagnosis.yml)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuready.nvidia.plugins.module_utils.doctor_checks import why_no_gfd_labels


def gfd_diagnosis(node, node_name, gfd_pods=None, namespace="nvidia-device-plugin", timeout=300):
    return why_no_gfd_labels(node or None, node_name, gfd_pods, namespace, timeout)


class FilterModule(object):
    def filters(self):
        return {"gfd_diagnosis": gfd_diagnosis}
