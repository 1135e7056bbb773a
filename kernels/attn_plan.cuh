// attn_plan.cuh: how the decode attention (attn_decode.cuh) splits a KV head's keys, in a header of
// its own: the kernel that merges the attention's slices for it (mvs.cuh MvsMerge) plans the same.
#pragma once

// A KV head's slices and head groups (atd_body's plan; the same numbers in every block of it, and
// in fused_step.cu, which maps its work items by them): the visible keys [lo, n_vis) in n_split
// slices of about min_keys, and ng blocks sharing the query heads (1: group 0 takes them all).
struct AtdPlan {
    int n_vis, lo, n_split, ng;
};
__device__ __forceinline__ AtdPlan atd_plan(int n_kv, int slot, int first, int window, int window_slots, int min_keys,
                                            int max_split, int n_hg) {
    AtdPlan p;
    p.n_vis = min(n_kv, slot + 1);
    p.lo = window > 0 && window_slots ? max(first, p.n_vis - window) : first;
    p.n_split = min(max_split, max(1, (p.n_vis - p.lo + min_keys - 1) / min_keys));
    p.ng = n_hg > 1 && p.n_split * n_hg <= max_split ? n_hg : 1;
    return p;
}

// Slices the attention leaves unmerged for the kernel that reads its output (its `defer`): a row
// of 2 .. defer slices (one slice writes the output itself; more than ATD_DEFER_MAX merge in the
// attention, whose two-level merge reads fewer bytes per block at long contexts).
#define ATD_DEFER_MAX 8
__device__ __forceinline__ bool atd_deferred(int n_split, int defer) { return n_split >= 2 && n_split <= defer; }
