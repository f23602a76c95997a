"""The GPU path, checked and timed in one short run (``benchmarks/gpu_check.sh`` runs it on a lent GPU).

On a Llama built from SmolLM2-135M's config (576 hidden, 30 layers, 9 heads / 3 KV heads, 1536 MLP,
49,152 vocabulary; random weights, so no download) with a LoRA adapter of rank 16 on all seven
projections (``init_lora_weights=False``, so both factors are non-zero):

* **exact**: per-example gradients on CUDA by the hooks, the batch-size-1 loop and vmap, in float32
  and in bfloat16; the largest element-wise gap relative to the largest gradient element,
  ``max|a − b| / max|b|`` over all LoRA blocks;
* **speed**: wall time (``torch.cuda.synchronize`` around each run) of a plain forward+backward
  (the cost of a training step's gradient), the hooks and the loop in bfloat16, at batch 1, 8 and 32,
  interleaved; the ratios say what per-example gradients cost over a training step;
* **cli**: the model saved as a local HF folder, ``gradian train`` (1 epoch on CUDA) and, on its
  adapter, ``gradian index --device cuda --dtype bfloat16`` with the run plan's own projection, by
  row and by sentence (one pass: the sentence units and the row index derived from them), the sentence
  one again with ``--rows-per-forward 8``: wall time, units (the larger index's) and row tokens per
  second from launch to exit (the process start and the model load included); then the row index again
  under ``torchrun --nproc-per-node 1`` (the NCCL process-group path), whose shards must equal the plain
  run's byte for byte.

    python benchmarks/bench_gpu.py --out /tmp/gpu-check          # needs CUDA

One machine has one GPU here, so the two-GPU test (``tests/gradients/test_gpu.py``) is skipped there.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import torch

SMOLLM2_135M = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49152,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    tie_word_embeddings=True,
)
DEVICE = "cuda"  # --device cpu: a slow smoke run of the same script where there is no GPU
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
WORDS = (
    "the capital of france is paris japan tokyo water boils at one hundred degrees iron is a metal with "
    "symbol fe and atomic number twenty six river mountain city north south east west large small old new"
).split()


def rows(n: int, seed: int = 0) -> list[dict]:
    """``n`` prompt/completion rows of 1-6 sentences (so sentence units exist), 10-200 tokens."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        q = " ".join(rng.choices(WORDS, k=rng.randint(3, 10)))
        sents = [
            " ".join(rng.choices(WORDS, k=rng.randint(4, 25))).capitalize() + "." for _ in range(rng.randint(1, 6))
        ]
        out.append({"id": f"r{i}", "prompt": f"Q: {q}?\nA:", "completion": " " + " ".join(sents)})
    return out


def base_model(dtype: torch.dtype = torch.float32):
    """The tokenizer (trained here) and the SmolLM2-shaped base model (seed 0) in ``dtype``, on the CPU."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from gradian.models.tiny import train_tokenizer

    tok = train_tokenizer([r["prompt"] + r["completion"] for r in rows(400)], vocab_size=2048)
    cfg = LlamaConfig(
        **SMOLLM2_135M,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
    )
    torch.manual_seed(0)
    return tok, LlamaForCausalLM(cfg).to(dtype)


def build(work: Path, dtype: torch.dtype):
    """The tokenizer and the SmolLM2-shaped PEFT model (LoRA seed 1) on CUDA in ``dtype``."""
    from peft import LoraConfig, get_peft_model

    from gradian.models.load import prepare_lora_for_gradients

    tok, base = base_model(dtype)
    torch.manual_seed(1)
    pm = get_peft_model(
        base, LoraConfig(r=16, lora_alpha=32, target_modules=TARGETS, init_lora_weights=False, lora_dropout=0.05)
    )
    prepare_lora_for_gradients(pm)
    return tok, pm.to(DEVICE)


def batch_of(tok, b: int, seq: int, seed: int = 0) -> dict:
    from gradian.data.formats import to_example
    from gradian.data.tokenize import TokenizeSpec, collate, tokenize_example

    items = [
        tokenize_example(to_example(r, i, "bench"), tok, TokenizeSpec(max_length=seq))
        for i, r in enumerate(rows(b, seed))
    ]
    return collate(items, tok.pad_token_id)


def rel(a: dict, b: dict) -> float:
    """``max|a − b| / max|b|`` over every block."""
    scale = max(v.abs().max().item() for v in b.values())
    return max((a[k].double() - b[k].double()).abs().max().item() for k in b) / scale


def exact(work: Path) -> list[str]:
    from gradian.gradients import per_example_grads

    out = ["## exact: per-example gradients on CUDA (SmolLM2-135M shape, LoRA r=16 on all 7 projections)", ""]
    out += ["| dtype | batch | hooks vs loop | vmap vs hooks | hooks vs float32 hooks |", "|---|---:|---:|---:|---:|"]
    tok, f32 = build(work, torch.float32)
    batch = batch_of(tok, 8, 256)
    ref = per_example_grads(f32, batch, "hooks")
    loop = per_example_grads(f32, batch, "loop")
    vmap = per_example_grads(f32, batch, "vmap")
    out.append(f"| float32 | 8 | {rel(ref, loop):.2e} | {rel(vmap, ref):.2e} | — |")
    del f32, loop, vmap
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    _, bf16 = build(work, torch.bfloat16)
    hooks = per_example_grads(bf16, batch, "hooks")
    loop = per_example_grads(bf16, batch, "loop")
    assert all(v.dtype == torch.float32 for v in hooks.values())
    out.append(f"| bfloat16 | 8 | {rel(hooks, loop):.2e} | — | {rel(hooks, ref):.2e} |")
    return out


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def synced(fn):
    """``fn`` then a wait for the device, so that a wall clock around it times the GPU's work, not its queueing."""

    def run() -> None:
        fn()
        sync()

    return run


def speed(work: Path, repeats: int, batches: list[int]) -> list[str]:
    from bench_per_example_grads import plain_forward_backward, timed_round_robin
    from gradian.gradients import per_example_grads

    tok, model = build(work, torch.bfloat16)

    out = ["", "## speed: bfloat16 on CUDA, sequences ≤ 256 tokens (median of runs, interleaved)", ""]
    out += ["| batch | plain fwd+bwd (ms) | hooks (ms) | loop (ms) | hooks / plain | loop / hooks |"]
    out += ["|---:|---:|---:|---:|---:|---:|"]
    for b in batches:
        batch = {k: v.to(DEVICE) for k, v in batch_of(tok, b, 256, seed=b).items()}
        fns = {
            "plain": lambda batch=batch: plain_forward_backward(model, batch),
            "hooks": lambda batch=batch: per_example_grads(model, batch, "hooks"),
            "loop": lambda batch=batch: per_example_grads(model, batch, "loop"),
        }
        t = timed_round_robin({k: synced(fn) for k, fn in fns.items()}, repeats)
        out.append(
            f"| {b} | {1e3 * t['plain']:.1f} | {1e3 * t['hooks']:.1f} | {1e3 * t['loop']:.1f} "
            f"| {t['hooks'] / t['plain']:.2f}x | {t['loop'] / t['hooks']:.2f}x |"
        )
    return out


def sha(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*.safetensors"))}


def cli(work: Path, n: int, n_sentence: int, max_gb: float) -> list[str]:
    """``gradian train`` then ``gradian index`` (row, torchrun, sentence) on CUDA, each its own process; each table
    row is printed as soon as it is measured (a run cut short keeps what it measured).
    """
    from gradian.data.formats import to_example
    from gradian.data.tokenize import TokenizeSpec, tokenize_example

    tok, model = base_model()
    base = work / "base"
    model.save_pretrained(base)
    tok.save_pretrained(base)
    del model
    data: dict[str, Path] = {}
    tokens: dict[str, int] = {}
    for name, k in (("train", n), ("sentence", min(n, n_sentence))):
        data[name] = work / f"{name}.jsonl"
        data[name].write_text("".join(json.dumps(r) + "\n" for r in rows(n, seed=7)[:k]))
        tokens[name] = sum(
            len(tokenize_example(to_example(r, i, "bench"), tok, TokenizeSpec(max_length=256)).input_ids)
            for i, r in enumerate(rows(n, seed=7)[:k])
        )
    env = dict(os.environ, HF_HUB_OFFLINE="1", GRADIAN_CACHE=str(work / "cache"), PYTHONUNBUFFERED="1")
    gradian = [sys.executable, "-m", "gradian"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", "-m", "gradian"]
    out: list[str] = []

    def say(*lines: str) -> None:
        out.extend(lines)
        print("\n".join(lines), flush=True)

    def go(name: str, cmd: list[str]) -> float:
        t = time.perf_counter()
        res = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t
        (work / f"{name}.log").write_text(res.stdout + res.stderr)
        if res.returncode != 0:
            raise SystemExit(f"{name} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
        return wall

    say("", f"## cli: on {DEVICE} (SmolLM2-135M shape, LoRA r=16 all-linear), rows ≤ 256 tokens", "")
    say("Each command is a fresh process: its wall time includes the start, the imports and the model load.", "")
    say("| command | rows | row tokens | wall (s) | index rows (+ units) | rows/s | row tokens/s | projection | MB |")
    say("|---|---:|---:|---:|---:|---:|---:|---|---:|")
    adapter = work / "adapter"
    train = [*gradian, "train", "--base", str(base), "--data", str(data["train"]), "--out", str(adapter)]
    train += ["--epochs", "1", "--r", "16", "--alpha", "32", "--targets", ",".join(TARGETS), "--max-length", "256"]
    wall = go("train", [*train, "--device", DEVICE])
    say(
        f"| gradian train, 1 epoch, float32 | {n} | {tokens['train']} | {wall:.1f} | — | {n / wall:.1f} "
        f"| {tokens['train'] / wall:.0f} | — | — |"
    )
    common = ["--base", str(base), "--adapter", str(adapter), "--checkpoints", "final", "--max-length", "256"]
    common += ["--device", DEVICE, "--dtype", "bfloat16", "--max-index-gb", str(max_gb)]
    folders = {}
    for name, launcher, unit, which, extra in (
        ("index-row", gradian, "row", "train", []),
        ("index-row-torchrun", torchrun, "row", "train", []),
        ("index-sentence", gradian, "sentence", "sentence", []),
        ("index-sentence-8-rows-a-forward", gradian, "sentence", "sentence", ["--rows-per-forward", "8"]),
    ):
        folders[name] = work / name
        cmd = [*launcher, "index", *common, "--data", str(data[which]), "--unit", unit, "--out", str(folders[name])]
        cmd += extra
        wall = go(name, cmd)
        mans = [json.loads(m.read_text()) for m in sorted(folders[name].glob("*/manifest.json"))]
        counts = sorted(int(m["n_examples"]) for m in mans)  # the sentence command writes derived rows + units
        proj = json.dumps(mans[0]["grad_spec"].get("projection", {}))
        mb = sum(p.stat().st_size for p in folders[name].rglob("*")) / 1e6
        k = counts[0]
        say(
            f"| {name} | {k} | {tokens[which]} | {wall:.1f} | {' + '.join(map(str, counts))} | {k / wall:.1f} "
            f"| {tokens[which] / wall:.0f} | `{proj}` | {mb:.0f} |"
        )
    same = sha(folders["index-row"]) == sha(folders["index-row-torchrun"])
    say("", f"torchrun (1 rank, NCCL) row shards byte-identical to the plain run: **{same}**")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("/tmp/gradian-gpu-check"))
    ap.add_argument("--rows", type=int, default=256, help="rows of train and the row indexes")
    ap.add_argument("--sentence-rows", type=int, default=64, help="the first rows, for the sentence index")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", default="1,8,32", help="batch sizes of the speed table")
    ap.add_argument(
        "--max-index-gb",
        type=float,
        default=2.0,
        help="the run plan's budget per index command (it picks the projection)",
    )
    ap.add_argument("--parts", default="exact,speed,cli")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a slow smoke run of the script")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_gpu needs CUDA (or --device cpu for a smoke run)")
    args.out.mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 in the exactness table
    head = [
        f"# GPU check: {torch.cuda.get_device_name() if DEVICE == 'cuda' else 'cpu'}, torch {torch.__version__}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "",
    ]
    lines = head
    print("\n".join(head), flush=True)
    parts = {
        "exact": lambda: exact(args.out),
        "speed": lambda: speed(args.out, args.repeats, [int(b) for b in args.batches.split(",")]),
    }
    parts["cli"] = lambda: cli(args.out, args.rows, args.sentence_rows, args.max_index_gb)
    for p in args.parts.split(","):
        t = time.perf_counter()
        new = parts[p]()
        if p != "cli":  # cli prints its rows as it measures them
            print("\n".join(new), flush=True)
        lines += new
        print(f"[{p}] {time.perf_counter() - t:.1f} s", flush=True)
        (args.out / "gpu_check.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
