"""Qwen3 dense (`qwen3`): config.py (metadata), reference.py (numpy), gpu.py (CUDA)."""

from .config import config_from_gguf

REFERENCE = "reference:Qwen3"  # module:class of the numpy forward
GPU = "gpu:Qwen3Gpu"  # module:class of the CUDA forward

__all__ = ["GPU", "REFERENCE", "config_from_gguf"]
