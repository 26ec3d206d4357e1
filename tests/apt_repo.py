# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A small signed apt repository of the NVIDIA Container Toolkit's packages, built here from the toolkit's
real binaries (lab/go: the lab's pin and the release before it), for tests that must not reach NVIDIA (or
anything else) over the network.

The repository is flat, like NVIDIA's (``deb [signed-by=KEYRING] URL /``), and holds every
release given, so a test can check that the pinned version was chosen over a newer one. It is
signed by a throwaway key made for each build.

    build(out_dir)                      ->  dict of paths (see build); releases=: others than lab/go's two
    serve(out_dir)                      ->  (url, stop): HTTP on 127.0.0.1 (or host=)

Layout of ``out_dir`` (served as it is, so URL + "/repo" is the repository URL and
URL + "/gpgkey.asc" a key URL):

    repo/          *.deb, Packages, Packages.gz, Release, InRelease, Release.gpg
    gpgkey.asc     the public key, ASCII-armored (what NVIDIA publishes at .../gpgkey)
    gpgkey.gpg     the same key in binary form (what ``gpg --dearmor`` writes)
    build.json     what build() returned

The packages are the four of the real repository, with the files and dependencies the toolkit's own
Debian packaging gives them: nvidia-container-toolkit-base installs /usr/bin/nvidia-ctk,
nvidia-container-runtime and nvidia-cdi-hook, and its postinst writes the runtime's default
/etc/nvidia-container-runtime/config.toml with ``nvidia-ctk config``; nvidia-container-toolkit installs
/usr/bin/nvidia-container-runtime-hook (the legacy mode's hook) and links nvidia-container-toolkit to it.
libnvidia-container-tools and libnvidia-container1 are C (github.com/NVIDIA/libnvidia-container), which
nothing here can build: they are empty packages that only keep the real dependencies installable, so the
runtime's legacy mode, which needs them, does not work (the default mode, just-in-time CDI, does not use them).

Needs ``gpg``, ``dpkg-deb`` (Debian 12: packages gnupg and dpkg) and the binaries ``make go-build`` makes.
Command line, for playbooks that start the server in the background::

    python tests/apt_repo.py build DIR
    python tests/apt_repo.py serve DIR --port-file FILE     (foreground until SIGTERM/SIGINT)
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import argparse
import email.utils
import functools
import gzip
import hashlib
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

import lab_scripts  # tests/, the script's own folder when run as one

PACKAGES = ("nvidia-container-toolkit", "nvidia-container-toolkit-base",
            "libnvidia-container-tools", "libnvidia-container1")
# The programs each package installs into /usr/bin (the toolkit's packaging/debian/*.install)
PROGRAMS = {
    "nvidia-container-toolkit-base": ("nvidia-ctk", "nvidia-container-runtime", "nvidia-cdi-hook"),
    "nvidia-container-toolkit": ("nvidia-container-runtime-hook",),
}
# lab/go's components of the toolkit: the release before the pin, the pin
TOOLKIT_COMPONENTS = ("container-toolkit-previous", "container-toolkit")
REVISION = "1"
# What the packages' maintainer scripts do (the toolkit's packaging/debian/*.postinst, *.postrm)
MAINTAINER_SCRIPTS = {
    "nvidia-container-toolkit-base": {
        "postinst": ("#!/bin/sh\nset -e\n"
                     "# the runtime's configuration file: what it sets, and the defaults of what it does not\n"
                     "if [ \"$1\" = configure ]; then\n"
                     "    /usr/bin/nvidia-ctk --quiet config --config-file=/etc/nvidia-container-runtime/config.toml"
                     " --in-place\n"
                     "fi\n"),
    },
    "nvidia-container-toolkit": {
        "postinst": ("#!/bin/sh\nset -e\n"
                     "# the hook's older name\n"
                     "if [ \"$1\" = configure ] && [ ! -e /usr/bin/nvidia-container-toolkit ]; then\n"
                     "    ln -s /usr/bin/nvidia-container-runtime-hook /usr/bin/nvidia-container-toolkit\n"
                     "fi\n"),
        "postrm": ("#!/bin/sh\nset -e\n"
                   "if [ \"$1\" = remove ] && [ -L /usr/bin/nvidia-container-toolkit ]; then\n"
                   "    rm -f /usr/bin/nvidia-container-toolkit\n"
                   "fi\n"),
    },
}
ARCH = "amd64"
KEY_UID = "gpuready test repository (throwaway) <test-repo@gpuready.invalid>"

# The file lists in Release, in the order apt expects them, and the hashes it reads.
_HASHES = (("MD5Sum", hashlib.md5), ("SHA1", hashlib.sha1), ("SHA256", hashlib.sha256))


def _depends(package, version):
    """The Depends field of the real packages: the toolkit wants its base and the tools at exactly its
    version (so installing the toolkit alone at an old version still needs those at that version, and
    the role pins all four)."""
    below_next_major = "%d.0.0" % (int(version.split(".")[0]) + 1)
    if package == "nvidia-container-toolkit":
        return ("nvidia-container-toolkit-base (= {0}), libnvidia-container-tools (= {0}), "
                "libnvidia-container-tools (<< {1})").format(version, below_next_major)
    if package == "libnvidia-container-tools":
        return "libnvidia-container1 (>= {0}), libnvidia-container1 (<< {1})".format(version, below_next_major)
    return None


def toolkit_releases():
    """[(package version, {program: binary path})] of the toolkit releases lab/go builds, oldest first."""
    gobuild = lab_scripts.script("lab/go/gobuild.py", "gpuready_gobuild_for_apt_repo")
    releases = []
    for name in TOOLKIT_COMPONENTS:
        found = gobuild.component(name)
        binaries = {gobuild.program_name(found.spec, tool): str(gobuild.binary_path(name, tool))
                    for tool in found.gomod["tool"]}
        missing = sorted(path for path in binaries.values() if not os.path.exists(path))
        if missing:
            raise RuntimeError("not built (run make go-build): %s" % ", ".join(missing))
        releases.append(("%s-%s" % (found.version.lstrip("v"), REVISION), binaries))
    return releases


def _write(path, data, mode=0o644):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(data.encode("utf-8") if isinstance(data, str) else data)
    os.chmod(path, mode)


def _build_deb(package, version, binaries, repo_dir, work_dir):
    """One .deb in repo_dir; returns its file name."""
    root = os.path.join(work_dir, "{0}_{1}".format(package, version))
    control = ["Package: " + package, "Version: " + version, "Architecture: " + ARCH,
               "Maintainer: gpuready.nvidia tests <test-repo@gpuready.invalid>",
               "Section: utils", "Priority: optional"]
    depends = _depends(package, version)
    if depends:
        control.append("Depends: " + depends)
    programs = PROGRAMS.get(package, ())
    if programs:
        summary = "NVIDIA Container Toolkit %s (%s), built from its Go module" % (
            version.split("-")[0], ", ".join(programs))
    else:
        summary = "empty stand-in: the C library and CLI cannot be built here"
    control.append("Description: {0} for gpuready.nvidia tests\n {1}.".format(package, summary))
    _write(os.path.join(root, "DEBIAN", "control"), "\n".join(control) + "\n")
    for script, text in MAINTAINER_SCRIPTS.get(package, {}).items():
        _write(os.path.join(root, "DEBIAN", script), text, mode=0o755)
    _write(os.path.join(root, "usr", "share", "doc", package, "README.gpuready"),
           "{0} {1}, built by tests/apt_repo.py of gpuready.nvidia: {2}.\n".format(package, version, summary))
    for program in programs:
        target = os.path.join(root, "usr", "bin", program)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(binaries[program], target)
        os.chmod(target, 0o755)
    for folder, _dirs, _files in os.walk(root):
        os.chmod(folder, 0o755)
    name = "{0}_{1}_{2}.deb".format(package, version, ARCH)
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build", root,
                    os.path.join(repo_dir, name)], check=True, stdout=subprocess.DEVNULL)
    return name


def _digests(path):
    with open(path, "rb") as handle:
        data = handle.read()
    return len(data), {field: algo(data).hexdigest() for field, algo in _HASHES}


def _packages_index(repo_dir, deb_names):
    """The Packages file: each .deb's control fields plus where it is and its hashes."""
    stanzas = []
    for name in sorted(deb_names):
        path = os.path.join(repo_dir, name)
        fields = subprocess.run(["dpkg-deb", "--field", path], check=True, stdout=subprocess.PIPE,
                                universal_newlines=True).stdout.rstrip("\n")
        size, digests = _digests(path)
        extra = ["Filename: ./" + name, "Size: %d" % size, "MD5sum: " + digests["MD5Sum"],
                 "SHA1: " + digests["SHA1"], "SHA256: " + digests["SHA256"]]
        stanzas.append(fields + "\n" + "\n".join(extra) + "\n")
    return "\n".join(stanzas)


def _release(repo_dir, index_names):
    lines = ["Origin: gpuready-test", "Label: gpuready-test",
             "Date: " + email.utils.formatdate(usegmt=True), "Architectures: " + ARCH]
    sums = {name: _digests(os.path.join(repo_dir, name)) for name in index_names}
    for field, _algo in _HASHES:
        lines.append(field + ":")
        lines.extend(" {0} {1:>8} {2}".format(sums[name][1][field], sums[name][0], name) for name in index_names)
    return "\n".join(lines) + "\n"


def _gpg(home, *args, **kwargs):
    return subprocess.run(["gpg", "--homedir", home, "--batch", "--quiet", "--no-tty"] + list(args),
                          check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs).stdout


def _sign(repo_dir, out_dir):
    """A throwaway key: sign Release, export the public key armored and binary; returns its fingerprint."""
    home = tempfile.mkdtemp(prefix="gpuready-apt-repo-gnupg-")
    try:
        os.chmod(home, 0o700)
        _gpg(home, "--passphrase", "", "--pinentry-mode", "loopback",
             "--quick-generate-key", KEY_UID, "ed25519", "sign", "never")
        release = os.path.join(repo_dir, "Release")
        _gpg(home, "--clearsign", "--output", os.path.join(repo_dir, "InRelease"), release)
        _gpg(home, "--armor", "--detach-sign", "--output", os.path.join(repo_dir, "Release.gpg"), release)
        _write(os.path.join(out_dir, "gpgkey.asc"), _gpg(home, "--armor", "--export"))
        _write(os.path.join(out_dir, "gpgkey.gpg"), _gpg(home, "--export"))
        colons = _gpg(home, "--with-colons", "--list-keys").decode("ascii")
        return [line.split(":")[9] for line in colons.splitlines() if line.startswith("fpr:")][0]
    finally:
        # gpg started an agent for this home; stop it before the home goes away.
        subprocess.run(["gpgconf", "--homedir", home, "--kill", "all"], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(home, ignore_errors=True)


def build(out_dir, releases=None):
    """Builds the repository and the key files in out_dir (replacing what a former build left), with the
    packages of each release: (package version, {program: binary}); default: toolkit_releases().

    Returns {"repo": folder, "key_asc": file, "key_gpg": file, "fingerprint": hex,
    "versions": [...], "packages": [...]}, also written to out_dir/build.json."""
    out_dir = os.path.abspath(out_dir)
    repo_dir = os.path.join(out_dir, "repo")
    shutil.rmtree(repo_dir, ignore_errors=True)
    os.makedirs(repo_dir)
    work_dir = tempfile.mkdtemp(prefix="gpuready-apt-repo-")
    try:
        releases = toolkit_releases() if releases is None else releases
        debs = [_build_deb(package, version, binaries, repo_dir, work_dir)
                for version, binaries in releases for package in PACKAGES]
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    index = _packages_index(repo_dir, debs)
    _write(os.path.join(repo_dir, "Packages"), index)
    # mtime=0: the same index gives the same Packages.gz (and Release hashes) on every build.
    _write(os.path.join(repo_dir, "Packages.gz"), gzip.compress(index.encode("utf-8"), mtime=0))
    _write(os.path.join(repo_dir, "Release"), _release(repo_dir, ["Packages", "Packages.gz"]))
    fingerprint = _sign(repo_dir, out_dir)
    result = {"repo": repo_dir, "key_asc": os.path.join(out_dir, "gpgkey.asc"),
              "key_gpg": os.path.join(out_dir, "gpgkey.gpg"), "fingerprint": fingerprint,
              "versions": [version for version, _binaries in releases], "packages": list(PACKAGES)}
    _write(os.path.join(out_dir, "build.json"), json.dumps(result, indent=2) + "\n")
    return result


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # pylint: disable=redefined-builtin
        pass


def serve(out_dir, port=0, host="127.0.0.1"):
    """Serves out_dir over HTTP on host (port 0: a free one) from a thread; returns (url, stop)."""
    handler = functools.partial(_QuietHandler, directory=os.path.abspath(out_dir))
    server = http.server.ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="apt-repo-http", daemon=True)
    thread.start()

    def stop():
        server.shutdown()
        server.server_close()
        thread.join()

    return "http://%s:%d" % (host, server.server_address[1]), stop


def _serve_forever(out_dir, port_file, port=0, host="127.0.0.1"):
    url, stop = serve(out_dir, port, host)
    done = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_args: done.set())
    if port_file:
        # Written whole under a temporary name, so a reader polling for the file never sees half of it.
        tmp = port_file + ".tmp"
        _write(tmp, url.rsplit(":", 1)[1] + "\n")
        os.replace(tmp, port_file)
    print("serving %s at %s" % (out_dir, url), flush=True)
    try:
        while not done.wait(3600):
            pass
    finally:
        stop()
        if port_file and os.path.exists(port_file):
            os.unlink(port_file)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description="A small signed apt repository of NVIDIA Container Toolkit packages.")
    sub = parser.add_subparsers(dest="command")
    sub.required = True
    build_cmd = sub.add_parser("build", help="build the repository and keys into DIR")
    build_cmd.add_argument("dir")
    serve_cmd = sub.add_parser("serve", help="serve DIR until SIGTERM or SIGINT")
    serve_cmd.add_argument("dir")
    serve_cmd.add_argument("--port-file", help="write the port here once listening (removed at exit)")
    serve_cmd.add_argument("--port", type=int, default=0, help="listen on this port (default: a free one)")
    serve_cmd.add_argument("--host", default="127.0.0.1", help="listen on this address (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.command == "build":
        result = build(args.dir)
        print(json.dumps(result, indent=2))
        return 0
    return _serve_forever(args.dir, args.port_file, args.port, args.host)


if __name__ == "__main__":
    sys.exit(main())
