# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of containerd_nvidia_runtime: read the node's files, edit them here with tomlkit,
validate on the node, then hand the write to containerd_config_file (checksum-guarded). With
applied_record, a re-run on files that still hold what this edit last left stops before tomlkit."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import functools

import yaml

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.text.converters import to_text
from ansible.plugins.action import ActionBase

from ansible_collections.gpuready.nvidia.plugins.module_utils import containerd_applied as applied
from ansible_collections.gpuready.nvidia.plugins.module_utils import containerd_checks, containerd_dropin
from ansible_collections.gpuready.nvidia.plugins.module_utils import containerd_config as engine
from ansible_collections.gpuready.nvidia.plugins.module_utils import containerd_entry, containerd_marks
from ansible_collections.gpuready.nvidia.plugins.module_utils import containerd_toml, containerd_versions
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_argspec import ARGUMENT_SPEC
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_checks import (
    dump_problem, kubelet_systemd_cgroup, semantic_problems)
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_dropin import covering_import
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_toml import HAS_TOMLKIT, TOMLKIT_IMPORT_ERROR, ConfigError
from ansible_collections.gpuready.nvidia.plugins.module_utils.containerd_versions import cri_disabled
from ansible_collections.gpuready.nvidia.plugins.module_utils import k3s_containerd

NODE_MODULE = "gpuready.nvidia.containerd_config_file"
DEFAULT_CONFIG = "/etc/containerd/config.toml"
# The code that shapes the edit, this file included: a record made by other code never matches.
ENGINE_SOURCES = tuple(m.__file__ for m in (engine, containerd_checks, containerd_dropin, containerd_entry,
                                            containerd_marks, containerd_toml, containerd_versions,
                                            k3s_containerd)) + (__file__,)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        args = dict(self._task.args)
        # YAML booleans for systemd_cgroup arrive as bool; the spec takes the strings.
        if isinstance(args.get("systemd_cgroup"), bool):
            args["systemd_cgroup"] = "true" if args["systemd_cgroup"] else "false"
        if isinstance(args.get("config_version"), int):
            args["config_version"] = str(args["config_version"])
        self._task.args = args
        dummy, params = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        # Plain str, not Ansible's tagged strings: they end up as TOML values.
        params = dict((k, str(v) if isinstance(v, str) else v) for k, v in params.items())
        if not HAS_TOMLKIT:
            raise AnsibleActionFail("containerd_nvidia_runtime needs the Python library tomlkit on the "
                                    "controller (pip install tomlkit): %s" % TOMLKIT_IMPORT_ERROR)
        try:
            result.update(self._run(params, task_vars))
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        return result

    def _node(self, task_vars, **module_args):
        reply = self._execute_module(module_name=NODE_MODULE, module_args=module_args,
                                     task_vars=task_vars)
        if reply.get("failed"):
            raise AnsibleActionFail(reply.get("msg", "containerd_config_file failed"), result=reply)
        return reply

    def _run(self, params, task_vars):
        if params["flavor"] != "containerd":
            return self._run_k3s(params, task_vars)
        if params["flavor_config_dir"]:
            raise AnsibleActionFail("flavor_config_dir is for flavor k3s or rke2")
        params["path"] = params["path"] or DEFAULT_CONFIG
        path, drop_in = params["path"], params["drop_in"]
        paths = [path] + ([drop_in] if drop_in else [])
        facts = self._node(task_vars, op="read", paths=paths,
                           containerd_binary=params["containerd_binary"],
                           kubelet_config=params["kubelet_config"],
                           applied_record=params["applied_record"])
        files = facts["files"]
        version = facts.get("containerd_version")
        record = self._record(params, path, paths, facts)
        if record and record["known"] is not None:
            return self._unchanged(record["known"])
        major = int(version.split(".")[0]) if version else None
        request = self._request(params, major, facts.get("kubelet_config_text"))
        config, dropped = files[path], files.get(drop_in) if drop_in else None
        try:
            outcome = engine.edit(config["content"], request, config_path=path, drop_in_path=drop_in,
                                  drop_in_text=dropped["content"] if dropped else None)
        except ConfigError as exc:
            raise AnsibleActionFail(to_text(exc))
        # The engine used the requested version only for a file without keys; say so when it differs.
        if params["config_version"] != "auto" and outcome.config_version != int(params["config_version"]):
            outcome.warnings.append("config_version=%s ignored: %s already has keys and its own version"
                                    % (params["config_version"], path))

        changes = [(p, files[p], new) for p, new in ((path, outcome.config_text),
                                                     (drop_in, outcome.drop_in_text)) if p]
        changes = [(p, old, new) for p, old, new in changes if old["content"] != new]
        summary = _summary(outcome)  # what a re-run reports: before validation adds its own warnings
        if changes and params["validate"] and request.state == "present":
            self._validate(params, outcome, major, drop_in, task_vars)

        return self._write(params, changes, outcome, task_vars, record, summary)

    def _record(self, params, main_path, paths, facts):
        """The applied record's view of this run (None without applied_record): its fingerprint, what the
        node shows now and, when the record says this edit already left exactly that, its result."""
        if not params["applied_record"]:
            return None
        fingerprint = applied.fingerprint(params, _engine_identity())
        observed = applied.observation(((p, facts["files"][p]["checksum"]) for p in paths),
                                       facts.get("containerd_version"), facts.get("kubelet_config_text"))
        text = facts.get("applied_record_text")
        return {"main": main_path, "fingerprint": fingerprint, "observed": observed, "text": text,
                "known": applied.applied_result(text, main_path, fingerprint, observed)}

    def _unchanged(self, known):
        """The result of a run the applied record shows to be a no-op (tomlkit never ran)."""
        return dict(known, changed=False, diff=[], restart_required=False, backups={}, files=[],
                    applied_record_matched=True)

    def _write(self, params, changes, outcome, task_vars, record, summary):
        """Hand the changed files and the new applied record to the node (unless check mode) and build
        the result."""
        written = {"written": [p for p, _o, _n in changes], "backups": {}}
        record_text = None
        if record and not self._task.check_mode:
            after = dict(record["observed"]["files"])
            after.update((p, applied.sha256_text(new)) for p, _old, new in changes)
            record_text = applied.updated_record(record["text"], record["main"], record["fingerprint"],
                                                 dict(record["observed"], files=after), summary)
        if (changes or record_text) and not self._task.check_mode:
            written = self._node(task_vars, op="write", backup=params["backup"],
                                 files=[{"path": p, "content": new, "checksum": old["checksum"]}
                                        for p, old, new in changes],
                                 applied_record=params["applied_record"] if record_text else None,
                                 applied_record_content=record_text)
        result = dict(summary, warnings=outcome.warnings)
        result.update({
            "changed": bool(changes),
            "diff": [{"before_header": p, "after_header": p, "before": old["content"] or "",
                      "after": new or ""} for p, old, new in changes],
            "restart_required": bool(changes),
            "backups": written.get("backups", {}),
            "files": written.get("written", []),
        })
        if record:
            result["applied_record_matched"] = False
        return result

    def _run_k3s(self, params, task_vars):
        """k3s/RKE2 render config.toml themselves: read it, write only files they read (see k3s_containerd)."""
        flavor = params["flavor"]
        rendered = params["path"] or k3s_containerd.rendered_config(flavor)
        config_dir = params["flavor_config_dir"] or "/etc/rancher/%s" % flavor
        request = self._request(dict(params, config_version="3"), None, None)
        candidates = [k3s_containerd.template_path(rendered, v) for v in (2, 3)]
        candidates.append(k3s_containerd.default_runtime_file(config_dir, params["runtime_name"]))
        if params["drop_in"]:
            candidates.append(params["drop_in"])
        facts = self._node(task_vars, op="read", paths=[rendered] + candidates,
                           applied_record=params["applied_record"])
        files = facts["files"]
        record = self._record(params, rendered, [rendered] + candidates, facts)
        if record and record["known"] is not None:
            return self._unchanged(record["known"])
        try:
            wanted, outcome = k3s_containerd.plan(
                flavor, rendered, files[rendered]["content"], dict((p, files[p]["content"]) for p in candidates),
                request, config_dir, params["drop_in"])
        except ConfigError as exc:
            raise AnsibleActionFail(to_text(exc))
        changes = [(p, files[p], new) for p, new in sorted(wanted.items())]
        return self._write(params, changes, outcome, task_vars, record, dict(_summary(outcome), restart_service=flavor))

    def _request(self, params, containerd_major, kubelet_text):
        if params["config_version"] == "auto":
            new_version = 3 if containerd_major is not None and containerd_major >= 2 else 2
        else:
            new_version = int(params["config_version"])
        kubelet_cgroup = None
        if params["systemd_cgroup"] == "auto" and kubelet_text is not None:
            try:
                kubelet_cgroup = kubelet_systemd_cgroup(yaml.safe_load(kubelet_text) or {})
            except (yaml.YAMLError, ConfigError) as exc:
                raise AnsibleActionFail("%s: cannot read the kubelet's cgroupDriver: %s"
                                        % (params["kubelet_config"], exc))
        systemd = {"auto": "auto", "true": True, "false": False}[params["systemd_cgroup"]]
        try:
            return engine.Request(runtime_name=params["runtime_name"], runtime_path=params["runtime_path"],
                                  set_as_default=params["set_as_default"], enable_cdi=params["enable_cdi"],
                                  systemd_cgroup=systemd, kubelet_systemd_cgroup=kubelet_cgroup,
                                  state=params["state"], new_file_version=new_version)
        except ConfigError as exc:
            raise AnsibleActionFail(to_text(exc))

    def _validate(self, params, outcome, containerd_major, drop_in, task_vars):
        """Semantic checks here, then containerd's own parser on the node; nothing is written on failure."""
        checked = outcome.drop_in_text if drop_in else outcome.config_text
        problems = semantic_problems(checked, drop_in or params["path"], containerd_major)
        if problems:
            raise AnsibleActionFail("validation failed, nothing written: " + "; ".join(problems))
        if containerd_major is None:
            outcome.warnings.append("containerd binary %r not found on the node: config dump validation "
                                    "skipped" % params["containerd_binary"])
            return
        files = [{"path": params["path"], "content": outcome.config_text}]
        rewrite = None
        if drop_in:
            files.append({"path": drop_in, "content": outcome.drop_in_text})
            rewrite = covering_import(outcome.config_text, drop_in, params["path"])
        dump = self._node(task_vars, op="validate", files=files, import_rewrite=rewrite,
                          containerd_binary=params["containerd_binary"])["dump"]
        if cri_disabled(outcome.config_text):
            return  # already warned: a containerd without CRI has no runtimes to show
        problem = dump_problem(dump, params["runtime_name"], params["runtime_path"],
                               outcome.default_runtime_name)
        if problem:
            raise AnsibleActionFail("validation failed, nothing written: containerd %s" % problem)


@functools.lru_cache(maxsize=None)
def _engine_identity():
    """Read the engine's sources once per process, not once per task."""
    return applied.engine_identity(ENGINE_SOURCES, containerd_toml.tomlkit.__version__)


def _summary(outcome):
    """The result fields that depend only on the edit (a no-op re-run reports them too)."""
    return {"config_version": outcome.config_version, "runtime_table": outcome.runtime_table,
            "default_runtime_name": outcome.default_runtime_name, "warnings": list(outcome.warnings)}
