"""kernels/delta_net.cu: Qwen3.5's Gated DeltaNet: the causal conv (+ SiLU, q/k L2 norm) with its
rolling state, the gated delta rule token by token (the gated output norm fused) or in chunks of
32 tokens (a parallel prep of every chunk, then the chain of chunks), and the gated norm after the
chunked form. States sit in slots `state_stride` floats apart, one per sequence (seq_start: the
batch's sequences; NULL: one); sequence s uses slot slots[s] (`slots`, device ints; 0: slot s)."""

from __future__ import annotations

from ctypes import c_float, c_int, c_long, c_void_p

KERNELS = ("reflex_dn_conv", "reflex_dn_conv_state", "reflex_dn_recurrent", "reflex_dn_prep", "reflex_dn_chunked",
           "reflex_dn_gated_norm")
CHUNK = 32  # DN_CHUNK
PREP_FLOATS = 2 * CHUNK * CHUNK + 4 * CHUNK  # DN_PREP_FLOATS: one (chunk, head) slot of reflex_dn_prep's scratch
MAX_HEAD = 128  # DN_MAX_HD: linear-attention head sizes (register / shared tiles)
MAX_CONV = 8  # DN_MAX_K: conv taps


GROUP = 8  # sequences a prep + chunked pair takes; larger batches run as groups of them (s_base)
CV = 16  # DN_CV: state columns per block of the chunked kernel
# DN_CHUNKED_SMEM: keys and queries (CHUNK x MAX_HEAD), the block's state columns, T, P, D, three gates
CHUNKED_SMEM = 4 * (2 * CHUNK * MAX_HEAD + MAX_HEAD * CV + 2 * CHUNK * CHUNK + CHUNK * CV + 3 * CHUNK)


def prep_floats(n_seq: int, n_tok: int, nv: int) -> int:
    """Scratch chunked() needs for a batch: a reflex_dn_prep slot per (chunk, head), chunk slots
    numbered below min(n_seq, GROUP) + ceil(n_tok / CHUNK) (dn_prep_slot)."""
    return (min(n_seq, GROUP) + -(-n_tok // CHUNK)) * nv * PREP_FLOATS


def conv(L, x, w, state, state_stride, slots, seq_start, n_seq, pos, out, n_tok, k, nk, nv, dk, dv, q_scale, eps,
         roll) -> None:
    """Causal conv + SiLU + q/k L2 norm of n_tok tokens; roll: every sequence is one token and
    the kernel shifts the conv state itself (else conv_state must follow)."""
    L.go("reflex_dn_conv", (2 * nk + nv, (n_tok + 7) // 8, 1), 256,
         [c_void_p(x), c_void_p(w), c_void_p(state), c_long(state_stride), c_void_p(slots or None),
          c_void_p(seq_start or None), c_int(n_seq), c_void_p(pos), c_void_p(out), c_int(n_tok), c_int(k), c_int(nk), c_int(nv), c_int(dk),
          c_int(dv), c_float(q_scale), c_float(eps), c_int(int(roll))])


def conv_state(L, x, state, state_stride, slots, seq_start, n_seq, pos, n_tok, channels, k) -> None:
    L.go("reflex_dn_conv_state", ((channels + 255) // 256, n_seq, 1), 256,
         [c_void_p(x), c_void_p(state), c_long(state_stride), c_void_p(slots or None), c_void_p(seq_start or None),
          c_int(n_seq), c_void_p(pos), c_int(n_tok), c_int(channels), c_int(k)])


def recurrent(L, qkv, alpha, beta, z, ssm_a, dt_bias, norm_w, state, state_stride, slots, seq_start, n_seq, pos, out,
              n_tok, nk, nv, dk, dv, eps) -> None:
    """The delta rule token by token with the gated output norm fused (one block per value head and sequence)."""
    L.go("reflex_dn_recurrent", (nv, n_seq, 1), 256,
         [c_void_p(qkv), c_void_p(alpha), c_void_p(beta), c_void_p(z), c_void_p(ssm_a), c_void_p(dt_bias),
          c_void_p(norm_w), c_void_p(state), c_long(state_stride), c_void_p(slots or None),
          c_void_p(seq_start or None), c_int(n_seq), c_void_p(pos), c_void_p(out), c_int(n_tok), c_int(nk), c_int(nv), c_int(dk), c_int(dv), c_float(eps)])


def chunked(L, qkv, alpha, beta, ssm_a, dt_bias, state, state_stride, slots, seq_start, n_seq, pos, out, n_tok, nk,
            nv, dk, dv, prep: int) -> None:
    """The delta rule CHUNK tokens at a time; `out` gets the unnormalized output (gated_norm next).
    prep: prep_floats(n_seq, n_tok, nv) floats of scratch: every chunk's state-free part first, in
    parallel (reflex_dn_prep), then the chain of chunks (reflex_dn_chunked), GROUP sequences at a
    time (one pair of launches for most batches)."""
    for s_base in range(0, n_seq, GROUP):
        g = min(GROUP, n_seq - s_base)
        L.go("reflex_dn_prep", (nv, -(-n_tok // CHUNK), g), 256,
             [c_void_p(qkv), c_void_p(alpha), c_void_p(beta), c_void_p(ssm_a), c_void_p(dt_bias),
              c_void_p(seq_start or None), c_int(s_base), c_void_p(prep), c_int(n_tok), c_int(nk), c_int(nv),
              c_int(dk), c_int(dv)])
        L.go("reflex_dn_chunked", (nv, -(-dv // CV), g), 256,
             [c_void_p(qkv), c_void_p(state), c_long(state_stride), c_void_p(slots or None),
              c_void_p(seq_start or None), c_int(s_base), c_void_p(pos), c_void_p(out), c_int(n_tok), c_int(nk),
              c_int(nv), c_int(dk), c_int(dv), c_void_p(prep)], CHUNKED_SMEM)


def gated_norm(L, o, z, w, out, rows, dv, eps) -> None:
    L.go("reflex_dn_gated_norm", (rows + 7) // 8, 256,
         [c_void_p(o), c_void_p(z), c_void_p(w), c_void_p(out), c_int(rows), c_int(dv), c_float(eps)])
