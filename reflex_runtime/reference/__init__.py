"""The numpy float32 reference: the oracle for `check` and the tests, and the CPU fallback.

This package holds what every family's reference forward shares: `base` (dequantized weights,
the KV cache, the forward contract), `layers` (the numpy ops), `blocks` (attention, gated FFN,
routed experts, LM head), the runner and sampling. Each family's own forward lives in its
package (`families/<name>/reference.py`); `families.load_reference` picks it:

    model = load_reference("model.gguf")          # from reflex_runtime.families
    cache = model.new_cache(256)
    logits = model.forward(prompt_ids, cache)     # (n, vocab) float32; cache now holds the prompt
"""

from .base import KVCache, ReferenceModel, Weights

__all__ = ["KVCache", "ReferenceModel", "Weights"]
