# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""tests/apt_repo.py, the signed apt repository the node_airgapped and default scenarios install from and the
lab's GPU node image is installed from: what it holds (the toolkit's real binaries, lab/go's pin and the
release before it), that its indexes and signatures check out the way apt checks them, and its server."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import gzip
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

import apt_repo
import require

TOOLS = ('gpg', 'gpgv', 'dpkg-deb')


@pytest.fixture(scope='module')
def repo(tmp_path_factory):
    missing = [tool for tool in TOOLS if not shutil.which(tool)]
    if missing:
        require.missing('needs %s (Debian: gnupg, gpgv, dpkg)' % ', '.join(missing))
    return apt_repo.build(str(tmp_path_factory.mktemp('apt-repo')))


PREVIOUS, PINNED = '1.20.1-1', '1.20.2-1'  # lab/go/container-toolkit-previous, lab/go/container-toolkit


def _stanzas(text):
    return [dict(line.split(': ', 1) for line in block.splitlines() if not line.startswith(' '))
            for block in text.strip().split('\n\n')]


def _read(path, mode='r'):
    with open(path, mode) as handle:
        return handle.read()


def test_packages_index_holds_both_versions_of_the_four_packages(repo):
    stanzas = _stanzas(_read(os.path.join(repo['repo'], 'Packages')))
    assert sorted((s['Package'], s['Version']) for s in stanzas) == sorted(
        (package, version) for package in apt_repo.PACKAGES for version in (PREVIOUS, PINNED))
    for stanza in stanzas:
        data = _read(os.path.join(repo['repo'], stanza['Filename']), 'rb')
        assert int(stanza['Size']) == len(data)
        assert stanza['SHA256'] == hashlib.sha256(data).hexdigest()
        assert stanza['Architecture'] == 'amd64'
    assert gzip.decompress(_read(os.path.join(repo['repo'], 'Packages.gz'), 'rb')).decode() == \
        _read(os.path.join(repo['repo'], 'Packages'))


def test_toolkit_needs_its_base_and_the_tools_at_its_version(repo):
    stanzas = _stanzas(_read(os.path.join(repo['repo'], 'Packages')))
    depends = {(s['Package'], s['Version']): s.get('Depends') for s in stanzas}
    assert depends[('nvidia-container-toolkit', PREVIOUS)] == (
        'nvidia-container-toolkit-base (= 1.20.1-1), libnvidia-container-tools (= 1.20.1-1), '
        'libnvidia-container-tools (<< 2.0.0)')
    assert depends[('libnvidia-container-tools', PINNED)] == (
        'libnvidia-container1 (>= 1.20.2-1), libnvidia-container1 (<< 2.0.0)')
    assert depends[('libnvidia-container1', PINNED)] is None
    assert depends[('nvidia-container-toolkit-base', PINNED)] is None


def test_release_lists_the_indexes_with_their_hashes(repo):
    release = _read(os.path.join(repo['repo'], 'Release'))
    sha256 = release.split('SHA256:\n', 1)[1].splitlines()
    for name in ('Packages', 'Packages.gz'):
        data = _read(os.path.join(repo['repo'], name), 'rb')
        assert ' %s %8d %s' % (hashlib.sha256(data).hexdigest(), len(data), name) in sha256


def test_release_is_signed_by_the_exported_key(repo, tmp_path):
    # gpgv is what apt runs, against the keyring file named in signed-by.
    for args in (['InRelease'], ['Release.gpg', 'Release']):
        subprocess.run(['gpgv', '--keyring', repo['key_gpg']] + args, cwd=repo['repo'], check=True,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # The armored file holds the same key: dearmored, it is the binary one byte for byte.
    home = tmp_path / 'gnupg'
    home.mkdir(mode=0o700)
    dearmored = subprocess.run(['gpg', '--homedir', str(home), '--batch', '--dearmor'], check=True,
                               input=_read(repo['key_asc'], 'rb'), stdout=subprocess.PIPE).stdout
    assert dearmored == _read(repo['key_gpg'], 'rb')
    assert _read(repo['key_asc']).startswith('-----BEGIN PGP PUBLIC KEY BLOCK-----\n')


def test_a_foreign_key_does_not_verify_it(repo, tmp_path):
    other = apt_repo.build(str(tmp_path / 'other'))
    result = subprocess.run(['gpgv', '--keyring', other['key_gpg'], 'InRelease'], cwd=repo['repo'], check=False,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert result.returncode != 0


def test_packages_ship_the_toolkits_programs_of_their_release(repo, tmp_path):
    contents = {}
    for name in os.listdir(repo['repo']):
        if name.endswith('.deb'):
            listing = subprocess.run(['dpkg-deb', '--contents', os.path.join(repo['repo'], name)], check=True,
                                     stdout=subprocess.PIPE, universal_newlines=True).stdout
            contents[name] = sorted(line.split()[-1] for line in listing.splitlines()
                                    if line.split()[-1].startswith('./usr/bin/') and not line.startswith('d'))
    for version in (PREVIOUS, PINNED):
        assert contents['nvidia-container-toolkit-base_%s_amd64.deb' % version] == [
            './usr/bin/nvidia-cdi-hook', './usr/bin/nvidia-container-runtime', './usr/bin/nvidia-ctk']
        assert contents['nvidia-container-toolkit_%s_amd64.deb' % version] == [
            './usr/bin/nvidia-container-runtime-hook']
        for package in ('libnvidia-container-tools', 'libnvidia-container1'):
            assert contents['%s_%s_amd64.deb' % (package, version)] == []

    for version in (PREVIOUS, PINNED):
        root = tmp_path / version
        subprocess.run(['dpkg-deb', '--extract', os.path.join(
            repo['repo'], 'nvidia-container-toolkit-base_%s_amd64.deb' % version), str(root)], check=True)
        upstream = version.split('-', maxsplit=1)[0]
        for program, first_line in (('nvidia-ctk', 'NVIDIA Container Toolkit CLI version ' + upstream),
                                    ('nvidia-container-runtime', 'NVIDIA Container Runtime version ' + upstream)):
            out = subprocess.run([str(root / 'usr' / 'bin' / program), '--version'], check=True,
                                 stdout=subprocess.PIPE, universal_newlines=True).stdout
            assert out.splitlines()[0] == first_line, out
        postinst = subprocess.run(['dpkg-deb', '--info', os.path.join(
            repo['repo'], 'nvidia-container-toolkit-base_%s_amd64.deb' % version), 'postinst'], check=True,
            stdout=subprocess.PIPE, universal_newlines=True).stdout
        assert 'nvidia-ctk --quiet config --config-file=/etc/nvidia-container-runtime/config.toml' in postinst


def test_serve_answers_on_loopback_until_stopped(repo):
    out_dir = os.path.dirname(repo['repo'])
    url, stop = apt_repo.serve(out_dir)
    try:
        assert url.startswith('http://127.0.0.1:')
        with urllib.request.urlopen(url + '/repo/InRelease', timeout=10) as response:
            assert response.read() == _read(os.path.join(repo['repo'], 'InRelease'), 'rb')
        with urllib.request.urlopen(url + '/gpgkey.asc', timeout=10) as response:
            assert response.read() == _read(repo['key_asc'], 'rb')
    finally:
        stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url + '/repo/Release', timeout=5)


def test_command_line_serves_writes_the_port_and_stops_on_sigterm(repo, tmp_path):
    out_dir = os.path.dirname(repo['repo'])
    port_file = str(tmp_path / 'port')
    server = subprocess.Popen([sys.executable, apt_repo.__file__, 'serve', out_dir, '--port-file', port_file],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while not os.path.exists(port_file):
            assert server.poll() is None and time.monotonic() < deadline, 'no port file'
            time.sleep(0.05)
        port = int(_read(port_file))
        with urllib.request.urlopen('http://127.0.0.1:%d/repo/Release' % port, timeout=10) as response:
            assert response.read() == _read(os.path.join(repo['repo'], 'Release'), 'rb')
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=20) == 0
    assert not os.path.exists(port_file)
