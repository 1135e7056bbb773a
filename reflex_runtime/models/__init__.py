"""Model families: configuration read from GGUF metadata (and, for GPU families, the forward).

`read_config(gguf)` is the one entry point; it names the architecture and lists the supported
ones when a file carries something else.
"""

from __future__ import annotations

from ..errors import UnsupportedModelError
from .config import ModelConfig

# architecture name in general.architecture -> module that defines `config_from_gguf`
_FAMILIES = {
    "qwen3": "qwen3",
    "gemma3": "gemma3",
    "qwen35": "qwen35", "qwen35moe": "qwen35",
    "qwen3moe": "qwen3moe",
    "deepseek2": "deepseek2",
}


def supported_architectures() -> list[str]:
    return sorted(_FAMILIES)


def register_family(arch: str, module: str) -> None:
    _FAMILIES[arch] = module


def read_config(gguf) -> ModelConfig:
    arch = gguf.architecture
    module = _FAMILIES.get(arch)
    if module is None:
        raise UnsupportedModelError(
            f"unsupported architecture '{arch}' in {gguf.path}; supported: {', '.join(supported_architectures())}"
        )
    import importlib

    mod = importlib.import_module(f"{__name__}.{module}")
    return mod.config_from_gguf(gguf)
