"""The model configuration every backend reads: one dataclass, filled from GGUF metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import ModelFileError, UnsupportedModelError
from ..ggml_types import COMPUTE_TYPES, GGML_TYPES


@dataclass
class ModelConfig:
    arch: str
    n_layers: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int  # key/query head size
    head_dim_v: int  # value head size
    vocab_size: int
    context_length: int
    rms_eps: float
    rope_theta: float
    rope_dim: int  # rotated dimensions per head (NeoX style: first half / second half)
    tied_embeddings: bool  # no output.weight: the LM head is token_embd
    # family-specific settings (gemma3: sliding window, local rope base, scales; MoE: experts...)
    extra: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    file_type: str = ""


class MetadataReader:
    """Typed reads of `{arch}.*` keys with one-line errors that name the key."""

    def __init__(self, gguf):
        self.gguf = gguf
        self.arch = gguf.architecture

    def _get(self, key: str, default, required: bool):
        full = key if key.startswith(("general.", "tokenizer.")) else f"{self.arch}.{key}"
        value = self.gguf.get(full)
        if value is None:
            if required:
                raise ModelFileError(f"GGUF is missing required key '{full}': {self.gguf.path}")
            return default
        return value

    def int(self, key: str, default: int | None = None, required: bool = False) -> int | None:
        v = self._get(key, default, required and default is None)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            raise ModelFileError(f"GGUF key '{key}' should be an integer, got {type(v).__name__}")
        return v

    def float(self, key: str, default: float | None = None, required: bool = False) -> float | None:
        v = self._get(key, default, required and default is None)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ModelFileError(f"GGUF key '{key}' should be a number, got {type(v).__name__}")
        return float(v)

    def str(self, key: str, default: str | None = None) -> str | None:
        v = self._get(key, default, False)
        return v if isinstance(v, str) else default


def check_tensor_types(gguf, allowed=COMPUTE_TYPES) -> None:
    """Fail early, naming the tensor, if a weight uses a quantization no backend can read."""
    for ti in gguf.tensors.values():
        name = GGML_TYPES[ti.ggml_type].name
        if name not in allowed:
            raise UnsupportedModelError(
                f"unsupported quantization type {name} (tensor '{ti.name}'); supported: {', '.join(sorted(allowed))}"
            )


def file_type_name(gguf) -> str:
    """Human name of general.file_type (the LLAMA_FTYPE enum, e.g. 15 = MOSTLY_Q4_K_M)."""
    ft = gguf.get("general.file_type")
    return _FTYPES.get(ft, f"file_type {ft}") if ft is not None else ""


# llama_ftype values (gguf.LlamaFileType) -> the names users know.
_FTYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 32: "BF16",
}
