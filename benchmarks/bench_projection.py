"""What the Johnson-Lindenstrauss projection costs in ranking fidelity.

On a world + adapter (as for bench_attribution_quality.py): evaluate once, build
the unprojected index and projected ones (Kronecker JL, `--dims` numbers per
LoRA block), score the regressed capability's failing items with DataInf on
each, and print Spearman and top-k overlap of every projected ranking against
the unprojected one, with index size and build time.

    python benchmarks/bench_projection.py --world WORLD_DIR --adapter ADAPTER_DIR --dims 16,64,256,1024
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=Path, required=True)
    ap.add_argument("--adapter", type=Path, required=True)
    ap.add_argument("--base", default=None)
    ap.add_argument("--dims", default="16,64,256,1024")
    ap.add_argument("--top-k", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=8)
    args = ap.parse_args()

    import numpy as np

    from gradian.attribute import AttributeSpec, attribute_capability
    from gradian.attribute.ranking import spearman, topk_overlap
    from gradian.finetune import training_index
    from gradian.gradients.projection import ProjectionSpec
    from gradian.index.store import GradSpec

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from worldtask import world_queries

    got = world_queries(args.world, args.adapter, args.base)
    if got is None:
        return
    ft, tspec, cap, qs = got
    spec = AttributeSpec(second_engine=None, drilldown_rows=0)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for dim in [0] + [int(d) for d in args.dims.split(",")]:
            g = GradSpec(tokenize=tspec, projection=ProjectionSpec(dim=dim, seed=0))
            t = time.perf_counter()
            idx, exs, items, _ = training_index(
                ft, args.world / "train.jsonl", g, root=Path(tmp) / f"d{dim}", batch_size=args.batch_size
            )
            t_build = time.perf_counter() - t
            res = attribute_capability(ft.model, ft.tokenizer, idx, exs, items, qs, tspec, spec)
            size = sum((idx.root / s["file"]).stat().st_size for s in idx.manifest["shards"])
            results[dim] = (np.asarray(res.scores), sum(int(b["dim"]) for b in idx.blocks), size, t_build)
    ref = results[0][0]
    print(f"\n{cap.name}: {len(qs)} failing items, {len(ref)} training rows, top-k = {args.top_k}\n")
    print("| numbers per block | numbers per row | index size (MB) | build (s) | Spearman vs exact | top-k overlap |")
    print("|---:|---:|---:|---:|---:|---:|")
    for dim, (sc, d, size, tb) in results.items():
        print(
            f"| {dim or 'exact'} | {d:,} | {size / 1e6:.1f} | {tb:.1f} | {spearman(sc, ref):.3f} | "
            f"{topk_overlap(sc, ref, args.top_k):.2f} |"
        )


if __name__ == "__main__":
    main()
