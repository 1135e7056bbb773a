"""Qwen3-MoE (`qwen3moe`): Qwen3's attention with routed experts. config.py (metadata, routing
rule), reference.py (numpy), gpu.py (CUDA)."""

from .config import config_from_gguf

REFERENCE = "reference:Qwen3Moe"  # module:class of the numpy forward
GPU = "gpu:Qwen3MoeGpu"  # module:class of the CUDA forward


def gpu_unsupported(config, gguf=None) -> str | None:
    from ...gpu.blocks import Attention
    from ...gpu.moe import moe_unsupported

    if config.n_embd % 32:
        return "hidden sizes must be multiples of 32"
    return Attention.unsupported(config) or moe_unsupported(config, gguf)


__all__ = ["GPU", "REFERENCE", "config_from_gguf", "gpu_unsupported"]
