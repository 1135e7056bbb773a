"""Structure-aware GGUF fuzzing: the mutations, and the worker that runs them through the CLI.

A seed is a real converted fixture (tests/conftest.py), its vocabulary cut to a few thousand
tokens (gguf_edit.shrink_vocab) so that one case costs milliseconds, plus the metadata keys the
loader reads from it (discovered by recording every lookup; see discover_keys). Case i of a
seed is a pure function of (seed, i): the parent process only hands out index ranges.

Mutations (make_case):
  config     every key read, in turn, set to each odd value (ODD_VALUES: 0, +-1, int32/uint32/
             int64 limits, NaN, infinities, denormals, strings, bools, empty/short/long/float/
             string arrays) under a fitting GGUF type, or removed; then random pairs of them
  header     tensor and key counts off by one, zero, huge
  kv         a key's length, value type, array element type, array count or string length
             field patched (+-1, zero, huge, random); duplicate keys, nested arrays, many keys,
             huge arrays
  tensor     n_dims, a dimension, the type, the offset, the name length; tensors renamed,
             dropped, reshaped (1-D token_embd), general.alignment changed
  truncate   at every structural boundary (+-3 bytes) and at random points, data included
  bytes      random bit flips and random 32/64-bit words in the header

Worker (`python tests/gguf_fuzz.py SPEC.json`): runs cases [start, stop) of each seed through
`reflex_runtime.cli.main(["generate", ...])` in process (REFLEX_DEBUG=1, so anything but a
ReflexError propagates and is caught here), under an address-space limit and a per-case alarm,
and writes a JSON summary: outcomes, the slowest case, peak RSS, and every failure.
"""

from __future__ import annotations

import json
import math
import os
import random
import struct
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gguf_edit import KV, VT, GGUFModel  # noqa: E402

CASE_SECONDS = 5.0  # CPU seconds: no case may take longer (CPU time, so a loaded machine does not fail it)
WALL_SECONDS = 120.0  # wall-clock backstop for a case (a hang that burns no CPU)
RSS_GROWTH_LIMIT = 512 << 20  # a case's peak RSS above the RSS it started from
ADDRESS_SPACE_MARGIN = 1 << 30  # RLIMIT_AS: the warmed-up worker's mapping plus this

_I = {VT.UINT8: (0, 255), VT.INT8: (-128, 127), VT.UINT16: (0, 65535), VT.INT16: (-32768, 32767),
      VT.UINT32: (0, 2**32 - 1), VT.INT32: (-2**31, 2**31 - 1), VT.UINT64: (0, 2**64 - 1), VT.INT64: (-2**63, 2**63 - 1)}
_NAN = float("nan")


def _int_types(v: int) -> list[int]:
    return [t for t, (lo, hi) in _I.items() if lo <= v <= hi]


def odd_values(orig: Any, n_layers: int) -> list[tuple[str, int, Any, int | None]]:
    """(label, vtype, value, etype) variants for one key; vtype None means: remove the key."""
    base = orig if type(orig) is int else 4
    ints = [0, 1, -1, 3, 2**31 - 1, -2**31, 2**32 - 1, 2**63 - 1, -2**63, 2**64 - 1, base + 1, base * 2]
    out: list = []
    for k, v in enumerate(ints):
        types = _int_types(v)
        t = types[k % len(types)]
        out.append((f"int {v} as {VT(t).name}", t, v, None))
    for k, v in enumerate([0.0, _NAN, math.inf, -math.inf, 1e-45, -1.0, 1e300]):
        t = VT.FLOAT64 if v == 1e300 or k % 3 == 2 else VT.FLOAT32
        out.append((f"float {v!r} as {t.name}", t, v, None))
    for s in ["", "\udc80\udcff", "yarn", "A" * 70000]:
        out.append((f"string {s[:12]!r}", VT.STRING, s, None))
    out.append(("bool true", VT.BOOL, True, None))
    n = max(n_layers, 1)
    out += [
        ("empty array", VT.ARRAY, [], VT.UINT32),
        ("array of ones", VT.ARRAY, [1] * n, VT.UINT32),
        ("array, one too long", VT.ARRAY, [2] * (n + 1), VT.INT32),
        ("array of huge", VT.ARRAY, [2**64 - 1] * n, VT.UINT64),
        ("float array with NaN", VT.ARRAY, [_NAN] * n, VT.FLOAT32),
        ("string array", VT.ARRAY, ["a"] * n, VT.STRING),
    ]
    out.append(("removed", None, None, None))
    return out


# -- seeds ------------------------------------------------------------------------------------


class _Recording(dict):
    """A metadata dict that remembers every key looked up (present or not)."""

    def __init__(self, d):
        super().__init__(d)
        self.seen: set[str] = set()

    def get(self, key, default=None):
        self.seen.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.seen.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.seen.add(key)
        return super().__contains__(key)


# Values that switch on code paths reading more keys (e.g. YaRN reads its parameters only when
# rope.scaling.type is yarn): discovery records the keys read under each of them as well.
SWITCHES = [
    ("rope.scaling.type", VT.STRING, "yarn"), ("rope.scaling.type", VT.STRING, "linear"),
    ("rope.scaling.factor", VT.FLOAT32, 4.0), ("attention.sliding_window", VT.UINT32, 512),
    ("attention.sliding_window_pattern", VT.UINT32, 6), ("expert_gating_func", VT.UINT32, 2),
    ("attention.q_lora_rank", VT.UINT32, 16), ("expert_group_count", VT.UINT32, 2),
    ("nextn_predict_layers", VT.UINT32, 1), ("attention.key_length_mla", VT.UINT32, 48),
]


def discover_keys(path: str) -> list[str]:
    """Every metadata key the loader looks up for this file: the config reader, the tokenizer,
    and the same under each SWITCHES value (whether the switched file loads or not)."""
    import tempfile

    from reflex_runtime.errors import ReflexError
    from reflex_runtime.families import read_config
    from reflex_runtime.modelfile.gguf_file import GGUFFile
    from reflex_runtime.text.tokenizer import Tokenizer

    def reads(p: str) -> set[str]:
        g = GGUFFile(p)
        g.metadata = rec = _Recording(g.metadata)
        try:
            read_config(g)
        except ReflexError:
            pass
        try:
            Tokenizer.from_gguf(g).prepare()
        except ReflexError:
            pass
        g.close()
        return rec.seen

    seen = reads(path) | {"general.alignment"}  # the parser's own key
    model = GGUFModel.load(path)
    arch = model.get("general.architecture")
    with tempfile.TemporaryDirectory() as d:
        for key, vtype, value in SWITCHES:
            m = model.copy()
            m.set(f"{arch}.{key}", value, vtype)
            p = os.path.join(d, "switch.gguf")
            with open(p, "wb") as f:
                f.write(m.to_bytes()[0])
            seen |= reads(p)
    return sorted(seen)


# -- cases ------------------------------------------------------------------------------------


# Random case kinds and their weights. A seed with its full vocabulary (slow to load) draws only
# from FULL_VOCAB_KINDS, which mostly fail while parsing: they hit the 150k-entry arrays.
KINDS = {"config2": 30, "header": 5, "kv": 25, "tensor": 25, "truncate": 8, "bytes": 7}
FULL_VOCAB_KINDS = {"header": 5, "kv": 25, "truncate": 10, "bytes": 10}


class Seed:
    def __init__(self, name: str, path: str, keys: list[str], systematic: bool = True):
        self.name, self.path, self.keys = name, path, keys
        self.kinds = KINDS if systematic else FULL_VOCAB_KINDS
        self.model = GGUFModel.load(path)
        self.blob, self.fields = self.model.to_bytes()
        self.arch = self.model.get("general.architecture")
        self.n_layers = self.model.get(f"{self.arch}.block_count") or 1
        self.variants = [(k, v) for k in keys for v in odd_values(self.model.get(k), self.n_layers)] if systematic \
            else []
        # A case's file is written as parts: the header (small) and the unchanged tensor data.
        f = self.fields
        self.head = bytes(self.blob[:f.data_offset])
        self.data = memoryview(self.blob)[f.data_offset:]
        self.tensor_infos = bytes(self.blob[f.kv[-1]["end"] if f.kv else 24:f.tensor[-1]["offset"] + 8])

    def __len__(self) -> int:
        """Systematic cases: each key read, each odd value."""
        return len(self.variants)

    def with_kvs(self, m: GGUFModel) -> list:
        """The parts of the seed's file with m's metadata (tensors unchanged): the tensor data
        offsets are relative to the data section, so only the padding before it changes."""
        head = bytearray(struct.pack("<IIQQ", 0x46554747, m.version, len(self.model.tensors), len(m.kvs)))
        for kv in m.kvs:
            head += struct.pack("<Q", len(kv.key)) + kv.key + struct.pack("<I", kv.vtype) + kv.payload()
        head += self.tensor_infos
        head += bytes(-len(head) % self.model.alignment)
        return [head, self.data]

    def patched(self, at: int, fmt: str, value: int) -> list:
        head = bytearray(self.head)
        _patch(head, at, fmt, value)
        return [head, self.data]


def _apply_variant(m: GGUFModel, key: str, variant) -> None:
    label, vtype, value, etype = variant
    if vtype is None:
        m.remove(key)
    else:
        m.set(key, value, vtype, etype)


def _patch(blob: bytearray, offset: int, fmt: str, value: int) -> None:
    if offset + struct.calcsize(fmt) <= len(blob):
        struct.pack_into(fmt, blob, offset, value & ((1 << (8 * struct.calcsize(fmt))) - 1))


def _odd_int(rng: random.Random, orig: int) -> int:
    return rng.choice([0, 1, orig - 1, orig + 1, orig * 2, orig // 2, 2**31, 2**32 - 1, 2**40, 2**62, 2**63, 2**64 - 1,
                       rng.getrandbits(64), rng.getrandbits(16)])


def make_case(seed: Seed, i: int) -> tuple[list, str]:
    """Case i of a seed: (the file as a list of byte buffers, description)."""
    if i < len(seed.variants):
        key, variant = seed.variants[i]
        m = seed.model.copy()
        _apply_variant(m, key, variant)
        return seed.with_kvs(m), f"config {key} = {variant[0]}"
    rng = random.Random(f"{seed.name}:{i}")
    kind = rng.choices(list(seed.kinds), list(seed.kinds.values()))[0]
    return globals()[f"_case_{kind}"](seed, rng)


def _case_config2(seed: Seed, rng: random.Random):
    m = seed.model.copy()
    picks = [rng.choice(seed.variants) for _ in range(rng.randint(2, 3))]
    for key, variant in picks:
        _apply_variant(m, key, variant)
    return seed.with_kvs(m), "config " + "; ".join(f"{k} = {v[0]}" for k, v in picks)


def _case_header(seed: Seed, rng: random.Random):
    field, at = rng.choice([("n_tensors", 8), ("n_kv", 16), ("version", 4)])
    if field == "version":
        v = rng.choice([0, 1, 2, 4, 0x03000000, rng.getrandbits(32)])
        return seed.patched(at, "<I", v), f"header {field} = {v}"
    (orig,) = struct.unpack_from("<Q", seed.head, at)
    v = _odd_int(rng, orig)
    return seed.patched(at, "<Q", v), f"header {field} = {v}"


def _case_kv(seed: Seed, rng: random.Random):
    what = rng.choice(["field", "field", "field", "duplicate", "nested", "many_keys", "huge_array", "long_key"])
    if what == "field":
        f = rng.choice(seed.fields.kv)
        name = rng.choice([k for k in ("key_len", "vtype", "etype", "count", "str_len") if k in f])
        fmt = "<I" if name in ("vtype", "etype") else "<Q"
        (orig,) = struct.unpack_from(fmt, seed.head, f[name])
        v = rng.choice([rng.randrange(0, 16), 9, 8, 2**32 - 1]) if fmt == "<I" else _odd_int(rng, orig)
        return seed.patched(f[name], fmt, v), f"kv field {name} at {f[name]} = {v}"
    m = seed.model.copy()
    if what == "duplicate":
        m.kvs.insert(rng.randrange(len(m.kvs) + 1), rng.choice(m.kvs))
    elif what == "nested":
        m.set("x.nested", [(VT.UINT32, [1, 2])] * rng.choice([1, 1000]), VT.ARRAY, VT.ARRAY)
    elif what == "many_keys":
        n = rng.choice([1000, 16384 - len(m.kvs), 16385 - len(m.kvs), 50000])
        m.kvs += [KV(f"k{k}".encode(), VT.UINT8, None, k & 255) for k in range(n)]
        return seed.with_kvs(m), f"kv {n} extra keys"
    elif what == "huge_array":  # encoded directly: the harness must not be what uses the memory
        n, etype = rng.choice([(2**21, VT.UINT8), (2**21 + 1, VT.UINT8), (2**20, VT.STRING), (3 * 10**6, VT.STRING)])
        item = b"\x00" if etype == VT.UINT8 else struct.pack("<Q", 2) + b"ab"
        m.kvs.append(KV(b"x.huge", VT.ARRAY, etype, None, struct.pack("<IQ", etype, n) + item * n))
        return seed.with_kvs(m), f"kv array of {n} {VT(etype).name}"
    else:
        m.set("k" * rng.choice([65535, 65536, 100000]), 1, VT.UINT8)
    return seed.with_kvs(m), f"kv {what}"


def _case_tensor(seed: Seed, rng: random.Random):
    what = rng.choice(["field", "field", "field", "rename", "drop", "reshape", "alignment", "retype"])
    if what == "field":
        f = rng.choice(seed.fields.tensor)
        name = rng.choice(["name_len", "n_dims", "dims", "type", "offset"])
        at = rng.choice(f["dims"]) if name == "dims" else f[name]
        fmt = "<I" if name in ("n_dims", "type") else "<Q"
        (orig,) = struct.unpack_from(fmt, seed.head, at)
        if name == "n_dims":
            v = rng.choice([0, 1, 2, 3, 4, 5, 2**32 - 1])
        elif name == "type":
            v = rng.choice([0, 1, 2, 8, 12, 14, 15, 30, 39, 2**32 - 1, rng.getrandbits(32)])
        elif name == "offset":
            v = rng.choice([0, orig + 1, orig + 32, orig - 32, orig + 4096, 2**40, 2**64 - 1, orig * 2])
        else:
            v = _odd_int(rng, orig)
        return seed.patched(at, fmt, v), f"tensor field {name} at {at} = {v}"
    m = seed.model.copy()
    t = rng.choice(m.tensors)
    if what == "rename":
        new = rng.choice([b"", b"x" * 63, b"x" * 64, b"\xff\xfe", m.tensors[0].name, t.name + b"x"])
        label = f"tensor rename {t.name[:40]!r} -> {new[:20]!r}"
        t.name = new
    elif what == "drop":
        m.tensors.remove(t)
        label = f"tensor drop {t.name[:40]!r}"
    elif what == "reshape":
        t = m.tensor("token_embd.weight") if rng.random() < 0.4 else t
        n = 1
        for d in t.dims:
            n *= d
        choice = rng.choice(["1d", "swap", "extra", "halve"])
        if choice == "1d":
            t.dims = [n]
        elif choice == "swap":
            t.dims = list(reversed(t.dims))
        elif choice == "extra":
            t.dims = t.dims + [1]
        else:
            t.dims = [t.dims[0]] + [max(d // 2, 1) for d in t.dims[1:]]
        label = f"tensor reshape {t.name[:40]!r} {choice} -> {t.dims}"
    elif what == "retype":
        t.ggml_type = rng.choice([0, 1, 8, 12, 14, 30])
        label = f"tensor retype {t.name[:40]!r} -> {t.ggml_type}"
    else:
        v, vt = rng.choice([(0, VT.UINT32), (3, VT.UINT32), (1, VT.UINT32), (64, VT.UINT32), (2**31, VT.UINT32),
                            (2**40, VT.UINT64), ("32", VT.STRING), (32.0, VT.FLOAT32), (-32, VT.INT32)])
        m.set("general.alignment", v, vt)
        label = f"alignment {v!r} as {vt.name}"
    return [m.to_bytes()[0]], label


def _case_truncate(seed: Seed, rng: random.Random):
    f = seed.fields
    points = [8, 16, 24, f.data_offset] + [x for d in f.kv for x in d.values()] + \
             [x for d in f.tensor for k, x in d.items() if k != "dims"]
    if rng.random() < 0.7:
        at = rng.choice(points) + rng.randint(-3, 3)
    else:
        at = rng.randrange(len(seed.blob))
    at = max(0, min(at, len(seed.blob) - 1))
    if at <= len(seed.head):
        return [seed.head[:at]], f"truncate at {at}"
    return [seed.head, seed.data[:at - len(seed.head)]], f"truncate at {at}"


def _case_bytes(seed: Seed, rng: random.Random):
    head = bytearray(seed.head)
    if rng.random() < 0.5:
        for _ in range(rng.randint(1, 8)):
            head[rng.randrange(len(head))] ^= 1 << rng.randrange(8)
        return [head, seed.data], "bit flips in the header"
    fmt = rng.choice(["<I", "<Q"])
    at = rng.randrange(0, len(head) - 8)
    _patch(head, at, fmt, rng.getrandbits(8 * struct.calcsize(fmt)))
    return [head, seed.data], f"random word at {at}"


# -- worker -----------------------------------------------------------------------------------


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # "5": reset VmHWM to the current RSS (Linux 4.0+)
        f.write("5")


def _peak_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _vm_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


class CaseTimeout(BaseException):
    """Raised by the alarm; a BaseException so nothing in the runtime can swallow it."""


def run_worker(spec: dict) -> dict:
    import contextlib
    import gc
    import io
    import resource
    import signal
    import traceback

    # LANGUAGE=C: argparse looks its messages up with gettext, ~20 ms a parser otherwise
    os.environ.update(REFLEX_DEBUG="1", REFLEX_NO_INDEX="1", HF_HUB_OFFLINE="1", LANGUAGE="C")
    from reflex_runtime import cli

    work = spec["workdir"]
    path = os.path.join(work, "case.gguf")

    def run(parts: list) -> tuple[int, str]:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.writev(fd, parts)
        finally:
            os.close(fd)
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = cli.main(["generate", "hi", "-m", path, "--backend", "cpu", "-n", "1", "--ctx", "64"])
        return code, err.getvalue()

    seeds = [Seed(s["name"], s["path"], s["keys"], s.get("systematic", True)) for s in spec["seeds"]]
    for seed in seeds:  # warm up: imports, first forward
        code, err = run([seed.blob])
        if code != 0:
            return {"fatal": f"seed {seed.name} does not run unmodified: exit {code}: {err.strip()[:300]}"}
    base_rss = _rss_bytes()
    base_fds = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_AS, (_vm_bytes() + ADDRESS_SPACE_MARGIN, resource.RLIM_INFINITY))

    def alarm(*_):
        raise CaseTimeout()

    signal.signal(signal.SIGALRM, alarm)
    signal.signal(signal.SIGPROF, alarm)
    outcomes: dict[str, int] = {}
    failures: list[dict] = []
    slowest = (0.0, "")
    slowest_wall = 0.0
    growth = (0, "")
    n = 0
    for seed, (start, stop, step) in zip(seeds, spec["ranges"]):
        for i in range(start, stop, step):
            parts, what = make_case(seed, i)
            if n % 64 == 0:
                gc.collect()  # the loader pauses the collector while it loads: let it catch up
            start_rss = _rss_bytes()
            _reset_peak_rss()
            t0, c0 = time.perf_counter(), time.process_time()
            signal.setitimer(signal.ITIMER_PROF, CASE_SECONDS + 1)
            signal.setitimer(signal.ITIMER_REAL, WALL_SECONDS)
            problem = None
            try:
                code, err = run(parts)
                lines = err.strip().splitlines()
                if code not in (0, 3, 4):
                    problem = f"exit {code}: {err.strip()[:400]}"
                elif code and (len(lines) != 1 or not lines[0].startswith("reflex: error: ")):
                    problem = f"exit {code} but stderr is not one error line: {err[:400]!r}"
                elif code and "MemoryError" in err:
                    problem = f"an allocation failed: {err.strip()[:300]}"
                elif code:
                    lines[0].encode("utf-8")  # strict: no surrogates in messages
                outcome = {0: "accepted", 3: "model_file_error", 4: "unsupported_model"}.get(code, f"exit {code}")
            except CaseTimeout:
                problem, outcome = f"over {CASE_SECONDS + 1:g} CPU s or {WALL_SECONDS:g} s", "timeout"
            except UnicodeEncodeError as e:
                problem, outcome = f"message not UTF-8 encodable: {e}", "bad_message"
            except BaseException as e:  # noqa: BLE001 - anything but a ReflexError is a finding
                problem, outcome = "".join(traceback.format_exception_only(type(e), e)).strip()[:400], type(e).__name__
                problem += " | " + " <- ".join(f"{fr.name}:{fr.lineno}" for fr in traceback.extract_tb(e.__traceback__)[-4:])
            finally:
                signal.setitimer(signal.ITIMER_PROF, 0)
                signal.setitimer(signal.ITIMER_REAL, 0)
                gc.unfreeze()  # the loader freezes what it made (cold-path tuning): let it go
            cpu, wall = time.process_time() - c0, time.perf_counter() - t0
            grown = _peak_rss_bytes() - start_rss
            if cpu > CASE_SECONDS and problem is None:
                problem = f"took {cpu:.1f} CPU s"
            if grown > RSS_GROWTH_LIMIT and problem is None:
                problem = f"grew the process by {grown >> 20} MiB"
            if cpu > slowest[0]:
                slowest = (cpu, f"{seed.name}#{i}: {what}")
            slowest_wall = max(slowest_wall, wall)
            if grown > growth[0]:
                growth = (grown, f"{seed.name}#{i}: {what}")
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            n += 1
            if problem and len(failures) < 50:
                failures.append({"case": f"{seed.name}#{i}", "what": what[:200], "problem": problem})
    gc.collect()
    return {"cases": n, "outcomes": outcomes, "failures": failures, "slowest_cpu_s": round(slowest[0], 3),
            "slowest": slowest[1][:200], "slowest_wall_s": round(slowest_wall, 3),
            "max_case_rss_growth_mb": round(growth[0] / 2**20, 1), "max_growth_case": growth[1][:200],
            "base_rss_mb": round(base_rss / 2**20, 1), "end_rss_mb": round(_rss_bytes() / 2**20, 1),
            "fds_left_open": len(os.listdir("/proc/self/fd")) - base_fds}


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    result = run_worker(spec)
    with open(spec["out"], "w") as f:
        json.dump(result, f)
