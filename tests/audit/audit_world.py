"""Builders for the Audit tests: a clean, realistic LoRA SFT run (data, eval, config, logs, tokenizer).

The clean run: 600 prompt/completion rows of varied instruction-following text, completion-only
loss, EOS appended by the trainer, sensible LoRA hyperparameters (r 16, alpha 32, lr 2e-4,
2 epochs, effective batch 16, 5% warmup, cosine), a held-out eval set, and a smooth trainer_state.json.
Fixtures that fire a check start from these and break one thing.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

TOPICS = [
    "river",
    "mountain",
    "library",
    "engine",
    "garden",
    "market",
    "harbor",
    "forest",
    "bridge",
    "museum",
    "orchard",
    "factory",
    "village",
    "island",
    "desert",
    "glacier",
    "castle",
    "canal",
    "valley",
    "station",
]
VERBS = ["describe", "explain", "summarise", "compare", "list", "outline", "evaluate", "justify", "predict", "classify"]
ADJ = [
    "quiet",
    "ancient",
    "busy",
    "remote",
    "modern",
    "narrow",
    "wide",
    "famous",
    "hidden",
    "coastal",
    "northern",
    "southern",
    "eastern",
    "western",
    "small",
    "large",
    "old",
    "new",
    "bright",
    "dark",
]
NOUNS = [
    "walls",
    "roads",
    "workers",
    "visitors",
    "trees",
    "boats",
    "rooms",
    "tools",
    "maps",
    "records",
    "stones",
    "birds",
    "clocks",
    "lamps",
    "songs",
    "stories",
    "rules",
    "prices",
    "seasons",
    "colours",
]
LINK = ["because", "although", "while", "after", "before", "since", "unless", "whereas", "so", "yet"]
STOP = ["the", "a", "of", "to", "and", "in", "is", "it", "for", "with", "on", "this", "that", "was", "are", "by"]


def sentence(rng: random.Random, n_clauses: int = 2) -> str:
    parts = []
    for _ in range(n_clauses):
        parts.append(
            f"the {rng.choice(ADJ)} {rng.choice(TOPICS)} {rng.choice(['has', 'keeps', 'shows', 'needs', 'loses'])} "
            f"{rng.randint(2, 999)} {rng.choice(ADJ)} {rng.choice(NOUNS)} {rng.choice(STOP)} "
            f"{rng.choice(NOUNS)}"
        )
    s = f" {rng.choice(LINK)} ".join(parts)
    return s[0].upper() + s[1:] + "."


def make_rows(n: int = 600, seed: int = 0, kind: str = "pc", id_prefix: str = "r") -> list[dict]:
    """n clean rows; kind 'pc' (prompt/completion strings) or 'messages'."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        topic = rng.choice(TOPICS)
        q = (
            f"{rng.choice(VERBS).capitalize()} the {rng.choice(ADJ)} {topic} number {i} in "
            f"{rng.randint(3, 7)} sentences. {sentence(rng, 1)}\n"
        )
        a = " ".join(sentence(rng, rng.randint(1, 3)) for _ in range(rng.randint(2, 5)))
        if kind == "messages":
            rows.append(
                {
                    "id": f"{id_prefix}{i}",
                    "messages": [{"role": "user", "content": q.strip()}, {"role": "assistant", "content": a}],
                }
            )
        else:
            rows.append({"id": f"{id_prefix}{i}", "prompt": q, "completion": a})
    return rows


def as_messages(rows: list[dict]) -> list[dict]:
    """Prompt/completion rows as 'messages' rows (the prompt stripped, one user and one assistant turn), same ids."""
    return [
        {
            "id": r["id"],
            "messages": [
                {"role": "user", "content": r["prompt"].strip()},
                {"role": "assistant", "content": r["completion"]},
            ],
        }
        for r in rows
    ]


def as_conversational(rows: list[dict]) -> list[dict]:
    """Prompt/completion rows in TRL's conversational prompt/completion form (one user turn, one assistant turn)."""
    return [
        {
            "id": r["id"],
            "prompt": [{"role": "user", "content": r["prompt"].strip()}],
            "completion": [{"role": "assistant", "content": r["completion"]}],
        }
        for r in rows
    ]


def clean_trl_config(**over) -> dict:
    cfg = {
        "output_dir": "out",
        "model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "learning_rate": 2e-4,
        "num_train_epochs": 2,
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 4,
        "warmup_ratio": 0.05,
        "lr_scheduler_type": "cosine",
        "max_length": 512,
        "packing": False,
        "completion_only_loss": True,
        "bf16": True,
        "eval_strategy": "steps",
        "eval_steps": 15,
        "save_strategy": "steps",
        "save_steps": 15,
        "logging_steps": 5,
        "use_peft": True,
        "lora_r": 16,
        "lora_alpha": 32,
        "lora_dropout": 0.05,
        "lora_target_modules": "all-linear",
    }
    cfg.update(over)
    return cfg


def clean_trainer_state(
    n_rows: int = 600,
    batch: int = 16,
    epochs: int = 2,
    lr: float = 2e-4,
    logging_steps: int = 5,
    eval_steps: int = 15,
    seed: int = 0,
) -> dict:
    """A smooth run: loss decays from ~2.1 to ~1.1 with small noise, eval loss decreases, cosine lr."""
    rng = random.Random(seed)
    spe = math.ceil(n_rows / batch)
    total = spe * epochs
    warm = math.ceil(0.05 * total)
    hist = []
    for s in range(logging_steps, total + 1, logging_steps):
        f = s / total
        lr_s = lr * s / warm if s < warm else lr * 0.5 * (1 + math.cos(math.pi * (s - warm) / (total - warm)))
        loss = 1.1 + 1.0 * math.exp(-4 * f) + rng.uniform(-0.03, 0.03)
        hist.append(
            {
                "epoch": round(s / spe, 4),
                "grad_norm": 0.8 + rng.uniform(-0.1, 0.1),
                "learning_rate": lr_s,
                "loss": round(loss, 4),
                "mean_token_accuracy": 0.55 + 0.1 * f,
                "step": s,
            }
        )
        if s % eval_steps == 0:
            hist.append(
                {
                    "epoch": round(s / spe, 4),
                    "eval_loss": round(1.25 + 0.9 * math.exp(-4 * f), 4),
                    "eval_runtime": 1.0,
                    "step": s,
                }
            )
    hist.append(
        {
            "epoch": float(epochs),
            "step": total,
            "total_flos": 1e12,
            "train_loss": 1.4,
            "train_runtime": 100.0,
            "train_samples_per_second": 12.0,
        }
    )
    return {
        "best_metric": None,
        "epoch": float(epochs),
        "eval_steps": eval_steps,
        "global_step": total,
        "is_hyper_param_search": False,
        "logging_steps": logging_steps,
        "max_steps": total,
        "num_train_epochs": epochs,
        "save_steps": eval_steps,
        "train_batch_size": 4,
        "log_history": hist,
    }


def corpus_for_tokenizer(rows: list[dict]) -> list[str]:
    out = []
    for r in rows:
        if "messages" in r:
            out += [m["content"] for m in r["messages"]]
        else:
            out += [r.get("prompt", ""), r.get("completion", "")]
    return out


def save_tokenizer(tok, folder: Path, max_positions: int = 2048, gen_eos: list[int] | None = None) -> Path:
    """Save a tokenizer as a model folder would hold it (tokenizer files + a config.json)."""
    folder.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(folder))
    cfg = {
        "model_type": "llama",
        "max_position_embeddings": max_positions,
        "vocab_size": len(tok),
        "torch_dtype": "bfloat16",
        "eos_token_id": tok.eos_token_id,
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    if gen_eos is not None:
        (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": gen_eos}))
    return folder
