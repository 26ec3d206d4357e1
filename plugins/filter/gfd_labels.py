# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter gfd_labels: the labels GFD would write, over module_utils/gpu_labels.py (docs in gfd_labels.yml)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleFilterError
from ansible_collections.gpuready.nvidia.plugins.module_utils.gpu_labels import LabelError, gfd_labels as _gfd_labels


def gfd_labels(facts, mig_strategy="none", sharing=None, timestamp=False):
    try:
        return _gfd_labels(facts, mig_strategy=mig_strategy, sharing=sharing, timestamp=timestamp)
    except LabelError as exc:
        raise AnsibleFilterError("gfd_labels: %s" % exc)


class FilterModule(object):
    def filters(self):
        return {"gfd_labels": gfd_labels}
