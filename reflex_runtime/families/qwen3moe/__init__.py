"""Qwen3-MoE (`qwen3moe`): Qwen3's attention with routed experts. config.py (metadata, routing
rule), reference.py (numpy), gpu.py (CUDA)."""

from .config import config_from_gguf


def reference_model(gguf, config, keep_weights: bool = True):
    from .reference import Qwen3Moe

    return Qwen3Moe(gguf, config, keep_weights=keep_weights)


def gpu_unsupported(config, gguf=None) -> str | None:
    from ...gpu.blocks import Attention
    from ...gpu.moe import moe_unsupported

    if config.n_embd % 32:
        return "hidden sizes must be multiples of 32"
    return Attention.unsupported(config) or moe_unsupported(config, gguf)


def gpu_model():
    from .gpu import Qwen3MoeGpu

    return Qwen3MoeGpu


__all__ = ["config_from_gguf", "gpu_model", "gpu_unsupported", "reference_model"]
