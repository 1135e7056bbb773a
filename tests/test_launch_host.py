"""The host side of a launch, without a GPU: gpu.driver.Kernel.launch hands cuLaunchKernel a void*
array holding each argument's address in kernel order (the fake device of the ABI tests stands in
for Kernel itself, so nothing else on the CPU checks this array), Launcher.role tags launches and
restores the outer role even when its block raises, and scripts/bench_host.py reports what it
measured."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from ctypes import c_float, c_int, c_long, c_void_p

import pytest

from reflex_runtime.gpu import driver

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Recorder:
    """The bindings' launch calls, recorded: the void* array read back at call time."""

    def __init__(self, real):
        self.real, self.calls = real, []

    def __getattr__(self, name):
        return getattr(self.real, name)

    def _read(self, params, n):
        return list((ctypes.c_void_p * n).from_address(params))

    def cuLaunchKernel(self, func, gx, gy, gz, bx, by, bz, shmem, stream, params, extra):
        self.calls.append(((gx, gy, gz), bx, shmem, params))
        return (self.real.CUresult.CUDA_SUCCESS,)

    def cuFuncSetAttribute(self, *args):
        self.calls.append(("attr",) + args[1:])
        return (self.real.CUresult.CUDA_SUCCESS,)


@pytest.mark.parametrize("n_args", [1, 7, 23, 47, 48, 60])  # both sides of the prebuilt array types' range
def test_kernel_launch_passes_each_arguments_address_in_order(monkeypatch, n_args):
    rec = _Recorder(driver.cu)
    monkeypatch.setattr(driver, "cu", rec)
    kinds = (c_void_p, c_int, c_long, c_float)
    args = [kinds[i % 4](i + 1) for i in range(n_args)]
    k = driver.Kernel("k", None)
    seen = []
    orig = rec.cuLaunchKernel

    def launch(*a):
        seen.append(rec._read(a[9], n_args))  # while the array is alive, as the driver reads it
        return orig(*a)

    rec.cuLaunchKernel = launch
    k.launch((3, 2, 1), 128, args, None, shmem=1000)
    assert rec.calls[-1][:3] == ((3, 2, 1), 128, 1000)
    assert seen == [[ctypes.addressof(a) for a in args]]
    k.launch(5, 64, args, None, shmem=500)  # an int grid; no new shared-memory attribute below the allowance
    assert rec.calls[-1][:3] == ((5, 1, 1), 64, 500)
    assert [c for c in rec.calls if c[0] == "attr"] == [("attr", driver.cu.CUfunction_attribute.
                                                        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 1000)]


def test_role_tags_launches_and_restores_the_outer_role_on_errors():
    from reflex_runtime.gpu.launch import Launcher

    class Dev:
        sm_count, cc, max_shared, smem_per_sm = 132, (9, 0), 232448, 233472

        def kernel(self, name):
            return type("K", (), {"launch": lambda *a, **k: None})()

    L = Launcher(Dev(), stream=None)
    with L.record() as got:
        with L.role("outer", 7):
            L.go("a", 1, 32, [])
            with pytest.raises(KeyError):
                with L.role("inner", 3):
                    L.go("b", 1, 32, [])
                    raise KeyError("x")
            L.go("c", 1, 32, [])
        L.go("d", 1, 32, [])
    assert [(x.role, x.weight_bytes) for x in got] == [("outer", 7), ("inner", 3), ("outer", 7), ("d", 0)]
    assert L.launches == 4


def test_bench_host_reports_launches_and_host_time(tmp_path):
    from reflex_runtime.modelfile.embedded import embedded_model_path

    out = tmp_path / "host.json"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_host.py"), embedded_model_path(),
                        "--tokens", "3,20", "--repeats", "2", "--out", str(out)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    assert d == json.loads(r.stdout) and d["arch"] == "gemma3" and d["layers"] == 18
    small, big = d["rows"]
    assert (small["tokens"], big["tokens"]) == (3, 20)
    # (3 tokens take the matrix-vector kernels, 20 the tensor-core ones: each path at least 4 launches a layer)
    assert small["launches"] >= 4 * d["layers"] and big["launches"] >= 4 * d["layers"]
    assert all(row["host_ms"] > 0 and row["host_us_per_launch"] > 0 for row in d["rows"])
    bad = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_host.py"), embedded_model_path(),
                          "--tokens", "16,x"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--tokens" in bad.stderr


def test_cached_segments_hold_what_a_fresh_build_would():
    """ops/gemm.py's GemmSegs and ops/matvec.py's MvSegs are cached by what they hold (a layer's
    products take the same every prompt): a hit is the same object, and every part of the key
    (matrices, rows, outputs, tile width, split scratch, counters) changes the bytes it should."""
    from reflex_runtime.gpu.ops import gemm, matvec
    from reflex_runtime.gpu.ops.common import Weight

    def fresh_gemm(ws, ys, bn, part, counters):
        s, end = gemm.GemmSegs(), 0
        for i, (w, y) in enumerate(zip(ws, ys)):
            s.w[i], s.y[i], s.rows[i] = w.ptr, y, w.rows
            end += -(-w.rows // bn)
            s.tile_end[i] = end
        for i in range(len(ws), 3):
            s.tile_end[i] = end
        s.part, s.counters = part, counters
        return bytes(s)

    q = Weight(1 << 32, "Q8_0", 2048, 1024, 1088)
    q_fewer = Weight(1 << 32, "Q8_0", 1024, 1024, 1088)  # the same pointer, fewer rows (a row view)
    k = Weight(2 << 32, "Q8_0", 512, 1024, 1088)
    ys = (5 << 32, 6 << 32)
    seen = set()
    for ws in ((q, k), (q_fewer, k), (q,)):
        for bn in (64, 128):
            for part, counters in ((0, 0), (7 << 32, 8 << 32)):
                got = gemm._segs(ws, ys[:len(ws)], bn, part, counters)
                assert got is gemm._segs(tuple(ws), ys[:len(ws)], bn, part, counters)
                assert bytes(got) == fresh_gemm(ws, ys, bn, part, counters)
                seen.add(bytes(got))
    assert len(seen) == 12

    for ws, one in (((q, k), True), ((q_fewer, k), True), ((q,), False)):
        segs, wpr, rpw, blocks = matvec._plan(ws, ys[:len(ws)], one, 32 * 132)
        assert [(segs.w[i], segs.y[i], segs.rows[i]) for i in range(len(ws))] == \
            [(w.ptr, y, w.rows) for w, y in zip(ws, ys)]
        assert wpr == matvec._warps_per_row(32 * 132, sum(w.rows for w in ws), 1024)
        assert rpw == matvec.rows_per_warp([w.rows for w in ws], 1 if one else 2, wpr)
        assert blocks == -(-sum(w.rows for w in ws) // (8 // wpr * rpw))
