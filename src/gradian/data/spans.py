"""Sentence units: the same tokens as a training row, the loss mask restricted to one sentence.

A wrong sentence inside a long row is a few of its supervised tokens, so its
signal in the whole-row gradient is diluted by every other sentence. A
*sentence unit* keeps the row's tokens (and so its context) and supervises only
the tokens of one sentence of the completion; its loss is the mean token
cross-entropy over that sentence,

    ℓ̄_{j,s} = (1/|s|) Σ_{t ∈ s} ℓ_t,

the sentence scored as if it were its own training row. Span-aware ranking
scores every unit like a row and ranks row j, for each failing item q, by its
most harmful sentence ``min_s score_q(j, s)`` (:func:`row_min`), then averages
over the items.

Every row has at least one unit. **A row with one unit is the row itself**: a
row whose completion has one sentence with a supervised token (a one-sentence
answer), none (e.g. it was truncated away), or a budget of one unit is one
*whole-row* unit with the row's whole mask (id ``<row id>#all``), end-of-turn
token included. Its gradient is then the row's, which the one-pass build
(:mod:`gradian.gradients.units`) makes with one backward vector instead of
two (the sentence, then the residual of the tokens outside it); a sentence
index of one-sentence answers holds the row index's gradients. Only rows of
two or more sentences are split, and only they have a sentence to drill into.
(Before unit rule 2, :data:`UNIT_RULE`, a one-sentence row's unit was its
sentence alone, without the end-of-turn token.)

A unit's tokens stop at its sentence's last token: under causal attention the
loss on tokens ≤ t does not depend on tokens after t, so the cut is exact and a
sentence early in a long row costs only its prefix.

**The budget per row.** A row has at most ``max_units`` units
(``GradSpec.max_units_per_row``, ``--max-units-per-row``, default
:data:`MAX_UNITS_PER_ROW`), so one row of 10,000 sentences cannot make the index
10,000 times a row's size. A row with K > B = ``max_units`` supervised
sentences s_1..s_K (in text order) gets B units; unit g (0 ≤ g < B) merges the
consecutive sentences

    s_i  for  ⌊g·K/B⌋ ≤ i − 1 < ⌊(g+1)·K/B⌋,

i.e. groups of ⌊K/B⌋ or ⌈K/B⌉ sentences, the longer groups spread evenly. Its
character span runs from its first sentence's start to the next unit's first
sentence's start (the last unit: to its last sentence's end), so the spans are
contiguous, disjoint and in order, and it supervises every supervised token
overlapping that span, as a sentence does: the units of the row partition the
supervised tokens of its completion from its first sentence's start to its last
sentence's end (the whitespace between sentences joins the unit before it).
The rule reads only K and B, so it is deterministic; a row with K ≤ B keeps
one unit per sentence, exactly as without a budget.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from gradian.data.formats import Example
from gradian.data.tokenize import IGNORE_INDEX, LazyItems, TokenIds, TokenizedExample, row_values

#: The rule that makes a row's units, in the identity of every sentence index (:meth:`GradSpec.identity`):
#: 2 since 2026-12-04, a row with one unit is the whole row (module docstring); 1 before, its sentence alone.
UNIT_RULE = 2

#: the default budget of sentence units per row (``GradSpec.max_units_per_row``); the module docstring's rule
MAX_UNITS_PER_ROW = 32

# A sentence ends at . ! or ? followed by whitespace or the end of the text, or at a newline;
# "the domain is .uz." stays one sentence.
_SENT = re.compile(r"[^\n]+?(?:[.!?]+(?=\s|$)|(?=\n)|$)")


def split_sentences(text: str) -> list[tuple[int, int]]:
    """Half-open character spans of the sentences of ``text`` (leading whitespace excluded)."""
    spans = []
    for m in _SENT.finditer(text):
        a, b = m.start(), m.end()
        while a < b and text[a].isspace():
            a += 1
        while b > a and text[b - 1].isspace():
            b -= 1
        if b > a:
            spans.append((a, b))
    return spans


@dataclass(frozen=True)
class SentenceUnit:
    """One (row, sentence) pair: where it is, not its tokens (:func:`unit_item` builds those).

    Attributes:
        row: index of the row in the training set.
        char_start, char_end: the sentence's half-open span in ``Example.completion_text``
            (None for a whole-row unit).
        length: the unit's token count (the row's tokens up to the sentence's last one).
        n_supervised: the sentence's supervised tokens.
    """

    row: int
    char_start: int | None
    char_end: int | None
    length: int
    n_supervised: int

    def suffix(self) -> str:
        """What the unit's id adds to its row's: ``#<start>-<end>``, or ``#all`` for a whole-row unit."""
        return "#all" if self.char_start is None else f"#{self.char_start}-{self.char_end}"


def unit_item(it: TokenizedExample, u: SentenceUnit) -> TokenizedExample:
    """The unit's tokens: row ``it``'s up to the sentence's last token, labels outside the sentence -100.

    Args:
        it: the tokenised row ``u.row``.
        u: one of its units.
    """
    if u.char_start is None:
        return replace(it, id=it.id + u.suffix())
    cut = u.length
    mask = it.span_mask(u.char_start, u.char_end)  # type: ignore[arg-type]
    labels = TokenIds(x if m else IGNORE_INDEX for x, m in zip(it.labels[:cut], mask[:cut]))
    return replace(it, id=it.id + u.suffix(), input_ids=it.input_ids[:cut], labels=labels, offsets=it.offsets[:cut])


def _token_spans(it: TokenizedExample) -> tuple[list[int], list[int], list[int]]:
    """The supervised, non-empty tokens of ``it``: (token index, char start, char end), in token order."""
    ks, ss, es = [], [], []
    for k, ((s, e), lab) in enumerate(zip(it.offsets, it.labels)):
        if lab != IGNORE_INDEX and e > s:
            ks.append(k)
            ss.append(s)
            es.append(e)
    return ks, ss, es


def _overlaps(spans: Sequence[tuple[int, int]], ks: list[int], ss: list[int], es: list[int]) -> list[tuple[int, int]]:
    """Per span (sorted, disjoint, absolute chars): ``(count, last token index + 1)`` of the tokens overlapping it.

    The same test as :meth:`TokenizedExample.span_mask` (``s < b and e > a``), one pass over the tokens with a
    binary search per token: O(T log K) for T tokens and K spans, where a span_mask per span is O(T K).
    """
    ends = [b for _, b in spans]
    out = [(0, 0)] * len(spans)
    for k, s, e in zip(ks, ss, es):
        i = bisect_right(ends, s)  # the first span ending after the token starts
        while i < len(spans) and spans[i][0] < e:
            n, _ = out[i]
            out[i] = (n + 1, k + 1)
            i += 1
    return out


def budget_groups(k: int, budget: int) -> list[tuple[int, int]]:
    """Half-open ranges of the ``k`` sentences merged into each unit: ``[⌊g·k/B⌋, ⌊(g+1)·k/B⌋)``, g < B.

    With ``k <= budget`` every sentence is its own unit.
    """
    if k <= budget:
        return [(i, i + 1) for i in range(k)]
    return [(g * k // budget, (g + 1) * k // budget) for g in range(budget)]


def sentence_units(
    examples: Sequence[Example], items: Sequence[TokenizedExample], max_units: int = MAX_UNITS_PER_ROW
) -> list[SentenceUnit]:
    """Every supervised sentence of every row, in row order (ids ``<row id>#<start>-<end>``).

    Reads each row once; a unit keeps a few numbers, its tokens are built by :func:`unit_item`
    (or :class:`SentenceItems`) when they are needed. A row with more than ``max_units``
    supervised sentences has ``max_units`` units of consecutive sentences (the module docstring's
    rule, :func:`budget_groups`); planning is O(T log K) per row of T tokens and K sentences.

    Args:
        max_units: the budget of units per row (``GradSpec.max_units_per_row``), at least 1.
    """
    from gradian.validate import check_int

    check_int(max_units, "GradSpec", "max_units_per_row", flag="--max-units-per-row", lo=1, hi=1_000_000)
    units: list[SentenceUnit] = []
    for j, (ex, it) in enumerate(zip(examples, items)):
        base = it.completion_char_start
        sents = split_sentences(ex.completion_text)
        toks = _token_spans(it)
        got = _overlaps([(base + a, base + b) for a, b in sents], *toks)
        kept = [(a, b) for (a, b), (n, _) in zip(sents, got) if n]  # sentences with a supervised token
        if len(kept) <= 1 or max_units == 1:  # one unit: the row itself (its gradient is the row's, made once)
            units.append(SentenceUnit(j, None, None, len(it.input_ids), it.n_supervised))
            continue
        if len(kept) <= max_units:  # one unit per sentence
            spans, got = kept, [g for g in got if g[0]]
        else:  # merged: a unit runs up to the next unit's first sentence (the whitespace between them joins it)
            groups = budget_groups(len(kept), max_units)
            spans = [(kept[lo][0], kept[hi][0] if hi < len(kept) else kept[hi - 1][1]) for lo, hi in groups]
            got = _overlaps([(base + a, base + b) for a, b in spans], *toks)
        for (a, b), (n, cut) in zip(spans, got):
            # cut is exact: nothing after the unit's last token affects its loss
            units.append(SentenceUnit(j, a, b, cut, n))
    return units


class SentenceItems(LazyItems):
    """The sentence units' tokenised items, built from their row when one is read (:class:`LazyItems`).

    What the sentence index is built from: the units of a shard are read once each, and consecutive
    units of one row share one read of the row (a :class:`gradian.data.tokenize.TokenizedRows`
    tokenises it again), so one shard's tokens are in memory at a time.

    Args:
        units: :func:`sentence_units` of ``items``.
        items: the tokenised rows.
    """

    def __init__(self, units: Sequence[SentenceUnit], items: Sequence[TokenizedExample]) -> None:
        super().__init__()
        self._units, self._items = units, items
        ids = row_values(items, "id")
        full, trunc = row_values(items, "full_length"), row_values(items, "truncated")
        for u in units:
            self._record(f"{ids[u.row]}{u.suffix()}", u.length, u.n_supervised, full[u.row], trunc[u.row])
        self._row: tuple[int, TokenizedExample] | None = None

    def _load(self, k: int) -> TokenizedExample:
        u = self._units[k]
        if self._row is None or self._row[0] != u.row:
            self._row = (u.row, self._items[u.row])
        return unit_item(self._row[1], u)


def row_min(unit_scores: np.ndarray, units: Sequence[SentenceUnit], n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row, its most harmful (minimum) unit score, and which unit it was.

    Args:
        unit_scores: (..., n_units).

    Returns:
        ``(scores (..., n_rows), argmin unit index (..., n_rows))``.
    """
    rows = np.array([u.row for u in units])
    out = np.full(unit_scores.shape[:-1] + (n_rows,), np.inf)
    arg = np.full(unit_scores.shape[:-1] + (n_rows,), -1, dtype=int)
    for k in range(len(units)):
        s = unit_scores[..., k]
        better = s < out[..., rows[k]]
        out[..., rows[k]] = np.where(better, s, out[..., rows[k]])
        arg[..., rows[k]] = np.where(better, k, arg[..., rows[k]])
    return out, arg
