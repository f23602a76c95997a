"""How a row's rank score is formed from its sentences: rank rules compared on runs saved with ``--save-evidence``.

For each ``RUN WORLD`` pair (a ``gradian attribute ... --save-evidence`` run folder on a world from ``gradian
world``, whose ``ground_truth.json`` lists the planted culprits), every rule turns the primary engine's item × unit
scores ``U`` (m failing items × K sentence units, cosine, trajectory-weighted; ``RUN/evidence.safetensors``) into one
score per row, folds in the default's references (BM25 and RepSim) by its agreement gate exactly as the default
verdict does (:func:`gradian.attribute.ranking.fuse_scores`, through ``runpairs.default_fusion``), and is scored
against the ground truth (:func:`gradian.worlds.scorecard.score_ranking`: AUC over all culprits, direct, buried,
and P@n):

* the default (since 2026-12-06): ``u_j = mean_q min_{s ∈ j} U[q, s]`` plus ``row_weight`` (0.5) × the whole
  row's ``w_j = mean_q S[q, j]``, each over its robust scale (:func:`gradian.attribute.ranking.rank_statistic`,
  called on the evidence), and the same with the other weights of ``ROW_WEIGHTS``;
* ``per item, then mean`` (the default 2026-12-02 to 2026-12-06): ``u_j`` alone;
* ``min of the items' mean`` (the default before): ``rows_j = min_{s ∈ j} mean_q U[q, s]``;
* ``whole row``: ``rows_j = mean_q S[q, j]``, the whole-row cosine (no sentences);
* ``bottom-2``, ``expected-min``: the unit-count corrections of :mod:`gradian.attribute.unit_null` on
  ``mean_q U``;
* ``per item, weighted by ...``: the default's per-item matrix ``P[q, j] = min_{s ∈ j} U[q, s]`` averaged over the
  items with weights ``w_q`` instead of equally (an item with no culprit behind it should add less noise):
  ``its tail`` ``w_q = max(0, −mean of the k lowest z(P_q))`` (z the robust standard score, k =
  ``tail_size(n)``), ``its lowest z`` ``w_q = max(0, −min_j z(P_q)_j)``, ``the consensus``
  ``w_q = max(0, ρ_s(P_q, mean_q P_q))``; and ``z per item, then mean`` (each item's row scores standardised);
* ``default, tail gate``: the default's rank score with the references weighted by the tail gate
  (:func:`gradian.attribute.ranking.tail_agreement`) instead of the global Spearman; ``default, per-item ...
  gate`` (session 21): each reference's weight from its agreement with the gradient item by item (:func:`item_gated`);
* ``default, the items' ...`` (session 21): the default with the median, the 20% trimmed mean or the most harmed
  item's standard score over the items instead of their mean (:func:`item_aggregates`);
* ``... unfused``: the default, ``per item, then mean`` and ``min of the items' mean`` without the references.

    python benchmarks/bench_rank_rule.py RUN1 WORLD1 [RUN2 WORLD2 ...] [--json out.json]

The last table it prints has one column per world and the worst world's AUC per rule.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

ROW_WEIGHTS = (0.1, 0.2, 0.3, 0.4, 0.7, 1.0)  # beside the default's: the sweep it was chosen from


def item_weights(P: np.ndarray) -> dict[str, np.ndarray]:
    """``{name: (m,) weights}`` of the failing items, from their per-item row scores ``P`` (m, n) (module docstring)."""
    from gradian.attribute.ranking import spearman, tail_size, zscore

    Z = np.stack([zscore(p) for p in P])
    k = tail_size(P.shape[1])
    consensus = P.mean(0)
    return {
        "its tail": np.maximum(-np.sort(Z, axis=1)[:, :k].mean(1), 0),
        "its lowest z": np.maximum(-Z.min(1), 0),
        "the consensus": np.array([max(0.0, spearman(p, consensus)) for p in P]),
    }


def item_aggregates() -> dict[str, Any]:
    """``{name: f}``, f taking an (m, n) per-item matrix to (n,) row scores instead of the mean over the m items
    (session 21): the median, the 20% trimmed mean, and the most harmed item's robust standard score.
    """
    from scipy.stats import trim_mean

    from gradian.attribute.ranking import robust_scale

    def lowest_z(M: np.ndarray) -> np.ndarray:
        return np.stack([m / robust_scale(m) for m in M]).min(0)

    return {
        "median": lambda M: np.median(M, axis=0),
        "20% trimmed mean": lambda M: trim_mean(M, 0.2, axis=0),
        "lowest z": lowest_z,
    }


def item_gated(g: np.ndarray, P: np.ndarray, T: dict, c: str, gate: str) -> np.ndarray:
    """The default fusion, each reference weighted by its per-item agreement with the gradient (session 21).

        w_r = max(0, mean_q a(P[q], R_r[q])),   fused = z(g) + Σ_r w_r · z(mean_q R_r[q])

    with a the Spearman correlation (``gate="spearman"``) or :func:`gradian.attribute.ranking.tail_agreement`
    (``"tail"``), P (m, n) the gradient's per-item statistic and R_r (m, n) the reference's per-item scores: a
    reference trusted where it agrees with the gradient item by item, not on the items' mean.
    """
    from gradian.attribute.pipeline import AttributeSpec
    from gradian.attribute.ranking import spearman, tail_agreement, zscore

    agree = spearman if gate == "spearman" else tail_agreement
    out = zscore(g)
    for r in AttributeSpec().fuse:
        R = T[f"{c}/{r}"]
        a = float(np.nanmean([agree(P[q], R[q]) for q in range(min(len(P), len(R)))]))
        out = out + (max(0.0, a) if np.isfinite(a) else 0.0) * zscore(R.mean(0))
    return out


def rank_rules(run_dir: Path) -> tuple[dict[str, np.ndarray], list[str], dict[str, Any]]:
    """``({rule: (n,) row scores}, train_ids, facts)`` for one saved run (module docstring)."""
    from gradian.attribute.evidence import EngineScores
    from gradian.attribute.pipeline import AttributeSpec
    from gradian.attribute.ranking import rank_statistic, with_whole_row, zscore
    from gradian.attribute.unit_null import corrected_rows
    from gradian.data.spans import SentenceUnit, row_min
    from runpairs import default_fusion, load_saved

    cap, c, e, ids, T = load_saved(run_dir)
    n = len(ids)
    unit_rows = T["units/row"].astype(int)
    units = [SentenceUnit(int(r), 0, 1, 0, 1) for r in unit_rows]  # rank_statistic reads only .row
    U, S = T[f"{c}/{e}/unit_cosine"], T[f"{c}/{e}/cosine"]

    def fused(g: np.ndarray) -> np.ndarray:
        return default_fusion(g, T, c)[0]

    es = EngineScores(e, T[f"{c}/{e}/raw"], S, T[f"{c}/{e}/unit_raw"], U)
    default = rank_statistic(es, AttributeSpec(), units, n).rows
    sentence = rank_statistic(es, AttributeSpec(row_weight=0.0), units, n)  # the sentence statistic alone
    before, _ = row_min(U.mean(0), units, n)
    P = sentence.per_item  # (m, n)
    rules = {
        f"per item, then mean, + {AttributeSpec().row_weight:g} x whole row (default)": fused(default),
        "per item, then mean (before 2026-12-06)": fused(sentence.rows),
        "min of the items' mean (before 2026-12-02)": fused(before),
        "whole row": fused(S.mean(0)),
        "bottom-2": fused(corrected_rows(U.mean(0), unit_rows, n, "bottom-m", 2)),
        "expected-min": fused(corrected_rows(U.mean(0), unit_rows, n, "expected-min")),
    }
    for lam in ROW_WEIGHTS:
        rules[f"per item, then mean, + {lam:g} x whole row"] = fused(
            rank_statistic(es, AttributeSpec(row_weight=lam), units, n).rows
        )
    for rule, w in item_weights(P).items():
        rules[f"per item, weighted by {rule}"] = fused((w[:, None] * P).sum(0) / max(float(w.sum()), 1e-300))
    rules["z per item, then mean"] = fused(np.stack([zscore(p) for p in P]).mean(0))
    for rule, agg in item_aggregates().items():  # the default with another aggregate over the items than the mean
        rules[f"default, the items' {rule}"] = fused(with_whole_row(agg(P), agg(S), AttributeSpec().row_weight))
    rules["default, tail gate"] = default_fusion(default, T, c, None, AttributeSpec(fuse_gate="tail"))[0]
    rules["default, per-item Spearman gate"] = item_gated(default, P, T, c, "spearman")
    rules["default, per-item tail gate"] = item_gated(default, P, T, c, "tail")
    rules["default, unfused"] = default
    rules["per item, then mean, unfused"] = sentence.rows
    rules["min of the items' mean, unfused"] = before
    # the rule the run itself ranked by must be one of these: its unfused gradient score, to float tolerance (a check
    # that the evidence is read as the run read it). Evidence files hold float64 since 2026-12-03; in an older
    # float32 file the fused score's BM25 weight can move with rounded ties.
    gradient = np.asarray(cap["evidence"]["gradient"]["scores"])
    made_with = [r for r in rules if r.endswith("unfused") and np.allclose(rules[r], gradient, rtol=1e-5, atol=1e-6)]
    if not made_with:
        raise SystemExit(f"{run_dir}: its gradient scores match none of the rules (not a default run?)")
    facts = {
        "rows": n,
        "units": len(unit_rows),
        "failing_items": int(U.shape[0]),
        "made_with": made_with[0].removesuffix(", unfused"),
    }
    return rules, ids, facts


def main() -> None:
    from runpairs import auc_cell, print_worst, run_world_pairs

    a, pairs = run_world_pairs(__doc__.splitlines()[0])
    table: dict[str, dict[str, dict[str, float]]] = {}
    names = [name for _, _, name in pairs]
    for run_dir, truth, name in pairs:
        rules, ids, facts = rank_rules(run_dir)
        print(
            f"\n## {name}: {facts['rows']} rows, {facts['units']} units, {facts['failing_items']} failing items;"
            f" the run ranked by: {facts['made_with']}"
        )
        print("| rule | AUC | direct | buried | P@n |\n|---|---:|---:|---:|---:|")
        for rule, scores in rules.items():
            cell = auc_cell(scores, ids, truth["culprits"])
            table.setdefault(rule, {})[name] = cell
            f = ["—" if v is None else f"{v:.3f}" for v in (cell["auc"], cell["direct"], cell["buried"])]
            print(f"| {rule} | {f[0]} | {f[1]} | {f[2]} | {cell['p_at_n']:.2f} |")
    print_worst("rule", table, names, a.json)


if __name__ == "__main__":
    main()
