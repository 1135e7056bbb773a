"""Plain `pytest` changes nothing on the machine and stays small: tests marked `system` (apt-get,
dockerd, pip installs) are skipped unless REFLEX_SYSTEM_TESTS=1, tests marked `full` (real models,
the full-size fuzz) unless REFLEX_FULL_TESTS=1; .ci/run sets both."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_system_tests_are_skipped_without_the_opt_in():
    env = {k: v for k, v in os.environ.items() if k != "REFLEX_SYSTEM_TESTS"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/test_sam_local.py"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 skipped" in r.stdout and "REFLEX_SYSTEM_TESTS=1" in r.stdout


def test_full_tests_are_skipped_without_the_opt_in():
    """The real-model tests (they use the smollm2_path fixture: marked `full` by conftest) are
    skipped, with the variable that runs them named, and none of them fetches anything."""
    env = {k: v for k, v in os.environ.items() if k != "REFLEX_FULL_TESTS"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/test_chat_smollm2.py"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 skipped" in r.stdout and "passed" not in r.stdout and "REFLEX_FULL_TESTS=1" in r.stdout


def test_ci_opts_in():
    run = (ROOT / ".ci" / "run").read_text()
    assert "REFLEX_SYSTEM_TESTS=1" in run and "REFLEX_FULL_TESTS=1" in run
