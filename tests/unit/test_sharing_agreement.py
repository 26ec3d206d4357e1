# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One gpuready_mig_strategy and one gpuready_sharing feed three readers: the device plugin's config
(roles/device_plugin), GFD's config (roles/feature_discovery) and our label engine
(plugins/module_utils/gpu_labels.py, which k8s_gpu_labels and the validation use). For every sharing
case and valid MIG strategy, both configs are rendered and parsed, must carry the same migStrategy
and sharing, and the engine must give, from what the configs say, the replicas, product name and
resources that sharing implies on the seed node (4x Tesla P4)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy

import pytest
import yaml

import gfd_cases
import manifest_render

from ansible_collections.gpuready.nvidia.plugins.module_utils import gpu_labels

SEED = 'seed-4x-tesla-p4-driver-535'
GPU = 'nvidia.com/gpu'

# sharing setting, and what it must mean on 4 Tesla P4: replicas label, product label, sharing-strategy
# label, advertised resources
CASES = {
    'none': (None, '1', 'Tesla-P4', 'none', {GPU: 4}),
    'time-slicing-4': ({'strategy': 'time-slicing', 'resources': [{'name': GPU, 'replicas': 4}]},
                       '4', 'Tesla-P4-SHARED', 'time-slicing', {GPU: 16}),
    'time-slicing-4-renamed': ({'strategy': 'time-slicing', 'rename_by_default': True,
                                'resources': [{'name': GPU, 'replicas': 4}]},
                               '4', 'Tesla-P4', 'time-slicing', {GPU + '.shared': 16}),
    'mps-2': ({'strategy': 'mps', 'resources': [{'name': GPU, 'replicas': 2}]}, '2', 'Tesla-P4-SHARED', 'mps', {GPU: 8}),
}
# The device plugin refuses MPS with mig-strategy mixed (both roles' preflights stop it)
PAIRS = [(sharing, mig) for sharing in CASES for mig in ('none', 'single', 'mixed')
         if not (sharing.startswith('mps') and mig == 'mixed')]


def _seed_facts():
    [case] = [c for _name, c in gfd_cases.load(gfd_cases.PUBLIC) if c['name'] == SEED]
    facts = gfd_cases.facts_of(case)
    assert [d['name'] for d in facts['devices']] == ['Tesla P4'] * 4 and not any(d['mig_capable'] for d in facts['devices'])
    return facts


def _configmap_config(objects, name):
    [configmap] = [o for o in objects if o['kind'] == 'ConfigMap' and o['metadata']['name'] == name]
    return yaml.safe_load(configmap['data']['config.yaml'])


def _configs(sharing, mig):
    settings = {'gpuready_sharing': copy.deepcopy(CASES[sharing][0]), 'gpuready_mig_strategy': mig}
    plugin = _configmap_config(manifest_render.render('device_plugin', 'device-plugin.yml.j2', settings),
                               'nvidia-device-plugin-config')
    gfd = _configmap_config(manifest_render.render('feature_discovery', 'gfd.yml.j2', settings),
                            'gpu-feature-discovery-config')
    return plugin, gfd


def _engine_sharing(config):
    """A config's sharing section in the label engine's form, as both binaries read it: mps wins over
    timeSlicing, only renameByDefault survives of the renaming options."""
    sections = config.get('sharing') or {}
    for strategy, key in (('mps', 'mps'), ('time-slicing', 'timeSlicing')):
        if sections.get(key):
            return {'strategy': strategy, 'rename_by_default': sections[key].get('renameByDefault', False),
                    'resources': [{'name': r['name'], 'replicas': r['replicas']} for r in sections[key]['resources']]}
    return None


@pytest.mark.parametrize('sharing,mig', PAIRS)
def test_plugin_and_gfd_configs_carry_the_same_mig_strategy_and_sharing(sharing, mig):
    plugin, gfd = _configs(sharing, mig)
    assert plugin['version'] == gfd['version'] == 'v1'
    assert plugin['flags']['migStrategy'] == gfd['flags']['migStrategy'] == mig
    assert plugin.get('sharing') == gfd.get('sharing')
    assert ('sharing' in gfd) == (CASES[sharing][0] is not None)


@pytest.mark.parametrize('sharing,mig', PAIRS)
def test_label_engine_gives_what_the_configs_imply(sharing, mig):
    setting, replicas, product, strategy, resources = CASES[sharing]
    plugin, gfd = _configs(sharing, mig)
    facts = _seed_facts()

    labels = gpu_labels.gfd_labels(facts, gfd['flags']['migStrategy'], _engine_sharing(gfd))
    assert labels['nvidia.com/gpu.replicas'] == replicas
    assert labels['nvidia.com/gpu.product'] == product
    assert labels['nvidia.com/gpu.sharing-strategy'] == strategy
    assert labels['nvidia.com/gpu.count'] == '4'
    assert labels['nvidia.com/mps.capable'] == ('true' if strategy == 'mps' else 'false')
    assert labels.get('nvidia.com/mig.strategy') == (None if mig == 'none' else mig)
    # k8s_gpu_labels labels from the settings themselves: the same labels as GFD reading its config
    assert gpu_labels.gfd_labels(facts, mig, setting) == labels

    advertised = gpu_labels.expected_node_resources(facts, plugin['flags']['migStrategy'], _engine_sharing(plugin))
    assert advertised == resources
    assert gpu_labels.expected_node_resources(facts, mig, setting) == advertised


def test_the_cases_differ_where_sharing_says_they_must():
    """A control on the table above: every sharing case renders a different config."""
    rendered = [yaml.safe_dump(_configs(sharing, 'none')[1], sort_keys=True) for sharing in CASES]
    assert len(set(rendered)) == len(CASES)
