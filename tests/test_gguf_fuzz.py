"""10,000+ structure-aware mutations of real converted GGUFs through the CLI (tests/gguf_fuzz.py;
every tenth of them in plain `pytest`, all with REFLEX_FULL_TESTS=1 as in CI):
only one-line ReflexErrors (exit 3 or 4) or a successful generation (exit 0), no case over 5 s of
CPU (CPU, not wall time: this machine is shared; a 120 s wall backstop catches hangs that burn
none), no case growing the process by RSS_GROWTH_LIMIT (512 MiB; its own peak RSS, measured by
resetting VmHWM before it) and an address-space limit that turns anything bigger into a
failure, no memory left behind, every message valid UTF-8.

Seeds: Qwen3 (Q4_K_M), Gemma 3, Qwen3-MoE, Qwen3.5, DeepSeek-V3 and Llama (f32), each with its
vocabulary cut to ~540 tokens so a case costs milliseconds, plus the untouched 151,936-token Qwen3
file for the mutations that hit the big arrays. Two worker processes (this machine's cores)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from gguf_edit import GGUFModel, shrink_vocab
from gguf_fuzz import CASE_SECONDS, RSS_GROWTH_LIMIT, Seed, discover_keys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (seed name, make_fixtures arch, outtype): one K-quant file, the rest f32 (dequantizing costs
# the accepted cases most of their time; other types come in through the retype mutations)
SEEDS = [("qwen3", "qwen3", "q4_k_m"), ("gemma3", "gemma3", "f32"), ("qwen3moe", "qwen3moe", "f32"),
         ("qwen35", "qwen35", "f32"), ("deepseek2", "deepseek_v3", "f32"), ("llama", "llama", "f32")]
CASES_PER_SEED = 1700
FULL_VOCAB_CASES = 30
WORKERS = 2
# Plain `pytest` runs every SAMPLE_STRIDE-th case; the 10,000+ (marker `full`) run in CI.
SAMPLE_STRIDE = 10
VOCAB_KEEP = 512

# Keys the discovery must find (a check that it records what the loader reads).
MUST_READ = {"general.architecture", "general.alignment", "general.file_type", "general.name", "tokenizer.ggml.model",
             "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.bos_token_id",
             "tokenizer.chat_template", "{arch}.block_count", "{arch}.embedding_length", "{arch}.attention.head_count",
             "{arch}.context_length", "{arch}.attention.layer_norm_rms_epsilon",
             "{arch}.rope.freq_base"}


@pytest.fixture(scope="module")
def seeds(fixture_paths, tmp_path_factory):
    out = tmp_path_factory.mktemp("fuzz-seeds")
    specs = []
    for name, arch, outtype in SEEDS:
        fx = fixture_paths(arch, outtype)
        model = GGUFModel.load(fx.gguf)
        if len(model.get("tokenizer.ggml.tokens")) > 4 * VOCAB_KEEP:
            model = shrink_vocab(model, VOCAB_KEEP)
        path = str(out / f"{name}.gguf")
        with open(path, "wb") as f:
            f.write(model.to_bytes()[0])
        specs.append({"name": name, "path": path, "keys": discover_keys(path)})
    full = str(fixture_paths("qwen3", "q4_k_m").gguf)
    specs.append({"name": "qwen3-full-vocab", "path": full, "keys": [], "systematic": False})
    return specs


def test_discovery_finds_the_keys_the_loader_reads(seeds):
    for s in seeds[:-1]:
        arch = GGUFModel.load(s["path"]).get("general.architecture")
        missing = {k.format(arch=arch) for k in MUST_READ} - set(s["keys"])
        assert not missing, (s["name"], missing)
        seed = Seed(s["name"], s["path"], s["keys"])
        assert {k for k, _ in seed.variants} == set(s["keys"])  # every key read gets every odd value
        assert len(seed) < CASES_PER_SEED


def test_fuzz_every_tenth_case_only_reflex_errors(seeds, tmp_path):
    """Plain `pytest`: every SAMPLE_STRIDE-th case of the full run (the same cases, so each seed's
    keys and every mutation kind come up), held to the same rules."""
    results, summary = run_fuzz(seeds, tmp_path, SAMPLE_STRIDE)
    check_fuzz(results, summary)
    total = sum(r["cases"] for r in results)
    assert total >= (len(SEEDS) * CASES_PER_SEED + FULL_VOCAB_CASES) // SAMPLE_STRIDE - WORKERS, summary


@pytest.mark.full
def test_fuzz_10k_mutations_only_reflex_errors(seeds, tmp_path):
    results, summary = run_fuzz(seeds, tmp_path, 1)
    check_fuzz(results, summary)
    outcomes = {k for r in results for k in r["outcomes"]}
    assert sum(r["cases"] for r in results) >= 10_000, summary
    assert outcomes == {"accepted", "model_file_error", "unsupported_model"}, summary


def run_fuzz(seeds, tmp_path, stride: int) -> tuple[list[dict], str]:
    """Cases stride*k + w of every seed on worker w (WORKERS processes); their results and a summary."""
    work = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else str(tmp_path)
    procs = []
    t0 = time.monotonic()
    for w in range(WORKERS):
        d = tempfile_dir(work, f"reflex-fuzz-{os.getpid()}-{w}")
        ranges = [[w, FULL_VOCAB_CASES if s.get("systematic") is False else CASES_PER_SEED, WORKERS * stride]
                  for s in seeds]
        spec = {"workdir": d, "seeds": seeds, "ranges": ranges, "out": os.path.join(d, "result.json")}
        with open(os.path.join(d, "spec.json"), "w") as f:
            json.dump(spec, f)
        env = {**os.environ, "PYTHONPATH": ROOT, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        log = open(os.path.join(d, "log.txt"), "w+")
        procs.append((subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "gguf_fuzz.py"),
                                        os.path.join(d, "spec.json")], env=env, stdout=log, stderr=log), d, log))
    results = []
    try:
        for p, d, log in procs:
            rc = p.wait(timeout=max(60.0, 840 - (time.monotonic() - t0)))
            log.seek(0)
            assert rc == 0, f"worker exited {rc}: {log.read()[-3000:]}"
            with open(os.path.join(d, "result.json")) as f:
                results.append(json.load(f))
    finally:
        for p, d, log in procs:
            if p.poll() is None:
                p.kill()
            log.close()
            for name in os.listdir(d):
                os.unlink(os.path.join(d, name))
            os.rmdir(d)
    wall = time.monotonic() - t0
    for r in results:
        assert "fatal" not in r, r["fatal"]
    total = sum(r["cases"] for r in results)
    outcomes: dict[str, int] = {}
    for r in results:
        for k, v in r["outcomes"].items():
            outcomes[k] = outcomes.get(k, 0) + v
    slow = max(results, key=lambda r: r["slowest_cpu_s"])
    big = max(results, key=lambda r: r["max_case_rss_growth_mb"])
    summary = (f"{total} cases in {wall:.0f} s: {outcomes}; slowest case {slow['slowest_cpu_s']} CPU s "
               f"({slow['slowest']}), slowest wall {max(r['slowest_wall_s'] for r in results)} s; largest RSS growth "
               f"of a case {big['max_case_rss_growth_mb']} MiB ({big['max_growth_case']}); worker RSS "
               f"{[r['base_rss_mb'] for r in results]} MiB after warm-up, {[r['end_rss_mb'] for r in results]} at the end")
    print(summary)
    return results, summary


def check_fuzz(results: list[dict], summary: str) -> None:
    """Only exit 0, 3 or 4 with one error line; no case over CASE_SECONDS of CPU or growing the
    process by RSS_GROWTH_LIMIT; nothing left behind."""
    failures = [f for r in results for f in r["failures"]]
    assert not failures, f"{len(failures)} failing cases, e.g.\n" + "\n".join(json.dumps(f) for f in failures[:20])
    outcomes = {k for r in results for k in r["outcomes"]}
    assert outcomes <= {"accepted", "model_file_error", "unsupported_model"}, summary
    assert max(r["slowest_cpu_s"] for r in results) < CASE_SECONDS, summary
    assert max(r["max_case_rss_growth_mb"] for r in results) < RSS_GROWTH_LIMIT / 2**20, summary
    for r in results:  # no leak: what the cases leave behind stays small, and no descriptor stays open
        assert r["end_rss_mb"] - r["base_rss_mb"] < 256, summary
        assert r["fds_left_open"] <= 2, summary


def tempfile_dir(parent: str, name: str) -> str:
    d = os.path.join(parent, name)
    os.makedirs(d, exist_ok=False)
    return d
