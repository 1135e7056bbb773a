"""Model families: one package per architecture family, registered here once.

A family package (`families/<name>/`) owns everything that is that family's:
  config.py     `config_from_gguf(gguf) -> ModelConfig`: metadata and tensor checks (no numpy)
  reference.py  the numpy float32 forward (a `reference.base.ReferenceModel`)
  gpu.py        the CUDA forward (a `gpu.model.GpuModel`), when the family runs on the GPU
and its `__init__.py` exposes them lazily (`config_from_gguf`, `reference_model`, `gpu_model`,
`gpu_unsupported`), so opening a file never imports numpy or the driver bindings.
Adding a family: write its package, then add its architecture names to FAMILIES.
"""

from __future__ import annotations

import importlib

from ..errors import UnsupportedModelError
from .config import ModelConfig

# general.architecture -> family package
FAMILIES = {
    "qwen3": "qwen3",
    "qwen3moe": "qwen3moe",
    "gemma3": "gemma3",
    "qwen35": "qwen35", "qwen35moe": "qwen35",
    "deepseek2": "deepseek2",
}


def supported_architectures() -> list[str]:
    return sorted(FAMILIES)


def family(arch: str, path: str = ""):
    """The family package of an architecture; UnsupportedModelError naming it and the supported ones."""
    name = FAMILIES.get(arch)
    if name is None:
        where = f" in {path}" if path else ""
        raise UnsupportedModelError(
            f"unsupported architecture '{arch}'{where}; supported: {', '.join(supported_architectures())}")
    return importlib.import_module(f"{__name__}.{name}")


def read_config(gguf) -> ModelConfig:
    return family(gguf.architecture, gguf.path).config_from_gguf(gguf)


def load_reference(gguf, config: ModelConfig | None = None, keep_weights: bool = True):
    """The numpy reference model of an open GGUFFile (or a path). Weights are dequantized lazily,
    the first time a forward needs them, and kept unless keep_weights=False."""
    if not hasattr(gguf, "tensors"):
        from ..gguf_file import GGUFFile

        gguf = GGUFFile(gguf)
    config = config or read_config(gguf)
    return family(config.arch).reference_model(gguf, config, keep_weights=keep_weights)


def gpu_unsupported(config: ModelConfig, gguf=None) -> str | None:
    """None if the CUDA engine runs this model, else the one-line reason it does not (with the
    file at hand, its tensor types are checked too). Imports no driver bindings."""
    fam = family(config.arch)
    if getattr(fam, "gpu_model", None) is None:
        gpu = sorted(a for a in FAMILIES if getattr(family(a), "gpu_model", None) is not None)
        return f"the CUDA engine does not run '{config.arch}' yet (it runs {', '.join(gpu)})"
    return fam.gpu_unsupported(config, gguf)


def gpu_model_class(config: ModelConfig):
    """The family's GpuModel subclass (imports the GPU forward; call after gpu_unsupported)."""
    return family(config.arch).gpu_model()


__all__ = ["FAMILIES", "ModelConfig", "family", "gpu_model_class", "gpu_unsupported", "load_reference", "read_config",
           "supported_architectures"]
