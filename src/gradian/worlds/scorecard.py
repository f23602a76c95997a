"""The ground-truth scorecard: how well a run found the culprits we planted.

Computed only from ``run.json`` (the verdict's ``rank_scores``, and each reference engine's own ranking) and the world's
``ground_truth.json``; nothing is taken from the planting code. For a capability
whose scores are aligned with ``attribution.train_ids`` (negative = degraded):

* **AUC**: P(score(culprit) < score(non-culprit)), ties counted half
  (Mann-Whitney); 1.0 = every culprit ranks more harmful than every other row,
  0.5 = chance.
* **precision@k**: the share of culprits among the k most harmful rows
  (k = number of culprits, and k = 10).
* **recall per kind**: the share of each kind's culprits (direct, buried)
  found among the k = number-of-culprits most harmful rows.
* **queried culprits**: the same numbers restricted to culprits whose target
  item the tuned model actually lost (only those items become queries; a
  culprit whose target survived did no measurable harm to attribute), with all
  other culprits left out of the comparison.
* **role**: which ranking a row of the card is: ``verdict`` (the run's ranking: its engine with the references
  folded in), ``second engine`` (the confidence engine's own), ``alone`` (a reference engine's own ranking).
* **localisation**: for buried culprits, whether the most harmful sentence of the
  drill-down overlaps the planted wrong sentence's character span.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from gradian.sign import auc_lower_is_positive  # noqa: F401 (with the sign convention; tests import it from here)


def precision_at_k(scores: np.ndarray, positive: np.ndarray, k: int) -> float:
    """The share of ``positive`` rows among the ``k`` lowest (most harmful) ``scores``.

    ``k`` is clipped to ``[1, len(scores)]``; ties keep row order (stable sort).
    """
    k = max(1, min(k, len(scores)))
    top = np.argsort(scores, kind="stable")[:k]
    return float(positive[top].mean())


def spans_overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether two half-open character spans ``[start, end)`` share at least one character."""
    return a[0] < b[1] and b[0] < a[1]


def score_ranking(scores: Sequence[float], ids: Sequence[str], culprits: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """How well one ranking (lower score = more harmful) finds the planted culprits.

    Args:
        scores: (n,) one score per training row, aligned with ``ids``.
        ids: (n,) the rows' ids.
        culprits: the ground truth's culprits, each with its ``id`` and ``kind``.

    Returns:
        ``n_rows``, ``n_culprits``, ``auc``, ``precision_at_n_culprits``, ``precision_at_10``, and per
        culprit kind ``recall_by_kind`` (share found among the n_culprits most harmful rows) and
        ``auc_by_kind`` (that kind's culprits against the non-culprit rows only).
    """
    s = np.asarray(scores, dtype=float)
    cid = {c["id"]: c for c in culprits}
    pos = np.array([i in cid for i in ids])
    k = int(pos.sum())
    out: dict[str, Any] = {
        "n_rows": len(ids),
        "n_culprits": k,
        "auc": auc_lower_is_positive(s, pos),
        "precision_at_n_culprits": precision_at_k(s, pos, k) if k else float("nan"),
        "precision_at_10": precision_at_k(s, pos, 10) if k else float("nan"),
    }
    top = set(np.argsort(s, kind="stable")[:k].tolist()) if k else set()
    kinds = sorted({c["kind"] for c in culprits})
    out["recall_by_kind"] = {}
    out["auc_by_kind"] = {}
    for kind in kinds:
        rows = [j for j, i in enumerate(ids) if i in cid and cid[i]["kind"] == kind]
        out["recall_by_kind"][kind] = sum(1 for j in rows if j in top) / len(rows)
        others = np.array([(i not in cid) for i in ids])
        mask = others.copy()
        mask[rows] = True
        kind_pos = np.zeros(len(ids), dtype=bool)
        kind_pos[rows] = True
        out["auc_by_kind"][kind] = auc_lower_is_positive(s[mask], kind_pos[mask])
    return out


def scorecard(
    run: dict[str, Any], truth: dict[str, Any], localisation: Sequence[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The scorecard for every attributed capability of ``run`` (see module docstring).

    Args:
        localisation: optional extra drill-down results ``[{"id", "top_sentence": {char_start, char_end}}]``
            for every buried culprit (the demo computes them); else the run's own drill-down is used.
    """
    culprits = truth.get("culprits", [])
    card: dict[str, Any] = {"variant": truth.get("variant"), "n_culprits": len(culprits), "capabilities": {}}
    att = run.get("attribution")
    if not att:
        card["stopped"] = run.get("stopped")
        return card
    ids = att["train_ids"]
    for cap in att["capabilities"]:
        queried = {q["item_id"] for q in cap["queries"]}
        hit = [c for c in culprits if c.get("eval_id") in queried]
        unqueried = {c["id"] for c in culprits} - {c["id"] for c in hit}
        keep = [j for j, i in enumerate(ids) if i not in unqueried]
        # (name, scores, role): the verdict's ranking (the engine's scores with the references folded in), the second
        # engine's own, and each reference engine's own ranking alone, for comparison
        engines = [(cap["engine"], cap.get("rank_scores", cap["scores"]), "verdict")]
        if cap.get("second_scores") is not None and cap.get("agreement"):
            engines.append((cap["agreement"]["engines"][1], cap["second_scores"], "second engine"))
        for src, e in (cap.get("evidence") or {}).items():
            if src != "gradient":
                engines.append((e["engine"], e["scores"], "alone"))
        entry: dict[str, Any] = {}
        for name, sc, role in engines:
            entry[name] = score_ranking(sc, ids, culprits)
            entry[name]["queried_culprits"] = score_ranking([sc[j] for j in keep], [ids[j] for j in keep], hit)
            entry[name]["role"] = role
        buried = {c["id"]: c for c in culprits if c["kind"] == "buried"}
        drills = localisation if localisation is not None else cap.get("drilldown", [])
        hits = n = 0
        for d in drills:
            gt = buried.get(d["id"])
            if gt is None:
                continue
            n += 1
            ts = d["top_sentence"]
            hits += spans_overlap((ts["char_start"], ts["char_end"]), (gt["char_start"], gt["char_end"]))
        entry["localisation"] = {"buried_rows_drilled": n, "hits": hits, "rate": (hits / n) if n else float("nan")}
        card["capabilities"][cap["capability"]] = entry
    return card
