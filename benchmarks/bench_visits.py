"""A run that stopped inside its first epoch, attributed with and without counting each row's visits.

For each seed: ``gradian world --kind tiny``; its ``train.yaml`` set to ``num_train_epochs: EPOCHS`` (below 1: the
HF Trainer stops inside the first epoch), a micro-batch of BATCH rows at learning rate LR (enough steps for the
tiny model to regress) and ``group_by_length: false`` (the Trainer's seeded random sampler, the
order :mod:`gradian.attribute.visits` reproduces); ``gradian train``; then ``gradian attribute`` twice with every
other flag at its default: ``--visits auto`` (the default) and ``--visits off`` (every row once, the rule before
2026-12-07). The rows the run read are counted from the adapter folder's ``training_config.yaml`` as Attribute counts
them.

Per run: the AUC of the verdict against the planted culprits the run trained (a planted row it never read cannot
have caused the regression, so it counts as a non-culprit), the same AUC over the trained rows alone (the order among
the rows that can have done anything), the AUC against all planted rows, and how many never-trained rows (planted or
not) the top 20 of the verdict lists.

    python benchmarks/bench_visits.py --out DIR [--seeds 0,1,2] [--epochs 0.6] [--batch 2] [--lr 0.01]
        [--world '--benign-rows 300'] [--save-steps K] [--score-only]

``--save-steps K`` keeps a checkpoint every K steps (``save_strategy: steps``) instead of one per epoch, so that a
checkpoint's interval is not an epoch: rows are read 0, 1 or 2 times in it, and a short last interval counts for its
few steps.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _never_read(world: Path, n: int) -> set[int]:
    from gradian.attribute.trajectory import resolve_trajectory
    from gradian.attribute.visits import with_visits
    from gradian.audit.config import load_config

    traj = resolve_trajectory(world / "adapter", "auto")
    traj = with_visits(traj, load_config([str(world / "adapter" / "training_config.yaml")]), n)
    if traj.visits is None:
        raise SystemExit(f"{world}: the run's order was not reproduced ({traj.visits_rule})")
    return set(traj.visits.never.tolist())


def measure(world: Path, run_name: str, never: set[int]) -> dict:
    from gradian.worlds.scorecard import score_ranking

    run = json.loads((world / run_name / "run.json").read_text())
    truth = json.loads((world / "ground_truth.json").read_text())
    att = run.get("attribution")
    if not att or not att.get("capabilities"):
        return {"regressed": False}
    ids = att["train_ids"]
    cap = att["capabilities"][0]
    planted = [c for c in truth["culprits"]]
    never_ids = {ids[j] for j in never}
    trained = [c for c in planted if c["id"] not in never_ids]
    top = [r["id"] for r in cap["ranked"][:20]]
    return {
        "regressed": True,
        "auc_trained_culprits": score_ranking(cap["rank_scores"], ids, trained)["auc"],
        "auc_all_planted": score_ranking(cap["rank_scores"], ids, planted)["auc"],
        "auc_among_trained_rows": score_ranking(
            [s for j, s in enumerate(cap["rank_scores"]) if j not in never],
            [i for j, i in enumerate(ids) if j not in never],
            trained,
        )["auc"],
        "never_trained_in_top20": sum(i in never_ids for i in top),
        "never_trained_planted_in_top20": sum(i in never_ids and i in {c["id"] for c in planted} for i in top),
        "visits": ((att.get("trajectory") or {}).get("visits") or {}).get("rule"),
    }


def main() -> None:
    from bench_family import train_and_attribute

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epochs", type=float, default=0.6)
    ap.add_argument("--batch", type=int, default=2, help="per_device_train_batch_size")
    ap.add_argument("--lr", type=float, default=1e-2, help="learning_rate")
    ap.add_argument("--score-only", action="store_true", help="re-score the runs already in --out")
    ap.add_argument("--world", default="", help="more `gradian world` flags, e.g. '--benign-rows 300'")
    ap.add_argument("--save-steps", type=int, default=0, help="a checkpoint every K steps (save_strategy: steps)")
    a = ap.parse_args()
    rows = []
    for seed in [int(s) for s in a.seeds.split(",")]:
        world = a.out / f"tiny-seed{seed}"
        if not (world / "train.yaml").exists():
            subprocess.run(
                [sys.executable, "-m", "gradian", "world", "--kind", "tiny", "--seed", str(seed), "--out", str(world)]
                + a.world.split(),
                check=True,
                capture_output=True,
            )
            cfg = yaml.safe_load((world / "train.yaml").read_text())
            cfg.update(num_train_epochs=a.epochs, group_by_length=False)
            cfg.update(per_device_train_batch_size=a.batch, learning_rate=a.lr)
            if a.save_steps:
                cfg.update(save_strategy="steps", save_steps=a.save_steps)
            header = (world / "train.yaml").read_text().splitlines()[0]
            (world / "train.yaml").write_text(header + "\n" + yaml.safe_dump(cfg, sort_keys=False))
        times: dict = {}
        if not a.score_only:
            times = train_and_attribute(world)
            times["attribute_off_s"] = train_and_attribute(world, extra=["--visits", "off"], run_name="run-off")[
                "attribute_s"
            ]
        n = sum(1 for x in (world / "train.jsonl").read_text().splitlines() if x.strip())
        never = _never_read(world, n)
        row = {"seed": seed, "rows": n, "never_trained": len(never), **times}
        row["auto"] = measure(world, "run", never)
        row["off"] = measure(world, "run-off", never)
        rows.append(row)
        print(json.dumps(row), flush=True)
    (a.out / "visits.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
