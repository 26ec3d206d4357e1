# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    # The options of plugins/module_utils/k8s_auth.py AUTH_ARG_SPEC; names, aliases and
    # environment variables are kubernetes.core's.
    DOCUMENTATION = r"""
options:
  kubeconfig:
    description:
      - Path to a kubeconfig file, or the kubeconfig as a dict.
      - Without it and without O(host), C($KUBECONFIG) or C(~/.kube/config) is read.
      - Environment variable C(K8S_AUTH_KUBECONFIG).
      - Never logged, as in kubernetes.core (a dict carries tokens, keys and exec environments); a path
        given here is masked in the output too.
    type: raw
  context:
    description: Kubeconfig context to use instead of the current one. Environment variable C(K8S_AUTH_CONTEXT).
    type: str
  host:
    description: API server URL, for example C(https://10.0.0.1:6443). Environment variable C(K8S_AUTH_HOST).
    type: str
  api_key:
    description: Bearer token. Environment variable C(K8S_AUTH_API_KEY).
    type: str
  validate_certs:
    description:
      - Verify the API server's TLS certificate.
      - When not set, certificates are verified unless the kubeconfig's cluster entry sets
        C(insecure-skip-tls-verify).
      - Environment variable C(K8S_AUTH_VERIFY_SSL).
    type: bool
    aliases: [verify_ssl]
  ca_cert:
    description: CA bundle that signed the API server's certificate. Environment variable C(K8S_AUTH_SSL_CA_CERT).
    type: path
    aliases: [ssl_ca_cert]
  client_cert:
    description: Client certificate for certificate authentication. Environment variable C(K8S_AUTH_CERT_FILE).
    type: path
    aliases: [cert_file]
  client_key:
    description: Key of O(client_cert). Environment variable C(K8S_AUTH_KEY_FILE).
    type: path
    aliases: [key_file]
  proxy:
    description: HTTP proxy URL for the API connection. Environment variable C(K8S_AUTH_PROXY).
    type: str
  no_proxy:
    description: Comma-separated hosts that bypass O(proxy). Environment variable C(K8S_AUTH_NO_PROXY).
    type: str
  proxy_headers:
    description: Headers sent to the proxy.
    type: dict
    suboptions:
      proxy_basic_auth:
        description: C(user:password) for the proxy.
        type: str
      basic_auth:
        description: C(user:password) sent as an C(Authorization) header.
        type: str
      user_agent:
        description: User agent sent to the proxy.
        type: str
  persist_config:
    description:
      - Write refreshed tokens (for example from an OIDC provider) back to the kubeconfig file.
      - Environment variable C(K8S_AUTH_PERSIST_CONFIG).
    type: bool
notes:
  - kubernetes.core's C(username)/C(password) (basic authentication, removed from Kubernetes in 1.19) and
    impersonation options are not offered.
  - Credentials are never echoed in results or error messages.
requirements:
  - kubernetes >= 24.2.0 (Python library, where the module runs)
"""
