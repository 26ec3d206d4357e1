# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The doctor: per node, the first broken link between the driver and a schedulable GPU pod.

Plain Python, no Ansible. ``diagnose`` judges one node from two dicts: what the node said
(module_utils/doctor_node.py, through the doctor_node_evidence module) and what the API says
(``doctor_evidence.api_evidence``). The links are checked in ``CHECKS`` order (``doctor_causes.LINKS``)
and the first broken one stops the chain: the links after it are ``not_checked``. Every finding
carries a cause from ``doctor_causes.CAUSES`` (the documented vocabulary), the evidence it saw,
quoted, and the fix. ``format_chain`` writes the reports for people.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuready.nvidia.plugins.module_utils import doctor_checks as checks
from ansible_collections.gpuready.nvidia.plugins.module_utils.doctor_causes import (
    BROKEN, CAUSES, LINKS, NOT_APPLICABLE, NOT_CHECKED, OK, Finding, NotApplicable)

# link -> the check that judges it, in the order of the chain (LINKS)
CHECKS = (
    ('driver', checks.check_driver),
    ('nvml', checks.check_nvml),
    ('device_nodes', checks.check_device_nodes),
    ('toolkit', checks.check_toolkit),
    ('containerd_config', checks.check_containerd_config),
    ('containerd_runtime_loaded', checks.check_containerd_runtime_loaded),
    ('runtime_class', checks.check_runtime_class),
    ('plugin_scheduled', checks.check_plugin_scheduled),
    ('plugin_running', checks.check_plugin_running),
    ('kubelet_registration', checks.check_kubelet_registration),
    ('capacity', checks.check_capacity),
    ('allocatable', checks.check_allocatable),
    ('labels', checks.check_labels),
    ('workload', checks.check_workload),
)


def diagnose(name, host, api, expected=None, settings=None, test_result=None):
    """{status, first_broken_link, cause, evidence, fix, links} for one Kubernetes Node."""
    n = checks.NodeEvidence(name, host, api, expected, settings or {}, test_result)
    links = dict((link, NOT_CHECKED) for link in LINKS)
    report = {'status': OK, 'first_broken_link': None, 'cause': None, 'summary': None, 'evidence': [], 'fix': None,
              'links': links}
    for link, check in CHECKS:
        try:
            check(n)
            links[link] = OK
        except NotApplicable:
            links[link] = NOT_APPLICABLE
        except Finding as finding:
            links[link] = BROKEN
            report.update(status=BROKEN, first_broken_link=link, cause=finding.cause, evidence=finding.evidence,
                          fix=finding.fix, summary=CAUSES[finding.cause][1])
            break
    return report


def format_chain(reports):
    """One line per link and node, for people."""
    lines = []
    for name in sorted(reports):
        report = reports[name]
        lines.append('%s: %s' % (name, 'ok' if report['status'] == OK else 'BROKEN at %s (%s)'
                                 % (report['first_broken_link'], report['cause'])))
        for link in LINKS:
            state = report['links'][link]
            lines.append('  %-26s %s' % (link, state))
            if link == report['first_broken_link']:
                lines.extend('      evidence: %s' % e for e in report['evidence'])
                lines.append('      fix: %s' % report['fix'])
    return lines
