"""Tokenizer built from GGUF metadata alone (`tokenizer.ggml.*`), behaving as llama.cpp does.

Two vocabulary kinds:
- "gpt2": byte-level BPE (Qwen2/3/3.5, DeepSeek, Llama 3, SmolLM2). Text -> pre-tokenizer pieces
  (pretokenize.py) -> UTF-8 bytes spelled in GPT-2's 256-char alphabet -> merges by rank (lowest
  first, leftmost on ties) -> token ids. Llama 3's pre-tokenizer also takes a piece that is a
  whole vocabulary token as that token, without merging (`ignore_merges`).
- "llama": SentencePiece-style (Llama 2, Gemma 3). Spaces become U+2581, an optional space is
  put in front, then adjacent symbols are merged into the vocabulary piece with the highest
  score; characters no piece covers fall back to <0xNN> byte tokens.

Before either runs, special tokens are cut out of the text: CONTROL and UNKNOWN tokens only when
parse_special is set, USER_DEFINED tokens always, longest token text first (llama.cpp's order).

Cold path: construction only reads scalars and keeps references to the metadata arrays. The big
lookup tables (token -> id, merge -> rank, special-token index) are built on first use, which is
the first encode of every cold request; `prepare()` builds them ahead (e.g. from a thread while
weights upload). With the sorted orders of a model index (`adopt_tables()`), token -> id and
merge -> rank start as bisection over sorted references (lookup.py: no hashing on the cold path)
and become dicts after DICTS_AFTER_CHARS of encoded text. No numpy here.
"""

from __future__ import annotations

import codecs
import threading
from typing import Any, Iterable, Mapping

from ..errors import ModelFileError, RequestError, UnsupportedModelError
from ..modelfile.gguf_file import printable
from .lookup import OrderError, SortedLookup, first_wins, last_wins, sorted_order
from .merges import bpe_merge, spm_merge
from .pretokenize import (ADD_BOS_DEFAULT, FROM_BYTE_CHARS, IGNORE_MERGES, PATTERNS, TO_BYTE_CHARS, SpecialTokens,
                          ids_of_types, splitter)

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

SUPPORTED_MODELS = ("gpt2", "llama")
SPACE_MARK = "\u2581"  # SentencePiece's visible space

# Token texts that end generation, from llama.cpp's end-of-generation list (the ones that mean
# end of turn or of text, not fill-in-the-middle markers).
END_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
    "<|end_of_text|>", "<EOT>", "<eos>", "<\uff5cend\u2581of\u2581sentence\uff5c>",
})

_WORD_CACHE_LIMIT = 1 << 16  # BPE results kept per distinct pre-tokenizer piece
# Text encoded through sorted lookups (~20x a dict's cost per lookup) before the dicts are built
# (~0.1-0.2 s): a cold start's first short prompts never build them, a long prompt or a busy
# server soon does, after ~10-40 ms of slower lookups.
DICTS_AFTER_CHARS = 4096


class Tokenizer:
    """See module docstring. Build with `from_gguf` or `from_metadata`."""

    def __init__(self, *, model: str, pre: str | None, tokens: list[str], token_types=None,
                 scores=None, merges: list[str] | None = None, bos_id: int | None = None,
                 eos_id: int | None = None, eot_id: int | None = None, eom_id: int | None = None,
                 unk_id: int | None = None, add_bos: bool = False, add_eos: bool = False,
                 add_space_prefix: bool = False, chat_template: str | None = None):
        self.model = model
        self.pre = pre
        self._tokens = tokens
        self._types = token_types  # array of token types, or None: all NORMAL
        self._scores = scores
        self._merges = merges
        self.bos_id, self.eos_id, self.eot_id, self.eom_id, self.unk_id = bos_id, eos_id, eot_id, eom_id, unk_id
        self.add_bos, self.add_eos, self.add_space_prefix = add_bos, add_eos, add_space_prefix
        self.chat_template = chat_template
        self._is_spm = model == "llama"
        self._ignore_merges = model == "gpt2" and pre in IGNORE_MERGES
        # Built on first use (see prepare()).
        self._token_ids: dict[str, int] | SortedLookup | None = None
        self._ranks: dict[str, int] | SortedLookup | None = None
        self._orders: dict | None = None  # adopt_tables(): sorted orders from the model index
        self._sorted_chars = 0  # text encoded through SortedLookups (see DICTS_AFTER_CHARS)
        self._tables_lock = threading.Lock()  # the switch from sorted lookups to dicts (_table)
        self._special_ids: list[int] | None = None  # CONTROL, UNKNOWN and USER_DEFINED ids
        self._specials: dict[bool, SpecialTokens] = {}  # by parse_special
        self._stop_ids: frozenset[int] | None = None
        self._byte_ids: list[int | None] | None = None
        self._split = None
        self._word_cache: dict[str, tuple[int, ...]] = {}
        self._bytes_cache: dict[int, bytes] = {}

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, gguf) -> "Tokenizer":
        """The file's tokenizer; its vocabulary must match the token embedding's rows (as
        llama.cpp requires), so no token id can fall outside the model."""
        tokenizer = cls.from_metadata(gguf.metadata)
        emb = gguf.tensors.get("token_embd.weight")
        if emb is not None and len(emb.shape) == 2 and emb.shape[1] != tokenizer.vocab_size:
            raise ModelFileError(f"GGUF vocabulary has {tokenizer.vocab_size} tokens but token_embd.weight has "
                                 f"{emb.shape[1]} rows: {printable(gguf.path, 1024)}")
        return tokenizer

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> "Tokenizer":
        """Validates what it reads: types, lengths, ids (see _number_array, _token_id)."""
        model = metadata.get("tokenizer.ggml.model")
        if not isinstance(model, str):
            raise ModelFileError("GGUF has no tokenizer (tokenizer.ggml.model is missing or not a string)")
        if model not in SUPPORTED_MODELS:
            raise UnsupportedModelError(
                f"unsupported tokenizer model '{printable(model)}' (supported: {', '.join(SUPPORTED_MODELS)})"
            )
        pre = metadata.get("tokenizer.ggml.pre")
        if pre is not None and not isinstance(pre, str):
            raise ModelFileError("GGUF tokenizer.ggml.pre should be a string")
        if model == "gpt2" and pre not in PATTERNS:
            raise UnsupportedModelError(
                f"unsupported BPE pre-tokenizer '{printable(pre) if pre is not None else 'missing'}' "
                f"(supported: {', '.join(sorted(PATTERNS))})"
            )
        tokens = metadata.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, list) or not tokens or not isinstance(tokens[0], str):
            raise ModelFileError("GGUF tokenizer.ggml.tokens is missing or not a list of strings")
        n = len(tokens)
        token_types = _number_array(metadata, "tokenizer.ggml.token_type", n, integers=True)
        scores = _number_array(metadata, "tokenizer.ggml.scores", n)
        merges = metadata.get("tokenizer.ggml.merges")
        if model == "gpt2" and (not isinstance(merges, list) or (merges and not isinstance(merges[0], str))):
            raise ModelFileError("GGUF byte-level BPE vocabulary has no tokenizer.ggml.merges string list")

        spm = model == "llama"
        # llama.cpp's defaults: SentencePiece files assume <unk>=0, <s>=1, </s>=2, a BOS and a
        # leading space; BPE files name their ids and add nothing unless they say so.
        bos_id = _token_id(metadata, "tokenizer.ggml.bos_token_id", n, 1 if spm else None)
        eos_id = _token_id(metadata, "tokenizer.ggml.eos_token_id", n, 2 if spm else None)
        add_bos = _flag(metadata, "tokenizer.ggml.add_bos_token", spm or pre in ADD_BOS_DEFAULT)
        add_eos = _flag(metadata, "tokenizer.ggml.add_eos_token", False)
        if add_bos and bos_id is None:
            raise ModelFileError("GGUF asks for a BOS token (add_bos_token) but names no valid bos_token_id")
        if add_eos and eos_id is None:
            raise ModelFileError("GGUF asks for an EOS token (add_eos_token) but names no valid eos_token_id")
        template = metadata.get("tokenizer.chat_template")
        if template is not None and not isinstance(template, str):
            raise ModelFileError("GGUF tokenizer.chat_template should be a string")
        return cls(
            model=model,
            pre=pre if isinstance(pre, str) else None,
            tokens=tokens,
            token_types=token_types,
            scores=scores,
            merges=merges if model == "gpt2" else None,
            bos_id=bos_id,
            eos_id=eos_id,
            eot_id=_token_id(metadata, "tokenizer.ggml.eot_token_id", n, None),
            eom_id=_token_id(metadata, "tokenizer.ggml.eom_token_id", n, None),
            unk_id=_token_id(metadata, "tokenizer.ggml.unknown_token_id", n, 0 if spm else None),
            add_bos=add_bos,
            add_eos=add_eos,
            add_space_prefix=spm and _flag(metadata, "tokenizer.ggml.add_space_prefix", True),
            chat_template=template if isinstance(template, str) else None,
        )

    def export_tables(self) -> dict:
        """What the model index keeps (modelcache.py) for adopt_tables(): the sorted orders of the
        token texts and merges (lookup.sorted_order; ~0.3 s, never on the cold path)."""
        out = {"ids_order": sorted_order(self._tokens, last=True)}
        if self._merges is not None and not self._is_spm:
            out["ranks_order"] = sorted_order(self._merges, last=False)
        return out

    def adopt_tables(self, tables: dict) -> "Tokenizer":
        """Use export_tables()'s orders from an index of this same file: the first lookups bisect
        instead of waiting for the dicts. Orders that do not fit are ignored (dicts are built)."""
        if isinstance(tables, dict) and isinstance(tables.get("ids_order"), bytes):
            self._orders = tables
        return self

    def prepare(self) -> "Tokenizer":
        """Build every lookup table now instead of on first encode. Safe to run in a thread."""
        self._ids()
        self._special_tokens(True)
        self._special_tokens(False)
        if not self._is_spm:
            self._merge_ranks()
            self._splitter()
        _ = self.stop_ids
        return self

    # -- properties -----------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    @property
    def stop_ids(self) -> frozenset[int]:
        """EOS, EOT, EOM and every token whose text marks the end of a turn or of the text."""
        if self._stop_ids is None:
            ids = {i for i in (self.eos_id, self.eot_id, self.eom_id) if i is not None}
            ids.update(self._over_lookups(self._end_text_ids))
            self._stop_ids = frozenset(ids)
        return self._stop_ids

    def _over_lookups(self, fn, *args):
        """fn(*args) over the token tables; if a saved sorted order turns out damaged (OrderError
        from a probe the load-time sample missed), again over dicts, as without an index."""
        try:
            return fn(*args)
        except OrderError:
            self._drop_orders()
            return fn(*args)

    def _end_text_ids(self) -> list[int]:
        token_ids = self._ids()
        return [token_ids[t] for t in END_TEXTS if t in token_ids]

    def token_type(self, token_id: int) -> int:
        return NORMAL if self._types is None else self._types[token_id]

    def is_special(self, token_id: int) -> bool:
        """Control and unknown tokens, BOS and stop tokens: what decode(skip_special=True) drops."""
        self._check_id(token_id)
        return (self.token_type(token_id) in (CONTROL, UNKNOWN) or token_id == self.bos_id
                or token_id in self.stop_ids)

    def token_text(self, token_id: int) -> str:
        """The token's text as stored in the vocabulary (e.g. for a template's bos_token)."""
        self._check_id(token_id)
        return self._tokens[token_id]

    # -- encode ---------------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Text -> token ids. add_special adds BOS/EOS as the file says; parse_special turns
        control-token texts such as "<|im_start|>" into their ids instead of spelling them."""
        if not isinstance(text, str):
            raise RequestError(f"text to tokenize must be a string, not {type(text).__name__}")
        text = _well_formed(text)
        if self._orders is not None:  # sorted lookups (adopt_tables): dicts once they pay off
            self._sorted_chars += len(text)
            if self._sorted_chars > DICTS_AFTER_CHARS:
                self._drop_orders()
        return self._over_lookups(self._encode, text, add_special, parse_special)

    def _encode(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        out: list[int] = []
        if add_special and self.add_bos:
            out.append(self.bos_id)
        after_special = True  # SentencePiece puts its leading space after BOS/special tokens
        for fragment in self._special_tokens(parse_special).partition(text):
            if type(fragment) is int:
                out.append(fragment)
                after_special = True
            else:
                if self._is_spm:
                    self._encode_spm(fragment, after_special, out)
                else:
                    self._encode_bpe(fragment, out)
                after_special = False
        if add_special and self.add_eos:
            out.append(self.eos_id)
        return out

    # byte-level BPE

    def _encode_bpe(self, text: str, out: list[int]) -> None:
        cache = self._word_cache
        for piece in self._splitter()(text):
            ids = cache.get(piece)
            if ids is None:
                ids = self._bpe_word(piece)
                if len(cache) >= _WORD_CACHE_LIMIT:
                    cache.clear()
                cache[piece] = ids
            out.extend(ids)

    def _bpe_word(self, piece: str) -> tuple[int, ...]:
        chars = piece.encode("utf-8").decode("latin-1").translate(TO_BYTE_CHARS)
        token_ids = self._ids()
        if self._ignore_merges:
            whole = token_ids.get(chars)
            if whole is not None:
                return (whole,)
        ranks = self._merge_ranks()
        ids = []
        for symbol in bpe_merge(list(chars), ranks):
            token_id = token_ids.get(symbol)
            if token_id is not None:
                ids.append(token_id)
            else:  # a merge whose result is not in the vocabulary: spell it byte by byte
                ids.extend(token_ids[c] for c in symbol if c in token_ids)
        return tuple(ids)

    def _merge_ranks(self) -> dict[str, int]:
        # Keyed by the merge's own "left right" text: building it hashes each string once and
        # splits nothing; a pair is looked up as left + " " + right (byte-level text has no spaces).
        # Built back to front so that a repeated merge keeps its first rank, as in llama.cpp.
        ranks = self._ranks
        if ranks is None:
            ranks = self._table("_ranks", "ranks_order", self._merges, first_wins)
        return ranks

    def _splitter(self):
        if self._split is None:
            self._split = splitter(self.pre)
        return self._split

    # SentencePiece

    def _encode_spm(self, text: str, after_special: bool, out: list[int]) -> None:
        if after_special and self.add_space_prefix:
            text = " " + text
        token_ids = self._ids()
        types = self._types
        scores = self._scores
        unused_halves: dict[str, tuple[str, str]] = {}

        def pair_score(left: str, right: str) -> float | None:
            token_id = token_ids.get(left + right)
            if token_id is None:
                return None
            kind = NORMAL if types is None else types[token_id]
            if kind in (CONTROL, UNKNOWN, BYTE):  # SentencePiece never forms these from text
                return None
            if kind == UNUSED:  # may be formed, but is then split again (as sentencepiece does)
                unused_halves[left + right] = (left, right)
            return scores[token_id] if scores is not None else 0.0

        for piece in spm_merge(list(text.replace(" ", SPACE_MARK)), pair_score):
            self._spm_emit(piece, token_ids, unused_halves, out)

    def _spm_emit(self, symbol: str, token_ids, unused_halves, out: list[int]) -> None:
        token_id = token_ids.get(symbol)
        if token_id is not None:
            kind = self.token_type(token_id)
            if kind == UNUSED and symbol in unused_halves:
                for half in unused_halves[symbol]:
                    self._spm_emit(half, token_ids, unused_halves, out)
                return
            if kind not in (CONTROL, UNKNOWN, BYTE):
                out.append(token_id)
                return
        for byte in symbol.encode("utf-8"):
            byte_id = self._byte_token(byte)
            if byte_id is not None:
                out.append(byte_id)

    def _byte_token(self, byte: int) -> int | None:
        if self._byte_ids is None:
            token_ids = self._ids()
            table: list[int | None] = []
            for b in range(256):
                token_id = token_ids.get(f"<0x{b:02X}>")
                if token_id is None and b < 0x80:
                    token_id = token_ids.get(chr(b))
                table.append(token_id if token_id is not None else self.unk_id)
            self._byte_ids = table
        return self._byte_ids[byte]

    # -- decode ---------------------------------------------------------------------------

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for (special tokens: their text). May be part of a UTF-8 char."""
        data = self._bytes_cache.get(token_id)
        if data is None:
            self._check_id(token_id)
            data = self._bytes_cache[token_id] = self._piece_bytes(token_id)
        return data

    def _piece_bytes(self, token_id: int) -> bytes:
        text = self._tokens[token_id]
        kind = self.token_type(token_id)
        if kind in (CONTROL, UNKNOWN, USER_DEFINED):
            return text.encode("utf-8", "surrogateescape")
        if kind == BYTE:
            byte = _hex_byte(text)
            if byte is not None:
                return bytes((byte,))
        if self._is_spm:
            return text.replace(SPACE_MARK, " ").encode("utf-8", "surrogateescape")
        try:
            return text.translate(FROM_BYTE_CHARS).encode("latin-1")
        except UnicodeEncodeError:  # not byte-level text: keep it as it is
            return text.encode("utf-8", "surrogateescape")

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Token ids -> text; invalid UTF-8 becomes U+FFFD. For SentencePiece files that add a
        leading space, the space encode() put after the start or a special token is taken off."""
        strip_space = self._is_spm and self.add_space_prefix
        after_special = True
        parts = []
        for token_id in ids:
            data = self.token_bytes(token_id)
            kind = self.token_type(token_id)
            if kind in (CONTROL, UNKNOWN, USER_DEFINED):
                after_special = True
                if skip_special and self.is_special(token_id):
                    continue
            else:
                if skip_special and self.is_special(token_id):
                    continue
                if strip_space and after_special and data[:1] == b" ":
                    data = data[1:]
                after_special = False
            parts.append(data)
        return b"".join(parts).decode("utf-8", "replace")

    def stream_decoder(self, skip_special: bool = False) -> "StreamDecoder":
        return StreamDecoder(self, skip_special)

    # -- lookup tables --------------------------------------------------------------------

    def _ids(self) -> dict[str, int]:
        ids = self._token_ids
        if ids is None:  # later duplicates win, as in llama.cpp
            ids = self._table("_token_ids", "ids_order", self._tokens, last_wins)
        return ids

    def _table(self, attr: str, order_name: str, keys, build):
        """One lookup table: a SortedLookup through the index's order while there is one, else a
        dict. A SortedLookup is kept only if no other thread's encode switched to dicts while it
        was made (it would stay for good); this call uses it either way."""
        orders = self._orders
        table = None
        if orders is not None and isinstance(orders.get(order_name), bytes):
            try:
                table = SortedLookup(keys, orders[order_name])
            except OrderError:  # not this vocabulary's order: dicts for both tables, as without an index
                self._drop_orders()
        if table is None:
            table = build(keys)
        with self._tables_lock:
            if type(table) is not SortedLookup or self._orders is orders:
                setattr(self, attr, table)
        return table

    def _drop_orders(self) -> None:
        """From now on both tables are dicts (built on their next use)."""
        with self._tables_lock:
            self._orders = None
            if type(self._token_ids) is SortedLookup:
                self._token_ids = None
            if type(self._ranks) is SortedLookup:
                self._ranks = None

    def _special_tokens(self, parse_special: bool) -> SpecialTokens:
        specials = self._specials.get(parse_special)
        if specials is None:
            if self._special_ids is None:
                self._special_ids = ids_of_types(self._types, (CONTROL, UNKNOWN, USER_DEFINED))
            ids = self._special_ids
            if not parse_special:  # USER_DEFINED tokens are always cut out, the others on request
                ids = [i for i in ids if self._types[i] == USER_DEFINED]
            specials = self._specials[parse_special] = SpecialTokens(self._tokens, ids)
        return specials

    def _check_id(self, token_id: int) -> None:
        if not (type(token_id) is int and 0 <= token_id < len(self._tokens)):
            raise RequestError(f"token id {token_id!r} is outside the vocabulary (0..{len(self._tokens) - 1})")

    def __repr__(self) -> str:
        return f"Tokenizer({self.model}/{self.pre}, {self.vocab_size} tokens, bos={self.bos_id}, eos={self.eos_id})"


class StreamDecoder:
    """Turns generated ids into text as they come, holding back an incomplete UTF-8 character
    until the token that completes it arrives. Bytes that can never form one become U+FFFD."""

    __slots__ = ("_tokenizer", "_skip_special", "_utf8")

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, token_id: int) -> str:
        if self._skip_special and self._tokenizer.is_special(token_id):
            return ""
        return self._utf8.decode(self._tokenizer.token_bytes(token_id), False)

    def flush(self) -> str:
        """Whatever is held back (as U+FFFD if incomplete); the decoder is then ready to reuse."""
        return self._utf8.decode(b"", True)


def _well_formed(text: str) -> str:
    """Lone surrogates (possible in JSON input) cannot be UTF-8: make each one U+FFFD."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def _hex_byte(text: str) -> int | None:
    if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
        try:
            return int(text[3:5], 16)
        except ValueError:
            return None
    return None


def _number_array(metadata: Mapping[str, Any], key: str, n: int, integers: bool = False):
    """A numeric array with (at least) one entry per token, cut to n entries."""
    value = metadata.get(key)
    if value is None:
        return None
    if not hasattr(value, "typecode") or len(value) < n or (integers and value.typecode in "fd"):
        kind = "an integer" if integers else "a numeric"
        raise ModelFileError(f"GGUF {key} must be {kind} array with one entry per token ({n})")
    return value if len(value) == n else value[:n]


def _token_id(metadata: Mapping[str, Any], key: str, n: int, default: int | None) -> int | None:
    value = metadata.get(key, default)
    if type(value) is not int or not 0 <= value < n:
        # llama.cpp ignores an out-of-range id too; the default, if any, must fit as well.
        return default if default is not None and 0 <= default < n else None
    return value


def _flag(metadata: Mapping[str, Any], key: str, default: bool) -> bool:
    value = metadata.get(key)
    return value if isinstance(value, bool) else default

