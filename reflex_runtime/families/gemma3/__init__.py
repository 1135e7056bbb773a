"""Gemma 3 text (`gemma3`): config.py (metadata, llama.cpp's conventions), reference.py (numpy),
gpu.py (CUDA)."""

from .config import config_from_gguf

REFERENCE = "reference:Gemma3"  # module:class of the numpy forward
GPU = "gpu:Gemma3Gpu"  # module:class of the CUDA forward

__all__ = ["GPU", "REFERENCE", "config_from_gguf"]
