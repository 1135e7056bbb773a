"""Text in and out of the model: the tokenizer read from GGUF metadata (tokenizer, pretokenize,
merges), chat templates (chat), and grammars that constrain generation (grammar, with
native_guard running llguidance's compiles where a deep schema cannot crash the process)."""
