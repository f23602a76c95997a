"""Attribute: rank training rows by how much they degraded a regressed capability.

Flow per regressed capability (the evidence comes from
:mod:`gradian.attribute.evidence` over the training trajectory, or from one
index with :func:`attribute_capability`):

1. queries from its failing items (contrastive by default; see
   :mod:`gradian.attribute.queries`), as gradients in each index's space;
2. each gradient engine preconditions them (DataInf: damped inverse curvature;
   gradient-dot: identity) and scores every training row (and sentence unit)
   for every item, at every checkpoint, weighted by the learning rate;
3. the **influence** of row j is the primary engine's mean over the failing items
   of the raw weighted inner products, under :mod:`gradian.sign` (negative =
   degraded; ``predicted_loss_delta_if_removed = influence / n``);
4. the **rank score** orders the verdict (:func:`gradian.attribute.ranking.rank_statistic`): the same
   engine's direction-only (cosine) scores by default, taken per sentence unit,
   reduced per failing item to the row's most harmful sentence and averaged over
   the items (span-aware ranking); same
   sign convention, but not in loss units. Reference engines (BM25, RepSim) can
   be folded in (``fuse``, :func:`gradian.attribute.ranking.fuse_scores`);
5. the two gradient engines' rank agreement (Spearman, top-k overlap) is the
   confidence — low agreement is reported, never averaged away; the reference
   engines' agreement with the verdict is reported beside it, and every listed
   row says which evidence supports it (gradient, lexical, representation);
6. the harmful tail is clustered, and the top rows are drilled down to the sentence
   (:func:`gradian.attribute.drilldown.blamed_units`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from gradian.attribute.clusters import cluster_tail, lacks_eos, whitespace_token_ids
from gradian.attribute.drilldown import SentenceScore, blamed_units, sentence_view
from gradian.attribute.evidence import MATRIX_KINDS, CapabilityEvidence, EngineScores
from gradian.attribute.queries import Query
from gradian.attribute.ranking import confidence_label, fuse_scores, rank_statistic, spearman, topk_overlap
from gradian.attribute.spec import AttributeSpec
from gradian.data.formats import Example
from gradian.data.tokenize import TokenizedExample, TokenizeSpec
from gradian.errors import GradianUserError
from gradian.index.store import GradientIndex
from gradian.sign import (
    SIGN_CONVENTION,
    VERDICT_SCORE_DOC,
    harm_ranks,
    harmful_rows,
    most_harmful_first,
    predicted_loss_delta_if_removed,
    sort_most_harmful_first,
    verdict_scores,
)

EVIDENCE_KIND = {"bm25": "lexical", "repsim": "representation"}


def reference_items(queries: Sequence[Query]) -> np.ndarray:
    """(m,) bool: the queries a reference engine's capability score averages over.

    BM25 and RepSim look for the rows that resemble what the model *said*. A cross-entropy query beside
    contrastive ones (a weakened item, ``--weakened``) has no wrong answer, so its reference scores only find
    the rows that state the correct answer: those items are left out of the mean. A capability whose
    queries are all cross-entropy (the loglik metric) keeps them all.
    """
    said = np.array([q.said is not None for q in queries], dtype=bool)
    return said if said.any() else np.ones(len(queries), dtype=bool)


@dataclass
class CapabilityAttribution:
    """One capability's verdict (``run.json`` ``attribution.capabilities[*]``).

    Attributes:
        scores: (n,) the primary engine's influence (sign convention; Δloss = score / n).
        rank_scores: (n,) the verdict's rank score (what orders ``ranked``, the clusters and the scorecard).
        row_sentences: per row, the ``[char_start, char_end]`` of the sentence the drill-down blames in
            its completion (:func:`blamed_units`; span-aware ranking), or None (whole-row ranking,
            or a row without sentences).
        second_scores: (n,) the second engine's rank score, or None.
        verdict_scores: (n,) the rank scores on the verdict's one readable scale
            (:func:`gradian.sign.verdict_scores`: a signed share of the harmful total, in percent).
        evidence: per source (``gradient`` = the primary engine, ``lexical``, ``representation``) its
            (n,) capability score and its agreement with the verdict.
        drill_queries: the drill-only items' queries (:attr:`AttributeSpec.drill_weakened_nats`); a drill-down
            entry's ``item_id`` may name one of them.
    """

    capability: str
    n_train: int
    queries: list[dict[str, Any]]
    engine: str
    scores: list[float]
    rank_scores: list[float]
    ranking: dict[str, Any]
    ranked: list[dict[str, Any]]
    agreement: dict[str, Any] | None
    evidence: dict[str, Any]
    clusters: list[dict[str, Any]]
    drilldown: list[dict[str, Any]]
    per_item_top: dict[str, list[dict[str, Any]]]
    second_scores: list[float] | None = None
    row_sentences: list[list[int] | None] | None = None
    verdict_scores: list[float] | None = None
    drill_queries: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


Drill = Callable[[int, int], list[SentenceScore]]  # (row, failing item) -> sentences, most harmful first


def _unit_drill(
    ev: CapabilityEvidence, spec: AttributeSpec, examples: Sequence[Example], items: Sequence[TokenizedExample]
) -> Drill:
    """Drill-down read off the sentence-unit scores: every sentence of row j for item q, no extra pass.

    Sentences *within* a row are ordered by their raw (trajectory-weighted) score for item q, not
    the cosine: they share the row's context, and the raw score compares what each actually does,
    while the cosine, right for comparing rows, inflates short sentences with small gradients.
    Measured on the worked example: 31 of 45 buried culprits localised with raw scores, 26 with
    cosine (docs/benchmarks.md).
    """
    es = ev.engines[spec.engine.name]
    U = es.unit_raw
    by_row: dict[int, list[int]] = {}
    for k, u in enumerate(ev.units or []):
        by_row.setdefault(u.row, []).append(k)

    def drill(j: int, q: int) -> list[SentenceScore]:
        ks = [k for k in by_row.get(j, []) if ev.units[k].char_start is not None]  # type: ignore[index]
        if len(ks) < 2:
            return []
        text = examples[j].completion_text
        n_sup = max(1, items[j].n_supervised)
        out = []
        for k in ks:
            u = ev.units[k]  # type: ignore[index]
            ntok = u.n_supervised
            out.append(
                SentenceScore(
                    u.char_start,
                    u.char_end,
                    text[u.char_start : u.char_end],
                    float(U[q, k]),  # type: ignore[index,misc]
                    float(es.unit_raw[q, k]) * ntok / n_sup,
                    ntok,
                )
            )  # type: ignore[index]
        return sort_most_harmful_first(out, lambda s: s.score)

    return drill


def _blamed_by_row(ev: CapabilityEvidence, spec: AttributeSpec) -> dict[int, tuple[int, int]]:
    units = ev.units or []
    return blamed_units(
        ev.engines[spec.engine.name].unit_raw,  # type: ignore[arg-type]
        [u.row for u in units],
        [u.char_start is not None for u in units],
    )


def _blamed_sentences(
    ev: CapabilityEvidence, by_row: dict[int, tuple[int, int]], n: int
) -> list[tuple[int, int] | None]:
    """Per row, the ``(char_start, char_end)`` of the sentence the drill-down blames (``by_row``, from
    :func:`blamed_units`), or None for a row without sentence units.
    """
    best: list[tuple[int, int] | None] = [None] * n
    for j, (k, _) in by_row.items():
        u = ev.units[k]  # type: ignore[index]
        best[j] = (int(u.char_start), int(u.char_end))  # type: ignore[arg-type]
    return best


def _drill_item(ev: CapabilityEvidence, spec: AttributeSpec, j: int, blamed: dict[int, tuple[int, int]]) -> int:
    """The failing item row j's drill-down uses: the item of its blamed sentence (:func:`blamed_units`), or, for a
    row without sentence units, the item it hurts most by raw influence.
    """
    if j in blamed:
        return blamed[j][1]
    return int(np.argmin(ev.engines[spec.engine.name].raw[:, j]))


NON_FINITE_FIX = (
    "check the numbers these scores are computed from: the learning rates in each checkpoint's "
    "trainer_state.json (they weigh the checkpoints), optimizer.pt with --optimizer adam, and the adapter and "
    "base weights; or attribute the final adapter alone (--checkpoints final) to narrow it down"
)


def refuse_non_finite(capability: str, what: str, scores: Any, of: str = "training rows") -> None:
    """The one guard between computed scores and a written verdict: every score must be finite.

    Args:
        capability: the capability being attributed; ``what``: which scores (e.g. ``"datainf influence"``).
        scores: an array of any shape whose last axis is the training rows (``of``: what that axis counts).

    Raises:
        GradianUserError: naming how many rows are NaN/inf and the inputs that are the likely cause, instead
            of a verdict ranked on NaN.
    """
    a = np.asarray(scores, dtype=np.float64)
    bad = ~np.isfinite(a)
    if bool(bad.any()):
        a2 = a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1)
        raise GradianUserError(
            f"the {what} scores of {int(bad.reshape(a2.shape).any(axis=0).sum())} of {a2.shape[1]} {of} are not "
            "finite (NaN/inf); no verdict is written",
            where=f"attribution of capability {capability!r}",
            fix=NON_FINITE_FIX,
        )


def verdict(
    ev: CapabilityEvidence,
    tokenizer,
    examples: Sequence[Example],
    items: Sequence[TokenizedExample],
    queries: Sequence[Query],
    spec: AttributeSpec,
    cluster_index: GradientIndex,
    drill: Drill | None = None,
    drill_queries: Sequence[Query] = (),
) -> CapabilityAttribution:
    """Rank, check agreement, cluster and drill down one capability (module docstring, steps 3-6).

    Args:
        cluster_index: the row index whose gradient directions cluster the harmful tail.
        drill: sentence drill-down for (row, item); default: read off the sentence units.
        drill_queries: items the sentence drill-down also asks about (``ev.drill`` holds their scores): the
            blamed sentence of a row is its most harmful one for any of ``queries + drill_queries``
            (:func:`blamed_units`); the ranking, references and clusters read ``queries`` alone.
    """
    if not queries:
        raise ValueError("a capability needs at least one failing item")
    if bool(drill_queries) != bool(ev.drill) or (
        ev.drill and any(es.raw.shape[0] != len(drill_queries) for es in ev.drill.values())
    ):
        raise ValueError("drill_queries and the evidence's drill scores must come together, one row per query")
    names = list(ev.engines)
    primary = ev.engines[names[0]]
    n = primary.raw.shape[1]
    cap = queries[0].capability
    for label, group in (("", ev.engines), (" drill-down", ev.drill or {})):  # the ranked items, the drill-only ones
        for e, es in group.items():
            for kind in MATRIX_KINDS:
                if getattr(es, kind) is not None:
                    of = "sentence units" if kind.startswith("unit") else "training rows"
                    refuse_non_finite(cap, f"{e}{label} {kind.replace('unit_', '')}", getattr(es, kind), of)
    for r, m in ev.references.items():
        refuse_non_finite(cap, r, m)
    tr = ev.trained  # the rows the run read (None: all): the statistics are theirs, the others score 0
    pop = slice(None) if tr is None else tr
    stats = {e: rank_statistic(es, spec, ev.units, n, tr) for e, es in ev.engines.items()}
    main = stats[names[0]]
    influence = primary.raw.mean(axis=0)
    ref_caps = {r: m[reference_items(queries)].mean(axis=0) for r, m in ev.references.items()}
    if tr is not None:  # a row the run never read is evidence of nothing, however it reads
        ref_caps = {r: np.where(tr, v, 0.0) for r, v in ref_caps.items()}
    fuse_w: dict[str, float] = {}
    rank_scores = main.rows
    if spec.fuse:
        rank_scores, fuse_w = fuse_scores(main.rows, {r: ref_caps[r] for r in spec.fuse}, spec.fuse_gate, tr)
    delta = predicted_loss_delta_if_removed(influence, n)
    k = min(spec.top_k, n)

    # evidence per source: its capability score, where each row stands, agreement with the verdict
    sources: dict[str, np.ndarray] = {"gradient": main.rows}
    for r, v in ref_caps.items():
        sources[EVIDENCE_KIND[r]] = v
    pct = {s: harm_ranks(v) / n for s, v in sources.items()}  # 1/n = most harmful
    support_cut = max(1, int(np.ceil(0.1 * n)))  # "supports" = in that evidence's top 10%
    evidence = {
        s: {
            "engine": names[0] if s == "gradient" else next(r for r in ref_caps if EVIDENCE_KIND[r] == s),
            "spearman_with_verdict": spearman(v[pop], rank_scores[pop]),
            "topk_overlap_with_verdict": topk_overlap(v[pop], rank_scores[pop], k),
            "scores": [float(x) for x in v],
        }
        for s, v in sources.items()
    }
    units = ev.units
    ev_all = ev.with_drill_items()  # the drill-down's items: the ranked ones, then the drill-only ones
    all_queries = list(queries) + list(drill_queries)
    by_row = _blamed_by_row(ev_all, spec) if units is not None else {}
    blamed = _blamed_sentences(ev, by_row, n) if units is not None else None
    vscore = verdict_scores(rank_scores)
    n_sents = [0] * n
    for u in units or []:
        if u.char_start is not None:
            n_sents[u.row] += 1
    ranked = []
    # only rows whose verdict score is harmful (< 0) are listed: "most harmful" never shows a row that is not
    for rank, j in enumerate(harmful_rows(rank_scores)[:k], start=1):
        ex, it = examples[j], items[j]
        row: dict[str, Any] = {
            "rank": rank,
            "id": ex.id,
            "score": float(influence[j]),
            "rank_score": float(rank_scores[j]),
            "verdict_score": float(vscore[j]),
            "predicted_loss_delta_if_removed": float(delta[j]),
            "format": ex.format,
            "tokens": it.full_length,
            "truncated": it.truncated,
            "prompt": ex.prompt_text[:300],
            "completion": ex.completion_text[:600],
            "support": {
                s: {"percentile": float(pct[s][j]), "supports": bool(pct[s][j] * n <= support_cut)} for s in sources
            },
        }
        if len(names) > 1:
            row[f"score_{names[1]}"] = float(stats[names[1]].rows[j])
        if blamed is not None and blamed[j] is not None and n_sents[j] > 1:
            a, b = blamed[j]  # the sentence that gives the row its rank carries the row's verdict score
            row["sentence"] = sentence_view(ex.completion_text, a, b, vscore[j], n_sents[j])
        ranked.append(row)
    agreement = None
    if len(names) > 1:
        rho = spearman(main.rows[pop], stats[names[1]].rows[pop])
        ov = topk_overlap(main.rows[pop], stats[names[1]].rows[pop], k)
        agreement = {
            "engines": names[:2],
            "spearman": rho,
            "topk_overlap": ov,
            "k": k,
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
    clusters = [c.to_dict() for c in cluster_tail(cluster_index, rank_scores, examples, items, no_eos, spec.clusters)]
    per_item_top = {}
    for qi, q in enumerate(queries):
        o = most_harmful_first(main.per_item[qi])[:5]
        per_item_top[q.item_id] = [{"id": examples[j].id, "score": float(main.per_item[qi][j])} for j in o]
    if drill is None and units is not None:
        drill = _unit_drill(ev_all, spec, examples, items)
    per_item_all = main.per_item  # the drill-down's items' rows: the ranked ones' are computed already
    if ev.drill:
        per_item_all = np.vstack([main.per_item, rank_statistic(ev.drill[names[0]], spec, units, n, tr).per_item])
    drills = []
    if drill is not None:
        # every listed row with more than one sentence, up to drilldown_rows of them (single-sentence rows
        # have nothing to localise; the top of a ranking is often all of them)
        by_id = {r["id"]: r for r in ranked}
        for j in harmful_rows(rank_scores)[:k]:
            if len(drills) >= spec.drilldown_rows:
                break
            qi = _drill_item(ev, spec, int(j), by_row)
            sents = drill(int(j), qi)
            refuse_non_finite(
                cap, "drill-down", [s.score for s in sents] or [0.0], f"sentences of row {examples[j].id}"
            )
            if not sents:
                continue
            top = sents[0].score
            sd = []
            for s_ in sents:  # the row's verdict score apportioned by the sentences' scores for the item
                d_ = s_.to_dict()
                d_["verdict_score"] = float(vscore[j] * s_.score / top) if top < 0 else 0.0
                sd.append(d_)
            drills.append(
                {
                    "id": examples[j].id,
                    "item_id": all_queries[qi].item_id,
                    "row_score_for_item": float(per_item_all[qi, j]),
                    "verdict_score": float(vscore[j]),
                    "sentences": sd,
                    "top_sentence": sd[0],
                }
            )
            row = by_id[examples[j].id]
            if "sentence" not in row:  # whole-row ranking: the drill-down's top sentence is the one blamed
                t0 = sents[0]
                row["sentence"] = sentence_view(
                    examples[j].completion_text, t0.char_start, t0.char_end, vscore[j], len(sents)
                )
    return CapabilityAttribution(
        capability=queries[0].capability,
        n_train=n,
        queries=[q.to_dict() for q in queries],
        engine=names[0],
        scores=[float(x) for x in influence],
        rank_scores=[float(x) for x in rank_scores],
        verdict_scores=[float(x) for x in vscore],
        ranking={
            "statistic": spec.statistic,
            "unit": spec.unit,
            "row_weight": spec.row_weight,
            "fuse": list(spec.fuse),
            "fuse_weights": fuse_w,
            "fuse_gate": spec.fuse_gate,
            "rank_score": _describe_rank(spec),
            "sign_convention": SIGN_CONVENTION,
            "verdict_score": VERDICT_SCORE_DOC,
        },
        ranked=ranked,
        agreement=agreement,
        evidence=evidence,
        clusters=clusters,
        drilldown=drills,
        per_item_top=per_item_top,
        second_scores=[float(x) for x in stats[names[1]].rows] if len(names) > 1 else None,
        row_sentences=None if blamed is None else [None if b is None else list(b) for b in blamed],
        drill_queries=[q.to_dict() for q in drill_queries],
    )


def _describe_rank(spec: AttributeSpec) -> str:
    what = "cosine of the preconditioned query and training gradients" if spec.statistic == "cosine" else "influence"
    where = (
        "each row's most harmful sentence for each failing item, then the mean over the items"
        if spec.unit == "sentence"
        else "whole rows, mean over the failing items"
    )
    if spec.unit == "sentence" and spec.row_weight > 0:
        where += f", plus {spec.row_weight:g} × the whole row's score (each on its robust scale)"
    how = "on the rows it blames most" if spec.fuse_gate == "tail" else "over all rows"
    fused = f", with {', '.join(spec.fuse)} folded in by its agreement with the gradient {how}" if spec.fuse else ""
    return f"{what}, learning-rate weighted over the checkpoints, {where}{fused}"


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
    references: dict[str, np.ndarray] | None = None,
) -> CapabilityAttribution:
    """One capability at ONE index (the model's current weights): evidence, then :func:`verdict`.

    The single-checkpoint path (no trajectory, whole-row units); :func:`gradian.attribute.run.attribute_run`
    scores over the trajectory instead. Drill-down computes sentence gradients for the top rows.

    Args:
        engines: optional ``{name: fitted Engine}`` cache, reused across capabilities.
        references: optional precomputed reference matrices ``{name: (m, n)}``.
    """
    from dataclasses import replace

    from gradian.attribute.drilldown import drill_down
    from gradian.attribute.evidence import _norms, _safe_div, row_norms
    from gradian.attribute.queries import projector_for, query_gradients
    from gradian.engines.base import ModelPass, score_index
    from gradian.engines.registry import fit_engine

    if not queries:
        raise ValueError("a capability needs at least one failing item")
    spec = replace(
        spec, unit="row", fuse=tuple(r for r in spec.fuse if r in (references or {}))
    )  # one index: whole rows
    engines = engines if engines is not None else {}
    model_pass = ModelPass(model, items, tokenizer.pad_token_id, spec.query_batch_size)  # for engines that need one
    for es in spec.engines:
        if es.name not in engines:
            engines[es.name] = fit_engine(es, index, model_pass)
    Q = query_gradients(model, tokenizer, queries, index, tokenize_spec, spec.query_batch_size)
    names = [es.name for es in spec.engines]
    R = {nm: engines[nm].precondition(index, Q) for nm in names}
    raw = [r.numpy() for r in score_index(index, [R[nm] for nm in names])]
    g = row_norms(index)
    ev = CapabilityEvidence(
        {nm: EngineScores(nm, r, _safe_div(r, np.outer(_norms(R[nm]), g))) for nm, r in zip(names, raw)},
        dict(references or {}),
    )
    proj = projector_for(index)
    block_names = [b["name"] for b in index.blocks]

    def drill(j: int, qi: int) -> list[SentenceScore]:
        r_q = {k: v[qi] for k, v in R[names[0]].items()}
        return drill_down(model, tokenizer, examples[j], items[j], r_q, proj, block_names, index.modules)

    return verdict(ev, tokenizer, examples, items, queries, spec, index, drill)
