"""Qwen3.5 hybrid (`qwen35`, `qwen35moe`): Gated DeltaNet and gated full-attention layers.
config.py (metadata, the converter's conventions), reference.py + delta_net.py (numpy). No GPU
forward yet (GPU is None), so `--backend auto` serves it from the reference."""

from .config import config_from_gguf

REFERENCE = "reference:Qwen35"  # module:class of the numpy forward
GPU = None  # module:class of the CUDA forward (None: the CUDA engine does not run it yet)

__all__ = ["GPU", "REFERENCE", "config_from_gguf"]
