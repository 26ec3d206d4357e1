# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""doctor_causes.py: the vocabulary is consistent (every cause breaks a known link, says what it
means and how to fix it) and a Finding carries its cause's fix unless given another."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuready.nvidia.plugins.module_utils import doctor_causes as dc


def test_every_cause_breaks_a_link_of_the_chain_and_says_what_to_do():
    assert len(set(dc.LINKS)) == len(dc.LINKS) == 14
    for cause, (link, summary, fix) in dc.CAUSES.items():
        assert link in dc.LINKS, cause
        assert summary and fix, cause
    assert set(link for link, _summary, _fix in dc.CAUSES.values()) == set(dc.LINKS)


def test_a_finding_quotes_its_evidence_and_defaults_to_the_causes_fix():
    finding = dc.Finding('nouveau_loaded', 'the nouveau module is loaded')
    assert finding.cause == 'nouveau_loaded' and finding.evidence == ['the nouveau module is loaded']
    assert finding.fix == dc.CAUSES['nouveau_loaded'][2]
    other = dc.Finding('plugin_crashing', ('a', 'b'), fix='restart it')
    assert other.evidence == ['a', 'b'] and other.fix == 'restart it'
