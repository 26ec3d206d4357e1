# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A Kubernetes API server emulator for tests (HTTPS, tokens and client certificates, RBAC, watches,
fault injection), on the standard library plus cryptography and jsonpatch. See README.md.

Tests use ``k8s_emulator.client.Emulator``; the server runs as ``python -m k8s_emulator``.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from .client import Emulator, EmulatorError, Identity

__all__ = ['Emulator', 'EmulatorError', 'Identity']
