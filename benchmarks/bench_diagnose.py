"""Benchmark: `gradian diagnose` over a generated 10,000-row dataset with a tokenizer.

    python benchmarks/bench_diagnose.py [--rows 10000] [--eval-rows 500] [--vocab 8000] [--target 10]

Builds (outside the timed region) a realistic SFT run on disk: 10,000 rows (TRL conversational
prompt/completion with a system turn, rendered through the chat template; ``--plain`` for plain
prompt/completion strings), a 500-row
eval set, a TRL config, a trainer_state.json, and a byte-level BPE tokenizer trained in-process
(gradian.models.tiny.train_tokenizer, ChatML template) saved as a model folder. Then times
``gradian.audit.diagnose`` on the paths, end to end: reading the files, loading the tokenizer
folder, tokenising every row exactly as the trainer does, and all 53 checks. Prints the wall
time, the per-stage split, and whether it met the target (exit code 1 if not).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import tempfile
import time
from pathlib import Path

TOPICS = ("river mountain library engine garden market harbor forest bridge museum orchard factory village island "
          "desert glacier castle canal valley station").split()
ADJ = ("quiet ancient busy remote modern narrow wide famous hidden coastal northern southern eastern western small "
       "large old new bright dark").split()
NOUNS = "walls roads workers visitors trees boats rooms tools maps records stones birds clocks lamps songs".split()
VERBS = "describe explain summarise compare list outline evaluate justify predict classify".split()
LINK = "because although while after before since unless whereas so yet".split()


def sentence(rng: random.Random) -> str:
    parts = [f"the {rng.choice(ADJ)} {rng.choice(TOPICS)} {rng.choice(['has', 'keeps', 'shows', 'needs'])} "
             f"{rng.randint(2, 999)} {rng.choice(ADJ)} {rng.choice(NOUNS)}" for _ in range(rng.randint(1, 3))]
    s = f" {rng.choice(LINK)} ".join(parts)
    return s[0].upper() + s[1:] + "."


def make_rows(n: int, seed: int, prefix: str, plain: bool = False) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        q = f"{rng.choice(VERBS).capitalize()} the {rng.choice(ADJ)} {rng.choice(TOPICS)} number {i}. {sentence(rng)}"
        a = " ".join(sentence(rng) for _ in range(rng.randint(2, 8)))
        if plain:
            rows.append({"id": f"{prefix}{i}", "prompt": q + "\n", "completion": a})
        else:
            rows.append({"id": f"{prefix}{i}",
                         "prompt": [{"role": "system", "content": "You are a careful writer."},
                                    {"role": "user", "content": q}],
                         "completion": [{"role": "assistant", "content": a}]})
    return rows


def trainer_state(n_rows: int, batch: int = 16, epochs: int = 2, lr: float = 2e-4) -> dict:
    rng = random.Random(0)
    spe = math.ceil(n_rows / batch)
    total = spe * epochs
    warm = math.ceil(0.05 * total)
    hist = []
    for s in range(10, total + 1, 10):
        f = s / total
        lr_s = lr * s / warm if s < warm else lr * 0.5 * (1 + math.cos(math.pi * (s - warm) / (total - warm)))
        hist.append({"epoch": s / spe, "grad_norm": 0.8 + rng.uniform(-0.1, 0.1), "learning_rate": lr_s,
                     "loss": 1.1 + math.exp(-4 * f) + rng.uniform(-0.03, 0.03), "step": s})
        if s % 100 == 0:
            hist.append({"epoch": s / spe, "eval_loss": 1.25 + 0.9 * math.exp(-4 * f), "step": s})
    hist.append({"epoch": float(epochs), "step": total, "train_loss": 1.4, "train_runtime": 1000.0})
    return {"global_step": total, "max_steps": total, "num_train_epochs": epochs, "log_history": hist}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--eval-rows", type=int, default=500)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--target", type=float, default=10.0)
    ap.add_argument("--plain", action="store_true", help="plain prompt/completion strings instead of chat rows")
    ap.add_argument("--repeat", type=int, default=1, help="run diagnose this many times (the first pays imports)")
    args = ap.parse_args()

    t0 = time.perf_counter()
    from gradian.audit import diagnose
    from gradian.models.tiny import train_tokenizer

    root = Path(tempfile.mkdtemp(prefix="gradian_bench_"))
    rows = make_rows(args.rows, 0, "r", args.plain)
    ev = make_rows(args.eval_rows, 1, "e", args.plain)
    for name, rs in (("train.jsonl", rows), ("eval.jsonl", ev)):
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rs))
    corpus = [r["completion"] if isinstance(r["completion"], str) else r["completion"][0]["content"]
              for r in rows[:4000]]
    tok = train_tokenizer(corpus, vocab_size=args.vocab)
    tok.save_pretrained(str(root / "tok"))
    (root / "tok" / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 8192,
                                                          "vocab_size": len(tok), "torch_dtype": "bfloat16"}))
    (root / "sft.json").write_text(json.dumps({
        "output_dir": "out", "learning_rate": 2e-4, "num_train_epochs": 2, "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 4, "warmup_ratio": 0.05, "lr_scheduler_type": "cosine", "max_length": 1024,
        "completion_only_loss": True, "bf16": True, "eval_strategy": "steps", "eval_steps": 100,
        "save_steps": 100, "use_peft": True, "lora_r": 16, "lora_alpha": 32, "lora_target_modules": "all-linear"}))
    (root / "trainer_state.json").write_text(json.dumps(trainer_state(args.rows)))
    t_prep = time.perf_counter() - t0

    walls = []
    for _ in range(max(1, args.repeat)):
        t1 = time.perf_counter()
        res = diagnose(data=root / "train.jsonl", eval=root / "eval.jsonl", configs=[root / "sft.json"],
                       logs=root / "trainer_state.json", tokenizer=root / "tok")
        walls.append(time.perf_counter() - t1)
    wall = walls[0]

    c = res.counts
    n_tokens = res.inputs.get("token_view", {})
    print(f"rows {args.rows} (+{args.eval_rows} eval), tokenizer vocab {len(tok)}, "
          f"TOKENIZERS_PARALLELISM={os.environ.get('TOKENIZERS_PARALLELISM', 'unset')}, cpus {os.cpu_count()}")
    print(f"setup (generate + train tokenizer, untimed): {t_prep:.2f} s")
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    print(f"diagnose wall time: {wall:.2f} s  (target < {args.target:g} s: {'met' if wall < args.target else 'MISSED'}; "
          f"1-min load average {load:.1f})")
    if len(walls) > 1:
        print("repeats (imports warm): " + ", ".join(f"{w:.2f} s" for w in walls[1:]))
    print(f"checks {c['checks']}: {c['error']} errors, {c['warning']} warnings, {c['info']} info, "
          f"{c['passed']} passed, {c['skipped']} skipped; token view {n_tokens}")
    for f in res.findings:
        print(f"  {f.severity} {f.id} {f.message}")
    return 0 if wall < args.target else 1


if __name__ == "__main__":
    sys.exit(main())
