"""Sentence-unit gradients, exact against split by position (``--unit-grads``): how close, and how much cheaper.

``exact`` gives each unit its own gradient, one backward vector per unit (and one for the residual tokens);
``positions`` runs one backward of the row's loss and splits its gradient by the positions that predict each unit,
``g̃_u = (1/w_u) Σ_{t∈P_u} G_t X_tᵀ`` (``gradian.gradients.units``). On the first ``--rows`` rows of a real adapter
this script times both, interleaved, one row a forward (median of ``--repeats``), and reports over the units of
rows with two or more sentences the cosine of ``g̃_u`` to ``g_u`` (all LoRA blocks concatenated; a one-unit row's
unit is its row gradient under both, cosine 1, and is left out), for a row's first sentence and the others apart
(the first leans most on the prompt, which the split leaves out), and the largest relative gap of the row gradients.

    python benchmarks/bench_unit_grads.py --base BASE --adapter ADAPTER --data train.jsonl --rows 30
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from adapter_rows import add_adapter_rows_args, load_adapter_rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_adapter_rows_args(ap, rows=30)
    args = ap.parse_args()

    from gradian.gradients.units import rows_unit_grads
    from gradian.index.joint import rows_unit_batch

    r = load_adapter_rows(args)
    ft, items, units, per_row, blocks = r.ft, r.items, r.units, r.per_row, r.blocks
    batches = [rows_unit_batch([it], [us], ft.tokenizer.pad_token_id) for it, us in zip(items, per_row)]

    def run(split: str) -> tuple[list, float, int]:
        t = time.perf_counter()
        out, passes = [], 0
        for batch, uls in batches:
            r = rows_unit_grads(ft.model, batch, uls, blocks, split)[0]
            passes += r.passes
            out.append(r)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return out, time.perf_counter() - t, passes

    def flat(d: dict[str, torch.Tensor], k: int | None = None) -> torch.Tensor:
        return torch.cat([(d[b.name][k] if k is not None else d[b.name]).reshape(-1).double() for b in blocks])

    run("exact")  # warm-up
    times: dict[str, list[float]] = {"exact": [], "positions": []}
    res: dict[str, list] = {}
    passes: dict[str, int] = {}
    for _ in range(args.repeats):
        for split in times:
            res[split], sec, passes[split] = run(split)
            times[split].append(sec)
    first, later = [], []
    row_gap = 0.0
    for j, (e, p) in enumerate(zip(res["exact"], res["positions"])):
        re_, rp = flat(e.row), flat(p.row)
        row_gap = max(row_gap, float((re_ - rp).abs().max() / re_.abs().max()))
        if len(per_row[j]) < 2:
            continue
        for k in range(len(per_row[j])):
            c = float(torch.nn.functional.cosine_similarity(flat(e.units, k), flat(p.units, k), dim=0))
            (first if k == 0 else later).append(c)
    n_tok = sum(len(it.input_ids) for it in items)
    multi = sum(1 for us in per_row if len(us) > 1)
    print(
        f"\n{len(items)} rows ({multi} of two or more sentences), {len(units)} units, {n_tok} tokens, "
        f"{len(blocks)} LoRA blocks, {args.dtype} on {args.device}, torch threads {torch.get_num_threads()}\n"
    )
    print("| unit gradients | s per row | vs exact | backward vectors |")
    print("|---|---:|---:|---:|")
    base = statistics.median(times["exact"])
    for split, ts in times.items():
        med = statistics.median(ts)
        print(f"| {split} | {med / len(items):.3f} | {med / base:.2f}x | {passes[split]} |")
    print("\n| cosine of the split unit to the exact unit | units | median | mean | min |")
    print("|---|---:|---:|---:|---:|")
    for name, cs in (("a row's first sentence", first), ("its later sentences", later), ("all", first + later)):
        if cs:
            print(f"| {name} | {len(cs)} | {statistics.median(cs):.3f} | {statistics.mean(cs):.3f} | {min(cs):.3f} |")
    print(f"\nrow gradients, split against exact: largest relative gap {row_gap:.1e}")


if __name__ == "__main__":
    main()
