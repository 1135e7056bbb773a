"""The sampling a request gets for the fields it leaves out, one rule for every front end.

Per field: the request's value; else the model author's recommendation, the file's
`general.sampling.*` key (the names gguf-py and llama.cpp define); else reflex's own default,
greedy (`SamplingParams()`: temperature 0, top_k/top_p/min_p off). The request layer applies it
(api/fields.check_sampling); /v1/models, the CLI's notice and each generate record say which
values applied. Recommendations reflex's sampler has no equivalent for (repetition penalties,
mirostat, XTC, a sampler order) are listed as not applied, never silently dropped.

No numpy: this is read while the engine is built, on the cold path.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, fields

from .errors import ModelFileError, printable
from .sampling import SamplingParams

REFLEX_DEFAULTS = SamplingParams()
PREFIX = "general.sampling."
# request field -> the GGUF key that recommends it
APPLIED = {"temperature": PREFIX + "temp", "top_k": PREFIX + "top_k", "top_p": PREFIX + "top_p",
           "min_p": PREFIX + "min_p"}
NOT_APPLIED = tuple(PREFIX + k for k in ("sequence", "penalty_last_n", "penalty_repeat", "mirostat", "mirostat_tau",
                                         "mirostat_eta", "xtc_probability", "xtc_threshold"))
# The largest temperature a direct request (api/direct_ops) or a model file may give.
MAX_TEMPERATURE = 100.0


@dataclass(frozen=True)
class SamplingDefaults:
    params: SamplingParams = REFLEX_DEFAULTS  # seed stays None: each request draws its own
    from_model: tuple[str, ...] = ()  # the fields whose default the file recommends
    not_applied: tuple[str, ...] = ()  # general.sampling.* keys in the file that reflex does not implement

    def describe(self) -> dict:
        """For /v1/models: the values a request gets when it leaves a field out, and where they come from."""
        values = {f: getattr(self.params, f) for f in APPLIED}
        return {**values, "source": {f: "model" if f in self.from_model else "reflex" for f in APPLIED},
                "not_applied": list(self.not_applied)}

    def notice(self) -> str | None:
        """One line for the CLI when the file changes a default (None when it changes nothing)."""
        if not self.from_model and not self.not_applied:
            return None
        parts = []
        if self.from_model:
            given = " ".join(f"{f}={getattr(self.params, f)}" for f in self.from_model)
            parts.append(f"sampling defaults from the model file: {given} (an option given overrides it)")
        if self.not_applied:
            parts.append(f"not applied (reflex has no such sampler): {', '.join(self.not_applied)}")
        return "; ".join(parts)


def _number(key: str, v, lo: float, hi: float, lo_open: bool = False) -> float:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if not (ok and (v > lo if lo_open else v >= lo) and v <= hi):
        span = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise ModelFileError(f"model metadata {key} must be a number in {span}, got {printable(repr(v))[:64]}")
    return _as_written(float(v))


def _as_written(v: float) -> float:
    """A float32 from the file as its writer spelled it (0.95, not 0.949999988079071): the
    shortest decimal that reads back as the same float32."""
    for digits in range(1, 10):
        s = float(f"{v:.{digits}g}")
        if struct.unpack("<f", struct.pack("<f", s))[0] == v:
            return s
    return v


def _top_k(key: str, v) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise ModelFileError(f"model metadata {key} must be an integer, got {printable(repr(v))[:64]}")
    return max(v, 0)  # as in llama.cpp, k <= 0 turns the filter off


def from_gguf(gguf) -> SamplingDefaults:
    """The defaults for a model file (`gguf.get(key)` reads its metadata). A recommended value of
    the wrong type or out of range is a bad model file (ModelFileError), named by its key."""
    got = {}
    for f, key in APPLIED.items():
        v = gguf.get(key)
        if v is None:
            continue
        if f == "top_k":
            got[f] = _top_k(key, v)
        elif f == "temperature":
            got[f] = _number(key, v, 0.0, MAX_TEMPERATURE)
        else:
            got[f] = _number(key, v, 0.0, 1.0, lo_open=f == "top_p")
    params = SamplingParams(**{f.name: got.get(f.name, getattr(REFLEX_DEFAULTS, f.name)) for f in fields(SamplingParams)})
    return SamplingDefaults(params, tuple(got), tuple(k for k in NOT_APPLIED if gguf.get(k) is not None))
