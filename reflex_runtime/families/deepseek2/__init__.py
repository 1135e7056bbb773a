"""DeepSeek-V2 / V2-Lite / V3 (`deepseek2`): multi-head latent attention and MoE. config.py
(metadata, routing rules, llama.cpp's conventions), reference.py (numpy). No GPU forward yet:
`gpu_model` is None, so `--backend auto` serves it from the reference."""

from .config import config_from_gguf

gpu_model = None


def reference_model(gguf, config, keep_weights: bool = True):
    from .reference import DeepSeek2

    return DeepSeek2(gguf, config, keep_weights=keep_weights)


__all__ = ["config_from_gguf", "gpu_model", "reference_model"]
