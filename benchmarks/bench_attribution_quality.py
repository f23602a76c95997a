"""Attribution quality on a world with planted culprits, and the cost of `gradian attribute`.

From ONE process, on a world built by `gradian world` and an adapter trained on it:

1. runs the whole `gradian attribute` pipeline (Evaluate → index build from scratch →
   Attribute) and times it;
2. times one plain forward+backward pass over the same training set (same batch
   size and the same length-sorted batches as the index build, no per-example
   gradients) and prints the ratio;
3. re-scores the regressed capability with the index just built, for the query
   kinds {contrastive, cross_entropy} × engines {datainf, graddot}, and prints
   the ground-truth scorecard of each (AUC, precision@k, recall per kind).

    python benchmarks/bench_attribution_quality.py --world WORLD_DIR --adapter ADAPTER_DIR [--base BASE]
    python benchmarks/bench_attribution_quality.py --world WORLD_DIR --run RUN_DIR   # reuse a finished run

With ``--run``, step 1 is read from that run's recorded timing and its index and
evaluation are reused (no new index build); the plain pass is timed here.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch


def plain_pass_seconds(ft, items, batch_size: int) -> float:
    from gradian.data.tokenize import collate
    from gradian.gradients import per_example_loss

    params = [p for p in ft.model.parameters() if p.requires_grad]
    items = sorted(items, key=lambda it: len(it.input_ids))  # the same length-sorted batches the index build uses
    t = time.perf_counter()
    for s in range(0, len(items), batch_size):
        b = collate(items[s : s + batch_size], ft.tokenizer.pad_token_id)
        logits = ft.model(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]
        ).logits
        torch.autograd.grad(per_example_loss(logits, b["labels"]).sum(), params)
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=Path, required=True)
    ap.add_argument("--adapter", type=Path, default=None)
    ap.add_argument(
        "--run", type=Path, default=None, help="reuse a finished gradian attribute run (its index and evaluation)"
    )
    ap.add_argument("--base", default=None, help="default: the base recorded in WORLD/world.json")
    ap.add_argument("--max-length", type=int, default=None, help="default: the world's train.yaml max_length")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument(
        "--project-dim", type=int, default=0, help="JL numbers per LoRA block for the fresh index (0 = exact)"
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    import yaml

    from gradian.attribute import AttributeSpec, attribute_capability, make_query
    from gradian.attribute.run import RunInputs, RunSpecs, attribute_run
    from gradian.data.formats import load_examples
    from gradian.data.tokenize import TokenizeSpec
    from gradian.engines import DataInfSpec
    from gradian.evaluate import EvalResult
    from gradian.finetune import load_finetune, tokenize_training_set
    from gradian.index.store import GradientIndex, GradSpec
    from gradian.models.load import ModelSpec
    from gradian.worlds.scorecard import score_ranking

    world = json.loads((args.world / "world.json").read_text())
    truth = json.loads((args.world / "ground_truth.json").read_text())
    if args.run is not None:
        run = json.loads((args.run / "run.json").read_text())
        paths = run["manifest"]["paths"]
        base, adapter = paths["base"], Path(paths["adapter"])
        g = run["manifest"]["identity"]["specs"]["grad"]
        from gradian.gradients.projection import ProjectionSpec

        grad = GradSpec(
            tokenize=TokenizeSpec(**g["tokenize"]),
            modules=tuple(g["modules"]) if g["modules"] else None,
            projection=ProjectionSpec(**g["projection"]),
            storage_dtype=g["storage_dtype"],
        )
    else:
        base = args.base or world["base"]
        adapter = args.adapter
        cfg = yaml.safe_load((args.world / "train.yaml").read_text())
        from gradian.gradients.projection import ProjectionSpec

        grad = GradSpec(
            tokenize=TokenizeSpec(max_length=args.max_length or int(cfg.get("max_length", 1024))),
            projection=ProjectionSpec(dim=args.project_dim, seed=0),
        )
    specs = RunSpecs(
        model=ModelSpec(base), grad=grad, attribute=AttributeSpec(drilldown_rows=0), batch_size=args.batch_size
    )
    inputs = RunInputs(base, adapter, args.world / "train.jsonl", args.world / "eval.jsonl")
    ft = load_finetune(specs.model, adapter)
    with tempfile.TemporaryDirectory() as tmp:
        if args.run is None:
            t = time.perf_counter()
            run = attribute_run(inputs, specs, Path(tmp) / "run", index_root=Path(tmp) / "index", ft=ft)
            t_attr = time.perf_counter() - t
        else:
            t_attr = run["timing"]["total"]
        examples = load_examples(inputs.data)
        items = tokenize_training_set(examples, ft.tokenizer, grad, inputs.data)
        t_plain = plain_pass_seconds(ft, items, args.batch_size)
        print(
            f"\n`gradian attribute` pipeline (evaluate + index build + attribute): {t_attr:.1f} s "
            f"(timings {run['timing']}){' [recorded by the run]' if args.run else ''}"
        )
        print(f"one plain forward+backward pass over the {len(items)} training rows: {t_plain:.1f} s")
        print(
            f"ratio: {t_attr / t_plain:.1f}x  (index build alone: "
            f"{run['timing'].get('index', float('nan')) / t_plain:.2f}x)"
        )
        if not run.get("attribution"):
            print("no capability regressed: nothing to score")
            return
        ev = EvalResult.from_dict(run["evaluation"])
        idx = GradientIndex(run["attribution"]["index"]["root"])
        rows = []
        for cap in ev.regressed:
            failing = ev.failing_items(cap.name)
            for qkind in ("contrastive", "cross_entropy"):
                qs = [
                    make_query(
                        f.id,
                        f.capability,
                        f.prompt,
                        f.answer,
                        f.tuned_answer,
                        f.reference_answer,
                        kind=qkind,
                        fallback=f.correct_completion,
                    )
                    for f in failing
                ]
                res = attribute_capability(
                    ft.model,
                    ft.tokenizer,
                    idx,
                    examples,
                    items,
                    qs,
                    grad.tokenize,
                    AttributeSpec(engine=DataInfSpec(), second_engine="graddot", drilldown_rows=0),
                )
                for eng, sc in (("datainf", res.scores), ("graddot", res.second_scores)):
                    card = score_ranking(sc, [e.id for e in examples], truth.get("culprits", []))
                    rows.append({"capability": cap.name, "query": qkind, "engine": eng, **card})
        print("\n| capability | query | engine | AUC | P@n_culprits | P@10 | recall direct | recall buried |")
        print("|---|---|---|---:|---:|---:|---:|---:|")
        for r in rows:
            rk = r["recall_by_kind"]
            print(
                f"| {r['capability']} | {r['query']} | {r['engine']} | {r['auc']:.3f} | "
                f"{r['precision_at_n_culprits']:.2f} | "
                f"{r['precision_at_10']:.2f} | {rk.get('direct', float('nan')):.2f} | "
                f"{rk.get('buried', float('nan')):.2f} |"
            )
        if args.out:
            args.out.write_text(
                json.dumps({"rows": rows, "t_attribute": t_attr, "t_plain": t_plain, "timing": run["timing"]}, indent=2)
            )


if __name__ == "__main__":
    main()
