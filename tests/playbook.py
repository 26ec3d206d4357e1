# -*- coding: utf-8 -*-
"""Run tasks through the real ansible-playbook (a subprocess, as a user would) and read back what
each task registered."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import subprocess
import sys


def run_tasks(workdir, tasks, timeout=900, python=sys.executable):
    """Run tasks on localhost with python as the node's interpreter; returns (completed process,
    {register name: result})."""
    names = [t["register"] for t in tasks if "register" in t]
    results = os.path.join(workdir, "results.json")
    saved = ", ".join("%s: (%s | default({'skipped_by_play': true}))" % (json.dumps(n), n) for n in names)
    play = [{
        "name": "gpuready.nvidia test play",
        "hosts": "localhost",
        "gather_facts": False,
        "tasks": tasks + [{
            "name": "Save what the tasks registered",
            "ansible.builtin.copy": {"dest": results, "content": "{{ {%s} | to_json }}" % saved, "mode": "0600"},
        }],
    }]
    playbook = os.path.join(workdir, "play.yml")
    with open(playbook, "w") as handle:
        json.dump(play, handle, indent=1)  # JSON is YAML
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=os.path.join(workdir, ".ansible-local"),
               ANSIBLE_REMOTE_TEMP=os.path.join(workdir, ".ansible-remote"), ANSIBLE_RETRY_FILES_ENABLED="0")
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
           "-e", "ansible_python_interpreter=%s" % python, "--diff", playbook]
    proc = subprocess.run(cmd, env=env, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=timeout, check=False)
    if not os.path.exists(results):
        raise AssertionError("ansible-playbook failed before saving results (rc %d):\n%s"
                             % (proc.returncode, proc.stdout[-6000:]))
    with open(results) as handle:
        return proc, json.load(handle)
