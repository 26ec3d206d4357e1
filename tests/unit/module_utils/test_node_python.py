# -*- coding: utf-8 -*-
"""node_python's decisions without a node: fed what the role's commands print. The apt-cache policy
outputs in tests/fixtures/node_python are real (Debian 12, LC_ALL=C, with its apt lists and with empty
ones as on the lab's minimal images), the probe outputs are files/probe.py run by Debian 12's
/usr/bin/python3 and by a venv the role filled from the wheel folder (its path rewritten to the default
/opt/gpuready/venv); the lab nodes' Python differs from that system Python only in lacking ensurepip and
python3-apt."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy
import json
import os
import subprocess
import sys

import pytest
import yaml

from ansible.errors import AnsibleFilterError
from ansible_collections.gpuready.nvidia.plugins.filter.node_python import DECISIONS, FilterModule
from ansible_collections.gpuready.nvidia.plugins.module_utils import node_python

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
FIXTURES = os.path.join(ROOT, 'tests', 'fixtures', 'node_python')
ROLE = os.path.join(ROOT, 'roles', 'node_python')
VENV = '/opt/gpuready/venv'
with open(os.path.join(ROLE, 'defaults', 'main.yml')) as _handle:
    DEFAULTS = yaml.safe_load(_handle)
REQUIREMENTS = DEFAULTS['node_python_requirements']
VENV_PACKAGES = DEFAULTS['node_python_venv_packages']


def _text(name):
    with open(os.path.join(FIXTURES, name)) as handle:
        return handle.read()


def _probe(name, **changes):
    probe = json.loads(_text(name))
    probe.update(changes)
    return probe


def _system(**changes):
    """Debian 12's /usr/bin/python3 without grpc and pynvml (no venv at /opt/gpuready/venv)."""
    return _probe('probe-system-bookworm.json', **changes)


def _lab_system(**changes):
    """The lab's minimal Debian 12 image: no ensurepip, no python3-apt."""
    return _system(ensurepip=False, apt=False, **changes)


def _venv(**changes):
    """The venv's Python after the role filled it from the wheel folder: grpcio and nvidia-ml-py in it."""
    return _probe('probe-venv-bookworm.json', **changes)


def _ran(probe, rc=0):
    """What `register:` keeps of a probe command that ran."""
    return {'changed': False, 'rc': rc, 'stdout': json.dumps(probe, sort_keys=True), 'stderr': ''}


SKIPPED = {'changed': False, 'skipped': True, 'skip_reason': 'Conditional result was False'}


def _with_venv_dir(system, python=True, pyvenv_cfg=True):
    return dict(system, venv_dir={'python': python, 'pyvenv_cfg': pyvenv_cfg})


def _set(probe, name, **found):
    probe = copy.deepcopy(probe)
    probe['requirements'][name].update(found)
    return probe


def _distro_grpcio(probe):
    """grpcio 1.51.1 from python3-grpcio, as apt installs it on Debian 12."""
    return _set(probe, 'grpcio', found=True, ok=True, error=None, version='1.51.1',
                location='/usr/lib/python3/dist-packages/grpc')


# --- the system Python's preflight -------------------------------------------------------------

def test_system_python_that_serves():
    assert node_python.system_python_problem(_ran(_system())) is None


def test_system_python_too_old():
    assert node_python.system_python_problem(_ran(_system(version='3.6.8'))) == 'is Python 3.6.8'
    assert node_python.system_python_problem(_ran(_system(version='3.8.19'))) == 'is Python 3.8.19'
    assert node_python.system_python_problem(_ran(_system(version='3.10.0'))) is None


def test_system_python_that_does_not_run():
    assert node_python.system_python_problem({'rc': 1, 'stdout': '', 'stderr': ''}) == 'does not run (rc 1)'
    assert (node_python.system_python_problem({'rc': 127, 'stdout': '', 'stderr': '  /bin/sh: python3: not found\n'})
            == 'does not run (rc 127: /bin/sh: python3: not found)')
    # the command module's own failure (no such file) may come without rc
    assert node_python.system_python_problem({'failed': True, 'msg': 'No such file'}) == 'does not run (rc ?)'


def test_system_python_that_prints_no_json():
    with pytest.raises(node_python.NodePythonError, match='did not print JSON'):
        node_python.system_python_problem({'rc': 0, 'stdout': 'Python 2.7.18', 'stderr': ''})


# --- the first look: the venv's state and whether there is work ------------------------------------

def test_fresh_node_without_venv():
    found = node_python.first_look(_ran(_system()), SKIPPED)
    assert found['venv_state'] == 'absent' and found['venv'] is None
    # probe.py sorts the requirements by name
    assert found['missing'] == ['grpcio', 'nvidia-ml-py'] == found['venv_lacks']
    assert found['work'] is True and found['distro_changed'] is False


def test_healthy_venv_that_imports_everything_means_no_work():
    found = node_python.first_look(_ran(_with_venv_dir(_system())), _ran(_venv()))
    assert found['venv_state'] == 'healthy' and found['venv'] == _venv()
    assert found['missing'] == ['grpcio', 'nvidia-ml-py'] and found['venv_lacks'] == []
    assert found['work'] is False


def test_healthy_venv_that_lacks_something_means_work():
    venv = _set(_venv(), 'nvidia-ml-py', ok=False, version='12.535.161')
    found = node_python.first_look(_ran(_with_venv_dir(_system())), _ran(venv))
    assert found['venv_state'] == 'healthy' and found['venv_lacks'] == ['nvidia-ml-py'] and found['work'] is True


def test_system_python_that_imports_everything_means_no_work():
    system = _distro_grpcio(_set(_system(), 'nvidia-ml-py', found=True, ok=True, version='12.570.86',
                                 location='/usr/local/lib/python3.11/dist-packages/pynvml.py'))
    found = node_python.first_look(_ran(system), SKIPPED)
    assert found['missing'] == [] and found['work'] is False


@pytest.mark.parametrize('venv_probe, why', [
    (_ran(_venv(), rc=1), 'its Python no longer starts'),
    (_ran(_venv(venv_system_site_packages=False)), 'it does not see the system packages'),
    (_ran(_venv(version='3.9.2')), 'another minor version (the distro moved on)'),
    (_ran(_venv(in_venv=False, venv_system_site_packages=None)), 'not a venv'),
])
def test_broken_venv(venv_probe, why):
    found = node_python.first_look(_ran(_with_venv_dir(_system())), venv_probe)
    assert found['venv_state'] == 'broken', why
    assert found['venv'] is None and found['venv_lacks'] == found['missing'] and found['work'] is True


def test_same_minor_version_other_patch_release_is_healthy():
    found = node_python.first_look(_ran(_with_venv_dir(_system())), _ran(_venv(version='3.11.9')))
    assert found['venv_state'] == 'healthy'


def test_bin_python_without_pyvenv_cfg_is_foreign():
    found = node_python.first_look(_ran(_with_venv_dir(_system(), pyvenv_cfg=False)), _ran(_venv()))
    assert found['venv_state'] == 'foreign' and found['venv'] is None


def test_real_probe_output_reads():
    """files/probe.py run now, by this Python, with the default requirements and a folder that is no venv."""
    with open(os.path.join(ROLE, 'files', 'probe.py')) as handle:
        code = handle.read()
    proc = subprocess.run([sys.executable, '-c', code, json.dumps(REQUIREMENTS), '/nonexistent/venv'],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, check=False)
    registered = {'rc': proc.returncode, 'stdout': proc.stdout, 'stderr': proc.stderr}
    assert node_python.system_python_problem(registered) is None
    found = node_python.first_look(registered, SKIPPED)
    assert found['venv_state'] == 'absent'
    assert set(found['missing']) <= {'grpcio', 'nvidia-ml-py'}


# --- the package managers' candidates -------------------------------------------------------------

@pytest.mark.parametrize('version, upstream', [
    ('1.51.1-3+b1', '1.51.1'),              # Debian 12 python3-grpcio: revision and binNMU dropped
    ('1:1.24.2-1+deb12u1', '1.24.2'),       # with an epoch
    ('3.11.2-1+b1', '3.11.2'),
    ('0.1.49', '0.1.49'),                   # a native package, no revision
    ('2.0~rc1-1', '2.0'),
    ('1.48.4', '1.48.4'),                   # dnf's %{version}
    ('1.60.1+ds', '1.60.1'),
])
def test_upstream_version(version, upstream):
    assert node_python.upstream_version(version) == upstream


def test_apt_candidates_with_the_apt_lists():
    assert node_python.apt_candidates(_text('apt-policy-bookworm.txt')) == {
        'python3-grpcio': {'version': '1.51.1', 'spec': 'python3-grpcio=1.51.1-3+b1'},
        'python3-venv': {'version': '3.11.2', 'spec': 'python3-venv=3.11.2-1+b1'},
    }


def test_apt_candidates_with_empty_apt_lists():
    """apt prints nothing for a package it does not know (python3-grpcio here); an installed one still has
    its installed version as candidate."""
    assert node_python.apt_candidates(_text('apt-policy-empty-lists.txt')) == {
        'python3-venv': {'version': '3.11.2', 'spec': 'python3-venv=3.11.2-1+b1'},
    }


def test_apt_candidates_without_candidate_with_epoch_native():
    assert node_python.apt_candidates(_text('apt-policy-no-candidate-epoch-native.txt')) == {
        'python3-numpy': {'version': '1.24.2', 'spec': 'python3-numpy=1:1.24.2-1+deb12u1'},
        'python3-debian': {'version': '0.1.49', 'spec': 'python3-debian=0.1.49'},
    }


@pytest.mark.parametrize('stdout', ['', None])
def test_apt_candidates_of_nothing(stdout):
    assert node_python.apt_candidates(stdout) == {}


def test_dnf_candidates():
    # dnf4 ends each line itself and prints the '\n' of the format too: empty lines between
    stdout = 'python3-grpcio 1.48.4 2.el9\n\npython3-pip 21.2.3 8.el9\n'
    assert node_python.dnf_candidates(stdout) == {
        'python3-grpcio': {'version': '1.48.4', 'spec': 'python3-grpcio-1.48.4-2.el9'},
        'python3-pip': {'version': '21.2.3', 'spec': 'python3-pip-21.2.3-8.el9'},
    }
    assert node_python.dnf_candidates('') == {} == node_python.dnf_candidates(None)


def test_later_candidate_of_the_same_package_wins():
    stdout = 'python3-grpcio 1.46.7 1.el9\npython3-grpcio 1.48.4 2.el9\n'
    assert node_python.dnf_candidates(stdout)['python3-grpcio']['version'] == '1.48.4'


# --- what to ask the distro about ------------------------------------------------------------------

def _query(found, family='Debian', offline=False, update_cache=True, venv_packages=None):
    return node_python.distro_query(found, REQUIREMENTS, family, VENV_PACKAGES if venv_packages is None else venv_packages,
                                    offline, update_cache)


def test_query_online_with_ensurepip():
    found = node_python.first_look(_ran(_system()), SKIPPED)
    assert _query(found) == {'packages': ['python3-grpcio'], 'argv': ['apt-cache', 'policy', 'python3-grpcio']}


def test_query_online_without_ensurepip_asks_for_python3_venv():
    found = node_python.first_look(_ran(_lab_system()), SKIPPED)
    assert _query(found)['argv'] == ['apt-cache', 'policy', 'python3-grpcio', 'python3-venv']


def test_query_offline_needs_no_ensurepip():
    found = node_python.first_look(_ran(_lab_system()), SKIPPED)
    assert _query(found, offline=True)['packages'] == ['python3-grpcio']


def test_query_healthy_venv_with_pip_needs_no_ensurepip():
    venv = _set(_venv(), 'grpcio', ok=False)
    found = node_python.first_look(_ran(_with_venv_dir(_lab_system())), _ran(venv))
    assert _query(found)['packages'] == ['python3-grpcio']
    found = node_python.first_look(_ran(_with_venv_dir(_lab_system())), _ran(dict(venv, pip=False)))
    assert _query(found)['packages'] == ['python3-grpcio', 'python3-venv']


def test_query_only_for_missing_requirements_with_a_distro_package():
    found = node_python.first_look(_ran(_distro_grpcio(_system())), SKIPPED)
    assert found['missing'] == ['nvidia-ml-py']
    assert _query(found)['packages'] == []
    requirements = [dict(REQUIREMENTS[0], distro_packages=None), dict(REQUIREMENTS[1], distro_packages={'RedHat': 'python3-grpcio'})]
    found = node_python.first_look(_ran(_system()), SKIPPED)
    assert node_python.distro_query(found, requirements, 'Debian', VENV_PACKAGES, False, True)['packages'] == []


def test_query_dnf():
    found = node_python.first_look(_ran(_system()), SKIPPED)
    queryformat = '%{name} %{version} %{release}\\n'  # a backslash and an n: dnf makes them a newline
    assert _query(found, family='RedHat') == {'packages': ['python3-grpcio'], 'argv': [
        'dnf', '--quiet', 'repoquery', '--latest-limit=1', '--queryformat', queryformat, 'python3-grpcio']}
    assert _query(found, family='RedHat', update_cache=False)['argv'][:3] == ['dnf', '--quiet', '--cacheonly']


# --- what to install from the distro ---------------------------------------------------------------

def _plan(found, stdout, family='Debian', offline=False, requirements=None):
    registered = {'rc': 0, 'stdout': stdout}
    return node_python.distro_plan(found, REQUIREMENTS if requirements is None else requirements, family, VENV_PACKAGES,
                                   offline, apt_policy=registered if family == 'Debian' else SKIPPED,
                                   dnf_query=registered if family == 'RedHat' else SKIPPED)


def test_plan_debian_12_online_without_ensurepip():
    """The README's online run: python3-grpcio 1.51.1 and python3-venv from Debian, nvidia-ml-py into the venv."""
    found = node_python.first_look(_ran(_lab_system()), SKIPPED)
    decided = _plan(found, _text('apt-policy-bookworm.txt'))
    assert decided['plan'] == [{'name': 'grpcio', 'package': 'python3-grpcio', 'version': '1.51.1',
                                'spec': 'python3-grpcio=1.51.1-3+b1'}]
    assert decided['install'] == ['python3-grpcio=1.51.1-3+b1', 'python3-venv']


def test_plan_with_ensurepip_installs_no_python3_venv():
    found = node_python.first_look(_ran(_system()), SKIPPED)
    assert _plan(found, _text('apt-policy-bookworm.txt'))['install'] == ['python3-grpcio=1.51.1-3+b1']


def test_plan_offline_installs_no_python3_venv():
    found = node_python.first_look(_ran(_lab_system()), SKIPPED)
    assert _plan(found, _text('apt-policy-bookworm.txt'), offline=True)['install'] == ['python3-grpcio=1.51.1-3+b1']


def test_plan_when_everything_comes_from_the_distro_needs_no_pip():
    found = node_python.first_look(_ran(_set(_lab_system(), 'nvidia-ml-py', ok=True, found=True, version='13.580.65',
                                             location='/usr/lib/python3/dist-packages/pynvml.py')), SKIPPED)
    assert _plan(found, _text('apt-policy-bookworm.txt'))['install'] == ['python3-grpcio=1.51.1-3+b1']


def test_plan_with_empty_apt_lists():
    """The lab's nodes with node_python_update_cache false: apt knows neither package, nothing to install."""
    found = node_python.first_look(_ran(_lab_system()), SKIPPED)
    assert _plan(found, '') == {'candidates': {}, 'plan': [], 'install': []}


def test_plan_without_python3_venv_candidate_installs_grpcio_only():
    found = node_python.first_look(_ran(_lab_system()), SKIPPED)
    stdout = _text('apt-policy-bookworm.txt').split('python3-venv:')[0]
    assert _plan(found, stdout)['install'] == ['python3-grpcio=1.51.1-3+b1']


@pytest.mark.parametrize('min_version, planned', [('1.51', True), ('1.51.1', True), ('1.52', False), (1.5, True),
                                                  (None, True), ('1.51.2', False)])
def test_plan_takes_a_candidate_only_when_recent_enough(min_version, planned):
    requirements = [dict(REQUIREMENTS[1], min_version=min_version)]
    found = node_python.first_look(_ran(_system()), SKIPPED)
    decided = _plan(found, _text('apt-policy-bookworm.txt'), requirements=requirements)
    assert [entry['name'] for entry in decided['plan']] == (['grpcio'] if planned else [])


def test_plan_dnf():
    found = node_python.first_look(_ran(_system()), SKIPPED)
    decided = _plan(found, 'python3-grpcio 1.48.4 2.el9\n', family='RedHat')
    assert decided['plan'] == []  # 1.48.4 < 1.51
    decided = _plan(found, 'python3-grpcio 1.60.1 1.fc40\n', family='RedHat')
    assert decided['install'] == ['python3-grpcio-1.60.1-1.fc40']


def test_plan_with_a_version_that_does_not_compare():
    found = node_python.first_look(_ran(_system()), SKIPPED)
    stdout = 'python3-grpcio:\n  Installed: (none)\n  Candidate: 1.51rc1-1\n  Version table:\n'
    requirements = [dict(REQUIREMENTS[1], min_version='1.51.0')]
    with pytest.raises(node_python.NodePythonError, match='Version comparison failed'):
        _plan(found, stdout, requirements=requirements)


# --- after the distro step --------------------------------------------------------------------------

def test_look_again_after_apt_installed():
    found = node_python.first_look(_ran(_lab_system()), SKIPPED)
    again = node_python.look_again(found, system_probe=_ran(_distro_grpcio(_lab_system())), planned=['grpcio'])
    assert again['distro_changed'] is True and again['missing'] == ['nvidia-ml-py'] == again['venv_lacks']
    assert again['system']['requirements']['grpcio']['ok'] is True
    assert again['work'] is True and found['missing'] == ['grpcio', 'nvidia-ml-py']  # found itself is kept


def test_look_again_when_nothing_was_installed():
    found = node_python.first_look(_ran(_lab_system()), SKIPPED)
    again = node_python.look_again(found, system_probe=SKIPPED, planned=[])
    assert again['distro_changed'] is False and again['missing'] == found['missing']
    assert again['system'] == found['system']


def test_look_again_in_check_mode_counts_the_plan_as_installed():
    found = node_python.first_look(_ran(_lab_system()), SKIPPED)
    again = node_python.look_again(found, system_probe=SKIPPED, planned=['grpcio'], check_mode=True)
    assert again['missing'] == ['nvidia-ml-py'] and again['distro_changed'] is False


def test_look_again_at_the_new_venv():
    found = node_python.first_look(_ran(_lab_system()), SKIPPED)
    new_venv = _set(_set(_venv(pip=False), 'grpcio', ok=False, found=False), 'nvidia-ml-py', ok=False, found=False)
    again = node_python.look_again(found, venv_probe=_ran(new_venv))
    assert again['venv'] == new_venv and again['venv_lacks'] == ['grpcio', 'nvidia-ml-py']
    assert node_python.look_again(again, venv_probe=SKIPPED) == again


# --- pip ---------------------------------------------------------------------------------------------

def test_pip_online_from_pypi_with_ensurepip():
    found = node_python.first_look(_ran(_system()), SKIPPED)
    assert node_python.pip_plan(found, REQUIREMENTS, False, None, '/opt/gpuready/wheels') == {
        'specs': ['nvidia-ml-py>=12.550.52', 'grpcio>=1.51'], 'index_args': [],
        'source': "from pip's configured index", 'venv_has_pip': False, 'can_install': True}


def test_pip_online_from_a_mirror_into_a_venv_with_pip():
    found = node_python.look_again(node_python.first_look(_ran(_lab_system()), SKIPPED),
                                   venv_probe=_ran(_set(_venv(), 'nvidia-ml-py', ok=False)))
    decided = node_python.pip_plan(found, REQUIREMENTS, False, 'https://pypi.mirror.example/simple', '/x')
    assert decided['specs'] == ['nvidia-ml-py>=12.550.52']
    assert decided['index_args'] == ['--index-url', 'https://pypi.mirror.example/simple']
    assert decided['source'] == 'from https://pypi.mirror.example/simple'
    assert decided['venv_has_pip'] is True and decided['can_install'] is True


def test_pip_offline_needs_no_pip_of_its_own():
    found = node_python.first_look(_ran(_lab_system()), SKIPPED)
    decided = node_python.pip_plan(found, REQUIREMENTS, True, None, '/opt/gpuready/wheels')
    assert decided['source'] == 'from /opt/gpuready/wheels' and decided['can_install'] is True
    assert decided['venv_has_pip'] is False


def test_pip_online_without_any_pip():
    found = node_python.first_look(_ran(_lab_system()), SKIPPED)
    assert node_python.pip_plan(found, REQUIREMENTS, False, None, '/x')['can_install'] is False


def test_pip_spec_without_min_version():
    requirements = [dict(REQUIREMENTS[0], min_version=None), dict(REQUIREMENTS[1], min_version=1.5)]
    found = node_python.first_look(_ran(_system()), SKIPPED)
    assert node_python.pip_plan(found, requirements, True, None, '/x')['specs'] == ['nvidia-ml-py', 'grpcio>=1.5']


# --- the result ----------------------------------------------------------------------------------------

def _result(found, check_mode=False):
    return node_python.result(found, REQUIREMENTS, VENV, '/usr/bin/python3', VENV + '/bin/python', check_mode)


def test_result_after_filling_the_venv():
    """The Molecule node_python scenario: both imports from the wheel folder into the venv."""
    found = node_python.look_again(node_python.first_look(_ran(_lab_system()), SKIPPED), venv_probe=_ran(_venv()))
    assert _result(found) == {
        'interpreter': '/opt/gpuready/venv/bin/python',
        'requirements': {
            'nvidia-ml-py': {'module': 'pynvml', 'min_version': '12.550.52', 'version': '13.615.71', 'source': 'venv',
                             'location': '/opt/gpuready/venv/lib/python3.11/site-packages/pynvml.py'},
            'grpcio': {'module': 'grpc', 'min_version': '1.51', 'version': '1.85.3', 'source': 'venv',
                       'location': '/opt/gpuready/venv/lib/python3.11/site-packages/grpc'},
        },
        'pending': [],
        'unmet': [],
    }


def test_result_distro_and_venv():
    system = _distro_grpcio(_lab_system())
    venv = _distro_grpcio(_venv())
    found = node_python.look_again(node_python.first_look(_ran(_lab_system()), SKIPPED),
                                   system_probe=_ran(system), planned=['grpcio'])
    found = node_python.look_again(found, venv_probe=_ran(venv))
    described = _result(found)['requirements']
    assert described['grpcio']['source'] == 'distro' and described['nvidia-ml-py']['source'] == 'venv'


@pytest.mark.parametrize('location, source', [
    ('/usr/lib/python3/dist-packages/grpc', 'distro'),
    ('/usr/lib64/python3.9/site-packages/grpc', 'distro'),
    ('/usr/local/lib/python3.11/dist-packages/grpc', 'system'),
    ('/opt/gpuready/venv', 'venv'),
    ('/opt/gpuready/venv2/lib/grpc', 'system'),
    (None, 'system'),
])
def test_result_source(location, source):
    system = _set(_system(), 'grpcio', ok=True, found=True, version='1.60.0', location=location)
    system = _set(system, 'nvidia-ml-py', ok=True, found=True, version='13.0.0', location='/usr/lib/python3/dist-packages/pynvml.py')
    decided = _result(node_python.first_look(_ran(system), SKIPPED))
    assert decided['interpreter'] == '/usr/bin/python3'
    assert decided['requirements']['grpcio']['source'] == source


def test_result_check_mode_without_venv_is_pending():
    found = node_python.first_look(_ran(_lab_system()), SKIPPED)
    decided = _result(found, check_mode=True)
    assert decided['interpreter'] == '/usr/bin/python3' and decided['pending'] == ['grpcio', 'nvidia-ml-py']
    assert [r['source'] for r in decided['requirements'].values()] == ['missing', 'missing']
    assert decided['requirements']['grpcio']['version'] is None and decided['requirements']['grpcio']['location'] is None


def test_result_check_mode_with_healthy_venv():
    found = node_python.first_look(_ran(_with_venv_dir(_lab_system())), _ran(_venv()))
    decided = _result(found, check_mode=True)
    assert decided['interpreter'] == VENV + '/bin/python' and decided['pending'] == []
    assert decided['unmet'] == []


def test_result_what_still_fails():
    venv = _set(_venv(), 'nvidia-ml-py', ok=False, version='12.535.161')
    found = node_python.look_again(node_python.first_look(_ran(_lab_system()), SKIPPED), venv_probe=_ran(venv))
    decided = _result(found)
    assert decided['unmet'] == [{'name': 'nvidia-ml-py', 'module': 'pynvml', 'found': venv['requirements']['nvidia-ml-py']}]
    assert decided['requirements']['nvidia-ml-py']['source'] == 'missing'
    assert decided['interpreter'] == VENV + '/bin/python' and decided['pending'] == []


# --- the filters ------------------------------------------------------------------------------------------

def test_every_filter_is_documented():
    filters = FilterModule().filters()
    assert sorted(filters) == sorted(DECISIONS)
    folder = os.path.join(ROOT, 'plugins', 'filter')
    for name in filters:
        with open(os.path.join(folder, name + '.yml')) as handle:
            assert yaml.safe_load(handle)['DOCUMENTATION']['name'] == name


def test_filter_reports_the_decision_error():
    found = FilterModule().filters()['node_python_found']
    assert found(_ran(_system()), SKIPPED)['venv_state'] == 'absent'
    with pytest.raises(AnsibleFilterError, match='^node_python_found: the system Python probe did not print JSON'):
        found({'rc': 0, 'stdout': 'Traceback'}, SKIPPED)
