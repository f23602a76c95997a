"""The joint row + sentence pass, one row at a time against b rows per forward (``rows_unit_grads``).

A row's sentence units come from one forward and one backward per vector (``gradian.gradients.units``). Taken one
row at a time that is ``Σ_rows K'`` backward passes of one sequence each; with b rows in one forward it is
``max K'`` passes per batch, each over b sequences. Compute-bound (a CPU) the two should cost about the same; bound
by per-kernel overhead (a GPU at this size, docs/benchmarks.md "GPU check") the batched pass should be up to b×
cheaper. This script times both on a real adapter's rows, interleaved, and checks the batched gradients equal the
one-row ones.

    python benchmarks/bench_joint_batch.py --base BASE --adapter ADAPTER --data train.jsonl --rows 32 --batches 1,4,8

Prints per batch size: seconds per row (median of --repeats), backward passes, and the largest relative gap
``max|a − b| / max|b|`` of its unit gradients to batch size 1. The rows are the first --rows of the data, grouped
as the build groups them (``gradian.index.joint.row_groups``: sorted by length within each block of 256 rows; until
session 21 this script grouped them in file order, which padded more, and docs/benchmarks.md's CPU table of session 20
was measured that way).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True)
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--batches", default="1,4,8")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-length", type=int, default=1024)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()

    from gradian.data.formats import load_examples
    from gradian.data.spans import sentence_units
    from gradian.data.tokenize import TokenizeSpec, row_values
    from gradian.finetune import load_finetune, tokenize_training_set
    from gradian.gradients.units import rows_unit_grads
    from gradian.index.joint import row_groups, rows_unit_batch
    from gradian.index.store import GradSpec, select_blocks
    from gradian.models.load import ModelSpec

    ft = load_finetune(ModelSpec(args.base, args.dtype, args.device), args.adapter)
    spec = GradSpec(tokenize=TokenizeSpec(max_length=args.max_length))
    exs = load_examples(args.data)[: args.rows]
    items = list(tokenize_training_set(exs, ft.tokenizer, spec, args.data))
    units = sentence_units(exs, items)
    per_row = [[u for u in units if u.row == j] for j in range(len(items))]
    blocks = select_blocks(ft.model, spec)
    sizes = [int(b) for b in args.batches.split(",")]
    pad = ft.tokenizer.pad_token_id

    lengths = row_values(items, "length")

    def run(b: int) -> tuple[list, int]:  # the rows grouped as the build groups them (--rows-per-forward b)
        out: list = [None] * len(items)
        passes = 0
        for group in row_groups(range(len(items)), lengths, 256, b):
            batch, uls = rows_unit_batch([items[j] for j in group], [per_row[j] for j in group], pad)
            res = rows_unit_grads(ft.model, batch, uls, blocks)
            passes += max(r.passes for r in res)
            for j, r in zip(group, res):
                out[j] = {k: v.cpu() for k, v in r.units.items()}
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return out, passes

    ref, _ = run(1)  # warm-up and the reference
    scale = max(v.abs().max().item() for r in ref for v in r.values())
    times: dict[int, list[float]] = {b: [] for b in sizes}
    passes: dict[int, int] = {}
    gap: dict[int, float] = {}
    for _ in range(args.repeats):
        for b in sizes:
            t = time.perf_counter()
            got, passes[b] = run(b)
            times[b].append(time.perf_counter() - t)
            gap[b] = max((g[k] - r[k]).abs().max().item() for g, r in zip(got, ref) for k in r) / scale
    n_tok = sum(len(it.input_ids) for it in items)
    print(
        f"\n{len(items)} rows, {len(units)} units, {n_tok} tokens, {len(blocks)} LoRA blocks, "
        f"{args.dtype} on {args.device}, torch threads {torch.get_num_threads()}\n"
    )
    print("| rows per forward | s per row | vs 1 | backward passes | max rel gap to 1 |")
    print("|---:|---:|---:|---:|---:|")
    base = statistics.median(times[sizes[0]])
    for b in sizes:
        med = statistics.median(times[b])
        print(f"| {b} | {med / len(items):.3f} | {med / base:.2f}x | {passes[b]} | {gap[b]:.1e} |")


if __name__ == "__main__":
    main()
