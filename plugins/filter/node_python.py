# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters node_python_*: the decisions of the node_python role, over module_utils/node_python.py (docs in
node_python_*.yml). They run on the controller, on what the role's commands printed on the node."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import functools

from ansible.errors import AnsibleFilterError
from ansible_collections.gpuready.nvidia.plugins.module_utils import node_python


def _reported(name, decide):
    """decide, with its NodePythonError as the filter error Ansible reports (prefixed with the filter's name)."""
    @functools.wraps(decide)
    def wrapper(*args, **kwargs):
        try:
            return decide(*args, **kwargs)
        except node_python.NodePythonError as exc:
            raise AnsibleFilterError('%s: %s' % (name, exc))
    return wrapper


# filter name -> the decision it makes (the filters' arguments are those of the functions)
DECISIONS = {
    'node_python_system_problem': node_python.system_python_problem,
    'node_python_found': node_python.first_look,
    'node_python_look_again': node_python.look_again,
    'node_python_distro_query': node_python.distro_query,
    'node_python_distro_plan': node_python.distro_plan,
    'node_python_pip': node_python.pip_plan,
    'node_python_result': node_python.result,
}


class FilterModule(object):
    def filters(self):
        return dict((name, _reported(name, decide)) for name, decide in DECISIONS.items())
