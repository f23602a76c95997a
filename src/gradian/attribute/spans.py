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
from gradian.data.tokenize import IGNORE_INDEX, TokenIds, TokenizedExample

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
    """One (row, sentence) pair.

    Attributes:
        row: index of the row in the training set.
        char_start, char_end: the sentence's half-open span in ``Example.completion_text``
            (None for a whole-row unit).
        item: the row's tokens with the labels outside the sentence set to -100.
    """

    row: int
    char_start: int | None
    char_end: int | None
    item: TokenizedExample


def sentence_units(examples: Sequence[Example], items: Sequence[TokenizedExample]) -> list[SentenceUnit]:
    """Every supervised sentence of every row, in row order (ids ``<row id>#<start>-<end>``)."""
    units: list[SentenceUnit] = []
    for j, (ex, it) in enumerate(zip(examples, items)):
        made = 0
        for a, b in split_sentences(ex.completion_text):
            mask = it.span_mask(a, b)
            if not any(mask):
                continue
            cut = max(k for k, m in enumerate(mask) if m) + 1  # exact: nothing after the sentence affects its loss
            labels = TokenIds(x if m else IGNORE_INDEX for x, m in zip(it.labels[:cut], mask[:cut]))
            unit = replace(
                it, id=f"{it.id}#{a}-{b}", input_ids=it.input_ids[:cut], labels=labels, offsets=it.offsets[:cut]
            )
            units.append(SentenceUnit(j, a, b, unit))
            made += 1
        if made == 0:
            units.append(SentenceUnit(j, None, None, replace(it, id=f"{it.id}#all")))
    return units


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
