"""Native calls that recurse by their input, run where a stack overflow cannot end the process.

llguidance (Rust) compiles a JSON schema by recursion: each $ref hop or nesting level takes a few
KB of native stack, and an overflow is a SIGSEGV, not an exception (a chain of ~2,500 $refs killed
`serve`, `stdio` and the Lambda handler, issue 30). The request layer bounds schemas before they
get here (api/schema_bounds.py); on top of that, every compile runs through `call()`, on a new
thread whose stack is STACK_BYTES (address space reserved up front, pages committed only as they
are touched), far more than the bounded worst case needs (tests/test_schema_bounds.py measures
the margin). At most SLOTS calls run at once, and a caller waits at most `timeout` seconds: a call
that never ends keeps its slot and its thread, never the caller (the engine).
"""

from __future__ import annotations

import threading

STACK_BYTES = 256 << 20
SLOTS = 2

_slots = threading.BoundedSemaphore(SLOTS)
_spawn = threading.Lock()  # threading.stack_size is process-wide: set, start, restore under it


class NativeTimeout(Exception):
    """The call did not finish in time (it goes on in its thread, holding its slot)."""


class NativeBusy(Exception):
    """Every slot stayed taken for the whole timeout."""


def call(fn, *args, timeout: float):
    """fn(*args) on a large-stack thread; its result, or its exception re-raised here."""
    if not _slots.acquire(timeout=timeout):
        raise NativeBusy(f"{SLOTS} native calls were still running after {timeout:g} s")
    out: dict = {}
    done = threading.Event()

    def run():
        try:
            out["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            out["error"] = e
        finally:
            _slots.release()
            done.set()

    try:
        with _spawn:
            old = threading.stack_size(STACK_BYTES)
            try:
                threading.Thread(target=run, name="reflex-native", daemon=True).start()
            finally:
                threading.stack_size(old)
    except BaseException:
        _slots.release()
        raise
    if not done.wait(timeout):
        raise NativeTimeout(f"still running after {timeout:g} s")
    if "error" in out:
        raise out["error"]
    return out["value"]
