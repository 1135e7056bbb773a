"""Experts on demand: the first token of a big MoE model waits only for the bytes it reads.

A 30B-A3B file is 32.5 GB, 94% of it routed experts, and a 5-token prompt routes to at most 40
of each layer's 128. So the weights go up in this order instead of file order:
  1. the base: everything but the routed experts (embeddings, attention, norms, routers, shared
     experts, the LM head), before the first forward may start;
  2. on demand: each MoE layer of a forward reads its tokens' expert ids back after the router
     (gpu/moe.py) and waits for just those experts, which jump the queue;
  3. in the background, once the first forward is through (or nothing asked for IDLE_RELEASE_S):
     every other expert, layer by layer.
Decode graphs are captured only once every expert is resident (gpu/runner.py); until then each
step runs eagerly through the same on-demand checks. REFLEX_EXPERTS_ON_DEMAND=0 uploads the
whole file first, as dense models always do.

Bytes land through the same per-thread pinned staging buffers and streams as gpu/upload.py. A
worker takes a share of the queue at once (of a burst, an even part among the workers), copies
it, synchronizes its stream and lands the share: a kernel queued after ensure() returns reads
complete weights, and a layer's burst costs each worker one take and one landing under the lock.

Packs: a worker takes as many queued chunks as fit in one staging buffer, reads them in one after
another, copies the buffer to its device scratch in one copy, and kernels/scatter.cu puts each
piece in place: fewer, larger copies and driver calls for a layer's 114 small (0.59 MB) experts.
On the H200 (results/2026-12-02-h200-s10) the bursts alone went from 7.4 to 12.4 GB/s with 8
threads; a whole cold start was level. REFLEX_UPLOAD_PACK=0 copies each chunk on its own. The scratch (one
staging ring's worth) stays allocated while the process lives: freeing device memory may
synchronize the device, which a decode graph being captured on another thread must not see.
"""

from __future__ import annotations

import collections
import os
import re
import threading
import time
from typing import NamedTuple

from ..modelfile import tensor_names as T
from .launch import Launcher
from .ops import scatter
from .upload import read_chunk

IDLE_RELEASE_S = 1.0  # no forward asked for experts this long after the base landed: start the rest
_EXPERT_TENSOR = re.compile(r"blk\.(\d+)\.(" + "|".join(re.escape(n) for n in (
    T.FFN_GATE_EXPS, T.FFN_UP_EXPS, T.FFN_GATE_UP_EXPS, T.FFN_DOWN_EXPS)) + r")$")


class ExpertTensor(NamedTuple):
    offset: int  # from the start of the weights region (the file's tensor data)
    stride: int  # bytes of one expert (the stacked tensor's outermost dimension)


class UploadPlan(NamedTuple):
    base: list[tuple[int, int]]  # (offset, nbytes) ranges of everything but the routed experts
    experts: dict[int, list[ExpertTensor]]  # layer -> its stacked expert tensors
    n_expert: dict[int, int]  # layer -> experts in each of its tensors
    total: int  # bytes of the weights region
    # the base again, by who reads it, in upload order: (None: the embedding and everything a first
    # layer may need, i: block i's tensors, "head": the output norm and LM head) -> its ranges
    base_parts: tuple = ()

    def expert_bytes(self, layer: int) -> int:
        return sum(t.stride for t in self.experts[layer])


def plan_upload(gguf) -> UploadPlan | None:
    """The file's routed-expert tensors and the rest; None when it has none (a dense model)."""
    data, total = gguf.data_offset, gguf.size - gguf.data_offset
    experts: dict[int, list[ExpertTensor]] = {}
    n_expert: dict[int, int] = {}
    holes = []
    for name, ti in gguf.tensors.items():
        m = _EXPERT_TENSOR.match(name)
        if m is None or len(ti.shape) != 3 or ti.nbytes % ti.shape[2]:
            continue
        il, n = int(m.group(1)), ti.shape[2]
        if n_expert.setdefault(il, n) != n:
            return None  # tensors of one layer disagree on the expert count: upload it whole
        experts.setdefault(il, []).append(ExpertTensor(ti.offset - data, ti.nbytes // n))
        holes.append((ti.offset - data, ti.nbytes))
    if not experts:
        return None
    base, at = [], 0
    for off, n in sorted(holes):
        if off > at:
            base.append((at, off - at))
        at = max(at, off + n)
    if at < total:
        base.append((at, total - at))
    return UploadPlan(base, experts, n_expert, total, _base_parts(gguf, holes, total))


_BLOCK = re.compile(r"blk\.(\d+)\.")
_HEAD = {T.OUTPUT, T.OUTPUT_NORM}


def _base_parts(gguf, holes, total: int) -> tuple:
    """Every byte of the base to the part that reads it: a tensor owns its bytes and the padding
    after it; an expert tensor's padding, and anything before the first tensor, goes first."""
    data, hole_at = gguf.data_offset, {off for off, _ in holes}
    spans = sorted((ti.offset - data, ti.nbytes, name) for name, ti in gguf.tensors.items())
    owned = [(None, 0, spans[0][0] if spans else total)]
    for i, (off, n, name) in enumerate(spans):
        end = spans[i + 1][0] if i + 1 < len(spans) else total
        if off in hole_at:
            owned.append((None, off + n, end))
            continue
        m = _BLOCK.match(name)
        owned.append((int(m.group(1)) if m else "head" if name in _HEAD else None, off, end))
    parts: dict = {None: []}
    for who, a, b in owned:
        if b > a:
            rs = parts.setdefault(who, [])
            if rs and rs[-1][0] + rs[-1][1] == a:
                rs[-1] = (rs[-1][0], b - rs[-1][0])
            else:
                rs.append((a, b - a))
    order = [None] + sorted(k for k in parts if isinstance(k, int)) + (["head"] if "head" in parts else [])
    return tuple((k, parts[k]) for k in order)


def on_demand_enabled() -> bool:
    return os.environ.get("REFLEX_EXPERTS_ON_DEMAND", "1") != "0"


def packing_enabled() -> bool:
    return os.environ.get("REFLEX_UPLOAD_PACK", "1") != "0"


def base_streaming_enabled() -> bool:
    """REFLEX_STREAM_BASE=1: the first forward starts once the embedding is up; each block's base
    goes up in order behind it and each layer waits for its own (off until measured on the GPU)."""
    return os.environ.get("REFLEX_STREAM_BASE", "0") == "1"


BASE = "base"


class WeightStream:
    """The weights region of `path` (from file_offset) uploaded to `dst` in plan order, by one
    worker per staging-ring thread. Tags: BASE, and (layer, expert) for each routed expert. A
    chunk is (tags, offset, size): consecutive experts of a stacked tensor share chunks, so a
    small expert is not a small copy; a tag is resident once every chunk touching it landed."""

    def __init__(self, device, ring, path: str, file_offset: int, dst: int, plan: UploadPlan, timeline=None):
        self.dev, self.ring, self.path, self.file_offset, self.dst, self.plan = device, ring, path, file_offset, dst, plan
        self.tl = timeline
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)  # the workers': work queued, the base landed, release, the end
        self._landed_cv = threading.Condition(self._lock)  # _wait()'s: a waiter's last tag landed
        self._waiting: list[set] = []  # each waiter's tags not yet resident
        self._urgent: collections.deque = collections.deque()  # chunks someone waits for, first
        self._background: collections.deque = collections.deque()  # chunks of the layer being filled in
        self._base_rest: collections.deque = collections.deque()  # REFLEX_STREAM_BASE: the blocks' base, in order
        self._parts = [(BASE if who is None else (BASE, who), ranges) for who, ranges in plan.base_parts] \
            if base_streaming_enabled() and plan.base_parts else [(BASE, plan.base)]
        self._later = collections.deque(sorted(plan.experts))  # layers whose unasked experts are still to queue
        self._left: dict = {}  # tag -> chunks not yet landed (a tag is queued once it has an entry)
        self._resident: set = set()
        self._hot: set = set()  # tags someone waits for (while any is, the experts nobody asked for wait)
        self._burst_share = 0  # chunks per worker of the urgent queue being shared out
        self._n_tags = len(self._parts) + sum(plan.n_expert[il] for il in plan.experts)
        self._released = False
        self._t_release: float | None = None  # on the timeline
        self._last_ask = time.monotonic()  # the idle clock (IDLE_RELEASE_S) runs from the base's landing
        # ensure() calls that waited, bytes they queued, their wait; ensure_base()'s waits
        self._demand = {"waits": 0, "bytes": 0, "wait_s": 0.0, "base_wait_s": 0.0}
        self.landed_bytes = 0
        self.stats: dict = {"experts_on_demand": True, "base_bytes": sum(n for _, n in plan.base),
                            "expert_bytes": plan.total - sum(n for _, n in plan.base)}
        self._t0 = time.perf_counter()
        self._fd = os.open(path, os.O_RDONLY)
        self._readback = None  # pinned ints for the routed ids (ensure_routed)
        self._packing = packing_enabled()
        # device bytes the packs land in, a staging ring's worth (32 MB by default, inside the
        # runner's FIT_HEADROOM), taken here so a failure is the load's and not one upload thread's
        self._scratch = device.alloc(ring.chunk * ring.per_thread * ring.n_threads) if self._packing else None
        self._launchers: list = [None] * ring.n_threads  # per worker, made at its first pack
        self.stats["upload_packs"] = self._packing
        self._alive = ring.n_threads  # the last worker out closes the file
        self._threads = [threading.Thread(target=self._worker, args=(w,), name=f"reflex-upload-{w}", daemon=True)
                         for w in range(ring.n_threads)]

    # -- the caller's side -------------------------------------------------------------------

    def load_base(self) -> None:
        """Start the workers and return once the base is on the device (with REFLEX_STREAM_BASE,
        its first part: the rest follows, block by block, before any expert nobody asked for)."""
        with self._lock:
            (tag, ranges), *rest = self._parts
            self._queue([((tag,), off, n) for off, n in ranges], self._urgent)
            for t, rs in rest:
                self._queue([((t,), off, n) for off, n in rs], self._base_rest)
            self._hot.add(BASE)
        for t in self._threads:
            t.start()
        self._wait({BASE})
        dt = time.perf_counter() - self._t0
        first = sum(n for _, n in self._parts[0][1])
        self.stats.update(base_upload_ms=round(dt * 1000, 3), base_gb_s=round(first / max(dt, 1e-9) / 1e9, 2),
                          base_loaded_bytes=first, base_streamed=len(self._parts) > 1)

    def ensure_base(self, part) -> None:
        """Return once this part of the base is on the device: a block's index, or "head" (a no-op
        unless REFLEX_STREAM_BASE split the base). Its chunks jump the queue if still waiting."""
        tag = (BASE, part)
        if tag in self._resident or tag not in self._left or self.complete:
            self.check()
            return
        with self._lock:
            self._hot.add(tag)
            self._base_rest = self._jump(self._base_rest, {tag})
            self._cv.notify_all()
        t = time.perf_counter()
        self._wait({tag})
        with self._lock:
            self._demand["base_wait_s"] += time.perf_counter() - t

    @property
    def complete(self) -> bool:
        return len(self._resident) == self._n_tags

    def check(self) -> None:
        """Raise the upload's failure, if it had one (the experts it left out never arrive)."""
        if self.error is not None:
            raise self.error

    def ensure(self, layer: int, experts) -> None:
        """Return once these experts of this layer are on the device (uploading them first)."""
        self.check()
        if self.complete:
            return
        need = {(layer, e) for e in experts if 0 <= e < self.plan.n_expert.get(layer, 0)} - self._resident
        with self._lock:
            self._last_ask = time.monotonic()
            if need:
                self._hot |= need
                runs = self._runs(layer, sorted(e for il, e in need if (il, e) not in self._left))
                self._demand["bytes"] += sum(n for _, _, n in runs)
                self._queue(runs, self._urgent)
                self._background = self._jump(self._background, need)  # being filled in: first
                self._cv.notify_all()
        if need:
            t = time.perf_counter()
            self._wait(need)
            with self._lock:
                self._last_ask = time.monotonic()
                self._demand["waits"] += 1
                self._demand["wait_s"] += time.perf_counter() - t

    def ensure_routed(self, launch, layer: int, ids_ptr: int, count: int) -> None:
        """ensure() for the expert ids a router just wrote on the device (count int32 at ids_ptr):
        the stream is synchronized to read them."""
        if self.complete:
            return
        dev, s = launch.dev, launch.stream
        if self._readback is None or self._readback[2] < count:
            self._readback = (*dev.alloc_pinned(4 * max(count, 4096)), max(count, 4096))
        ptr, view, _ = self._readback
        dev.dtoh(ptr, ids_ptr, 4 * count, s)
        dev.sync(s)
        self.ensure(layer, set(view.cast("i")[:count]))

    def forward_done(self) -> None:
        """A forward pass is through: the rest of the experts may go up now."""
        if not self._released:
            self.release()

    def release(self) -> None:
        with self._lock:
            self._release()

    def _release(self) -> None:
        """(under the lock) Let the background upload start; the record's figures at this moment."""
        if not self._released:
            self._released = True
            self._t_release = self.tl.elapsed() if self.tl is not None else 0.0
            self.stats["resident_bytes_at_release"] = self.landed_bytes
            self.stats["released_after_ms"] = round((time.perf_counter() - self._t0) * 1000, 3)
            # what the forwards before the release (the first token's) waited for, and how long
            d = self._demand
            self.stats.update(demand_waits=d["waits"], demand_bytes=d["bytes"], demand_wait_ms=round(d["wait_s"] * 1000, 3),
                              demand_gb_s=round(d["bytes"] / d["wait_s"] / 1e9, 2) if d["wait_s"] > 0 else None,
                              base_wait_ms=round(d["base_wait_s"] * 1000, 3))
            self._cv.notify_all()

    def wait_all(self) -> None:
        """Every expert on the device (starting the background upload if it had not)."""
        self.release()
        self._wait(None)

    def join(self, timeout: float | None = None) -> None:
        """Wait for the workers to end (they do once every expert is resident): before the ring
        they copy through is freed."""
        for t in self._threads:
            t.join(timeout)

    # -- internals ---------------------------------------------------------------------------

    def _runs(self, layer: int, experts: list[int]) -> list:
        """Chunks (tags, offset, size) of these experts (ascending) of one layer: each run of
        consecutive ids is one contiguous range per stacked tensor, cut at the staging chunk."""
        chunks, runs = [], []
        for e in experts:
            if runs and runs[-1][1] == e:
                runs[-1][1] = e + 1
            else:
                runs.append([e, e + 1])
        for e0, e1 in runs:
            for t in self.plan.experts[layer]:
                lo, hi = t.offset + e0 * t.stride, t.offset + e1 * t.stride
                for a in range(lo, hi, self.ring.chunk):
                    b = min(a + self.ring.chunk, hi)
                    tags = frozenset((layer, e) for e in range((a - t.offset) // t.stride, (b - 1 - t.offset) // t.stride + 1))
                    chunks.append((tags, a, b - a))
        return chunks

    def _queue(self, pieces, into) -> None:
        """Queue (tags, offset, size) ranges, cut at the staging chunk; count each tag's chunks."""
        chunk = self.ring.chunk
        for tags, off, size in pieces:
            for c in range(0, size, chunk):
                into.append((frozenset(tags), off + c, min(chunk, size - c)))
                for tag in tags:
                    self._left[tag] = self._left.get(tag, 0) + 1

    def _wait(self, tags) -> None:
        """Until these tags (None: every tag) are resident. A waiter is woken when its own last
        tag lands, not at every chunk: eight workers landing ~100 chunks a layer would otherwise
        wake it (and contend for the GIL with it) a hundred times."""
        with self._lock:
            left = None if tags is None else set(tags) - self._resident
            if left is not None:
                self._waiting.append(left)
            try:
                while True:
                    self.check()
                    if self.complete if left is None else not left:
                        return
                    self._landed_cv.wait()
            finally:
                if left is not None:
                    self._waiting = [w for w in self._waiting if w is not left]

    def _landed(self, tags, size: int) -> None:
        """(under the lock) One chunk touching these tags is on the device."""
        self.landed_bytes += size
        wake = False
        for tag in tags:
            self._left[tag] -= 1
            if self._left[tag] == 0:
                self._resident.add(tag)
                self._hot.discard(tag)
                if tag == BASE:
                    self._last_ask = time.monotonic()
                    self._cv.notify_all()  # idle workers start the idle clock
                for left in self._waiting:
                    if tag in left:
                        left.discard(tag)
                        wake = wake or not left
        if self.complete:
            self.stats["all_resident_ms"] = round((time.perf_counter() - self._t0) * 1000, 3)
            if self.tl is not None:  # the background's span on the cold-start timeline
                now = self.tl.elapsed()
                self.tl.span("experts_upload", now if self._t_release is None else self._t_release, now)
            wake = True
            self._cv.notify_all()  # the workers end
        if wake:
            self._landed_cv.notify_all()

    def _jump(self, queue, tags: set):
        """(under the lock) Move the queue's chunks touching these tags to the urgent queue, in
        order; returns what stays."""
        if all(c[0].isdisjoint(tags) for c in queue):
            return queue
        self._urgent.extend(c for c in queue if not c[0].isdisjoint(tags))
        return collections.deque(c for c in queue if c[0].isdisjoint(tags))

    def _pack(self, queue) -> list:
        """(under the lock) The queue's next chunk and as many after it as fit in one staging
        buffer as a pack (kernels/scatter.cu); just the one when packing is off or nothing fits."""
        pack = [queue.popleft()]
        if self._packing:
            data = scatter.aligned(pack[0][2])
            while (queue and len(pack) < scatter.MAX_PIECES and
                   scatter.header_bytes(len(pack) + 1) + data + scatter.aligned(queue[0][2]) <= self.ring.chunk):
                pack.append(queue.popleft())
                data += scatter.aligned(pack[-1][2])
        return pack

    def _share(self, queue, urgent: bool) -> list:
        """(under the lock) A worker's share of the queue, as packs: of urgent chunks, an even
        part among the workers (a layer's burst is one take and one landing per worker, not one
        per pack: per-pack locking and wake-ups of eight threads under one GIL held the Qwen3.5
        bursts to 10 GB/s with no device copy at all, results/2026-12-02-h200-s11); of the rest,
        one pack per staging buffer, so an ask waits for at most that much."""
        if urgent:
            n = self._burst_share = max(-(-len(queue) // self.ring.n_threads), self._burst_share)
        else:
            n = self.ring.per_thread
        packs, taken = [], 0
        while queue and taken < n:
            packs.append(self._pack(queue))
            taken += len(packs[-1])
        if not self._urgent:
            self._burst_share = 0
        return packs

    def _take(self):
        """(under the lock) The next share of chunks (a list of packs); a float: nothing now, wait
        at most that long (None: until notified); False: stop."""
        if self.error is not None:
            return False
        if self._urgent:
            return self._share(self._urgent, True)
        if self._base_rest:
            return self._share(self._base_rest, False)
        if not self._released and BASE in self._resident and not self._hot:  # nobody waits: idle
            idle = time.monotonic() - self._last_ask
            if idle <= IDLE_RELEASE_S:
                return IDLE_RELEASE_S - idle + 0.001
            self._release()
        if self._released:
            while not self._background and self._later:
                il = self._later.popleft()
                self._queue(self._runs(il, [e for e in range(self.plan.n_expert[il]) if (il, e) not in self._left]),
                            self._background)
            if self._background:
                return self._share(self._background, False)
        return False if self.complete else None

    def _land(self, chunks) -> None:
        """(under the lock) These (tags, size) chunks are on the device."""
        for tags, size in chunks:
            self._landed(tags, size)

    def _copy(self, w: int, b: int, pieces: list, stream) -> None:
        """Read these chunks into worker w's staging buffer b and queue their copy to the device:
        straight to its place for one chunk, else as one pack to the worker's scratch and the
        scatter kernel after it (both on the worker's stream, before its buffer's event)."""
        dev, ring = self.dev, self.ring
        ptr, view = ring.buffers[w][b]
        if len(pieces) == 1:
            _, off, size = pieces[0]
            read_chunk(self._fd, view, size, self.file_offset + off, self.path)
            dev.htod(self.dst + off, ptr, size, stream)
            return
        if self._launchers[w] is None:  # the worker's first pack
            self._launchers[w] = Launcher(dev, stream)
        at, rows = scatter.header_bytes(len(pieces)), []
        for _, off, size in pieces:
            read_chunk(self._fd, view[at:at + size], size, self.file_offset + off, self.path)
            rows.append((self.dst + off, at, size))
            at += scatter.aligned(size)
        scatter.write_header(view, rows)
        pack = self._scratch + (w * ring.per_thread + b) * ring.chunk
        dev.htod(pack, ptr, at, stream)
        scatter.scatter(self._launchers[w], pack, len(rows))

    def _worker(self, w: int) -> None:
        """Take a share, copy its packs through this worker's staging buffers (each reused once
        its copy is done), wait for the stream, land the share: one lock round per share."""
        dev, ring = self.dev, self.ring
        k = 0
        try:
            dev.make_current()
            ring.ensure(dev, w)
            stream, events = ring.streams[w], ring.events[w]
            while True:
                with self._lock:
                    got = self._take()
                    if got is None or isinstance(got, float):
                        if not self._urgent and not self.complete and self.error is None and not (
                                self._released and (self._background or self._later)):
                            self._cv.wait(got)
                        continue
                if got is False:
                    break
                packs, done = got, []
                in_buffer: list = [None] * ring.per_thread  # the chunks whose copy out of buffer b may be in flight
                for pieces in packs:
                    b = k % ring.per_thread
                    k += 1
                    if in_buffer[b] is not None:
                        dev.wait_event(events[b])  # the copy out of this buffer is done
                        done += in_buffer[b]
                    self._copy(w, b, pieces, stream)
                    dev.record(events[b], stream)
                    in_buffer[b] = [(tags, size) for tags, _, size in pieces]
                dev.sync(stream)
                with self._lock:
                    self._land(done + [c for chunks in in_buffer if chunks for c in chunks])
        except BaseException as e:  # surfaced to whoever waits, and by ensure() and check() from now on
            with self._lock:
                if self.error is None:
                    self.error = e
                    self.stats["upload_error"] = f"{type(e).__name__}: {e}"
                self._cv.notify_all()
                self._landed_cv.notify_all()
        with self._lock:
            self._alive -= 1
            if self._alive == 0:
                os.close(self._fd)

