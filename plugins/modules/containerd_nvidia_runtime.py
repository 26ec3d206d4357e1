#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: containerd_nvidia_runtime
short_description: Declare the NVIDIA runtime in containerd's config, as nvidia-ctk does, without losing comments
version_added: 0.1.0
description:
  - Does what C(nvidia-ctk runtime configure --runtime=containerd) does to a containerd config, in the right
    CRI table for the file's config version (1, 2, 3 or 4), idempotently, with check and diff mode.
  - The edit runs on the controller with tomlkit (an action plugin), so comments, key order and layout
    of the rest of the file stay byte for byte, and check mode shows the real diff on a fresh node.
    The node only needs Python's standard library (see M(gpuready.nvidia.containerd_config_file)).
  - "Differences from nvidia-ctk, on purpose: D1 a new or empty file gets the version the installed containerd
    wants (O(config_version)); D2 O(enable_cdi) on a version 1 file goes to C(plugins.cri.enable_cdi), where
    containerd reads it; D3 O(drop_in) on a version 1 file is refused; D4 without a base runtime to copy,
    C(SystemdCgroup) follows the kubelet's C(cgroupDriver); D5 on a version 1/2 file without runtimes, C(runc)
    is declared too, since containerd 1.x drops its built-in runc once the file declares any runtime; D6
    O(set_as_default) is refused while the deprecated C(containerd.default_runtime) table sets a
    C(runtime_type), which makes containerd 1.x ignore C(default_runtime_name); D7 the CRI table the file
    really uses wins over the one its version implies, where containerd reads it at that version (a version 2
    file with version-3 tables, as AKS writes), with a warning; a table containerd ignores at the file's version
    (the C(io.containerd.grpc.v1.cri) tables of a file without C(version), read by containerd 1.x only from
    C(plugins.cri)) is named in a warning and the implied table is edited; D8 a runtime built without a base
    on a version 3/4 file omits C(runtime_root) and C(runtime_engine), which containerd 2.0 removed; D9 the
    runtime entry is replaced in the file itself unless O(drop_in) is given, where nvidia-ctk 1.18 and later
    writes the entry of a version 2/3 file to a drop-in that containerd 2.x merges over the file, so there keys
    of an older entry of that name that the new one lacks (such as C(base_runtime_spec)) stay in effect."
  - Option keys that differ only in case from the ones written (for example C(binaryName)) are removed,
    because containerd 1.x decodes runtime options case-insensitively.
  - Every key or table added or changed carries a trailing comment that starts with C(gpuready.nvidia),
    recording the old value (for a runtime entry declared before, the whole entry as an inline table).
    O(state=absent) reverts exactly those, so present then absent gives back the original file.
  - containerd reads its config only at start; RV(restart_required) says when it must be restarted.
  - Input it cannot handle faithfully fails the task and leaves every file as it was - invalid TOML, a key
    of the wrong type, an unknown config version, a path that is not a regular file, a file over 4 MiB, bytes
    that are not UTF-8, a UTF-8 byte order mark (see M(gpuready.nvidia.containerd_config_file)). A write
    that fails half way gives the files already written their old content back.
author: gpuready.nvidia contributors (!UNKNOWN)
extends_documentation_fragment:
  - gpuready.nvidia.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
    details: One before/after entry per file (config.toml and the drop-in).
  action:
    support: full
    details: Computes the new config on the controller; needs C(tomlkit) there.
requirements:
  - tomlkit >= 0.15.1 (controller)
  - PyYAML (controller, to read the kubelet configuration)
notes:
  - O(flavor=k3s) and O(flavor=rke2) are tested against k3s' rendered configs (a GPU node and an RKE2 node),
    not against a live k3s or RKE2.
options:
  path:
    description:
      - containerd's main config file. A symbolic link is followed and kept.
      - Defaults to C(/etc/containerd/config.toml); with O(flavor=k3s) or O(flavor=rke2), to the config they
        render, C(/var/lib/rancher/<flavor>/agent/etc/containerd/config.toml), which is read and never written.
    type: path
  flavor:
    description:
      - V(containerd) edits O(path).
      - V(k3s) and V(rke2) regenerate containerd's config at every start and add an C(nvidia) runtime themselves
        when they find the toolkit's binary (C(nvidia-container-runtime) in C(/usr/bin), C(/usr/local/nvidia/toolkit)
        and similar). So the rendered file is never edited. O(set_as_default) writes C(default-runtime) into
        C(<flavor_config_dir>/config.yaml.d/90-gpuready-<runtime_name>.yaml); that agent option came with k3s
        PR 8751 (late 2023; k3s 1.29 and the 1.26-1.28 patch releases of that time, as far as we know) and
        older releases skip the key, leaving pods to select the runtime through a RuntimeClass.
      - A runtime k3s does not detect itself (another name or path) goes into O(drop_in) when the rendered config
        imports it (newer k3s import C(config-v3.toml.d/*.toml)), else into C(config-v3.toml.tmpl) (or
        C(config.toml.tmpl) for a version 2 rendering) holding C({{ template "base" . }}) plus the runtime table
        (the base template needs k3s 1.24.17, 1.25.13, 1.26.8, 1.27.5, 1.28.1 or later). A template of your own
        is never edited. The appended table is checked against the rendered config for duplicate tables.
      - Restart C(k3s), C(k3s-agent), C(rke2-server) or C(rke2-agent) afterwards (RV(restart_service)).
    type: str
    choices: [containerd, k3s, rke2]
    default: containerd
  flavor_config_dir:
    description: The k3s or RKE2 configuration folder, C(/etc/rancher/k3s) or C(/etc/rancher/rke2) by default.
    type: path
  containerd_binary:
    description:
      - containerd executable on the node (a name on E(PATH) or an absolute path), used by
        O(config_version=auto) and by O(validate).
    type: str
    default: containerd
  runtime_name:
    description:
      - Name of the runtime entry (and of the RuntimeClass handler that selects it).
      - 1 to 63 letters, digits, C(_) or C(-), starting with a letter or digit; no dots.
    type: str
    default: nvidia
  runtime_path:
    description: Absolute path of the NVIDIA container runtime, written as C(options.BinaryName).
    type: path
    default: /usr/bin/nvidia-container-runtime
  set_as_default:
    description:
      - V(true) makes the runtime containerd's default (C(default_runtime_name)), which the device plugin
        needs unless pods select it through a RuntimeClass.
      - V(false) removes C(default_runtime_name) when it names this runtime (an earlier value recorded by
        this module is restored).
      - Omitted leaves C(default_runtime_name) as it is.
    type: bool
  enable_cdi:
    description: Set C(enable_cdi = true) on the CRI plugin. V(false) leaves the key as it is.
    type: bool
    default: false
  systemd_cgroup:
    description:
      - V(auto) copies C(SystemdCgroup) from the base runtime; without a base, it follows the kubelet's
        C(cgroupDriver) read from O(kubelet_config), and stays unset when there is no kubelet config.
      - V(true) or V(false) set C(options.SystemdCgroup) on the runtime.
    type: str
    choices: [auto, 'true', 'false']
    default: auto
  kubelet_config:
    description: Kubelet configuration file read for O(systemd_cgroup=auto).
    type: path
    default: /var/lib/kubelet/config.yaml
  drop_in:
    description:
      - Write the runtime to this separate file instead of O(path), as nvidia-ctk 1.18+ does. It gets the
        config version and a copy of the whole CRI table (containerd 1.x replaces imported plugin tables
        instead of merging them), and O(path) gets an C(imports) entry covering it unless one already does.
      - Refused for a version 1 O(path) (D3), and in the folder of O(path), since the C(imports) glob of its
        folder would cover O(path) itself.
    type: path
  config_version:
    description:
      - Version of a new or empty O(path). V(auto) is 3 when O(containerd_binary) reports 2.x, else 2.
      - Ignored (with a warning) for a file that has keys; its own version counts.
    type: str
    choices: [auto, '1', '2', '3', '4']
    default: auto
  state:
    description:
      - V(absent) undoes what this module did. The runtime it added, the default, the drop-in and the import
        go; a runtime declared before it is kept, with the values it had before this module rewrote it.
      - On a file that carries none of this module's marks (configured by nvidia-ctk or by hand) it removes
        the runtime and the default naming it, as nvidia-ctk's own cleanup does.
    type: str
    choices: [present, absent]
    default: present
  backup:
    description: Keep a timestamped copy of each file before it is replaced or deleted.
    type: bool
    default: false
  validate:
    description:
      - Before writing, run C(containerd config dump) on the new file(s) (in drop-in mode on a temporary
        pair) and check that the dump shows the runtime where it was written; and check what C(config dump)
        does not (a default runtime without an entry, runc not declared where containerd 1.x needs it,
        a version 3/4 file for a 1.x binary). A failed validation writes nothing.
      - Without a containerd binary on the node the dump is skipped with a warning.
    type: bool
    default: true
  applied_record:
    description:
      - A file on the node where the module records what it left in the config files (their SHA-256
        checksums, with a fingerprint of the options, the engine's code, the tomlkit version, the
        containerd version and the kubelet config). A later run whose files and fingerprint match the
        record is a no-op known without parsing the files, and reports the recorded result.
      - Any difference takes the full path, among them a file changed by someone else; the record is then
        rewritten. One file holds an entry per O(path); it is created with mode C(0600), never in check mode.
      - Omitted, nothing is recorded and every run parses the files.
    type: path
seealso:
  - name: nvidia-ctk runtime configure
    description: The NVIDIA Container Toolkit's own command.
    link: https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html
"""

EXAMPLES = r"""
- name: Make nvidia containerd's default runtime
  gpuready.nvidia.containerd_nvidia_runtime:
    set_as_default: true
  notify: Restart containerd

- name: Put the runtime in a drop-in, with CDI, keeping a backup
  gpuready.nvidia.containerd_nvidia_runtime:
    drop_in: /etc/containerd/conf.d/99-nvidia.toml
    set_as_default: true
    enable_cdi: true
    backup: true

- name: Re-runs on unchanged files skip the parse (the containerd_runtime role does this)
  gpuready.nvidia.containerd_nvidia_runtime:
    set_as_default: true
    applied_record: /var/lib/gpuready/containerd_runtime_applied.json

- name: Remove it again
  gpuready.nvidia.containerd_nvidia_runtime:
    drop_in: /etc/containerd/conf.d/99-nvidia.toml
    state: absent
"""

RETURN = r"""
config_version:
  description: Config version of O(path) (after the edit).
  returned: success
  type: int
  sample: 2
runtime_table:
  description: Dotted path of the runtime entry.
  returned: success
  type: str
  sample: plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia
default_runtime_name:
  description: C(default_runtime_name) after the edit, V(null) when unset (containerd then uses runc).
  returned: success
  type: str
  sample: nvidia
restart_required:
  description: containerd must be restarted to load the change (it reads its config only at start).
  returned: success
  type: bool
backups:
  description: For each file replaced or deleted with O(backup=true), the backup path; V(null) for a file this run created.
  returned: success
  type: dict
  sample: {"/etc/containerd/config.toml": "/etc/containerd/config.toml.1234.2026-12-02@10:00:00~"}
files:
  description: Files written or deleted (would be, in check mode).
  returned: success
  type: list
  elements: str
warnings:
  description: Things worth knowing that did not stop the edit (also shown as task warnings).
  returned: success
  type: list
  elements: str
restart_service:
  description: The service that must restart to load the change, for O(flavor=k3s) or O(flavor=rke2) (the agent's unit on agent nodes).
  returned: flavor is k3s or rke2
  type: str
  sample: k3s
applied_record_matched:
  description: V(true) when O(applied_record) showed this run to be a no-op and the files were not parsed.
  returned: O(applied_record) is set
  type: bool
diff:
  description: One before/after entry per changed file, rendered by Ansible as a unified diff with C(--diff).
  returned: changed
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_argspec import ARGUMENT_SPEC


def main():
    # The work happens in the action plugin of the same name; reaching this means it was bypassed.
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.fail_json(msg="gpuready.nvidia.containerd_nvidia_runtime runs through its action plugin; "
                         "call it by its full name from a play")


if __name__ == "__main__":
    main()
