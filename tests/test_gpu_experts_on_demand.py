"""Experts on demand (gpu/residency.py) on the GPU: a MoE file's first forward runs with only the
base and the experts its tokens route to on the device, the rest uploading behind it. The tokens
must be the same as with the whole file uploaded first, on every MoE family, greedy and seeded;
a request that runs while experts are still missing (the background held back) too, alone and
in a batch.

Run on a GPU machine: pytest -m gpu tests/test_gpu_experts_on_demand.py
"""

import pytest

from reflex_runtime.gpu import residency
from reflex_runtime.sampling import SamplingParams

pytestmark = pytest.mark.gpu

FILES = {"qwen3moe": ("qwen3moe", "q8_0"), "qwen35moe": ("qwen35moe", "q4_k_m"),
         "deepseek_v2lite": ("deepseek_v2lite", "q8_0"), "deepseek_v3": ("deepseek_v3", "q4_k_m")}
PROMPT = "The capital of France is"


def _path(name):
    from fixtures import make_fixture

    arch, outtype = FILES[name]
    overrides = {}
    if arch.startswith("deepseek_"):
        from fixtures.deepseek import GPU_CONFIGS

        arch, overrides = GPU_CONFIGS[arch.removeprefix("deepseek_")]
    return str(make_fixture(arch, outtype, **overrides).gguf)


def _engine(name, monkeypatch, on_demand: bool, **kw):
    from reflex_runtime.loader import load_engine

    monkeypatch.setenv("REFLEX_EXPERTS_ON_DEMAND", "1" if on_demand else "0")
    eng = load_engine(_path(name), "cuda", **kw)
    assert (eng.runner._weights is not None) == on_demand
    return eng


def _hold_back(runner):
    """Only what forwards ask for goes up: the background waits for wait_all(). The experts not
    there yet are 0xFF bytes (NaN scales in every block type): a kernel that read one before its
    upload would poison the tokens, not shift them slightly."""
    ws = runner._weights
    ws.forward_done = lambda: None
    for il, tensors in ws.plan.experts.items():
        for e in range(ws.plan.n_expert[il]):
            if (il, e) not in ws._resident:
                for t in tensors:
                    ws.dev.memset8(ws.dst + t.offset + e * t.stride, 0xFF, t.stride, runner.stream)
    ws.dev.sync(runner.stream)
    asked = []
    ensure = ws.ensure
    ws.ensure = lambda layer, experts: (asked.append((layer, set(experts))), ensure(layer, experts))[1]
    return asked


@pytest.fixture(autouse=True)
def _no_idle_release(monkeypatch):
    monkeypatch.setattr(residency, "IDLE_RELEASE_S", 3600.0)


@pytest.mark.parametrize("name", list(FILES))
def test_greedy_and_seeded_tokens_equal_with_and_without_experts_on_demand(name, monkeypatch):
    whole = _engine(name, monkeypatch, on_demand=False)
    ids = whole.prompt_ids(PROMPT)
    seeded = SamplingParams(temperature=0.8, top_k=40, seed=7)
    want = list(whole.runner.generate_ids(ids, SamplingParams(), 32, frozenset()))
    want_seeded = list(whole.runner.generate_ids(ids, seeded, 32, frozenset()))

    eng = _engine(name, monkeypatch, on_demand=True)
    r, ws = eng.runner, eng.runner._weights
    asked = _hold_back(r)
    assert not ws.complete and ws.landed_bytes == ws.stats["base_bytes"]
    got = list(r.generate_ids(ids, SamplingParams(), 32, frozenset()))  # every step eager, experts on demand
    assert got == want
    # every layer the forward runs asked for its experts; a Qwen3.5 file's multi-token-prediction
    # block (counted in block_count, with experts of its own) is never run, so never asks
    runs = {il for il in ws.plan.experts if il < eng.config.n_layers}
    assert runs and {il for il, _ in asked} == runs
    got_seeded = list(r.generate_ids(ids, seeded, 32, frozenset()))
    assert got_seeded == want_seeded
    r.wait_weights()  # the rest lands; then the decode graph
    assert ws.complete and list(r.generate_ids(ids, SamplingParams(), 32, frozenset())) == want
    assert r.info()["decode_graph_nodes"] > 0 and r.info()["all_resident_ms"] > 0


@pytest.mark.parametrize("name", list(FILES))
def test_greedy_tokens_equal_with_the_base_streamed_behind_the_forward(name, monkeypatch):
    """REFLEX_STREAM_BASE=1: the first forward starts with only the embedding's part of the base on
    the device, each block waiting for its own (and the next block's norm) and the head for its
    own; the experts still on demand. Greedy tokens equal to the whole file uploaded first."""
    whole = _engine(name, monkeypatch, on_demand=False)
    ids = whole.prompt_ids(PROMPT)
    want = list(whole.runner.generate_ids(ids, SamplingParams(), 32, frozenset()))
    monkeypatch.setenv("REFLEX_STREAM_BASE", "1")
    take = residency.WeightStream._take
    # the blocks' parts go up only when a forward asks (ensure_base makes them urgent), so what is
    # not asked yet can be poisoned: a block that ran before its part landed would read 0xFF bytes
    monkeypatch.setattr(residency.WeightStream, "_take",
                        lambda self: 0.005 if not self._urgent and self._base_rest else take(self))
    eng = _engine(name, monkeypatch, on_demand=True)
    r, ws = eng.runner, eng.runner._weights
    assert ws.stats["base_streamed"] and ws.stats["base_loaded_bytes"] < ws.stats["base_bytes"]
    for part, ranges in ws.plan.base_parts[1:]:
        assert (residency.BASE, part) not in ws._resident
        for off, n in ranges:
            ws.dev.memset8(ws.dst + off, 0xFF, n, r.stream)
    ws.dev.sync(r.stream)
    assert list(r.generate_ids(ids, SamplingParams(), 32, frozenset())) == want


@pytest.mark.parametrize("packing", ["1", "0"])
def test_every_byte_lands_in_place_in_packs_or_one_chunk_a_copy(packing, monkeypatch):
    """A forward's experts, then the rest behind it, with small experts packed several to a copy
    (kernels/scatter.cu puts them in place) or not: the weights on the device are the file's bytes."""
    import numpy as np
    from cuda.bindings import driver as cu

    monkeypatch.setenv("REFLEX_UPLOAD_PACK", packing)
    eng = _engine("qwen35moe", monkeypatch, on_demand=True)
    r, ws = eng.runner, eng.runner._weights
    list(r.generate_ids(eng.prompt_ids(PROMPT), SamplingParams(), 4, frozenset()))
    r.wait_weights()
    got = np.empty(ws.plan.total, np.uint8)
    assert cu.cuMemcpyDtoH(got.ctypes.data, ws.dst, got.nbytes)[0] == cu.CUresult.CUDA_SUCCESS
    want = np.fromfile(ws.path, np.uint8, count=ws.plan.total, offset=ws.file_offset)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{bad.size} bytes differ, the first at {bad[:1]}"
    assert ws.stats["upload_packs"] == (packing == "1")


def _batch(r, prompts, n):
    """The scheduler's way: every prompt in one step, then decode steps of all rows."""
    from reflex_runtime.gpu.step import Pick

    sids = [r.batch_open(p, Pick(SamplingParams()), n, frozenset()) for p in prompts]
    out = {s: [] for s in sids}
    got = r.batch_step([(s, len(p)) for s, p in zip(sids, prompts)], [])
    while True:
        for s in sids:
            out[s] += got.get(s, [])
        if all(len(v) >= n for v in out.values()):
            break
        got = r.batch_step([], [s for s in sids if len(out[s]) < n])
    for s in sids:
        r.batch_close(s)
    return [out[s][:n] for s in sids]


@pytest.mark.parametrize("name", ["qwen3moe", "deepseek_v2lite"])
def test_a_batch_served_while_experts_are_missing_gets_the_same_tokens(name, monkeypatch):
    """The scheduler's batch API while experts are missing: the prompts' forward and the decode
    steps run eagerly, their experts on demand (a graph only once every expert is there, which
    the tiny fixtures' few experts may soon be); after wait_weights, the decode graphs.
    Same tokens as the same batch with the whole file uploaded first."""
    whole = _engine(name, monkeypatch, on_demand=False, max_seqs=4)
    prompts = [whole.prompt_ids(p) for p in (PROMPT, "Once upon a time", "1, 2, 3, 4,")]
    want = _batch(whole.runner, prompts, 12)
    eng = _engine(name, monkeypatch, on_demand=True, max_seqs=4)
    ws = eng.runner._weights
    asked = _hold_back(eng.runner)
    assert _batch(eng.runner, prompts, 12) == want
    assert asked
    eng.runner.wait_weights()
    assert _batch(eng.runner, prompts, 12) == want and ws.complete and eng.runner._graphs
