# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The wheel folder an air-gapped GPU node needs for gpuready.nvidia.node_python (offline mode).

``build(dest)`` puts into ``dest`` the wheels of what our node-side modules import (nvidia-ml-py,
grpcio and their dependencies) for the lab nodes' Python (Debian 12: CPython 3.11, x86_64 glibc),
plus a pip wheel: the role runs pip from that wheel when the node's venv has no pip of its own.

The download happens once, on this machine (which reaches PyPI), with this interpreter's pip:
``pip download --only-binary=:all: --python-version 3.11 --platform manylinux2014_x86_64 ...``.
The result is cached under ``.cache/wheels/`` (the sibling of ``LAB_CACHE``), keyed by what was
asked for, so later builds need no network. Versions follow the repository's ``constraints.txt``
where it pins them (the same releases the controller tests use).

    python tests/offline_wheels.py DEST     # prints the wheels it put into DEST

Standard library only (plus the running interpreter's pip).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CONSTRAINTS = os.path.join(ROOT, 'constraints.txt')

# Keep in step with roles/node_python/defaults/main.yml (node_python_requirements) and pip itself.
REQUIREMENTS = ('nvidia-ml-py>=12.550.52', 'grpcio>=1.51', 'pip')
PYTHON_VERSION = '3.11'
PLATFORMS = ('manylinux2014_x86_64',)
STAMP = 'wheels.json'


def cache_root():
    """``$GPUREADY_WHEEL_CACHE``, else ``wheels`` beside ``$LAB_CACHE``, else ``.cache/wheels``."""
    if os.environ.get('GPUREADY_WHEEL_CACHE'):
        return os.environ['GPUREADY_WHEEL_CACHE']
    if os.environ.get('LAB_CACHE'):
        return os.path.join(os.path.dirname(os.path.abspath(os.environ['LAB_CACHE'])), 'wheels')
    return os.path.join(ROOT, '.cache', 'wheels')


def _canonical(name):
    return name.strip().lower().replace('_', '-').replace('.', '-')


def pinned(names, constraints=CONSTRAINTS):
    """``name==version`` lines of the constraints file for the given distribution names."""
    wanted = set(_canonical(n) for n in names)
    pins = []
    try:
        with open(constraints) as handle:
            lines = handle.read().splitlines()
    except (IOError, OSError):
        return pins
    for line in lines:
        line = line.split('#', 1)[0].strip()
        if '==' in line and _canonical(line.split('==', 1)[0]) in wanted:
            pins.append(line)
    return sorted(pins)


def _name(requirement):
    for sep in ('<', '>', '=', '!', '~', ';', '['):
        requirement = requirement.split(sep, 1)[0]
    return requirement.strip()


def download_args(dest, requirements, python_version, platforms, constraints_file):
    """The pip command line that fills ``dest``."""
    abi = 'cp' + python_version.replace('.', '')
    args = [sys.executable, '-m', 'pip', 'download', '--disable-pip-version-check', '--no-input',
            '--only-binary=:all:', '--python-version', python_version, '--implementation', 'cp',
            '--abi', abi, '--dest', dest]
    for platform in platforms:
        args += ['--platform', platform]
    if constraints_file:
        args += ['--constraint', constraints_file]
    return args + list(requirements)


def build(dest, requirements=REQUIREMENTS, python_version=PYTHON_VERSION, platforms=PLATFORMS,
          cache=None, constraints=CONSTRAINTS):
    """Fill ``dest`` with the wheels for ``requirements``; returns the wheel paths in ``dest``.

    The wheels come from the cache when an earlier build asked for the same thing, otherwise from
    ``pip download`` into a fresh cache folder, renamed into place only when complete."""
    pins = pinned([_name(r) for r in requirements], constraints)
    key = hashlib.sha256(json.dumps([sorted(requirements), pins, python_version, sorted(platforms)])
                         .encode('utf-8')).hexdigest()[:16]
    root = cache or cache_root()
    folder = os.path.join(root, 'node-cp%s-%s' % (python_version.replace('.', ''), key))
    if not os.path.exists(os.path.join(folder, STAMP)):
        if not os.path.isdir(root):
            os.makedirs(root)
        work = tempfile.mkdtemp(prefix='.download-', dir=root)
        try:
            constraints_file = None
            if pins:
                constraints_file = os.path.join(work, 'constraints.txt')
                with open(constraints_file, 'w') as handle:
                    handle.write('\n'.join(pins) + '\n')
            wheels = os.path.join(work, 'wheels')
            proc = subprocess.run(download_args(wheels, requirements, python_version, platforms, constraints_file),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                                  check=False)
            if proc.returncode != 0:
                raise RuntimeError('pip download failed (rc %d):\n%s' % (proc.returncode, proc.stdout[-4000:]))
            files = sorted(f for f in os.listdir(wheels) if f.endswith('.whl'))
            with open(os.path.join(wheels, STAMP), 'w') as handle:
                json.dump({'requirements': list(requirements), 'pins': pins, 'python_version': python_version,
                           'platforms': list(platforms), 'wheels': files}, handle, indent=1)
            try:
                os.rename(wheels, folder)
            except OSError:
                if not os.path.exists(os.path.join(folder, STAMP)):  # not another build that won the race
                    raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
    with open(os.path.join(folder, STAMP)) as handle:
        files = json.load(handle)['wheels']
    if not os.path.isdir(dest):
        os.makedirs(dest)
    copied = []
    for name in files:
        target = os.path.join(dest, name)
        shutil.copyfile(os.path.join(folder, name), target)
        copied.append(target)
    return copied


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith('-'):
        sys.stderr.write('usage: python tests/offline_wheels.py DEST\n')
        return 2
    for path in build(argv[0]):
        print(path)
    return 0


if __name__ == '__main__':
    sys.exit(main())
