"""Llama (`llama`): Llama 2 / 3.x, SmolLM2 and other files llama.cpp runs as `llama`. config.py
(metadata, rope scaling, llama.cpp's conventions), reference.py (numpy), gpu.py (CUDA)."""

from .config import config_from_gguf

REFERENCE = "reference:Llama"  # module:class of the numpy forward
GPU = "gpu:LlamaGpu"  # module:class of the CUDA forward

__all__ = ["GPU", "REFERENCE", "config_from_gguf"]
