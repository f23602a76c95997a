"""Attribute: rank training rows by how much they degraded a regressed capability.

Flow per regressed capability:

1. queries from its failing items (contrastive by default; see
   :mod:`gradian.attribute.queries`), as gradients in the index's space;
2. each engine preconditions them (DataInf: damped inverse curvature;
   gradient-dot: identity), and one pass over the index scores every training
   row for every item and engine: ``score[q, j] = Σ_l ⟨r_l[q], g_l[j]⟩``;
3. the capability score of row j is the mean over its failing items (the
   influence on the mean query loss), under the sign convention of
   :mod:`gradian.sign` (negative = degraded); ``predicted_loss_delta_if_removed = score / n``;
4. the two engines' rank agreement (Spearman, top-k overlap) becomes the
   confidence — low agreement is reported, never averaged away;
5. the harmful tail is clustered, and the top harmful rows are drilled down to
   the sentence.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

from gradian.attribute.clusters import ClusterSpec, cluster_tail, lacks_eos, whitespace_token_ids
from gradian.attribute.drilldown import drill_down
from gradian.attribute.queries import Query, projector_for, query_gradients
from gradian.data.formats import Example
from gradian.data.tokenize import TokenizedExample, TokenizeSpec
from gradian.engines.base import EngineSpec, make_engine, score_index
from gradian.index.store import GradientIndex
from gradian.sign import SIGN_CONVENTION, influence_from_inner_product, most_harmful_first, predicted_loss_delta_if_removed


@dataclass(frozen=True)
class AttributeSpec:
    """Attribution knobs (all land in the run manifest).

    Attributes:
        engine: the primary engine.
        second_engine: a second engine run in the same pass for the agreement check (None: off).
        query: ``"contrastive"`` or ``"cross_entropy"``.
        top_k: rows listed per capability; also the k of the top-k overlap.
        drilldown_rows: how many of the most harmful rows get sentence scores.
        clusters: harmful-tail clustering knobs.
    """

    engine: EngineSpec = field(default_factory=EngineSpec)
    second_engine: str | None = "graddot"
    query: str = "contrastive"
    top_k: int = 20
    drilldown_rows: int = 10
    query_batch_size: int = 8
    clusters: ClusterSpec = field(default_factory=ClusterSpec)

    def __post_init__(self) -> None:
        from gradian.engines.base import ENGINES
        from gradian.validate import check_choice, check_int, check_type

        check_type(self.engine, EngineSpec, "AttributeSpec", "engine")
        if self.second_engine is not None:
            check_choice(self.second_engine, ENGINES, "AttributeSpec", "second_engine", flag="--second-engine",
                         fix=f"use one of {', '.join(ENGINES)} (or none)")
        check_choice(self.query, ("contrastive", "cross_entropy"), "AttributeSpec", "query", flag="--query")
        check_int(self.top_k, "AttributeSpec", "top_k", flag="--top-k", lo=1, hi=1_000_000,
                  fix="list at least one row, e.g. --top-k 20")
        check_int(self.drilldown_rows, "AttributeSpec", "drilldown_rows", lo=0, hi=10_000)
        check_int(self.query_batch_size, "AttributeSpec", "query_batch_size", lo=1, hi=65_536)
        check_type(self.clusters, ClusterSpec, "AttributeSpec", "clusters")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import spearmanr

    if len(a) < 3:
        return float("nan")
    return float(spearmanr(a, b).statistic)


def topk_overlap(a: np.ndarray, b: np.ndarray, k: int) -> float:
    """|top-k most harmful by a ∩ by b| / k."""
    k = max(1, min(k, len(a)))
    return len(set(most_harmful_first(a)[:k].tolist()) & set(most_harmful_first(b)[:k].tolist())) / k


def confidence_label(rho: float, overlap: float) -> str:
    """``high`` (ρ ≥ 0.8 and overlap ≥ 0.6), ``medium`` (ρ ≥ 0.5 and overlap ≥ 0.3), else ``low``."""
    if np.isnan(rho):
        return "unknown"
    if rho >= 0.8 and overlap >= 0.6:
        return "high"
    if rho >= 0.5 and overlap >= 0.3:
        return "medium"
    return "low"


@dataclass
class CapabilityAttribution:
    capability: str
    n_train: int
    queries: list[dict[str, Any]]
    engine: str
    scores: list[float]
    ranked: list[dict[str, Any]]
    agreement: dict[str, Any] | None
    clusters: list[dict[str, Any]]
    drilldown: list[dict[str, Any]]
    per_item_top: dict[str, list[dict[str, Any]]]
    second_scores: list[float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def attribute_capability(
    model,
    tokenizer,
    index: GradientIndex,
    examples: Sequence[Example],
    items: Sequence[TokenizedExample],
    queries: Sequence[Query],
    tokenize_spec: TokenizeSpec,
    spec: AttributeSpec = AttributeSpec(),
    engines: dict[str, Any] | None = None,
) -> CapabilityAttribution:
    """Score, rank, cluster and drill down one capability's failing items.

    Args:
        engines: optional ``{name: fitted Engine}`` cache, reused across capabilities.
    Returns:
        a :class:`CapabilityAttribution`; ``scores`` are aligned with ``examples``.
    """
    assert queries, "a capability needs at least one failing item"
    engines = engines if engines is not None else {}
    names = [spec.engine.name] + ([spec.second_engine] if spec.second_engine and spec.second_engine != spec.engine.name else [])
    for nm in names:
        if nm not in engines:
            eng = make_engine(EngineSpec(nm, spec.engine.damping_scale))
            eng.fit(index)
            engines[nm] = eng
    Q = query_gradients(model, tokenizer, queries, index, tokenize_spec, spec.query_batch_size)
    R = [engines[nm].precondition(index, Q) for nm in names]
    raw = score_index(index, R)  # per engine (m, n)
    per_item = [influence_from_inner_product(r.numpy()) for r in raw]
    cap_scores = [p.mean(axis=0) for p in per_item]
    main = cap_scores[0]
    n = len(main)
    delta = predicted_loss_delta_if_removed(main, n)
    order = most_harmful_first(main)
    ranked = []
    for rank, j in enumerate(order[: spec.top_k], start=1):
        ex, it = examples[j], items[j]
        row = {
            "rank": rank,
            "id": ex.id,
            "score": float(main[j]),
            "predicted_loss_delta_if_removed": float(delta[j]),
            "format": ex.format,
            "tokens": it.full_length,
            "truncated": it.truncated,
            "prompt": ex.prompt_text[:300],
            "completion": ex.completion_text[:600],
        }
        if len(cap_scores) > 1:
            row[f"score_{names[1]}"] = float(cap_scores[1][j])
        ranked.append(row)
    agreement = None
    if len(cap_scores) > 1:
        rho = spearman(cap_scores[0], cap_scores[1])
        k = spec.top_k
        ov = topk_overlap(cap_scores[0], cap_scores[1], k)
        agreement = {
            "engines": names,
            "spearman": rho,
            "topk_overlap": ov,
            "k": min(k, n),
            "confidence": confidence_label(rho, ov),
        }
    # EOS or any other special token (an end-of-turn such as <|im_end|> or <|eot_id|>) ends a row
    # (a pad token equal to EOS, as in SmolLM2, still ends a row)
    not_ends = {tokenizer.bos_token_id, tokenizer.unk_token_id}
    if tokenizer.pad_token_id != tokenizer.eos_token_id:
        not_ends.add(tokenizer.pad_token_id)
    eos_ids = ({tokenizer.eos_token_id} | set(tokenizer.all_special_ids or [])) - not_ends
    ws = whitespace_token_ids(tokenizer, items)
    no_eos = [lacks_eos(it, eos_ids, ws) for it in items]
    clusters = [c.to_dict() for c in cluster_tail(index, main, examples, items, no_eos, spec.clusters)]
    # per-item top harmful rows (the single-item view the drill-down uses)
    per_item_top = {}
    for qi, q in enumerate(queries):
        o = most_harmful_first(per_item[0][qi])[:5]
        per_item_top[q.item_id] = [{"id": examples[j].id, "score": float(per_item[0][qi][j])} for j in o]
    # drill-down on the most harmful rows that have several sentences
    proj = projector_for(index)
    block_names = [b["name"] for b in index.blocks]
    modules = index.modules
    drill = []
    for j in order[: spec.drilldown_rows]:
        if main[j] >= 0:
            break
        qi = int(np.argmin(per_item[0][:, j]))
        r_q = {k: v[qi] for k, v in R[0].items()}
        sents = drill_down(model, tokenizer, examples[j], items[j], r_q, proj, block_names, modules)
        if sents:
            drill.append(
                {
                    "id": examples[j].id,
                    "item_id": queries[qi].item_id,
                    "row_score_for_item": float(per_item[0][qi][j]),
                    "sentences": [s.to_dict() for s in sents],
                    "top_sentence": sents[0].to_dict(),
                }
            )
    return CapabilityAttribution(
        capability=queries[0].capability,
        n_train=n,
        queries=[q.to_dict() for q in queries],
        engine=names[0],
        scores=[float(x) for x in main],
        ranked=ranked,
        agreement=agreement,
        clusters=clusters,
        drilldown=drill,
        per_item_top=per_item_top,
        second_scores=[float(x) for x in cap_scores[1]] if len(cap_scores) > 1 else None,
    )


SIGN = SIGN_CONVENTION
