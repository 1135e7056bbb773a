"""Qwen3.5 hybrid (`qwen35`, `qwen35moe`): Gated DeltaNet and gated full-attention layers.
config.py (metadata, the converter's conventions), reference.py + delta_net.py (numpy), gpu.py +
blocks.py (CUDA)."""

from .config import config_from_gguf

REFERENCE = "reference:Qwen35"  # module:class of the numpy forward
GPU = "gpu:Qwen35Gpu"  # module:class of the CUDA forward

# Tensors read as raw float32 vectors (norms, the decay parameters, the conv taps).
_F32_SUFFIXES = ("norm.weight", "ssm_a", "ssm_dt.bias", "ssm_conv1d.weight")


def gpu_unsupported(config, gguf=None) -> str | None:
    """None if the CUDA engine runs this model, else the one-line reason (imports no driver)."""
    from ...gpu.blocks import Attention, GatedFFN
    from ...gpu.moe import moe_unsupported
    from .blocks import delta_net_unsupported

    c = config
    if c.n_embd % 32:
        return "hidden sizes must be multiples of 32"
    why = delta_net_unsupported(c)
    if why is None and not all(c.extra["recurrent_layers"]):
        why = Attention.unsupported(c)
        if why is None and c.head_dim != c.head_dim_v:
            why = f"the gated attention needs equal key and value head sizes, not {c.head_dim}/{c.head_dim_v}"
    if why is None and c.arch == "qwen35moe":
        why = moe_unsupported(c, gguf)
        if why is None and c.extra["n_ff_shexp"] % 32:
            why = "the shared expert's FFN size must be a multiple of 32"
        shexp = gguf.tensors.get("blk.0.ffn_up_shexp.weight") if gguf is not None else None
        if why is None and shexp is not None and shexp.shape[1] != c.extra["n_ff_shexp"]:
            why = f"the shared expert has {shexp.shape[1]} rows but expert_shared_feed_forward_length says " \
                  f"{c.extra['n_ff_shexp']}"
    elif why is None:
        why = GatedFFN.unsupported(c)
    return why or (_tensor_types_unsupported(c, gguf) if gguf is not None else None)


def _tensor_types_unsupported(config, gguf) -> str | None:
    """Every tensor the forward reads has a type its kernel decodes (checked before the upload)."""
    from ...gpu.ops.common import WEIGHT_TYPES

    for name, ti in gguf.tensors.items():
        if name.startswith("blk.") and int(name.split(".")[1]) >= config.n_layers:
            continue  # MTP blocks are never read
        if name.endswith(_F32_SUFFIXES):
            if ti.type_name != "F32":
                return f"tensor '{name}' is {ti.type_name}; the CUDA engine reads it as F32"
            continue
        if ti.type_name not in WEIGHT_TYPES:
            return f"tensor '{name}' is {ti.type_name}, which the CUDA kernels do not read"
        if ti.shape[0] % 32:
            return f"tensor '{name}' rows of {ti.shape[0]} are not a multiple of 32"
    return None


__all__ = ["GPU", "REFERENCE", "config_from_gguf", "gpu_unsupported"]
