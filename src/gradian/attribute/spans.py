"""Sentence units: the same tokens as a training row, the loss mask restricted to one sentence.

A wrong sentence inside a long row is a few of its supervised tokens, so its
signal in the whole-row gradient is diluted by every other sentence. A
*sentence unit* keeps the row's tokens (and so its context) and supervises only
the tokens of one sentence of the completion; its loss is the mean token
cross-entropy over that sentence,

    ℓ̄_{j,s} = (1/|s|) Σ_{t ∈ s} ℓ_t,

the sentence scored as if it were its own training row. Span-aware ranking
scores every unit like a row and ranks row j by its most harmful sentence,
``min_s score(j, s)`` (:func:`row_min`).

Every row has at least one unit: a row whose completion has no sentence with a
supervised token (e.g. it was truncated away) is one unit with its whole mask.

A unit's tokens stop at its sentence's last token: under causal attention the
loss on tokens ≤ t does not depend on tokens after t, so the cut is exact and a
sentence early in a long row costs only its prefix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from gradian.data.formats import Example
from gradian.data.tokenize import IGNORE_INDEX, LazyItems, TokenIds, TokenizedExample, row_values

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


def sentence_units(examples: Sequence[Example], items: Sequence[TokenizedExample]) -> list[SentenceUnit]:
    """Every supervised sentence of every row, in row order (ids ``<row id>#<start>-<end>``).

    Reads each row once; a unit keeps a few numbers, its tokens are built by :func:`unit_item`
    (or :class:`SentenceItems`) when they are needed.
    """
    units: list[SentenceUnit] = []
    for j, (ex, it) in enumerate(zip(examples, items)):
        made = 0
        for a, b in split_sentences(ex.completion_text):
            mask = it.span_mask(a, b)
            if not any(mask):
                continue
            cut = max(k for k, m in enumerate(mask) if m) + 1  # exact: nothing after the sentence affects its loss
            units.append(SentenceUnit(j, a, b, cut, sum(mask)))
            made += 1
        if made == 0:
            units.append(SentenceUnit(j, None, None, len(it.input_ids), it.n_supervised))
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
