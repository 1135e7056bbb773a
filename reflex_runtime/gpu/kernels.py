"""The one table of kernel names the fatbin must carry (kernels/*.cu, all `extern "C"`).

scripts/build_kernels.py writes this list into the manifest beside the fatbin, CI checks with
cuobjdump that every name is there for every architecture, and `reflex smoke` resolves every
name on the GPU at hand. Argument packs live with the code that launches them (gpu/launch.py).
"""

# ggml type name -> kernel suffix, for the weight types the kernels decode (kernels/quant.cuh)
WEIGHT_TYPES = {
    "F32": "f32", "F16": "f16", "BF16": "bf16", "Q8_0": "q8_0", "Q4_0": "q4_0", "Q5_0": "q5_0",
    "Q4_1": "q4_1", "Q5_1": "q5_1",
    "Q4_K": "q4_k", "Q5_K": "q5_k", "Q6_K": "q6_k",
}

_PER_TYPE = ("reflex_embed_{}", "reflex_mv_{}", "reflex_mv_glu_{}", "reflex_mm_{}", "reflex_moe_mv_glu_{}",
             "reflex_moe_mv_down_{}", "reflex_moe_mm_{}", "reflex_mla_mv_{}", "reflex_mla_mm_{}", "reflex_mla_mv_t_{}",
             # sm_80+ prompt kernels (gemm.cu): two tile configurations each, and the grouped experts
             "reflex_gemm_{}_l", "reflex_gemm_{}_s", "reflex_gemm_glu_{}_l", "reflex_gemm_glu_{}_s",
             "reflex_moe_gemm_glu_{}", "reflex_moe_gemm_down_{}",
             # one-token (decode) kernels with their weights staged in shared memory
             "reflex_mvs_{}", "reflex_mvs_glu_{}", "reflex_moe_mvs_down_{}")

_SINGLE = (
    "reflex_rmsnorm", "reflex_glu", "reflex_scale", "reflex_qk_rope_store", "reflex_attn", "reflex_attn_decode",
    "reflex_mvs_mixed",
    "reflex_argmax_partial", "reflex_argmax_final", "reflex_sample", "reflex_logprob_rows", "reflex_softcap",
    "reflex_smoke_axpb", "reflex_moe_topk", "reflex_moe_group", "reflex_moe_combine", "reflex_moe_route",
    "reflex_mla_rope_store", "reflex_mla_attn",
    "reflex_flash_attn_64", "reflex_flash_attn_128", "reflex_flash_attn_256",
    "reflex_dn_conv", "reflex_dn_conv_state", "reflex_dn_recurrent", "reflex_dn_chunked", "reflex_dn_gated_norm",
    "reflex_gate_split", "reflex_sigmoid_mul",
    "reflex_logit_stats", "reflex_mask_logits", "reflex_token_logit",  # logprobs and grammars (constrain.cu)
    "reflex_moe_router_f32", "reflex_moe_router_f16", "reflex_moe_router_bf16",  # float routers only
)

KERNEL_NAMES: tuple[str, ...] = tuple(p.format(s) for p in _PER_TYPE for s in WEIGHT_TYPES.values()) + _SINGLE
