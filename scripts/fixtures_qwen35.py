"""Qwen3.5 fixtures (`qwen35` dense and `qwen35moe`): tiny random text models for make_fixtures.py.

Qwen3.5 is a hybrid: most layers are Gated DeltaNet ("linear attention") layers, every
`full_attention_interval`-th one a gated full-attention layer. The published checkpoints also
carry one multi-token-prediction (MTP) block under `mtp.*`, which transformers ignores and
llama.cpp's converter writes as an extra block (`nextn_predict_layers`). The converter
*requires* those tensors unless it runs with `--no-nextn` (it asserts on a checkpoint without
them), so every fixture here writes a random MTP block into `model-mtp.safetensors`: the
converter reads every `model*.safetensors`, transformers only `model.safetensors`.

    build_qwen35 / build_qwen35moe (registered in make_fixtures.ARCHS)
    convert_variant(fx, outtype, "--no-nextn")   the same HF model converted with other flags
    hf_model_from_gguf(gguf, hf_dir)             transformers fed the file's dequantized weights

Tokenizer: the real Qwen3 tokenizer (as build_qwen3), so files say tokenizer.ggml.pre = "qwen2";
real Qwen3.5 files carry their own 248k vocabulary with pre "qwen35" (tests/test_tokenizer.py
covers it with llama.cpp's ggml-vocab-qwen35.gguf).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import make_fixtures


def _mf():
    # imported lazily: make_fixtures imports this module to register the builders
    import make_fixtures

    return make_fixtures


# As in Qwen/Qwen3.5-*'s text_config (interleaved M-RoPE; for text every section sees the same
# position, so it is NeoX RoPE on the first partial_rotary_factor * head_dim dimensions).
_ROPE = {"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
         "mrope_section": [11, 11, 10], "mrope_interleaved": True}


def _common(overrides: dict) -> dict:
    kw = dict(
        vocab_size=151936,  # >= the Qwen3 tokenizer's 151669 ids (the converter checks)
        hidden_size=256,
        num_hidden_layers=4,  # full_attention_interval 4: layers 0-2 linear, 3 full
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,  # != key heads: exercises the converter's V-head reorder
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_id=151645,
        mtp_num_hidden_layers=1,
    )
    rope = dict(_ROPE)
    rope.update(overrides.pop("rope_parameters", {}))
    kw.update(overrides)
    kw["rope_parameters"] = rope
    return kw


def _tokenizer(hf_dir: Path) -> None:
    tok = _mf().qwen3_tokenizer_dir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tok / name, hf_dir / name)


def _write_mtp(config, hf_dir: Path, n_mtp: int, seed: int = 1234) -> None:
    """Random MTP block(s) named as in the published checkpoints: mtp.fc (2*hidden -> hidden),
    mtp.pre_fc_norm_embedding / pre_fc_norm_hidden / norm, and mtp.layers.{i}.* = one
    full-attention decoder layer of the same model type."""
    import copy
    import importlib

    import torch
    from safetensors.torch import save_file

    if n_mtp <= 0:
        return
    mod = importlib.import_module(type(config).__module__.replace("configuration_", "modeling_"))
    layer_cls = next(getattr(mod, n) for n in dir(mod) if n.endswith("DecoderLayer") and "Vision" not in n)
    cfg = copy.deepcopy(config)
    cfg.layer_types = ["full_attention"]
    cfg.num_hidden_layers = 1
    gen = torch.Generator().manual_seed(seed)
    h = config.hidden_size
    tensors = {}

    def rand(shape, std):
        return (std * torch.randn(shape, generator=gen, dtype=torch.float32)).contiguous()

    for i in range(n_mtp):
        layer = layer_cls(cfg, 0)
        for name, p in sorted(layer.state_dict().items()):
            std = 0.1 if p.ndim == 1 else 0.8 / p.shape[-1] ** 0.5
            tensors[f"mtp.layers.{i}.{name}"] = rand(tuple(p.shape), std)
    tensors["mtp.fc.weight"] = rand((h, 2 * h), 0.8 / (2 * h) ** 0.5)
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        tensors[f"mtp.{name}.weight"] = rand((h,), 0.1)
    save_file(tensors, str(hf_dir / "model-mtp.safetensors"), metadata={"format": "pt"})


def build_qwen35(overrides: dict, hf_dir: Path) -> "make_fixtures.ArchBuild":
    """Qwen3.5 dense text model (Qwen3_5ForCausalLM). Overrides are Qwen3_5TextConfig fields
    (e.g. layer_types, full_attention_interval, head_dim, linear_*); mtp_num_hidden_layers=0
    writes no MTP block (the file can then only be converted with --no-nextn)."""
    from transformers import Qwen3_5TextConfig

    kw = _common(dict(overrides))
    kw.setdefault("intermediate_size", 512)
    kw["architectures"] = ["Qwen3_5ForCausalLM"]
    cfg = Qwen3_5TextConfig(**kw)
    _tokenizer(hf_dir)
    _write_mtp(cfg, hf_dir, int(kw["mtp_num_hidden_layers"]))
    # Qwen3_5RMSNorm computes x * (1 + w): norm weights are drawn around 0 (the converter adds
    # 1). make_fixtures' init draws every 1-D "norm" weight that way, so the gated ssm norm
    # (x * w, stored as is) gets small weights of either sign too, and A_log, dt_bias are
    # N(0, 0.02): every head decays by about exp(-softplus(a)) per token. That is enough to
    # tell every convention apart (a wrong +1 on any norm moves logits by far more than 1e-4).
    return _mf().ArchBuild(cfg, norm_center=0.0)


def build_qwen35moe(overrides: dict, hf_dir: Path) -> "make_fixtures.ArchBuild":
    """Qwen3.5 MoE text model (Qwen3_5MoeForCausalLM): routed experts (softmax, top-k,
    renormalized) plus a shared expert scaled by sigmoid(shared_expert_gate)."""
    from transformers import Qwen3_5MoeTextConfig

    kw = _common(dict(overrides))
    kw.setdefault("num_experts", 8)
    kw.setdefault("num_experts_per_tok", 2)
    kw.setdefault("moe_intermediate_size", 256)
    kw.setdefault("shared_expert_intermediate_size", 512)
    kw["architectures"] = ["Qwen3_5MoeForCausalLM"]
    cfg = Qwen3_5MoeTextConfig(**kw)
    _tokenizer(hf_dir)
    _write_mtp(cfg, hf_dir, int(kw["mtp_num_hidden_layers"]))
    return _mf().ArchBuild(cfg, norm_center=0.0)


# -- the same HF model converted with other converter flags ------------------------------------


def convert_variant(fx, outtype: str = "f32", *flags: str) -> Path:
    """Convert fx.hf_dir again with extra convert_hf_to_gguf.py flags (e.g. "--no-nextn",
    "--mtp"), cached next to fx.gguf. Types the converter cannot write are requantized from the
    f32 variant with the same flags."""
    mf = _mf()
    outtype = outtype.lower()
    versions = mf._versions()
    key = mf._key({"llama.cpp": versions["llama.cpp"], "flags": list(flags),
                   "quantizer": versions["quantizer"] if outtype not in mf.CONVERTER_TYPES else 0})
    base = fx.gguf.parent
    out = base / f"{outtype}-{key}.gguf"
    with mf._locked(base.parent / f".{base.name}.lock"):
        if out.exists():
            return out
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        if outtype in mf.CONVERTER_TYPES:
            _convert(fx.hf_dir, outtype, tmp, flags)
        else:
            import quantize_gguf

            f32 = base / f"f32-{mf._key({'llama.cpp': versions['llama.cpp'], 'flags': list(flags), 'quantizer': 0})}.gguf"
            if not f32.exists():
                ftmp = f32.with_name(f".{f32.name}.{os.getpid()}.tmp")
                _convert(fx.hf_dir, "f32", ftmp, flags)
                ftmp.rename(f32)
            quantize_gguf.quantize_file(f32, tmp, outtype.upper(), log=None)
        tmp.rename(out)
    return out


def _convert(hf_dir: Path, outtype: str, outfile: Path, flags) -> None:
    script = _mf().llama_cpp_dir() / "convert_hf_to_gguf.py"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("NO_LOCAL_GGUF", None)
    with tempfile.TemporaryDirectory() as cwd:
        r = subprocess.run([sys.executable, str(script), str(hf_dir), "--outtype", outtype, "--outfile",
                            str(outfile), "--model-name", "reflex test fixture", *flags],
                           cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).splitlines()[-30:])
        raise RuntimeError(f"convert_hf_to_gguf.py {' '.join(flags)} failed ({r.returncode}) on {hf_dir}:\n{tail}")


# -- GGUF tensors back into the transformers model ---------------------------------------------
#
# The inverse of what the converter does for these architectures (conversion/qwen.py,
# Qwen3NextModel and _LinearAttentionVReorderBase):
#   - every `*norm.weight` except the linear-attention gated norm is stored as w + 1;
#   - A_log is stored as ssm_a = -exp(A_log); dt_bias as ssm_dt.bias; conv1d squeezed to (C, K);
#   - with fewer key than value heads, value heads are reordered from grouped by key head
#     (HF: v head g*r + i serves key head g) to tiled (GGUF: v head i*nk + g, key head j % nk), in
#     in_proj_qkv's V rows, in_proj_z, in_proj_a/b, A_log, dt_bias, conv1d's V channels and
#     out_proj's columns;
#   - MoE gate_up_proj (E, 2F, D) is split into ffn_gate_exps and ffn_up_exps (E, F, D).


def _untile_v(arr, axis: int, nk: int, nv: int, head_dim: int):
    """GGUF (tiled) value-head order -> HF (grouped) order along `axis`."""
    import numpy as np

    if nk == nv:
        return arr
    r = nv // nk
    a = np.moveaxis(arr, axis, 0)
    rest = a.shape[1:]
    a = a.reshape(r, nk, head_dim, *rest).swapaxes(0, 1).reshape(nv * head_dim, *rest)
    return np.ascontiguousarray(np.moveaxis(a, 0, axis))


def hf_model_from_gguf(gguf_path, hf_dir):
    """The saved HF model with every parameter replaced by the gguf-py-dequantized tensor of
    gguf_path (undoing the converter's transforms). MTP tensors are ignored; any other unused
    tensor, or a parameter without a tensor, raises."""
    import gguf
    import numpy as np
    import torch
    from quantize_gguf import _SourceGGUF
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    c = model.config
    src = _SourceGGUF(gguf_path)
    arch = src.get("general.architecture").decode()
    n_file = int(src.get(f"{arch}.block_count"))
    nextn = int(src.get(f"{arch}.nextn_predict_layers", 0) or 0)
    tensors = {name: (shape, t, off) for name, shape, t, off in src.tensors}
    used: set[str] = set()

    def get(name):
        shape, t, off = tensors[name]
        arr = gguf.quants.dequantize(src.tensor_bytes(shape, t, off), gguf.GGMLQuantizationType(t))
        used.add(name)
        return np.array(arr, dtype=np.float32).reshape(tuple(reversed(shape)))

    nk, nv = c.linear_num_key_heads, c.linear_num_value_heads
    dk, dv = c.linear_key_head_dim, c.linear_value_head_dim
    simple = {
        "input_layernorm.weight": ("attn_norm.weight", 1), "post_attention_layernorm.weight": ("post_attention_norm.weight", 1),
        "self_attn.q_proj.weight": ("attn_q.weight", 0), "self_attn.k_proj.weight": ("attn_k.weight", 0),
        "self_attn.v_proj.weight": ("attn_v.weight", 0), "self_attn.o_proj.weight": ("attn_output.weight", 0),
        "self_attn.q_norm.weight": ("attn_q_norm.weight", 1), "self_attn.k_norm.weight": ("attn_k_norm.weight", 1),
        "mlp.gate_proj.weight": ("ffn_gate.weight", 0), "mlp.up_proj.weight": ("ffn_up.weight", 0),
        "mlp.down_proj.weight": ("ffn_down.weight", 0), "mlp.gate.weight": ("ffn_gate_inp.weight", 0),
        "mlp.experts.down_proj": ("ffn_down_exps.weight", 0),
        "mlp.shared_expert.gate_proj.weight": ("ffn_gate_shexp.weight", 0),
        "mlp.shared_expert.up_proj.weight": ("ffn_up_shexp.weight", 0),
        "mlp.shared_expert.down_proj.weight": ("ffn_down_shexp.weight", 0),
        "mlp.shared_expert_gate.weight": ("ffn_gate_inp_shexp.weight", 0),
        "linear_attn.norm.weight": ("ssm_norm.weight", 0),
    }
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname == "model.embed_tokens.weight":
                arr = get("token_embd.weight")
            elif pname == "lm_head.weight":
                arr = get("output.weight")
            elif pname == "model.norm.weight":
                arr = get("output_norm.weight") - 1.0
            else:
                parts = pname.split(".")
                if parts[:2] != ["model", "layers"]:
                    raise KeyError(f"no GGUF tensor for parameter {pname}")
                b, rest = f"blk.{parts[2]}.", ".".join(parts[3:])
                if rest in simple:
                    gname, shift = simple[rest]
                    arr = get(b + gname) - float(shift)
                elif rest == "mlp.experts.gate_up_proj":
                    arr = np.concatenate([get(b + "ffn_gate_exps.weight"), get(b + "ffn_up_exps.weight")], axis=1)
                elif rest == "linear_attn.in_proj_qkv.weight":
                    w = get(b + "attn_qkv.weight")
                    arr = np.concatenate([w[:2 * nk * dk], _untile_v(w[2 * nk * dk:], 0, nk, nv, dv)])
                elif rest == "linear_attn.in_proj_z.weight":
                    arr = _untile_v(get(b + "attn_gate.weight"), 0, nk, nv, dv)
                elif rest == "linear_attn.in_proj_a.weight":
                    arr = _untile_v(get(b + "ssm_alpha.weight"), 0, nk, nv, 1)
                elif rest == "linear_attn.in_proj_b.weight":
                    arr = _untile_v(get(b + "ssm_beta.weight"), 0, nk, nv, 1)
                elif rest == "linear_attn.dt_bias":
                    arr = _untile_v(get(b + "ssm_dt.bias"), 0, nk, nv, 1)
                elif rest == "linear_attn.A_log":
                    arr = np.log(-_untile_v(get(b + "ssm_a"), 0, nk, nv, 1))
                elif rest == "linear_attn.conv1d.weight":
                    w = get(b + "ssm_conv1d.weight")  # (C, K)
                    arr = np.concatenate([w[:2 * nk * dk], _untile_v(w[2 * nk * dk:], 0, nk, nv, dv)])[:, None, :]
                elif rest == "linear_attn.out_proj.weight":
                    arr = _untile_v(get(b + "ssm_out.weight"), 1, nk, nv, dv)
                else:
                    raise KeyError(f"no GGUF tensor for parameter {pname}")
            p.copy_(torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32).reshape(tuple(p.shape))))
    mtp = {n for n in tensors if n.startswith("blk.") and int(n.split(".")[1]) >= n_file - nextn}
    left = set(tensors) - used - mtp
    if left:
        raise KeyError(f"GGUF tensors not used by the HF model: {sorted(left)}")
    return model
