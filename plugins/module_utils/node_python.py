# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The decisions of the node_python role, on the controller: the role's tasks only run commands on the
node and hand what those printed to the filters in plugins/filter/node_python.py, which call these.

Plain Python over what the role registers: ``probe`` is the JSON that roles/node_python/files/probe.py
prints (the interpreter's version, ``ensurepip``/``pip``/``apt``, ``venv_dir`` and per requirement
``found``/``version``/``location``/``ok``), the package managers' candidates come from ``apt-cache policy``
and ``dnf repoquery`` as they print them under ``LC_ALL=C``. A ``found`` dictionary carries what is known
about the node from one step of the role to the next:

* ``system``: the system Python's probe; ``venv``: the venv's probe where the venv is healthy, else None;
* ``venv_state``: ``absent``, ``foreign`` (a bin/python without pyvenv.cfg), ``healthy`` or ``broken``;
* ``missing``: the requirements the system Python does not import in a recent enough release;
* ``venv_lacks``: those the venv does not (what the system Python lacks while there is no healthy venv);
* ``work``: whether anything is to be done, decided on the first look;
* ``distro_changed``: whether the distro step installed something.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import re

from ansible.module_utils.compat.version import LooseVersion

# `apt-cache policy PKG...`: a block per package apt knows (none for one it does not), e.g.
#   python3-grpcio:
#     Installed: (none)
#     Candidate: 1.51.1-3+b1
_APT_POLICY = re.compile(r'(?m)^(\S+):\s*\n\s+Installed: .*\n\s+Candidate: (\S+)')
# `dnf repoquery --queryformat '%{name} %{version} %{release}\n'`: a line per package
_DNF_QUERY = re.compile(r'(?m)^(\S+) (\S+) (\S+)$')
# dnf prints '\n' in --queryformat as a newline itself: the argument is a backslash and an n.
DNF_QUERYFORMAT = '%{name} %{version} %{release}\\n'
_NO_CANDIDATE = '(none)'
# A requirement found under these comes from a distro package
_DISTRO_LOCATION = re.compile(r'^/usr/lib(64)?/')


class NodePythonError(Exception):
    """What the role's tasks handed over cannot be read (not a probe's JSON, a version that does not compare)."""


def _probe_json(text, what):
    try:
        return json.loads(text)
    except (TypeError, ValueError) as exc:
        raise NodePythonError('%s did not print JSON (%s): %r' % (what, exc, text))


def _ran(registered):
    """Whether a registered command result is of a task that ran (not skipped, not absent)."""
    return bool(registered) and not registered.get('skipped', False)


def read_probe(registered, what='the probe'):
    """The probe's report from a registered command result; None where the command was skipped or
    did not exit 0 (a venv's Python that no longer starts)."""
    if not _ran(registered) or registered.get('rc', 1) != 0:
        return None
    return _probe_json(registered.get('stdout'), what)


def unmet(probe):
    """The names of the requirements the probed Python does not import in a recent enough release, in the
    probe's order (probe.py sorts them by name)."""
    return [name for name, found in probe['requirements'].items() if not found['ok']]


def system_python_problem(registered):
    """Why the system Python cannot serve, completing '<system python> ...': 'is Python 3.6.8', 'does not
    run (rc 127: ...)'; None when it runs and is 3.9 or newer."""
    rc = registered.get('rc', '?')
    if rc != 0:
        stderr = registered.get('stderr') or ''
        return 'does not run (rc %s%s)' % (rc, (': ' + stderr.strip()) if stderr else '')
    version = _probe_json(registered.get('stdout'), 'the system Python probe')['version']
    if _at_least(version, '3.9'):
        return None
    return 'is Python %s' % version


def _at_least(version, minimum):
    """version >= minimum as Ansible's `version` test compares them by default (loose)."""
    if not version:
        raise NodePythonError('Input version value cannot be empty')
    try:
        return LooseVersion(str(version)) >= LooseVersion(str(minimum))
    except Exception as exc:  # pylint: disable=broad-except  # LooseVersion raises TypeError on 1.0rc1 vs 1.0.0
        raise NodePythonError('Version comparison failed: %s' % exc)


def venv_state(system, venv):
    """absent (no bin/python), foreign (bin/python without pyvenv.cfg: not ours to touch), healthy (starts,
    is a venv, sees the system packages, same minor version as the system Python) or broken (a venv that
    is not healthy, e.g. after the distro moved to a newer Python: rebuilt)."""
    folder = system['venv_dir']
    if not folder['python']:
        return 'absent'
    if not folder['pyvenv_cfg']:
        return 'foreign'
    if (venv and venv['in_venv'] and venv['venv_system_site_packages']
            and venv['version'].split('.')[:2] == system['version'].split('.')[:2]):
        return 'healthy'
    return 'broken'


def _with_venv_lacks(found):
    found['venv_lacks'] = unmet(found['venv']) if found['venv'] is not None else list(found['missing'])
    return found


def first_look(system_probe, venv_probe):
    """What the first probes say (system_probe: the system Python's, with VENV_DIR; venv_probe: the venv's
    Python's, skipped where there is no bin/python)."""
    system = _probe_json(system_probe.get('stdout'), 'the system Python probe')
    probed_venv = read_probe(venv_probe, "the venv's probe")
    state = venv_state(system, probed_venv)
    venv = probed_venv if state == 'healthy' else None
    missing = unmet(system)
    # Nothing to do when the system Python, or else the venv already there, imports everything.
    work = len(missing) > 0 and not (venv is not None and unmet(venv) == [])
    return _with_venv_lacks({'system': system, 'venv': venv, 'venv_state': state, 'missing': missing,
                             'work': work, 'distro_changed': False})


def look_again(found, system_probe=None, planned=None, check_mode=False, venv_probe=None):
    """found, updated by a later probe. After the distro step: system_probe (skipped where nothing was
    installed) and planned, the requirement names the distro step installs; in check mode nothing was
    installed, so those count as installed. After pip: venv_probe (skipped where nothing ran)."""
    found = dict(found)
    if system_probe is not None:
        found['distro_changed'] = _ran(system_probe)
        if found['distro_changed']:
            found['system'] = _probe_json(system_probe.get('stdout'), 'the system Python probe')
        if check_mode:
            found['missing'] = [name for name in found['missing'] if name not in (planned or [])]
        else:
            found['missing'] = unmet(found['system'])
    if _ran(venv_probe):
        found['venv'] = _probe_json(venv_probe.get('stdout'), "the venv's probe")
    return _with_venv_lacks(found)


def _distro_package(requirement, family):
    return (requirement.get('distro_packages') or {}).get(family, '')


def _ensurepip_packages(venv_packages, family):
    return venv_packages.get(family) or []


def _venv_has_pip(found):
    return bool(found['venv'] is not None and found['venv']['pip'])


def distro_query(found, requirements, family, venv_packages, offline, update_cache):
    """The distro packages to ask about, and the command that asks (apt-cache policy on Debian, dnf
    repoquery on RedHat): the distro package of each missing requirement and, online where the venv will
    need a pip and the system Python has no ensurepip, what provides it (Debian ships it apart:
    python3-venv)."""
    packages = [package for package in (_distro_package(requirement, family) for requirement in requirements
                                        if requirement['name'] in found['missing']) if package]
    pip_from_distro = (not offline and not found['system']['ensurepip']
                       and not (found['venv_state'] == 'healthy' and found['venv']['pip']))
    if pip_from_distro:
        packages += _ensurepip_packages(venv_packages, family)
    if family == 'Debian':
        argv = ['apt-cache', 'policy'] + packages
    else:
        argv = (['dnf', '--quiet'] + ([] if update_cache else ['--cacheonly'])
                + ['repoquery', '--latest-limit=1', '--queryformat', DNF_QUERYFORMAT] + packages)
    return {'packages': packages, 'argv': argv}


def upstream_version(version):
    """The upstream part of a package version, what min_version is compared with: apt's epoch, the Debian
    revision and anything after + or ~ dropped ('1:1.24.2-1+deb12u1' -> '1.24.2')."""
    version = re.sub(r'^[0-9]+:', '', version)
    version = re.sub(r'-[^-]*$', '', version)
    return re.sub(r'[+~].*$', '', version)


def apt_candidates(text):
    """{package: {version: upstream version, spec: package=full version}} from `apt-cache policy` output;
    packages without a candidate ((none)) are left out. spec makes apt install exactly that version."""
    candidates = {}
    for package, version in _APT_POLICY.findall(text or ''):
        if version != _NO_CANDIDATE:
            candidates[package] = {'version': upstream_version(version), 'spec': '%s=%s' % (package, version)}
    return candidates


def dnf_candidates(text):
    """{package: {version: upstream version, spec: name-version-release}} from `dnf repoquery` output."""
    candidates = {}
    for package, version, release in _DNF_QUERY.findall(text or ''):
        if version != _NO_CANDIDATE:
            candidates[package] = {'version': upstream_version(version),
                                   'spec': '%s-%s-%s' % (package, version, release)}
    return candidates


def distro_plan(found, requirements, family, venv_packages, offline, apt_policy=None, dnf_query=None):
    """What to install from the distro, from the registered apt-cache policy (Debian) or dnf repoquery
    (RedHat) result: {candidates, plan: [{name, package, version, spec}] for each missing requirement whose
    distro package has a recent enough candidate, install: the specs to install}. The ensurepip packages
    join them where the venv will be needed (not everything comes from the distro), can get no pip
    otherwise, and the distro offers all of them."""
    if family == 'Debian':
        candidates = apt_candidates((apt_policy or {}).get('stdout', ''))
    else:
        candidates = dnf_candidates((dnf_query or {}).get('stdout', ''))
    plan = []
    for requirement in requirements:
        if requirement['name'] not in found['missing']:
            continue
        package = _distro_package(requirement, family)
        if package not in candidates:
            continue
        minimum = requirement.get('min_version')
        if minimum is not None and not _at_least(candidates[package]['version'], str(minimum)):
            continue
        plan.append({'name': requirement['name'], 'package': package,
                     'version': candidates[package]['version'], 'spec': candidates[package]['spec']})
    planned = [entry['name'] for entry in plan]
    ensurepip_packages = _ensurepip_packages(venv_packages, family)
    ensurepip_needed = bool(
        [name for name in found['missing'] if name not in planned]
        and not offline and not found['system']['ensurepip']
        and not (found['venv_state'] == 'healthy' and found['venv']['pip'])
        and ensurepip_packages
        and all(package in candidates for package in ensurepip_packages))
    install = [entry['spec'] for entry in plan] + (ensurepip_packages if ensurepip_needed else [])
    return {'candidates': candidates, 'plan': plan, 'install': install}


def pip_plan(found, requirements, offline, index_url, wheels_remote_dir):
    """How pip fills the venv with what it lacks: {specs: a requirement specifier each (name>=min_version),
    index_args: --index-url online where one is set, source: where from (for the check mode report),
    venv_has_pip, can_install: a pip to install with (offline: the wheel folder's; else the venv's, or the
    system Python's ensurepip)}."""
    specs = []
    for requirement in requirements:
        if requirement['name'] in found['venv_lacks']:
            minimum = requirement.get('min_version')
            specs.append(requirement['name'] + (('>=%s' % minimum) if minimum is not None else ''))
    if offline:
        source = 'from %s' % wheels_remote_dir
    else:
        source = 'from %s' % (index_url or "pip's configured index")
    venv_has_pip = _venv_has_pip(found)
    return {'specs': specs, 'index_args': ['--index-url', index_url] if index_url else [], 'source': source,
            'venv_has_pip': venv_has_pip,
            'can_install': bool(offline or venv_has_pip or found['system']['ensurepip'])}


def _source(found, venv):
    if not found['ok']:
        return 'missing'
    location = str(found['location'])
    if (location + '/').startswith(str(venv) + '/'):
        return 'venv'
    if _DISTRO_LOCATION.match(location):
        return 'distro'
    return 'system'


def result(found, requirements, venv, system_python, venv_python, check_mode):
    """What the role hands to later roles: {interpreter, requirements: per name {module, min_version,
    version, location, source (missing, venv, distro: under /usr/lib*/, system: elsewhere)}, pending,
    unmet: [{name, module, found}] for the failure message}. The interpreter is the system Python when it
    imports everything, else the venv's; what it imports comes from the last look at it. In check mode on
    a node without the venv yet, the system Python's (what it misses is pending: not installed yet)."""
    use_venv = len(found['missing']) > 0 and found['venv'] is not None
    probe = found['venv'] if use_venv else found['system']
    described = {}
    unmet_requirements = []
    for requirement in requirements:
        requirement_found = probe['requirements'][requirement['name']]
        described[requirement['name']] = {
            'module': requirement['module'],
            'min_version': requirement.get('min_version'),
            'version': requirement_found['version'] if requirement_found['ok'] else None,
            'location': requirement_found['location'] if requirement_found['ok'] else None,
            'source': _source(requirement_found, venv),
        }
        if not requirement_found['ok']:
            unmet_requirements.append({'name': requirement['name'], 'module': requirement['module'],
                                       'found': requirement_found})
    check_mode_without_venv = bool(check_mode and found['missing'] and found['venv'] is None)
    return {
        'interpreter': system_python if not found['missing'] or check_mode_without_venv else venv_python,
        'requirements': described,
        'pending': list(found['missing']) if check_mode_without_venv else [],
        'unmet': unmet_requirements,
    }
