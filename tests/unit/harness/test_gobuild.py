# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""lab/go/gobuild.py without the go command: how an upstream go.mod's replace directives become ours.
The upstream texts below are cut from the real go.mod files (k8s.io/kubernetes v1.37.2, etcd server
v3.6.16, node-feature-discovery v0.19.0); the expected blocks are written out by hand."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

import lab_scripts

gobuild = lab_scripts.script('lab/go/gobuild.py', 'gobuild')

KUBERNETES = '''module k8s.io/kubernetes

go 1.26.0

godebug default=go1.26

require (
\tgithub.com/blang/semver/v4 v4.0.0
\tk8s.io/api v0.0.0
\tk8s.io/client-go v0.0.0
\tk8s.io/kubelet v0.0.0
)

require (
\tgithub.com/go-logr/logr v1.4.3 // indirect
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
\tk8s.io/kubelet => ./staging/src/k8s.io/kubelet
\tk8s.io/sample-cli-plugin => ./staging/src/k8s.io/sample-cli-plugin
)
'''

ETCD = '''module go.etcd.io/etcd/server/v3

require (
\tgo.etcd.io/etcd/api/v3 v3.6.16
\tgo.etcd.io/etcd/pkg/v3 v3.6.16
)

replace (
\tgo.etcd.io/etcd/api/v3 => ../api
\tgo.etcd.io/etcd/pkg/v3 => ../pkg
)

// Bad imports are sometimes causing attempts to pull that code.
// This makes the error more explicit.
replace go.etcd.io/etcd => ./FORBIDDEN_DEPENDENCY
'''

NFD = '''module sigs.k8s.io/node-feature-discovery

require (
\tk8s.io/api v0.35.3
\tsigs.k8s.io/node-feature-discovery/api/nfd v0.0.0-00010101000000-000000000000
)

replace (
\tk8s.io/api => k8s.io/api v0.35.3
\tk8s.io/legacy-cloud-providers => k8s.io/legacy-cloud-providers v0.35.3
\tsigs.k8s.io/node-feature-discovery/api/nfd => ./api/nfd
)
'''


def test_staging_modules_become_published_releases():
    assert gobuild.carried_replaces(KUBERNETES, 'v0.37.2') == {
        'k8s.io/api': ['k8s.io/api', 'v0.37.2'],
        'k8s.io/client-go': ['k8s.io/client-go', 'v0.37.2'],
        'k8s.io/kubelet': ['k8s.io/kubelet', 'v0.37.2'],
    }


def test_kubernetes_release_maps_to_staging_release():
    assert gobuild.COMPONENTS['kubernetes']['local_version']('v1.37.2') == 'v0.37.2'


def test_guards_for_modules_not_required_are_left_out():
    assert gobuild.carried_replaces(ETCD, 'v3.6.16') == {
        'go.etcd.io/etcd/api/v3': ['go.etcd.io/etcd/api/v3', 'v3.6.16'],
        'go.etcd.io/etcd/pkg/v3': ['go.etcd.io/etcd/pkg/v3', 'v3.6.16'],
    }


def test_version_pins_are_kept_and_local_paths_published():
    assert gobuild.carried_replaces(NFD, 'v0.19.0') == {
        'k8s.io/api': ['k8s.io/api', 'v0.35.3'],
        'sigs.k8s.io/node-feature-discovery/api/nfd': ['sigs.k8s.io/node-feature-discovery/api/nfd', 'v0.19.0'],
    }


def test_parse_reads_blocks_single_lines_and_tools():
    parsed = gobuild.parse_gomod('module a/b\n\nrequire x/y v1.0.0 // indirect\n\ntool (\n\tx/y/cmd/z\n)\n\ntool x/y/cmd/w\n')
    assert parsed == {'module': 'a/b', 'require': {'x/y': 'v1.0.0'}, 'replace': {}, 'tool': ['x/y/cmd/z', 'x/y/cmd/w']}


def test_kubernetes_programs_are_stamped_with_the_release():
    flags = gobuild.COMPONENTS['kubernetes']['ldflags']('v1.37.2')
    assert '-X k8s.io/component-base/version.gitVersion=v1.37.2' in flags
    assert '-X k8s.io/component-base/version.gitMinor=37' in flags
    assert '-X k8s.io/client-go/pkg/version.gitMajor=1' in flags


def test_toolkit_programs_are_stamped_as_its_makefile_does():
    # Its Makefile writes the version without the "v": nvidia-ctk --version answers 1.20.2.
    flags = gobuild.COMPONENTS['container-toolkit']['ldflags']('v1.20.2')
    assert flags == ['-X github.com/NVIDIA/nvidia-container-toolkit/internal/info.version=1.20.2']


@pytest.mark.parametrize('name', sorted(gobuild.COMPONENTS))
def test_each_component_pins_its_module_and_names_programs(name):
    spec, _folder, gomod, version = gobuild.component(name)
    assert version.startswith('v')
    assert gomod['tool'], 'no programs listed in lab/go/%s/go.mod' % name
    # The upstream's programs, and programs of ours in our own module
    assert all(tool.startswith((spec['module'] + '/', gomod['module'] + '/')) or tool == spec['module']
               for tool in gomod['tool'])


def test_a_program_of_ours_is_built_again_when_its_sources_change(tmp_path):
    ours = tmp_path / 'cmd' / 'tool'
    ours.mkdir(parents=True)
    (ours / 'main.go').write_text('package main\n')
    found = gobuild.Component({}, tmp_path, {'module': 'gpuready.lab/x'}, 'v1.0.0')
    first = gobuild._own_sources_digest(found, 'gpuready.lab/x/cmd/tool')
    assert first and first == gobuild._own_sources_digest(found, 'gpuready.lab/x/cmd/tool')
    (ours / 'main.go').write_text('package main\n\nfunc main() {}\n')
    assert gobuild._own_sources_digest(found, 'gpuready.lab/x/cmd/tool') not in (None, first)
    assert gobuild._own_sources_digest(found, 'upstream.example/cmd/tool') is None


def test_cached_binaries_are_named_by_program_and_version():
    version = gobuild.component('kubernetes').version
    assert gobuild.find_binary('kubelet').name == 'kubelet-' + version
    assert gobuild.find_binary('kubelet-device-manager').name.startswith('kubelet-device-manager-%s-' % version)
    assert gobuild.find_binary('nvidia-ctk').name == 'nvidia-ctk-' + gobuild.component('container-toolkit').version


def test_unknown_component_is_refused():
    with pytest.raises(gobuild.GoModError, match='unknown component'):
        gobuild.component('kube-everything')
