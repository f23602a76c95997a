"""The HF ``TrainingArguments`` field table (and TRL ``ModelConfig``'s LoRA fields), one for three formats.

TRL, LLaMA-Factory and axolotl each read these rows under their own key names (see :func:`read_hf_args`) and add
their own keys. PEFT's ``adapter_config.json`` and LLaMA-Factory v1's ``peft_config`` read the LoRA rows under
PEFT's names (:data:`PEFT_NAMES`).
"""

from __future__ import annotations

import json
from typing import Mapping

from gradian.audit.config.model import TrainConfig
from gradian.audit.config.reader import Reader, Row, set_many

#: ``TrainingArguments`` (plus ``model_name_or_path``): (TrainConfig field, TRL/HF key, kind).
HF_ARGS: tuple[Row, ...] = (
    ("base_model", "model_name_or_path", "str"),
    ("learning_rate", "learning_rate", "num"),
    ("num_epochs", "num_train_epochs", "num"),
    ("micro_batch_size", "per_device_train_batch_size", "int"),
    ("gradient_accumulation_steps", "gradient_accumulation_steps", "int"),
    ("warmup_ratio", "warmup_ratio", "num"),
    ("lr_scheduler", "lr_scheduler_type", "str"),
    ("max_grad_norm", "max_grad_norm", "num"),
    ("bf16", "bf16", "bool"),
    ("fp16", "fp16", "bool"),
    ("eval_steps", "eval_steps", "num"),
    ("save_strategy", "save_strategy", "str"),
    ("save_steps", "save_steps", "num"),
    ("load_best_model_at_end", "load_best_model_at_end", "bool"),
    ("group_by_length", "group_by_length", "bool"),
    ("seed", "seed", "int"),
    ("data_seed", "data_seed", "int"),
    ("dataloader_drop_last", "dataloader_drop_last", "bool"),
    ("train_sampling_strategy", "train_sampling_strategy", "str"),
)

#: ``TrainingArguments``' own defaults for the fields above (transformers 4.x/5.x): what an HF Trainer, and a
#: trainer built on it, applies to a field the file leaves unset.
HF_DEFAULTS: dict[str, object] = {
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
    "seed": 42,
    "dataloader_drop_last": False,
}

#: The LoRA and quantisation fields, in TRL ``ModelConfig`` names.
LORA_ARGS: tuple[Row, ...] = (
    ("lora_r", "lora_r", "int"),
    ("lora_alpha", "lora_alpha", "num"),
    ("lora_dropout", "lora_dropout", "num"),
    ("lora_target_modules", "lora_target_modules", "list"),
    ("modules_to_save", "lora_modules_to_save", "list"),
    ("use_rslora", "use_rslora", "bool"),
    ("use_dora", "use_dora", "bool"),
    ("load_in_4bit", "load_in_4bit", "bool"),
    ("load_in_8bit", "load_in_8bit", "bool"),
)

#: PEFT ``LoraConfig``'s names for the :data:`LORA_ARGS` keys (TRL's ``ModelConfig`` prefixes its LoRA fields;
#: None: not a ``LoraConfig`` field). ``adapter_config.json`` and LLaMA-Factory v1's ``peft_config`` use them.
PEFT_NAMES: dict[str, str | None] = {
    "lora_r": "r",
    "lora_target_modules": "target_modules",
    "lora_modules_to_save": "modules_to_save",
    "load_in_4bit": None,
    "load_in_8bit": None,
}


def read_max_steps(cfg: TrainConfig, r: Reader) -> None:
    """Set ``max_steps`` when the file gives a positive one (-1, HF's default, means: train for the epochs)."""
    ms = r.int_("max_steps")
    if ms is not None and ms > 0:
        cfg.set("max_steps", ms, r.where("max_steps"))


def read_hf_args(
    cfg: TrainConfig,
    r: Reader,
    keys: Mapping[str, str | None] | None = None,
    eval_keys: tuple[str, ...] = ("eval_strategy", "evaluation_strategy"),
) -> None:
    """Read :data:`HF_ARGS` and :data:`LORA_ARGS`, ``max_steps`` and the eval strategy.

    Args:
        cfg: the config being filled.
        r: the file.
        keys: the format's own name for a TRL/HF key (``{"num_train_epochs": "num_epochs"}``), None for a key
            the format does not have.
        eval_keys: the keys that may name the eval strategy (all are read, in order).

    """
    set_many(cfg, r, HF_ARGS + LORA_ARGS, keys)
    read_max_steps(cfg, r)
    acc = r.get("accelerator_config") if r.has("accelerator_config") else None
    if isinstance(acc, str):  # TrainingArguments also takes it as a JSON string
        try:
            acc = json.loads(acc)
        except ValueError:
            acc = None
    if isinstance(acc, dict) and isinstance(acc.get("use_seedable_sampler"), bool):
        cfg.set("use_seedable_sampler", acc["use_seedable_sampler"], r.where("accelerator_config"))
    for key in eval_keys:
        if r.has(key):
            cfg.set("eval_strategy", str(r.get(key)).lower().replace("intervalstrategy.", ""), r.where(key))
