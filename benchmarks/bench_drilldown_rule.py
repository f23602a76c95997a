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
* ``min_q z(MAD)``: ``s_q`` the median absolute deviation (:func:`gradian.attribute.pipeline.item_scaled`,
  the default since it was measured here).

    python benchmarks/bench_drilldown_rule.py RUN1 WORLD1 [RUN2 WORLD2 ...] [--engine graddot]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def _spans_overlap(a, b) -> bool:
    return max(a[0], b[0]) < min(a[1], b[1])


def rules(U: np.ndarray, C: np.ndarray) -> dict[str, np.ndarray]:
    """``{rule: (m, K) matrix}``: each rule's unit score is ``min_q`` (or the mean, for ``mean_q``) of its matrix."""
    from gradian.attribute.pipeline import item_scaled

    return {
        "min_q raw": U,
        "mean_q raw": U,
        "mean_q cosine": C,
        "min_q z(std)": U / (U.std(axis=1, keepdims=True) + 1e-30),
        "min_q z(rms)": U / (np.sqrt((U**2).mean(axis=1, keepdims=True)) + 1e-30),
        "min_q z(MAD) (default)": item_scaled(U),
    }


def localise(run_dir: Path, world: Path, engine: str | None) -> dict[str, dict[str, int]]:
    """``{rule: {"lost_hits", "lost_n", "all_hits", "all_n"}}`` for one run."""
    from safetensors.numpy import load_file

    run = json.loads((run_dir / "run.json").read_text())
    truth = json.loads((world / "ground_truth.json").read_text())
    T = load_file(str(run_dir / "evidence.safetensors"))
    att = run["attribution"]
    cap = att["capabilities"][0]
    c, e = cap["capability"], engine or cap["engine"]
    pos = {rid: j for j, rid in enumerate(att["train_ids"])}
    rows, a, b = T["units/row"], T["units/char_start"], T["units/char_end"]
    lost = {q["item_id"] for q in cap["queries"]}
    by_row: dict[int, list[int]] = {}
    for k, r in enumerate(rows):
        if a[k] >= 0:
            by_row.setdefault(int(r), []).append(k)
    out = {}
    for name, M in rules(T[f"{c}/{e}/unit_raw"], T[f"{c}/{e}/unit_cosine"]).items():
        per_unit = M.mean(axis=0) if name.startswith("mean_q") else M.min(axis=0)
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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pairs", nargs="+", help="RUN WORLD [RUN WORLD ...]")
    ap.add_argument("--engine", default=None, help="the engine's matrices to use (default: the run's primary)")
    args = ap.parse_args()
    if len(args.pairs) % 2:
        raise SystemExit("give RUN WORLD pairs")
    pairs = [(Path(args.pairs[i]), Path(args.pairs[i + 1])) for i in range(0, len(args.pairs), 2)]
    res = {str(w): localise(r, w, args.engine) for r, w in pairs}
    names = list(next(iter(res.values())))
    print("| rule | " + " | ".join(Path(w).name for w in res) + " |")
    print("|---|" + "---:|" * len(res))
    for n in names:
        cells = [f"{v[n]['lost_hits']}/{v[n]['lost_n']} ({v[n]['all_hits']}/{v[n]['all_n']})" for v in res.values()]
        print(f"| {n} | " + " | ".join(cells) + " |")
    print("\ncells: buried culprits of lost items localised (all buried culprits localised)")


if __name__ == "__main__":
    main()
