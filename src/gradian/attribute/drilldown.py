"""Span-level drill-down: which sentence inside a harmful row did the harm.

Two ways to it. The default verdict reads the sentence-unit scores it already has: :func:`blamed_units` picks
per row the (item, sentence) pair with the most negative item-scaled raw influence (:func:`item_scaled`), and
:func:`sentence_view` is what the report shows of it. :func:`drill_down` re-scores a row's sentences exactly,
with one backward pass per sentence mask, for a row outside a sentence index:

The tokens stay fixed; only the loss mask changes. For a row j with
supervised tokens S_j and a sentence s (a character span of the completion,
mapped to tokens with :meth:`TokenizedExample.span_mask`), the sentence's share
of the row's loss is

    ℓ_{j,s} = (1/|S_j|) Σ_{t ∈ s} ℓ_t,        so  Σ_s ℓ_{j,s} + ℓ_{j,rest} = ℓ_j

Sentences are ranked by ``⟨r, ∇ℓ̄_{j,s}⟩``, where ``ℓ̄_{j,s}`` is the *mean*
loss over the sentence's own tokens (the sentence scored as if it were its own
training row), with the preconditioned query ``r`` of the *single* failing item
this row hurts most (an averaged query dilutes the sentence signal). The
additive share ``⟨r, ∇ℓ_{j,s}⟩ = |s|/|S_j| · ⟨r, ∇ℓ̄_{j,s}⟩`` is reported
beside it; shares of all sentences plus the remaining tokens (e.g. EOS) add up
to the row's score.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from gradian.data.formats import Example
from gradian.data.spans import split_sentences
from gradian.data.tokenize import TokenizedExample, collate
from gradian.gradients.per_example import per_example_grads
from gradian.gradients.projection import KroneckerProjector
from gradian.sign import sort_most_harmful_first


@dataclass
class SentenceScore:
    """One sentence of a row's completion: its character span, text, score and share of the row's score."""

    char_start: int
    char_end: int
    text: str
    score: float
    share: float
    n_tokens: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def drill_down(
    model,
    tokenizer,
    example: Example,
    item: TokenizedExample,
    r_query: dict[str, torch.Tensor],
    projector: KroneckerProjector,
    block_names: list[str],
    modules: list[str] | None = None,
    batch_size: int = 8,
) -> list[SentenceScore]:
    """Score every sentence of ``example``'s completion against one preconditioned query.

    Args:
        r_query: ``{block: (d_l,)}`` preconditioned query of one failing item.

    Returns:
        sentence scores, most harmful (most negative) first.
    """
    text = example.completion_text
    spans = split_sentences(text)
    masks, kept = [], []
    for a, b in spans:
        m = item.span_mask(a, b)
        if any(m):
            masks.append(m)
            kept.append((a, b, sum(m)))
    if len(kept) < 2:
        return []
    n_sup = max(1, item.n_supervised)
    out: list[SentenceScore] = []
    for s in range(0, len(kept), batch_size):
        chunk_masks = masks[s : s + batch_size]
        chunk = kept[s : s + batch_size]
        batch = collate([item] * len(chunk_masks), tokenizer.pad_token_id, label_masks=chunk_masks)
        grads = per_example_grads(model, batch, "hooks", modules)
        score = torch.zeros(len(chunk), dtype=torch.float64)
        for bi, name in enumerate(block_names):
            g = projector(bi, grads[name].detach().double()).cpu()  # the model may be on a GPU
            score += g @ r_query[name].double()
        for (a, b, ntok), sc in zip(chunk, score.tolist()):
            # sc is per sentence-token mean loss; its additive share of the row score is sc·|s|/|S_j|
            out.append(SentenceScore(a, b, text[a:b], sc, sc * ntok / n_sup, ntok))
    return sort_most_harmful_first(out, lambda x: x.score)


def item_scaled(U: np.ndarray) -> np.ndarray:
    """Each failing item's unit scores in units of that item's typical spread: ``Z[q, k] = U[q, k] / s_q``.

    ``s_q = median_k |U[q, k] − median_k U[q, k]|`` is the median absolute deviation of item q's scores over all
    units k (the bulk's spread, which a few culprit outliers do not inflate as they inflate a standard
    deviation); an item whose scores are all equal keeps ``s_q = 1``. The sign is kept (no centring), so a
    negative ``Z`` is still harmful. Raw influence is on a different scale for every item (its query
    gradient's norm), so ``min_q U[q, k]`` asks which item has the largest gradient rather than which item the
    unit hurts most for its kind; ``min_q Z[q, k]`` compares the items on one scale.

    Args:
        U: (m, K) raw influence of K units on m failing items.

    Returns:
        (m, K) float64.
    """
    U = np.asarray(U, dtype=np.float64)
    med = np.median(U, axis=1, keepdims=True)
    s = np.median(np.abs(U - med), axis=1, keepdims=True)
    return U / np.where(s > 0, s, 1.0)


def blamed_units(U_raw: np.ndarray, unit_rows: Sequence[int], has_span: Sequence[bool]) -> dict[int, tuple[int, int]]:
    """The drill-down's rule: per row j, the failing item it hurts most and its most harmful sentence.

    With ``Z = item_scaled(U_raw)`` (:func:`item_scaled`):

        k_j = argmin_{k ∈ j} min_q Z[q, k]        q_j = argmin_q Z[q, k_j]

    i.e. the (item, sentence) pair of the row with the most negative item-scaled raw influence.

    Measured on buried culprits whose target item was lost (``benchmarks/bench_drilldown_rule.py`` on runs made
    with ``--save-evidence``; docs/benchmarks.md, "Which sentence the drill-down blames"): the full SmolLM2
    worked example 29 → 41 of 45 against the unscaled ``min_q U_raw`` it replaces, the quick SmolLM2 world
    14 → 15 of 15, the tiny world and the held-out SmolLM2 heldout-a unchanged (1 of 3, 1 of 2).

    Args:
        U_raw: (m, K) raw (trajectory-weighted) influence of K sentence units on m failing items.
        unit_rows: (K,) the row of each unit.
        has_span: (K,) whether a unit is a sentence (the residual unit of a row has no span and is never blamed).

    Returns:
        ``{row: (unit index k_j, item index q_j)}`` for every row with at least one sentence unit.
    """
    Z = item_scaled(U_raw)
    best = Z.min(axis=0)  # (K,) the unit's most harmful item-scaled score
    arg_q = Z.argmin(axis=0)
    out: dict[int, tuple[int, int]] = {}
    for k, (r, ok) in enumerate(zip(unit_rows, has_span)):
        if not ok:
            continue
        r = int(r)
        if r not in out or best[k] < best[out[r][0]]:
            out[r] = (k, int(arg_q[k]))
    return out


#: Characters of context shown on each side of a row's blamed sentence.
SENTENCE_CONTEXT = 80


def sentence_view(text: str, a: int, b: int, score: float, n_sentences: int) -> dict[str, Any]:
    """The blamed sentence of a listed row: its span, text, verdict score and some context on each side.

    ``context_before`` / ``context_after``: up to :data:`SENTENCE_CONTEXT` characters of the completion
    before ``a`` and after ``b`` (so a long row is shown around its harmful sentence, never cut before it).
    """
    return {
        "char_start": a,
        "char_end": b,
        "text": text[a:b][:300],
        "verdict_score": float(score),
        "n_sentences": int(n_sentences),
        "context_before": text[max(0, a - SENTENCE_CONTEXT) : a],
        "context_after": text[b : b + SENTENCE_CONTEXT],
    }
