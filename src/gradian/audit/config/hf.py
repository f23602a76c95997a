"""HF ``TrainingArguments`` JSON/YAML (``training_args.to_json_string()``): read like a TRL config (same names)."""

from __future__ import annotations

from gradian.audit.config import trl
from gradian.audit.config.reader import Format

#: TrainingArguments keys: a file with one of them, and no other format's keys, is this format.
KEYS = frozenset(
    {
        "output_dir",
        "per_device_train_batch_size",
        "num_train_epochs",
        "learning_rate",
        "gradient_accumulation_steps",
        "eval_strategy",
        "evaluation_strategy",
        "warmup_ratio",
        "lr_scheduler_type",
        "logging_steps",
        "save_steps",
        "max_steps",
        "per_device_eval_batch_size",
    }
)

DEFAULTS = {
    "learning_rate": 5e-5,
    "num_epochs": 3.0,
    "micro_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "lr_scheduler": "linear",
    "warmup_steps": 0,
    "warmup_ratio": 0.0,
    "eval_strategy": "no",
    "save_strategy": "steps",
    "save_steps": 500,
    "load_best_model_at_end": False,
    "group_by_length": False,
    "max_grad_norm": 1.0,
}

FORMAT = Format(
    name="hf", title="HF TrainingArguments", read=trl.read, order=20, fallback=KEYS, trainer="hf", defaults=DEFAULTS
)
