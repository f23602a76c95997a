"""Which checkpoints the verdict needs: checkpoint weightings compared on runs saved with ``--save-evidence``.

The default verdict sums each checkpoint's scores with the TracIn weights ``w_t`` (the learning rate over the
checkpoint's span of steps, :mod:`gradian.attribute.trajectory`). Every checkpoint costs one index build (the
forward and the sentence units' backward passes over every row), so a verdict that needs fewer checkpoints costs
proportionally less. ``gradian attribute --save-evidence`` writes every checkpoint's unweighted matrices
(``c/<engine>/ck<t>/<kind>``) and the weights (``trajectory/weights``); this script re-forms the default verdict
under other weightings, with the pipeline's own functions:

* rank: ``rank_statistic`` (per item, the row's most harmful sentence, then the items' mean) on the weighted
  ``unit_cosine``, the default's references folded in by ``fuse_scores`` with its gate
  (``runpairs.default_fusion``); scored by :func:`gradian.worlds.scorecard.score_ranking` (AUC over all
  culprits, direct, buried, P@n);
* drill-down: ``blamed_units`` on the weighted ``unit_raw``; a buried culprit is localised when the blamed
  sentence overlaps its planted one (lost items' culprits, and all buried culprits in brackets).

Weightings (T checkpoints, in training order): ``lr (default)`` the run's own, ``equal``, ``first``, ``final``,
``first + final`` (lr weights of those two), ``first two`` (lr weights). "checkpoints" is how many indexes the
weighting needs, the build's cost relative to the default in brackets.

    python benchmarks/bench_checkpoint_weights.py RUN1 WORLD1 [RUN2 WORLD2 ...] [--json out.json]

The ``lr (default)`` row must reproduce the run's own ``rank_scores`` (checked; a run made with other defaults
is refused). A run made with ``--weakened`` is re-formed from its lost items' rows alone (the default's queries; its
own ranking, which also averaged the weakened items, is then not the comparison).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def weightings(w: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{name: ((T,) row weights, (T,) sentence-unit weights)}``; a zero weight means that checkpoint's index
    (row, or sentence) is not needed.

    The "rows all, sentences X" weightings keep every checkpoint's row scores (the whole-row term and the
    references' gate) and take the sentence units (the worst-sentence statistic and the drill-down) from one
    checkpoint: a row-only pass (one forward and one backward per row, in batches) at the others, instead of
    the joint pass's K' backward vectors per row.
    """
    T = len(w)
    only = np.eye(T)
    out = {name: (x, x) for name, x in (("lr (default)", w), ("equal", np.full(T, 1.0 / T)))}
    out |= {"first": (only[0], only[0]), "final": (only[-1], only[-1])}
    if T >= 2:
        out["first + final"] = (w * (only[0] + only[-1]),) * 2
    if T >= 3:
        out["first two"] = (w * (only[0] + only[1]),) * 2
    if T >= 2:
        out["rows all, sentences first"] = (w, w * only[0])
        out["rows all, sentences final"] = (w, w * only[-1])
    if T >= 3:
        out["rows all, sentences middle"] = (w, w * only[T // 2])
        out["rows all, sentences first + final"] = (w, w * (only[0] + only[-1]))
    return out


def _used(wt: np.ndarray) -> int:
    """How many checkpoints a weighting (``(T,)`` or ``(T, n)``) needs: those with a weight other than 0."""
    return int(np.any(np.reshape(wt, (len(wt), -1)) != 0, axis=1).sum())


def visit_rules(W: np.ndarray, w: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Row-weight rules for a run whose visits were counted (``trajectory/row_weights`` W, (T, n); ``w`` (T,) the
    checkpoint weights): ``lr (default)`` the run's own W; ``lr, every row once`` (``--visits off``); ``lr, rows never
    read 0`` (w, but 0 for a row no step read); ``visits, each row's total w`` (W rescaled per row so that its
    weights sum to Σ_t w_t: which checkpoints read it, not how often).
    """
    read = W.sum(axis=0) > 0
    once = np.repeat(w[:, None], W.shape[1], axis=1)
    total = np.where(read, w.sum() / np.where(read, W.sum(axis=0), 1.0), 0.0)
    rules = {
        "lr (default)": W,
        "lr, every row once": once,
        "lr, rows never read 0": once * read[None, :],
        "visits, each row's total w": W * total[None, :],
    }
    return {k: (v, v) for k, v in rules.items()}


def verdicts(run_dir: Path, today: bool = False) -> tuple[dict[str, dict[str, Any]], list[str], dict[str, Any]]:
    """``({weighting: {"rows": (n,) rank scores, "spans": {row: (a, b)}, "checkpoints": k}}, train_ids, facts)``."""
    from gradian.attribute.drilldown import blamed_units
    from gradian.attribute.evidence import EngineScores
    from gradian.attribute.ranking import rank_statistic
    from gradian.data.spans import SentenceUnit
    from runpairs import default_fusion, load_saved, run_spec

    cap, c, e, ids, T = load_saved(run_dir)
    n = len(ids)
    if "trajectory/weights" not in T:
        raise SystemExit(f"{run_dir}: its evidence has no per-checkpoint matrices (re-run with --save-evidence)")
    w = T["trajectory/weights"]
    # a run that ranked weakened items too (--weakened): the default's verdict is re-formed from the lost items' rows
    kinds = {f["id"]: f.get("kind", "lost") for f in cap.get("failing_items") or []}
    lost = np.array([kinds.get(q["item_id"], "lost") == "lost" for q in cap["queries"]])
    rows, a, b = T["units/row"].astype(int), T["units/char_start"], T["units/char_end"]
    units = [SentenceUnit(int(r), 0, 1, 0, 1) for r in rows]  # rank_statistic reads only .row
    has_span = a >= 0
    spec = run_spec(run_dir)  # the run's own rank rule (its row weight), so "lr (default)" is its verdict
    if today:  # today's default rank rule and fusion on a run made before them (no reproduction check)
        from gradian.attribute.spec import AttributeSpec

        spec = AttributeSpec()

    def weighted(kind: str, wt: np.ndarray) -> np.ndarray:
        """Σ_t wt[t] · ck<t>/kind; ``wt`` (T,) per checkpoint, or (T, n) per checkpoint and row (a unit takes its
        row's weight).
        """
        per_row = np.ndim(wt) == 2
        if per_row and kind.startswith("unit_"):
            wt = wt[:, rows]
        return sum(
            (x[None, :] if per_row else x) * T[f"{c}/{e}/ck{t}/{kind}"][lost]
            for t, x in enumerate(wt)
            if np.any(x != 0)
        )

    table = weightings(w)
    if "trajectory/row_weights" in T:  # a run whose visits were counted: its own weights, and other rules for them
        table = {
            **visit_rules(T["trajectory/row_weights"], w),
            **{k: v for k, v in table.items() if k != "lr (default)"},
        }
    out: dict[str, dict[str, Any]] = {}
    for name, (wr, wu) in table.items():
        es = EngineScores(
            e, weighted("raw", wr), weighted("cosine", wr), weighted("unit_raw", wu), weighted("unit_cosine", wu)
        )
        read = np.reshape(wr, (len(wr), -1)).any(axis=0) if np.ndim(wr) == 2 else None
        trained = None if read is None or read.all() else read  # the rows the rule counts, as the verdict takes them
        g = rank_statistic(es, spec, units, n, trained).rows
        fused, fw = default_fusion(g, T, c, lost, spec, trained)
        blamed = blamed_units(es.unit_raw, rows, has_span)
        spans = {j: (int(a[k]), int(b[k])) for j, (k, _) in blamed.items()}
        out[name] = {
            "rows": fused,
            "spans": spans,
            "checkpoints": f"{_used(wr)}+{_used(wu)}",
            "fuse_weights": fw,
        }
    if (
        not today
        and lost.all()
        and not np.allclose(out["lr (default)"]["rows"], cap["rank_scores"], rtol=1e-5, atol=1e-6)
    ):
        raise SystemExit(f"{run_dir}: the lr weighting does not reproduce the run's rank scores (not a default run?)")
    facts = {"rows": n, "units": len(rows), "failing_items": int(lost.sum()), "checkpoints": len(w)}
    return out, ids, facts


def localised(spans: dict[int, tuple[int, int]], ids: list[str], truth: dict, lost: set[str]) -> tuple[int, ...]:
    """(lost hits, lost n, all hits, all n) over the buried culprits."""
    pos = {rid: j for j, rid in enumerate(ids)}
    h = [0, 0, 0, 0]
    for cu in truth["culprits"]:
        j = pos[cu["id"]]
        if cu["kind"] != "buried" or j not in spans:
            continue
        s = spans[j]
        hit = int(max(s[0], cu["char_start"]) < min(s[1], cu["char_end"]))
        h[2] += hit
        h[3] += 1
        if cu.get("eval_id") in lost:
            h[0] += hit
            h[1] += 1
    return tuple(h)


def main() -> None:
    from runpairs import auc_cell, print_worst, run_world_pairs

    def extra(ap):
        ap.add_argument("--today", action="store_true", help="re-form under today's default rule, not the run's own")

    args, pairs = run_world_pairs(__doc__.splitlines()[0], extra)
    table: dict[str, dict[str, dict[str, Any]]] = {}
    names = [name for _, _, name in pairs]
    for run_dir, truth, name in pairs:
        cap = json.loads((run_dir / "run.json").read_text())["attribution"]["capabilities"][0]
        lost = {f["id"] for f in cap["failing_items"] if f.get("kind", "lost") == "lost"}
        res, ids, facts = verdicts(run_dir, args.today)
        print(
            f"\n## {name}: {facts['rows']} rows, {facts['units']} units, {facts['failing_items']} failing items, "
            f"{facts['checkpoints']} checkpoints"
        )
        print("| weighting | row + sentence indexes | AUC | direct | buried | P@n | localised |")
        print("|---|---:|---:|---:|---:|---:|---|")
        for rule, v in res.items():
            loc = localised(v["spans"], ids, truth, lost)
            cell = {**auc_cell(v["rows"], ids, truth["culprits"]), "localised": loc, "checkpoints": v["checkpoints"]}
            table.setdefault(rule, {})[name] = cell
            f = ["—" if x is None else f"{x:.3f}" for x in (cell["auc"], cell["direct"], cell["buried"])]
            print(
                f"| {rule} | {v['checkpoints']} of {facts['checkpoints']} | {f[0]} | {f[1]} | {f[2]} | "
                f"{cell['p_at_n']:.2f} | {loc[0]}/{loc[1]} ({loc[2]}/{loc[3]}) |"
            )
    print_worst("weighting", table, names, args.json)  # a weighting a shorter trajectory lacks is "—"


if __name__ == "__main__":
    main()
