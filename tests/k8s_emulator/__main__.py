# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``python -m k8s_emulator --dir DIR [--port 0] [--nodes N] [--verbose]``

Makes the PKI and the admin identity in DIR, listens on 127.0.0.1 (port 0: any free one), then
writes DIR/emulator.json atomically: {"url", "ca_cert", "control_token", "kubeconfigs": {"admin"},
"pid", "port"}. Runs until SIGTERM or SIGINT.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import argparse
import json
import os
import secrets
import signal
import sys

from .pki import CertificateAuthority
from .resources import ResourceTable
from .server import ApiServer, Identities, Principal, TLSServer, ssl_context
from .store import Store


def _stop(signum, frame):  # pylint: disable=unused-argument
    raise SystemExit(0)


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m k8s_emulator', description=__doc__.splitlines()[0])
    parser.add_argument('--dir', required=True, help='folder for the PKI, kubeconfigs and emulator.json')
    parser.add_argument('--port', type=int, default=0, help='TCP port on 127.0.0.1 (0: pick a free one)')
    parser.add_argument('--nodes', type=int, default=0, help='pre-create N Node objects (benchmarks)')
    parser.add_argument('--verbose', action='store_true', help='log every HTTP request to stderr')
    args = parser.parse_args(argv)

    directory = os.path.abspath(args.dir)
    os.makedirs(directory, exist_ok=True)
    info_path = os.path.join(directory, 'emulator.json')
    if os.path.exists(info_path):
        os.unlink(info_path)
    ca = CertificateAuthority.create(directory)
    server_cert, server_key = ca.issue(os.path.join(directory, 'server.crt'), os.path.join(directory, 'server.key'),
                                       'kube-apiserver', server_names=('127.0.0.1', 'localhost'))
    table = ResourceTable()
    store = Store(table)
    if args.nodes:
        store.add_nodes(args.nodes)

    httpd = TLSServer(('127.0.0.1', args.port), None, ssl_context(server_cert, server_key, ca.cert_path))
    port = httpd.server_address[1]
    url = 'https://127.0.0.1:%d' % port
    identities = Identities(directory, ca, url)
    admin = identities.add('admin', ('system:masters',))
    control_token = secrets.token_urlsafe(32)
    httpd.api = ApiServer(store, table, identities, control_token, Principal('admin', ('system:masters',)),
                          verbose=args.verbose)

    signal.signal(signal.SIGTERM, _stop)
    tmp = info_path + '.tmp'
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, 'w') as handle:
        json.dump({'url': url, 'port': port, 'pid': os.getpid(), 'ca_cert': ca.cert_path,
                   'control_token': control_token, 'kubeconfigs': {'admin': admin['kubeconfig']}}, handle, indent=2)
    os.replace(tmp, info_path)  # readers see all of it or nothing
    sys.stderr.write('k8s_emulator: serving %s (state in %s)\n' % (url, directory))
    sys.stderr.flush()
    try:
        httpd.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        httpd.api.stopping.set()
        httpd.server_close()
        if os.path.exists(info_path):
            os.unlink(info_path)
    return 0


if __name__ == '__main__':
    sys.exit(main())
