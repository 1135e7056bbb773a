"""Qwen3.5 (`qwen35`, `qwen35moe`) on the GPU (the layer diagram is in config.py):

    x += mixer(norm(x))     Gated DeltaNet (blocks.DeltaNet) on recurrent layers, gated full
                            attention (blocks.GatedAttention) on the others
    x += ffn(norm(x))       SwiGLU (qwen35), or routed experts + gated shared expert (qwen35moe)
Every block adds into the residual stream in its last kernel.

The DeltaNet layers' conv and delta-rule states sit in one arena piece, `dn_state` (a "slot":
every recurrent layer's states, laid out by plan()), which a new request (position 0) restarts
from zero and a decode step updates in place, so the step stays one CUDA graph. system1 scores by
forking (GpuModel.scoring): fork(n) copies the slot n times into a separate allocation, and a
forward(seqs=n) runs sequence s on copy s.
MTP (nextn) blocks a file may hold are never read.
"""

from __future__ import annotations

from ...modelfile import tensor_names as T
from ...gpu.blocks import Batch, GatedFFN
from ...gpu.layer import DecoderLayer
from ...gpu.model import MAX_SEQS, GpuModel
from .blocks import DeltaNet, GatedAttention, SharedMoe


class Qwen35Gpu(GpuModel):
    scoring = "fork"

    def plan(self) -> None:
        self.slot_bytes = 0  # the state slot: each recurrent layer's conv and delta-rule states in turn
        self._forks = (0, 0)  # (device pointer, slots) of the forked state copies
        super().plan()
        # continuous batching (gpu/batch.py): slot 0 is the runner's own, sequence i's is slot i + 1,
        # as its cache range is range i + 1
        self.n_slots = self.max_seqs + 1 if self.max_seqs > 1 else 1
        self.arena.reserve("dn_state", self.slot_bytes * self.n_slots)

    def mixers_batch(self) -> bool:
        """Recurrent layers batch with a state slot per sequence (state_of)."""
        return all(isinstance(ly.mixer, (DeltaNet, GatedAttention)) for ly in self.layers)

    def decoder_layer(self, il: int) -> DecoderLayer:
        c = self.cfg
        if c.extra["recurrent_layers"][il]:
            conv_bytes, ssm_bytes = DeltaNet.state_bytes(c)
            mixer = DeltaNet(self, il, self.slot_bytes, self.slot_bytes + conv_bytes)
            self.slot_bytes += conv_bytes + ssm_bytes
        else:
            mixer = GatedAttention(self, il, c.rope_theta)
        ffn = SharedMoe(self, il) if c.arch == "qwen35moe" else GatedFFN(self, c.n_ff, GatedFFN.SILU)
        return DecoderLayer(mixer, ffn, ffn_norm=T.POST_ATTN_NORM)  # the file's name for the pre-FFN norm

    # -- recurrent state ------------------------------------------------------------------------

    def state_of(self, b: Batch) -> tuple[int, int, int]:
        """(slot 0's device pointer, bytes between slots, device ints: each sequence's slot or 0
        for slot s) of the state this batch continues: system1's forks, the decode rows of a
        batch (row_slot, written by the batcher), one sequence's prompt chunk in its cache range
        (kv_base) or the runner's own slot."""
        if b.forked:
            return self._forks[0], self.slot_bytes, 0
        if b.rows:
            return self.p("dn_state"), self.slot_bytes, self.p("row_slot")
        return self.p("dn_state") + b.kv_base // self.range_slots * self.slot_bytes, 0, 0

    def fork(self, n_seq: int, kv_base: int = 0) -> None:
        dev, s = self.launch.dev, self.launch.stream
        src = self.p("dn_state") + kv_base // self.range_slots * self.slot_bytes  # as state_of's prompt chunk
        ptr, have = self._forks
        if have < n_seq:
            if ptr:
                dev.sync(s)  # earlier passes may still read the old copies
                dev.free(ptr)
            ptr = dev.alloc(max(n_seq * self.slot_bytes, 4))
            self._forks = (ptr, n_seq)
        for k in range(n_seq if self.slot_bytes else 0):
            dev.dtod(ptr + k * self.slot_bytes, src, self.slot_bytes, s)

    def max_forks(self) -> int:
        """Sequences per forked pass: up to half the free device memory for their state copies."""
        if not self.slot_bytes:
            return MAX_SEQS
        free, _ = self.launch.dev.mem_info()
        return max(1, min(MAX_SEQS, free // 2 // self.slot_bytes))

    # -- for decode_bytes_per_token ---------------------------------------------------------------

    def unread_bytes_per_token(self) -> int:
        """Experts the router skips, and the MTP blocks (blk.n_layers and up)."""
        unread = super().unread_bytes_per_token()
        for name, ti in self.gguf.tensors.items():
            if name.startswith("blk.") and int(name.split(".")[1]) >= self.cfg.n_layers:
                unread += ti.nbytes
        return unread
