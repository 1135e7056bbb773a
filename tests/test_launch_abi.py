"""Every kernel launch the GPU engine makes passes exactly the parameters the compiled kernel
expects, checked without a GPU.

nvcc compiles kernels/all.cu to PTX here, which lists each `extern "C"` kernel's parameters with
their sizes. A fake device stands in for the driver: it records each launch's ctypes argument
pack, and we run the real forward passes (prefill, decode step, system1 tree, samplers, scoring)
of tiny Qwen3 and Gemma 3 models through it. A wrong argument count, order of sizes, launch
shape, or a kernel missing from the table fails here instead of on the GPU.
"""

import ctypes
import glob
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

_SIZES = {"u64": 8, "s64": 8, "b64": 8, "f64": 8, "u32": 4, "s32": 4, "b32": 4, "f32": 4, "u16": 2, "s16": 2, "u8": 1, "s8": 1}


def find_nvcc():
    import build_kernels

    return build_kernels.find_nvcc()


@pytest.fixture(scope="module")
def ptx_params(tmp_path_factory):
    nvcc = find_nvcc()
    if nvcc is None:
        pytest.fail("nvcc is needed (CI has it): the kernels' parameter lists come from their PTX")
    out = tmp_path_factory.mktemp("ptx") / "all.ptx"
    subprocess.run([nvcc, "--ptx", "-std=c++17", "-arch=compute_75", "-o", str(out), os.path.join(ROOT, "kernels", "all.cu")],
                   check=True)
    text = out.read_text()
    params = {}
    for m in re.finditer(r"\.visible \.entry (\w+)\(\s*(.*?)\)", text, re.S):
        sizes = []
        for p in m.group(2).split(","):
            p = p.strip()
            arr = re.search(r"\.b8 \w+\[(\d+)\]", p)
            if arr:
                sizes.append(int(arr.group(1)))
            else:
                sizes.append(_SIZES[re.search(r"\.param \.(\w+)", p).group(1)])
        params[m.group(1)] = sizes
    return params


def test_kernel_table_matches_compiled_kernels(ptx_params):
    from reflex_runtime.gpu.kernels import KERNEL_NAMES

    assert set(KERNEL_NAMES) == set(ptx_params), set(KERNEL_NAMES) ^ set(ptx_params)


class FakeKernel:
    def __init__(self, name, dev):
        self.name, self.dev = name, dev

    def launch(self, grid, block, args, stream, shmem=0, pdl=False):
        want = self.dev.params[self.name]
        got = [ctypes.sizeof(a) for a in args]
        assert got == want, f"{self.name}: passed sizes {got}, kernel takes {want}"
        g = grid if isinstance(grid, tuple) else (grid, 1, 1)
        assert all(1 <= d < 2**31 for d in g) and g[1] < 65536 and g[2] < 65536, (self.name, g)
        assert 32 <= block <= 1024 and block % 32 == 0, (self.name, block)
        for a in args:  # device pointers must point into memory we handed out (or be NULL)
            if isinstance(a, ctypes.c_void_p) and a.value:
                assert self.dev.owns(a.value), f"{self.name}: pointer {a.value:#x} is outside every allocation"
        self.dev.launches.append((self.name, g, block))


class FakeDevice:
    """gpu.driver.Device's whole interface with no GPU behind it: memory is address ranges,
    copies and memsets check their ranges, launches check their argument packs (FakeKernel)."""

    name, cc, sm_count, total_mem, driver_version = "fake", (9, 0), 132, 80 << 30, 13000

    def __init__(self, params):
        self.params = params
        self.launches = []
        self.copies = []
        self._next = 1 << 32
        self._ranges = []
        self.kernels = {n: FakeKernel(n, self) for n in params}

    def make_current(self):
        pass

    def kernel(self, name):
        return self.kernels[name]

    def resolve_all(self, names):
        return [n for n in names if n not in self.kernels]

    def alloc(self, nbytes):
        p = self._next
        self._ranges.append((p, p + nbytes))
        self._next += -(-nbytes // 4096) * 4096 + 4096
        return p

    def free(self, ptr):
        assert any(a == ptr for a, _ in self._ranges), f"free of {ptr:#x}, which was never allocated"

    def alloc_pinned(self, nbytes):
        buf = (ctypes.c_char * nbytes)()
        self._pinned = getattr(self, "_pinned", []) + [buf]
        return ctypes.addressof(buf), memoryview(buf).cast("B")

    def owns(self, ptr, nbytes=1):
        return any(a <= ptr and ptr + nbytes <= b for a, b in self._ranges)

    def _device_range(self, ptr, nbytes, what):
        assert self.owns(ptr, nbytes), f"{what}: [{ptr:#x}, +{nbytes}) is outside every allocation"
        self.copies.append((what, ptr, nbytes))

    def memset32(self, ptr, value, count, stream):
        self._device_range(ptr, 4 * count, "memset32")

    def memset8(self, ptr, value, count, stream):
        self._device_range(ptr, count, "memset8")

    def htod(self, dst, src_ptr, nbytes, stream):
        self._device_range(dst, nbytes, "htod")

    def dtoh(self, dst_ptr, src, nbytes, stream):
        self._device_range(src, nbytes, "dtoh")

    def dtod(self, dst, src, nbytes, stream):
        self._device_range(dst, nbytes, "dtod")
        self._device_range(src, nbytes, "dtod")

    def mem_info(self):
        return self.total_mem, self.total_mem

    def stream(self):
        return object()

    def sync(self, stream):
        pass

    def event(self, timing=False):
        return object()

    def record(self, event, stream):
        pass

    def wait_event(self, event):
        pass

    def elapsed_ms(self, start, end):
        return 0.0

    def begin_capture(self, stream):
        pass

    def end_capture(self, stream):
        return None


def test_fake_device_has_the_whole_device_interface():
    """The fake stands in for gpu.driver.Device: it must offer every public method and attribute."""
    from reflex_runtime.gpu.driver import Device

    public = {n for n in dir(Device) if not n.startswith("_")}
    missing = {n for n in public if not hasattr(FakeDevice, n)} - {"load_fatbin"}
    assert not missing, missing


def _model(arch, params, path=None):
    from make_fixtures import make_fixture

    from reflex_runtime.families import gpu_model_class, gpu_unsupported, read_config
    from reflex_runtime.gguf_file import GGUFFile
    from reflex_runtime.gpu.launch import Launcher

    g = GGUFFile(path or make_fixture(arch, "q4_k_m").gguf)
    cfg = read_config(g)
    assert gpu_unsupported(cfg, g) is None
    model = gpu_model_class(cfg)(cfg, g, max_batch=64, n_ctx=256, max_new=256)
    dev = FakeDevice(params)
    base = dev.alloc(model.arena_bytes)
    model.bind(base, Launcher(dev, stream=None))
    return model, dev


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "qwen3moe", "qwen35", "qwen35moe"])
def test_forward_launches_match_kernel_abi(ptx_params, arch):
    from reflex_runtime.gpu.driver import RxState
    from reflex_runtime.gpu.model import ARGMAX_PARTS

    dec, dev = _model(arch, ptx_params)
    cfg = dec.cfg
    dec.forward(1)  # a decode step
    per_layer = len(dev.launches)
    assert per_layer < 14 * cfg.n_layers + 8, f"{per_layer} launches for one decode step"
    dec.forward(20, first=3)  # a short prefill: matrix-vector path
    dec.forward(64, tree=True, prefix_len=10, logit_row=9, logit_rows=55, logits=dev.alloc(4 * 55 * cfg.vocab_size))
    st = RxState(*[dec.p(n) for n in ("tokens", "pos", "slot", "n_kv", "step", "out_tokens")])
    dec.launch.argmax(dec.p("logits"), cfg.vocab_size, dec.p("amax_v"), dec.p("amax_i"), ARGMAX_PARTS, st, 0)
    dec.launch.sample(dec.p("logits"), cfg.vocab_size, dec.p("sampling"), st, 0)
    dec.launch.logprob_rows(dec.p("logits"), cfg.vocab_size, dec.p("tokens"), dec.p("pos"), dec.p("att"), 3)
    names = {n for n, _, _ in dev.launches}
    assert any(n.startswith("reflex_mm_") for n in names), "64 tokens should use the tensor-core kernel"
    assert "reflex_attn" in names
    if arch == "gemma3":
        assert any(n.startswith("reflex_mv_glu_") for n in names)
    if arch in ("qwen3moe", "qwen35moe"):  # both expert paths: per-pair matrix-vector, and grouped tensor cores
        for kind in ("reflex_moe_topk", "reflex_moe_mv_glu_", "reflex_moe_mv_down_", "reflex_moe_group",
                     "reflex_moe_mm_", "reflex_moe_combine"):
            assert any(n.startswith(kind) for n in names), kind
    if arch.startswith("qwen35"):
        # a short prefill (delta rule token by token) and a forked system1 pass of 3 sequences
        dec.forward(5)
        dec.fork(3)
        dec.forward(9, tree=True, prefix_len=4, logit_row=0, logit_rows=9, logits=dev.alloc(4 * 9 * cfg.vocab_size),
                    seqs=3, seq_max=4)
        names = {n for n, _, _ in dev.launches}
        for kind in ("reflex_dn_conv", "reflex_dn_conv_state", "reflex_dn_recurrent", "reflex_dn_chunked",
                     "reflex_dn_gated_norm", "reflex_gate_split", "reflex_sigmoid_mul"):
            assert kind in names, kind
        assert sum(1 for what, _, _ in dev.copies if what == "dtod") == 2 * 3, "one state copy (dst, src) per sequence"


@pytest.mark.parametrize("arch,flag", [("qwen35", "--fuse-qkv"), ("qwen35moe", "--fuse-gate-up-exps")])
def test_fused_qwen35_files_read_row_views_of_the_fused_tensors(ptx_params, arch, flag):
    """--fuse-qkv (attention layers' q|gate, k, v in one attn_qkv) and --fuse-gate-up-exps (per
    expert [gate | up] rows) run as views of the fused tensor: same launches as unfused files."""
    from fixtures_qwen35 import convert_variant
    from make_fixtures import make_fixture

    path = convert_variant(make_fixture(arch, "f32"), "f32", flag)
    dec, dev = _model(arch, ptx_params, path)
    c = dec.cfg
    dec.forward(1)
    dec.forward(70)  # tensor cores (and grouped experts)
    att = next(ly.mixer for ly in dec.layers if not c.extra["recurrent_layers"][dec.layers.index(ly)])
    if flag == "--fuse-qkv":
        w = att.w
        assert (w.q.rows, w.k.rows, w.v.rows) == (2 * c.n_head * c.head_dim, c.n_head_kv * c.head_dim,
                                                  c.n_head_kv * c.head_dim_v)
        assert w.k.ptr == w.q.ptr + w.q.rows * w.q.row_bytes and w.v.ptr == w.k.ptr + w.k.rows * w.k.row_bytes
    else:
        m = dec.layers[0].ffn.moe.w
        f = c.extra["n_ff_exp"][0]
        assert m.up.ptr == m.gate.ptr + f * m.gate.row_bytes and m.gate_up_stride == 2 * f * m.gate.row_bytes
        assert {n for n, _, _ in dev.launches} >= {"reflex_moe_mv_glu_f32", "reflex_moe_mm_f32"}


def test_moe_shapes_the_cuda_engine_refuses():
    from types import SimpleNamespace

    from reflex_runtime.gpu.moe import moe_unsupported

    def cfg(**kw):
        return SimpleNamespace(n_layers=2, extra=dict(dict(n_expert=128, n_expert_used=8, n_ff_exp=768), **kw))

    assert moe_unsupported(cfg()) is None  # Qwen3-30B-A3B
    assert "2048 experts" in moe_unsupported(cfg(n_expert=2048))
    assert "65 experts per token" in moe_unsupported(cfg(n_expert_used=65))
    assert "multiple of 32" in moe_unsupported(cfg(n_ff_exp=100))

    class File:  # a GGUF whose layer 1 stores gate and up experts in different types
        def tensor(self, name):
            return SimpleNamespace(type_name="Q6_K" if name == "blk.1.ffn_up_exps.weight" else "Q4_K")

    assert "layer 1 stores its expert gate as Q4_K and up as Q6_K" in moe_unsupported(cfg(), File())


def test_every_kernel_waits_for_its_predecessor_first():
    """The decode graph chains kernels as programmatic dependent launches: a kernel may start
    while the previous one runs, so each must call rx_pdl_begin() before touching memory."""
    checked = declared = 0
    for path in sorted(glob.glob(os.path.join(ROOT, "kernels", "*.cu"))):
        src = open(path).read()
        declared += src.count("__global__")
        for m in re.finditer(r"__global__[^{]*?\b(reflex_\w+)[^{]*\{", src):
            body = src[m.end():m.end() + 200].lstrip(" \\\n")
            assert body.startswith("rx_pdl_begin();"), f"{os.path.basename(path)}: {m.group(1)} does not start with rx_pdl_begin()"
            checked += 1
    assert checked == declared > 20, (checked, declared)


def test_no_runtime_compilation_in_the_package():
    """Nothing in the runtime package may compile code at run time: no NVRTC or nvJitLink
    import, no driver JIT linking; the fatbin is loaded with plain cuModuleLoadData."""
    pkg = os.path.join(ROOT, "reflex_runtime")
    banned = re.compile(r"^\s*(from|import)\s+[\w.]*(nvrtc|nvjitlink|nvvm)|cuLink\w*\(|cuModuleLoadDataEx|cuLibraryLoad",
                        re.M | re.I)
    checked = 0
    for dirpath, _, files in os.walk(pkg):
        for f in files:
            if f.endswith(".py"):
                text = open(os.path.join(dirpath, f)).read()
                assert not banned.search(text), f"{f}: {banned.search(text).group(0)}"
                checked += 1
    assert checked > 10


@pytest.mark.parametrize("max_batch,passes", [(512, 2), (4, 4)])  # 4: the 5-token prompt and the candidates in 2 passes each
def test_system1_on_a_recurrent_model_forks_the_state_and_batches_the_candidates(ptx_params, monkeypatch, max_batch,
                                                                                 passes):
    """The runner's "fork" scoring through the fake device: the prompt once, then every candidate's
    tokens but its last in one pass of independent sequences (two when they exceed a batch), one
    state copy per sequence, and each token scored from the right logits row."""
    from types import SimpleNamespace

    from make_fixtures import make_fixture

    import reflex_runtime.gpu.runner as runner_mod
    from reflex_runtime.coldstart import Timeline
    from reflex_runtime.families import gpu_model_class, read_config
    from reflex_runtime.gguf_file import GGUFFile

    monkeypatch.setattr(runner_mod, "MAX_BATCH", max_batch)
    g = GGUFFile(make_fixture("qwen35", "q8_0").gguf)
    cfg = read_config(g)
    dev = FakeDevice(ptx_params)
    boot = SimpleNamespace(wait=lambda: dev, stream=None, error=None, kernel_format="fake")
    runner = runner_mod.CudaRunner(boot, g, cfg, Timeline(), gpu_model_class(cfg), max_context=256)
    runner._load()
    assert runner.error is None, runner.error
    seen = {}

    def gather(logits, rows, toks, lengths):
        seen.update(rows=rows, toks=toks)
        return [[0.0] * n for n in lengths]

    runner._gather_logprobs = gather
    cands = [[1, 2, 3], [4], [5, 6], [7, 8, 9, 10]]
    runner.score([11, 12, 13, 14, 15], cands)
    assert runner.forward_passes == passes
    # rows: 0 = after the prompt; then the tails [1, 2], [5], [7, 8, 9] in order
    assert seen["rows"] == [0, 1, 2, 0, 0, 3, 0, 4, 5, 6] and seen["toks"] == [t for c in cands for t in c]
    assert sum(1 for what, _, _ in dev.copies if what == "dtod") == 2 * 3
    if passes == 2:  # the one batch's sequence starts, as written for the device
        ints = runner._in_view.cast("i")
        assert list(ints[runner._seq_at:runner._seq_at + 4]) == [0, 2, 3, 6]
