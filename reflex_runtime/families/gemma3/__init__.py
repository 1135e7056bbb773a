"""Gemma 3 text (`gemma3`): config.py (metadata, llama.cpp's conventions), reference.py (numpy),
gpu.py (CUDA)."""

from .config import config_from_gguf


def reference_model(gguf, config, keep_weights: bool = True):
    from .reference import Gemma3

    return Gemma3(gguf, config, keep_weights=keep_weights)


def gpu_unsupported(config, gguf=None) -> str | None:
    from ...gpu.blocks import Attention, GatedFFN

    return Attention.unsupported(config) or GatedFFN.unsupported(config)


def gpu_model():
    from .gpu import Gemma3Gpu

    return Gemma3Gpu


__all__ = ["config_from_gguf", "gpu_model", "gpu_unsupported", "reference_model"]
