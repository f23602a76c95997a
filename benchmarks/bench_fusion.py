"""Which references the verdict folds in: fusion sets compared on finished runs.

For each ``RUN WORLD`` pair (a ``gradian attribute`` run folder and the world from ``gradian world`` it was made on),
the rows' gradient score and each reference's score are read from ``RUN/run.json``
(``attribution.capabilities[0].evidence``: ``gradient``, ``lexical`` = BM25, ``representation`` = RepSim; no
``--save-evidence`` needed), the ranking is re-formed with each fusion set by
:func:`gradian.attribute.ranking.fuse_scores` (the global agreement gate, ``w_r = max(0, ρ_s(gradient, r))``), and
scored against the planted culprits (:func:`gradian.worlds.scorecard.score_ranking`):

* ``gradient``: no reference (``--fuse none``);
* ``bm25``: BM25 only (the default before 2026-12-06);
* ``bm25 + repsim``: both (the default since);
* ``bm25 alone`` / ``repsim alone``: the references by themselves.

A check that the run is read as it ranked: the fusion set of the run's own spec must reproduce its ``rank_scores``.

    python benchmarks/bench_fusion.py RUN1 WORLD1 [RUN2 WORLD2 ...] [--json out.json]

Prints, per world, AUC / direct / buried / P@10 / P@n of each set and the weights, then one AUC column per world
with the worst world's AUC per set.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SETS = {"gradient": (), "bm25": ("bm25",), "bm25 + repsim": ("bm25", "repsim")}


def fusions(run_dir: Path) -> tuple[dict[str, tuple[np.ndarray, dict]], list[str]]:
    """``({set: (rows (n,), weights)}, train_ids)`` for one run (module docstring)."""
    from gradian.attribute.pipeline import EVIDENCE_KIND
    from gradian.attribute.ranking import fuse_scores

    att = json.loads((Path(run_dir) / "run.json").read_text())["attribution"]
    cap = att["capabilities"][0]
    ev = cap["evidence"]
    g = np.asarray(ev["gradient"]["scores"], float)
    refs = {r: np.asarray(ev[k]["scores"], float) for r, k in EVIDENCE_KIND.items() if k in ev}
    out: dict[str, tuple[np.ndarray, dict]] = {}
    for name, fuse in SETS.items():
        if all(r in refs for r in fuse):
            out[name] = fuse_scores(g, {r: refs[r] for r in fuse}) if fuse else (g, {})
    for r, v in refs.items():
        out[f"{r} alone"] = (v, {})
    own = tuple(cap["ranking"].get("fuse") or ())
    mine = [n for n, f in SETS.items() if f == own and n in out]
    if cap["ranking"].get("fuse_gate", "global") != "global" or not mine:
        raise SystemExit(f"{run_dir}: its ranking ({own}, gate {cap['ranking'].get('fuse_gate')}) is none of these")
    if not np.allclose(out[mine[0]][0], cap["rank_scores"], rtol=1e-5, atol=1e-5):
        raise SystemExit(f"{run_dir}: the fusion of its own spec does not reproduce its rank scores")
    return out, att["train_ids"]


def main() -> None:
    from runpairs import auc_cell, print_worst, run_world_pairs

    args, pairs = run_world_pairs(__doc__.splitlines()[0])
    table: dict[str, dict[str, dict]] = {}
    names = []
    for run_dir, truth, name in pairs:
        names.append(name)
        sets, ids = fusions(run_dir)
        print(f"\n**{name}**\n\n| fusion | AUC | direct | buried | P@10 | P@n | weights |")
        print("|---|---:|---:|---:|---:|---:|---|")
        for s, (rows, w) in sets.items():
            cell = auc_cell(rows, ids, truth["culprits"]) | {"weights": w}
            table.setdefault(s, {})[name] = cell
            f = [("—" if x is None else f"{x:.3f}") for x in (cell["auc"], cell["direct"], cell["buried"])]
            ws = ", ".join(f"{r} {x:.2f}" for r, x in w.items()) or "—"
            print(f"| {s} | {' | '.join(f)} | {cell['p_at_10']:.2f} | {cell['p_at_n']:.2f} | {ws} |")
    print_worst("fusion", table, names, args.json)


if __name__ == "__main__":
    main()
