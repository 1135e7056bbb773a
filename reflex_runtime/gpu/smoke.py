"""`reflex smoke`: prove the AOT pipeline on this GPU in well under a second.

Loads the fatbin with one cuModuleLoadData, resolves every kernel in the table, says whether
this GPU runs native SASS or the PTX fallback, and runs two known-answer kernels (y = a x + b,
and a Q8_0 matrix-vector product built here byte by byte). Exit 1 on any failure.
"""

from __future__ import annotations

import ctypes
import json
import struct
import sys


def _q8_0_rows(rows: list[list[int]], scales: list[float]) -> bytes:
    """Encode rows of int8 values (length % 32 == 0) as Q8_0 blocks with one scale per row."""
    out = bytearray()
    for vals, d in zip(rows, scales):
        for b in range(0, len(vals), 32):
            out += struct.pack("<e", d) + struct.pack("<32b", *vals[b:b + 32])
    return bytes(out)


def known_answers(dev, stream) -> list[str]:
    """Run the known-answer kernels; return a list of failures (empty when all pass)."""
    from . import products
    from .launch import Launcher
    from .ops.common import Weight
    from .ops.logits import smoke_axpb

    failures = []
    n = 1000  # not a multiple of the block size
    x = [0.25 * i for i in range(n)]
    xb = struct.pack(f"<{n}f", *x)
    dx, dy = dev.alloc(4 * n), dev.alloc(4 * n)
    host_ptr, host = dev.alloc_pinned(8 * n)
    ctypes.memmove(host_ptr, xb, 4 * n)
    dev.htod(dx, host_ptr, 4 * n, stream)
    L = Launcher(dev, stream)
    smoke_axpb(L, dx, dy, n, 3.0, 1.0)
    dev.dtoh(host_ptr + 4 * n, dy, 4 * n, stream)
    dev.sync(stream)
    y = struct.unpack(f"<{n}f", bytes(host[4 * n:8 * n]))
    bad = [i for i in range(n) if y[i] != 3.0 * x[i] + 1.0]
    if bad:
        failures.append(f"axpb wrong at {len(bad)} of {n} elements (first {bad[0]}: {y[bad[0]]})")

    # Q8_0 matrix-vector: 3 rows x 96 columns, weights q * d with q in [-127, 127].
    k, rows = 96, 3
    qs = [[((r * 37 + c * 11) % 255) - 127 for c in range(k)] for r in range(rows)]
    ds = [0.5, 0.25, 0.125]  # exact in f16
    blob = _q8_0_rows(qs, ds)
    xv = [((c % 7) - 3) * 0.5 for c in range(k)]
    expect = [sum(d * q * xc for q, xc in zip(qr, xv)) for qr, d in zip(qs, ds)]
    dw, dxv, dyv = dev.alloc(len(blob)), dev.alloc(4 * k), dev.alloc(4 * rows)
    ctypes.memmove(host_ptr, blob, len(blob))
    dev.htod(dw, host_ptr, len(blob), stream)
    dev.sync(stream)
    ctypes.memmove(host_ptr, struct.pack(f"<{k}f", *xv), 4 * k)
    dev.htod(dxv, host_ptr, 4 * k, stream)
    products.matmul(L, Weight(dw, "Q8_0", rows, k, len(blob) // rows), dxv, dyv, 1)
    dev.dtoh(host_ptr + 4 * n, dyv, 4 * rows, stream)
    dev.sync(stream)
    got = struct.unpack(f"<{rows}f", bytes(host[4 * n:4 * n + 4 * rows]))
    if any(abs(g - e) > 1e-3 * (1 + abs(e)) for g, e in zip(got, expect)):
        failures.append(f"Q8_0 matrix-vector gave {got}, expected {expect}")
    for p in (dx, dy, dw, dxv, dyv):
        dev.free(p)
    return failures


def main(args, timeline) -> int:
    from .bootstrap import DeviceBootstrap, fatbin_is_stale, kernels_dir, read_manifest
    from .ops import kernel_names

    boot = DeviceBootstrap.start(timeline)
    dev = boot.wait()
    manifest = read_manifest() or {}
    result = {"kernels_dir": kernels_dir(), "manifest_kernels": len(manifest.get("kernels", [])),
              "sass": manifest.get("sass"), "ptx": manifest.get("ptx"), "nvcc": manifest.get("nvcc")}
    ok = dev is not None
    if dev is None:
        result["error"] = boot.error
    else:
        missing = dev.resolve_all(manifest.get("kernels", []))
        result.update({"device": dev.name, "compute_capability": f"{dev.cc[0]}.{dev.cc[1]}",
                       "kernel_format": boot.kernel_format, "kernels_resolved": len(dev.kernels),
                       "kernels_in_table": len(kernel_names()), "driver_version": dev.driver_version})
        failures = known_answers(dev, boot.stream)
        if missing:
            failures.append(f"kernels missing from the fatbin: {', '.join(missing)}")
        if set(manifest.get("kernels", [])) != set(kernel_names()):
            failures.append("the manifest and this package's kernels (gpu/ops/) differ (rebuild the kernels)")
        stale = fatbin_is_stale(manifest)
        result["fatbin_matches_sources"] = None if stale is None else not stale
        if stale:
            failures.append("kernels/*.cu changed since the fatbin was built: run python scripts/build_kernels.py")
        result["known_answer"] = "pass" if not failures else "fail"
        if failures:
            result["error"] = "; ".join(failures)
            ok = False
    result["process_start_to_result_ms"] = round(timeline.elapsed() * 1000, 3)
    result["status"] = "PASS" if ok else "FAIL"
    if args.json:
        print(json.dumps(result))
    else:
        print("REFLEX_SMOKE " + " ".join(f"{k}={json.dumps(v) if isinstance(v, (list, dict, str)) and ' ' in str(v) else v}"
                                         for k, v in result.items()), flush=True)
    if not ok:
        print(f"reflex: smoke failed: {result.get('error')}", file=sys.stderr)
    return 0 if ok else 1
