# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""k8s/auth.py: kubernetes.core's option names, and the client the options make (explicit options
over the kubeconfig). Against a real kube-apiserver with each credential: tests/integration/test_k8s_credentials.py."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest
import yaml

from ansible_collections.gpuready.nvidia.plugins.module_utils.k8s import auth

HOST = 'https://api.example.test:6443'


def test_the_options_are_kubernetes_cores():
    assert sorted(auth.AUTH_ARG_SPEC) == ['api_key', 'ca_cert', 'client_cert', 'client_key', 'context', 'host',
                                          'kubeconfig', 'no_proxy', 'persist_config', 'proxy', 'proxy_headers',
                                          'validate_certs']
    assert auth.AUTH_ARG_SPEC['validate_certs']['aliases'] == ['verify_ssl']
    assert auth.AUTH_ARG_SPEC['ca_cert']['aliases'] == ['ssl_ca_cert']
    assert auth.AUTH_ARG_SPEC['api_key']['no_log'] and auth.AUTH_ARG_SPEC['kubeconfig']['no_log']


def test_host_and_token_need_no_kubeconfig(monkeypatch):
    monkeypatch.setenv('KUBECONFIG', '/nonexistent/kubeconfig')
    client = auth.api_client({'host': HOST, 'api_key': 'token', 'validate_certs': False, 'proxy': 'http://proxy:3128'})
    configuration = client.configuration
    assert configuration.host == HOST
    assert configuration.api_key == {'authorization': 'Bearer token'}
    assert configuration.verify_ssl is False and configuration.proxy == 'http://proxy:3128'


def test_a_kubeconfig_dict_gives_host_and_options_win(tmp_path):
    kubeconfig = {'apiVersion': 'v1', 'kind': 'Config', 'current-context': 'lab',
                  'clusters': [{'name': 'lab', 'cluster': {'server': 'https://10.0.0.1:6443',
                                                           'insecure-skip-tls-verify': True}}],
                  'users': [{'name': 'admin', 'user': {'token': 'from-kubeconfig'}}],
                  'contexts': [{'name': 'lab', 'context': {'cluster': 'lab', 'user': 'admin'}}]}
    client = auth.api_client({'kubeconfig': kubeconfig})
    assert client.configuration.host == 'https://10.0.0.1:6443' and client.configuration.verify_ssl is False
    path = tmp_path / 'config'
    path.write_text(yaml.safe_dump(kubeconfig))
    client = auth.api_client({'kubeconfig': str(path), 'host': HOST, 'validate_certs': True})
    assert client.configuration.host == HOST and client.configuration.verify_ssl is True


def test_a_missing_kubeconfig_or_server_is_a_k8s_auth_error(tmp_path):
    with pytest.raises(auth.K8sAuthError, match='cannot load kubeconfig'):
        auth.api_client({'kubeconfig': str(tmp_path / 'missing')})
    with pytest.raises(auth.K8sAuthError, match='no API server'):
        auth.api_client({'kubeconfig': {'apiVersion': 'v1', 'kind': 'Config', 'current-context': 'x',
                                        'clusters': [{'name': 'x', 'cluster': {}}], 'users': [{'name': 'u', 'user': {}}],
                                        'contexts': [{'name': 'x', 'context': {'cluster': 'x', 'user': 'u'}}]}})
