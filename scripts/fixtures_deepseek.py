"""DeepSeek-V2 / V2-Lite / V3 fixtures (GGUF architecture `deepseek2`): the builders registered
in make_fixtures.ARCHS, the way back from a (quantized) GGUF into a transformers model, and a
rewrite of a converted file into the older single-`attn_kv_b` layout.

What llama.cpp's converter (DeepseekV2Model, conversion/deepseek.py) writes for this family:
- `deepseek2.attention.key_length` = kv_lora_rank + qk_rope_head_dim and `value_length` =
  kv_lora_rank (the MQA view of absorbed MLA); the real head sizes go to `key_length_mla` =
  qk_nope + qk_rope and `value_length_mla` = v_head_dim; `attention.kv_lora_rank`,
  `attention.q_lora_rank` only when the config has one, `rope.dimension_count` = qk_rope_head_dim;
  `attention.head_count_kv` = 1 (MQA);
- `leading_dense_block_count` (first_k_dense_replace), `expert_count`, `expert_used_count`,
  `expert_shared_count`, `expert_feed_forward_length` (moe_intermediate_size),
  `feed_forward_length` (the dense layers' intermediate_size), `expert_group_count` (n_group) and
  `expert_group_used_count` (topk_group) when the config has them, `expert_weights_scale`
  (routed_scaling_factor), `expert_weights_norm` only when norm_topk_prob is true, and
  `expert_gating_func` ONLY when the config carries `scoring_func` (absent means softmax, which
  is why the builders give the keys real config.json files have: V2 "softmax", V3 "sigmoid");
- YaRN: `rope.scaling.type` "yarn", `rope.scaling.factor`, `rope.scaling.original_context_length`,
  `rope.scaling.yarn_beta_fast/slow` when given, and `rope.scaling.yarn_log_multiplier` =
  0.1 * mscale_all_dim (llama.cpp divides it back by 0.1; HF's `mscale` itself is not written);
- tensors: `attn_q` (no q_lora) or `attn_q_a` + `attn_q_a_norm` + `attn_q_b`; `attn_kv_a_mqa`
  (kv_lora_rank + rope rows), `attn_kv_a_norm`; kv_b_proj split per head into `attn_k_b`
  (numpy (n_head, kv_lora_rank, qk_nope): transposed) and `attn_v_b` (numpy (n_head, v_head,
  kv_lora_rank)); older converters wrote kv_b_proj unsplit as `attn_kv_b`; MoE layers have
  `ffn_gate_inp`, `exp_probs_b.bias` (V3's e_score_correction_bias), stacked `ffn_{gate,up,down}_exps`
  and `ffn_{gate,up,down}_shexp`; leading dense layers plain `ffn_{gate,up,down}`;
- no q/k permutation: the rope dims stay in HF's interleaved-pair order (llama.cpp runs the
  "normal" pair-adjacent RoPE on them);
- vocabulary via `_set_vocab_gpt2` (tokenizer.json): with the real Qwen3 tokenizer that is
  model "gpt2", pre "qwen2" (real DeepSeek files say "deepseek-llm" / "deepseek-v3", which
  reflex_runtime.text.pretokenize also knows).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from make_fixtures import ArchBuild

# make_fixtures imports this module to register the builders: import it back only inside the
# functions, so running make_fixtures.py as a script does not create an import cycle.

# Shapes shared by both variants: tiny, but with every head size different (qk_nope != v_head
# != rope) so a mixed-up split cannot pass, and n_head * v_head_dim = 256 so attn_output can be
# K-quantized.
_COMMON = dict(
    vocab_size=151936,  # the converter asserts every tokenizer id fits (see build_qwen3)
    hidden_size=256,
    intermediate_size=512,  # the leading dense layers
    moe_intermediate_size=384,
    num_hidden_layers=3,
    num_attention_heads=4,
    qk_nope_head_dim=32,
    qk_rope_head_dim=16,
    v_head_dim=64,
    kv_lora_rank=128,
    rms_norm_eps=1e-6,
    rope_theta=10_000.0,
    tie_word_embeddings=False,
    bos_token_id=151643,
    eos_token_id=151645,
)


# The configurations the GPU engine is checked on (tests/test_gpu_deepseek2.py, the launch ABI
# test): V2-Lite (no q_lora, softmax over all experts), full V2 (q_lora, softmax routing limited
# to the best groups by their max; qk_nope 64 so that attn_k_b rows can be quantized), V3 (q_lora,
# sigmoid + exp_probs_b, top-2-sum groups, normalized and scaled weights).
GPU_CONFIGS = {
    "v2lite": ("deepseek_v2", {}),
    "v2": ("deepseek_v2", dict(
        q_lora_rank=256, n_routed_experts=12, num_experts_per_tok=3, n_group=4, topk_group=2,
        topk_method="group_limited_greedy", n_shared_experts=1, routed_scaling_factor=4.0,
        first_k_dense_replace=0, num_hidden_layers=2, qk_rope_head_dim=32, qk_nope_head_dim=64,
        yarn_factor=0)),
    "v3": ("deepseek_v3", {}),
}


def _copy_tokenizer(hf_dir: Path) -> None:
    from make_fixtures import qwen3_tokenizer_dir

    tok = qwen3_tokenizer_dir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tok / name, hf_dir / name)


def _yarn(kw: dict, mscale: float | None) -> None:
    """`yarn_factor` / `yarn_orig_ctx` overrides -> the rope_scaling dict real DeepSeek configs
    carry (type yarn, beta_fast 32, beta_slow 1, mscale == mscale_all_dim; 0.707 in V2, 1.0 in
    V3), with a small original context so the test prompts cross it. yarn_factor=0: no scaling;
    yarn_mscale=None: leave mscale/mscale_all_dim out (HF then scales cos/sin only)."""
    factor = float(kw.pop("yarn_factor", 4.0))
    orig = int(kw.pop("yarn_orig_ctx", 16))
    mscale = kw.pop("yarn_mscale", mscale)
    kw.setdefault("max_position_embeddings", int(orig * factor) if factor else 4096)
    if factor and "rope_scaling" not in kw:
        rs = {"type": "yarn", "factor": factor, "original_max_position_embeddings": orig,
              "beta_fast": 32, "beta_slow": 1}
        if mscale is not None:
            rs.update(mscale=mscale, mscale_all_dim=mscale)
        kw["rope_scaling"] = rs


def build_deepseek_v2(overrides: dict, hf_dir: Path) -> ArchBuild:
    """DeepSeek-V2 (DeepseekV2ForCausalLM). Defaults are V2-Lite-like: no q_lora, softmax
    routing over all experts ("greedy", n_group 1), 2 shared experts, one leading dense layer,
    YaRN with mscale 0.707. `q_lora_rank=N, n_group=G, topk_group=T,
    topk_method="group_limited_greedy"` gives the full V2's group-limited routing. transformers'
    V2 router never renormalizes the top-k weights, so norm_topk_prob stays False (as in the real
    configs): a True would be written to the file and mean something else to llama.cpp."""
    from make_fixtures import ArchBuild, _split_overrides
    from transformers import DeepseekV2Config

    kw = _split_overrides(overrides, dict(
        _COMMON,
        q_lora_rank=None,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=2,
        n_group=1,
        topk_group=1,
        topk_method="greedy",
        scoring_func="softmax",
        norm_topk_prob=False,
        routed_scaling_factor=1.0,
        first_k_dense_replace=1,
    ))
    _yarn(kw, 0.707)
    if kw["norm_topk_prob"]:
        raise ValueError("transformers' DeepSeek-V2 router ignores norm_topk_prob: keep it False")
    groups_hold = kw["topk_group"] * kw["n_routed_experts"] // kw["n_group"]
    if kw["topk_method"] == "group_limited_greedy" and kw["num_experts_per_tok"] > groups_hold:
        raise ValueError("num_experts_per_tok must fit in the topk_group selected groups")
    kw["num_key_value_heads"] = kw["num_attention_heads"]
    kw["architectures"] = ["DeepseekV2ForCausalLM"]
    _copy_tokenizer(hf_dir)
    return ArchBuild(DeepseekV2Config(**kw), norm_center=1.0)


def build_deepseek_v3(overrides: dict, hf_dir: Path) -> ArchBuild:
    """DeepSeek-V3 (DeepseekV3ForCausalLM): q_lora, sigmoid scores with the e_score_correction
    bias (`exp_probs_b`) for the choice only, top-2-sum group scores, top-k within the
    topk_group best groups, renormalized weights times routed_scaling_factor, YaRN with mscale
    1.0, one leading dense layer. `router_bias_std` (default 0.1): transformers initializes the
    bias to zero, which would leave exp_probs_b untested, so the model is built by a subclass
    that draws it (the saved checkpoint is a plain DeepseekV3ForCausalLM one)."""
    from make_fixtures import ArchBuild, _split_overrides

    bias_std = float(overrides.pop("router_bias_std", 0.1))
    kw = _split_overrides(overrides, dict(
        _COMMON,
        q_lora_rank=256,
        n_routed_experts=16,
        num_experts_per_tok=4,
        n_shared_experts=1,
        n_group=4,
        topk_group=2,
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        first_k_dense_replace=1,
        num_nextn_predict_layers=0,  # MTP layers are dropped by the converter anyway
    ))
    _yarn(kw, 1.0)
    if kw["num_experts_per_tok"] > kw["topk_group"] * kw["n_routed_experts"] // kw["n_group"]:
        raise ValueError("num_experts_per_tok must fit in the topk_group selected groups")
    kw["num_key_value_heads"] = kw["num_attention_heads"]
    kw["architectures"] = ["DeepseekV3ForCausalLM"]
    _copy_tokenizer(hf_dir)
    return ArchBuild(_v3_config_class(bias_std)(**kw), norm_center=1.0)


_V3_CLASSES: dict = {}


def _v3_config_class(bias_std: float):
    """A DeepseekV3Config subclass that AutoModelForCausalLM maps to a DeepseekV3ForCausalLM
    subclass drawing each router's e_score_correction_bias from N(0, bias_std) with the global
    torch RNG (build_hf seeds it first, so fixtures stay deterministic). model_type and the
    saved `architectures` stay DeepSeek-V3's."""
    if bias_std in _V3_CLASSES:
        return _V3_CLASSES[bias_std]
    import torch
    from transformers import AutoModelForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    config_cls = type(f"FixtureDeepseekV3Config{len(_V3_CLASSES)}", (DeepseekV3Config,), {})

    def __init__(self, config):
        DeepseekV3ForCausalLM.__init__(self, config)
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, DeepseekV3TopkRouter):
                    m.e_score_correction_bias.normal_(0.0, bias_std)

    # the class name is what save_pretrained writes to config.json "architectures"
    model_cls = type("DeepseekV3ForCausalLM", (DeepseekV3ForCausalLM,), {"config_class": config_cls, "__init__": __init__})
    AutoModelForCausalLM.register(config_cls, model_cls, exist_ok=True)
    _V3_CLASSES[bias_std] = config_cls
    return config_cls


# -- GGUF -> transformers ---------------------------------------------------------------------


def _gguf_reader(gguf_path):
    import gguf
    import numpy as np
    from quantize_gguf import _SourceGGUF

    src = _SourceGGUF(gguf_path)
    tensors = {name: (shape, t, off) for name, shape, t, off in src.tensors}

    def load(gname: str) -> np.ndarray:
        shape, t, off = tensors[gname]
        arr = gguf.quants.dequantize(src.tensor_bytes(shape, t, off), gguf.GGMLQuantizationType(t))
        return np.array(arr, dtype=np.float32).reshape(tuple(reversed(shape)))

    return src, tensors, load


def hf_deepseek_from_gguf(gguf_path, hf_dir):
    """The float32 DeepSeek-V2/V3 model of hf_dir with every parameter (and V3's router bias
    buffer) replaced by the gguf-py-dequantized tensor of gguf_path. kv_b_proj is rebuilt from
    attn_k_b + attn_v_b (or taken from a legacy attn_kv_b); the fused expert gate_up_proj from
    ffn_gate_exps + ffn_up_exps. Raises if a parameter or a tensor is left over, or a shape
    differs (no reshape, so a transposed matrix cannot slip through)."""
    import gguf
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    src, tensors, load_raw = _gguf_reader(gguf_path)
    n_blocks = int(src.get("deepseek2.block_count"))
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.DEEPSEEK2, n_blocks)
    cfg = model.config
    used: set[str] = set()

    def load(gname: str) -> np.ndarray:
        if gname not in tensors:
            raise KeyError(f"no GGUF tensor {gname}")
        used.add(gname)
        return load_raw(gname)

    def kv_b(bid: int) -> np.ndarray:
        if f"blk.{bid}.attn_kv_b.weight" in tensors:
            return load(f"blk.{bid}.attn_kv_b.weight")
        k_b = load(f"blk.{bid}.attn_k_b.weight").transpose(0, 2, 1)  # (H, nope, kv_lora)
        v_b = load(f"blk.{bid}.attn_v_b.weight")  # (H, v, kv_lora)
        return np.concatenate([k_b, v_b], axis=1).reshape(-1, cfg.kv_lora_rank)

    named = dict(model.named_parameters())
    named.update((n, b) for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
    with torch.no_grad():
        for name, p in named.items():
            parts = name.split(".")
            if name.endswith("self_attn.kv_b_proj.weight"):
                arr = kv_b(int(parts[2]))
            elif name.endswith("mlp.experts.gate_up_proj"):
                bid = int(parts[2])
                arr = np.concatenate([load(f"blk.{bid}.ffn_gate_exps.weight"), load(f"blk.{bid}.ffn_up_exps.weight")], axis=1)
            elif name.endswith("mlp.experts.down_proj"):
                arr = load(f"blk.{int(parts[2])}.ffn_down_exps.weight")
            elif name.endswith("mlp.gate.e_score_correction_bias"):
                arr = load(f"blk.{int(parts[2])}.exp_probs_b.bias")
            elif name == "lm_head.weight" and "output.weight" not in tensors:
                continue  # tied: the embedding below
            else:
                gname = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
                if gname is None:
                    raise KeyError(f"no GGUF tensor for parameter {name}")
                arr = load(gname)
            if arr.shape != tuple(p.shape):
                raise ValueError(f"{name}: GGUF gives {arr.shape}, the model wants {tuple(p.shape)}")
            p.copy_(torch.from_numpy(arr))
    if set(tensors) - used:
        raise KeyError(f"GGUF tensors not used by the HF model: {sorted(set(tensors) - used)}")
    return model


# -- the legacy attn_kv_b layout --------------------------------------------------------------


def write_legacy_kv_b(src_path, dst_path) -> None:
    """Rewrite a converted deepseek2 GGUF the way converters before the MLA split wrote it:
    attn_k_b + attn_v_b merged back into one `attn_kv_b` per layer (numpy (n_head * (qk_nope +
    v_head), kv_lora_rank), rows per head [k_nope | v]), and the MQA keys replaced by the plain
    head sizes (key_length = qk_nope + qk_rope, value_length = v_head, head_count_kv = n_head;
    no *_mla keys). The
    pinned converter cannot write this layout any more, so the test builds it."""
    import gguf
    import numpy as np
    from quantize_gguf import _copy_metadata

    src, tensors, load = _gguf_reader(src_path)
    arch = "deepseek2"
    k_mla = int(src.get(f"{arch}.attention.key_length_mla"))
    v_mla = int(src.get(f"{arch}.attention.value_length_mla"))
    n_head = int(src.get(f"{arch}.attention.head_count"))
    mla_keys = {f"{arch}.attention.{k}" for k in ("key_length", "value_length", "key_length_mla", "value_length_mla",
                                                  "head_count_kv")}
    src.metadata = [m for m in src.metadata if m[0] not in mla_keys]
    writer = gguf.GGUFWriter(str(dst_path), arch)
    _copy_metadata(src, writer, int(src.get("general.file_type", 0)))
    writer.add_head_count_kv(n_head)  # old converters kept HF's num_key_value_heads (= n_head)
    writer.add_key_length(k_mla)
    writer.add_value_length(v_mla)
    for name, (shape, t, _) in tensors.items():
        if ".attn_v_b." in name:
            continue
        if ".attn_k_b." in name:
            if gguf.GGMLQuantizationType(t) != gguf.GGMLQuantizationType.F32:
                raise ValueError("write_legacy_kv_b expects an f32 file")
            k_b = load(name).transpose(0, 2, 1)  # (H, nope, kv_lora)
            v_b = load(name.replace(".attn_k_b.", ".attn_v_b."))  # (H, v, kv_lora)
            kv_b = np.concatenate([k_b, v_b], axis=1).reshape(-1, k_b.shape[-1])
            writer.add_tensor(name.replace(".attn_k_b.", ".attn_kv_b."), np.ascontiguousarray(kv_b))
            continue
        if gguf.GGMLQuantizationType(t) != gguf.GGMLQuantizationType.F32:
            raise ValueError("write_legacy_kv_b expects an f32 file")
        writer.add_tensor(name, np.ascontiguousarray(load(name)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
