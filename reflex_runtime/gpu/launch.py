"""The launch plumbing every kernel launch goes through (the launches themselves live in ops/,
one module per kernel file): `Launcher.go` enqueues a kernel on the launcher's stream (so it can
be captured into a graph), `record()` keeps each launch with the role the calling block gave it
(`role()`) and the weight bytes it reads, which is how `reflex bench` times a decode step kind
by kind; and the per-device choices the ops consult (tensor cores, shared memory, the decode
kernels and their knobs, which the bench varies).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass

from ..envvars import env_number
from ..errors import BadSetting
from .ops.mvs import STATIC_SMEM_RESERVE

TC_MIN_CC = (8, 0)  # gemm.cu and flash_attn.cu (mma.sync with cp.async)
STATIC_SHARED = 1024  # headroom for the kernels' static shared memory (< 300 bytes today)
# The decode step's kernels (one token): "staged" = kernels/mvs.cu, moe_decode.cu and
# attn_decode.cu; "legacy" = the matrix-vector and attention kernels every batch size can use.
DECODE_KERNELS = os.environ.get("REFLEX_DECODE_KERNELS", "staged")


def knob(name: str, default, kind=int, minimum=None, maximum=None, choices=None):
    """The tuning variable `name` (unset or empty: default) as a number of `kind` in [minimum,
    maximum] or one of `choices`; anything else is a one-line BadSetting naming it."""
    return env_number(name, kind, default, lambda raw, why: BadSetting(f"{name}={raw!r}: {why}"), minimum, maximum,
                      choices)


@dataclass
class Launch:
    """One recorded launch: enough to replay it (its argument pack is kept alive here)."""

    kernel: object
    grid: tuple
    block: int
    args: list
    role: str
    weight_bytes: int
    shmem: int = 0


# the one-kernel step's options (gpu/fused.py): what its program or launch depends on beside
# fused_step itself; the runner rebuilds the step when one changes, and reflex bench reports them
FUSED_KNOBS = ("fused_x_early", "fused_lookahead", "fused_attn_early", "fused_attn_groups", "fused_fold_norms")


class Launcher:
    def __init__(self, device, stream):
        self.dev = device
        self.stream = stream
        self.launches = 0  # counted so tests can assert how many passes a request made
        self.pdl = False  # programmatic dependent launches (set while capturing the decode graph)
        # The shared-memory carveout of the PDL-chained launches: one for all, the largest. Left to
        # the driver, each kernel gets the smallest that holds its blocks, and an SM must drain
        # before it changes, so a launch could not share an SM with its predecessor: the blocks
        # of consecutive matrix kernels landed two on one SM and none on the next (s25's traces).
        self.carveout = knob("REFLEX_SMEM_CARVEOUT", 100, minimum=-1, maximum=100)
        # Warps the matrix-vector kernels aim to keep in flight: 32 per SM hides the load latency.
        self.target_warps = 32 * device.sm_count
        # sm_80+ kernels (gemm.cu, flash_attn.cu); False keeps the older kernels (tests force it)
        self.tc = tuple(device.cc) >= TC_MIN_CC
        self.max_dyn_shared = device.max_shared - STATIC_SHARED
        # Decode-step kernels and their knobs (kernels/mvs.cu, attn_decode.cu; the bench varies them).
        self.staged = self.attn_decode = DECODE_KERNELS != "legacy"
        self.mvs_blocks_per_sm = knob("REFLEX_MVS_BLOCKS_PER_SM", 1, minimum=1)
        # the LM head streamed by this many resident blocks an SM (kernels/mvs.cuh mvs_stream_body);
        # 0: staged blocks in waves like the other matrices. 2: LM head 95 -> 63 us a token on the
        # 0.6B Q8_0 shape, 106 -> 90 on Gemma 3 270M's (1: slower; results/2026-12-05-h200-s29)
        self.mvs_head_stream = knob("REFLEX_MVS_HEAD_STREAM", 2, choices=(0, 1, 2))
        # Weight bytes one block stages: two blocks of consecutive kernels must fit on an SM together,
        # so the next kernel's copies can run while this one computes.
        per_sm, per_block = device.smem_per_sm, device.max_shared
        self.mvs_budget = knob("REFLEX_MVS_BUDGET", 0, minimum=0) or max(
            8 * 1024, min(96 * 1024, per_block - STATIC_SMEM_RESERVE - 8 * 1024, per_sm // 2 - 12 * 1024))
        # staged launches' blocks made larger when that saves a wave (mvs.plan); 0 turns it off
        self.mvs_waves = os.environ.get("REFLEX_MVS_WAVES", "1") != "0"
        # 1: Gemma's post-norms folded into the next matrix kernel of a decode step (kernels/mvs.cuh
        # mvs_post_x, the _post kernels) instead of a reflex_rmsnorm launch each: Gemma 3 270M's
        # shape 1,391 -> 1,588 tok/s (results/2026-12-05-h200-s29)
        self.post_fold = bool(knob("REFLEX_POST_FOLD", 1, choices=(0, 1)))
        # a prompt's float32 router logits through a tiled GEMM (moe.router_mm), not the matrix-vector kernel
        self.router_mm = os.environ.get("REFLEX_ROUTER_MM", "1") != "0"
        # at most this many K slices of that GEMM while its tiles leave SMs idle (moe.router_mm_splits); 1: none
        self.router_splits = knob("REFLEX_ROUTER_SPLITS", 8, choices=(1, 2, 4, 8))
        # pairs per tile of a prompt's grouped expert kernels: 0 the default 64 (moe.tile_for), 32 or 64 forces it
        self.moe_tile = knob("REFLEX_MOE_TILE", 0, choices=(0, 32, 64))
        # a prompt's latent attention (DeepSeek) on tensor cores (kernels/mla_flash.cu); 0: mla.cu's kernel
        self.mla_flash = os.environ.get("REFLEX_MLA_FLASH", "1") != "0"
        self.attn_min_keys = knob("REFLEX_ATTN_MIN_KEYS", 32, minimum=1)
        # blocks sharing a KV head's query heads at short contexts (kernels/attn_decode.cu): up to 4
        # (the 30B-A3B shape's decode 299 -> 324 tok/s, attention 687 -> 471 us a token; 2: 316, 8: 323;
        # results/2026-12-03-h200-s17)
        self.attn_head_groups = knob("REFLEX_ATTN_HEAD_GROUPS", 4, minimum=1, maximum=64)
        self.fuse_rope = os.environ.get("REFLEX_FUSE_ROPE", "1") != "0"  # rope + cache store inside it
        # groups of at most 2 or 4 query heads a KV head run reflex_attn_decode_g2 / _g4, registers for
        # that many (95 / 80 against 117: five blocks an SM fit); 0: reflex_attn_decode for every group
        self.attn_group_kernels = bool(knob("REFLEX_ATTN_GROUP_KERNELS", 1, choices=(0, 1)))
        # 1: groups of at most 8 query heads with hd, hd_v <= 128 walk the keys on tensor cores, each warp
        # its own (reflex_attn_decode_t2 / _t4 / _t8, sm_80+), in a decode step over at least
        # attn_tc_from keys: the runner captures that step's graph apart (attn_context). On an H100 they
        # were 2.5-7% faster from 5,120 keys on, 1% slower at 4,096 (0.6B Q8_0, PERFORMANCE_NOTES s37)
        self.attn_tc = bool(knob("REFLEX_ATTN_TC", 1, choices=(0, 1)))
        # a shorter context keeps the tile kernels: the tensor-core ones hold 3 blocks an SM, not 5, and
        # cost tg128 8% on an H100 with their tile path (s36), 8% at 2,048 keys, 1% at 4,096 (s37)
        self.attn_tc_from = knob("REFLEX_ATTN_TC_FROM", 4608, minimum=0)
        self.attn_short = False  # set by attn_context: the step's context is under attn_tc_from
        # in those kernels, a slice of fewer keys goes through the tiles, whose first tile is staged before the
        # kernel waits for its predecessor (a short context's few keys: tg128's slices hold <= 32)
        self.attn_tc_min_keys = knob("REFLEX_ATTN_TC_MIN_KEYS", 64, minimum=0)
        # a one-token context of 2 .. N slices is merged by the output projection as it reads the
        # attention's output (kernels/mvs.cuh MvsMerge), not by the attention's last block; 0: never.
        # Only where that projection's input is at most ..._K wide (mvs.takes_merge: Gemma 3 270M's
        # shape 1.027x, Qwen3-0.6B's, K = 2,048, 0.90x; results/2026-12-05-h100-s33)
        self.attn_out_merge = knob("REFLEX_ATTN_OUT_MERGE", 8, minimum=0, maximum=8)
        self.attn_out_merge_k = knob("REFLEX_ATTN_OUT_MERGE_K", 1024, minimum=0)
        # a dense model's decode step as one persistent kernel (gpu/fused.py): off until it beats the
        # kernel-per-op graph (issue 27's notes); the bench measures both
        self.fused_step = os.environ.get("REFLEX_FUSED_STEP", "0") == "1"
        # that kernel's options (kernels/fused_step.cu), all on: with the five 848 vs 803 tok/s on the
        # 0.6B Q8_0 shape, 1,158 vs 940 on Gemma 3 270M's (results/2026-12-05-h200-s29 call 1). x_early, a
        # matrix op's x copied into shared memory (once a block) before the next op's weight copies
        # leave, its norm weights staged an op earlier; lookahead, a matrix op stages the next matrix
        # op's first tile past the attention or a norm between them
        self.fused_x_early = bool(knob("REFLEX_FUSED_X_EARLY", 1, choices=(0, 1)))
        self.fused_lookahead = bool(knob("REFLEX_FUSED_LOOKAHEAD", 1, choices=(0, 1)))
        # and attn_early, the attention's first item reads what it may before the barrier ending q/k/v
        self.fused_attn_early = bool(knob("REFLEX_FUSED_ATTN_EARLY", 1, choices=(0, 1)))
        # and attn_groups, its attention's query heads shared by attn_head_groups blocks at short contexts
        self.fused_attn_groups = bool(knob("REFLEX_FUSED_ATTN_GROUPS", 1, choices=(0, 1)))
        # and fold_norms, Gemma's post-norms folded into the matrix op after each (no op of their own)
        self.fused_fold_norms = bool(knob("REFLEX_FUSED_FOLD_NORMS", 1, choices=(0, 1)))
        # 4: the decode attention at 16,384 tokens of context 564 vs 430 tok/s with 2 (results/2026-12-03-h200-s14);
        # 5 where the kernel fits five (attn_decode.splits caps it: reflex_attn_decode_g2 / _g4 do, the general
        # one four): Qwen3-0.6B tg128 1.014x, @d1024 1.013x, @d16384 1.002x (results/2026-12-05-h200-s34)
        self.attn_blocks_per_sm = knob("REFLEX_ATTN_BLOCKS_PER_SM", 5.0, float, minimum=0.25, maximum=64)
        # set while a decode step of several sequences is enqueued (GpuModel.forward rows): the
        # products then pick their kernels for decode rows (products.matvec_path, gemm.k_splits)
        self.decode_rows = False
        # a prompt's products whose tiles fill less than the GPU twice split K, summed in slice order
        # (gemm.k_splits); the scratch comes from the model's arena at bind (0: none, no split)
        self.prompt_splits = bool(knob("REFLEX_PROMPT_SPLITS", 1, choices=(0, 1)))
        self.gemm_part = self.gemm_counters = 0
        self._recorded: list[Launch] | None = None
        self._role = ""
        self._bytes = 0
        self._kernels: dict = {}  # name -> the device's kernel, asked once (go runs per launch)

    @contextmanager
    def record(self):
        """Keep every launch made inside the block (still enqueued as usual): yields the list."""
        self._recorded = out = []
        try:
            yield out
        finally:
            self._recorded = None

    def role(self, name: str, weight_bytes: int = 0) -> "_Role":
        """Tag the launches made inside with what they do (and the weight bytes they read)."""
        return _Role(self, name, weight_bytes)

    @contextmanager
    def attn_context(self, context: int | None):
        """Launch (or capture) the decode attention inside for a step over `context` keys: the
        tensor-core kernels from attn_tc_from keys on (attn_decode.kernel), the tile kernels below;
        None: no context known (a direct op call), every context the same kernel."""
        prev = self.attn_short
        self.attn_short = self.attn_short_for(context)
        try:
            yield
        finally:
            self.attn_short = prev

    def attn_short_for(self, context: int | None) -> bool:
        """Whether a step over `context` keys is under attn_tc_from (None: not known, not short)."""
        return context is not None and context < self.attn_tc_from

    def attn_tc_for(self, context: int | None) -> bool:
        """Whether a step over `context` keys takes the tensor-core attention."""
        return self.attn_tc and not self.attn_short_for(context)

    def go(self, name: str, grid, block: int, args: list, shmem: int = 0, cooperative: bool = False) -> None:
        """Enqueue kernel `name` (grid: an int or a 3-tuple) with its argument pack, in the
        kernel's parameter order (ops/ builds them; tests/test_launch_abi.py checks them).
        cooperative: a grid whose blocks must all be resident at once (not chained by PDL)."""
        kernel = self._kernels.get(name) or self._kernel(name)
        if cooperative:
            kernel.launch(grid, block, args, self.stream, shmem=shmem, cooperative=True)
        else:
            kernel.launch(grid, block, args, self.stream, shmem=shmem, pdl=self.pdl,
                          carveout=self.carveout if self.pdl else None)
        self.launches += 1
        if self._recorded is not None:
            g = grid if isinstance(grid, tuple) else (grid, 1, 1)
            self._recorded.append(Launch(kernel, g, block, args, self._role or name, self._bytes, shmem))

    def _kernel(self, name: str):
        k = self._kernels[name] = self.dev.kernel(name)
        return k


class _Role:
    """Launcher.role's block: a plain class, not a generator-based context manager (blocks enter
    one around almost every launch, and contextlib's costs a prompt ~1 us a launch)."""

    __slots__ = ("launcher", "role", "prev")

    def __init__(self, launcher: Launcher, name: str, weight_bytes: int):
        self.launcher, self.role = launcher, (name, weight_bytes)

    def __enter__(self) -> None:
        L = self.launcher
        self.prev = L._role, L._bytes
        L._role, L._bytes = self.role

    def __exit__(self, *exc) -> None:
        L = self.launcher
        L._role, L._bytes = self.prev
