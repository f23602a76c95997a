"""What 2-byte index storage (bfloat16, float16) costs in ranking fidelity, against float32.

On a world + adapter (as bench_projection.py): evaluate once, build the index at the final adapter
in float32, bfloat16 and float16 (the same gradients, rounded when stored), score the regressed
capability's failing items with DataInf and gradient-dot on each, and print, against float32:
Spearman and top-k overlap of the rankings, the largest relative score difference, the culprit
AUC (when the world has ground truth), the index size, and how many stored float32 numbers lie
below float16's smallest normal number (6.1e-5: float16 keeps fewer bits there, and flushes
numbers below 6e-8 to zero).

    python benchmarks/bench_storage_dtype.py --world WORLD_DIR --adapter ADAPTER_DIR

Without a world (``--data FILE --base BASE``), on many rows: the queries are differences of two
training rows' gradients (``g_2q − g_2q+1`` for the first ``2 × --queries`` rows, from the float32
index), DataInf and gradient-dot score every row for each, and the table gives the mean over the
queries of each ranking's Spearman and top-k overlap against float32 (many rows, many near-ties:
a harder test of the rounding than one capability's ranking).

    python benchmarks/bench_storage_dtype.py --data train-4000.jsonl --base BASE --adapter ADAPTER
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=Path, default=None)
    ap.add_argument("--data", type=Path, default=None, help="without --world: a training file")
    ap.add_argument("--queries", type=int, default=8)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--adapter", type=Path, required=True)
    ap.add_argument("--base", default=None)
    ap.add_argument("--dtypes", default="float32,bfloat16,float16")
    ap.add_argument("--project-dim", type=int, default=0)
    ap.add_argument("--top-k", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=8)
    args = ap.parse_args()

    import numpy as np
    import torch

    from gradian.attribute import AttributeSpec, attribute_capability
    from gradian.attribute.ranking import spearman, topk_overlap
    from gradian.finetune import training_index
    from gradian.gradients.projection import ProjectionSpec
    from gradian.index.store import GradSpec

    if args.world is None:
        return synthetic(args)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from worldtask import world_queries

    got = world_queries(args.world, args.adapter, args.base)
    if got is None:
        return
    ft, tspec, cap, qs = got
    truth = None
    gt = args.world / "ground_truth.json"
    if gt.exists():
        truth = json.loads(gt.read_text())["culprits"]
    spec = AttributeSpec(second_engine="graddot", drilldown_rows=0, references=(), fuse=())
    results = {}
    small = None
    with tempfile.TemporaryDirectory() as tmp:
        for dt in args.dtypes.split(","):
            g = GradSpec(tokenize=tspec, projection=ProjectionSpec(dim=args.project_dim, seed=0), storage_dtype=dt)
            idx, exs, items, _ = training_index(
                ft, args.world / "train.jsonl", g, root=Path(tmp) / dt, batch_size=args.batch_size
            )
            res = attribute_capability(ft.model, ft.tokenizer, idx, exs, items, qs, tspec, spec)
            size = sum((idx.root / s["file"]).stat().st_size for s in idx.manifest["shards"])
            results[dt] = {"datainf": np.asarray(res.scores), "graddot": np.asarray(res.second_scores), "bytes": size}
            if dt == "float32":
                vals = torch.cat([torch.cat(list(s.values()), 1).flatten() for _, s in idx.iter_shards(torch.float32)])
                nz = vals[vals != 0].abs()
                small = {
                    "below_normal": float((nz < 6.1e-5).double().mean()),
                    "below_subnormal": float((nz < 6e-8).double().mean()),
                    "max": float(nz.max()),
                }
            ids = [e.id for e in exs]
    ref = results["float32"]
    print(
        f"\n{cap.name}: {len(qs)} failing items, {len(ids)} training rows, top-k = {args.top_k}, "
        f"project-dim {args.project_dim or 'exact'}"
    )
    if small:
        print(
            f"float32 index: {small['below_normal']:.1%} of its non-zero numbers are below 6.1e-5 (float16's "
            f"smallest normal), {small['below_subnormal']:.2%} below 6e-8 (float16 rounds them to 0); largest |g| "
            f"{small['max']:.3g}\n"
        )
    print("| storage | engine | index (MB) | Spearman vs float32 | top-k overlap | max rel. score diff | culprit AUC |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for dt, r in results.items():
        for eng in ("datainf", "graddot"):
            x, y = ref[eng], r[eng]
            auc = "—"
            if truth is not None:
                from gradian.worlds.scorecard import score_ranking

                auc = f"{score_ranking(list(y), ids, truth)['auc']:.3f}"
            rel = float(np.abs(x - y).max() / np.abs(x).max())
            print(
                f"| {dt} | {eng} | {r['bytes'] / 1e6:.1f} | {spearman(y, x):.6f} | "
                f"{topk_overlap(y, x, args.top_k):.2f} "
                f"| {rel:.1e} | {auc} |"
            )


def synthetic(args) -> None:
    import numpy as np

    from gradian.attribute.ranking import spearman, topk_overlap
    from gradian.data.tokenize import TokenizeSpec
    from gradian.engines import EngineSpec, make_engine, score_index
    from gradian.finetune import load_finetune, training_index
    from gradian.gradients.projection import ProjectionSpec
    from gradian.index.store import GradSpec
    from gradian.models.load import ModelSpec

    ft = load_finetune(ModelSpec(args.base), args.adapter)
    tspec = TokenizeSpec(max_length=args.max_length)
    out = {}
    Q = None
    with tempfile.TemporaryDirectory() as tmp:
        for dt in args.dtypes.split(","):
            g = GradSpec(tokenize=tspec, projection=ProjectionSpec(dim=args.project_dim, seed=0), storage_dtype=dt)
            idx, *_ = training_index(ft, args.data, g, root=Path(tmp) / dt, batch_size=args.batch_size)
            if Q is None:  # from the first (float32) index: the same queries for every storage
                first = idx.load_shard(0)
                Q = {k: v[0 : 2 * args.queries : 2] - v[1 : 2 * args.queries : 2] for k, v in first.items()}
            R = []
            for name in ("datainf", "graddot"):
                eng = make_engine(EngineSpec(name))
                eng.fit(idx)
                R.append(eng.precondition(idx, Q))
            sc = score_index(idx, R)
            size = sum((idx.root / s["file"]).stat().st_size for s in idx.manifest["shards"])
            out[dt] = {"datainf": sc[0].numpy(), "graddot": sc[1].numpy(), "bytes": size, "n": idx.n}
    ref = out["float32"]
    print(
        f"\n{ref['n']:,} rows, {args.queries} queries (differences of two rows' gradients), top-k = {args.top_k}, "
        f"project-dim {args.project_dim or 'exact'}\n"
    )
    print(
        "| storage | engine | index (MB) | Spearman vs float32 (mean, min) | top-k overlap (mean, min) | max rel. "
        "score diff |"
    )
    print("|---|---|---:|---:|---:|---:|")
    for dt, r in out.items():
        for eng in ("datainf", "graddot"):
            rho = [spearman(r[eng][q], ref[eng][q]) for q in range(args.queries)]
            ov = [topk_overlap(r[eng][q], ref[eng][q], args.top_k) for q in range(args.queries)]
            rel = float(np.abs(r[eng] - ref[eng]).max() / np.abs(ref[eng]).max())
            print(
                f"| {dt} | {eng} | {r['bytes'] / 1e6:.0f} | {np.mean(rho):.6f}, {min(rho):.6f} | {np.mean(ov):.3f}, "
                f"{min(ov):.2f} | {rel:.1e} |"
            )


if __name__ == "__main__":
    main()
