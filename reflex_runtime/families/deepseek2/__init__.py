"""DeepSeek-V2 / V2-Lite / V3 (`deepseek2`): multi-head latent attention and MoE. config.py
(metadata, routing rules, llama.cpp's conventions), reference.py (numpy), gpu.py (CUDA: the
latent cache, absorbed attention, DeepSeek's routing on the GPU)."""

from .config import config_from_gguf

REFERENCE = "reference:DeepSeek2"  # module:class of the numpy forward
GPU = "gpu:DeepSeek2Gpu"  # module:class of the CUDA forward


def gpu_unsupported(config, gguf=None) -> str | None:
    from .gpu import unsupported

    return unsupported(config, gguf)


__all__ = ["GPU", "REFERENCE", "config_from_gguf", "gpu_unsupported"]
