// embed.cu: out[t, :] = scale * row tokens[t] of the token embedding, decoded from its GGUF
// blocks. One block per token; bound by one row read (n_embd weights).
// Out-of-range ids (never produced by our tokenizer or sampler) give a zero row, not a fault.
#include "embed.cuh"

template <int T>
__device__ void embed_body(const uint8_t* table, long row_bytes, const int* tokens, float* out, int n_embd, int n_vocab,
                           float scale) {
    rx_embed_row<T>(table, row_bytes, tokens[blockIdx.x], out + (long)blockIdx.x * n_embd, n_embd, n_vocab, scale);
}

#define RX_EMBED(name, T)                                                                                         \
    extern "C" __global__ void reflex_embed_##name(const uint8_t* table, long row_bytes, const int* tokens,        \
                                                   float* out, int n_embd, int n_vocab, float scale) {            \
        rx_pdl_begin();                                                                                           \
        embed_body<T>(table, row_bytes, tokens, out, n_embd, n_vocab, scale);                                     \
    }

RX_FOR_EACH_TYPE(RX_EMBED)
