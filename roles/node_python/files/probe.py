# Run by gpuready.nvidia.node_python as `PYTHON -c "<this file>" REQUIREMENTS_JSON [VENV_DIR]`. Reads only.
# Prints one JSON object: the interpreter's version, whether it is a venv (and sees the system packages),
# whether ensurepip, pip and the apt bindings import, and for each requirement whether it imports, its
# version, where it was found and whether that meets its min_version. With VENV_DIR, also whether that
# folder has a bin/python and a pyvenv.cfg. Kept runnable by old Pythons, so that the role can tell
# "Python 3.6" or "Python 2.7" instead of a traceback.
import json
import os
import re
import sys

try:
    import importlib
    import importlib.util
except ImportError:  # Python 2
    importlib = None

try:
    from importlib import metadata
except ImportError:  # Python < 3.8
    metadata = None


def release(text):
    """The leading numeric release of a version as a tuple: '1.51.1rc2' -> (1, 51, 1); None if there is none."""
    match = re.match(r'\s*v?(\d+(?:\.\d+)*)', text or '')
    return tuple(int(part) for part in match.group(1).split('.')) if match else None


def at_least(version, minimum):
    have, want = release(version), release(minimum)
    if have is None or want is None:
        return False
    width = max(len(have), len(want))
    return have + (0,) * (width - len(have)) >= want + (0,) * (width - len(want))


def has(name):
    if importlib is None:
        return False
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def venv_config():
    """The running venv's pyvenv.cfg as a dict, or None outside a venv."""
    if sys.prefix == getattr(sys, 'base_prefix', sys.prefix):
        return None
    config = {}
    try:
        with open(os.path.join(sys.prefix, 'pyvenv.cfg')) as handle:
            for line in handle:
                key, sep, value = line.partition('=')
                if sep:
                    config[key.strip().lower()] = value.strip()
    except (IOError, OSError):
        pass
    return config


def probe(requirement):
    found = {'module': requirement['module'], 'found': False, 'version': None, 'location': None,
             'error': None, 'ok': False}
    try:
        module = __import__(requirement['module'], fromlist=['_'])
    except Exception as exc:  # pylint: disable=broad-except  # a broken binary module is "not there" too
        found['error'] = '%s: %s' % (type(exc).__name__, exc)
        return found
    found['found'] = True
    path = getattr(module, '__file__', None)
    if path:  # a package: its folder; a single-file module: the file
        path = os.path.realpath(path)
        found['location'] = os.path.dirname(path) if os.path.basename(path).startswith('__init__.') else path
    if metadata is not None:
        try:
            found['version'] = metadata.version(requirement['name'])
        except Exception:  # pylint: disable=broad-except  # no metadata for this distribution
            pass
    if found['version'] is None:
        version = getattr(module, '__version__', None)
        found['version'] = version if isinstance(version, str) else None
    minimum = requirement.get('min_version')
    found['ok'] = True if minimum is None else at_least(found['version'], str(minimum))
    return found


def main():
    requirements = json.loads(sys.argv[1]) if len(sys.argv) > 1 else []
    config = venv_config()
    report = {
        'executable': sys.executable,
        'version': '%d.%d.%d' % tuple(sys.version_info[:3]),
        'in_venv': config is not None,
        'venv_system_site_packages': None if config is None
        else config.get('include-system-site-packages', 'false').lower() == 'true',
        'ensurepip': has('ensurepip'),
        'pip': has('pip'),
        'apt': has('apt') and has('apt_pkg'),
        'requirements': dict((r['name'], probe(r)) for r in requirements),
    }
    if len(sys.argv) > 2:
        report['venv_dir'] = {
            'python': os.path.lexists(os.path.join(sys.argv[2], 'bin', 'python')),
            'pyvenv_cfg': os.path.exists(os.path.join(sys.argv[2], 'pyvenv.cfg')),
        }
    sys.stdout.write(json.dumps(report, sort_keys=True) + '\n')


main()
