"""Relevance feedback on saved runs: does it rank the culprits of items the tuned model still answers (issue 23)?

Rows whose training gradients look like the verdict's most harmful rows are ranked up. Tried and not kept (no flag):
it lifted the tiny family and lowered both SmolLM2 worlds it had not seen (docs/benchmarks.md "Relevance feedback").

The verdict's queries are built from the items the tuned model lost, so the culprits of items it kept are found only
through what they share with the queried ones (docs/benchmarks.md, "what caps the all-culprit AUC"). This re-ranks a
saved run with one more signal, read from the run's own row indexes (no gradient is computed again):

    w_j   = max(0, −z_j)^p                       z = zscore(the verdict's rank scores)
    q_c   = Σ_j w_j ĝ_{j,c}                      ĝ_{j,c} = g_{j,c} / ‖g_{j,c}‖, row j's gradient at checkpoint c
    f_i   = Σ_c λ_c cos(g_{i,c}, q_c)            λ_c: the run's checkpoint weights
    score = z − α · zscore(f)                    lower = more harmful, as the rank score

``soft`` seeds weigh every row by how far below the median the verdict puts it (p = 1; ``soft2`` p = 2, ``soft0.5``
p = 0.5); ``top0.2n`` seeds are the verdict's ⌈0.2 n⌉ most harmful rows, equally weighted; ``--final-only`` reads
the final checkpoint alone. Each ``WORLD`` is a folder with ``ground_truth.json`` and ``run/run.json`` (a default
``gradian attribute`` run); the AUC is the scorecard's (all planted culprits against the benign rows), and for
``--detail`` also over the culprits of lost and of kept items, and over the direct and the buried ones.

    python benchmarks/bench_feedback.py WORLD [WORLD ...] [--alphas 0.5,1] [--seeds soft,top0.2n] [--final-only]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np


def seed_weights(rank: np.ndarray, seeds: str) -> np.ndarray:
    """(n,) the seeds' weights w_j (module docstring)."""
    from gradian.attribute.ranking import zscore

    if seeds.startswith("soft"):  # the rows the verdict puts below the median, by how far
        below = np.clip(-zscore(np.asarray(rank, dtype=np.float64)), 0.0, None)
        return below ** (float(seeds[4:]) if len(seeds) > 4 else 1.0)
    if seeds.startswith("top") and seeds.endswith("n"):
        w = np.zeros(len(rank))
        w[np.argsort(rank, kind="stable")[: max(5, math.ceil(float(seeds[3:-1]) * len(rank)))]] = 1.0
        return w
    raise SystemExit(f"unknown seeds {seeds!r}: soft, soft<p> or top<fraction>n")


def similarity_to_seeds(index, weights: np.ndarray) -> np.ndarray:
    """(n,) ``cos(g_i, q)``, ``q = Σ_j w_j ĝ_j``, over one row index: two passes (the centroid, then the cosines),
    one shard in memory at a time.
    """
    import torch

    names = [b["name"] for b in index.blocks]

    def unit_rows(shard):
        G = torch.cat([shard[b] for b in names], dim=1)
        return G / G.norm(dim=1, keepdim=True).clamp(min=1e-30)

    w = torch.as_tensor(np.asarray(weights, dtype=np.float64))
    q = sum(w[start : start + shard.n] @ unit_rows(shard) for start, shard in index.iter_shards(torch.float64))
    q = q / q.norm().clamp(min=1e-30)
    out = np.zeros(index.n)
    for start, shard in index.iter_shards(torch.float64):
        out[start : start + shard.n] = (unit_rows(shard) @ q).numpy()
    return out


def feedback(rank: np.ndarray, indexes: list, seeds: str) -> np.ndarray:
    """(n,) f_i = Σ_c λ_c cos(g_{i,c}, q_c) (module docstring) over ``indexes`` [(λ_c, GradientIndex)]."""
    w = seed_weights(rank, seeds)
    return sum(lam * similarity_to_seeds(idx, w) for lam, idx in indexes)


def apply_feedback(rank: np.ndarray, f: np.ndarray, alpha: float) -> np.ndarray:
    """``zscore(rank) − α · zscore(f)``: lower = more harmful, as the rank score."""
    from gradian.attribute.ranking import zscore

    return zscore(np.asarray(rank, dtype=np.float64)) - alpha * zscore(np.asarray(f, dtype=np.float64))


def load(world: Path, final_only: bool):
    run = json.loads((world / "run" / "run.json").read_text())
    truth = json.loads((world / "ground_truth.json").read_text())
    att = run["attribution"]
    cap = att["capabilities"][0]
    ids = att["train_ids"]
    lost = {q["item_id"] for q in cap["queries"]}
    target = {c["id"]: c.get("eval_id") for c in truth["culprits"]}
    kind = {c["id"]: c.get("kind") for c in truth["culprits"]}
    pos = np.array([i in target for i in ids])
    groups = {
        "lost": np.array([i in target and target[i] in lost for i in ids]),
        "direct": np.array([kind.get(i) == "direct" for i in ids]),
    }
    cks = att["trajectory"]["checkpoints"]
    from gradian.index.store import GradientIndex

    indexes = [
        (float(c["weight"]), GradientIndex(c["index"]["row"]["root"])) for c in (cks[-1:] if final_only else cks)
    ]
    return np.asarray(cap["rank_scores"], dtype=np.float64), pos, groups, indexes


def main() -> None:
    from gradian.sign import auc_lower_is_positive as auc

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("worlds", nargs="+", type=Path)
    ap.add_argument("--alphas", default="0.5,1")
    ap.add_argument("--seeds", default="soft,soft2,soft0.5,top0.2n")
    ap.add_argument("--final-only", action="store_true", help="the final checkpoint's row index alone")
    ap.add_argument(
        "--detail", action="store_true", help="also the AUC over the culprits of lost / kept items, direct / buried"
    )
    a = ap.parse_args()
    data = {w.name: load(w, a.final_only) for w in a.worlds}

    def group(s: np.ndarray, pos: np.ndarray, mask: np.ndarray) -> float:
        keep = ~pos | mask
        return auc(s[keep], mask[keep]) if mask.any() else float("nan")

    configs = [("default", None, None)] + [
        (f"{s}, α {float(al):g}", s, float(al)) for s in a.seeds.split(",") for al in a.alphas.split(",")
    ]
    print("| ranking | " + " | ".join(data) + " | worst | mean |")
    print("|---|" + "---:|" * (len(data) + 2))
    sims: dict[tuple[str, str], np.ndarray] = {}  # (world, seeds) → f: two reads of every row index, once
    for name, seeds, al in configs:
        cells, aucs = [], []
        for world, (rank, pos, groups, mats) in data.items():
            if seeds is not None and (world, seeds) not in sims:
                sims[world, seeds] = feedback(rank, mats, seeds)
            s = rank if seeds is None else apply_feedback(rank, sims[world, seeds], al)
            aucs.append(auc(s, pos))
            lo, di = groups["lost"], groups["direct"]
            extra = (
                f" (lost {group(s, pos, lo):.3f} / kept {group(s, pos, pos & ~lo):.3f}; "
                f"direct {group(s, pos, di):.3f} / buried {group(s, pos, pos & ~di):.3f})"
                if a.detail
                else ""
            )
            cells.append(f"{aucs[-1]:.3f}{extra}")
        print(f"| {name} | " + " | ".join(cells) + f" | {min(aucs):.3f} | {np.mean(aucs):.3f} |")


if __name__ == "__main__":
    main()
