"""Text utilities for the data checks: normalisation, n-gram hashing, MinHash, scripts.

All hashing is deterministic (``zlib.crc32`` of words, combined with a fixed
polynomial in uint64 arithmetic); nothing depends on Python's per-process
string hash, so a diagnosis is exactly reproducible.

* ``normalise(s)``: NFC, casefold, whitespace collapsed to one space.
* word n-gram hash of words ``w_i..w_{i+n-1}``: ``h = sum_k crc32(w_{i+k}) * P^k  (mod 2^64)``.
* MinHash with K permutations ``(a_k * h + b_k) mod 2^64``; signature = min over the row's
  shingles; LSH with ``bands`` bands of ``K / bands`` rows; candidate pairs are then verified
  by the exact Jaccard of their shingle sets (so LSH only decides what gets compared).
"""

from __future__ import annotations

import re
import unicodedata
import zlib
from collections import defaultdict
from typing import Iterable, Sequence

import numpy as np

_WORD = re.compile(r"\w+", re.UNICODE)
#: ``_WORD`` for ASCII text: on ASCII characters ``\w`` is ``[A-Za-z0-9_]`` either way; this matches twice as fast.
_WORD_ASCII = re.compile(r"\w+", re.ASCII)
_P = np.uint64(1099511628211)  # FNV prime as the polynomial base


#: The ASCII whitespace other than the space (``str.split`` splits at these too).
_ASCII_WS_NOT_SPACE = "\t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"


def normalise(s: str) -> str:
    """NFC, casefold, whitespace runs collapsed to one space and stripped: ``" ".join(NFC(s).casefold().split())``."""
    t = unicodedata.normalize("NFC", s).casefold()
    if (
        t.isascii()
        and "  " not in t
        and t[:1] != " "
        and t[-1:] != " "
        and not any(c in t for c in _ASCII_WS_NOT_SPACE)
    ):
        return t  # single spaces only: split and join would give it back
    return " ".join(t.split())


def words(s: str) -> list[str]:
    """The words of ``s`` after :func:`normalise`."""
    return find_words(normalise(s))


def find_words(s: str) -> list[str]:
    """``_WORD.findall(s)``: the words of ``s`` (its maximal runs of word characters)."""
    return (_WORD_ASCII if s.isascii() else _WORD).findall(s)


_WH: dict[str, int] = {}


def _word_hash(w: str) -> int:
    h = zlib.crc32(w.encode("utf-8"))
    if len(_WH) < 2_000_000:
        _WH[w] = h
    return h


def word_table(ws: Sequence[str]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``(hashes, ids, vocab)``: (len(ws),) uint64 crc32 of each word, (len(ws),) int64 its index in ``vocab``
    (the distinct words, first seen first).

    Each distinct word is hashed once; the words are then mapped through that table at C speed.
    """
    index = dict.fromkeys(ws)
    vocab = list(index)
    get = _WH.get  # a cached hash of 0 is recomputed (as 0): same result
    vh = np.fromiter((get(w) or _word_hash(w) for w in vocab), dtype=np.uint64, count=len(vocab))
    for k, w in enumerate(vocab):
        index[w] = k
    ids = np.fromiter(map(index.__getitem__, ws), dtype=np.int64, count=len(ws))
    return vh[ids], ids, vocab


def word_hashes(ws: Sequence[str]) -> np.ndarray:
    """(len(ws),) uint64 crc32 of each word."""
    return word_table(ws)[0]


def ngram_hashes(ws: Sequence[str] | np.ndarray, n: int) -> np.ndarray:
    """(max(len(ws)-n+1, 1 if ws else 0),) uint64 hashes of word n-grams; a row shorter than n is one gram.

    ``ws`` is a list of words, or their :func:`word_hashes`.
    """
    if len(ws) == 0:
        return np.zeros(0, dtype=np.uint64)
    h = ws if isinstance(ws, np.ndarray) else word_hashes(ws)
    return rolling_hashes(h, min(n, len(ws)))


def rolling_hashes(h: np.ndarray, n: int) -> np.ndarray:
    """(len(h)-n+1,) uint64 polynomial hashes ``Σ_k h[i+k]·P^k`` (mod 2^64) of each window of ``n`` hashes."""
    m = len(h) - n + 1
    out = np.zeros(m, dtype=np.uint64)
    mult = np.uint64(1)
    with np.errstate(over="ignore"):
        for k in range(n):
            out += h[k : k + m] * mult
            mult = mult * _P
    return out


def ngrams_rows(hash_rows: Sequence[np.ndarray], n: int) -> list[np.ndarray]:
    """:func:`ngram_hashes` for many rows at once (one rolling pass over the concatenation)."""
    lens = np.fromiter((len(h) for h in hash_rows), dtype=np.int64, count=len(hash_rows))
    out: list[np.ndarray] = [np.zeros(0, dtype=np.uint64)] * len(hash_rows)
    if not len(lens) or lens.sum() == 0:
        return out
    flat = np.concatenate([h for h in hash_rows if len(h)]) if lens.sum() else np.zeros(0, dtype=np.uint64)
    T = len(flat)
    starts = np.concatenate(([0], np.cumsum(lens)[:-1]))
    roll = rolling_hashes(flat, n) if T >= n else np.zeros(0, dtype=np.uint64)
    for i, (s0, L) in enumerate(zip(starts.tolist(), lens.tolist())):
        if L == 0:
            continue
        if L >= n:
            out[i] = roll[s0 : s0 + L - n + 1]
        else:
            out[i] = ngram_hashes(hash_rows[i], n)
    return out


_SEGMENT = re.compile(r"(?<=[.!?;:])\s+|\s*\n\s*")
_SENTENCE = re.compile(r"(?<=[.!?;:])\s+")  # _SEGMENT for a text without newlines (half the scanning)


def _split_segments(s: str) -> list[str]:
    """``_SEGMENT.split(s)``."""
    return (_SEGMENT if "\n" in s else _SENTENCE).split(s)


def segments(s: str) -> list[str]:
    """``s`` cut into sentences and lines (at ``.!?;:`` followed by whitespace, and at newlines); only at
    whitespace, so the segments' words, in order, are the words of ``s``.
    """
    return [x for x in _split_segments(s) if x and x.strip()]


#: ``P^-1 mod 2^64`` (``_P`` is odd, so invertible): a span's polynomial hash is normalised to start at power 0.
_P_INV = np.uint64(pow(int(_P), -1, 2**64))
_LEN_MIX = np.uint64(0x9E3779B97F4A7C15)


def _powers(base: np.uint64, n: int) -> np.ndarray:
    """(n,) uint64 ``base^k mod 2^64`` for k = 0..n-1."""
    out = np.full(n, base, dtype=np.uint64)
    if n:
        out[0] = 1
        np.cumprod(out, out=out)  # wraps mod 2^64 (array arithmetic: no overflow warning)
    return out


def span_hash_flat(flat: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Hashes of the word spans ``flat[starts[s]:ends[s]]`` (uint64 word hashes), all at once.

    ``hash = (sum_k flat[start + k] * P^k  mod 2^64)  xor  (length * 0x9E3779B97F4A7C15)``: equal word sequences
    hash equal, in every process; computed from one prefix sum ``Q[i] = sum_{k<i} flat[k] P^k`` as
    ``(Q[end] - Q[start]) * P^-start`` (mod 2^64).
    """
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    if not len(starts):
        return np.zeros(0, dtype=np.uint64)
    T = len(flat)
    q = np.zeros(T + 1, dtype=np.uint64)  # array arithmetic wraps mod 2^64 silently
    np.cumsum(flat * _powers(_P, T), out=q[1:])
    h = (q[ends] - q[starts]) * _powers(_P_INV, T + 1)[starts]
    return h ^ ((ends - starts).astype(np.uint64) * _LEN_MIX)


def span_bounds(lengths: Sequence[int], total: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of consecutive spans of ``lengths`` words (empty ones skipped), clipped to ``total`` words."""
    lens = np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(lens)
    starts = ends - lens
    keep = lens > 0
    return np.minimum(starts[keep], total), np.minimum(ends[keep], total)


def span_hashes(h: np.ndarray | list[int], lengths: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(start, end, hash)`` of consecutive spans of a row's word hashes (one per segment, empty ones skipped,
    clipped to the row); equal word sequences hash equal (:func:`span_hash_flat`).
    """
    flat = np.asarray(h, dtype=np.uint64)
    a, b = span_bounds(lengths, len(flat))
    return list(zip(a.tolist(), b.tolist(), span_hash_flat(flat, a, b).tolist()))


def segment_word_counts(text: str, expected: int | None = None) -> list[int]:
    """Word counts (as :func:`words` counts them) of the :func:`segments` of ``text``.

    One pass over the raw text (word starts between segment boundaries); when that disagrees with the
    normalised word count ``expected`` (a combining mark that NFC merges, say), each segment is
    normalised and counted instead.
    """
    if "\x01" in text:
        parts = _split_segments(text)
        counted = [len(_WORD.findall(x)) for x in parts]
    else:
        # Every word becomes one "\x01" (never whitespace nor .!?;:, so the segments split where they did), and a
        # segment's words are its "\x01"s: no word strings are built.
        parts = _split_segments((_WORD_ASCII if text.isascii() else _WORD).sub("\x01", text))
        counted = [x.count("\x01") for x in parts]
    if len(parts) == 1:
        n = expected if expected is not None else len(words(text))
        return [n] if n else []
    counts = [c for c in counted if c]
    if expected is not None and sum(counts) != expected:
        counts = [len(_WORD.findall(normalise(x))) for x in segments(text)]
    return counts


def _ascii_table(chars: str) -> np.ndarray:
    t = np.zeros(256, dtype=bool)
    t[[ord(c) for c in chars]] = True
    return t


# On ASCII text: what the word and whitespace classes match (Unicode mode: \x1c-\x1f are whitespace too), and the
# characters a segment may end with.
_ASCII_WORD = _ascii_table("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz")
_ASCII_SPACE = _ascii_table("\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f ")
_ASCII_END = _ascii_table(".!?;:")


def segment_word_counts_many(texts: Sequence[str], expected: Sequence[int]) -> list[list[int]]:
    """``[segment_word_counts(t, e) for t, e in zip(texts, expected)]``, the ASCII texts all at once with numpy.

    ``_SEGMENT.split`` cuts at a whitespace run that follows one of ``.!?;:`` or holds a newline (the regex can
    match nowhere else), so on the ASCII texts joined by newlines (each join is such a run, and adds no word):
    word starts (a word character after a non-word one), whitespace runs, the runs that cut, and the words
    between consecutive cuts (by binary search in the word starts). A text whose counts do not add up to its
    ``expected`` takes :func:`segment_word_counts` itself.
    """
    out: list[list[int] | None] = [None] * len(texts)
    idx = [i for i, t in enumerate(texts) if t.isascii()]
    for i in set(range(len(texts))) - set(idx):
        out[i] = segment_word_counts(texts[i], expected[i])
    if idx:
        a = np.frombuffer("\n".join([texts[i] for i in idx]).encode("ascii"), dtype=np.uint8)
        n = len(a)
        isw = _ASCII_WORD[a]
        iss = _ASCII_SPACE[a]
        starts = isw.copy()
        starts[1:] &= ~isw[:-1]
        w_at = np.flatnonzero(starts)  # where each word starts
        prev_s = np.zeros(n, dtype=bool)
        prev_s[1:] = iss[:-1]
        next_s = np.zeros(n, dtype=bool)
        next_s[:-1] = iss[1:]
        r0 = np.flatnonzero(iss & ~prev_s)  # whitespace runs [r0, r1)
        r1 = np.flatnonzero(iss & ~next_s) + 1
        nl = np.flatnonzero(a == 10)
        cut = np.searchsorted(nl, r1) > np.searchsorted(nl, r0)  # the run holds a newline
        cut[r0 > 0] |= _ASCII_END[a[r0[r0 > 0] - 1]]
        seg_from = np.concatenate(([0], r1[cut]))
        seg_to = np.concatenate((r0[cut], [n]))
        cnt = np.searchsorted(w_at, seg_to) - np.searchsorted(w_at, seg_from)  # words starting in [from, to)
        keep = cnt > 0
        text_start = np.zeros(len(idx), dtype=np.int64)
        np.cumsum([len(texts[i]) + 1 for i in idx[:-1]], out=text_start[1:])
        seg_text = np.searchsorted(text_start, seg_from[keep], side="right") - 1
        bounds = np.searchsorted(seg_text, np.arange(len(idx) + 1)).tolist()
        cl = cnt[keep].tolist()
        for k, i in enumerate(idx):
            c = cl[bounds[k] : bounds[k + 1]]
            out[i] = c if sum(c) == expected[i] else segment_word_counts(texts[i], expected[i])
    return out  # type: ignore[return-value]


class MinHasher:
    """MinHash signatures for many rows at once (vectorised with ``np.minimum.reduceat``)."""

    def __init__(self, k: int = 64, seed: int = 1234):
        rng = np.random.default_rng(seed)
        self.a = rng.integers(1, 2**63 - 1, size=k, dtype=np.uint64) | np.uint64(1)
        self.b = rng.integers(0, 2**63 - 1, size=k, dtype=np.uint64)
        self.k = k

    def signatures(self, shingles: list[np.ndarray]) -> np.ndarray:
        """(n_rows, k) uint64; rows with no shingles get all-max signatures (never candidates)."""
        n = len(shingles)
        sig = np.full((n, self.k), np.iinfo(np.uint64).max, dtype=np.uint64)
        nonempty = [i for i, s in enumerate(shingles) if len(s)]
        if not nonempty:
            return sig
        flat = np.concatenate([shingles[i] for i in nonempty])
        offsets = np.cumsum([0] + [len(shingles[i]) for i in nonempty[:-1]])
        v = np.empty_like(flat)
        rows = np.asarray(nonempty, dtype=np.int64)
        with np.errstate(over="ignore"):
            for j in range(self.k):
                np.multiply(flat, self.a[j], out=v)
                np.add(v, self.b[j], out=v)
                sig[rows, j] = np.minimum.reduceat(v, offsets)
        return sig


def band_keys(sig: np.ndarray, bands: int) -> np.ndarray:
    """(bands, n_rows) uint64: one hash per band of each signature (rows of a band combined polynomially)."""
    n, k = sig.shape
    r = k // bands
    out = np.zeros((bands, n), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for b in range(bands):
            acc = np.zeros(n, dtype=np.uint64)
            for j in range(b * r, (b + 1) * r):
                acc = acc * _P + sig[:, j]
            out[b] = acc
    return out


def lsh_candidates(
    sig: np.ndarray, bands: int, valid: Sequence[bool] | None = None, max_bucket: int = 50
) -> set[tuple[int, int]]:
    """Pairs (i < j) sharing at least one band of their signatures.

    A bucket larger than ``max_bucket`` contributes a chain (i_1, i_2), (i_2, i_3), ... instead
    of all pairs: its members are near-identical on that band, and clustering is transitive.
    """
    n = sig.shape[0]
    keys = band_keys(sig, bands)
    ok = np.ones(n, dtype=bool) if valid is None else np.asarray(valid, dtype=bool)
    rows = np.nonzero(ok)[0]
    pairs: set[tuple[int, int]] = set()
    for b in range(bands):
        kb = keys[b, rows]
        order = np.argsort(kb, kind="stable")
        ks = kb[order]
        if len(ks) < 2:
            continue
        same = ks[1:] == ks[:-1]
        if not same.any():
            continue
        starts = np.nonzero(np.concatenate(([True], ~same)))[0]
        ends = np.append(starts[1:], len(ks))
        for s0, e0 in zip(starts, ends):
            if e0 - s0 < 2:
                continue
            members = sorted(rows[order[s0:e0]].tolist())
            if len(members) <= max_bucket:
                for x in range(len(members)):
                    for y in range(x + 1, len(members)):
                        pairs.add((members[x], members[y]))
            else:
                pairs.update(zip(members, members[1:]))
    return pairs


def jaccard(a: set, b: set) -> float:
    """``|a & b| / |a | b|`` (1.0 for two empty sets)."""
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


# ---------------------------------------------------------------------- scripts & languages
_SCRIPT_RANGES = [
    ("Latin", 0x0041, 0x024F),
    ("Greek", 0x0370, 0x03FF),
    ("Cyrillic", 0x0400, 0x052F),
    ("Armenian", 0x0530, 0x058F),
    ("Hebrew", 0x0590, 0x05FF),
    ("Arabic", 0x0600, 0x06FF),
    ("Devanagari", 0x0900, 0x097F),
    ("Bengali", 0x0980, 0x09FF),
    ("Tamil", 0x0B80, 0x0BFF),
    ("Thai", 0x0E00, 0x0E7F),
    ("Georgian", 0x10A0, 0x10FF),
    ("Hangul", 0x1100, 0x11FF),
    ("Latin", 0x1E00, 0x1EFF),
    ("Kana", 0x3040, 0x30FF),
    ("Han", 0x3400, 0x4DBF),
    ("Han", 0x4E00, 0x9FFF),
    ("Hangul", 0xAC00, 0xD7AF),
]


def dominant_script(s: str) -> str | None:
    """The script with the most letters in ``s`` (Latin, Cyrillic, Han, Kana, Arabic, ...), or None."""
    if s.isascii():
        return "Latin" if any(c.isalpha() for c in s) else None
    counts: dict[str, int] = defaultdict(int)
    for c in s:
        if not c.isalpha():
            continue
        o = ord(c)
        for name, lo, hi in _SCRIPT_RANGES:
            if lo <= o <= hi:
                counts[name] += 1
                break
        else:
            counts["Other"] += 1
    if not counts:
        return None
    if counts.get("Kana"):  # Japanese mixes Han and Kana
        counts["Kana"] += counts.pop("Han", 0)
    return max(sorted(counts), key=lambda k: counts[k])


_STOPWORDS = {
    "en": "the and of to is in that it for was with as on are this be by not you have".split(),
    "fr": "le la les des est et une dans que pour pas qui sur avec sont du au il elle".split(),
    "de": "der die das und ist nicht ein eine zu den mit von sich auf für dem auch".split(),
    "es": "el los las que del por una con para como pero más sus este esta está son".split(),
    "it": "il che della di una per non sono gli nel alla anche come questo questa".split(),
    "pt": "os que não uma para com por como mais das dos pelo está são muito também".split(),
    "nl": "de het een en van dat niet is op te zijn voor met ook maar".split(),
}
_SW_LOOKUP: dict[str, list[str]] = defaultdict(list)
for _lang, _ws in _STOPWORDS.items():
    for _w in _ws:
        _SW_LOOKUP[_w].append(_lang)


#: Each stopword's votes, ``(language, 1 / number of its languages)``.
_SW_VOTES = {w: tuple((lang, 1.0 / len(langs)) for lang in langs) for w, langs in _SW_LOOKUP.items()}


def latin_language(ws: Iterable[str], min_hits: int = 4) -> str | None:
    """A stopword vote among en/fr/de/es/it/pt/nl; None when fewer than ``min_hits`` stopwords or a tie."""
    lookup = _SW_LOOKUP
    sw = list(filter(lookup.__contains__, ws))  # only stopwords vote
    hits = len(sw)
    if hits < min_hits:
        return None
    votes: dict[str, float] = defaultdict(float)
    for w in sw:  # in word order, as the float sums always were
        for lang, v in _SW_VOTES[w]:
            votes[lang] += v
    if not votes:
        return None
    ranked = sorted(votes.items(), key=lambda kv: (-kv[1], kv[0]))
    if len(ranked) > 1 and ranked[0][1] < 1.5 * ranked[1][1]:
        return None
    return ranked[0][0]


def is_stopword(vocab: Sequence[str]) -> np.ndarray:
    """(len(vocab),) bool: which words vote in :func:`latin_language`."""
    return np.fromiter(map(_SW_LOOKUP.__contains__, vocab), dtype=bool, count=len(vocab))


def language_of(s: str, ws: list[str] | None = None) -> str | None:
    """``en``/``fr``/... for Latin-script text (stopword vote), else the script name; None if unsure.

    ``ws``: the words of ``s`` (:func:`words`), or only its stopwords in order (only they vote).
    """
    script = dominant_script(s)
    if script != "Latin":
        return script
    return latin_language(ws if ws is not None else words(s))


# ---------------------------------------------------------------------- noise patterns
REFUSAL = re.compile(
    r"\b(as an ai( language model)?|as a language model|i(?:'m| am) (?:just )?an ai\b|i cannot (?:fulfill|comply)"
    r"|i'm sorry, but i (?:can't|cannot)|openai|chatgpt|my knowledge cutoff)",
    re.IGNORECASE,
)
#: Every REFUSAL alternative holds one of these (lower case): a necessary condition, checked with ``str.lower`` and
#: ``in`` on ASCII text (where ``lower`` is exactly the regex's case folding); see :func:`refusal_in`.
_REFUSAL_WORDS = ("an ai", "language model", "cannot", "sorry", "openai", "chatgpt", "cutoff")


def refusal_in(s: str) -> bool:
    """``REFUSAL.search(s)`` is not None; ASCII text without any of the pattern's key words skips the regex."""
    if s.isascii():
        low = s.lower()
        if not any(w in low for w in _REFUSAL_WORDS):
            return False
    return REFUSAL.search(s) is not None


HTML = re.compile(
    r"</?(?:div|span|p|br|a|img|table|tr|td|script|style|html|body)\b[^>]*>|&(?:nbsp|amp|lt|gt|quot|#\d+);",
    re.IGNORECASE,
)
MOJIBAKE = re.compile("\ufffd|Ã[\u0080-\u00bf]|â€[\u0080-\u00bf\u2018-\u201d\u2122\u0153\u0161]|Â\u00a0|Ã©|Ã¨")

# Chat-template markers by family (strings a template writes around turns).
TEMPLATE_MARKERS: dict[str, tuple[str, ...]] = {
    "chatml": ("<|im_start|>", "<|im_end|>"),
    "llama3": ("<|start_header_id|>", "<|eot_id|>", "<|end_header_id|>"),
    "llama2": ("[INST]", "[/INST]", "<<SYS>>"),
    "gemma": ("<start_of_turn>", "<end_of_turn>"),
    "phi3": ("<|user|>", "<|assistant|>", "<|end|>"),
    "alpaca": ("### Instruction:", "### Response:"),
    "vicuna": ("USER:", "ASSISTANT:"),
    "deepseek": ("<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"),
}

# Training-template names (axolotl chat_template, LLaMA-Factory template) -> family.
TEMPLATE_NAME_FAMILY = {
    "chatml": "chatml",
    "qwen": "chatml",
    "qwen2": "chatml",
    "qwen2_5": "chatml",
    "qwen3": "chatml",
    "qwen25": "chatml",
    "smollm": "chatml",
    "smollm2": "chatml",
    "llama3": "llama3",
    "llama3_2": "llama3",
    "llama3_1": "llama3",
    "llama-3": "llama3",
    "llama2": "llama2",
    "llama2_chat": "llama2",
    "mistral": "llama2",
    "mistral_v1": "llama2",
    "mistral_v2v3": "llama2",
    "mistral_v3_tekken": "llama2",
    "mistral_v7_tekken": "llama2",
    "mixtral": "llama2",
    "gemma": "gemma",
    "gemma2": "gemma",
    "gemma3": "gemma",
    "phi_3": "phi3",
    "phi3": "phi3",
    "phi_35": "phi3",
    "phi": "phi3",
    "alpaca": "alpaca",
    "vicuna": "vicuna",
    "deepseek3": "deepseek",
    "deepseek_v3": "deepseek",
    "deepseek": "deepseek",
}


def template_family(template: str | None) -> str | None:
    """The family a chat template string belongs to, by the markers it writes; None if unknown."""
    if not template:
        return None
    scores = {fam: sum(template.count(m) for m in marks) for fam, marks in TEMPLATE_MARKERS.items()}
    best = max(sorted(scores), key=lambda k: scores[k])
    return best if scores[best] > 0 else None


def markers_in(s: str) -> list[str]:
    """Template families whose markers appear in ``s``."""
    return [fam for fam, marks in TEMPLATE_MARKERS.items() if any(m in s for m in marks)]
