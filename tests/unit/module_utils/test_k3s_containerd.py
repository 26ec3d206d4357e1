# -*- coding: utf-8 -*-
"""k3s/RKE2 flavor, against the k3s-rendered fixtures (07: GPU node with nvidia, 08: RKE2 without)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import tomllib

import pytest

import containerd_cases as cases
from ansible_collections.gpuready.nvidia.plugins.module_utils import containerd_config as engine
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_toml import ConfigError
from ansible_collections.gpuready.nvidia.plugins.module_utils import k3s_containerd as k3s

RENDERED = "/var/lib/rancher/k3s/agent/etc/containerd/config.toml"
TEMPLATE = "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl"
DEFAULT_FILE = "/etc/rancher/k3s/config.yaml.d/90-gpuready-nvidia.yaml"
CUSTOM = "/opt/nvidia/bin/nvidia-container-runtime"


def _fixture(name):
    with open(os.path.join(cases.FIXTURES, "real-configs", name)) as handle:
        return handle.read()


K3S_GPU = _fixture("07-k3s-gpu-node.toml")
RKE2 = _fixture("08-rke2-selinux-registry-auth.toml")


def plan(rendered, files=None, drop_in=None, **request):
    return k3s.plan("k3s", RENDERED, rendered, files or {}, engine.Request(**request), "/etc/rancher/k3s", drop_in)


def test_gpu_node_needs_only_the_default():
    changes, outcome = plan(K3S_GPU, set_as_default=True)
    assert changes == {DEFAULT_FILE: k3s.OUR_HEADER + "\ndefault-runtime: nvidia\n"}
    assert outcome.config_version == 3 and outcome.default_runtime_name == "nvidia"
    again = plan(K3S_GPU, files=changes, set_as_default=True)
    assert again[0] == {}


def test_detected_runtime_is_left_to_k3s_with_a_warning():
    changes, outcome = plan(RKE2)
    assert changes == {}
    assert any("adds runtime 'nvidia' itself" in w for w in outcome.warnings)


def test_undetected_runtime_gets_a_template_without_duplicate_tables():
    changes = plan(RKE2, runtime_path=CUSTOM)[0]
    template = changes[TEMPLATE]
    assert template.startswith(k3s.OUR_HEADER) and '{{ template "base" . }}' in template
    table = template.split('{{ template "base" . }}\n', 1)[1]
    rendered = tomllib.loads(RKE2 + "\n" + table)  # what k3s will render: no duplicate table
    runtime = rendered["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["nvidia"]
    assert runtime["options"]["BinaryName"] == CUSTOM
    assert runtime["runtime_type"] == "io.containerd.runc.v2"
    assert plan(RKE2, files={TEMPLATE: template}, runtime_path=CUSTOM)[0] == {}


def test_rendered_runtime_with_another_binary_is_refused():
    with pytest.raises(ConfigError, match="already renders runtime 'nvidia'"):
        plan(K3S_GPU, runtime_path=CUSTOM)


def test_user_template_is_never_edited():
    with pytest.raises(ConfigError, match="template of your own"):
        plan(RKE2, files={TEMPLATE: '{{ template "base" . }}\n'}, runtime_path=CUSTOM)


def test_drop_in_needs_an_import_that_covers_it():
    drop_in = "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d/50-nvidia.toml"
    with pytest.raises(ConfigError, match="does not import"):
        plan(RKE2, drop_in=drop_in, runtime_path=CUSTOM)
    importing = 'imports = ["%s"]\n' % drop_in.replace("50-nvidia.toml", "*.toml") + RKE2
    changes = plan(importing, drop_in=drop_in, runtime_path=CUSTOM)[0]
    assert tomllib.loads(changes[drop_in])["version"] == 3


def test_absent_removes_only_our_files():
    files = {DEFAULT_FILE: k3s.OUR_HEADER + "\ndefault-runtime: nvidia\n",
             TEMPLATE: '{{ template "base" . }}\n'}
    changes = plan(K3S_GPU, files=files, state="absent")[0]
    assert changes == {DEFAULT_FILE: None}


def test_missing_rendered_config_is_explained():
    with pytest.raises(ConfigError, match="start k3s once"):
        plan(None)
