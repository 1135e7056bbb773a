"""DeepSeek-V2, V2-Lite and V3 (GGUF architecture `deepseek2`): configuration from GGUF.

Per layer: RMSNorm -> multi-head latent attention -> residual; RMSNorm -> FFN -> residual.

Multi-head latent attention (MLA), per token, with H heads of qk_nope + qk_rope key dims and
v_head value dims:
  q        attn_q @ h (no q_lora), or attn_q_b @ rmsnorm(attn_q_a @ h, attn_q_a_norm) (q_lora);
           per head [q_nope (qk_nope) | q_pe (qk_rope)]
  latent   attn_kv_a_mqa @ h = [c (kv_lora_rank) | k_pe (qk_rope)]; c = rmsnorm(c, attn_kv_a_norm)
  rope     q_pe and the one shared k_pe, rotating adjacent pairs (x[2i], x[2i+1]) (llama.cpp's
           "normal" RoPE; the converter keeps HF's interleaved order), YaRN when the file says so
  keys     head h: [W_k[h] @ c | k_pe], values W_v[h] @ c, where kv_b_proj = per head [W_k; W_v]
  scores   (q_nope . W_k[h] c + q_pe . k_pe) * kq_scale, causal softmax; out = wo @ concat_h(...)
What is cached is only [c | k_pe] per token (kv_lora_rank + qk_rope floats, one "KV head"): the
forward absorbs W_k into the query (q_nope -> W_k[h]^T q_nope, kv_lora_rank dims) and applies
W_v after attending over c, as llama.cpp does. So `head_dim`, `head_dim_v` and `n_head_kv` of the
ModelConfig describe that MQA view (kv_lora_rank + qk_rope, kv_lora_rank, 1); the per-head sizes
are in `extra` (qk_nope, v_head_dim, q_lora_rank, kv_lora_rank).

Tensors: attn_k_b, numpy (H, kv_lora_rank, qk_nope) = W_k transposed per head, and attn_v_b,
numpy (H, v_head, kv_lora_rank) = W_v, as the converter writes them since the MLA split; older
files have one attn_kv_b, numpy (H * (qk_nope + v_head), kv_lora_rank), rows per head
[W_k | W_v]: both layouts are read (the layout is decided per file from the tensors).

FFN: the first `leading_dense_block_count` layers are dense SwiGLU (ffn_gate/up/down, n_ff); the
others are MoE with `expert_shared_count` always-on shared experts (ffn_*_shexp) plus routed
experts chosen per token:
  softmax gating (V2, V2-Lite; the default when `expert_gating_func` is absent):
    p = softmax(router logits); with n_group > 1 the groups ranked by their max p, only the
    `expert_group_used_count` best groups stay ("group_limited_greedy"); top-k by p; weights p
  sigmoid gating (V3): s = sigmoid(logits); choice scores s + exp_probs_b (the correction
    bias, zero if absent); groups ranked by the sum of their two best choice scores; top-k by
    choice score within the kept groups; weights s (unbiased)
  then weights / sum when `expert_weights_norm`, times `expert_weights_scale`
  (routed_scaling_factor). Equal scores go to the lower expert / group id.

What llama.cpp takes from the file and what we do differently, and why:
- q_lora: llama.cpp decides it from the layer count (27-layer "lite" models read no
  q_lora_rank); we decide it from the file: `attention.q_lora_rank` present and > 0 with
  attn_q_a/attn_q_a_norm/attn_q_b tensors, else attn_q.
- `nextn_predict_layers`: that many trailing blocks are MTP heads, skipped as llama.cpp does;
  `attention.temperature_scale` (position-dependent query scaling) is refused, not ignored.
- `expert_gating_func` absent: softmax (old V2/V2.5 files), except llama.cpp's sigmoid for the
  47/48-layer, 154880-token GLM-4.7-Lite files, which we copy.
- group scores under softmax gating: llama.cpp sums each group's two best (V3's rule) for every
  gating function; DeepSeek-V2's own code and transformers take the group max, which we follow
  (the two only differ for files with expert_group_count > 1 and softmax, i.e. full V2/V2.5).
- YaRN (`rope.scaling.type` yarn): frequencies as in ggml (corr dims from
  rope.scaling.original_context_length, yarn_beta_fast/slow, default 32/1). cos/sin are scaled by
  `rope.scaling.yarn_attn_factor` if present, else 1 when `yarn_log_multiplier` is present (the
  file does not carry HF's `mscale`; llama.cpp and every real config assume mscale ==
  mscale_all_dim), else 0.1 ln(factor) + 1. kq_scale = m^2 / sqrt(qk_nope + qk_rope) with
  m = 0.1 * mscale_all_dim * ln(factor) + 1, mscale_all_dim = yarn_log_multiplier / 0.1 (the
  converter's 0.1 factor undone); without the multiplier m = 1 as in transformers (llama.cpp
  uses 0.1 ln(factor) + 1 there).
"""

from __future__ import annotations

import math

from ...errors import ModelFileError, UnsupportedModelError
from ...modelfile.gguf_file import printable
from ..config import (MAX_EXPERTS, MAX_HEADS, MAX_WIDTH, MetadataReader, ModelConfig, check_tensor_types,
                      embedding_shape, file_type_name)

GATING = {1: "softmax", 2: "sigmoid"}  # gguf ExpertGatingFuncType (llama_expert_gating_func_type)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1.0 else 0.1 * mscale * math.log(factor) + 1.0


def rope_frequencies(e: dict, theta: float) -> list[float]:
    """The rotation frequency of each rope pair i (radians per position), in double:
    theta^(-2i/rope); linear scaling divides by the factor; YaRN mixes f_i / factor
    (interpolation) and f_i (extrapolation) with ggml's ramp over the correction dims. The
    numpy reference and the GPU's table (kernels/mla.cu) both take them from here."""
    d = e["qk_rope"]
    freqs = [float(theta) ** (-(2 * i) / d) for i in range(d // 2)]
    kind = e["rope_scaling"]
    if kind == "linear":
        return [f / e["rope_factor"] for f in freqs]
    if kind != "yarn":
        return freqs

    def corr_dim(n_rot: float) -> float:
        return d * math.log(e["yarn_orig_ctx"] / (n_rot * 2 * math.pi)) / (2 * math.log(theta))

    low = max(0.0, math.floor(corr_dim(e["yarn_beta_fast"])))
    high = min(d - 1.0, math.ceil(corr_dim(e["yarn_beta_slow"])))
    span = max(0.001, high - low)
    out = []
    for i, f in enumerate(freqs):
        extrap = 1.0 - min(max((i - low) / span, 0.0), 1.0)  # 1: keep f_i, 0: f_i / factor
        out.append(f / e["rope_factor"] * (1.0 - extrap) + f * extrap)
    return out


def kv_cache_bytes_per_token(config, bytes_per_value: int = 2) -> dict:
    """KV-cache bytes one token adds over all layers (f16 by default): `latent`, what MLA keeps
    (one row of kv_lora_rank + qk_rope values per layer), against `expanded`, what a cache of the
    decompressed heads would keep (per head qk_nope + qk_rope key and v_head_dim value values)."""
    e, n = config.extra, config.n_layers
    latent = n * (e["kv_lora_rank"] + e["qk_rope"]) * bytes_per_value
    expanded = n * config.n_head * (e["qk_nope"] + e["qk_rope"] + e["v_head_dim"]) * bytes_per_value
    return {"latent": latent, "expanded": expanded, "expanded_over_latent": round(expanded / latent, 2)}


def _rope_settings(gguf, md: MetadataReader, k_mla: int) -> dict:
    kind = md.str("rope.scaling.type", "none") or "none"
    factor = md.float("rope.scaling.factor", 0.0, lo=0.0) or 0.0
    out = {"rope_scaling": "none", "rope_attn_factor": 1.0, "kq_scale": 1.0 / math.sqrt(k_mla)}
    if kind == "none" or factor in (0.0, 1.0):
        return out
    if kind == "linear":
        out.update(rope_scaling="linear", rope_factor=factor)
        return out
    if kind != "yarn":
        raise UnsupportedModelError(
            f"unsupported rope scaling '{printable(kind)}' for deepseek2 in {printable(gguf.path, 1024)}; "
            "supported: none, linear, yarn")
    log_mul = md.float("rope.scaling.yarn_log_multiplier", 0.0, lo=0.0) or 0.0
    mscale_all_dim = log_mul / 0.1
    attn = md.float("rope.scaling.yarn_attn_factor", lo=0.0)
    if attn is None:
        attn = 1.0 if mscale_all_dim else yarn_mscale(factor)
    m = yarn_mscale(factor, mscale_all_dim) if mscale_all_dim else 1.0
    out.update(
        rope_scaling="yarn",
        rope_factor=factor,
        yarn_orig_ctx=md.int("rope.scaling.original_context_length", md.int("context_length", 0)),
        yarn_beta_fast=md.float("rope.scaling.yarn_beta_fast", 32.0, lo=0.0, lo_open=True),
        yarn_beta_slow=md.float("rope.scaling.yarn_beta_slow", 1.0, lo=0.0, lo_open=True),
        rope_attn_factor=attn,
        kq_scale=m * m / math.sqrt(k_mla),
    )
    if not out["yarn_orig_ctx"]:
        raise ModelFileError(f"GGUF uses YaRN but has no rope.scaling.original_context_length: {printable(gguf.path, 1024)}")
    return out


def _check_shape(gguf, name: str, shape: tuple[int, ...]) -> None:
    ti = gguf.tensor(name)  # ModelFileError naming it when absent
    if tuple(ti.shape) != shape:
        raise ModelFileError(f"GGUF tensor '{name}' has shape {tuple(ti.shape)}, expected {shape}: {printable(gguf.path, 1024)}")


def _check_tensors(gguf, e: dict, n_layers: int, n_embd: int, n_head: int, n_ff: int) -> None:
    r, nope, rope, v = e["kv_lora_rank"], e["qk_nope"], e["qk_rope"], e["v_head_dim"]
    k_mla = nope + rope
    _check_shape(gguf, "token_embd.weight", (n_embd, gguf.tensor("token_embd.weight").shape[-1]))
    _check_shape(gguf, "output_norm.weight", (n_embd,))
    if "output.weight" in gguf.tensors:
        _check_shape(gguf, "output.weight", gguf.tensor("token_embd.weight").shape)
    for il in range(n_layers):
        p = f"blk.{il}."
        _check_shape(gguf, p + "attn_norm.weight", (n_embd,))
        _check_shape(gguf, p + "ffn_norm.weight", (n_embd,))
        if e["q_lora_rank"]:
            _check_shape(gguf, p + "attn_q_a.weight", (n_embd, e["q_lora_rank"]))
            _check_shape(gguf, p + "attn_q_a_norm.weight", (e["q_lora_rank"],))
            _check_shape(gguf, p + "attn_q_b.weight", (e["q_lora_rank"], n_head * k_mla))
        else:
            _check_shape(gguf, p + "attn_q.weight", (n_embd, n_head * k_mla))
        _check_shape(gguf, p + "attn_kv_a_mqa.weight", (n_embd, r + rope))
        _check_shape(gguf, p + "attn_kv_a_norm.weight", (r,))
        if e["kv_b_split"]:
            _check_shape(gguf, p + "attn_k_b.weight", (nope, r, n_head))
            _check_shape(gguf, p + "attn_v_b.weight", (r, v, n_head))
        else:
            _check_shape(gguf, p + "attn_kv_b.weight", (r, n_head * (nope + v)))
        _check_shape(gguf, p + "attn_output.weight", (n_head * v, n_embd))
        if il < e["n_dense_lead"]:
            for kind, shape in (("gate", (n_embd, n_ff)), ("up", (n_embd, n_ff)), ("down", (n_ff, n_embd))):
                _check_shape(gguf, f"{p}ffn_{kind}.weight", shape)
            continue
        n_exp, f = e["n_expert"], e["n_ff_exp"]
        _check_shape(gguf, p + "ffn_gate_inp.weight", (n_embd, n_exp))
        for kind, shape in (("gate", (n_embd, f, n_exp)), ("up", (n_embd, f, n_exp)), ("down", (f, n_embd, n_exp))):
            _check_shape(gguf, f"{p}ffn_{kind}_exps.weight", shape)
        if p + "exp_probs_b.bias" in gguf.tensors:
            _check_shape(gguf, p + "exp_probs_b.bias", (n_exp,))
        fs = f * e["n_expert_shared"]
        if fs:
            for kind, shape in (("gate", (n_embd, fs)), ("up", (n_embd, fs)), ("down", (fs, n_embd))):
                _check_shape(gguf, f"{p}ffn_{kind}_shexp.weight", shape)


def config_from_gguf(gguf) -> ModelConfig:
    check_tensor_types(gguf)
    md = MetadataReader(gguf)
    # trailing NextN/MTP blocks (GLM-4.7-Flash style files) are not part of the forward
    n_layers = md.layers() - (md.int("nextn_predict_layers", 0) or 0)
    where = printable(gguf.path, 1024)
    if n_layers <= 0:
        raise ModelFileError(f"GGUF has no trunk layers (block_count minus nextn_predict_layers): {where}")
    if md.float("attention.temperature_scale", 0.0):
        raise UnsupportedModelError(
            f"deepseek2 attention temperature scaling (attention.temperature_scale) is not supported: {where}")
    n_embd = md.int("embedding_length", required=True, lo=1, hi=MAX_WIDTH)
    n_head = md.int("attention.head_count", required=True, lo=1, hi=MAX_HEADS)
    _, vocab = embedding_shape(gguf)
    kv_lora = md.int("attention.kv_lora_rank", required=True, lo=1, hi=MAX_WIDTH)
    rope = md.int("rope.dimension_count", required=True, hi=MAX_WIDTH)
    if md.int("attention.key_length_mla", hi=MAX_WIDTH) is not None:  # split MLA layout (current converter)
        k_mla = md.int("attention.key_length_mla", required=True, lo=1, hi=MAX_WIDTH)
        v_mla = md.int("attention.value_length_mla", required=True, lo=1, hi=MAX_WIDTH)
    else:  # legacy: key/value_length are the per-head sizes
        k_mla = md.int("attention.key_length", required=True, lo=1, hi=MAX_WIDTH)
        v_mla = md.int("attention.value_length", required=True, lo=1, hi=MAX_WIDTH)
    if k_mla <= rope or rope % 2:
        raise ModelFileError(
            f"GGUF has key length {k_mla} and rope dimension {rope}; need an even rope < key length: {where}")
    q_lora = md.int("attention.q_lora_rank", 0, hi=MAX_WIDTH) or 0
    split = "blk.0.attn_k_b.weight" in gguf.tensors
    if not split and "blk.0.attn_kv_b.weight" not in gguf.tensors:
        raise ModelFileError(f"GGUF has neither attn_k_b/attn_v_b nor attn_kv_b tensors: {where}")

    n_dense = md.int("leading_dense_block_count", 0) or 0
    n_expert = md.int("expert_count", 0, hi=MAX_EXPERTS) or 0
    n_used = md.int("expert_used_count", 0, hi=MAX_EXPERTS) or 0
    gating_id = md.int("expert_gating_func", 0) or 0
    if gating_id == 0:  # llama.cpp's default for files without the key
        gating_id = 2 if n_layers in (47, 48) and vocab == 154880 else 1
    if gating_id not in GATING:
        raise UnsupportedModelError(
            f"unsupported expert_gating_func {gating_id} in {where}; supported: 1 (softmax), 2 (sigmoid)")
    n_group = md.int("expert_group_count", 0, hi=MAX_EXPERTS) or 0
    n_group_used = md.int("expert_group_used_count", 0, hi=MAX_EXPERTS) or 0
    if n_dense < n_layers:
        if not 0 < n_used <= n_expert:
            raise ModelFileError(
                f"GGUF has expert_count {n_expert} and expert_used_count {n_used}; need 0 < used <= count: {where}")
        if n_group > 1 and (n_expert % n_group or not 0 < n_group_used <= n_group
                            or n_used > n_group_used * (n_expert // n_group)):
            raise ModelFileError(
                f"GGUF has {n_expert} experts in {n_group} groups, {n_group_used} groups used and {n_used} experts used; "
                f"need equal groups and used experts that fit the used groups: {where}")
    n_ff = md.int("feed_forward_length", 0, hi=MAX_WIDTH) or 0
    extra = {
        "q_lora_rank": q_lora,
        "kv_lora_rank": kv_lora,
        "qk_nope": k_mla - rope,
        "qk_rope": rope,
        "v_head_dim": v_mla,
        "kv_b_split": split,
        "n_dense_lead": n_dense,
        "n_expert": n_expert,
        "n_expert_used": n_used,
        "n_expert_shared": md.int("expert_shared_count", 0, hi=MAX_EXPERTS) or 0,
        "n_ff_exp": md.int("expert_feed_forward_length", 0, hi=MAX_WIDTH) or 0,
        "n_group": n_group,
        "n_group_used": n_group_used,
        "gating": GATING[gating_id],
        # how a group is ranked: V2's max (softmax) or V3's sum of the two best (sigmoid); see above
        "group_score": "top2" if gating_id == 2 else "max",
        "weights_norm": md.flag("expert_weights_norm", False),
        "weights_scale": md.float("expert_weights_scale", 0.0, lo=0.0) or 1.0,
        **_rope_settings(gguf, md, k_mla),
    }
    _check_tensors(gguf, extra, n_layers, n_embd, n_head, n_ff)
    return ModelConfig(
        arch=md.arch,
        n_layers=n_layers,
        n_embd=n_embd,
        n_ff=n_ff,
        n_head=n_head,
        n_head_kv=1,
        head_dim=kv_lora + rope,
        head_dim_v=kv_lora,
        vocab_size=vocab,
        context_length=md.int("context_length", 4096, lo=1),
        rms_eps=md.float("attention.layer_norm_rms_epsilon", 1e-6, lo=0.0, hi=1.0, lo_open=True),
        rope_theta=md.float("rope.freq_base", 10_000.0, lo=1.0, lo_open=True),
        rope_dim=rope,
        tied_embeddings="output.weight" not in gguf.tensors,
        extra=extra,
        name=md.str("general.name", "") or "",
        file_type=file_type_name(gguf),
    )
