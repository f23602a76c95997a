"""PEFT ``adapter_config.json`` (or the adapter folder: its README's "Framework versions" give library versions)."""

from __future__ import annotations

from typing import Any

from gradian.audit.config.hf_args import LORA_ARGS, PEFT_NAMES
from gradian.audit.config.model import TrainConfig
from gradian.audit.config.reader import Format, Reader, set_many

DEFAULTS = {"lora_r": 8, "lora_alpha": 8, "lora_dropout": 0.0, "use_rslora": False, "use_dora": False}


def _claims(raw: dict[str, Any]) -> bool:
    return "peft_type" in raw


def _after_defaults(cfg: TrainConfig) -> None:
    if "peft" in cfg.formats and cfg.finetuning is None:
        cfg.set("finetuning", "lora", "adapter_config.json (peft_type)")


def read(cfg: TrainConfig, r: Reader) -> None:
    """Read a PEFT ``adapter_config.json`` into ``cfg`` (its ``peft_version`` too)."""
    pt = str(r.get("peft_type") or "").upper()
    if pt not in ("LORA",):
        cfg.set("finetuning", pt.lower() or "unknown", r.where("peft_type"))
    else:
        cfg.set("finetuning", "lora", r.where("peft_type"))
    set_many(cfg, r, (("base_model", "base_model_name_or_path", "str"), *LORA_ARGS), PEFT_NAMES)
    if isinstance(cfg.modules_to_save, str):
        cfg.modules_to_save = [cfg.modules_to_save]
    if r.get("trainable_token_indices"):
        cfg.set("trainable_token_indices", r.get("trainable_token_indices"), r.where("trainable_token_indices"))
    pv = r.str_("peft_version")
    if pv:
        cfg.versions.setdefault("peft", pv)


FORMAT = Format(
    name="peft",
    title="PEFT LoraConfig",
    read=read,
    order=0,
    claims=_claims,
    defaults=DEFAULTS,
    after_defaults=_after_defaults,
)
