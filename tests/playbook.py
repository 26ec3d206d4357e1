# -*- coding: utf-8 -*-
"""Run tasks through the real ansible-playbook (a subprocess, as a user would) and read back what
each task registered."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import subprocess
import sys


def run_tasks(workdir, tasks, timeout=900, python=sys.executable, inventory=None, hosts="localhost", env=None,
              registered=()):
    """Run tasks on localhost with python as the node's interpreter, or on ``hosts`` (one host) of
    ``inventory`` (e.g. the lab's, with ``env`` carrying its podman settings); returns (completed
    process, {register name: result}) for the tasks and blocks given and the ``registered`` names
    (of tasks in files they include)."""
    names = list(_registers(tasks)) + list(registered)
    results = os.path.join(workdir, "results.json")
    saved = ", ".join("%s: (%s | default({'skipped_by_play': true}))" % (json.dumps(n), n) for n in names)
    play = [{
        "name": "gpuready.nvidia test play",
        "hosts": hosts,
        "gather_facts": False,
        "tasks": tasks + [{
            "name": "Save what the tasks registered",
            "ansible.builtin.copy": {"dest": results, "content": "{{ {%s} | to_json }}" % saved, "mode": "0600"},
            "delegate_to": "localhost",
        }],
    }]
    playbook = os.path.join(workdir, "play.yml")
    with open(playbook, "w") as handle:
        json.dump(play, handle, indent=1)  # JSON is YAML
    env = dict(os.environ, **(env or {}))
    env.update(ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=os.path.join(workdir, ".ansible-local"),
               ANSIBLE_RETRY_FILES_ENABLED="0")
    if inventory is None:
        env["ANSIBLE_REMOTE_TEMP"] = os.path.join(workdir, ".ansible-remote")
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "--diff", playbook]
    if inventory is None:
        cmd += ["-i", "localhost,", "-c", "local", "-e", "ansible_python_interpreter=%s" % python]
    else:
        cmd += ["-i", inventory]
    proc = subprocess.run(cmd, env=env, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=timeout, check=False)
    if not os.path.exists(results):
        raise AssertionError("ansible-playbook failed before saving results (rc %d):\n%s"
                             % (proc.returncode, proc.stdout[-6000:]))
    with open(results) as handle:
        return proc, json.load(handle)


def _registers(tasks):
    for task in tasks:
        if "register" in task:
            yield task["register"]
        for key in ("block", "rescue", "always"):
            yield from _registers(task.get(key) or [])
