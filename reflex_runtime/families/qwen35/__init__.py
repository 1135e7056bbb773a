"""Qwen3.5 hybrid (`qwen35`, `qwen35moe`): Gated DeltaNet and gated full-attention layers.
config.py (metadata, the converter's conventions), reference.py + delta_net.py (numpy). No GPU
forward yet: `gpu_model` is None, so `--backend auto` serves it from the reference."""

from .config import config_from_gguf

gpu_model = None


def reference_model(gguf, config, keep_weights: bool = True):
    from .reference import Qwen35

    return Qwen35(gguf, config, keep_weights=keep_weights)


__all__ = ["config_from_gguf", "gpu_model", "reference_model"]
