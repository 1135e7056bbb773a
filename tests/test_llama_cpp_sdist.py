"""scripts/llama_cpp_sdist.py: the pinned llama.cpp files unpacked once, even when two processes
ask at once (a whole-suite run's tests and conftest's fixture prebuild did, and one process's
converter vanished while the other replaced the folder: a CI failure on 2026-12-02)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = """
import sys, time
sys.path.insert(0, sys.argv[1])
from llama_cpp_sdist import llama_cpp_dir
d = llama_cpp_dir()
end = time.time() + 3  # the other process may still be unpacking: the folder must stay whole
while time.time() < end:
    assert (d / "convert_hf_to_gguf.py").is_file() and (d / ".complete").is_file(), "the folder changed under us"
    time.sleep(0.01)
print(d)
"""


def test_two_processes_unpacking_at_once_both_get_a_whole_folder(tmp_path):
    from llama_cpp_sdist import SDIST, cache_dir, llama_cpp_dir

    llama_cpp_dir()  # the sdist in the shared test cache (downloaded and checked once)
    try:  # the same file: no second download, no copy
        os.link(cache_dir() / SDIST, tmp_path / SDIST)
    except OSError:  # another filesystem
        os.symlink(cache_dir() / SDIST, tmp_path / SDIST)
    env = dict(os.environ, REFLEX_TEST_CACHE=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, os.path.join(ROOT, "scripts")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
        assert out.strip() == str(tmp_path / "llama.cpp-0.3.36")
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".unpack-")]
