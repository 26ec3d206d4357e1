# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kubernetes API authentication shared by every gpuready.nvidia module that talks to the API:
the option spec and the client.

The option names, aliases and K8S_AUTH_* environment variables are kubernetes.core's, so one
``module_defaults: group/gpuready.nvidia.k8s`` block (or the same environment) serves both
collections. Plain Python apart from the argument spec; the doc fragment is
``gpuready.nvidia.k8s_auth``. Requests go through ``k8s.api.call_api``.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

from ansible.module_utils.basic import env_fallback

try:
    import urllib3
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config
    from kubernetes.config.config_exception import ConfigException
    HAS_KUBERNETES = True
    KUBERNETES_IMPORT_ERROR = None
except ImportError as exc:  # pragma: no cover - depends on the controller
    HAS_KUBERNETES = False
    KUBERNETES_IMPORT_ERROR = exc

AUTH_ARG_SPEC = dict(
    kubeconfig=dict(type='raw', no_log=True, fallback=(env_fallback, ['K8S_AUTH_KUBECONFIG'])),
    context=dict(type='str', fallback=(env_fallback, ['K8S_AUTH_CONTEXT'])),
    host=dict(type='str', fallback=(env_fallback, ['K8S_AUTH_HOST'])),
    api_key=dict(type='str', no_log=True, fallback=(env_fallback, ['K8S_AUTH_API_KEY'])),
    validate_certs=dict(type='bool', aliases=['verify_ssl'], fallback=(env_fallback, ['K8S_AUTH_VERIFY_SSL'])),
    ca_cert=dict(type='path', aliases=['ssl_ca_cert'], fallback=(env_fallback, ['K8S_AUTH_SSL_CA_CERT'])),
    client_cert=dict(type='path', aliases=['cert_file'], fallback=(env_fallback, ['K8S_AUTH_CERT_FILE'])),
    client_key=dict(type='path', aliases=['key_file'], no_log=False, fallback=(env_fallback, ['K8S_AUTH_KEY_FILE'])),
    proxy=dict(type='str', fallback=(env_fallback, ['K8S_AUTH_PROXY'])),
    no_proxy=dict(type='str', fallback=(env_fallback, ['K8S_AUTH_NO_PROXY'])),
    proxy_headers=dict(type='dict', options=dict(
        proxy_basic_auth=dict(type='str', no_log=True),
        basic_auth=dict(type='str', no_log=True),
        user_agent=dict(type='str'),
    )),
    persist_config=dict(type='bool', fallback=(env_fallback, ['K8S_AUTH_PERSIST_CONFIG'])),
)


class K8sAuthError(Exception):
    """The client cannot be configured (no kubeconfig, bad context, missing library)."""


def _kubeconfig(params, configuration):
    """Load the kubeconfig (a path, a dict, or $KUBECONFIG / ~/.kube/config) into configuration.
    As in kubernetes.core, none is read when host and credentials are given without one."""
    kubeconfig = params.get('kubeconfig')
    if not kubeconfig and params.get('host') and (params.get('api_key') or params.get('client_cert')):
        return
    persist = bool(params.get('persist_config'))
    try:
        if isinstance(kubeconfig, dict):
            k8s_config.load_kube_config_from_dict(kubeconfig, context=params.get('context'),
                                                  client_configuration=configuration, persist_config=persist)
        else:
            path = kubeconfig or os.environ.get('KUBECONFIG', '~/.kube/config').split(os.pathsep)[0]
            k8s_config.load_kube_config(config_file=os.path.expanduser(path), context=params.get('context'),
                                        client_configuration=configuration, persist_config=persist)
    except (ConfigException, IOError, OSError, ValueError, TypeError) as exc:
        raise K8sAuthError('cannot load kubeconfig %s: %s' % (
            'from the given dict' if isinstance(kubeconfig, dict) else kubeconfig or '(default)', exc))


def api_client(params):
    """A kubernetes.client.ApiClient from the AUTH_ARG_SPEC options (explicit options win over the
    kubeconfig, as in kubernetes.core). Certificates are verified unless validate_certs is false or,
    with validate_certs unset, the kubeconfig says insecure-skip-tls-verify."""
    if not HAS_KUBERNETES:
        raise K8sAuthError('the kubernetes Python library is not installed: %s' % KUBERNETES_IMPORT_ERROR)
    configuration = k8s_client.Configuration()
    _kubeconfig(params, configuration)
    if params.get('host'):
        configuration.host = params['host']
    if params.get('api_key'):
        configuration.api_key = {'authorization': 'Bearer %s' % params['api_key']}
        # The kubeconfig loader re-sets its own token before every request through this hook.
        configuration.refresh_api_key_hook = None
    if params.get('ca_cert'):
        configuration.ssl_ca_cert = params['ca_cert']
    if params.get('client_cert'):
        configuration.cert_file = params['client_cert']
    if params.get('client_key'):
        configuration.key_file = params['client_key']
    if params.get('validate_certs') is not None:
        configuration.verify_ssl = params['validate_certs']
    if params.get('proxy'):
        configuration.proxy = params['proxy']
    if params.get('no_proxy'):
        configuration.no_proxy = params['no_proxy']
    if params.get('proxy_headers'):
        headers = dict((k, v) for k, v in params['proxy_headers'].items() if v is not None)
        configuration.proxy_headers = urllib3.util.make_headers(**headers)
    if not configuration.host or configuration.host == 'http://localhost':
        raise K8sAuthError('no API server: give host or a kubeconfig with a current context')
    return k8s_client.ApiClient(configuration)
