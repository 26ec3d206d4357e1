# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter nfd_labels: the label keys NFD set on a Node, over module_utils/node_labels.py (docs in
nfd_labels.yml)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuready.nvidia.plugins.module_utils.node_labels import nfd_labels


class FilterModule(object):
    def filters(self):
        return {"nfd_labels": nfd_labels}
