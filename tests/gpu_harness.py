"""A thin numpy <-> device bridge for the GPU tests (never used by the package itself)."""

import numpy as np
from gguf import GGMLQuantizationType as Q

from quant_blocks import LAYOUT, random_matrix

# The weight types every tiny fixture is made in (Q4_K_M is the mixed file), and the prompt
# the engine tests use.
FIXTURE_TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "q4_k_m"]
PROMPT = "The capital of France is the city of"


def reference_greedy(ref, ids, n):
    """The numpy reference's n greedy tokens after prompt ids (token by token through its cache)."""
    cache = ref.new_cache(len(ids) + n + 1)
    logits = ref.forward(ids, cache)[-1]
    out = []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = ref.forward([out[-1]], cache)[0]
    return out


TYPE_NAMES = {Q.F32: "F32", Q.F16: "F16", Q.BF16: "BF16", Q.Q8_0: "Q8_0", Q.Q4_0: "Q4_0", Q.Q5_0: "Q5_0",
              Q.Q4_1: "Q4_1", Q.Q5_1: "Q5_1",
              Q.Q4_K: "Q4_K", Q.Q5_K: "Q5_K", Q.Q6_K: "Q6_K"}


def random_weight(gpu, qtype, rows, k, rng):
    """A random rows x k matrix of type qtype on the device (a gpu.ops.common Weight) and its float32 values."""
    from reflex_runtime.gpu.ops.common import Weight

    raw, dense = random_matrix(qtype, rows, k, rng)
    return Weight(gpu.put(raw), TYPE_NAMES[qtype], rows, k, raw.nbytes // rows), dense


def k_for(qtype, multiple_of_64: bool) -> int:
    """An awkward row length: an odd number of blocks (and of 64s when the tensor-core path needs it)."""
    if LAYOUT[qtype][0] == 256:
        return 768
    return 448 if multiple_of_64 else 416


def act_ref(g, act):
    g = g.astype(np.float64)
    if act == 0:
        return g / (1 + np.exp(-g))
    return 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))


def rms_ref(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


class GpuHarness:
    def __init__(self):
        from reflex_runtime.measure.coldstart import Timeline
        from reflex_runtime.gpu.bootstrap import DeviceBootstrap
        from reflex_runtime.gpu.launch import Launcher

        boot = DeviceBootstrap.start(Timeline())
        dev = boot.wait()
        assert dev is not None, boot.error
        self.dev, self.stream = dev, boot.stream
        self.launch = Launcher(dev, boot.stream)
        self._allocs = []

    def _check(self, result, what):
        from reflex_runtime.gpu.driver import check

        return check(result, what)

    def put(self, arr) -> int:
        """A device copy of arr, complete before anything later on the kernels' stream runs.
        (A plain cuMemcpyHtoD from pageable memory runs on the legacy stream and may return
        before its DMA lands; our stream is non-blocking, so kernels could read stale memory.)"""
        arr = np.ascontiguousarray(arr)
        ptr = self.dev.alloc(arr.nbytes)
        self._allocs.append(ptr)
        self.dev.htod(ptr, arr.ctypes.data, arr.nbytes, self.stream)
        self.sync()  # arr may be freed by the caller as soon as this returns
        return ptr

    def poisoned(self, shape, dtype=np.float32) -> int:
        """Device memory filled with NaN (floats) or -7 (ints): every output must be written."""
        arr = np.full(shape, np.nan if np.dtype(dtype).kind == "f" else -7, dtype=dtype)
        return self.put(arr)

    def get(self, ptr, shape, dtype=np.float32):
        from cuda.bindings import driver as cu

        out = np.empty(shape, dtype=dtype)
        self.sync()
        self._check(cu.cuMemcpyDtoH(out.ctypes.data, ptr, out.nbytes), "cuMemcpyDtoH")
        return out

    def sync(self):
        self.dev.sync(self.stream)

    def free_all(self):
        self.sync()
        for p in self._allocs:
            self.dev.free(p)
        self._allocs.clear()


def tree_batch(first: int, n_tok: int):
    """system1's batch in the kernel tests: a prompt's last 4 tokens at slots first.., then
    candidates of 3, 1 and 4 tokens after them. (prefix_len, seg_lo, q_pos): each candidate token
    sees the prompt and its own candidate's slots from seg_lo; positions restart per candidate."""
    import numpy as np

    assert n_tok == 12
    seg_lo = np.zeros(n_tok, dtype=np.int32)
    starts, s = [], first + 4
    for ln in (3, 1, 4):
        starts += [s] * ln
        s += ln
    seg_lo[4:] = starts
    q_pos = np.concatenate([np.arange(first, first + 4), [first + 4 + i for ln in (3, 1, 4) for i in range(ln)]])
    return first + 4, seg_lo, q_pos.astype(np.int32)
