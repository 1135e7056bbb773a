"""kernels/quant.cuh (the block decoders every CUDA kernel uses) against gguf-py's dequantizers.

The header is plain C when compiled without nvcc, so g++ builds it into a tiny shared library
here and we compare it, weight for weight, on random blocks of every type at awkward row
lengths. This runs in CI without a GPU; the GPU tests check the kernels built on top of it.
"""

import ctypes
import os
import shutil
import subprocess

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from quant_blocks import LAYOUT, random_row

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_SRC = r"""
#include "quant.cuh"
typedef void (*fn8)(const uint8_t*, int, float*);
int dequant_row(int type, const uint8_t* row, int k, float* out) {
    fn8 f = 0;
    switch (type) {
        case RX_F32: f = dequant8_f32; break;
        case RX_F16: f = dequant8_f16; break;
        case RX_BF16: f = dequant8_bf16; break;
        case RX_Q8_0: f = dequant8_q8_0; break;
        case RX_Q4_0: f = dequant8_q4_0; break;
        case RX_Q5_0: f = dequant8_q5_0; break;
        case RX_Q4_1: f = dequant8_q4_1; break;
        case RX_Q5_1: f = dequant8_q5_1; break;
        case RX_Q4_K: f = dequant8_q4_k; break;
        case RX_Q5_K: f = dequant8_q5_k; break;
        case RX_Q6_K: f = dequant8_q6_k; break;
        default: return -1;
    }
    for (int g = 0; g < k / 8; g++) f(row, g, out + 8 * g);
    return 0;
}
long row_bytes(int type, long k) { return rx_row_bytes(type, k); }
"""

@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.fail("a C compiler is needed to build the host copy of kernels/quant.cuh")
    d = tmp_path_factory.mktemp("quant")
    src = d / "quant_host.c"
    src.write_text(_SRC)
    so = d / "quant_host.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-x", "c", "-I", os.path.join(ROOT, "kernels"), str(src), "-o", str(so)],
                   check=True)
    lib = ctypes.CDLL(str(so))
    lib.dequant_row.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    lib.row_bytes.restype = ctypes.c_long
    lib.row_bytes.argtypes = [ctypes.c_int, ctypes.c_long]
    return lib


@pytest.mark.parametrize("qtype", list(LAYOUT), ids=lambda t: t.name)
@pytest.mark.parametrize("n_super", [1, 3, 5])
def test_host_decoder_matches_gguf(lib, qtype, n_super):
    rng = np.random.default_rng(1000 * int(qtype) + n_super)
    bs = LAYOUT[qtype][0]
    # awkward lengths: odd numbers of blocks, not powers of two
    k = n_super * 256 if bs == 256 else (n_super * 8 + 1) * 32
    raw = np.ascontiguousarray(random_row(qtype, k, rng))
    assert lib.row_bytes(int(qtype), k) == raw.nbytes
    ours = np.full(k, np.nan, dtype=np.float32)  # poisoned: every weight must be written
    assert lib.dequant_row(int(qtype), raw.ctypes.data, k, ours.ctypes.data) == 0
    theirs = dequantize(raw, qtype).astype(np.float32).reshape(-1)
    assert theirs.shape == ours.shape
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6 * float(np.abs(theirs).max() + 1e-30))


def test_f16_decoder_is_exact_for_every_half(lib):
    every = np.arange(65536, dtype=np.uint16)
    ours = np.empty(65536, dtype=np.float32)
    lib.dequant_row(int(Q.F16), every.ctypes.data, 65536, ours.ctypes.data)
    ref = every.view(np.float16).astype(np.float32)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(ours), nan)
    assert np.array_equal(ours[~nan].view(np.uint32), ref[~nan].view(np.uint32))


# -- kernels/mvs_decode.cuh: the staged decode kernels' integer 32-weight dot products, the fast float decoders -------------

_MVS_SRC = r"""
#include "mvs_decode.cuh"
/* 8 weights of group g through the tensor-core kernels' decoders (-1: no such decoder) */
int fast8(int type, const uint8_t* row, int g, float* out) {
    switch (type) {
        case RX_Q8_0: dequant8_fast_q8_0(row, g, out); return 0;
        case RX_Q4_K: dequant8_fast_q4_k(row, g, out); return 0;
        case RX_Q6_K: dequant8_fast_q6_k(row, g, out); return 0;
    }
    return -1;
}
void plain8(int type, const uint8_t* row, int g, float* out) {
    if (type == RX_Q8_0) dequant8_q8_0(row, g, out);
    else if (type == RX_Q4_K) dequant8_q4_k(row, g, out);
    else dequant8_q6_k(row, g, out);
}
/* the same with the lane's inputs quantized to int16 first (the kernels' integer dots) */
float idot_unit(int type, const uint8_t* row, const float* x32, int u) {
    float sum = 0.f;
    for (int i = 0; i < 32; i++) sum += x32[i];
    MvsQ q;
    mvs_quant32(x32, sum, &q);
    switch (type) {
        case RX_Q8_0: return mvs_idot_q8_0(row, &q, u);
        case RX_Q4_K: return mvs_idot_q4_k(row, &q, u);
        case RX_Q6_K: return mvs_idot_q6_k(row, &q, u);
    }
    return -1e30f;
}
"""


@pytest.fixture(scope="module")
def mvs_lib(tmp_path_factory):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.fail("a C compiler is needed to build the host copy of kernels/mvs_decode.cuh")
    d = tmp_path_factory.mktemp("mvs")
    src = d / "mvs_host.c"
    src.write_text(_MVS_SRC)
    so = d / "mvs_host.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-x", "c", "-I", os.path.join(ROOT, "kernels"), str(src), "-o", str(so)],
                   check=True)
    lib = ctypes.CDLL(str(so))
    lib.fast8.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    lib.plain8.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    lib.idot_unit.restype = ctypes.c_float
    lib.idot_unit.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    return lib


def _inputs(rng, k, trial):
    x = rng.standard_normal(k).astype(np.float32)
    if trial == 1:
        x[:] = 1.0  # the minimum terms of Q4_K see sum(x) at its largest
    elif trial == 2:
        x[::29] *= 300.0  # an outlier in most units: the rest of the unit gets few int16 levels
    elif trial == 3:
        x *= np.float32(1e-30)  # tiny inputs: the scale must not underflow to zero
    return x


@pytest.mark.parametrize("qtype,k,shift", [(Q.Q8_0, 416, 0), (Q.Q8_0, 416, 2), (Q.Q8_0, 1024, 2),
                                           (Q.Q4_K, 768, 0), (Q.Q6_K, 768, 0), (Q.Q6_K, 768, 2)])
def test_integer_unit_dots_match_gguf(mvs_lib, qtype, k, shift):
    """The integer dots (inputs as int16 with one scale per 32, dp2a products) against gguf-py's
    weights times the float inputs: within the rounding of x to its int16 grid (half a step per
    input times |w|) plus float rounding."""
    rng = np.random.default_rng([int(qtype), k, shift, 16])
    for trial in range(5):
        raw = random_row(qtype, k, rng)
        buf = np.zeros(raw.nbytes + 16, dtype=np.uint8)
        buf[shift:shift + raw.nbytes] = raw
        x = _inputs(rng, k, trial)
        dense = dequantize(raw, qtype).astype(np.float64).reshape(-1)
        for u in range(k // 32):
            xu = np.ascontiguousarray(x[32 * u:32 * u + 32])
            wu = dense[32 * u:32 * u + 32]
            got = mvs_lib.idot_unit(int(qtype), buf.ctypes.data + shift, xu.ctypes.data, u)
            want = float(wu @ xu)
            step = float(np.abs(xu).max()) / 32767.0
            bound = 0.5 * step * float(np.abs(wu).sum()) * 1.001 + 2e-6 * float(np.abs(wu) @ np.abs(xu)) + 1e-37
            assert abs(got - want) <= bound, (trial, u, got, want, bound)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
def test_integer_unit_dots_keep_non_finite_inputs_visible(mvs_lib, qtype):
    """A NaN or infinite input makes the unit's dot NaN, as the float path's would be non-finite:
    quantizing must not turn it into a finite number."""
    rng = np.random.default_rng(int(qtype))
    raw = random_row(qtype, 256, rng)
    buf = np.zeros(raw.nbytes + 16, dtype=np.uint8)
    buf[:raw.nbytes] = raw
    for bad in (np.nan, np.inf, -np.inf):
        x = rng.standard_normal(32).astype(np.float32)
        x[7] = bad
        assert not np.isfinite(mvs_lib.idot_unit(int(qtype), buf.ctypes.data, x.ctypes.data, 0)), bad
    zeros = np.zeros(32, dtype=np.float32)
    assert mvs_lib.idot_unit(int(qtype), buf.ctypes.data, zeros.ctypes.data, 0) == 0.0


@pytest.mark.parametrize("qtype,shift", [(Q.Q8_0, 0), (Q.Q8_0, 2), (Q.Q4_K, 0), (Q.Q6_K, 0), (Q.Q6_K, 2)], ids=str)
def test_fast_float_decoders_are_bit_identical(mvs_lib, qtype, shift):
    """The kernels' float decoders (mantissa-trick bytes, 32-bit loads) give quant.cuh's weights bit
    for bit, on every group of random rows (rows 2 bytes off a 4-byte boundary too), and gguf-py's."""
    rng = np.random.default_rng([int(qtype), shift, 8])
    k = 5 * 256
    for trial in range(4):
        raw = random_row(qtype, k, rng)
        buf = np.zeros(raw.nbytes + 16, dtype=np.uint8)
        buf[shift:shift + raw.nbytes] = raw
        fast, plain = np.full(k, np.nan, np.float32), np.full(k, np.nan, np.float32)
        for g in range(k // 8):
            assert mvs_lib.fast8(int(qtype), buf.ctypes.data + shift, g, fast.ctypes.data + 32 * g) == 0
            mvs_lib.plain8(int(qtype), buf.ctypes.data + shift, g, plain.ctypes.data + 32 * g)
        assert np.array_equal(fast.view(np.uint32), plain.view(np.uint32))
        np.testing.assert_allclose(fast, dequantize(raw, qtype).reshape(-1), rtol=1e-6, atol=1e-6 * float(np.abs(plain).max()))
