"""What happens to text before the merges: special tokens are cut out, then byte-level BPE
vocabularies split the rest with their pre-tokenizer and spell it in GPT-2's byte alphabet.

A pre-tokenizer cuts text into pieces before BPE; merges never cross a piece boundary. Each
`tokenizer.ggml.pre` name stands for the `pre_tokenizer` of the model's Hugging Face
tokenizer.json: a chain of regex Splits with behaviour "Isolated", where every match and every
stretch of text between matches becomes its own piece, and each later pattern cuts the pieces the
earlier ones left. The pattern texts below are those tokenizer.json files' own (the same ones
llama.cpp's src/llama-vocab.cpp lists for these names).

They need \\p{L}, \\p{N}, \\p{M}, \\p{P}, \\p{S} and case-insensitive groups, which the stdlib `re`
lacks, so we use the `regex` package (imported on first use: ~10 ms; the same patterns spelled out
as stdlib character classes take longer to compile and match 3x slower). `\\s` in `regex` is the
Unicode White_Space property, which is what Oniguruma (used by `tokenizers`) means by it.
"""

from __future__ import annotations

import re
import sys
from typing import Callable

from ..errors import ReflexError, UnsupportedModelError

# Contractions are case-insensitive in the originals: (?i:...) also folds e.g. "'ſ" to "'s".
_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"

_QWEN2 = (
    _CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen3.5: letter runs also take combining marks.
_QWEN35 = (
    _CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Llama 3 (llama.cpp's "llama-bpe"): digits in groups of up to three.
_LLAMA3 = (
    _CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# GPT-2's byte-level pattern (the ByteLevel pre-tokenizer's own regex, case-sensitive contractions).
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

# DeepSeek LLM 7B/67B: explicit letter ranges (Latin, Greek, Cyrillic, Armenian, Georgian, ...).
_DEEPSEEK_LLM_LETTERS = (
    "A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481"
    "\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf"
    "\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d"
    "\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4"
    "\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
    "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f"
    "\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
    "\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb"
    "\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943"
)
_DEEPSEEK_LLM = (
    r"[\r\n]",
    r"\s?[" + _DEEPSEEK_LLM_LETTERS + "]+",
    r"\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    r"\s+$",
    "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
    r"\p{N}+",  # the Digits pre-tokenizer: runs of numeric characters
)

# DeepSeek V3/R1: digits in groups of up to three, CJK kana/ideograph runs, then a GPT-4-like
# pattern where one ASCII punctuation mark may lead a run of ASCII letters.
_DEEPSEEK_V3 = (
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)

PATTERNS: dict[str, tuple[str, ...]] = {
    "llama-bpe": (_LLAMA3,), "llama3": (_LLAMA3,), "llama-v3": (_LLAMA3,),  # llama.cpp's names for it
    # SmolLM / SmolLM2: every numeric character on its own (HF's Digits(individual_digits)), then GPT-2's split
    "smollm": (r"\p{N}", _GPT2),
    "qwen2": (_QWEN2,),
    "deepseek-r1-qwen": (_QWEN2,),  # DeepSeek-R1 distills of Qwen keep Qwen's tokenizer
    "qwen35": (_QWEN35,),
    "deepseek-llm": _DEEPSEEK_LLM,
    "deepseek-v3": _DEEPSEEK_V3,
}

# Pre-tokenizers whose pieces, when a piece is itself a vocabulary token, become that token without
# merging (HF's BPE `ignore_merges`, which Llama 3's tokenizer.json sets; llama.cpp does the same).
IGNORE_MERGES = frozenset({"llama-bpe", "llama3", "llama-v3"})
# Pre-tokenizers for which llama.cpp adds a BOS unless the file says otherwise (add_bos_token).
ADD_BOS_DEFAULT = frozenset({"llama-bpe", "llama3", "llama-v3"})

_splitters: dict[str, Callable[[str], list[str]]] = {}


def splitter(pre: str) -> Callable[[str], list[str]]:
    """The pre-tokenizer for `tokenizer.ggml.pre` == pre: text -> pieces (compiled once per process)."""
    fn = _splitters.get(pre)
    if fn is None:
        if pre not in PATTERNS:
            raise UnsupportedModelError(
                f"unsupported BPE pre-tokenizer '{pre}' (supported: {', '.join(sorted(PATTERNS))})"
            )
        try:
            import regex  # deferred: only byte-level BPE vocabularies need it
        except ImportError:
            raise ReflexError("byte-level BPE tokenizers need the 'regex' package (pip install regex)") from None

        compiled = [regex.compile(p) for p in PATTERNS[pre]]
        fn = _chain(compiled)
        _splitters[pre] = fn
    return fn


def _chain(patterns) -> Callable[[str], list[str]]:
    if len(patterns) == 1:
        return _isolated(patterns[0])
    splits = [_isolated(p) for p in patterns]

    def split_all(text: str) -> list[str]:
        pieces = [text]
        for split in splits:
            pieces = [part for piece in pieces for part in split(piece)]
        return pieces

    return split_all


def _isolated(pattern) -> Callable[[str], list[str]]:
    """Split "Isolated": each match is a piece, and so is each non-empty gap between matches."""
    finditer = pattern.finditer

    def split(text: str) -> list[str]:
        pieces = []
        done = 0
        for m in finditer(text):
            start, end = m.span()
            if start == end:
                continue
            if start > done:
                pieces.append(text[done:start])
            pieces.append(text[start:end])
            done = end
        if done < len(text):
            pieces.append(text[done:])
        return pieces

    return split


def _byte_chars() -> list[str]:
    """GPT-2's byte -> printable char map: printable Latin-1 bytes stand for themselves, the other
    68 bytes (controls, space, NBSP, soft hyphen) take the chars from U+0100 on, in byte order."""
    printable = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    chars = []
    spare = 0x100
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(spare))
            spare += 1
    return chars


BYTE_CHARS: list[str] = _byte_chars()
# str.translate tables: Latin-1 text -> byte-level text, and back. Chars outside the 256-char
# alphabet map to U+FFFF so that a later .encode("latin-1") fails and the caller falls back.
TO_BYTE_CHARS = {b: c for b, c in enumerate(BYTE_CHARS)}
FROM_BYTE_CHARS = {ord(c): b for b, c in enumerate(BYTE_CHARS)}
for _b in range(256):
    FROM_BYTE_CHARS.setdefault(_b, 0xFFFF)
del _b


# -- special tokens -------------------------------------------------------------------------------


class SpecialTokens:
    """Cuts special-token texts out of a text as llama.cpp does: the longest token text first,
    each over the fragments the earlier ones left, every non-overlapping occurrence from the left.

    Only tokens that occur are cut. To find them without a pass per special token (Gemma 3 has
    6,400), tokens are grouped by first character; for each first character in the text, either
    each of its occurrences is probed with slices of the group's lengths, or each token of the
    group is searched for, whichever is fewer operations.
    """

    def __init__(self, tokens: list[str], ids: list[int]):
        groups: dict[str, dict[str, int]] = {}
        for token_id in ids:
            text = tokens[token_id]
            if text:  # the lowest id wins among duplicates
                groups.setdefault(text[0], {}).setdefault(text, token_id)
        self._groups = groups
        self._lengths = {c: sorted({len(t) for t in g}, reverse=True) for c, g in groups.items()}
        self._first_chars = frozenset(groups)

    def partition(self, text: str) -> list:
        """`text` as a list of str fragments and int token ids, in order."""
        fragments: list = [text] if text else []
        for token_text, token_id in self._present(text):
            cut: list = []
            for fragment in fragments:
                if type(fragment) is int or token_text not in fragment:
                    cut.append(fragment)
                    continue
                for k, part in enumerate(fragment.split(token_text)):
                    if k:
                        cut.append(token_id)
                    if part:
                        cut.append(part)
            fragments = cut
        return fragments

    def _present(self, text: str) -> list[tuple[str, int]]:
        """(token text, id) of the special tokens that occur in `text`, longest first, then by id."""
        found = []
        for first in self._first_chars.intersection(text):
            group = self._groups[first]
            lengths = self._lengths[first]
            if text.count(first) * len(lengths) < len(group):
                hits = set()
                pos = text.find(first)
                while pos >= 0:
                    for length in lengths:
                        if text[pos:pos + length] in group:
                            hits.add(text[pos:pos + length])
                    pos = text.find(first, pos + 1)
            else:
                hits = [t for t in group if t in text]
            found.extend((token_text, group[token_text]) for token_text in hits)
        found.sort(key=lambda hit: (-len(hit[0]), hit[1]))
        return found


def ids_of_types(types, wanted: tuple[int, ...]) -> list[int]:
    """Ids whose token type (an array from tokenizer.ggml.token_type) is in `wanted`, in order."""
    if types is None:
        return []
    if types.itemsize == 4 and sys.byteorder == "little":
        # Token types are small: take the low byte of each int32 and search those with one regex
        # instead of looping over 150k-260k items in Python (~3 ms instead of ~15 ms).
        raw = types.tobytes()
        high = raw[1::4] + raw[2::4] + raw[3::4]
        if high.count(0) == len(high):
            kinds = re.compile(b"[" + re.escape(bytes(wanted)) + b"]")
            return [m.start() for m in kinds.finditer(raw[::4])]
    wanted_set = set(wanted)
    return [i for i, t in enumerate(types) if t in wanted_set]
