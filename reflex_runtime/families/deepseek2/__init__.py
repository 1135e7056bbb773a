"""DeepSeek-V2 / V2-Lite / V3 (`deepseek2`): multi-head latent attention and MoE. config.py
(metadata, routing rules, llama.cpp's conventions), reference.py (numpy). No GPU forward yet
(GPU is None), so `--backend auto` serves it from the reference."""

from .config import config_from_gguf

REFERENCE = "reference:DeepSeek2"  # module:class of the numpy forward
GPU = None  # module:class of the CUDA forward (None: the CUDA engine does not run it yet)

__all__ = ["GPU", "REFERENCE", "config_from_gguf"]
