"""Every kernel launch the GPU engine makes passes exactly the parameters the compiled kernel
expects, checked without a GPU.

nvcc compiles each kernels/*.cu to PTX here (on its own: it includes what it uses), which lists
each `extern "C"` kernel's parameters with their sizes; each file's kernels must be exactly the
names its ops module (reflex_runtime/gpu/ops/<file>.py) declares. A fake device stands in for
the driver: it records each launch's ctypes argument pack, and we run the real forward passes
(prefill, decode step, system1 tree, samplers, scoring) of tiny Qwen3, Gemma 3, Qwen3-MoE, Llama,
DeepSeek and Qwen3.5 models through it. A wrong argument count, order of sizes, launch shape, or
a kernel missing from its ops module fails here instead of on the GPU.
"""

import concurrent.futures
import ctypes
import glob
import os
import re
import subprocess

import pytest

from reflex_runtime.errors import RequestError

from reflex_runtime.gpu.ops import (attn_decode, constrain, delta_net, flash_attn, gemm, kernel_modules, logits, moe,
                                    moe_decode, mvs, sample)
from reflex_runtime.gpu import products

from fake_device import FakeBoot, FakeDevice

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ATD = set(attn_decode.KERNELS)  # the decode attention: one kernel for any group, two for small ones


def find_nvcc():
    import build_kernels

    return build_kernels.find_nvcc()


@pytest.fixture(scope="module")
def ptx_by_file():
    """{kernel file: {kernel name: parameter sizes}} from each .cu's own PTX (cached by content
    like the build's pieces)."""
    import build_kernels

    nvcc = find_nvcc()
    if nvcc is None:
        pytest.fail("nvcc is needed (CI has it): the kernels' parameter lists come from their PTX")
    sources = build_kernels.kernel_sources(ROOT)
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        entries = list(pool.map(lambda src: build_kernels.ptx_entries(nvcc, src), sources))
    return {os.path.basename(src): e for src, e in zip(sources, entries)}


@pytest.fixture(scope="module")
def ptx_params(ptx_by_file):
    params = {}
    for entries in ptx_by_file.values():
        assert not set(entries) & set(params), "a kernel name defined in two files"
        params.update(entries)
    return params


def test_each_ops_module_owns_exactly_its_files_kernels(ptx_by_file):
    """ops/<name>.py declares the kernels kernels/<name>.cu defines, no more and no fewer, and
    every kernel file has its ops module: the manifest and `reflex smoke` take the names from there."""
    owners = {m.__name__.rsplit(".", 1)[1] + ".cu": m for m in kernel_modules()}
    assert set(owners) == set(ptx_by_file), set(owners) ^ set(ptx_by_file)
    for cu, entries in ptx_by_file.items():
        declared = owners[cu].KERNELS
        assert len(set(declared)) == len(declared), f"{owners[cu].__name__} lists a kernel twice"
        assert set(declared) == set(entries), f"{cu}: {sorted(set(declared) ^ set(entries))}"


def test_ops_constants_match_the_kernels():
    """Constants an ops module mirrors from its kernel file's #defines."""
    from reflex_runtime.sampling import MAX_TOP_LOGPROBS

    def define(cu, name):
        return int(re.search(rf"#define {name} (\d+)", open(os.path.join(ROOT, "kernels", cu)).read()).group(1))

    assert constrain.STATS_TOPK == define("constrain.cu", "RX_TOPK_MAX") == MAX_TOP_LOGPROBS
    assert moe.MAX_EXPERTS == define("moe.cuh", "MOE_MAX_EXPERTS")
    assert (moe.ROUTER_MM_T, moe.ROUTER_MM_KT) == (define("moe.cu", "RM_T"), define("moe.cu", "RM_KT"))
    assert delta_net.MAX_HEAD == define("delta_net.cu", "DN_MAX_HD") and delta_net.MAX_CONV == define("delta_net.cu", "DN_MAX_K")
    assert attn_decode.SPLITS_MAX == define("attn_decode.cuh", "ATD_MAXSPLIT")
    assert attn_decode.MAX_GROUP == define("attn_decode.cuh", "ATD_MAXG")
    assert attn_decode.MERGE_RUN == define("attn_decode.cuh", "ATD_MERGE")
    assert attn_decode.DEFER_MAX == define("attn_plan.cuh", "ATD_DEFER_MAX")
    from reflex_runtime.gpu.ops import mla, moe_route

    assert mla.HEADS == define("mla.cu", "MLA_HEADS") and mla.MAX_PAIRS == define("mla.cu", "MLA_MAX_PAIRS")
    assert mla.MERGE_RUN == define("mla.cu", "MLA_RUN")
    from reflex_runtime.gpu.ops import mla_flash

    assert (mla_flash.ROWS, mla_flash.BKV, mla_flash.D, mla_flash.R) == tuple(
        define("mla_flash.cu", n) for n in ("MLF_ROWS", "MLF_BKV", "MLF_D", "MLF_R"))
    assert moe_route.MAX_GROUPS == define("moe_route.cu", "ROUTE_MAX_GROUPS")
    assert mvs.MVS_NX == define("mvs.cuh", "MVS_NX")
    assert mvs.MVS_STAGES == define("mvs.cuh", "MVS_STAGES")
    from reflex_runtime.gpu.ops import fused_step

    assert (fused_step.X_EARLY, fused_step.LOOKAHEAD, fused_step.ATTN_EARLY) == tuple(
        define("fused_step.cu", n) for n in ("FS_X_EARLY", "FS_LOOKAHEAD", "FS_ATTN_EARLY"))
    from reflex_runtime.gpu import fused

    assert fused.POST_MAX == define("fused_step.cu", "FS_POST_E") * define("fused_step.cu", "FS_THREADS")


def test_staged_launches_take_no_partly_empty_last_wave(ptx_params):
    """mvs.plan on sm_90: the Qwen3-30B-A3B shape's expert gate/up (8 slots x 768 rows of 2,176
    bytes, two ranges) takes 24 rows a block, 256 blocks in the 264 places of one wave, not 22
    rows in 280 blocks (two waves: measured 1.5x slower); launches already in one wave keep
    their blocks; bigger blocks only while two fit an SM; REFLEX_MVS_WAVES=0 keeps the old rule."""
    from reflex_runtime.gpu.launch import Launcher

    L = Launcher(FakeDevice(ptx_params), stream=None)
    per_sm, sm = L.dev.smem_per_sm, L.dev.sm_count

    def blocks(p, rows, groups=1):
        return groups * -(-(rows // groups) // p.rb)

    def per_sm_fit(p):
        return per_sm // (p.smem + mvs.STATIC_SMEM_RESERVE + 1024)

    glu = mvs.plan(L, 768 * 8, 2176, 2048, ranges=2, groups=8)
    assert glu.rb == 24 and blocks(glu, 768 * 8, 8) <= sm * per_sm_fit(glu) and per_sm_fit(glu) == 2
    for rows, rb_bytes, k, ranges in ((4096, 1088, 1024, 1), (3072, 1088, 1024, 2), (1024, 3264, 3072, 1)):
        assert mvs.plan(L, rows, rb_bytes, k, ranges).rb == -(-rows // sm)  # Qwen3-0.6B's: one wave already
    head = mvs.plan(L, 151936, 1088, 1024)  # LM head: 7 waves of 90 rows -> 6 of 96
    assert head.rb == 96 and -(-blocks(head, 151936) // (sm * per_sm_fit(head))) == 6
    L.mvs_waves = False
    assert mvs.plan(L, 768 * 8, 2176, 2048, ranges=2, groups=8).rb == 22
    assert mvs.plan(L, 151936, 1088, 1024).rb == 90


def test_fake_device_has_the_whole_device_interface():
    """The fake stands in for gpu.driver.Device: it must offer every public method and attribute."""
    from reflex_runtime.gpu.driver import Device

    public = {n for n in dir(Device) if not n.startswith("_")}
    missing = {n for n in public if not hasattr(FakeDevice, n)} - {"load_fatbin"}
    assert not missing, missing


ABI_MODELS = {  # name: (fixture architecture or deepseek GPU config, overrides)
    "qwen3": ("qwen3", {}), "gemma3": ("gemma3", {}), "qwen3moe": ("qwen3moe", {}),
    "llama": ("llama", {}),  # untied LM head, pairwise rope
    "llama3_tied": ("llama", {"tie_word_embeddings": True, "rope_llama3": 4.0}),  # + rope_freqs factors
    "deepseek_v2lite": ("deepseek_v2lite", {}), "deepseek_v2": ("deepseek_v2", {}), "deepseek_v3": ("deepseek_v3", {}),
    "deepseek_legacy": ("deepseek_legacy", {}), "deepseek_v3_wide": ("deepseek_v3_wide", {}),
    "qwen35": ("qwen35", {}), "qwen35moe": ("qwen35moe", {}),
}


def _fixture_file(arch, tmp_dir=None, **overrides):
    """The q4_k_m file of a fixture: an architecture (with overrides), or a deepseek GPU config
    ('deepseek_v3'), or 'deepseek_legacy' (a V3 without q_lora rewritten into the single
    attn_kv_b layout, f32)."""
    from fixtures import make_fixture

    if arch.startswith("deepseek_"):
        from fixtures.deepseek import GPU_CONFIGS, write_legacy_kv_b

        if arch == "deepseek_legacy":
            out = os.path.join(tmp_dir, "legacy.gguf")
            src = make_fixture("deepseek_v3", "f32", q_lora_rank=None, num_hidden_layers=2, qk_rope_head_dim=8)
            write_legacy_kv_b(src.gguf, out)
            return out
        base, ds_overrides = GPU_CONFIGS[arch.removeprefix("deepseek_")]
        return make_fixture(base, "q4_k_m", **ds_overrides).gguf
    return make_fixture(arch, "q4_k_m", **overrides).gguf


def _model(arch, params, tmp_dir=None, cc=(9, 0), path=None, **overrides):
    from reflex_runtime.families import gpu_model_class, gpu_unsupported, read_config
    from reflex_runtime.modelfile.gguf_file import GGUFFile
    from reflex_runtime.gpu.launch import Launcher

    g = GGUFFile(str(path or _fixture_file(arch, tmp_dir, **overrides)))
    cfg = read_config(g)
    assert gpu_unsupported(cfg, g) is None
    model = gpu_model_class(cfg)(cfg, g, max_batch=64, n_ctx=256, max_new=256)
    dev = FakeDevice(params)
    dev.cc = cc
    base = dev.alloc(model.arena_bytes)
    model.bind(base, Launcher(dev, stream=None))
    return model, dev


# the prompt kernels each GPU generation runs (sm_80+: gemm.cu and flash_attn.cu; older: WMMA + scalar)
PROMPT_KERNELS = {
    (9, 0): {"all": ("reflex_gemm_", "reflex_flash_attn_"), "gemma3": ("reflex_gemm_glu_",),
             "qwen3moe": ("reflex_moe_gemm_glu_", "reflex_moe_gemm_down_")},
    (7, 5): {"all": ("reflex_mm_",), "gemma3": ("reflex_glu",), "qwen3moe": ("reflex_moe_mm_", "reflex_moe_combine")},
}


@pytest.mark.parametrize("name", ["qwen3", "gemma3"])
def test_decode_step_knobs_launch_matching_abi(ptx_params, name, tmp_path, monkeypatch):
    """The decode step's paths on by default: the streamed LM head (REFLEX_MVS_HEAD_STREAM, with
    the greedy pick fused where there is no soft-capping), and Gemma's post-norms folded into the
    next matrix kernel (REFLEX_POST_FOLD, the _post kernels): one norm launch left a step, the
    residual alternating buffers."""
    from reflex_runtime.gpu.ops.sample import RxState

    monkeypatch.delenv("REFLEX_MVS_HEAD_STREAM", raising=False)
    monkeypatch.delenv("REFLEX_POST_FOLD", raising=False)
    arch, overrides = ABI_MODELS[name]
    dec, dev = _model(arch, ptx_params, str(tmp_path), **overrides)
    st = RxState(*[dec.p(n) for n in ("tokens", "pos", "slot", "n_kv", "step", "out_tokens")])
    dec.launch.pdl = True
    for step in range(2):  # the second step starts from the first residual buffer again
        n0 = len(dev.launches)
        dec.forward(1, pick=(st, 0))
        launches = dev.launches[n0:]
        names = [n for n, _, _ in launches]
        heads = [g for n, g, _ in launches if n.startswith("reflex_mvs_head_")]
        assert len(heads) == 1 and heads[0][0] <= 2 * dev.sm_count, heads
        assert set(names) & ATD
        posts = [a for (n, _, _), a in zip(launches, dev.last_args[n0:]) if isinstance(a, mvs.MvsPost) and a.src]
        # an MvsPost only ever goes to the _post kernels; the others keep main's arguments
        assert all(("_post" in n) == isinstance(a, mvs.MvsPost) for (n, _, _), a in zip(launches, dev.last_args[n0:])
                   if n.startswith("reflex_mvs")), names
        if name == "gemma3":  # post-norms folded into the next q/k/v or gate/up launch, but the last layer's
            assert names.count("reflex_rmsnorm") == 1 and len(posts) == 2 * dec.cfg.n_layers - 1
            assert dec.res.x == dec.p("x" if len(posts) % 2 == 0 else "x2")
        else:
            assert not posts
    n0 = len(dev.launches)
    dec.forward(5)  # a prompt: no folding; Gemma's post-norms are norm launches again
    assert not any(isinstance(a, mvs.MvsPost) and a.src for a in dev.last_args[n0:])
    if name == "gemma3":
        assert sum(n == "reflex_rmsnorm" for n, _, _ in dev.launches[n0:]) >= 2 * dec.cfg.n_layers


def test_decode_attention_slices_fit_one_wave(ptx_params):
    """attn_decode.splits never asks for more blocks than fit the GPU at once: 3 tensor-core blocks an
    SM for Qwen3's 8 KV heads is 49 slices (396 places), not 50 (round(49.5): 4 blocks ran a second
    wave, 58 us at 16,384 keys on an H100); a whole quotient stays whole (5 an SM, 132 SMs, 4 heads)."""
    from reflex_runtime.gpu.launch import Launcher

    L = Launcher(FakeDevice(ptx_params), stream=None)
    sm = L.dev.sm_count
    for per_sm in (0.25, 1, 2.5, 3, 4, 5, 6):
        L.attn_blocks_per_sm = per_sm
        for n_kv in (1, 2, 3, 4, 8, 16, 24, 40, 64, 512):
            for fit in (None, 1, 2, 3, 4, 5):
                s = attn_decode.splits(L, n_kv, fit)
                cap = min(per_sm, fit or per_sm) * sm
                assert 1 <= s <= attn_decode.SPLITS_MAX and (s * n_kv <= cap or s == 1), (per_sm, n_kv, fit, s)
    L.attn_blocks_per_sm = 5
    assert attn_decode.splits(L, 8, 3) == 49 and attn_decode.splits(L, 4, 5) == attn_decode.SPLITS_MAX
    L.attn_blocks_per_sm = 5 * 4 / sm  # exactly 5 slices a head for 4 heads: no float shortfall
    assert attn_decode.splits(L, 4) == 5


@pytest.mark.parametrize("name", ["qwen3", "gemma3", "qwen3moe", "llama", "qwen35"])
@pytest.mark.parametrize("out_merge,k_max", [(8, None), (0, None), (8, 8)], ids=["on", "off", "wider_than_k_max"])
def test_decode_attention_leaves_its_merge_to_the_output_projection(ptx_params, name, out_merge, k_max, tmp_path):
    """REFLEX_ATTN_OUT_MERGE: in a one-token forward every decode attention launch defers a context
    of up to 8 slices (its `defer`) exactly where the launch after it is reflex_mvs_merge_* reading
    its output, whose MvsMerge plans as the attention's grid does (slices per KV head, head groups,
    min_keys, the layer's window). Qwen3.5's gated output (a sigmoid between them) never defers;
    nor does a prompt, 0, or an output projection wider than REFLEX_ATTN_OUT_MERGE_K."""
    arch, overrides = ABI_MODELS[name]
    dec, dev = _model(arch, ptx_params, str(tmp_path), **overrides)
    L = dec.launch
    L.attn_out_merge = out_merge
    if k_max:
        L.attn_out_merge_k = k_max
    for n in (1, 5):
        n0 = len(dev.launches)
        dec.forward(n)
        launches, args = dev.launches[n0:], dev.args[n0:]
        attn = [i for i, (k, _, _) in enumerate(launches) if k in ATD]
        merges = [i for i, (k, _, _) in enumerate(launches) if k.startswith("reflex_mvs_merge_")]
        assert bool(attn) == (n == 1)
        if n > 1 or not out_merge or k_max or name == "qwen35":
            assert not merges and all(args[i][-3].value == 0 for i in attn), name
            continue
        assert merges == [i + 1 for i in attn], [k for k, _, _ in launches]
        for i in attn:
            (_, grid, _), a, m = launches[i], args[i], args[i + 1][-1]
            assert isinstance(m, mvs.MvsMerge) and a[-3].value == m.defer == 8
            # the attention's att, part_o, part_ml, n_kv, q_slot and window are what the merge reads
            assert args[i + 1][2].value == a[8].value and (m.part_o, m.part_ml) == (a[9].value, a[10].value)
            assert (m.n_kv, m.slot, m.window, m.hd_v) == (a[7].value, a[5].value, a[17].value, a[15].value)
            assert (m.max_split, m.n_hg, m.min_keys) == (grid[1], a[-4].value, a[20].value)


@pytest.mark.parametrize("cc", list(PROMPT_KERNELS), ids=lambda cc: f"sm{cc[0]}{cc[1]}")
@pytest.mark.parametrize("name", list(ABI_MODELS))
def test_forward_launches_match_kernel_abi(ptx_params, name, cc, tmp_path):
    from reflex_runtime.gpu.ops.sample import ARGMAX_PARTS, RxState

    arch, overrides = ABI_MODELS[name]
    dec, dev = _model(arch, ptx_params, str(tmp_path), cc=cc, **overrides)
    if arch == "llama":  # pairwise rope, and the factors tensor bound in place when the file has one
        attn = dec.layers[0].mixer
        assert attn.rope_pairs and (attn.rope_factors != 0) == ("rope_llama3" in overrides)
        assert not attn.w.q_norm and not attn.w.k_norm
    cfg = dec.cfg
    st = RxState(*[dec.p(n) for n in ("tokens", "pos", "slot", "n_kv", "step", "out_tokens")])
    dec.launch.pdl = True  # as while capturing the decode graph
    assert dec.forward(1, pick=(st, 0)) is (dec.softcap <= 0)  # a greedy decode step; no fused pick under soft-capping
    dec.launch.pdl = False
    assert dev.carveouts == {100}, dev.carveouts  # all of it: an SM holds consecutive kernels only in one configuration
    step = {n for n, _, _ in dev.launches}
    per_layer = len(dev.launches)
    assert per_layer < 14 * cfg.n_layers + 8, f"{per_layer} launches for one decode step"
    # the one-token kernels: weights staged in shared memory, decode attention, the pick in the head
    if not arch.startswith("deepseek_"):  # (DeepSeek's latent attention has its own kernels)
        assert step & ATD and "reflex_attn" not in step
        assert "reflex_qk_rope_store" not in step  # fused into the decode attention
    assert not any(n.startswith(("reflex_mv_", "reflex_argmax")) for n in step)
    assert max(dev.shmem) > 0  # staged weights (FakeKernel checks the size against the opt-in limit)
    if arch == "qwen3moe":
        for kind in ("reflex_moe_router_", "reflex_mvs_glu_", "reflex_moe_mvs_down_"):
            assert any(n.startswith(kind) for n in step), kind
    dec.forward(1)  # the same step eagerly (decode_logits, check)
    dec.forward(12, first=3)  # a short prefill (under products.MM_MIN_TOKENS): matrix-vector path
    dec.forward(64, tree=True, prefix_len=10, logit_row=9, logit_rows=55, logits=dev.alloc(4 * 55 * cfg.vocab_size))
    sample.argmax(dec.launch, dec.p("logits"), cfg.vocab_size, dec.p("amax_v"), dec.p("amax_i"), ARGMAX_PARTS, st, 0)
    sample.sample(dec.launch, dec.p("logits"), cfg.vocab_size, dec.p("sampling"), st, 0)
    logits.logprob_rows(dec.launch, dec.p("logits"), cfg.vocab_size, dec.p("tokens"), dec.p("pos"), dec.p("o"), 3)
    from reflex_runtime.gpu.ops.constrain import STATS_PARTS, STATS_TOPK  # logprobs and grammar masks

    part = dev.alloc(4 * STATS_PARTS * (2 + 2 * STATS_TOPK))
    constrain.logit_stats(dec.launch, dec.p("logits"), cfg.vocab_size, 5, part,
                          part + 4 * STATS_PARTS * (2 + STATS_TOPK), STATS_PARTS)
    constrain.mask_logits(dec.launch, dec.p("logits"), dev.alloc(4 * (cfg.vocab_size + 31) // 32), cfg.vocab_size)
    constrain.token_logit(dec.launch, dec.p("logits"), dec.p("tokens"), part)
    names = {n for n, _, _ in dev.launches}
    if arch.startswith("deepseek_"):  # latent attention and DeepSeek's routing, no GQA attention
        kinds = ["reflex_mla_rope_store", "reflex_mla_attn", "reflex_mla_mv_", "reflex_moe_route", "reflex_moe_mv_glu_",
                 "reflex_moe_group"]
        kinds += ["reflex_moe_gemm_glu_"] if cc >= (8, 0) else ["reflex_moe_mm_"]
        kinds += ["reflex_mla_mv_t_"] if arch == "deepseek_legacy" else ["reflex_mla_mm_"]
        for kind in kinds:
            assert any(n.startswith(kind) for n in names), kind
        assert "reflex_attn" not in names and "reflex_moe_topk" not in names
        # a prompt's latent attention on tensor cores at the real widths (kv_lora_rank 512, rope 64)
        wide = dec.layers[0].mixer.d == 576 and dec.layers[0].mixer.r == 512
        assert ("reflex_mla_flash" in names) == (wide and cc >= (8, 0)), (wide, cc)
        split = [g for n, g, _ in dev.launches if n == "reflex_mla_attn" and g[1] > 1]
        assert split and all(g[0] == 1 for g in split), "only a decode step splits the keys"
        return
    for kind in PROMPT_KERNELS[cc]["all"] + PROMPT_KERNELS[cc].get(arch, ()):
        assert any(n.startswith(kind) for n in names), f"64 tokens should run {kind}*"
    if cc < (8, 0):
        assert not any(n.startswith(("reflex_gemm", "reflex_flash", "reflex_moe_gemm")) for n in names)
    assert names & ({"reflex_attn"} | ATD)  # decode
    if arch == "gemma3":
        assert any(n.startswith("reflex_mv_glu_") for n in names)
    if arch in ("qwen3moe", "qwen35moe"):  # both expert paths: per-pair matrix-vector, and grouped tensor cores
        for kind in ("reflex_moe_topk", "reflex_moe_mv_glu_", "reflex_moe_mv_down_", "reflex_moe_group"):
            assert any(n.startswith(kind) for n in names), kind
    if arch.startswith("qwen35"):
        # a short prefill (delta rule token by token) and a forked system1 pass of 3 sequences
        dec.forward(5)
        dec.fork(3)
        dec.forward(9, tree=True, prefix_len=4, logit_row=0, logit_rows=9, logits=dev.alloc(4 * 9 * cfg.vocab_size),
                    seqs=3, seq_max=4)
        names = {n for n, _, _ in dev.launches}
        for kind in ("reflex_dn_conv", "reflex_dn_conv_state", "reflex_dn_recurrent", "reflex_dn_prep",
                     "reflex_dn_chunked", "reflex_dn_gated_norm", "reflex_gate_split", "reflex_sigmoid_mul"):
            assert kind in names, kind
        assert sum(1 for what, _, _ in dev.copies if what == "dtod") == 2 * 3, "one state copy (dst, src) per sequence"


def test_every_prompt_kernel_launch_matches_abi(ptx_params):
    """Every sm_80+ prompt kernel, each weight type and tile configuration, through the launcher
    (the forward passes above only reach the types and sizes of their fixtures)."""
    from reflex_runtime.gpu.launch import Launcher
    from reflex_runtime.gpu.ops.common import WEIGHT_TYPES, Weight
    from reflex_runtime.gpu.ops.moe import MoeGroups

    dev = FakeDevice(ptx_params)
    L = Launcher(dev, stream=None)
    n_tok, k_embd, n_ff, n_expert, top_k = 300, 1024, 768, 8, 2

    def weight(type_name, rows, k):
        from reflex_runtime.modelfile.ggml_types import GGML_TYPES_BY_NAME

        t = GGML_TYPES_BY_NAME[type_name]
        rb = k // t.block_size * t.type_size
        return Weight(dev.alloc(rows * rb), type_name, rows, k, rb)

    buf = lambda n: dev.alloc(4 * n)  # noqa: E731
    for tn in WEIGHT_TYPES:
        wq, wk = weight(tn, 2048, k_embd), weight(tn, 512, k_embd)
        x = buf(n_tok * k_embd)
        for cfg in gemm.CFGS:
            gemm.gemm(L, [wq, wk, wk], x, [buf(n_tok * 2048), buf(n_tok * 512), buf(n_tok * 512)], n_tok, cfg=cfg)
            gemm.gemm(L, [wq], x, [buf(n_tok * 2048)], n_tok, accumulate=True, cfg=cfg)
            gemm.glu(L, wq, wq, x, buf(n_tok * 2048), n_tok, 1, cfg=cfg)
        pairs = n_tok * top_k
        for tile in (moe.TILE, moe.SMALL_TILE):
            tiles = moe.max_tiles(pairs, n_expert, tile)
            grp = MoeGroups(*[buf(n) for n in (n_expert, n_expert, pairs, pairs)], buf(tiles), buf(tiles), buf(1), tiles,
                            tile)
            moe.group(L, buf(pairs), pairs, n_expert, top_k, grp.counts, grp.offsets, grp.pair_tok, grp.pair_id,
                      grp.tile_e, grp.tile_m0, grp.n_tiles, tile)
            wg, wd = weight(tn, n_expert * n_ff, k_embd), weight(tn, n_expert * k_embd, n_ff)
            act, xh = buf(pairs * n_ff), buf(n_tok * k_embd)
            gemm.to_half(L, x, xh, n_tok * k_embd)
            gemm.moe_glu(L, wg, wg, n_ff * wg.row_bytes, n_ff, grp, xh, act, 0)
            gemm.moe_down(L, wd, k_embd * wd.row_bytes, k_embd, grp, act, buf(pairs), top_k, buf(pairs * k_embd), x,
                          buf(n_tok * gemm.down_col_tiles(k_embd)))
    for hd in flash_attn.HEAD_DIMS:
        n_head, n_kv, n_ctx = 16, 2, 4096
        assert flash_attn.ok(L, n_tok, hd, hd, n_head, n_kv)
        flash_attn.attention(L, buf(n_tok * n_head * hd), buf(n_kv * n_ctx * hd // 2), buf(n_kv * n_ctx * hd // 2),
                             buf(n_ctx), buf(n_tok), buf(n_tok), buf(n_tok), 7, buf(1), buf(n_tok * n_head * hd), n_tok,
                             n_head, n_kv, hd, n_ctx, 512, 0.1, 0.0)
    from reflex_runtime.gpu.ops import mla_flash

    n_head, n_ctx = 128, 4096
    assert mla_flash.ok(L, n_tok, mla_flash.R, mla_flash.D, rows=False)
    mla_flash.attention(L, buf(n_tok * n_head * mla_flash.D), buf(n_ctx * mla_flash.D // 2), buf(n_tok), buf(n_tok), 7,
                        buf(1), buf(n_tok * n_head * mla_flash.R), n_tok, n_head, 0.1, blocks=buf(n_ctx // 16))
    launched = {n for n, _, _ in dev.launches}
    wanted = {n for n in ptx_params if n.startswith(("reflex_gemm_", "reflex_moe_gemm_", "reflex_flash_attn_",
                                                     "reflex_mla_flash"))}
    assert wanted <= launched, wanted - launched


def test_prompt_kernel_shared_memory_sizes_match_the_kernels(tmp_path):
    """The launcher's dynamic shared-memory sizes are the kernels' own constants (a host program
    compiled by nvcc prints GemmSmem<T, C, XT>::BYTES, FaCfg<HD>::BYTES and MLF_BYTES; no GPU needed)."""
    from reflex_runtime.gpu.ops import mla_flash
    from reflex_runtime.gpu.ops.common import WEIGHT_TYPES

    nvcc = find_nvcc()
    src = tmp_path / "sizes.cu"
    src.write_text('#include "gemm.cu"\n#include "flash_attn.cu"\n#include "mla_flash.cu"\n#include <cstdio>\n'
                   '#define P(name, T) printf("%s %d %d %d %d\\n", #name, GemmSmem<T, GemmL, float>::BYTES, GemmSmem<T, GemmS, float>::BYTES, GemmSmem<T, GemmMoeW, __half>::BYTES, GemmSmem<T, GemmMoeN, __half>::BYTES);\n'
                   'int main() { RX_FOR_EACH_TYPE(P) '
                   + " ".join(f'printf("fa {hd} %d\\n", FaCfg<{hd}>::BYTES);' for hd in flash_attn.HEAD_DIMS)
                   + ' printf("mla %d 0\\n", MLF_BYTES); }\n')
    exe = tmp_path / "sizes"
    subprocess.run([nvcc, "-std=c++17", "-arch=compute_75", "-code=compute_75", "-I", os.path.join(ROOT, "kernels"),
                    "-o", str(exe), str(src)], check=True)
    lines = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")
    suffix_to_type = {v: k for k, v in WEIGHT_TYPES.items()}
    seen = 0
    for line in filter(None, lines):
        f = line.split()
        if f[0] == "fa":
            assert int(f[2]) == flash_attn.shared_bytes(int(f[1])), line
        elif f[0] == "mla":
            assert int(f[1]) == mla_flash.shared_bytes(), line
        else:
            tn = suffix_to_type[f[0]]
            assert tuple(map(int, f[1:5])) == tuple(gemm.shared_bytes(tn, c, 2 if c in "wn" else 4)
                                                    for c in ("l", "s", "w", "n")), line
        seen += 1
    assert seen == len(WEIGHT_TYPES) + len(flash_attn.HEAD_DIMS) + 1


@pytest.mark.parametrize("arch,flag", [("qwen35", "--fuse-qkv"), ("qwen35moe", "--fuse-gate-up-exps")])
def test_fused_qwen35_files_read_row_views_of_the_fused_tensors(ptx_params, arch, flag):
    """--fuse-qkv (attention layers' q|gate, k, v in one attn_qkv) and --fuse-gate-up-exps (per
    expert [gate | up] rows) run as views of the fused tensor: same launches as unfused files."""
    from fixtures.qwen35 import convert_variant
    from fixtures import make_fixture

    path = convert_variant(make_fixture(arch, "f32"), "f32", flag)
    dec, dev = _model(arch, ptx_params, path=path)
    c = dec.cfg
    dec.forward(1)
    dec.forward(70)  # tensor cores (and grouped experts)
    att = next(ly.mixer for ly in dec.layers if not c.extra["recurrent_layers"][dec.layers.index(ly)])
    if flag == "--fuse-qkv":
        w = att.w
        assert (w.q.rows, w.k.rows, w.v.rows) == (2 * c.n_head * c.head_dim, c.n_head_kv * c.head_dim,
                                                  c.n_head_kv * c.head_dim_v)
        assert w.k.ptr == w.q.ptr + w.q.rows * w.q.row_bytes and w.v.ptr == w.k.ptr + w.k.rows * w.k.row_bytes
    else:
        m = dec.layers[0].ffn.moe.w
        f = c.extra["n_ff_exp"][0]
        assert m.up.ptr == m.gate.ptr + f * m.gate.row_bytes and m.gate_up_stride == 2 * f * m.gate.row_bytes
        names = {n for n, _, _ in dev.launches}
        assert names & {"reflex_moe_mv_glu_f32", "reflex_mvs_glu_f32"} and names & {
            "reflex_moe_mm_f32", "reflex_moe_gemm_glu_f32", "reflex_moe_gemm_glu_f32_n"}


def test_moe_shapes_the_cuda_engine_refuses():
    from types import SimpleNamespace

    from reflex_runtime.gpu.moe import moe_unsupported

    def cfg(**kw):
        return SimpleNamespace(n_layers=2, extra=dict(dict(n_expert=128, n_expert_used=8, n_ff_exp=768), **kw))

    assert moe_unsupported(cfg()) is None  # Qwen3-30B-A3B
    assert "2048 experts" in moe_unsupported(cfg(n_expert=2048))
    assert "65 experts per token" in moe_unsupported(cfg(n_expert_used=65))
    assert "multiple of 32" in moe_unsupported(cfg(n_ff_exp=100))

    class File:  # a GGUF whose layer 1 stores gate and up experts in different types
        def tensor(self, name):
            return SimpleNamespace(type_name="Q6_K" if name == "blk.1.ffn_up_exps.weight" else "Q4_K")

    assert "layer 1 stores its expert gate as Q4_K and up as Q6_K" in moe_unsupported(cfg(), File())


def test_every_kernel_waits_for_its_predecessor_first():
    """The decode graph chains kernels as programmatic dependent launches: a kernel may start
    while the previous one runs, so each must call rx_pdl_begin() before touching memory."""
    checked = declared = early = 0
    for path in sorted(glob.glob(os.path.join(ROOT, "kernels", "*.cu"))):
        src = open(path).read()
        declared += src.count("__global__")
        for m in re.finditer(r"__global__[^{]*?\b(reflex_\w+)[^{]*\{", src):
            body = src[m.end():m.end() + 200].lstrip(" \\\n")
            # the exception (common.cuh): kernels that copy weights (or, where they say why, older
            # launches' outputs) before they wait start with the marker and wait in their body
            if body.startswith("rx_pdl_weights_first();"):
                import build_kernels

                early += 1  # it waits in its body: this file or a header it includes
                assert any("rx_pdl_begin();" in open(f).read() for f in [path] + build_kernels.headers_of(path)), path
            else:
                assert body.startswith("rx_pdl_begin();"), f"{os.path.basename(path)}: {m.group(1)} does not start with rx_pdl_begin()"
            checked += 1
    assert checked == declared > 20, (checked, declared)
    assert early > 0


def test_no_runtime_compilation_in_the_package():
    """Nothing in the runtime package may compile code at run time: no NVRTC or nvJitLink
    import, no driver JIT linking; the fatbin is loaded with plain cuModuleLoadData."""
    pkg = os.path.join(ROOT, "reflex_runtime")
    banned = re.compile(r"^\s*(from|import)\s+[\w.]*(nvrtc|nvjitlink|nvvm)|cuLink\w*\(|cuModuleLoadDataEx|cuLibraryLoad",
                        re.M | re.I)
    checked = 0
    for dirpath, _, files in os.walk(pkg):
        for f in files:
            if f.endswith(".py"):
                text = open(os.path.join(dirpath, f)).read()
                assert not banned.search(text), f"{f}: {banned.search(text).group(0)}"
                checked += 1
    assert checked > 10


@pytest.mark.parametrize("smem", [(232448, 233472), (166912, 167936), (101376, 102400), (65536, 65536)],
                         ids=["sm90", "sm80", "sm86", "sm75"])
def test_decode_kernels_plan_real_shapes(ptx_params, smem):
    """The one-token kernels at Qwen3-0.6B, Gemma 3 270M and Qwen3-30B-A3B shapes, on devices with
    less shared memory: every launch fits the device (FakeKernel checks sizes, grids, shared memory)
    and none falls back to a legacy kernel."""
    from reflex_runtime.gpu.launch import Launcher
    from reflex_runtime.gpu.ops.common import Weight
    from reflex_runtime.gpu.ops.sample import RxState

    dev = FakeDevice(ptx_params)
    dev.max_shared, dev.smem_per_sm = smem
    L = Launcher(dev, stream=None)
    L.pdl = True
    layout = {"Q8_0": (32, 34), "Q4_K": (256, 144), "Q6_K": (256, 210), "F32": (1, 4), "F16": (1, 2)}

    def w(t, rows, k):
        bs, ts = layout[t]
        return Weight(dev.alloc(rows * k // bs * ts), t, rows, k, k // bs * ts)

    buf = dev.alloc(64 << 20)
    st = RxState(*[buf] * 6)
    for t in ("Q8_0", "Q4_K", "Q6_K"):
        for e, qkv, ff, o_k in ((1024, (2048, 1024, 1024), 3072, 2048), (640, (1024, 256, 256), 2048, 1024),
                                (2048, (4096, 512, 512), 6144, 4096)):
            products.segments(L, [w(t, r, e) for r in qkv], buf, [buf] * 3, 1, norm_w=buf, eps=1e-6)
            products.segments(L, [w(t, r, e) if i < 2 else w("Q6_K", r, e) for i, r in enumerate(qkv)], buf,
                              [buf] * 3, 1)
            products.gated_ffn_in(L, w(t, ff, e), w(t, ff, e), buf, buf, 1, 0, 0, 0, norm_w=buf, eps=1e-6)
            products.matmul(L, w(t, e, o_k), buf, buf, 1, accumulate=True)
            products.matmul(L, w(t, e, ff), buf, buf, 1, accumulate=True)
            assert mvs.head(L, w(t, 151936, e), buf, buf, buf, 1e-6, (buf, buf, buf, st, 0))
        gate, up, down = w(t, 128 * 768, 2048), w(t, 128 * 768, 2048), w(t, 128 * 2048, 768)
        assert moe_decode.router_topk(L, w("F32", 128, 2048), buf, buf, 1e-6, buf, 8, True, buf, buf, buf)
        assert moe_decode.router_topk(L, w("F32", 256, 2048), buf, buf, 1e-6, buf, 8, True, buf, buf, buf,
                                      also=[(w("F32", 1, 2048), buf)])  # Qwen3.5's shared-expert gate
        assert not moe_decode.router_topk(L, w("F32", 128, 2048), buf, buf, 1e-6, buf, 8, True, buf, buf, buf,
                                          also=[(w("F16", 1, 2048), buf)])  # another type: two launches
        assert mvs.expert_glu(L, gate, up, 768 * gate.row_bytes, buf, 8, buf, buf, 768, 0, buf, 1e-6)
        assert moe_decode.down(L, down, 2048 * down.row_bytes, buf, buf, 8, buf, buf, 2048, early=True)
    assert L.attn_tc and L.attn_tc_from == 4608  # on from 4,608 keys: faster there on an H100 (s37)
    L.attn_tc = True  # REFLEX_ATTN_TC=1
    for n_head, n_kv, hd in ((16, 8, 128), (4, 1, 256), (32, 4, 128), (8, 1, 64), (9, 3, 64), (16, 4, 128)):
        fits = not (hd == 256 and smem[0] < 80 * 1024)  # sm_75: 256-wide heads (78 KB of tiles) stay legacy
        n_before = len(dev.launches)
        assert attn_decode.attention(L, *([buf] * 11), n_head, n_kv, hd, hd, 8192, 0, 0.1, 0.0, True) == fits
        assert attn_decode.splits(L, n_kv) <= attn_decode.SPLITS_MAX
        # the instantiation for the group: heads <= 128 wide on tensor cores, 2 -> _t2, 3 or 4 -> _t4,
        # 8 -> _t8; wider ones the tile loop with registers for it, 2 -> _g2, 3 or 4 -> _g4, 8 -> the general one
        tile = {2: "_g2", 3: "_g4", 4: "_g4"}.get(n_head // n_kv, "")
        want = {2: "_t2", 3: "_t4", 4: "_t4", 8: "_t8"}[n_head // n_kv] if hd <= 128 else tile
        assert not fits or dev.launches[n_before][0] == "reflex_attn_decode" + want
        assert attn_decode.kernel(L, n_head // n_kv, hd, hd) == "reflex_attn_decode" + want
        L.attn_tc = False  # REFLEX_ATTN_TC=0: the tile loop for every group
        assert attn_decode.kernel(L, n_head // n_kv, hd, hd) == "reflex_attn_decode" + tile
        L.attn_tc = True
    assert attn_decode.kernel(L, 2, 128, 256) == "reflex_attn_decode_g2"  # values wider than the tensor-core kernels hold
    assert attn_decode.kernel(L, 16, 128, 128) == "reflex_attn_decode"  # a group past 8
    L.attn_tc = L.attn_group_kernels = False  # and REFLEX_ATTN_GROUP_KERNELS=0: the general kernel for every group
    assert attn_decode.kernel(L, 2, 128, 128) == attn_decode.kernel(L, 16) == "reflex_attn_decode"
    L.attn_tc = L.attn_group_kernels = True
    # blocks sharing a KV head's query heads: whole divisors of the group, the grid's x times them
    for want, group in ((1, 1), (2, 2), (4, 8), (3, 3), (3, 6)):
        L.attn_head_groups = 4
        assert attn_decode.head_groups(L, group) == want
        n_before = len(dev.launches)
        assert attn_decode.attention(L, *([buf] * 11), 4 * group, 4, 128, 128, 8192, 0, 0.1, 0.0, True)
        name, grid, _ = dev.launches[n_before]
        assert name == attn_decode.kernel(L, group, 128, 128) and grid[0] == 4 * want
    L.attn_head_groups = 1
    names = {n for n, _, _ in dev.launches}
    assert not any(n.startswith(("reflex_mv_", "reflex_moe_mv_", "reflex_attn_")) or n == "reflex_attn" for n in names
                   if n not in ATD), names
    assert "reflex_mvs_mixed" in names


class _AllowAll:
    """A grammar constraint that allows every token (what matters here is the launches)."""

    def __init__(self):
        self.accepted = []

    def fill_mask(self, ptr, nbytes):
        ctypes.memset(ptr, 0xFF, nbytes)
        return True

    def accept(self, tok):
        self.accepted.append(tok)


def _fake_runner(ptx_params, max_context=128, max_seqs=1, arch="qwen3", kv_tokens=None):
    from reflex_runtime.measure.coldstart import Timeline
    from reflex_runtime.families import gpu_model_class, read_config
    from reflex_runtime.modelfile.gguf_file import GGUFFile
    from reflex_runtime.gpu.runner import CudaRunner

    g = GGUFFile(_fixture_file(arch))
    cfg = read_config(g)
    dev = FakeDevice(ptx_params)
    runner = CudaRunner.start(FakeBoot(dev), g, cfg, Timeline(), gpu_model_class(cfg), max_context=max_context,
                              max_seqs=max_seqs, kv_tokens=kv_tokens)
    runner.wait_ready()
    return runner, dev


def test_the_kv_pool_takes_what_fits_in_free_memory(ptx_params):
    """The paged KV cache's pool is sized at load: room for every sequence at the full context
    when that fits in the GPU's free memory; less, with a notice, when it does not (the sequences
    stay: a request waits for room), never less than one sequence; a pool the user sized
    (--kv-tokens), or a model that fits with none, is a DoesNotFit naming the sizes, raised by
    the loader even on `auto` (the CPU is no answer to a setting), before anything is allocated."""
    from reflex_runtime.errors import DoesNotFit
    from reflex_runtime.families import gpu_model_class, read_config
    from reflex_runtime.gpu.runner import FIT_HEADROOM, CudaRunner
    from reflex_runtime.kvpool import KV_BLOCK
    from reflex_runtime.loader import load_engine
    from reflex_runtime.measure.coldstart import Timeline
    from reflex_runtime.modelfile.gguf_file import GGUFFile

    path = _fixture_file("qwen3")
    g = GGUFFile(path)
    cfg = read_config(g)
    plan = CudaRunner(None, g, cfg, Timeline(), gpu_model_class(cfg), max_context=120)._plan
    full = plan(16)
    assert full.range_slots == 128 and full.pool_blocks == (9, 16 * 8)  # 120 slots -> 8 blocks; range 0, a spare
    arena = {n: plan(16, n * 128).arena_bytes for n in (1, 4, 5)}
    assert arena[1] < arena[4] < arena[5] < full.arena_bytes
    assert plan(16, 1).pool_blocks[1] == 8  # never less than one sequence's context
    total = 8 << 30
    from reflex_runtime.engine import Limits

    lim = Limits()  # room kept for a system1 call's logits at the default limits
    system1 = 4 * lim.max_candidates * lim.max_candidate_tokens * cfg.vocab_size
    free = arena[4] + FIT_HEADROOM + total // 100 + system1 + (arena[5] - arena[4]) // 2  # 4 x 128 fit, 5 not

    def start(kv_tokens=None, free=free):
        dev = FakeDevice(ptx_params)
        dev.mem_info = lambda: (free, total)
        r = CudaRunner.start(FakeBoot(dev), g, cfg, Timeline(), gpu_model_class(cfg), max_context=120,
                             max_seqs=16, kv_tokens=kv_tokens)
        return r, dev

    runner, dev = start()
    runner.wait_ready()
    tokens = runner.model.pool_blocks[1] * KV_BLOCK
    assert runner.max_seqs == 16 and 4 * 128 <= tokens < 5 * 128 and runner.model.arena_bytes <= arena[5]
    assert dev._ranges[0][1] - dev._ranges[0][0] == runner.model.arena_bytes  # the one arena allocation, fitted
    assert runner.fit_note.startswith(f"the KV cache holds {tokens} tokens for up to 16 sequences of up to 120")
    runner, dev = start(kv_tokens=200)  # a pool asked for that fits: as asked, in whole blocks
    runner.wait_ready()
    assert runner.model.pool_blocks[1] == 13 and runner.fit_note is None
    runner, dev = start(kv_tokens=10**6, free=total)  # more than 16 sequences could use: what they can
    runner.wait_ready()
    assert runner.model.pool_blocks[1] == 16 * 8
    assert runner.fit_note.startswith("the KV cache holds 2048 tokens, not --kv-tokens 1000000")

    runner, dev = start(kv_tokens=16 * 128, free=full.arena_bytes - 4096)  # --kv-tokens given: not lowered
    with pytest.raises(DoesNotFit, match=r"a KV cache of 2048 tokens.*lower --kv-tokens"):
        runner.wait_ready()
    assert not dev._ranges
    runner, dev = start(free=arena[1] // 2)  # not even one sequence: what one needs, and --ctx
    with pytest.raises(DoesNotFit, match=r"caches for one sequence of 120 tokens.*lower --ctx / REFLEX_CTX$"):
        runner.wait_ready()

    small = FakeDevice(ptx_params)
    small.mem_info = lambda: (arena[1] // 2, total)
    with pytest.raises(DoesNotFit):
        load_engine(str(path), "auto", device=FakeBoot(small), max_seqs=16)


@pytest.mark.parametrize("arch", ["qwen3", "qwen35", "qwen35moe", "deepseek_v2lite", "deepseek_v3"])
def test_batch_api_on_the_fake_device(ptx_params, arch, monkeypatch):
    """gpu/batch.py's host side on the fake device (read-backs bring token 0, graph replays do
    nothing): prompts in chunks beside running decodes, a sequence joining and a hooked one
    decoding alone, each getting exactly max_new tokens; a stop id ends one at once and a closed
    sequence's range is reused; every pack matches the PTX, the decode attention runs one grid
    z per row and each row count gets its own graph. Qwen3.5 has a state slot per range and its
    decode rows' DeltaNet launches one sequence per row; DeepSeek's latent attention one grid x
    per row. The paged cache: every cache kernel gets the block table (offset to a prompt
    chunk's range), an open maps its range's first blocks to blocks of its own, a close points
    them at the spare block and gives them back, and a full pool is NoRoom."""
    from reflex_runtime.errors import NoRoom
    from reflex_runtime.gpu.step import Pick
    from reflex_runtime.kvpool import KV_BLOCK
    from reflex_runtime.sampling import SamplingParams

    runner, dev = _fake_runner(ptx_params, max_context=64, max_seqs=4, arch=arch, kv_tokens=200)
    assert runner.max_seqs == 4
    if arch.startswith("qwen35"):
        m = runner.model
        assert m.arena.sizes["dn_state"] >= 5 * m.slot_bytes > 0  # slot 0: the runner's own
    with pytest.raises(RequestError, match="exceed the context of 64"):
        runner.batch_open(list(range(60)), Pick(), 5, frozenset())
    want, got = {}, {}

    def open_(prompt, pick, n):
        sid = runner.batch_open(prompt, pick, n, frozenset())
        want[sid], got[sid] = n, []
        return sid

    def step(prefill, decode):
        for sid, toks in runner.batch_step(prefill, decode).items():
            got[sid] += toks

    a = open_([1, 2, 3, 4, 5, 6, 7], Pick(), 5)
    b = open_([1, 2], Pick(SamplingParams(0.7, seed=3)), 6)
    n_fwd = runner.forward_passes
    step([(a, 4), (b, 2)], [])
    assert got == {a: [], b: [0]}  # a's prompt is half done; b's first token came with its prompt
    # attention-only families run both chunks as one forward, each token's keys from its range
    packed = ("htod", runner.model.p("seg_lo") + 4 * runner._batch.X, 4 * 6) in dev.copies
    assert packed == (arch == "qwen3") and runner.forward_passes - n_fwd == (1 if packed else 2)
    step([(a, 3)], [b])
    assert len(got[a]) == 1 and len(got[b]) >= 2
    c = open_([9, 9], Pick(SamplingParams(), constraint=_AllowAll()), 3)  # hooked: one token a step
    step([(c, 2)], [a, b])
    for _ in range(20):
        live = [s for s in got if 0 < len(got[s]) < want[s]]
        if not live:
            break
        step([], live)
    assert {s: len(t) for s, t in got.items()} == want and all(t == 0 for ts in got.values() for t in ts)
    m, bt = runner.model, runner._batch
    table = m.p("kv_blocks")
    assert m.paged and m.range_slots == 64 and bt.pool.n == 13  # 200 tokens in blocks of 16
    cache_kernels = {"reflex_qk_rope_store", "reflex_flash_attn_128", "reflex_attn", "reflex_mla_rope_store",
                     "reflex_mla_attn"} | ATD
    for (n, _, _), last in zip(dev.launches, dev.last_args):  # the table (from a prompt chunk's range's entries)
        if n in cache_kernels:
            assert table <= last.value < table + 4 * 5 * 4 and (last.value - table) % 16 == 0, n
    held = [bt.seqs[s].blocks for s in (a, b, c)]  # prompt + max_tokens each: 12, 8, 5 slots -> one block
    assert [len(x) for x in held] == [1, 1, 1] and len({x[0] for x in held}) == 3
    assert all(runner.model.pool_blocks[0] <= x[0] for x in held)
    maps = [cp for cp in dev.copies if cp[0] == "htod" and table <= cp[1] < table + 4 * 20]
    assert [cp[1:] for cp in maps[-3:]] == [(table + 4 * (s + 1) * 4, 4) for s in (a, b, c)]
    free_before = bt.pool.free_tokens
    name, axis = {"qwen3": ("reflex_attn_decode", 2), "deepseek_v2lite": ("reflex_mla_attn", 0),
                  "deepseek_v3": ("reflex_mla_attn", 0)}.get(arch, ("reflex_dn_recurrent", 1))
    # the single-row graph and the two-row one (a hooked row decodes alone)
    assert {1, 2} <= {g[axis] for n, g, _ in dev.launches if n == name or name in ATD and n in ATD}, name
    assert "reflex_pick_rows" in {n for n, _, _ in dev.launches}
    for s in (a, b, c):
        runner.batch_close(s)
    assert bt.pool.free_tokens == free_before + 3 * KV_BLOCK == bt.pool.tokens
    with pytest.raises(NoRoom):  # 13 blocks: 3 sequences of 60 tokens (4 blocks each), not 4
        for _ in range(4):
            got[runner.batch_open([1] * 10, Pick(), 50, frozenset())] = []
    for s in [s for s in bt.seqs]:
        runner.batch_close(s)
        got.pop(s)
    assert bt.pool.free_tokens == bt.pool.tokens
    # system1 between steps runs in the runner's own range and state rows: the decode rows of an
    # unchanged batch are written again before its next step
    e, f = open_([3, 4], Pick(), 20), open_([5], Pick(), 20)
    step([(e, 2), (f, 1)], [])
    step([], [e, f])
    seg_lo, n_copies = runner.model.p("seg_lo"), len(dev.copies)
    step([], [e, f])
    assert not any(c[:2] == ("htod", seg_lo) for c in dev.copies[n_copies:])
    assert len(runner.score([1, 2, 3], [[4], [5, 6]])) == 2
    step([], [e, f])
    assert ("htod", seg_lo, 8) in dev.copies[n_copies:]
    # system1 in a step (the scheduler's way): a sequence of its own range and blocks, its tree
    # after the decode rows; the rows are not written again and the draw counter is left alone
    step([], [e, f])
    free_before, n_copies = bt.pool.free_tokens, len(dev.copies)
    s1 = runner.batch_open_score([1, 2, 3], [[4], [5, 6]])
    assert bt.pool.free_tokens == free_before - KV_BLOCK and s1 not in (e, f)
    out = runner.batch_step([], [e, f], score=[s1])
    assert len(out[s1]) == 2 and [len(x) for x in out[s1]] == [1, 2] and len(out[e]) >= 1
    new = dev.copies[n_copies:]
    assert not any(c[1] in (seg_lo, m.p("step")) for c in new if c[0] == "htod")
    n_first = 6 if m.scoring == "tree" else 3  # the tree after the rows; forked: the prompt first
    assert ("htod", m.p("tokens") + 4 * bt.X, 4 * n_first) in new
    runner.batch_close(s1)
    assert bt.pool.free_tokens == free_before
    with pytest.raises(RequestError, match="exceed the context of 64"):
        runner.batch_open_score(list(range(60)), [[1, 2, 3, 4, 5]])
    for s in (e, f):
        runner.batch_close(s)
    d = runner.batch_open([1], Pick(), 5, frozenset({0}))
    assert d in (a, b, c, e, f)  # a freed range
    assert runner.batch_step([(d, 1)], []) == {d: [0]}  # the stop id ends it with its first token
    runner.batch_close(d)


def _fused_dataflow(b) -> tuple[list, dict]:
    """Run a fused program (gpu/fused.py _Builder's ops) on symbols: each matrix op's input as a
    formula of what it reads (n(...): an RMS norm, w<ptr>: a weight vector), and every buffer's last
    formula, as kernels/fused_step.cu computes them (FS_NORM: rx_rmsnorm_row; FsMv.post_*: fs_post_x)."""
    mem: dict[int, str] = {}
    val = lambda p: mem.get(p, f"init@{p:x}")  # noqa: E731
    inputs = []
    for op, role in zip(b.ops, b.roles):
        if op.kind == FUSED_OPS["embed"]:
            mem[op.u.embed.out] = "emb"
        elif op.kind == FUSED_OPS["attn"]:
            a = op.u.attn.a
            mem[a.out] = f"attn({val(a.q)},{val(a.rope.k)},{val(a.rope.v)})"
        elif op.kind == FUSED_OPS["norm"]:
            f = op.u.norm
            mem[f.resid] = r = f"({val(f.resid)}+n({val(f.src)})*w{f.w_src:x})"
            if f.out:
                mem[f.out] = f"n({r})*w{f.w_out:x}"
        else:
            m = op.u.mv
            if m.post_src:
                mem[m.post_resid_out] = r = f"({val(m.post_resid)}+n({val(m.post_src)})*w{m.post_w_src:x})"
                x = f"n({r})*w{m.norm_w:x}" if m.norm_w else r
            else:
                x = f"n({val(m.x)})*w{m.norm_w:x}" if m.norm_w else val(m.x)
            for i in range(1 if op.kind == FUSED_OPS["glu"] else m.n_w):
                y = f"{role}[{m.w[i]:x}]({x})"
                mem[m.y[i]] = f"({val(m.y[i])}+{y})" if m.accumulate else y
            inputs.append((role, x))
    return inputs, mem


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_fused_fold_computes_what_the_norm_ops_did(ptx_params, tmp_path, layers):
    """Gemma's post-norms folded into the matrix op after each (Launcher.fused_fold_norms): run on
    symbols, both programs give every matrix op the same input, the head the same logits and the
    residual the same final value in x as the program with its norm ops, whatever the layer count
    (the residual alternates between x and h)."""
    from reflex_runtime.gpu import fused
    from reflex_runtime.gpu.ops.sample import RxState

    dec, _ = _model("gemma3", ptx_params, str(tmp_path), num_hidden_layers=layers)
    st = RxState(*[dec.p(n) for n in ("tokens", "pos", "slot", "n_kv", "step", "out_tokens")])
    for greedy in (True, False):
        runs = []
        for fold in (False, True):
            dec.launch.fused_fold_norms = fold
            b = fused._Builder(dec, 132, 64 * 1024)
            b.embed()
            b.layers()
            b.head(st, greedy)
            runs.append(_fused_dataflow(b))
        (plain, m0), (folded, m1) = runs
        assert plain == folded and len(folded) == 4 * layers + 1
        assert m0[dec.p("logits")] == m1[dec.p("logits")] and m0[dec.p("x")] == m1[dec.p("x")]
        assert "init@" not in m1[dec.p("logits")]


def test_fused_step_rebuilt_when_its_knobs_change(ptx_params):
    """bench_knobs switches the launcher's knobs between graphs (reset_graphs): the fused step's
    program and flags follow them, not the first build's."""
    from reflex_runtime.gpu.ops import fused_step as fs
    from reflex_runtime.sampling import SamplingParams

    runner, dev = _fake_runner(ptx_params)
    L = runner.launch
    L.fused_step = True
    seen = []
    for early, ahead, attn in [(False, False, False), (True, False, False), (True, True, False), (False, True, True)]:
        L.fused_x_early, L.fused_lookahead, L.fused_attn_early = early, ahead, attn
        runner.reset_graphs()
        list(runner.generate_ids([1, 2, 3], SamplingParams(), 2, frozenset()))
        seen.append(runner._fused.flags)
        assert [n for n, _, _ in dev.launches].count("reflex_fused_step") >= 1
    assert seen == [0, fs.X_EARLY, fs.X_EARLY | fs.LOOKAHEAD, fs.LOOKAHEAD | fs.ATTN_EARLY]


@pytest.mark.parametrize("fused", [False, True], ids=["kernel_per_op", "fused_step"])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_plain_generation_queues_the_step_graph_ahead(ptx_params, temperature, fused):
    """CudaRunner.decode's plain path on the fake device (whose read-backs bring zeros): the
    prompt's forward and pick, the step graph captured once (forward + pick, fused into the LM
    head when greedy) and replayed, one token read back per generated token, no host hooks."""
    from reflex_runtime.gpu.runner import AHEAD
    from reflex_runtime.sampling import SamplingParams

    runner, dev = _fake_runner(ptx_params)
    runner.launch.fused_step = fused  # (off by default: REFLEX_FUSED_STEP=1)
    tokens = runner.model.p("tokens")
    out = list(runner.generate_ids([1, 2, 3], SamplingParams(temperature, seed=1), 6, frozenset()))
    assert out == [0] * 6
    assert [c for c in dev.copies if c[0] == "dtoh" and c[1] == tokens] == [("dtoh", tokens, 4)] * 6
    names = [n for n, _, _ in dev.launches]
    assert not any(n.startswith(("reflex_logit_stats", "reflex_mask_logits", "reflex_token_logit")) for n in names)
    # one step captured: a kernel per op, or the whole step one kernel (gpu/fused.py), its pick inside when greedy
    if fused:
        assert names.count("reflex_fused_step") == 1 and not ATD & set(names)
    else:
        assert "reflex_fused_step" not in names and sum(n in ATD for n in names) == runner.config.n_layers
    if temperature:  # the prompt's pick and the graph's: the sampler reads its settings from the device
        assert names.count("reflex_sample") == 2
    else:  # the prompt's argmax; the graph's pick is fused into the LM head (mvs.cu, or the fused step's)
        assert names.count("reflex_argmax_final") == 1 and "reflex_sample" not in names
    assert AHEAD >= 1 and len(runner.info()) > 0
    # a stop id ends it at once; a step of two sequences is refused (batching is issue 32)
    assert list(runner.generate_ids([1, 2], SamplingParams(), 6, frozenset({0}))) == [0]
    from reflex_runtime.gpu.step import Pick, Seq, Step

    with pytest.raises(ValueError, match="issue 32"):
        list(runner.decode(Step.of(Seq.prompt([1], pick=Pick()), Seq.prompt([2], pick=Pick())), 2, frozenset()))


@pytest.mark.parametrize("hooked", [False, True], ids=["graph", "logprobs"])
def test_a_long_context_takes_its_own_decode_graph(ptx_params, hooked):
    """REFLEX_ATTN_TC=1: a decode step over at least REFLEX_ATTN_TC_FROM keys replays a graph with
    the tensor-core attention in it, a shorter one a graph with the tile kernels (faster there:
    s36); each captured once, whichever way the tokens are picked; off, one graph for all."""
    from reflex_runtime.sampling import SamplingParams

    runner, dev = _fake_runner(ptx_params)
    L = runner.launch
    L.attn_tc, L.attn_tc_from = True, 8
    lp = {"logprobs": 1} if hooked else {}
    n0 = len(dev.launches)
    list(runner.generate_ids([1, 2, 3, 4, 5], SamplingParams(), 8, frozenset(), **lp))  # steps over 6 .. 12 keys
    atd = [n for n, _, _ in dev.launches[n0:] if n in ATD]
    tc = [n for n in atd if n.startswith("reflex_attn_decode_t")]
    n_layers = runner.config.n_layers
    assert len(atd) == 2 * n_layers and len(tc) == n_layers, atd  # two captures: short, then long
    assert atd.index(tc[0]) == n_layers  # the short graph first
    assert sorted(k[2] for k in runner._graphs) == [False, True]
    list(runner.generate_ids([1, 2, 3, 4, 5, 6, 7, 8, 9], SamplingParams(), 3, frozenset(), **lp))  # long at once
    assert len([n for n, _, _ in dev.launches[n0:] if n in ATD]) == 2 * n_layers  # nothing captured again
    with L.attn_context(7):  # the same rule for a benchmark's recorded step
        assert not L.attn_tc_for(7) and L.attn_short
    assert L.attn_tc_for(8) and L.attn_tc_for(None) and not L.attn_short
    L.attn_tc = False
    runner.reset_graphs()
    n1 = len(dev.launches)
    list(runner.generate_ids([1, 2, 3, 4, 5], SamplingParams(), 8, frozenset(), **lp))
    assert not any(n.startswith("reflex_attn_decode_t") for n, _, _ in dev.launches[n1:])
    assert len(runner._graphs) == 1


def test_a_batch_takes_the_long_context_graph_by_its_longest_row(ptx_params):
    """The batcher's graphs (one row, several rows) follow the same rule, by the longest row's keys."""
    from reflex_runtime.gpu.step import Pick

    runner, dev = _fake_runner(ptx_params, max_context=64, max_seqs=2)
    L = runner.launch
    L.attn_tc, L.attn_tc_from = True, 8
    a = runner.batch_open([1, 2, 3], Pick(), 8, frozenset())
    b = runner.batch_open([4, 5], Pick(), 3, frozenset())
    got = {a: [], b: []}
    for sid, toks in runner.batch_step([(a, 3), (b, 2)], []).items():
        got[sid] += toks
    while len(got[a]) < 8:
        live = [s for s, n in ((a, 8), (b, 3)) if len(got[s]) < n]
        for sid, toks in runner.batch_step([], live).items():
            got[sid] += toks
    kinds = {(k[0], k[2]) for k in runner._graphs}
    assert ("rows2", True) in kinds and ("row1-greedy", False) in kinds, kinds  # b leaves at 5 keys, a goes on
    names = [n for n, _, _ in dev.launches if n in ATD]
    assert any(n.startswith("reflex_attn_decode_t") for n in names) and any(n.startswith("reflex_attn_decode_g") for n in names)


def test_hooked_and_forced_one_token_steps_follow_the_same_rule(ptx_params, monkeypatch):
    """The batcher's hooked sequence (logprobs: one eager token a step) and decode_logits' forced
    tokens launch the tile kernels under REFLEX_ATTN_TC_FROM keys, the tensor-core ones from it."""
    from reflex_runtime.gpu.step import Pick

    runner, dev = _fake_runner(ptx_params, max_context=64, max_seqs=2)
    L = runner.launch
    L.attn_tc, L.attn_tc_from = True, 8
    a = runner.batch_open([1, 2, 3], Pick(logprobs=1), 8, frozenset())
    n0, got = len(dev.launches), []
    for toks in runner.batch_step([(a, 3)], []).values():
        got += toks
    while len(got) < 8:
        for toks in runner.batch_step([], [a]).values():
            got += toks
    def tc_by_step(since):  # each one-token step's first decode attention (the prompt's is not ATD)
        atd = [n for n, _, _ in dev.launches[since:] if n in ATD]
        return [n.startswith("reflex_attn_decode_t") for n in atd[:: runner.config.n_layers]]

    assert tc_by_step(n0) == [False] * 4 + [True] * 3  # steps over 4 .. 10 keys
    n1 = len(dev.launches)
    monkeypatch.setattr(runner, "_fetch", lambda ptr, shape, np: np.zeros(shape, np.float32))  # no device to read
    runner.decode_logits([1, 2, 3, 4, 5], [6, 7, 8, 9])  # forced tokens over 6 .. 9 keys
    assert tc_by_step(n1) == [False, False, True, True]


def test_the_prefill_stops_at_the_deadline_between_chunks(ptx_params, monkeypatch):
    """CudaRunner takes the engine's deadline: checked before each MAX_BATCH-token chunk of the
    prompt, after the previous one has finished on the device (RequestTimeout); none: no waits."""
    from reflex_runtime.errors import RequestTimeout
    from reflex_runtime.gpu import runner as runner_module
    from reflex_runtime.gpu.runner import MAX_BATCH
    from reflex_runtime.sampling import SamplingParams

    runner, dev = _fake_runner(ptx_params, max_context=4 * MAX_BATCH)
    assert runner.checks_deadline
    ids = [(7 * i + 11) % 1000 + 1 for i in range(2 * MAX_BATCH + 5)]  # three chunks
    syncs = []
    monkeypatch.setattr(dev, "sync", lambda stream: syncs.append(runner.forward_passes))
    clock = iter([0.0, 10.0])  # the first check passes, the second (after one chunk) does not
    monkeypatch.setattr(runner_module.time, "perf_counter", lambda: next(clock))
    with pytest.raises(RequestTimeout, match=f"after {MAX_BATCH} of {len(ids)} prompt tokens"):
        list(runner.generate_ids(ids, SamplingParams(), 2, frozenset(), deadline=5.0))
    assert runner.forward_passes == 1 and syncs[0] == 1  # waited for the first chunk before the check
    monkeypatch.undo()
    passes, syncs = runner.forward_passes, []
    monkeypatch.setattr(dev, "sync", lambda stream: syncs.append(runner.forward_passes))
    assert len(list(runner.generate_ids(ids, SamplingParams(), 2, frozenset()))) == 2
    assert runner.forward_passes == passes + 3 and syncs == [passes + 3]  # no deadline: no waits until the end


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the fake device's copies bring back zeros
def test_logprobs_and_grammar_generation_launches_match_abi(ptx_params):
    """CudaRunner's decode loop with pick hooks (gpu/constrained.py) on the fake device: every
    launch matches its kernel, every copy stays inside its buffers, one token per step, the mask
    before the pick."""
    from reflex_runtime.sampling import Sampled, SamplingParams

    runner, dev = _fake_runner(ptx_params)
    c = _AllowAll()
    out = list(runner.generate_ids([1, 2, 3], SamplingParams(0.7, seed=1), 4, frozenset(), logprobs=3, constraint=c))
    assert len(out) == 4 and all(isinstance(s, Sampled) and len(s.top_ids) <= 3 for s in out)
    assert len(c.accepted) == 4
    names = [n for n, _, _ in dev.launches]
    assert names.count("reflex_logit_stats") == names.count("reflex_mask_logits") == 4
    assert names.count("reflex_sample") == names.count("reflex_token_logit") == 4
    first_mask = names.index("reflex_mask_logits")
    assert names.index("reflex_logit_stats") < first_mask < names.index("reflex_sample")  # stats see raw logits


def test_step_breakdown_times_every_role_on_the_fake_device(ptx_params):
    """reflex bench's role-by-role step (commands/bench.py step_breakdown -> role_times): every
    role of a decode step gets a row (the fake device's clock reads 0), the state-advancing pick
    only while its replays fit the context."""
    from reflex_runtime.commands.bench import attention_by_context, role_times, step_breakdown

    runner, _ = _fake_runner(ptx_params)
    rows = step_breakdown(runner, context=8, repeats=2)
    roles = {r["role"] for r in rows}
    assert {"qkv", "attn output"} <= roles and all(r["launches"] >= 1 and r["us"] == 0 for r in rows)
    # the attention alone at a few contexts (one launch a layer, the rope fused in), past the context: skipped
    by_ctx = attention_by_context(runner, (4, 16, runner.model.max_new), repeats=2)
    assert [r["context"] for r in by_ctx] == [4, 16, runner.model.max_new]
    assert all(r["role"].startswith("attention") and r["launches"] == runner.config.n_layers for r in by_ctx[:2])
    assert "skipped" in by_ctx[2]
    launches = runner.decode_step_launches(8)
    assert any("argmax" in r["role"] or r["role"].startswith("pick") for r in role_times(runner, launches, 2, 100))
    assert not any("argmax" in r["role"] or r["role"].startswith("pick") for r in role_times(runner, launches, 2, 1))
    # the prompt's roles (bench --prefill-breakdown): the prefill's own kernels, the pick left out
    prompt = role_times(runner, runner.prefill_launches(24), 2, max_replays=0)
    assert {"qkv", "attn output"} <= {r["role"] for r in prompt}
    assert not any("argmax" in r["role"] or r["role"].startswith("pick") for r in prompt)


def _route_to_1_and_3(runner, dev, monkeypatch):
    """The fake device's read-back of the routed ids says experts 1 and 3 (each read's count
    into `asked`); captures records, for each graph captured, whether every expert was resident;
    the background upload is held back until the returned release() is called."""
    ws, ids_ptr, fake_dtoh, asked, captures = runner._weights, runner.model.p("moe_ids"), dev.dtoh, [], []

    def dtoh(dst, src, n, stream):
        fake_dtoh(dst, src, n, stream)
        if src == ids_ptr:
            ids = (ctypes.c_int * (n // 4)).from_address(dst)
            for j in range(n // 4):
                ids[j] = (1, 3)[j % 2]
            asked.append(n // 4)

    begin, release = dev.begin_capture, ws.release
    monkeypatch.setattr(dev, "dtoh", dtoh)
    monkeypatch.setattr(dev, "begin_capture", lambda s: (captures.append(ws.complete), begin(s)))
    monkeypatch.setattr(ws, "release", lambda: None)  # the rest held back: every decode step eager
    return asked, captures, release


def test_a_batch_runs_eagerly_while_experts_are_missing(ptx_params, monkeypatch):
    """The batcher on a MoE file whose experts are still uploading: its prompt forward and decode
    steps (several rows, then one) run as EagerSteps, each MoE layer reading its rows' ids back;
    no graph until every expert is resident, then the rows' graph."""
    from reflex_runtime.gpu import residency
    from reflex_runtime.gpu.step import Pick

    monkeypatch.setattr(residency, "IDLE_RELEASE_S", 3600.0)
    runner, dev = _fake_runner(ptx_params, max_context=64, max_seqs=4, arch="qwen3moe")
    asked, captures, release = _route_to_1_and_3(runner, dev, monkeypatch)
    n_moe, k = len(runner._weights.plan.experts), runner.config.extra["n_expert_used"]
    a = runner.batch_open([1, 2, 3], Pick(), 4, frozenset())
    b = runner.batch_open([4, 5], Pick(), 4, frozenset())
    got = {a: [], b: []}
    for sid, toks in runner.batch_step([(a, 3), (b, 2)], []).items():
        got[sid] += toks
    assert asked[:n_moe] == [5 * k] * n_moe  # both prompts in one packed forward
    while any(len(v) < 4 for v in got.values()):
        for sid, toks in runner.batch_step([], [s for s in got if len(got[s]) < 4]).items():
            got[sid] += toks
    assert {s: len(v) for s, v in got.items()} == {a: 4, b: 4}
    assert 2 * k in asked[n_moe:] and not captures and not runner.resident()  # two rows a step, eagerly
    for s in got:
        runner.batch_close(s)
    release()
    runner.wait_weights()
    n_asked = len(asked)
    c = runner.batch_open([1, 2], Pick(), 3, frozenset())
    d = runner.batch_open([3], Pick(), 3, frozenset())
    out = {c: [], d: []}
    for sid, toks in runner.batch_step([(c, 2), (d, 1)], []).items():
        out[sid] += toks
    while any(len(v) < 3 for v in out.values()):
        for sid, toks in runner.batch_step([], [s for s in out if len(out[s]) < 3]).items():
            out[sid] += toks
    assert captures and all(captures) and len(asked) == n_asked


@pytest.mark.parametrize("on_demand", ["1", "0", "stream"])
def test_a_moe_file_uploads_its_routed_experts_on_demand(ptx_params, monkeypatch, on_demand):
    """A MoE file's cold path on the fake device (gpu/residency.py): the first forward starts
    with only the base uploaded; each MoE layer reads its routed ids back (here the fake's read-back
    says experts 1 and 3) and waits for those; the rest goes up behind it, and the decode graph is
    captured only once every expert is resident. REFLEX_EXPERTS_ON_DEMAND=0: the whole file first."""
    from reflex_runtime.gpu import residency
    from reflex_runtime.sampling import SamplingParams

    monkeypatch.setattr(residency, "IDLE_RELEASE_S", 3600.0)
    monkeypatch.setenv("REFLEX_EXPERTS_ON_DEMAND", "0" if on_demand == "0" else "1")
    monkeypatch.setenv("REFLEX_STREAM_BASE", "1" if on_demand == "stream" else "0")  # each block's base behind the forward
    if on_demand == "stream":  # a block's part goes up only when the forward asks for it: one it forgot never lands
        take = residency.WeightStream._take
        monkeypatch.setattr(residency.WeightStream, "_take",
                            lambda self: 0.005 if not self._urgent and self._base_rest else take(self))
    runner, dev = _fake_runner(ptx_params, arch="qwen3moe")
    ws, model = runner._weights, runner.model
    if on_demand == "stream":
        assert ws.stats["base_streamed"] and ws.stats["base_loaded_bytes"] < ws.stats["base_bytes"]
    if on_demand == "0":
        assert ws is None and model.residency is None and runner.resident()
        assert sum(n for what, _, n in dev.copies if what == "htod") >= model.weights_bytes
        return
    assert model.residency is ws and not ws.complete and not runner.resident()
    asked, captures, release = _route_to_1_and_3(runner, dev, monkeypatch)
    assert list(runner.generate_ids([1, 2, 3], SamplingParams(), 6, frozenset())) == [0] * 6
    moe_layers = sorted(ws.plan.experts)
    k = runner.config.extra["n_expert_used"]
    # the prompt's 3 tokens, then each of the 5 decode steps' one token, once per MoE layer
    assert asked == [3 * k] * len(moe_layers) + [k] * (5 * len(moe_layers))
    assert not captures and not ws.complete  # eager steps, no graph, while experts are missing
    assert ws.landed_bytes == ws.stats["base_bytes"] + sum(2 * ws.plan.expert_bytes(il) for il in moe_layers)
    release()
    s = runner.info()
    assert s["resident_bytes_at_release"] == ws.stats["base_bytes"] + sum(2 * ws.plan.expert_bytes(il) for il in moe_layers)
    runner.wait_weights()
    n_asked = len(asked)
    assert list(runner.generate_ids([1, 2, 3], SamplingParams(), 6, frozenset())) == [0] * 6
    assert captures and all(captures) and len(asked) == n_asked  # all resident: no read-backs, one graph
    assert runner.resident() and s["experts_on_demand"] and "all_resident_ms" in runner.info()


FUSED_OPS = {"embed": 0, "mv": 1, "glu": 2, "attn": 3, "norm": 4, "head": 5}


FUSED_MODELS = dict(ABI_MODELS, qwen3_odd=("qwen3", {"num_hidden_layers": 3}))  # the second program's start


@pytest.mark.parametrize("flags", [0, 1, 2, 3, 4, 7, 15, 16, 31],
                         ids=["plain", "x_early", "lookahead", "x_early_lookahead", "attn_early", "all", "all_groups",
                              "fold", "all_fold"])
@pytest.mark.parametrize("name", list(FUSED_MODELS))
def test_fused_step_program(ptx_params, name, flags, tmp_path):
    """gpu/fused.py's program for each family: dense models get one (its launch matches the ABI,
    one block per SM), in GpuModel.forward's order (embedding; per layer qkv, attention, output,
    gate/up, down, and Gemma's two post-norms; the head with the pick when greedy); every pointer
    inside an allocation, every tile's rows within its buffer, its partial sums within theirs;
    MoE, recurrent and latent-attention models keep the kernel-per-op step (Unfusable). With the
    knobs (kernels/fused_step.cu's flags): x and two norm-weight slots of room past the program,
    the tile buffers smaller by as much, each op's x and norm weights fitting them; with Gemma's
    post-norms folded, no norm ops, the matrix op after each making its input from the residual,
    which alternates between x and h."""
    from reflex_runtime.gpu import fused
    from reflex_runtime.gpu.ops import fused_step as fs
    from reflex_runtime.gpu.ops.mvs import stage_bytes
    from reflex_runtime.gpu.ops.sample import RxState

    arch, overrides = FUSED_MODELS[name]
    dec, dev = _model(arch, ptx_params, str(tmp_path), **overrides)
    dec.launch.fused_step = True  # (off by default: REFLEX_FUSED_STEP=1)
    dec.launch.fused_x_early, dec.launch.fused_lookahead = bool(flags & fs.X_EARLY), bool(flags & fs.LOOKAHEAD)
    dec.launch.fused_attn_early = bool(flags & fs.ATTN_EARLY)
    dec.launch.fused_attn_groups = bool(flags & 8)  # (a program field, not a kernel flag: the attention ops' n_hg)
    dec.launch.fused_fold_norms = fold = bool(flags & 16)  # (a program option too: the matrix ops' post_*)
    st = RxState(*[dec.p(n) for n in ("tokens", "pos", "slot", "n_kv", "step", "out_tokens")])
    if arch not in ("qwen3", "gemma3", "llama"):
        with pytest.raises(fused.Unfusable):
            fused.FusedStep.build(dec, st)
        return
    step = fused.FusedStep.build(dec, st)
    lay = step.layout
    assert lay.smem + fs.STATIC_SMEM <= dev.max_shared and step.grid == dev.sm_count and step.flags == flags & 7
    if flags & fs.X_EARLY or (fold and arch == "gemma3"):
        assert lay.prog_off < lay.xs_off < lay.nw_off and lay.nw_off + 2 * lay.nw_bytes == lay.smem
        assert lay.xs_off % 16 == 0 and lay.nw_off % 16 == 0 and lay.nw_bytes % 16 == 0
    else:
        assert (lay.xs_off, lay.nw_off, lay.nw_bytes) == (0, 0, 0)
    for greedy in (True, False):
        step.launch(greedy)
        assert dev.launches[-1] == ("reflex_fused_step", (dev.sm_count, 1, 1), fs.THREADS)
        ptr, n = step.programs[greedy]
        assert dev.owns(ptr, n * fs.OP_BYTES) and n <= dec.fused_max_ops
        assert ptr % 256 == 0  # the kernel copies it to shared memory as 16-byte chunks from an aligned start
    # rebuild the op list to inspect it (the device copy is opaque here)
    b = fused._Builder(dec, step.grid, lay.buf_bytes)
    b.embed()
    b.layers()
    b.head(st, True)
    kinds = [op.kind for op in b.ops]
    layer = ["mv", "attn", "mv", "glu", "mv"] if arch != "gemma3" or fold else \
        ["mv", "attn", "mv", "norm", "glu", "mv", "norm"]
    assert kinds == [FUSED_OPS[k] for k in ["embed"] + layer * dec.cfg.n_layers + ["head"]]
    posts = [op.u.mv for op in b.ops if op.kind in (FUSED_OPS["mv"], FUSED_OPS["glu"], FUSED_OPS["head"])
             and op.u.mv.post_src]
    if fold and arch == "gemma3":  # gate/up, the next layer's q/k/v and the head: the residual x -> h -> x ...
        x, h = dec.p("x"), dec.p("h")
        assert len(posts) == 2 * dec.cfg.n_layers
        for j, m in enumerate(posts):
            assert (m.post_resid, m.post_resid_out) == ((x, h) if j % 2 == 0 else (h, x)) and m.K == dec.cfg.n_embd
            assert m.K <= fused.POST_MAX and m.post_w_src and m.norm_w and dev.owns(m.post_src, 4 * m.K)
            assert dev.owns(m.post_w_src, 4 * m.K) and 4 * m.K <= lay.nw_off - lay.xs_off
        assert b.ops[-1].u.mv.post_src  # the last post-norm folded into the head
    else:
        assert not posts
    for op in b.ops:
        if op.kind in (FUSED_OPS["mv"], FUSED_OPS["glu"], FUSED_OPS["head"]):
            m = op.u.mv
            ranges = 2 if op.kind == FUSED_OPS["glu"] else 1
            assert m.K <= 8 * 32 * 4 * m.wpr and m.rb * m.wpr * ranges <= fused.RED_FLOATS
            assert dev.owns(m.x, 4 * m.K) and (not m.norm_w or dev.owns(m.norm_w, 4 * m.K))
            if flags & fs.X_EARLY:  # x copied whole (16-aligned), the norm weights' 16-byte hull into a slot
                assert m.x % 16 == 0 and 4 * m.K <= lay.nw_off - lay.xs_off
                if m.norm_w:
                    lo, hi = m.norm_w // 16 * 16, -(-(m.norm_w + 4 * m.K) // 16) * 16
                    assert dev.owns(lo, hi - lo) and (m.norm_w - lo) + 4 * m.K <= lay.nw_bytes
            for i in range(m.n_w):
                assert stage_bytes(m.rb * m.row_bytes[i]) <= lay.buf_bytes // ranges
                assert dev.owns(m.w[i], m.rows[i] * m.row_bytes[i]) and m.w[i] % 16 == 0
                if op.kind != FUSED_OPS["glu"] or i == 0:
                    assert dev.owns(m.y[i], 4 * m.rows[i])
            assert bool(m.pick.part_v) == (op.kind == FUSED_OPS["head"])
        elif op.kind == FUSED_OPS["attn"]:
            f, max_split = op.u.attn.a, op.u.attn.max_split
            assert 1 <= max_split <= attn_decode.SPLITS_MAX and f.n_head_kv * max_split <= step.grid
            assert dev.owns(f.part_o, 4 * f.n_head * max_split * f.hd_v) and f.rope.k
            assert f.prefetch == bool(flags & fs.ATTN_EARLY)  # its early reads: before the barrier
            group = f.n_head // f.n_head_kv  # head groups: whole divisors of the group, counters within n_head's
            assert op.u.attn.n_hg == (attn_decode.head_groups(dec.launch, group) if flags & 8 else 1)
            assert group % op.u.attn.n_hg == 0 and f.n_head_kv * op.u.attn.n_hg <= f.n_head
    # off by default, and with the staged kernels off (the bench's legacy comparison)
    dec.launch.fused_step = False
    with pytest.raises(fused.Unfusable):
        fused.FusedStep.build(dec, st)


def test_fused_step_header_layout_matches_the_ctypes_mirror(tmp_path):
    """kernels/fused_step.cuh compiled on the host: every field's offset and every struct's size
    equal the ctypes mirror's (gpu/ops/fused_step.py) that the program is written with."""
    import shutil
    from ctypes import sizeof

    from reflex_runtime.gpu.ops import fused_step as fs

    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.fail("a C compiler is needed (CI has gcc)")
    structs = {"FsPick": fs.FsPick, "FsMv": fs.FsMv, "FsNorm": fs.FsNorm, "FsEmbed": fs.FsEmbed,
               "AtdRope": attn_decode.AtdRope, "AtdArgs": attn_decode.AtdArgs, "FsAttn": fs.FsAttn, "FsOp": fs.FsOp}
    lines, expect = [], []
    for cname, cls in structs.items():
        lines.append(f'printf("%zu\\n", sizeof({cname}));')
        expect.append(sizeof(cls))
        for field, _ in cls._fields_:
            lines.append(f'printf("%zu\\n", offsetof({cname}, {field}));')
            expect.append(getattr(cls, field).offset)
    src = tmp_path / "layout.c"
    src.write_text('#include <stddef.h>\n#include <stdio.h>\n#include "fused_step.cuh"\nint main(void) {\n'
                   + "\n".join(lines) + "\nreturn 0;\n}\n")
    exe = tmp_path / "layout"
    subprocess.run([cc, "-I", os.path.join(ROOT, "kernels"), "-o", str(exe), str(src)], check=True)
    got = [int(v) for v in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
    assert got == expect
