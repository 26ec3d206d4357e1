# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The NVIDIA runtime on k3s and RKE2, which render containerd's config.toml themselves at every start.

We never edit the rendered file. k3s (and RKE2, which uses k3s' templates) adds an `nvidia` runtime by
itself when it finds the toolkit's binary; what it cannot know we add in a file it reads:
- the default runtime: `default-runtime` in a config.yaml.d drop-in (the agent option from k3s PR #8751,
  late 2023; older releases skip the key with a warning, and pods then need a RuntimeClass);
- a runtime k3s does not detect (another name or path): a containerd drop-in where the rendered config
  imports one, else a `config(-v3).toml.tmpl` that renders k3s' own base and appends our table.
Anything appended is checked against the rendered config for duplicate tables, which containerd
refuses at start.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import posixpath

try:
    import tomllib as _strict_toml  # a strict parser: duplicate tables are errors
except ImportError:  # pragma: no cover - Python < 3.11 on the controller
    _strict_toml = None

from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_config import Outcome
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_dropin import imports_cover
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_entry import build_entry
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_toml import (
    ConfigError, dotted, get_path, parse, plain, to_item, tomlkit)
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_versions import cri_table_name, detect_version

FLAVORS = ("k3s", "rke2")
OUR_HEADER = "# Written by gpuready.nvidia (containerd_nvidia_runtime)."
# Where k3s looks for the toolkit's runtimes, and the names it gives them (pkg/agent/containerd).
DETECTED = {"nvidia": "nvidia-container-runtime", "nvidia-experimental": "nvidia-container-runtime-experimental",
            "nvidia-cdi": "nvidia-container-runtime.cdi"}
DETECTED_DIRS = ("/usr/local/nvidia/toolkit", "/usr/bin", "/usr/local/bin", "/usr/sbin", "/bin", "/sbin")


def rendered_config(flavor):
    return "/var/lib/rancher/%s/agent/etc/containerd/config.toml" % flavor


def default_runtime_file(flavor_config_dir, runtime_name):
    return posixpath.join(flavor_config_dir, "config.yaml.d", "90-gpuready-%s.yaml" % runtime_name)


def template_path(rendered_path, version):
    name = "config-v3.toml.tmpl" if version >= 3 else "config.toml.tmpl"
    return posixpath.join(posixpath.dirname(rendered_path), name)


def detected_by_k3s(request):
    return DETECTED.get(request.runtime_name) == posixpath.basename(request.runtime_path) and \
        posixpath.dirname(request.runtime_path) in DETECTED_DIRS


def _ours(text):
    return text is not None and text.startswith(OUR_HEADER)


def plan(flavor, rendered_path, rendered_text, files, request, flavor_config_dir, drop_in_path=None):
    """New content for each file we own: {path: text, or None to remove}; files maps each path we
    might write to its current text (None when missing). Returns (changes, outcome)."""
    outcome = Outcome()
    if rendered_text is None:
        raise ConfigError("%s does not exist: start %s once so that it renders containerd's config, "
                          "then run again" % (rendered_path, flavor))
    doc = parse(rendered_text, rendered_path)
    version = detect_version(doc, rendered_path, 3)
    cri = cri_table_name(doc, version, rendered_path, outcome.warnings)
    runtimes_path = ["plugins", cri, "containerd", "runtimes"]
    outcome.config_version = version
    outcome.runtime_table = dotted(runtimes_path + [request.runtime_name])
    default_file = default_runtime_file(flavor_config_dir, request.runtime_name)
    template = template_path(rendered_path, version)
    wanted = {}

    if request.state == "absent":
        for path in (default_file, template, drop_in_path):
            if path and _ours(files.get(path)):
                wanted[path] = None
        return _changes(files, wanted), outcome

    runtimes = plain(doc).get("plugins", {}).get(cri, {}).get("containerd", {}).get("runtimes", {})
    current = runtimes.get(request.runtime_name)
    if current is not None:
        binary = current.get("options", {}).get("BinaryName")
        if binary != request.runtime_path:
            raise ConfigError(
                "%s already renders runtime %r with BinaryName %r; a second table of that name would stop "
                "containerd. Pick another runtime_name for %s."
                % (flavor, request.runtime_name, binary, request.runtime_path))
    elif detected_by_k3s(request):
        outcome.warnings.append("%s adds runtime %r itself once it finds %s at start: install the toolkit, "
                                "then restart %s" % (flavor, request.runtime_name, request.runtime_path, flavor))
    else:
        table = _runtime_table_text(get_path(doc, runtimes_path, rendered_path), version, cri, request)
        _refuse_duplicates(rendered_text, table, rendered_path)
        if drop_in_path:
            imports = plain(doc).get("imports", [])
            if not imports_cover(imports, drop_in_path, rendered_path):
                raise ConfigError(
                    "%s does not import %s (this %s release has no config drop-in folder); omit drop_in to "
                    "use a config template instead" % (rendered_path, drop_in_path, flavor))
            wanted[drop_in_path] = "%s\nversion = %d\n\n%s" % (OUR_HEADER, version, table)
        else:
            existing = files.get(template)
            if existing is not None and not _ours(existing):
                raise ConfigError(
                    "%s is a template of your own; containerd_nvidia_runtime does not edit Go templates. "
                    "Append this table to it:\n%s" % (template, table))
            wanted[template] = ("%s Renders %s's own config, then adds the runtime.\n{{ template \"base\" . }}\n\n%s"
                                % (OUR_HEADER, flavor, table))
    if request.set_as_default is True:
        wanted[default_file] = "%s\ndefault-runtime: %s\n" % (OUR_HEADER, request.runtime_name)
        outcome.default_runtime_name = request.runtime_name
    elif request.set_as_default is False and _ours(files.get(default_file)):
        wanted[default_file] = None
    return _changes(files, wanted), outcome


def _runtime_table_text(runtimes, version, cri, request):
    entry, _base = build_entry(runtimes, None, version, request, "rendered config")
    doc = tomlkit.document()
    node = doc
    for part in ["plugins", cri, "containerd", "runtimes"]:
        node[part] = tomlkit.table(is_super_table=True)
        node = node[part]
    node[request.runtime_name] = to_item(entry)
    return tomlkit.dumps(doc)


def _refuse_duplicates(rendered_text, table, rendered_path):
    if _strict_toml is None:
        return
    try:
        _strict_toml.loads(rendered_text + "\n" + table)
    except _strict_toml.TOMLDecodeError as exc:
        raise ConfigError("the runtime table would clash with %s once rendered (%s); nothing written"
                          % (rendered_path, exc))


def _changes(files, wanted):
    return dict((path, text) for path, text in wanted.items() if files.get(path) != text)
