"""numpy float32 forward of every supported architecture: the oracle for `check` and tests,
and the CPU fallback. Weights come from the GGUF through gguf-py's `dequantize`.

    model = load_reference("model.gguf")          # or an open GGUFFile
    cache = model.new_cache(256)
    logits = model.forward(prompt_ids, cache)     # (n, vocab) float32; cache now holds the prompt
"""

from __future__ import annotations

import importlib

from ..errors import UnsupportedModelError
from .base import KVCache, ReferenceModel, Weights

# architecture -> (module, class)
_MODELS = {
    "qwen3": ("qwen3", "Qwen3"),
    "gemma3": ("gemma3", "Gemma3"),
    "qwen35": ("qwen35", "Qwen35"), "qwen35moe": ("qwen35", "Qwen35"),
    "qwen3moe": ("qwen3moe", "Qwen3Moe"),
    "deepseek2": ("deepseek2", "DeepSeek2"),
}


def load_reference(gguf, config=None, keep_weights: bool = True) -> ReferenceModel:
    """A reference model for an open GGUFFile (or a path). Weights are dequantized lazily, the
    first time a forward needs them, and kept unless keep_weights=False."""
    if not hasattr(gguf, "tensors"):
        from ..gguf_file import GGUFFile

        gguf = GGUFFile(gguf)
    if config is None:
        from ..models import read_config

        config = read_config(gguf)
    entry = _MODELS.get(config.arch)
    if entry is None:
        raise UnsupportedModelError(
            f"no reference forward for architecture '{config.arch}'; supported: {', '.join(sorted(_MODELS))}")
    module, cls = entry
    mod = importlib.import_module(f"{__name__}.{module}")
    return getattr(mod, cls)(gguf, config, keep_weights=keep_weights)


__all__ = ["load_reference", "KVCache", "ReferenceModel", "Weights"]
