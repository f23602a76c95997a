"""Which sentence the drill-down blames: sentence rules compared on runs saved with ``--save-evidence``.

For each ``RUN WORLD`` pair (a ``gradian attribute ... --save-evidence`` run folder on a world from ``gradian
world``, whose ``ground_truth.json`` marks every buried culprit's planted sentence), every rule picks one sentence
unit per row from the primary engine's item × unit raw influence ``U`` (m, K) in ``RUN/evidence.safetensors``; a
buried culprit is localised when the picked sentence overlaps its planted one. Counted over the buried culprits
whose target item was lost (what the scorecard's localisation counts), and over all buried culprits.

Rules (``Z = U / s_q`` with ``s_q`` item q's spread over all units):

* ``min_q raw``: ``argmin_{k ∈ j} min_q U[q, k]`` (the rule before item scaling);
* ``mean_q raw`` / ``mean_q cosine``: the items' mean;
* ``min_q z(std)``, ``min_q z(rms)``: ``s_q`` the standard deviation, the root mean square;
* ``min_q z(MAD)``: ``s_q`` the median absolute deviation (:func:`gradian.attribute.drilldown.item_scaled`,
  the default since it was measured here);
* tried since (session 16, none kept): the same on the cosine, on ``U / ‖g_k‖^0.5`` (half-way between raw and
  cosine), centred on each row's own median per item, and the sentence that hurts most the one item the whole
  row hurts most (the row's item-scaled raw influence);
* tried in session 19 (not kept): ``Z`` centred across the items, ``min_q (Z[q, k] − mean_q' Z[q', k])`` (and with
  the median), which discounts a sentence that hurts every item alike (a short sentence of rare tokens such as
  "Its internet country domain is .my."), and the mean rule over the lost and weakened items together, what
  the default (``--drill-weakened``) would blame with it;
* tried in session 21 (not kept; ``--lexical``): the words of the lost item's question, the row's sentence that
  BM25 (the product's :func:`gradian.engines.lexical.bm25_scores`, ``said`` mode, the units' texts as documents)
  finds closest to the question (``prompt``), to the question and the model's answer (``prompt + said``), and added
  to the gradient's item-scaled score, ``min_q (Z[q, k] + λ · L[q, k])`` (L ∈ [−1, 0] per item, −1 the most
  relevant). In the facts worlds a buried culprit's planted sentence is the only sentence of its row that states a
  capital, so the question's words alone find it: a property of the worlds, not evidence about a rule;
* ``lost + weakened items`` (runs made with ``--drill-weakened`` or ``--weakened``): the default's rule over the lost
  and the weakened items' rows together, what ``--drill-weakened`` blames (and the same centred in the row). Every
  other rule reads the lost items' rows.

    python benchmarks/bench_drilldown_rule.py RUN1 WORLD1 [RUN2 WORLD2 ...] [--engine graddot] [--lexical]
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def _spans_overlap(a, b) -> bool:
    return max(a[0], b[0]) < min(a[1], b[1])


def rules(U: np.ndarray, C: np.ndarray, by_row: dict[int, list[int]], S: np.ndarray) -> dict[str, np.ndarray]:
    """``{rule: (K,) unit score}``: the row's blamed sentence is its unit of lowest score.

    Args:
        U, C: (m, K) raw influence and cosine of the K sentence units on the m failing items.
        by_row: the units (with a span) of each row.
        S: (m, n) the whole rows' raw influence (for the row's most-hurt item).
    """
    from gradian.attribute.drilldown import item_scaled

    Z, Zc = item_scaled(U), item_scaled(C)
    with np.errstate(divide="ignore", invalid="ignore"):  # |U| / |C| = ‖g_k‖ · ‖r_q‖: the unit's gradient norm
        norm = np.nanmedian(np.where(np.abs(C) > 0, np.abs(U) / np.abs(C), np.nan), axis=0)
    norm = np.where(np.isfinite(norm) & (norm > 0), norm, 1.0)
    centred = Z.copy()
    for ks in by_row.values():  # each item's scores less their median over the row's own sentences
        centred[:, ks] = Z[:, ks] - np.median(Z[:, ks], axis=1, keepdims=True)
    own = np.zeros(U.shape[1])
    RZ = item_scaled(S)
    for j, ks in by_row.items():  # the item the whole row hurts most, then that item's sentence
        own[ks] = Z[int(np.argmin(RZ[:, j])), ks]
    return {
        "min_q raw": U.min(0),
        "mean_q raw": U.mean(0),
        "mean_q cosine": C.mean(0),
        "min_q z(std)": (U / (U.std(axis=1, keepdims=True) + 1e-30)).min(0),
        "min_q z(rms)": (U / (np.sqrt((U**2).mean(axis=1, keepdims=True)) + 1e-30)).min(0),
        "min_q z(MAD) (default)": Z.min(0),
        "min_q z(MAD) of cosine": Zc.min(0),
        "min_q z(MAD) of U / ‖g‖^0.5": item_scaled(U / np.sqrt(norm)).min(0),
        "min_q z(MAD), centred in the row": centred.min(0),
        "z(MAD) of the row's most-hurt item": own,
        "min_q z(MAD), centred across the items (mean)": (Z - Z.mean(axis=0, keepdims=True)).min(0),
        "min_q z(MAD), centred across the items (median)": (Z - np.median(Z, axis=0, keepdims=True)).min(0),
    }


def item_rows(run: dict, T: dict, c: str, e: str, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """``(lost, weakened)``: the lost items' rows of ``c/e/kind`` and the weakened items' (the rows after the lost
    ones of a ``--weakened`` run, or the ``drill/`` matrix of a ``--drill-weakened`` run; none: an empty matrix).
    """
    cap = run["attribution"]["capabilities"][0]
    M = T[f"{c}/{e}/{kind}"]
    kinds = {f["id"]: f.get("kind", "lost") for f in cap.get("failing_items") or []}
    lost = np.array([kinds.get(q["item_id"], "lost") == "lost" for q in cap["queries"]])
    weak = M[~lost]
    if f"{c}/{e}/drill/{kind}" in T:
        weak = np.concatenate([weak, T[f"{c}/{e}/drill/{kind}"]])
    return M[lost], weak


def lexical_rules(Z: np.ndarray, qs: list[dict], texts: list[str]) -> dict[str, np.ndarray]:
    """``{rule: (K,) unit score}`` from the words of the lost items' questions (module docstring, session 21).

    Args:
        Z: (m, K) the gradient's item-scaled unit scores of the m lost items.
        qs: the m lost items' query records (run.json ``queries``: ``prompt``, ``said``).
        texts: the K units' sentence texts ("" for a unit without a span).
    """
    from gradian.engines.lexical import BM25Spec, bm25_scores

    def prompt(q: dict) -> str:
        p = q["prompt"]
        return " ".join(m["content"] for m in p) if isinstance(p, list) else str(p)

    said = BM25Spec(mode="said")
    L = bm25_scores(texts, [prompt(q) for q in qs], [None] * len(qs), said)  # (m, K), −1 = most relevant
    Ls = bm25_scores(texts, [f"{prompt(q)}\n{q.get('said') or ''}" for q in qs], [None] * len(qs), said)
    out = {"the question's words alone": L.min(0), "the question's and the answer's words alone": Ls.min(0)}
    for lam in (1.0, 2.0, 4.0):
        out[f"min_q z(MAD) + {lam:g} × the question's words"] = (Z + lam * L).min(0)
    return out


def localise(run_dir: Path, truth: dict, engine: str | None, world: Path | None = None) -> dict[str, dict[str, int]]:
    """``{rule: {"lost_hits", "lost_n", "all_hits", "all_n"}}`` for one run (with ``world``, the lexical rules too:
    the units' texts are read from its ``train.jsonl``).
    """
    from safetensors.numpy import load_file

    from gradian.attribute.drilldown import item_scaled

    run = json.loads((run_dir / "run.json").read_text())
    T = load_file(str(run_dir / "evidence.safetensors"))
    att = run["attribution"]
    cap = att["capabilities"][0]
    c, e = cap["capability"], engine or cap["engine"]
    pos = {rid: j for j, rid in enumerate(att["train_ids"])}
    rows, a, b = T["units/row"], T["units/char_start"], T["units/char_end"]
    kinds = {f["id"]: f.get("kind", "lost") for f in cap.get("failing_items") or []}
    lost = {q["item_id"] for q in cap["queries"] if kinds.get(q["item_id"], "lost") == "lost"}
    by_row: dict[int, list[int]] = {}
    for k, r in enumerate(rows):
        if a[k] >= 0:
            by_row.setdefault(int(r), []).append(k)
    (U, Uw), (C, _), (S, _) = (item_rows(run, T, c, e, k) for k in ("unit_raw", "unit_cosine", "raw"))
    found = rules(U, C, by_row, S)
    if world is not None:
        from gradian.data.formats import load_examples

        text = {ex.id: ex.completion_text for ex in load_examples(world / "train.jsonl")}
        units = [text[att["train_ids"][int(r)]][a[k] : b[k]] if a[k] >= 0 else "" for k, r in enumerate(rows)]
        qs = [q for q in cap["queries"] if kinds.get(q["item_id"], "lost") == "lost"]
        found |= lexical_rules(item_scaled(U), qs, units)
    if len(Uw):  # the drill-down asking the weakened items too (--drill-weakened)
        Zw = item_scaled(np.concatenate([U, Uw]))
        found["min_q z(MAD), lost + weakened items"] = Zw.min(0)  # the default with --drill-weakened
        found["min_q z(MAD), lost + weakened items, centred across the items (mean)"] = (
            Zw - Zw.mean(axis=0, keepdims=True)
        ).min(0)
        for ks in by_row.values():  # and centred in the row, as above
            Zw[:, ks] = Zw[:, ks] - np.median(Zw[:, ks], axis=1, keepdims=True)
        found["min_q z(MAD), lost + weakened items, centred in the row"] = Zw.min(0)
    out = {}
    for name, per_unit in found.items():
        r = {"lost_hits": 0, "lost_n": 0, "all_hits": 0, "all_n": 0}
        for cu in truth["culprits"]:
            ks = by_row.get(pos[cu["id"]]) if cu["kind"] == "buried" else None
            if not ks:
                continue
            k = ks[int(np.argmin(per_unit[ks]))]
            hit = int(_spans_overlap((a[k], b[k]), (cu["char_start"], cu["char_end"])))
            r["all_hits"] += hit
            r["all_n"] += 1
            if cu.get("eval_id") in lost:
                r["lost_hits"] += hit
                r["lost_n"] += 1
        out[name] = r
    return out


def main() -> None:
    from runpairs import run_world_pairs

    def engine(ap):
        ap.add_argument("--engine", default=None, help="the engine's matrices to use (default: the run's primary)")
        ap.add_argument("--lexical", action="store_true", help="also the rules from the questions' words")

    args, pairs = run_world_pairs(__doc__.splitlines()[0], engine)
    worlds = [Path(w) if args.lexical else None for w in args.pairs[1::2]]
    res = {name: localise(r, w, args.engine, wd) for (r, w, name), wd in zip(pairs, worlds)}
    names = list(dict.fromkeys(n for v in res.values() for n in v))
    print("| rule | " + " | ".join(res) + " |")
    print("|---|" + "---:|" * len(res))
    for n in names:
        cells = [
            f"{v[n]['lost_hits']}/{v[n]['lost_n']} ({v[n]['all_hits']}/{v[n]['all_n']})" if n in v else "—"
            for v in res.values()
        ]
        print(f"| {n} | " + " | ".join(cells) + " |")
    print("\ncells: buried culprits of lost items localised (all buried culprits localised)")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
