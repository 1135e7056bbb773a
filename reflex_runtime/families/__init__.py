"""Model families: one package per architecture family, registered here once.

A family package (`families/<name>/`) owns everything that is that family's:
  config.py     `config_from_gguf(gguf) -> ModelConfig`: metadata and tensor checks (no numpy)
  reference.py  the numpy float32 forward (a `reference.base.ReferenceModel`)
  gpu.py        the CUDA forward (a `gpu.model.GpuModel`), when the family runs on the GPU
Its `__init__.py` names them without importing them, so opening a file never imports numpy or
the driver bindings: `config_from_gguf`, `REFERENCE = "reference:Class"`, `GPU = "gpu:Class"`
(or None), and optionally `gpu_unsupported(config, gguf) -> reason | None` (default: the dense
attention + gated FFN limits).
Adding a family: write its package, then add its architecture names to FAMILIES.
"""

from __future__ import annotations

import importlib
import os

from ..errors import UnsupportedModelError
from ..modelfile.gguf_file import printable
from .config import ModelConfig, validate

# general.architecture -> family package
FAMILIES = {
    "qwen3": "qwen3",
    "qwen3moe": "qwen3moe",
    "gemma3": "gemma3",
    "qwen35": "qwen35", "qwen35moe": "qwen35",
    "deepseek2": "deepseek2",
    "llama": "llama",
}


def supported_architectures() -> list[str]:
    return sorted(FAMILIES)


def family(arch: str, path: str = ""):
    """The family package of an architecture; UnsupportedModelError naming it and the supported ones."""
    name = FAMILIES.get(arch)
    if name is None:
        where = f" in {printable(path, 1024)}" if path else ""
        raise UnsupportedModelError(
            f"unsupported architecture '{printable(arch)}'{where}; supported: {', '.join(supported_architectures())}")
    return importlib.import_module(f"{__name__}.{name}")


def read_config(gguf) -> ModelConfig:
    """The file's ModelConfig: read, bounded and shape-checked by its family, then checked against
    the invariants every backend relies on (config.validate)."""
    return validate(family(gguf.architecture, gguf.path).config_from_gguf(gguf), gguf)


def _class(fam, spec: str):
    module, cls = spec.split(":")
    return getattr(importlib.import_module(f"{fam.__name__}.{module}"), cls)


def reference_keeps_weights(gguf, memory: int | None = None) -> bool:
    """Whether every tensor of `gguf` as float32 fits in half of `memory` (default: this machine's).
    A 35B-A3B file's experts alone are ~140 GB as float32: kept, they end the process (s32)."""
    need = 4 * sum(t.n_elements for t in gguf.tensors.values())
    if memory is None:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return need <= memory // 2


def load_reference(gguf, config: ModelConfig | None = None, keep_weights: bool | None = None):
    """The numpy reference model of an open GGUFFile (or a path). Weights are dequantized lazily,
    the first time a forward needs them, and kept if keep_weights (None: if they fit,
    reference_keeps_weights); otherwise dequantized on every use (only the routed experts' rows)."""
    if not hasattr(gguf, "tensors"):
        from ..modelfile.gguf_file import GGUFFile

        gguf = GGUFFile(gguf)
    if keep_weights is None:
        keep_weights = reference_keeps_weights(gguf)
    config = config or read_config(gguf)
    fam = family(config.arch)
    return _class(fam, fam.REFERENCE)(gguf, config, keep_weights=keep_weights)


def gpu_unsupported(config: ModelConfig, gguf=None) -> str | None:
    """None if the CUDA engine runs this model, else the one-line reason it does not (with the
    file at hand, its tensor types are checked too). Imports no driver bindings."""
    fam = family(config.arch)
    if fam.GPU is None:
        gpu = sorted(a for a in FAMILIES if family(a).GPU is not None)
        return f"the CUDA engine does not run '{config.arch}' yet (it runs {', '.join(gpu)})"
    check = getattr(fam, "gpu_unsupported", None)
    if check is not None:
        return check(config, gguf)
    from ..gpu.blocks import Attention, GatedFFN

    return Attention.unsupported(config) or GatedFFN.unsupported(config)


def gpu_model_class(config: ModelConfig):
    """The family's GpuModel subclass (imports the GPU forward; call after gpu_unsupported)."""
    fam = family(config.arch)
    return _class(fam, fam.GPU)


__all__ = ["FAMILIES", "ModelConfig", "family", "gpu_model_class", "gpu_unsupported", "load_reference", "read_config",
           "supported_architectures"]
