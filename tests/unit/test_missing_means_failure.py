# -*- coding: utf-8 -*-
"""Under `make test` a missing library, tool, privilege or ../shared fails the run instead of skipping:
every test reaches that decision through tests/require.py, never through pytest.skip or importorskip."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import glob
import os
import re
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIPS = re.compile(r"pytest\.skip\(|importorskip|skipif|mark\.skip|xfail")
# Skips that no install step can turn into a pass: the test does not apply to the machine.
NOT_A_MISSING_DEPENDENCY = {
    # Asserts what the module reports on a machine without a GPU; on a GPU machine there is no such answer.
    os.path.join("integration", "test_nvidia_gpu_facts.py"): ['pytest.skip("this machine has an NVIDIA driver")'],
}


def test_no_test_skips_on_its_own():
    found = {}
    for path in glob.glob(os.path.join(TESTS, "**", "*.py"), recursive=True):
        name = os.path.relpath(path, TESTS)
        if name == "require.py" or name == os.path.join("unit", "test_missing_means_failure.py"):
            continue
        with open(path) as handle:
            lines = [line.strip() for line in handle if SKIPS.search(line)]
        if lines != NOT_A_MISSING_DEPENDENCY.get(name, []):
            found[name] = lines
    assert found == {}


def _pytest(tmp_path, test, env):
    """Run pytest on test (a node id) with the environment changed by env (None removes a variable)."""
    environ = dict(os.environ)
    for key, value in env.items():
        if value is None:
            environ.pop(key, None)
        else:
            environ[key] = value
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs",
                           "--rootdir", TESTS, test], cwd=str(tmp_path), env=environ, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, timeout=300, check=False)
    return proc


@pytest.fixture
def no_libraries(tmp_path):
    """A folder that, first on PYTHONPATH, makes pynvml and google.protobuf fail to import."""
    shadow = tmp_path / "shadow"
    (shadow / "google").mkdir(parents=True)
    for path in (shadow / "pynvml.py", shadow / "google" / "__init__.py"):
        path.write_text("raise ImportError('hidden by test_missing_means_failure')\n")
    return str(shadow) + os.pathsep + os.environ.get("PYTHONPATH", "")


@pytest.mark.parametrize("test", [
    os.path.join("unit", "module_utils", "test_nvml.py") + "::test_real_pynvml_against_fake_library",
    os.path.join("unit", "module_utils", "test_cri.py"),
])
def test_a_missing_library_fails_under_make_test_and_skips_by_hand(tmp_path, no_libraries, test):
    node = os.path.join(TESTS, test)
    strict = _pytest(tmp_path, node, {"PYTHONPATH": no_libraries, "GPUREADY_REQUIRE_REAL": "1"})
    assert strict.returncode == 1 and " failed" in strict.stdout, strict.stdout[-3000:]
    assert "hidden by test_missing_means_failure" in strict.stdout
    by_hand = _pytest(tmp_path, node, {"PYTHONPATH": no_libraries, "GPUREADY_REQUIRE_REAL": None})
    assert by_hand.returncode == 0 and " skipped" in by_hand.stdout, by_hand.stdout[-3000:]


def test_missing_shared_reference_fails_in_ci(tmp_path):
    node = os.path.join(TESTS, "unit", "module_utils", "test_containerd_config.py") + \
        "::test_public_cases_are_byte_identical_to_shared"
    in_ci = _pytest(tmp_path, node, {"GPUREADY_SHARED_DIR": None, "CI": "true"})
    assert in_ci.returncode == 1 and "../shared is not beside this checkout" in in_ci.stdout, in_ci.stdout[-3000:]
    users_clone = _pytest(tmp_path, node, {"GPUREADY_SHARED_DIR": None, "CI": None})
    assert users_clone.returncode == 0 and "1 skipped" in users_clone.stdout, users_clone.stdout[-3000:]
