"""LLaMA-Factory v1 YAML (``llamafactory-cli sft|dpo|rm config.yaml``).

Keys: ``model``, ``peft_config``, ``cutoff_len``, ``micro_batch_size`` ...
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gradian.audit.config.hf_args import LORA_ARGS, PEFT_NAMES, read_max_steps
from gradian.audit.config.model import TrainConfig
from gradian.audit.config.reader import Format, Reader, set_many

#: Keys only a LLaMA-Factory v1 config has (detection, with ``cutoff_len`` or ``model``).
KEYS = frozenset(
    {
        "peft_config",
        "model_class",
        "train_dataset",
        "kernel_config",
        "dist_config",
        "quant_config",
        "sample_backend",
        "global_batch_size",
        "batching_strategy",
        "optim_config",
        "lr_scheduler_config",
    }
)

DEFAULTS = {
    "finetuning": "full",
    "micro_batch_size": 1,
    "max_length": 2048,
    "learning_rate": 1e-4,
    "num_epochs": 3.0,
    "max_grad_norm": 1.0,
    "bf16": True,
    "truncation": "truncate",
    "train_on_inputs": False,
    "packing": False,
    "gradient_accumulation_steps": 1,
    "lora_r": 8,
    "lora_alpha": 16,
    "lora_target_modules": "all",
}


#: The ``peft_config`` keys read (PEFT ``LoraConfig`` names): r, lora_alpha, lora_dropout, target_modules.
_PEFT_CONFIG_KEYS = {**PEFT_NAMES, "lora_modules_to_save": None, "use_rslora": None, "use_dora": None}


def _claims(raw: dict[str, Any]) -> bool:
    keys = set(raw)
    return (
        bool(keys & KEYS)
        and ("cutoff_len" in keys or "model" in keys)
        and not keys & {"stage", "finetuning_type", "base_model", "sequence_len"}
    )


def read(cfg: TrainConfig, r: Reader) -> None:
    """LLaMA-Factory v1 (``llamafactory-cli sft|dpo|rm config.yaml``): ``model``, ``peft_config``, ``cutoff_len`` ..."""
    set_many(
        cfg,
        r,
        [
            ("base_model", "model", "str"),
            ("learning_rate", "learning_rate", "num"),
            ("num_epochs", "num_train_epochs", "num"),
            ("micro_batch_size", "micro_batch_size", "int"),
            ("total_batch_size", "global_batch_size", "int"),
            ("max_length", "cutoff_len", "int"),
            ("max_grad_norm", "max_grad_norm", "num"),
            ("bf16", "bf16", "bool"),
            ("chat_template", "template", "str"),
        ],
    )
    read_max_steps(cfg, r)
    quant = r.get("quant_config")
    bits = None
    if isinstance(quant, dict):
        bits = r.int_("quant_config.quantization_bit") or 4  # v1 defaults to 4-bit when a quant_config is given
        cfg.set("load_in_4bit" if bits == 4 else "load_in_8bit", True, r.where("quant_config"))
    pc = r.get("peft_config")
    if isinstance(pc, dict):
        name = (r.str_("peft_config.name") or "").lower()
        if name == "lora":
            cfg.set("finetuning", "qlora" if bits else "lora", r.where("peft_config.name"))
            set_many(cfg, r, LORA_ARGS, _PEFT_CONFIG_KEYS, prefix="peft_config.")
        elif name:
            cfg.set("finetuning", "full" if name == "full" else name, r.where("peft_config.name"))
    mc = (r.str_("model_class") or "").lower()
    if mc == "cls":
        cfg.set("stage", "rm", f"{r.where('model_class')} (a classification head: reward modelling)")
    else:
        cfg.notes.append(
            f"{Path(r.path).name}: a LLaMA-Factory v1 config does not say its stage (it is the "
            "llamafactory-cli command: sft, dpo or rm); the SFT rules were applied"
        )


FORMAT = Format(
    name="llamafactory_v1",
    title="LLaMA-Factory v1",
    read=read,
    order=2,
    claims=_claims,
    trainer="llamafactory",
    trainer_note="format: LLaMA-Factory v1",
    defaults=DEFAULTS,
)
