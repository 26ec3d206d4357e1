# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Everything the collection asks of the Kubernetes API, split by job: auth (the option spec and the
client), api (requests, reading, listing, watching), pods (why a pod waits, the GPU test pod) and
workloads (what a GPU workload is, whose it is, where it may run)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type
