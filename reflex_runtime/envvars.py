"""Numbers from environment variables, held to a range: the handler's settings (REFLEX_CTX,
REFLEX_PARALLEL, ...) and the launcher's tuning variables (REFLEX_MVS_*, REFLEX_MOE_TILE, ...)."""

from __future__ import annotations

import os


def env_number(name: str, kind, default, error, lo=None, hi=None, choices=None):
    """The variable `name` (unset or blank: default) parsed as `kind` (int or float), within
    [lo, hi] (a None bound is open) or one of `choices`. Otherwise raises error(raw, why), the
    caller's exception worded its own way; `why` says what the value should have been."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        v = kind(raw)
    except ValueError:
        raise error(raw, f"expected {'an integer' if kind is int else 'a number'}") from None
    if choices is not None and v not in choices:
        raise error(raw, f"expected one of {', '.join(str(c) for c in choices)}")
    if (lo is not None and not v >= lo) or (hi is not None and not v <= hi):  # NaN fails both
        raise error(raw, f"expected a value from {lo} to {hi}" if hi is not None else f"expected at least {lo}")
    return v
