# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Build the lab's real components from their Go modules, once per pinned version.

Each folder beside this file is one Go module of ours (go.mod, go.sum) that requires one
upstream module at the version the lab pins and lists, as `tool` lines, the programs the lab
runs from it. Nothing else pins a version: the binary's version is the `require` line.

    gobuild.py build [COMPONENT...]   build what is missing into .cache/bin/<program>-<version>
                                      (a program of our own: <program>-<version>-<digest of its sources>)
    gobuild.py generate COMPONENT     rewrite the component's go.mod from its pin (then go mod tidy)
    gobuild.py check                  each go.mod's replace block equals what its upstream go.mod implies
    gobuild.py path PROGRAM           print the cached binary's path (exit 1 if not built)
    gobuild.py version COMPONENT      print the pinned version of the component's upstream module

The cache folder is $GPUREADY_GO_BIN_DIR (tools/test-env.sh sets it), else .cache/bin here.

A module's own replace directives apply only when it is the main module, so ours carries
them over: k8s.io/kubernetes points every staging module k8s.io/X at ./staging/src/k8s.io/X,
which a module that requires it cannot see, so ours replaces each with k8s.io/X at the
matching v0.MINOR.PATCH release; NFD does the same with its api/nfd module and also pins its
k8s.io modules. That block is derived from the upstream go.mod, never typed.
"""

import argparse
import collections
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
BIN_DIR = Path(os.environ.get("GPUREADY_GO_BIN_DIR", REPO / ".cache" / "bin"))


def _k8s_ldflags(version):
    # What Kubernetes' own build (hack/lib/version.sh) stamps, so /version and --version
    # answer v1.37.2 instead of v0.0.0-master.
    major, minor = version.lstrip("v").split(".")[:2]
    flags = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate=1970-01-01T00:00:00Z",
        ]
    return flags


def _nvidia_ldflags(version):
    return [f"-X github.com/NVIDIA/k8s-device-plugin/internal/info.version={version}"]


def _toolkit_ldflags(version):
    # The toolkit's Makefile stamps the version without its "v" (nvidia-ctk --version: 1.20.2).
    return [f"-X github.com/NVIDIA/nvidia-container-toolkit/internal/info.version={version.lstrip('v')}"]


def _nfd_ldflags(version):
    return [f"-X sigs.k8s.io/node-feature-discovery/pkg/version.version={version}"]


# folder -> the upstream module it pins, how its programs are named, how they are stamped
COMPONENTS = {
    "kubernetes": {
        "module": "k8s.io/kubernetes",
        "ldflags": _k8s_ldflags,
        "local_version": lambda version: re.sub(r"^v1\.", "v0.", version),
    },
    "etcd": {
        "module": "go.etcd.io/etcd/server/v3",
        "names": {"go.etcd.io/etcd/server/v3": "etcd"},
    },
    "device-plugin": {
        "module": "github.com/NVIDIA/k8s-device-plugin",
        "ldflags": _nvidia_ldflags,
        "cgo": True,
    },
    "nfd": {
        "module": "sigs.k8s.io/node-feature-discovery",
        "ldflags": _nfd_ldflags,
    },
    "container-toolkit": {
        "module": "github.com/NVIDIA/nvidia-container-toolkit",
        "ldflags": _toolkit_ldflags,
        "cgo": True,
    },
    # the release before the pin: the test apt repository's older packages (pins, upgrades, downgrades)
    "container-toolkit-previous": {
        "module": "github.com/NVIDIA/nvidia-container-toolkit",
        "ldflags": _toolkit_ldflags,
        "cgo": True,
    },
}


class GoModError(Exception):
    pass


def parse_gomod(text):
    """The parts of a go.mod we use: module, requires, replaces and tools."""
    out = {"module": None, "require": {}, "replace": {}, "tool": []}
    block = None
    for raw in text.splitlines():
        line = raw.split("//", 1)[0].strip()
        if not line:
            continue
        if block:
            if line == ")":
                block = None
                continue
            _add_directive(out, block, line)
            continue
        verb, rest = (line.split(" ", 1) + [""])[:2]
        rest = rest.strip()
        if rest == "(":
            block = verb
        elif verb == "module":
            out["module"] = rest
        else:
            _add_directive(out, verb, rest)
    return out


def _add_directive(out, verb, rest):
    parts = rest.split()
    if verb == "require":
        out["require"][parts[0]] = parts[1]
    elif verb == "replace":
        left, right = rest.split("=>")
        out["replace"][left.split()[0]] = right.split()
    elif verb == "tool":
        out["tool"].append(parts[0])


def carried_replaces(upstream_gomod_text, local_version):
    """The upstream module's replace directives as ours must state them.

    A local path (`./staging/src/k8s.io/api`, `./api/nfd`) becomes the published module of
    that name at `local_version`; a module => module@version replace is kept as it is. A
    replace of a module the upstream does not require (etcd's ./FORBIDDEN_DEPENDENCY guards)
    changes no build and is left out.
    """
    upstream = parse_gomod(upstream_gomod_text)
    replaces = {}
    for module, target in sorted(upstream["replace"].items()):
        if module not in upstream["require"]:
            continue
        if target[0].startswith("./") or target[0].startswith("../"):
            replaces[module] = [module, local_version]
        else:
            replaces[module] = target
    return replaces


def _go(args, cwd, env=None):
    result = subprocess.run(["go", *args], cwd=cwd, env=env, text=True, capture_output=True, check=False)
    if result.returncode != 0:
        raise GoModError(f"go {' '.join(args)} (in {cwd}) failed:\n{result.stderr.strip()}")
    return result.stdout


def _download(module, version):
    # Outside our modules, so a go.mod being rewritten cannot get in the way.
    return json.loads(_go(["mod", "download", "-json", f"{module}@{version}"], HERE))


def upstream_gomod(module, version):
    return Path(_download(module, version)["GoMod"]).read_text()


def upstream_dir(name):
    """The pinned upstream module's files in Go's module cache (read-only): where the lab reads what
    it needs besides programs, such as NFD's CustomResourceDefinitions."""
    found = component(name)
    return Path(_download(found.spec["module"], found.version)["Dir"])


def dependency_dir(name, module):
    """A module the component builds with, at the version its go.mod requires (read-only), such as
    k8s.io/kubelet for the device plugin API's api.proto the plugin was built against."""
    found = component(name)
    replaced = found.gomod["replace"].get(module)
    if replaced and len(replaced) == 2:
        module, version = replaced
    else:
        version = found.gomod["require"].get(module)
    if not version:
        raise GoModError(f"{found.folder}/go.mod does not require {module}")
    return Path(_download(module, version)["Dir"])


Component = collections.namedtuple("Component", "spec folder gomod version")


def component(name):
    if name not in COMPONENTS:
        raise GoModError(f"unknown component {name!r}; known: {', '.join(COMPONENTS)}")
    spec = COMPONENTS[name]
    folder = HERE / name
    gomod = parse_gomod((folder / "go.mod").read_text())
    version = gomod["require"].get(spec["module"])
    if not version:
        raise GoModError(f"{folder}/go.mod does not require {spec['module']}")
    return Component(spec, folder, gomod, version)


def program_name(spec, tool):
    return spec.get("names", {}).get(tool, tool.rsplit("/", 1)[-1])


def _own_sources_digest(found, tool):
    """For a program of ours in the component's module (not the upstream's): a digest of its Go files, so
    that an edit builds it again; None for an upstream program, which only its pin changes."""
    prefix = found.gomod["module"] + "/"
    if not tool.startswith(prefix):
        return None
    digest = hashlib.sha256()
    for source in sorted((found.folder / tool[len(prefix):]).glob("*.go")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()[:12]


def binary_path(name, tool):
    found = component(name)
    digest = _own_sources_digest(found, tool)
    return BIN_DIR / (f"{program_name(found.spec, tool)}-{found.version}" + (f"-{digest}" if digest else ""))


def find_binary(program):
    """The cached path of `program` (built or not), whichever component lists it."""
    for name, spec in COMPONENTS.items():
        for tool in component(name).gomod["tool"]:
            if program_name(spec, tool) == program:
                return binary_path(name, tool)
    raise GoModError(f"no component builds {program!r}")


def wanted_replaces(name):
    found = component(name)
    local_version = found.spec.get("local_version", lambda v: v)(found.version)
    return carried_replaces(upstream_gomod(found.spec["module"], found.version), local_version)


def check(names):
    problems = []
    for name in names:
        want, have = wanted_replaces(name), component(name).gomod["replace"]
        if have != want:
            missing = sorted(set(want) - set(have))
            extra = sorted(set(have) - set(want))
            differ = sorted(k for k in set(want) & set(have) if want[k] != have[k])
            problems.append(f"{name}: go.mod's replace block is not the upstream one (missing {missing}, "
                            f"extra {extra}, different {differ}); run: lab/go/gobuild.py generate {name}")
    return problems


def generate(name):
    spec, folder, gomod, version = component(name)
    lines = [f"module {gomod['module']}", "", "go 1.26.0", "", f"require {spec['module']} {version}", ""]
    replaces = wanted_replaces(name)
    if replaces:
        lines.append(f"// Generated by lab/go/gobuild.py from {spec['module']}'s own go.mod.")
        lines.append("replace (")
        lines += [f"\t{left} => {' '.join(right)}" for left, right in replaces.items()]
        lines += [")", ""]
    lines.append("tool (")
    lines += [f"\t{tool}" for tool in gomod["tool"]]
    lines += [")", ""]
    (folder / "go.mod").write_text("\n".join(lines))
    _go(["mod", "tidy"], folder)


def build(names, out=sys.stdout):
    BIN_DIR.mkdir(parents=True, exist_ok=True)
    for name in names:
        spec, folder, gomod, version = component(name)
        ldflags = ["-s", "-w", *spec.get("ldflags", lambda v: [])(version)]
        env = dict(os.environ, CGO_ENABLED="1" if spec.get("cgo") else "0")
        for tool in gomod["tool"]:
            target = binary_path(name, tool)
            if target.exists():
                print(f"gobuild: {target.name}: cached", file=out)
                continue
            start = time.monotonic()
            partial = target.with_name(target.name + ".partial")
            _go(["build", "-trimpath", "-ldflags", " ".join(ldflags), "-o", str(partial), tool],
                folder, env=env)
            partial.rename(target)
            print(f"gobuild: {target.name}: built in {time.monotonic() - start:.0f}s", file=out)
            out.flush()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build").add_argument("components", nargs="*")
    sub.add_parser("generate").add_argument("component")
    sub.add_parser("check")
    sub.add_parser("path").add_argument("program")
    sub.add_parser("version").add_argument("component")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            names = args.components or list(COMPONENTS)
            problems = check(names)
            if problems:
                raise GoModError("\n".join(problems))
            build(names)
        elif args.command == "generate":
            generate(args.component)
        elif args.command == "check":
            problems = check(list(COMPONENTS))
            for problem in problems:
                print(problem, file=sys.stderr)
            return 1 if problems else 0
        elif args.command == "version":
            print(component(args.component).version)
        elif args.command == "path":
            path = find_binary(args.program)
            print(path)
            return 0 if path.exists() else 1
    except GoModError as exc:
        print(f"gobuild: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
