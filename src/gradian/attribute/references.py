"""The reference engines' opinions for every capability: BM25 (lexical) and RepSim (representation).

They run beside the gradient engines in every attribution, on the same rows and
the same failing items, at the final adapter (:mod:`gradian.engines.lexical`,
:mod:`gradian.engines.repsim`). Each returns an (m, n) matrix in Gradian's sign
convention (negative = evidence that the row taught what the model said).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from gradian.attribute.queries import Query, _example
from gradian.data.formats import Example
from gradian.data.tokenize import TokenizedExample, TokenizeSpec, tokenize_example

Progress = Callable[[str, int, int], None]


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, list):
        return "\n".join(str(m.get("content", "")) for m in prompt if isinstance(m, dict))
    return str(prompt)


def reference_scores(
    names: Sequence[str],
    ft,
    examples: Sequence[Example],
    items: Sequence[TokenizedExample],
    queries: dict[str, Sequence[Query]],
    tokenize: TokenizeSpec,
    spec,
    identity: dict[str, Any],
    *,
    batch_size: int = 8,
    progress: Progress | None = None,
    known_states: dict[int, Any] | None = None,
) -> dict[str, dict[str, np.ndarray]]:
    """``{capability: {engine: (m, n)}}`` for the reference engines in ``names``.

    Collective under torchrun: the ranks share RepSim's pass over the training rows; rank 0
    computes the rest and returns the scores, the other ranks return ``{}``.

    Args:
        ft: the loaded fine-tune, with the final adapter's weights (RepSim's representations).
        spec: the :class:`gradian.attribute.pipeline.AttributeSpec` (its ``bm25``/``repsim`` settings).
        identity: the content identity of (adapter, dataset, tokenisation) that keys RepSim's cache.
        batch_size: queries per forward of RepSim's query states (the training rows go one a forward).
        known_states: RepSim's training-row states the final checkpoint's index build pooled on its way (row ->
            (d,) float64; :func:`gradian.engines.repsim.cached_train_states`): those rows need no forward here.
    """
    from gradian import distributed

    out: dict[str, dict[str, np.ndarray]] = {c: {} for c in queries}
    if not names:
        return out
    H = None
    if "repsim" in names:  # the one pass over the training rows: shared by the ranks
        from gradian.engines.repsim import cached_train_states

        todo = len(items) - len(known_states or {})  # the rows the index build did not give their states
        pf = (lambda k: progress("representations", k, todo)) if progress and todo else None
        H = cached_train_states(ft.model, items, ft.tokenizer.pad_token_id, identity, pf, known_states)
    if not distributed.current().is_main:
        return {}
    said = {c: [f"{_prompt_text(q.prompt)}\n{q.said or ''}" for q in qs] for c, qs in queries.items()}
    corr = {c: [f"{_prompt_text(q.prompt)}\n{q.correct}" for q in qs] for c, qs in queries.items()}
    if "bm25" in names:
        from gradian.engines.lexical import bm25_scores

        docs = [f"{e.prompt_text}\n{e.completion_text}" for e in examples]
        for c in queries:
            out[c]["bm25"] = bm25_scores(docs, said[c], corr[c], spec.bm25)
    if "repsim" in names:
        from gradian.engines.repsim import pooled_states, repsim_scores

        pad = ft.tokenizer.pad_token_id
        assert H is not None
        for c, qs in queries.items():
            # a cross-entropy query has no answer of the model's: its representation is the correct one's
            s_items = [
                tokenize_example(_example(q.prompt, q.said if q.said else q.correct, q.item_id), ft.tokenizer, tokenize)
                for q in qs
            ]
            c_items = [tokenize_example(_example(q.prompt, q.correct, q.item_id), ft.tokenizer, tokenize) for q in qs]
            Hs = pooled_states(ft.model, s_items, pad, batch_size)
            Hc = pooled_states(ft.model, c_items, pad, batch_size)
            out[c]["repsim"] = repsim_scores(H, Hs, Hc, spec.repsim)
    return out
