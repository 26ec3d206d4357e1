# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Render a role's Kubernetes manifest template the way the role does, without a play or a cluster.

``render(role, template, overrides=None)`` renders ``roles/<role>/templates/<template>`` with
ansible-core's own templating (Templar over a DataLoader, trim_blocks on, as the ``template``
lookup) and returns the Kubernetes objects it produces (the YAML documents, empty ones dropped).

Variables, later wins: ``roles/gpuready/defaults/main.yml``, ``roles/<role>/defaults/main.yml``,
``overrides``. They are loaded as role defaults are in a play (trusted as templates), and override
strings are trusted as extra vars are, so templated defaults such as ``gpuready_device_plugin_image``
resolve lazily against the final values (an overridden ``gpuready_registry`` reaches the image).
Only ansible.builtin filters and tests are available; collection plugins are not loaded.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

COLLECTION_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROLES_DIR = os.path.join(COLLECTION_ROOT, 'roles')


def _trusted(value):
    """Strings trusted as templates, containers walked (what Ansible does for extra vars)."""
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return dict((key, _trusted(item)) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return [_trusted(item) for item in value]
    return value


def variables(role, overrides=None, loader=None):
    """The variables a template of ``role`` sees: shared defaults, the role's defaults, overrides."""
    loader = loader or DataLoader()
    merged = {}
    for defaults_role in ('gpuready', role):
        path = os.path.join(ROLES_DIR, defaults_role, 'defaults', 'main.yml')
        if os.path.exists(path):
            merged.update(loader.load_from_file(path, trusted_as_template=True) or {})
    merged.update(_trusted(dict(overrides or {})))
    return merged


def render_text(role, template, overrides=None):
    """The rendered text of ``roles/<role>/templates/<template>``."""
    path = os.path.join(ROLES_DIR, role, 'templates', template)
    loader = DataLoader()
    templar = Templar(loader=loader, variables=variables(role, overrides, loader))
    # include/import inside a template resolve from the template's own folder, as in the lookup
    templar = templar.copy_with_new_env(searchpath=[os.path.dirname(path)])
    with open(path) as handle:
        source = handle.read()
    return templar.template(trust_as_template(source), escape_backslashes=False)


def render(role, template, overrides=None):
    """The Kubernetes objects ``roles/<role>/templates/<template>`` renders to (list of dicts)."""
    return [doc for doc in yaml.safe_load_all(render_text(role, template, overrides)) if doc is not None]
