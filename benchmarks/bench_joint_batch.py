"""The joint row + sentence pass, one row at a time against b rows per forward (``rows_unit_grads``).

A row's sentence units come from one forward and one backward per vector (``gradian.gradients.units``). Taken one
row at a time that is ``Σ_rows K'`` backward passes of one sequence each; with b rows in one forward it is
``max K'`` passes per batch, each over b sequences. Compute-bound (a CPU) the two should cost about the same; bound
by per-kernel overhead (a GPU at this size, docs/benchmarks.md "GPU check") the batched pass should be up to b×
cheaper. This script times both on a real adapter's rows, interleaved, and checks the batched gradients equal the
one-row ones. With ``--unit-grads positions`` (the build's default since session 22) a row is one backward, so b
rows a forward are one backward pass instead of b; ``--unit-grads exact`` times the per-unit vectors (the figures of
sessions 20 and 21).

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

from adapter_rows import add_adapter_rows_args, load_adapter_rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_adapter_rows_args(ap, rows=32)
    ap.add_argument("--batches", default="1,4,8")
    ap.add_argument("--unit-grads", default="positions", help="positions (the build's default) | exact")
    args = ap.parse_args()

    from gradian.data.tokenize import row_values
    from gradian.gradients.units import rows_unit_grads
    from gradian.index.joint import row_groups, rows_unit_batch

    r = load_adapter_rows(args)
    ft, items, units, per_row, blocks = r.ft, r.items, r.units, r.per_row, r.blocks
    sizes = [int(b) for b in args.batches.split(",")]
    pad = ft.tokenizer.pad_token_id

    lengths = row_values(items, "length")

    def run(b: int) -> tuple[list, int]:  # the rows grouped as the build groups them (--rows-per-forward b)
        out: list = [None] * len(items)
        passes = 0
        for group in row_groups(range(len(items)), lengths, 256, b):
            batch, uls = rows_unit_batch([items[j] for j in group], [per_row[j] for j in group], pad)
            res = rows_unit_grads(ft.model, batch, uls, blocks, args.unit_grads)
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
