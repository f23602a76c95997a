"""HF ``TrainingArguments`` JSON/YAML (``training_args.to_json_string()``): read like a TRL config (same names)."""

from __future__ import annotations

from gradian.audit.config import trl
from gradian.audit.config.hf_args import HF_DEFAULTS
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

DEFAULTS = HF_DEFAULTS

FORMAT = Format(
    name="hf", title="HF TrainingArguments", read=trl.read, order=20, fallback=KEYS, trainer="hf", defaults=DEFAULTS
)
