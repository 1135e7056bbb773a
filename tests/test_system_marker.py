"""Plain `pytest` changes nothing on the machine: tests marked `system` (apt-get, dockerd, pip
installs) are skipped unless REFLEX_SYSTEM_TESTS=1 (which .ci/run sets)."""

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


def test_ci_opts_in():
    assert "REFLEX_SYSTEM_TESTS=1" in (ROOT / ".ci" / "run").read_text()
