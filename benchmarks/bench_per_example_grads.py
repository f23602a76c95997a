"""Per-example LoRA gradients: hooks vs batch-size-1 loop vs vmap vs a plain forward+backward.

All four are timed side by side in one run, on the same model and the same
batches, and reported as ratios to the plain forward+backward (the cost of an
ordinary training step's gradient, without per-example gradients).

    python benchmarks/bench_per_example_grads.py               # tiny Llama (built from config)
    python benchmarks/bench_per_example_grads.py --smollm2     # also SmolLM2-135M (slow)
    python benchmarks/bench_per_example_grads.py --dora        # the same with DoRA adapters (use_dora)

Each cell is the median of --repeats timed runs after one warm-up; the runs of
the four methods are interleaved so that other load on the machine hits all alike.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from gradian.data.formats import to_example
from gradian.data.tokenize import TokenizeSpec, collate, tokenize_example
from gradian.gradients import per_example_grads, per_example_loss


def plain_forward_backward(model, batch):
    params = [p for p in model.parameters() if p.requires_grad]
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
    ).logits
    torch.autograd.grad(per_example_loss(logits, batch["labels"]).sum(), params)


def timed_round_robin(fns: dict, repeats: int) -> dict:
    """Median wall time per function, interleaving the runs so load on the machine hits all alike."""
    for fn in fns.values():
        fn()  # warm-up
    ts = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            ts[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in ts.items()}


def make_batch(tok, b, seq, seed=0):
    g = torch.Generator().manual_seed(seed)
    words = ["capital", "river", "metal", "Paris", "water", "the", "of", "is", "a", "and", "Iron", "city", "north"]
    rows = []
    for i in range(b):
        n = int(torch.randint(seq // 3, seq, (1,), generator=g))  # mixed lengths → padding
        text = " ".join(words[int(j)] for j in torch.randint(0, len(words), (n,), generator=g))
        half = len(text) // 2
        rows.append(to_example({"prompt": text[:half], "completion": text[half:]}, i, "bench"))
    items = [tokenize_example(e, tok, TokenizeSpec(max_length=seq)) for e in rows]
    return collate(items, tok.pad_token_id)


def tiny_setup(hidden=64, layers=2, dora=False):
    from peft import LoraConfig, get_peft_model

    from gradian.models.load import prepare_lora_for_gradients
    from gradian.models.tiny import default_targets, tiny_model, train_tokenizer

    corpus = ["The capital of France is Paris. Iron is a metal. The river runs north of the city."] * 50
    tok = train_tokenizer(corpus, vocab_size=1000)
    model = tiny_model(tok, "llama", hidden=hidden, layers=layers, heads=4)
    pm = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=default_targets("llama"), use_dora=dora))
    prepare_lora_for_gradients(pm)
    kind = "DoRA" if dora else "LoRA"
    return f"Llama from config ({hidden} hidden, {layers} layers, {kind} r=8 on all 7 linears)", pm, tok


def smollm2_setup(dora=False):
    from peft import LoraConfig, get_peft_model

    from gradian.models.load import ModelSpec, load_base, prepare_lora_for_gradients
    from gradian.worlds.smollm2 import materialise_smollm2

    folder = materialise_smollm2()
    model, tok = load_base(ModelSpec(str(folder)))
    pm = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], use_dora=dora))
    prepare_lora_for_gradients(pm)
    return f"SmolLM2-135M ({'DoRA' if dora else 'LoRA'} r=8 on q_proj, v_proj)", pm, tok


def run(name, model, tok, batch_sizes, seq, repeats, methods):
    print(f"\n## {name}, sequence length ≤ {seq}, torch threads = {torch.get_num_threads()}\n")
    print(
        "| batch | plain fwd+bwd (s) | hooks (s) | loop (s) | vmap (s) | hooks / plain | loop / hooks | vmap / hooks |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for b in batch_sizes:
        batch = make_batch(tok, b, seq)
        fns = {"plain": lambda batch=batch: plain_forward_backward(model, batch)}
        for m in methods:
            fns[m] = lambda m=m, batch=batch: per_example_grads(model, batch, m)
        t = timed_round_robin(fns, repeats)

        def f(k: str, t: dict[str, float] = t) -> str:
            return f"{t[k]:.4f}" if k in t else "—"

        def r(a: str, c: str, t: dict[str, float] = t) -> str:
            return f"{t[a] / t[c]:.2f}x" if a in t and c in t else "—"

        print(
            f"| {b} | {f('plain')} | {f('hooks')} | {f('loop')} | {f('vmap')} "
            f"| {r('hooks', 'plain')} | {r('loop', 'hooks')} | {r('vmap', 'hooks')} |"
        )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--smollm2", action="store_true", help="also run on SmolLM2-135M (slow)")
    ap.add_argument("--dora", action="store_true", help="DoRA adapters (use_dora) instead of plain LoRA")
    args = ap.parse_args()
    bs = [int(x) for x in args.batch_sizes.split(",")]
    torch.manual_seed(0)
    three = ["hooks", "loop", "vmap"]
    run(*tiny_setup(64, 2, args.dora), bs, args.seq, args.repeats, three)  # the test-suite's tiny model
    run(*tiny_setup(256, 4, args.dora), bs, args.seq, args.repeats, three)
    if args.smollm2:
        run(*smollm2_setup(args.dora), bs, args.seq, max(1, args.repeats // 3), ["hooks", "loop"])


if __name__ == "__main__":
    main()
