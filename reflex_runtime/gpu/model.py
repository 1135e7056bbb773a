"""What every family's GPU forward shares: the arena plan (weights, caches, activations, the
device-side decode state), binding weights in place once they are uploaded, and the forward pass
around the family's layers (embedding in, its decoder layers, LM head out).

A family subclasses GpuModel (families/<name>/gpu.py) and writes what differs:
  decoder_layer(il)  layer il as a gpu.layer.DecoderLayer: its mixer and FFN blocks (which
                     reserve their caches and activation buffers) and its norm tensors
  plan()             only to set embed_scale / softcap (or a layout shared by layers) first
and, where it has them, fork() / max_forks() (recurrent state) and unread_bytes_per_token().
The runner (gpu/runner.py) sees only this base class.
"""

from __future__ import annotations

from ..kvpool import KV_BLOCK
from ..modelfile import tensor_names as T
from .arena import Arena
from .blocks import Attention, Batch, LmHead, Residual, TensorReader
from .launch import Launcher
from .layer import DecoderLayer
from .ops import attn_decode, embed, gemm
from .ops.fused_step import OP_BYTES
from .ops.sample import ARGMAX_PARTS
from .step import int_array

MAX_SEQS = 256  # independent sequences in one forward pass (system1 candidates on recurrent models)


class GpuModel:
    """Sizes everything from the config, then runs forward passes for batches of tokens whose
    ids, positions and cache slots are already in the device state arrays."""

    embed_scale = 1.0
    softcap = 0.0
    # How system1 scores candidates (gpu/runner.py). "tree": the prompt and every candidate in one
    # pass, each candidate attending to the prompt and to itself (a tree mask: attention-only
    # models). "fork": recurrent state cannot be masked, so the prompt runs once, its state is
    # copied once per candidate (fork) and the candidates run as one batch of independent
    # sequences (forward(seqs=...)), their attention layers still under the tree mask.
    scoring = "tree"
    # gpu/residency.py's WeightStream while routed experts are still uploading (MoE files), else None
    residency = None

    def __init__(self, config, gguf, max_batch: int, n_ctx: int, max_new: int, max_seqs: int = 1,
                 kv_rows: int | None = None):
        self.cfg, self.gguf = config, gguf
        self.max_batch, self.n_ctx, self.max_new = max_batch, n_ctx, max_new
        # sequences decoded together (gpu/batch.py): their decode rows sit at state index 0..max_seqs-1,
        # a prompt chunk's tokens after them; each sequence's cache is its own range of n_ctx slots
        self.max_seqs = max_seqs
        # The caches' rows: one per slot, or with kv_rows a paged pool (kvpool.py) that the block
        # table kv_blocks maps the n_ctx logical slots into: range 0 (the runner's own) on rows
        # 0 .. n_ctx / ranges - 1 as they are, then one block that unmapped slots point at, then
        # the blocks the batcher hands out.
        self.paged = kv_rows is not None
        self.kv_rows = kv_rows or n_ctx
        self.weights_bytes = gguf.size - gguf.data_offset
        self.arena = Arena()
        self.arena.reserve("weights", self.weights_bytes)
        self._needs: dict[str, int] = {}
        c, t = config, max_batch
        self.need([(name, t * c.n_embd) for name in Residual.BUFFERS] + [(name, c.n_embd) for name in Residual.ONE_ROW])
        # argmax partials: ARGMAX_PARTS for reflex_argmax_*, one per block (<= one per row) for the
        # LM head with the pick fused; mvs_counters: [0] that head's, [1] the MoE router's (zeroed)
        self.need([("logits", max_seqs * c.vocab_size), ("amax_v", max(ARGMAX_PARTS, c.vocab_size)),
                   ("amax_i", max(ARGMAX_PARTS, c.vocab_size)), ("mvs_counters", 4)])
        self._rope_tables: dict[tuple, str] = {}  # (base, freq_scale, rope_dim) -> its angle table's arena name
        self.plan()
        self.head = LmHead(self, self.softcap)
        self.arena.reserve_f32(self._needs.items())
        nt = max(t, self.range_slots, max_seqs + t)  # per-token inputs cover a whole prompt of one range
        self.arena.reserve_f32([("tokens", nt), ("pos", nt), ("slot", nt), ("seg_lo", nt), ("n_kv", 1), ("step", 1),
                                ("out_tokens", max_new + 1), ("kv_pos", n_ctx), ("seq_start", MAX_SEQS + 1),
                                ("steps", 2 * max_seqs + 1), ("row_start", max_seqs + 1), ("row_slot", max_seqs + 1)])
        # gpu/fused.py's two programs (the greedy and the sampled step) and its barrier's u64 counter (zeroed)
        self.fused_max_ops = 7 * c.n_layers + 2
        self.fused_program_bytes = -(-self.fused_max_ops * OP_BYTES // 256) * 256  # each program 256-aligned
        self.arena.reserve("fused_ops", 2 * self.fused_program_bytes)
        self.arena.reserve_f32([("fused_counters", 2)])
        self.arena.reserve("sampling", 64)
        self.arena.reserve_f32([("gemm_part", gemm.PART_FLOATS), ("gemm_counters", gemm.PART_COUNTERS)])
        # per decode row, then per first token of the prompts a step ends (gpu/batch.py)
        self.arena.reserve("sampling_rows", 32 * (2 * max_seqs + 1))
        if self.paged:
            assert n_ctx % KV_BLOCK == 0 and self.kv_rows % KV_BLOCK == 0
            self.arena.reserve_f32([("kv_blocks", n_ctx // KV_BLOCK)])

    @property
    def range_slots(self) -> int:
        """Cache slots per sequence range (gpu/batch.py)."""
        return self.n_ctx // (self.max_seqs + 1) if self.max_seqs > 1 else self.n_ctx

    @property
    def pool_blocks(self) -> tuple[int, int]:
        """(first block id, count) of the blocks the batcher hands out (paged only)."""
        first = self.range_slots // KV_BLOCK + 1  # after range 0's and the unmapped slots' block
        return first, self.kv_rows // KV_BLOCK - first

    def kv_table(self, kv_base: int = 0) -> int:
        """The block table as a kernel reads it for a batch whose slots count from kv_base (0:
        not paged, slot = row)."""
        if not self.paged:
            assert kv_base == 0, "only the paged cache has ranges"
            return 0
        return self.p("kv_blocks") + 4 * (kv_base // KV_BLOCK)

    # -- for families ---------------------------------------------------------------------

    def need(self, pieces) -> None:
        """Activation buffers (name, 4-byte element count); blocks that share a name share it."""
        for name, count in pieces:
            self._needs[name] = max(self._needs.get(name, 0), count)

    def plan(self) -> None:
        self.layers = [self.decoder_layer(il) for il in range(self.cfg.n_layers)]

    def decoder_layer(self, il: int) -> DecoderLayer:
        raise NotImplementedError

    def fork(self, n_seq: int, kv_base: int = 0) -> None:
        """(scoring = "fork") Copy the recurrent state after the prompt (the state slot of the
        range from kv_base) into sequence slots 0..n_seq-1 for a forward(seqs=n_seq) pass."""
        raise NotImplementedError(f"{type(self).__name__} scores by tree mask; it has no state to fork")

    def max_forks(self) -> int:
        """How many sequences one forked pass may hold (device memory for their state copies)."""
        return MAX_SEQS

    def unread_bytes_per_token(self) -> int:
        """Weight bytes a decode step does not read beyond the embedding rows (routed experts
        not chosen); for decode_bytes_per_token."""
        return sum(ly.unread_bytes() for ly in self.layers)

    # -- binding (after the arena exists and the weights are uploaded) ----------------------

    @property
    def arena_bytes(self) -> int:
        return self.arena.size

    def p(self, name: str) -> int:
        return self.arena.ptr(name)

    def rope_table(self, base: float, freq_scale: float, rope_dim: int) -> str:
        """The arena name of the decode attention's angle table for this rope (ops/attn_decode.py
        rope_theta), one per distinct rope, filled at bind."""
        key = (float(base), float(freq_scale), int(rope_dim))
        if key not in self._rope_tables:
            self._rope_tables[key] = name = f"rope_theta{len(self._rope_tables)}"
            self.arena.reserve(name, 8 * (rope_dim // 2))
        return self._rope_tables[key]

    def bind(self, base: int, launch: Launcher) -> None:
        self.arena.base = base
        self.launch = launch
        launch.gemm_part, launch.gemm_counters = self.p("gemm_part"), self.p("gemm_counters")
        for name in self.arena.offsets:  # completion counters (split attention, grouped experts) start and stay at 0
            if name.endswith("counters"):
                launch.dev.memset32(self.p(name), 0, self.arena.sizes[name] // 4, launch.stream)
        if self.paged:  # range 0 on its own rows, every other slot on the unmapped block (gpu/batch.py maps them)
            n0, table = self.range_slots // KV_BLOCK, self.p("kv_blocks")
            launch.dev.memset32(table, n0, self.n_ctx // KV_BLOCK, launch.stream)
            self._ident = int_array(range(n0))  # kept: the copy is asynchronous (no numpy on the cold path)
            addr, _ = self._ident.buffer_info()
            launch.dev.htod(table, addr, 4 * n0, launch.stream)
        self._theta = [attn_decode.rope_theta(*key) for key in self._rope_tables]  # kept: the copies are asynchronous
        for name, table in zip(self._rope_tables.values(), self._theta):
            addr, n = table.buffer_info()
            launch.dev.htod(self.p(name), addr, 8 * n, launch.stream)
        self.tensors = TensorReader(self.gguf, self.p("weights"))
        self.embedding = self.tensors.matrix(T.TOKEN_EMBD)
        self.res = Residual(launch, self.p("x"), self.p("h"), self.p("o"), self.cfg.n_embd, self.cfg.rms_eps,
                            x2=self.p("x2"))
        for il, ly in enumerate(self.layers):
            ly.bind(self, il)
        self.head.bind(self, self.tensors, self.embedding)

    def decode_bytes_per_token(self) -> int:
        """Weight bytes one decode step reads: the file's tensors less the embedding rows it
        skips (untied LM head) and what the family says it does not read."""
        unread = self.unread_bytes_per_token()
        if self.head.w is not self.embedding:
            unread += self.embedding.nbytes - self.embedding.row_bytes
        return self.weights_bytes - unread

    # -- the forward pass ---------------------------------------------------------------------

    @property
    def batchable(self) -> bool:
        """Whether sequences can decode together (gpu/batch.py)."""
        return self.mixers_batch()

    def mixers_batch(self) -> bool:
        """Every layer's mixer can run decode rows and prompt chunks in a cache range (a family
        with other mixers says when its own can): here, the shared attention block."""
        return self.scoring == "tree" and all(type(ly.mixer) is Attention for ly in self.layers)

    @property
    def packs_prompts(self) -> bool:
        """Whether one forward may hold several sequences' prompt chunks (forward(segments=True)):
        every mixer is the shared attention block, whose kernels keep each token to its own range
        (recurrent state and MLA's latent cache run one sequence's chunk at a time)."""
        return GpuModel.mixers_batch(self)  # the base rule, not a family's own batching mixers

    def forward(self, n: int, first: int = 0, tree: bool = False, prefix_len: int = 0,
                logit_row: int = -1, logit_rows: int = 1, logits: int = 0, seqs: int = 0, seq_max: int = 0,
                pick=None, rows: bool = False, kv_base: int = 0, segments: bool = False) -> bool:
        """Run n tokens (state arrays from index `first`) through every layer, then the LM head
        for rows [logit_row, logit_row + logit_rows) of this batch into `logits` (default: the
        one-row logits buffer). logit_rows = 0 skips the head. seqs > 0: the batch is that many
        independent sequences (starts in the seq_start array, the longest seq_max tokens), each
        continuing its own state copy from fork(seqs). pick = (RxState, last): the head may take
        the greedy choice itself; True when it did (the caller then launches no pick). rows: each
        of the n tokens is another sequence's decode token (gpu/batch.py), whose keys start at its
        seg_lo entry. kv_base: the batch's slots count from this cache slot (one sequence's prompt
        chunk in its own range). segments: the tokens are several sequences' prompt chunks (each
        sequence's consecutive), at absolute slots, each seeing its own range from its seg_lo entry
        (packs_prompts)."""
        p, E = self.p, self.cfg.n_embd
        if rows:  # to recurrent layers, n one-token sequences (row_start = 0, 1, .., written by the batcher)
            seqs, seq_max = n, 1
        b = Batch(n, p("tokens") + 4 * first, p("pos") + 4 * first, p("slot") + 4 * first,
                  p("seg_lo") + 4 * first if tree or rows or segments else 0, prefix_len, p("n_kv"), n_seq=max(seqs, 1),
                  seq_start=(p("row_start") if rows else p("seq_start")) if seqs else 0,
                  seq_max=seq_max if seqs else n, forked=seqs > 0 and not rows, slots_in_order=not tree, rows=rows,
                  kv_base=kv_base)
        L = self.launch
        L.decode_rows = rows
        try:
            self.res.begin()
            with L.role("embedding", n * self.embedding.row_bytes):
                embed.embed(L, self.embedding, b.tokens, self.res.x, n, self.embed_scale)
            self.res.added()
            ws = self.residency
            if ws is not None:  # ensure_base: no-ops unless the base streams in behind the forward (gpu/residency.py)
                ws.ensure_base(0)
            for il, ly in enumerate(self.layers):
                last = il + 1 == len(self.layers)
                if ws is not None and not last:
                    ws.ensure_base(il + 1)  # this layer's end applies the next one's attention norm
                ly(self.res, b, 0 if last else self.layers[il + 1].attn_norm, None if last else self.layers[il + 1].mixer)
            if ws is not None:
                ws.forward_done()
            if logit_rows <= 0:
                return False
            row = (n - 1) if logit_row < 0 else logit_row
            if ws is not None:
                ws.ensure_base("head")
            return self.head(self.res.x + 4 * E * row, logit_rows, logits or p("logits"), pick=pick)
        finally:
            L.decode_rows = False

    def logits_of_rows(self, rows: list[int]) -> None:
        """The LM head, after a forward(logit_rows=0), for these rows of its batch (ascending) into
        logits rows 0..len(rows)-1: the rows' final states are gathered to the front of x first
        (row i from rows[i] >= i, in order: no copy overwrites a row still to be read)."""
        E, x, L = self.cfg.n_embd, self.res.x, self.launch
        if self.residency is not None:
            self.residency.ensure_base("head")
        for i, r in enumerate(rows):
            assert r >= i
            if r != i:
                L.dev.dtod(x + 4 * E * i, x + 4 * E * r, 4 * E, L.stream)
        self.head(x, len(rows), self.p("logits"))
