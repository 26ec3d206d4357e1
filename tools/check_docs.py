"""Render ``ansible-doc`` for every plugin in a built collection tarball (``make docs``).

Usage: python tools/check_docs.py TARBALL NAMESPACE.NAME INSTALLED_DIR

The collection must already be installed in INSTALLED_DIR, on ANSIBLE_COLLECTIONS_PATH;
every rendering must come from there (not from a source tree).
Fails when a plugin file in the tarball has no documented plugin, when a listed plugin
is UNDOCUMENTED, when a rendering exits non-zero or prints an error or a warning, and
when the tarball holds no plugin at all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile

# plugins/<folder> -> ansible-doc type; folders without plugin docs are not listed.
FOLDER_TYPES = {
    'action': 'module',  # an action plugin is documented by the module of the same name
    'become': 'become',
    'cache': 'cache',
    'callback': 'callback',
    'cliconf': 'cliconf',
    'connection': 'connection',
    'filter': 'filter',
    'httpapi': 'httpapi',
    'inventory': 'inventory',
    'lookup': 'lookup',
    'modules': 'module',
    'netconf': 'netconf',
    'shell': 'shell',
    'strategy': 'strategy',
    'test': 'test',
    'vars': 'vars',
}
# Jinja2 plugin files may define several plugins each: they only need to yield one.
MULTI_PLUGIN_TYPES = ('filter', 'test')
SOURCE_EXTENSIONS = ('.py', '.ps1')


def plugin_files(tarball: str) -> dict[str, set[str]]:
    """Return {(folder, stem)} of plugin source files in the tarball, by folder."""
    found: dict[str, set[str]] = {}
    with tarfile.open(tarball) as tar:
        for member in tar.getmembers():
            parts = member.name.split('/')
            if not member.isfile() or len(parts) < 3 or parts[0] != 'plugins':
                continue
            folder, filename = parts[1], parts[-1]
            stem, ext = os.path.splitext(filename)
            if folder not in FOLDER_TYPES or filename == '__init__.py':
                continue
            if ext in SOURCE_EXTENSIONS or (ext in ('.yml', '.yaml') and FOLDER_TYPES[folder] in MULTI_PLUGIN_TYPES):
                found.setdefault(folder, set()).add(stem if ext in SOURCE_EXTENSIONS else 'doc:' + stem)
    return found


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    """Run a command and capture its output as text."""
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def listed(plugin_type: str, collection: str) -> dict[str, str]:
    """Return {fqcn: short description} that ansible-doc lists for the collection."""
    result = run(['ansible-doc', '-l', '-j', '-t', plugin_type, collection])
    if result.returncode != 0:
        raise RuntimeError('ansible-doc -l -t %s failed: %s' % (plugin_type, result.stderr.strip()))
    return json.loads(result.stdout or '{}')


def main(argv: list[str]) -> int:
    """Check every plugin of the tarball; return the exit code."""
    tarball, collection, installed = argv[1], argv[2], argv[3]
    errors: list[str] = []
    files = plugin_files(tarball)
    types = sorted({FOLDER_TYPES[folder] for folder in files})
    listings = {plugin_type: listed(plugin_type, collection) for plugin_type in types}

    for folder, stems in sorted(files.items()):
        plugin_type = FOLDER_TYPES[folder]
        names = listings[plugin_type]
        for stem in sorted(stems):
            if plugin_type in MULTI_PLUGIN_TYPES and not stem.startswith('doc:'):
                continue
            name = stem.replace('doc:', '', 1)
            fqcn = '%s.%s' % (collection, name)
            if fqcn not in names:
                what = '%s (documentation file)' % name if stem.startswith('doc:') else name
                errors.append('plugins/%s/%s: no %s %s listed by ansible-doc' % (folder, what, plugin_type, fqcn))
        if plugin_type in MULTI_PLUGIN_TYPES and not names:
            errors.append('plugins/%s: no %s plugin listed by ansible-doc' % (folder, plugin_type))

    rendered = 0
    for plugin_type in types:
        for fqcn, description in sorted(listings[plugin_type].items()):
            if description == 'UNDOCUMENTED':
                errors.append('%s %s: UNDOCUMENTED' % (plugin_type, fqcn))
                continue
            result = run(['ansible-doc', '-t', plugin_type, fqcn])
            output = result.stdout + result.stderr
            if result.returncode != 0 or '[ERROR]' in output or '[WARNING]' in output or 'ERROR!' in output:
                errors.append('%s %s: ansible-doc exit %d\n%s' % (plugin_type, fqcn, result.returncode, result.stderr.strip()))
                continue
            if installed not in result.stdout:
                errors.append('%s %s: not rendered from the installed tarball in %s' % (plugin_type, fqcn, installed))
                continue
            rendered += 1
            print('ok   %-7s %s (%d lines)' % (plugin_type, fqcn, len(result.stdout.splitlines())))

    for error in errors:
        print('FAIL %s' % error)
    if rendered == 0 and not errors:
        errors.append('no plugin found in %s' % tarball)
        print('FAIL no plugin found in %s' % tarball)
    print('%d plugin docs rendered, %d problems' % (rendered, len(errors)))
    return 1 if errors else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
