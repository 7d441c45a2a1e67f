"""Shared fixtures of the Python package tests.

The tests use the package from the source tree (python/) and the library of
the build tree: FR_BUILDDIR names it (make check sets it), else ../../build.
Multi-process tests launch their workers with that build's frrun.
"""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("FR_BUILDDIR", os.path.join(TOP, "build"))
LIB = os.path.join(BUILD, ".libs", "libfastreduce.so")

os.environ.setdefault("FASTREDUCE_LIB", LIB)
sys.path.insert(0, os.path.join(TOP, "python"))


def launch(n, script, *args, env=None, timeout=600, frrun_args=()):
    """Run tests/python/<script> on n ranks under frrun (with frrun_args);
    return the CompletedProcess (stdout and stderr together)."""
    e = dict(os.environ)
    e["PYTHONPATH"] = os.path.join(TOP, "python") + os.pathsep + e.get("PYTHONPATH", "")
    e["FASTREDUCE_LIB"] = os.environ["FASTREDUCE_LIB"]
    e.setdefault("FR_TIMEOUT_MS", "60000")
    e.update(env or {})
    cmd = [os.path.join(BUILD, "frrun"), "-n", str(n), "--timeout", str(timeout)] + \
        list(frrun_args) + [sys.executable, os.path.join(HERE, script)] + [str(a) for a in args]
    return subprocess.run(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout + 30)


@pytest.fixture
def run_ranks():
    return launch


def ranks_to_test(default):
    """FR_TEST_RANKS ("1 2 3 4") limits the rank counts, as in the C tests."""
    env = os.environ.get("FR_TEST_RANKS")
    if not env:
        return default
    want = {int(x) for x in env.split()}
    return [n for n in default if n in want] or default[:1]
