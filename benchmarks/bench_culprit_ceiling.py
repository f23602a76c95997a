"""What caps a world's AUC over all culprits: the culprits of lost items against those of items that still pass.

For each ``WORLD RUN`` pair (a world folder with ``ground_truth.json``, a run folder with ``run.json``) and the first
attributed capability, the AUC of the verdict's rank scores (lower = more harmful) for

* all culprits, against the benign rows (the scorecard's AUC);
* the culprits whose target eval item the tuned model lost (a query was built from them), against the benign rows;
* the culprits of items it still answers correctly, against the benign rows;

how many lost items no planted row targets, and how many the tuned model answered with the capital a direct culprit
planted for them; and the ceiling ``(n_lost · 1 + n_kept · AUC_kept) / (n_lost + n_kept)``: the all-culprit AUC if
every culprit of a lost item ranked above every benign row while the others kept their AUC.

    python benchmarks/bench_culprit_ceiling.py WORLD RUN [WORLD RUN ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def ceiling(world: Path, run_dir: Path) -> dict[str, float]:
    from gradian.sign import auc_lower_is_positive

    truth = json.loads((world / "ground_truth.json").read_text())
    run = json.loads((run_dir / "run.json").read_text())
    ids = run["attribution"]["train_ids"]
    cap = run["attribution"]["capabilities"][0]
    scores = np.asarray(cap["rank_scores"], dtype=np.float64)
    lost = {q["item_id"] for q in cap["queries"]}
    of_lost = {c["id"] for c in truth["culprits"] if c.get("eval_id") in lost}
    of_kept = {c["id"] for c in truth["culprits"]} - of_lost
    benign = np.array([i not in of_lost and i not in of_kept for i in ids])

    def auc(group: set[str]) -> float:
        if not group:
            return float("nan")
        member = np.array([i in group for i in ids])
        keep = member | benign
        return auc_lower_is_positive(scores[keep], member[keep])

    a_kept = auc(of_kept)
    n = len(of_lost) + len(of_kept)
    targeted = {c.get("eval_id") for c in truth["culprits"]}
    stated: dict[str, set[str]] = {}  # per eval item, the capitals its direct culprits state
    for c in truth["culprits"]:
        if c.get("stated"):
            stated.setdefault(c.get("eval_id"), set()).add(c["stated"].casefold())
    return {
        "lost_items": len(lost),
        "lost_without_culprit": len(lost - targeted),
        # lost items whose tuned answer says the capital a direct culprit planted for them
        "said_planted": sum(
            any(w in (q.get("said") or "").casefold() for w in stated.get(q["item_id"], ())) for q in cap["queries"]
        ),  # fmt: skip
        "culprits_of_lost": len(of_lost),
        "culprits_of_kept": len(of_kept),
        "auc_all": auc(of_lost | of_kept),
        "auc_of_lost": auc(of_lost),
        "auc_of_kept": a_kept,
        "ceiling": (len(of_lost) + (len(of_kept) * a_kept if of_kept else 0.0)) / n,
    }


def main() -> None:
    args = sys.argv[1:]
    if not args or len(args) % 2:
        sys.exit(__doc__)
    print(
        "| run | lost items (no planted culprit; said a planted answer) | culprits of lost / kept items | AUC all "
        "| of lost | of kept | ceiling |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for world, run_dir in zip(args[::2], args[1::2]):
        c = ceiling(Path(world), Path(run_dir))
        print(
            f"| {run_dir} | {c['lost_items']} ({c['lost_without_culprit']}; {c['said_planted']}) "
            f"| {c['culprits_of_lost']} / {c['culprits_of_kept']} | {c['auc_all']:.3f} "
            f"| {c['auc_of_lost']:.3f} | {c['auc_of_kept']:.3f} | {c['ceiling']:.3f} |"
        )


if __name__ == "__main__":
    main()
