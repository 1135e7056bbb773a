"""The GGUF tensor names (llama.cpp's conventions, as its converter writes them), spelled once for
every family, the numpy reference and the GPU blocks. Per-layer tensors: `blk(il, ATTN_Q)`."""

TOKEN_EMBD = "token_embd.weight"
OUTPUT = "output.weight"
OUTPUT_NORM = "output_norm.weight"
ROPE_FREQS = "rope_freqs.weight"  # per-pair RoPE frequency divisors (Llama 3.1+), shared by all layers

# attention
ATTN_NORM = "attn_norm.weight"
ATTN_Q = "attn_q.weight"
ATTN_K = "attn_k.weight"
ATTN_V = "attn_v.weight"
ATTN_QKV = "attn_qkv.weight"  # fused q/k/v (and Qwen3.5's linear-attention input)
ATTN_OUT = "attn_output.weight"
ATTN_Q_NORM = "attn_q_norm.weight"
ATTN_K_NORM = "attn_k_norm.weight"
ATTN_GATE = "attn_gate.weight"
POST_ATTN_NORM = "post_attention_norm.weight"
# multi-head latent attention (DeepSeek-V2/V3)
ATTN_Q_A = "attn_q_a.weight"
ATTN_Q_A_NORM = "attn_q_a_norm.weight"
ATTN_Q_B = "attn_q_b.weight"
ATTN_KV_A_MQA = "attn_kv_a_mqa.weight"
ATTN_KV_A_NORM = "attn_kv_a_norm.weight"
ATTN_KV_B = "attn_kv_b.weight"
ATTN_K_B = "attn_k_b.weight"
ATTN_V_B = "attn_v_b.weight"

# feed-forward
FFN_NORM = "ffn_norm.weight"
FFN_GATE = "ffn_gate.weight"
FFN_UP = "ffn_up.weight"
FFN_DOWN = "ffn_down.weight"
POST_FFN_NORM = "post_ffw_norm.weight"
# routed experts (stacked per expert) and shared experts
FFN_ROUTER = "ffn_gate_inp.weight"
FFN_GATE_EXPS = "ffn_gate_exps.weight"
FFN_UP_EXPS = "ffn_up_exps.weight"
FFN_GATE_UP_EXPS = "ffn_gate_up_exps.weight"
FFN_DOWN_EXPS = "ffn_down_exps.weight"
FFN_EXP_PROBS_B = "exp_probs_b.bias"
FFN_GATE_SHEXP = "ffn_gate_shexp.weight"
FFN_UP_SHEXP = "ffn_up_shexp.weight"
FFN_DOWN_SHEXP = "ffn_down_shexp.weight"
FFN_ROUTER_SHEXP = "ffn_gate_inp_shexp.weight"

# Gated DeltaNet (Qwen3.5 linear attention)
SSM_CONV1D = "ssm_conv1d.weight"
SSM_A = "ssm_a"
SSM_DT_BIAS = "ssm_dt.bias"
SSM_ALPHA = "ssm_alpha.weight"
SSM_BETA = "ssm_beta.weight"
SSM_NORM = "ssm_norm.weight"
SSM_OUT = "ssm_out.weight"


def blk(il: int, name: str) -> str:
    """The name of layer il's tensor `name`."""
    return f"blk.{il}.{name}"
