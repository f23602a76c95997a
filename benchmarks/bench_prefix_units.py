"""Would a row's unit gradients be cheaper if each unit's backward ran over its own prefix only (issue 24)?

The joint build (:func:`gradian.gradients.units.row_unit_grads`) runs a row forward once and then one backward
per unit over the whole row's graph, although a unit's loss depends only on the tokens up to its last one
(causal attention). Counted in tokens, backward passes over the prefixes alone would do 77% of the backward work
on the quick SmolLM2 world. This benchmark measures it instead of counting: the row is
run forward in chunks that end where a unit ends (the KV cache carries the earlier chunks, so the graph of chunk c
holds chunks 1..c only), each unit's loss is formed from its own chunks' token losses, and its backward therefore
never enters the chunks after it. Each row is computed both ways, one after the other, on the same thread(s);
it prints the wall times and the largest relative difference of the unit gradients (float32).

    python benchmarks/bench_prefix_units.py --base BASE --adapter ADAPTER --data train.jsonl [--rows 12] [--threads 1]
        [--profile]

It first counts the backward tokens of every row of the data both ways (``--rows 0``: only that). ``--profile`` also
runs the first row once more each way under ``torch.profiler`` (after a warm-up) and prints the time in matrix
products and the number of operator calls, and splits the whole-row graph's time into its forward pass and its
backward vectors.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch


def vector_ends(W: torch.Tensor, T: int) -> list[int]:
    """Per backward vector k (rows of ``loss_weights``' W, (K', T-1)): the logits it reads are positions [0, end)."""
    ends = []
    for k in range(W.shape[0]):
        nz = torch.nonzero(W[k] != 0).flatten()
        ends.append(int(nz.max()) + 1 if len(nz) else T)
    return ends


def prefix_unit_grads(model, batch, unit_labels, blocks):
    """Unit gradients (K', o, i) per block, with each vector's backward over its prefix's chunks only.

    Returns ``({block: (K', o, i)}, (K',) losses)``, K' counting the residual vector as
    :func:`gradian.gradients.units.loss_weights` does.
    """
    from transformers import DynamicCache

    from gradian.gradients.loss import IGNORE_INDEX
    from gradian.gradients.units import loss_weights

    W, _, k_all = loss_weights(batch["labels"][0], unit_labels)  # (K', T-1)
    T = batch["input_ids"].shape[1]
    ends = vector_ends(W, T)
    seen: list[tuple[int, torch.Tensor, torch.Tensor]] = []

    def hook(kb):
        def fwd(_m, inputs, output):
            if output.requires_grad:
                seen.append((kb, inputs[0].detach(), output))

        return fwd

    handles = [b.module.register_forward_hook(hook(kb)) for kb, b in enumerate(blocks)]
    cache, lab, chunks, lo = DynamicCache(), batch["labels"][0], [], 0
    try:
        for hi in sorted(set(ends)):
            tgt = lab[lo + 1 : hi + 1]  # positions lo..hi-1 predict labels lo+1..hi
            keep = torch.nonzero(tgt != IGNORE_INDEX).flatten()
            out = model(
                input_ids=batch["input_ids"][:, lo:hi],
                attention_mask=batch["attention_mask"][:, :hi],
                position_ids=torch.arange(lo, hi).unsqueeze(0),
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=keep if keep.numel() else 1,
            )
            c = torch.zeros(hi - lo, dtype=torch.float32)
            if keep.numel():
                logp = torch.log_softmax(out.logits[0].float(), -1)
                c = c.index_put((keep,), -logp.gather(-1, tgt[keep].unsqueeze(-1)).squeeze(-1))
            chunks.append((hi, c))
            lo = hi
    finally:
        for h in handles:
            h.remove()
    ys = [y for _, _, y in seen]
    grads = {b.name: torch.zeros((k_all, *b.shape)) for b in blocks}
    losses = []
    for k in range(k_all):
        # built from this vector's chunks only: a cat over all of them would lead the backward into the later ones
        ck = torch.cat([c for hi, c in chunks if hi <= ends[k]])[: T - 1]
        loss = W[k, : ck.shape[0]].to(ck.dtype) @ ck
        losses.append(float(loss.detach()))
        Gs = torch.autograd.grad(loss, ys, retain_graph=k < k_all - 1, allow_unused=True)
        for (kb, X, _), G in zip(seen, Gs):
            if G is not None:
                grads[blocks[kb].name][k] += G[0].T @ X[0]
    return grads, torch.tensor(losses)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True)
    ap.add_argument("--adapter", required=True, type=Path)
    ap.add_argument("--data", required=True, type=Path)
    ap.add_argument("--rows", type=int, default=12, help="rows with more than one sentence unit, first in the file")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--profile", action="store_true", help="operator counts and the forward / backward split")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    from gradian.data.formats import load_examples
    from gradian.data.spans import sentence_units
    from gradian.finetune import load_finetune, tokenize_training_set
    from gradian.gradients.units import loss_weights, row_unit_grads
    from gradian.index.joint import row_unit_batch
    from gradian.index.store import GradSpec, select_blocks
    from gradian.models.spec import ModelSpec

    ft = load_finetune(ModelSpec(a.base), a.adapter)
    ft.model.eval()
    exs = load_examples(a.data)
    items = tokenize_training_set(exs, ft.tokenizer, GradSpec(), a.data)
    by_row: dict[int, list] = {}
    for u in sentence_units(exs, items):
        by_row.setdefault(u.row, []).append(u)
    blocks = select_blocks(ft.model, GradSpec())

    whole = prefix = 0  # backward tokens over every row of the data: whole-row graph vs each vector's prefix
    for j in sorted(by_row):
        batch, ul = row_unit_batch(items[j], by_row[j], ft.tokenizer.pad_token_id)
        W, _, k_all = loss_weights(batch["labels"][0], ul)
        T = batch["input_ids"].shape[1]
        whole += k_all * T
        prefix += sum(vector_ends(W, T))
    print(f"backward tokens over all {len(by_row)} rows: whole-row graph {whole:,}, prefixes {prefix:,} "
          f"({prefix / whole:.0%})")  # fmt: skip
    rows = [j for j in sorted(by_row) if len(by_row[j]) > 1][: a.rows]
    t_full = t_pref = err = 0.0
    print(f"{len(blocks)} LoRA blocks; {len(rows)} rows with more than one unit; {a.threads} thread(s)")
    for j in rows:
        batch, ul = row_unit_batch(items[j], by_row[j], ft.tokenizer.pad_token_id)
        t0 = time.perf_counter()
        ref = row_unit_grads(ft.model, batch, ul, blocks)
        t1 = time.perf_counter()
        got, _ = prefix_unit_grads(ft.model, batch, ul, blocks)
        t2 = time.perf_counter()
        t_full, t_pref = t_full + t1 - t0, t_pref + t2 - t1
        K = ul.shape[0]
        for b in blocks:
            want = ref.units[b.name].double()
            err = max(err, float((want - got[b.name][:K].double()).abs().max() / want.abs().max().clamp(min=1e-30)))
        print(f"row {j}: {K} units, {batch['input_ids'].shape[1]} tokens: whole-row graph {t1 - t0:.2f} s, "
              f"prefix chunks {t2 - t1:.2f} s")  # fmt: skip
    if not rows:
        return
    print(f"total: whole-row graph {t_full:.1f} s, prefix chunks {t_pref:.1f} s ({t_pref / t_full:.2f}x); "
          f"largest relative difference of a unit gradient {err:.1e}")  # fmt: skip
    if a.profile:
        batch, ul = row_unit_batch(items[rows[0]], by_row[rows[0]], ft.tokenizer.pad_token_id)
        profile(ft.model, batch, ul, blocks)


def profile(model, batch, unit_labels, blocks) -> None:
    """One row under ``torch.profiler`` each way (mm time, operator calls), and the whole-row graph's split."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from gradian.gradients.units import row_unit_grads

    for name, fn in (("whole-row graph", row_unit_grads), ("prefix chunks", prefix_unit_grads)):
        fn(model, batch, unit_labels, blocks)  # warm-up
        with torch_profile(activities=[ProfilerActivity.CPU]) as p:
            fn(model, batch, unit_labels, blocks)
        ev = p.key_averages()
        mm = sum(e.self_cpu_time_total for e in ev if e.key == "aten::mm") / 1e6
        print(f"{name}: aten::mm {mm:.2f} s, {sum(e.count for e in ev)} operator calls")
    marks: list[float] = []
    handle = model.register_forward_hook(lambda *_: marks.append(time.perf_counter()))
    try:
        t0 = time.perf_counter()
        res = row_unit_grads(model, batch, unit_labels, blocks)
        t2 = time.perf_counter()
    finally:
        handle.remove()
    t1, k_all = marks[0], res.passes
    print(
        f"whole-row graph, split: forward {t1 - t0:.2f} s, then {k_all} backward vectors (with their G^T X) "
        f"{(t2 - t1) / k_all:.2f} s each"
    )


if __name__ == "__main__":
    main()
