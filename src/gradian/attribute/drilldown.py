"""Span-level drill-down: which sentence inside a harmful row did the harm.

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
from typing import Any

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
