# -*- coding: utf-8 -*-
"""Shared by every test layer. pytest puts this folder on sys.path, so tests import the helpers
beside it (containerd_cases) by name."""
