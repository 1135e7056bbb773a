// fused_step.cu: a whole decode step of a dense model (embedding, every layer, the LM head and
// the greedy pick) as ONE persistent kernel that runs a program of ops (fused_step.cuh) built by
// gpu/fused.py, the phases separated by a grid-wide barrier instead of kernel boundaries.
//
// Why: a 28-layer model's step is ~140 kernels of 1-7 MB each. Even chained by PDL in a graph,
// each boundary drains the GPU and ramps it up again (the 0.6B Q8_0 step read its weights at
// ~0.6 TB/s of the H200's ~4 TB/s). Here one block per SM stays resident for the whole step; a
// block stages the weights of its next tile with cp.async while it computes the current one, and
// when an op ends it stages its first tile of the NEXT op before it waits at the barrier: weight
// traffic runs through the barriers, and only activations (a few KB, from L2) wait for them.
//
// Grid: co-resident blocks (one per SM; a cooperative launch where the driver allows it),
// FS_THREADS threads. Dynamic smem: two tile buffers of buf_bytes, the partial row sums (red_off),
// the attention's working memory (attn_off; attn_decode.cuh), a copy of the program (prog_off),
// and under FS_X_EARLY or with folded post-norms (xs_off != 0) x (xs_off) and two norm-weight slots
// of nw_bytes (nw_off). stamps (NULL:
// none; 4 n_ops zeroed u64): per op, block 0's start, the last block's start, the last block's "x
// and first tile in" (matrix ops) and the last block's end of its work (%globaltimer ns), for
// FusedStep.profile. Matrix tiles: block b takes tiles b, b + grid, ...; each row is mvs.cuh's
// dot (the same sums as reflex_mvs_*), x' in registers. FS_ATTN: work item i = (KV head
// i % n_head_kv, slice i / n_head_kv; fs_attn_item with head groups) runs atd_body on the
// block's first 128 threads while the others stage the next op's tile. FS_NORM and FS_EMBED run
// on block 0. FS_HEAD ends the program: with a pick, mvs_pick's last block advances the state.
//
// flags (Launcher knobs, off by default until a GPU run says they pay; gpu/fused.py):
// - FS_X_EARLY: a matrix op's input leaves before the next op's weights. Without it, a block issues
//   the next op's first tile and then loads x, and an SM returns its loads in order, so x (a few KB
//   hot in L2) arrived behind tens of KB of weights from DRAM: 3.7-5.1 us from the barrier to "x and
//   first tile in" per matrix op on the 0.6B Q8_0 shape (results/2026-12-04-h200-s26, the profile).
//   With it, x is copied into shared memory (xs_off) first, its norm weights came with the op's
//   first tile an op earlier (two slots at nw_off, by op parity), the accumulated rows' old values
//   are loaded before both, and every warp takes x' from shared memory: the same arithmetic as
//   mvs_load_x on global memory (the same sums in the same order).
// - FS_LOOKAHEAD: a matrix op followed by an op without weights (the attention, Gemma's norms)
//   stages the first tile of the matrix op after that one, so the attention's dependent loads do
//   not queue behind the output projection's copies (issued by its own block's other threads
//   without it) and those copies get an op more to land.
// - FS_ATTN_EARLY: a block's first attention item starts before the barrier that ends the op
//   before it (q/k/v): its threads 0-127 read the step's position, slot and context length, the
//   norm weights, compute the rope angles and copy the first tile's older keys (atd_body's
//   `prefetch` part: nothing the q/k/v op writes), then wait at the barrier inside atd_body
//   (FsWait; named barrier 2 of the whole block, which its threads 128-255 meet outside). The
//   block arrives at that barrier before this part, so it delays no other block.
//
// The barrier (fs_grid_sync): a release add on an arrival counter, then an acquire spin on it (so
// plain loads after it see every block's writes). bar: a zeroed u64 of the model's arena.
// Requirements (host-checked, gpu/fused.py): what mvs.cu and attn_decode.cu require of their
// inputs, every tile's rows within buf_bytes (FS_GLU: two runs in halves), all blocks resident,
// weights inside the model's arena (tiles are copied in whole 16-byte chunks: rx_stage_hull).
#include "attn_decode.cuh"
#include "embed.cuh"
#include "fused_step.cuh"
#include "mvs.cuh"
#include "norm.cuh"

#define FS_THREADS 256
#define FS_X_EARLY 1
#define FS_LOOKAHEAD 2
#define FS_ATTN_EARLY 4

// Barrier k of this launch: arrive (a release add, no round trip to wait for), then spin until
// all gridDim.x blocks have. bar counts arrivals since the arena was zeroed; every launch runs whole
// barriers of gridDim.x arrivals, so `base` (the count at this launch's start rounded down to a
// multiple of gridDim.x: fewer than gridDim.x arrivals of this launch can precede a block's first)
// + (k + 1) gridDim.x is reached when barrier k is complete.
__device__ __forceinline__ void fs_arrive(unsigned long long* bar) {
    asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(bar) : "memory");
}

__device__ __forceinline__ void fs_wait_for(unsigned long long* bar, unsigned long long target) {
    unsigned long long c;
    do {
        asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(c) : "l"(bar) : "memory");
    } while (c < target);
}

__device__ __forceinline__ void fs_grid_sync(unsigned long long* bar, unsigned long long target) {
    __syncthreads();
    if (threadIdx.x == 0) fs_arrive(bar), fs_wait_for(bar, target);
    __syncthreads();
}

// The waiting half of that barrier for a block that arrived already (FS_ATTN_EARLY: __syncthreads,
// then thread 0's fs_arrive) and whose halves reach this point from different code: named barrier
// 2 of all FS_THREADS threads instead of __syncthreads (barrier 0, which must be reached from the
// same place) once thread 0 has seen every block arrive.
__device__ __forceinline__ void fs_grid_wait_split(unsigned long long* bar, unsigned long long target) {
    if (threadIdx.x == 0) fs_wait_for(bar, target);
    asm volatile("bar.sync 2, %0;" ::"n"(FS_THREADS) : "memory");
}

// The attention op's work item w: (KV head, slice, head group). With f.n_hg > 1, blocks share a
// KV head's query heads while its slices leave room (atd_plan's ng, the same in every block), the
// items then ordered so that every active one is among the first n_head_kv * max_split, one a
// block; ng = 1 gives (w % n_head_kv, w / n_head_kv, 0) as before.
__device__ __forceinline__ int fs_attn_groups(const FsAttn& f) {
    if (f.n_hg <= 1) return 1;
    const AtdArgs& a = f.a;
    return atd_plan(*a.n_kv_ptr, *a.q_slot, a.seq_lo ? a.seq_lo[0] : 0, a.window, a.window_slots, a.min_keys,
                    f.max_split, f.n_hg).ng;
}

// atd_body for item w of attention op f (threads 0 .. ATD_THREADS - 1)
template <class Wait>
__device__ __forceinline__ void fs_attn_item(const FsAttn& f, int ng, int w, uint8_t* smem, Wait wait) {
    int nkv = f.a.n_head_kv;  // (n_hg 0, a zeroed field, would give every KV head the same counters)
    atd_body(f.a, smem, w % nkv, w / (nkv * ng), f.max_split, 0, (w / nkv) % ng, max(1, f.n_hg), wait);
}

// atd_body's wait here: under FS_ATTN_EARLY for a block's first item the wait half of the barrier
// after the op before the attention (waited set), else nothing (the barrier is behind it; and a
// cooperative launch has no predecessor to wait for). One type for every call: each instance of
// atd_body has its own static shared memory.
struct FsWait {
    unsigned long long* bar;
    unsigned long long target;
    bool* waited;  // NULL: nothing to wait for
    __device__ __forceinline__ void operator()() const {
        if (waited) fs_grid_wait_split(bar, target), *waited = true;
    }
};

__device__ __forceinline__ unsigned long long fs_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ bool fs_weight_op(int kind) { return kind == FS_MV || kind == FS_GLU || kind == FS_HEAD; }

// Tile t of a matrix op: its matrix s, first row r0 and row count n. False past the last tile.
__device__ __forceinline__ bool fs_tile(const FsMv& m, int kind, int t, int* s, int* r0, int* n) {
    int n_w = kind == FS_GLU ? 1 : m.n_w;
    for (int i = 0; i < n_w; i++) {
        int nt = (m.rows[i] + m.rb - 1) / m.rb;
        if (t < nt) {
            *s = i, *r0 = t * m.rb, *n = min(m.rb, m.rows[i] - t * m.rb);
            return true;
        }
        t -= nt;
    }
    return false;
}

// Start copying tile t of op `op` (a matrix op) into buf with threads [t0, t0 + nt) of the
// block; FS_GLU's up rows go to the buffer's second half. nw (FS_X_EARLY; NULL: not): where the
// op's norm weights go with the block's first tile. False: the op has no tile t.
__device__ bool fs_stage(const FsOp* op, int t, uint8_t* buf, int buf_bytes, int t0, int nt, uint8_t* nw = nullptr) {
    int kind = op->kind;
    if (!fs_weight_op(kind)) return false;
    const FsMv& m = op->u.mv;
    int s, r0, n;
    if (!fs_tile(m, kind, t, &s, &r0, &n)) return false;
    long rb = m.row_bytes[s];
    int tid = threadIdx.x - t0;
    if (tid < 0 || tid >= nt) return true;
    if (nw && m.norm_w && !m.post_src && t == (int)blockIdx.x)
        rx_stage_hull(nw, reinterpret_cast<const uint8_t*>(m.norm_w), 4L * m.K, tid, nt);
    rx_stage_hull(buf, m.w[s] + r0 * rb, n * rb, tid, nt);
    if (kind == FS_GLU) rx_stage_hull(buf + buf_bytes / 2, m.w[1] + r0 * rb, n * rb, tid, nt);
    return true;
}

// Where a matrix op's norm weights are staged under FS_X_EARLY: two slots, by the parity of its
// ordinal among the matrix ops (mi), so an op's staging of the next one's never overwrites its own.
struct FsEarly {
    float* xs;               // x (or a folded post-norm's x') of the current matrix op (16-aligned, K floats)
    uint8_t *nw0, *nw1;      // norm-weight slots (4 K + 16 bytes each): matrix ops 0, 2, .. and 1, 3, ..
    bool on;                 // FS_X_EARLY (xs may be set without it: for folded post-norms)
    __device__ __forceinline__ uint8_t* slot(int i) const { return on ? (i & 1 ? nw1 : nw0) : nullptr; }
    // the op's norm weights in its slot (rx_stage_hull keeps their address mod 16)
    __device__ __forceinline__ const float* nw_of(const FsMv& m, int i) const {
        uint8_t* slot = i & 1 ? nw1 : nw0;
        return m.norm_w ? reinterpret_cast<const float*>(slot + (reinterpret_cast<uintptr_t>(m.norm_w) & 15)) : nullptr;
    }
};

// A folded post-norm's x' into xs (FsMv.post_src; K <= FS_POST_E * FS_THREADS, host-checked): what
// rx_rmsnorm_row does on block 0 for an FS_NORM op, the same sums in the same order, on every block,
// with r in registers; block 0 also stores r, the residual the next fold reads. No norm_w: x' = r
// (a matrix op's input without a norm). (Folded into the head, whose unfolded input is the residual
// normalized by mvs_load_x, x' differs from that by float rounding: another order of the sums.)
#define FS_POST_E 8
__device__ void fs_post_x(const FsMv& m, float* xs) {
    __shared__ float scratch[32];
    const float *src = m.post_src, *ws = m.post_w_src, *resid = m.post_resid, *wo = m.norm_w;
    int n = m.K;
    float s[FS_POST_E], r[FS_POST_E], a[FS_POST_E], b[FS_POST_E];
#pragma unroll
    for (int e = 0; e < FS_POST_E; e++) {  // every load issued before the first use
        int i = threadIdx.x + e * FS_THREADS;
        bool in = i < n;
        s[e] = in ? src[i] : 0.f;
        r[e] = in ? resid[i] : 0.f;
        a[e] = in && ws ? ws[i] : 1.f;
        b[e] = in && wo ? wo[i] : 1.f;
    }
    float src_scale = 1.f;
    if (ws) {
        float ss = 0.f;
#pragma unroll
        for (int e = 0; e < FS_POST_E; e++)
            if (threadIdx.x + e * FS_THREADS < n) ss += s[e] * s[e];
        src_scale = rsqrtf(block_sum(ss, scratch) / n + m.eps);
    }
    float ss = 0.f;
#pragma unroll
    for (int e = 0; e < FS_POST_E; e++) {
        int i = threadIdx.x + e * FS_THREADS;
        if (i >= n) continue;
        r[e] += ws ? s[e] * src_scale * a[e] : s[e];
        if (blockIdx.x == 0) m.post_resid_out[i] = r[e];
        ss += r[e] * r[e];
    }
    float scale = wo ? rsqrtf(block_sum(ss, scratch) / n + m.eps) : 1.f;
#pragma unroll
    for (int e = 0; e < FS_POST_E; e++) {
        int i = threadIdx.x + e * FS_THREADS;
        if (i < n) xs[i] = wo ? r[e] * scale * b[e] : r[e];
    }
    __syncthreads();
}

// x' in registers for lane layout RL (see mvs.cuh), for the op's K and wpr: x and its norm
// weights from global memory, or (FS_X_EARLY) from their copies in shared memory.
template <int RL>
__device__ __forceinline__ void fs_load_x(const FsMv& m, const float* x, const float* norm_w, MvsX& xin,
                                          float* scratch) {
    int part = (threadIdx.x >> 5) % m.wpr;
    float nw[MVS_NX][8];
    mvs_load_nw<RL>(norm_w, m.K, part, m.wpr, nw);
    mvs_load_x<RL>(x, m.K, norm_w != nullptr, nw, m.eps, part, m.wpr, xin, scratch);
}

// Partial sums of rows [0, n) of one staged run into red[(base + i) * wpr + part], by type.
__device__ __forceinline__ void fs_rows(int type, const uint8_t* srow, long row_bytes, int n,
                                        const MvsX& xin, int K, int wpr, float* red, int base) {
#define FS_ROWS_CASE(name, T)                                                \
    case T:                                                                  \
        mvs_range<T>(srow, row_bytes, n, xin, K >> 3, wpr, red, base);       \
        break;
    switch (type) { RX_FOR_EACH_TYPE(FS_ROWS_CASE) }
#undef FS_ROWS_CASE
}

__device__ __forceinline__ int fs_rl(int type) { return (type == RX_Q8_0 || type == RX_Q4_K || type == RX_Q6_K) ? 4 : 1; }

// One matrix op (matrix op mi of the program): this block's tiles; on its last tile it stages its
// first tile of op `next` (if a matrix op: the next one, mi + 1) with threads [nt0, FS_THREADS).
// Returns whether that was staged (it then sits in buf[cur] afterwards). e.on: FS_X_EARLY (x copied
// ahead of the next copies into e.xs); m.post_src: a folded post-norm makes x' there (fs_post_x).
__device__ bool fs_matrix(const FsOp* op, const FsOp* next, int nt0, int mi, bool staged, uint8_t* smem,
                          int buf_bytes, int red_off, int& cur, FsEarly e, unsigned long long* ready) {
    __shared__ float scratch[MVS_WARPS];
    const FsMv& m = op->u.mv;
    int kind = op->kind, G = gridDim.x;
    bool early = e.on, post = m.post_src != nullptr;
    uint8_t* buf[2] = {smem, smem + buf_bytes};
    float* red = reinterpret_cast<float*>(smem + red_off);
    if (!staged) fs_stage(op, blockIdx.x, buf[cur], buf_bytes, 0, FS_THREADS, e.slot(mi)), rx_cp_commit();
    MvsX xin;
    int rl = 0;  // the lane layout x' is loaded for (0: none yet)
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    bool next_staged = false;
    int s, r0, n;
    bool any = false, any_done = false;
    for (int t = blockIdx.x; fs_tile(m, kind, t, &s, &r0, &n); t += G) {
        any = true;
        int type = m.type[s], want = fs_rl(type);
        float* y = m.y[s] + r0;
        // the accumulated rows' old values, issued now and used last (no load left after the dots);
        // under FS_X_EARLY before x, and x before the copies below
        float prev = 0.f;
        if (early || post) prev = m.accumulate && (int)threadIdx.x < n ? y[threadIdx.x] : 0.f;
        if (post && rl == 0) fs_post_x(m, e.xs);  // its loads ahead of the copies below, as FS_X_EARLY's
        else if (early && rl == 0)
            rx_stage_hull(reinterpret_cast<uint8_t*>(e.xs), reinterpret_cast<const uint8_t*>(m.x), 4L * m.K,
                          threadIdx.x, FS_THREADS), rx_cp_commit();
        int tn, r0n, nn;
        if (fs_tile(m, kind, t + G, &tn, &r0n, &nn)) fs_stage(op, t + G, buf[cur ^ 1], buf_bytes, 0, FS_THREADS);
        else if (next)
            next_staged = fs_stage(next, blockIdx.x, buf[cur ^ 1], buf_bytes, nt0, FS_THREADS - nt0, e.slot(mi + 1));
        rx_cp_commit();
        if (!early && !post) {
            prev = m.accumulate && (int)threadIdx.x < n ? y[threadIdx.x] : 0.f;
            if (want != rl) {  // the x loads overlap the tile's copies
                if (want == 4) fs_load_x<4>(m, m.x, m.norm_w, xin, scratch);
                else fs_load_x<1>(m, m.x, m.norm_w, xin, scratch);
                rl = want;
            }
        }
        rx_cp_wait_prior<1>();  // this tile (and x, norm weights) in; the copies just issued may fly
        __syncthreads();
        if (post && want != rl) {  // x' made whole in xs: no norm left to apply
            if (want == 4) fs_load_x<4>(m, e.xs, nullptr, xin, scratch);
            else fs_load_x<1>(m, e.xs, nullptr, xin, scratch);
            rl = want;
        } else if (early && want != rl) {
            const float* nw = e.nw_of(m, mi);
            if (want == 4) fs_load_x<4>(m, e.xs, nw, xin, scratch);
            else fs_load_x<1>(m, e.xs, nw, xin, scratch);
            rl = want;
        }
        if (ready && !any_done && threadIdx.x == 0) atomicMax(ready, fs_now());  // x and the first tile in
        any_done = true;
        long rbytes = m.row_bytes[s];
        const uint8_t* w = m.w[s] + r0 * rbytes;
        const uint8_t* srow = buf[cur] + (reinterpret_cast<uintptr_t>(w) & 15);
        fs_rows(type, srow, rbytes, n, xin, m.K, m.wpr, red, 0);
        if (kind == FS_GLU) {
            const uint8_t* su = buf[cur] + buf_bytes / 2 + (reinterpret_cast<uintptr_t>(m.w[1] + r0 * rbytes) & 15);
            fs_rows(type, su, rbytes, n, xin, m.K, m.wpr, red, m.rb);
        }
        __syncthreads();
        for (int r = threadIdx.x; r < n; r += FS_THREADS) {
            float v = mvs_total(red, r, m.wpr);
            if (kind == FS_GLU) {
                y[r] = rx_act(v, m.act) * mvs_total(red, m.rb + r, m.wpr);
                continue;
            }
            if (m.accumulate) v += r == (int)threadIdx.x ? prev : y[r];
            y[r] = v;
            if (v != v) v = -INFINITY;  // NaN never wins
            if (rx_better(v, r0 + r, bv, bi)) bv = v, bi = r0 + r;
        }
        __syncthreads();  // red and buf[cur] are free again
        cur ^= 1;
    }
    if (!any && next) {  // no tile of this op: stage the next op's first one now
        next_staged = fs_stage(next, blockIdx.x, buf[cur], buf_bytes, nt0, FS_THREADS - nt0, e.slot(mi + 1));
        rx_cp_commit();
    }
    if (kind == FS_HEAD && m.pick.part_v) {
        MvsPick pick;
        pick.part_v = m.pick.part_v, pick.part_i = m.pick.part_i, pick.counter = m.pick.counter, pick.last = m.pick.last;
        pick.st = RxState{m.pick.st[0], m.pick.st[1], m.pick.st[2], m.pick.st[3], m.pick.st[4], m.pick.st[5]};
        mvs_pick(pick, bv, bi);
    }
    return next_staged;
}

extern "C" __global__ void __launch_bounds__(FS_THREADS, 1)
    reflex_fused_step(const FsOp* prog, int n_ops, unsigned long long* bar, int buf_bytes, int red_off,
                      int attn_off, int prog_off, unsigned long long* stamps, int xs_off, int nw_off, int nw_bytes,
                      int flags) {
    rx_pdl_begin();  // the wait is a no-op (a cooperative launch is no programmatic dependent); a PDL
                     // successor released early still waits for this whole grid in its own wait
    uint8_t* smem = rx_dyn_smem;
    // the program in shared memory: its fields are read at every op, and each barrier's fence
    // would send those reads back to L2
    const FsOp* ops = reinterpret_cast<const FsOp*>(
        rx_stage(smem + prog_off, reinterpret_cast<const uint8_t*>(prog), (long)n_ops * sizeof(FsOp)));
    rx_cp_commit();
    __shared__ unsigned long long base;  // fs_grid_sync's
    if (threadIdx.x == 0) {
        unsigned long long c;
        asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(c) : "l"(bar) : "memory");
        base = c / gridDim.x * gridDim.x;
    }
    rx_cp_wait_all();
    __syncthreads();
    int n = n_ops;  // stamps: [block 0's start | last block's start | last ready | last end] x n_ops
    // xs_off 0: no x region (neither FS_X_EARLY nor a folded post-norm in the program)
    FsEarly early{xs_off ? reinterpret_cast<float*>(smem + xs_off) : nullptr, smem + nw_off, smem + nw_off + nw_bytes,
                  (flags & FS_X_EARLY) != 0};
    int cur = 0;         // the tile buffer the next matrix op's first tile is (or goes) in
    int staged_op = -1;  // the op whose first tile that is, staged already (by an op before it)
    int mi = 0;          // matrix ops before op i
    bool attn_begun = false;  // FS_ATTN_EARLY: this block's first item of the attention op i ran already
    for (int i = 0; i < n_ops; i++) {
        const FsOp* op = ops + i;
        const FsOp* next = i + 1 < n_ops ? ops + i + 1 : nullptr;
        int kind = op->kind;
        // the op whose first tile this one stages: the next, or under FS_LOOKAHEAD past an op
        // without weights after a matrix op; past the attention only by the threads that will not
        // run it (atd_body waits for all of its threads' copies)
        int ai = i + 1, at0 = 0;
        if ((flags & FS_LOOKAHEAD) && fs_weight_op(kind) && ai + 1 < n_ops && !fs_weight_op(ops[ai].kind) &&
            fs_weight_op(ops[ai + 1].kind))
            at0 = ops[ai].kind == FS_ATTN ? ATD_THREADS : 0, ai++;
        const FsOp* ahead = ai < n_ops ? ops + ai : nullptr;
        if (stamps && threadIdx.x == FS_THREADS - 1) {  // (not thread 0: FS_ATTN_EARLY keeps it in the attention)
            unsigned long long t = fs_now();
            if (blockIdx.x == 0) stamps[i] = t;
            atomicMax(stamps + n + i, t);
        }
        if (fs_weight_op(kind)) {
            bool st = fs_matrix(op, ahead, at0, mi, staged_op == i, smem, buf_bytes, red_off, cur, early,
                                stamps ? stamps + 2 * n + i : nullptr);
            staged_op = st ? ai : -1;
            mi++;
        } else {
            // the op's work on some threads; the block's other threads stage the next op's first
            // tile meanwhile (all of them, after the work, on a block with work for all)
            int t0 = 0, nt = FS_THREADS;
            if (kind == FS_ATTN) {
                const FsAttn& f = op->u.attn;
                int items = f.a.n_head_kv * f.max_split;
                if (blockIdx.x < items) {
                    if (threadIdx.x < ATD_THREADS) {
                        int ng = fs_attn_groups(f);
                        for (int w = blockIdx.x + (attn_begun ? gridDim.x : 0); w < items; w += gridDim.x)
                            fs_attn_item(f, ng, w, smem + attn_off, FsWait{nullptr, 0, nullptr});
                    }
                    t0 = ATD_THREADS, nt = FS_THREADS - ATD_THREADS;
                }
                attn_begun = false;
            } else if (blockIdx.x == 0) {
                __shared__ float nscratch[32];
                if (kind == FS_NORM) {
                    const FsNorm& f = op->u.norm;
                    rx_rmsnorm_row(f.src, f.w_src, f.resid, f.w_out, f.out, f.n, f.eps, nscratch);
                } else if (kind == FS_EMBED) {
                    const FsEmbed& f = op->u.embed;
#define FS_EMBED_CASE(name, T)                                                                      \
    case T:                                                                                         \
        rx_embed_row<T>(f.table, f.row_bytes, f.tokens[0], f.out, f.n_embd, f.n_vocab, f.scale);    \
        break;
                    switch (f.type) { RX_FOR_EACH_TYPE(FS_EMBED_CASE) }
#undef FS_EMBED_CASE
                }
            }
            if (ahead && staged_op != ai) {  // (FS_LOOKAHEAD: the op before staged it)
                staged_op = fs_stage(ahead, blockIdx.x, smem + cur * buf_bytes, buf_bytes, t0, nt, early.slot(mi))
                                ? ai : -1;
                rx_cp_commit();
            }
        }
        if (stamps) {  // profiling (FusedStep.profile): the last block's end of this op's work
            __syncthreads();
            if (threadIdx.x == 0) atomicMax(stamps + 3 * n + i, fs_now());
        }
        if (!next) break;
        unsigned long long target = base + (unsigned long long)(i + 1) * gridDim.x;
        if ((flags & FS_ATTN_EARLY) && next->kind == FS_ATTN) {
            // the block arrives, then the attention's first item runs on threads 0-127 up to its
            // wait, which is the rest of this barrier
            const FsAttn& f = next->u.attn;
            __syncthreads();
            if (threadIdx.x == 0) fs_arrive(bar);
            bool waited = false;
            if ((int)blockIdx.x < f.a.n_head_kv * f.max_split && threadIdx.x < ATD_THREADS)
                fs_attn_item(f, fs_attn_groups(f), blockIdx.x, smem + attn_off, FsWait{bar, target, &waited});
            if (!waited) fs_grid_wait_split(bar, target);  // the rest of the block, or an item with nothing to do
            attn_begun = true;
        } else {
            fs_grid_sync(bar, target);
        }
    }
}
