"""Offline stand-in for the get-pip script that ansible-test downloads.

ansible-test bootstraps pip into each sanity venv by running
``~/.ansible/test/cache/get_pip_<version>.py`` (downloaded from Ansible's CI file
server when missing; that server is not reachable from our machines).
``tools/sanity.sh`` copies this file there, next to the matching pip wheel.

It receives get-pip's arguments (``pip==24.2 --no-setuptools --no-wheel`` and pip
options), drops the two get-pip-only flags and installs the requested packages from
the wheels in its own folder, with pip run straight from the requested pip wheel.
"""

from __future__ import annotations

import glob
import os
import sys

GET_PIP_ONLY = ('--no-setuptools', '--no-wheel')


def main() -> int:
    """Install pip from the wheel that lies beside this script."""
    here = os.path.dirname(os.path.abspath(__file__))
    args = [arg for arg in sys.argv[1:] if arg not in GET_PIP_ONLY]
    versions = [arg.split('==', 1)[1] for arg in args if arg.startswith('pip==')]
    pattern = 'pip-%s-py3-none-any.whl' % (versions[0] if versions else '*')
    wheels = sorted(glob.glob(os.path.join(here, pattern)))

    if not wheels:
        sys.stderr.write('get-pip stand-in: no %s in %s\n' % (pattern, here))
        return 1

    sys.path.insert(0, wheels[-1])

    from pip._internal.cli.main import main as pip_main  # pylint: disable=import-outside-toplevel

    return pip_main(['install', '--no-index', '--find-links', here] + args)


if __name__ == '__main__':
    sys.exit(main())
