"""torchtune YAML: ``_component_`` entries (``model``, ``tokenizer``, ``dataset``, ``loss`` ...).

A dataset builder's own defaults count (``alpaca_dataset`` trains on the prompt unless ``train_on_input: false``).
"""

from __future__ import annotations

from typing import Any

from gradian.audit.config.model import TrainConfig
from gradian.audit.config.reader import Format, Reader, set_many

DEFAULTS = {
    "save_adapter_weights_only": False,  # recipes/lora_finetune_single_device.py: cfg.get(..., False)
    "train_on_inputs": False,
    "packing": False,
    "gradient_accumulation_steps": 1,
    "truncation": "truncate",
    "stage": "sft",
}


def _has_component(obj: Any, depth: int = 0) -> bool:
    """True when a ``_component_`` key is at most two levels down."""
    if isinstance(obj, dict):
        if "_component_" in obj:
            return True
        return depth < 2 and any(_has_component(v, depth + 1) for v in obj.values())
    if isinstance(obj, list):
        return depth < 2 and any(_has_component(v, depth + 1) for v in obj)
    return False


# torchtune dataset builders: what each does when the config leaves a field unset
# (torchtune/datasets/*.py; alpaca_cleaned_dataset is partial(alpaca_dataset, ...)).
_TT_TRAIN_ON_INPUT = {
    "alpaca_dataset": True,
    "alpaca_cleaned_dataset": True,
    "chat_dataset": False,
    "instruct_dataset": False,
    "grammar_dataset": False,
    "samsum_dataset": False,
    "slimorca_dataset": False,
}
_TT_STAGE = {
    "text_completion_dataset": "pt",
    "wikitext_dataset": "pt",
    "cnn_dailymail_articles_dataset": "pt",
    "preference_dataset": "dpo",
    "stack_exchange_paired_dataset": "dpo",
    "hh_rlhf_helpful_dataset": "dpo",
}


def _tt_loss_stage(leaf: str) -> str | None:
    low = leaf.lower()
    for key, stage in (
        ("simpo", "simpo"),
        ("grpo", "grpo"),
        ("ppo", "ppo"),
        ("ipo", "ipo"),
        ("rso", "dpo"),
        ("dpo", "dpo"),
    ):
        if key in low:
            return stage
    return None


def read(cfg: TrainConfig, r: Reader) -> None:
    """Read a torchtune config into ``cfg`` (a dataset builder's own defaults count as the run's settings)."""
    comp = str(r.get("model._component_") or "")
    if comp:
        leaf = comp.rsplit(".", 1)[-1].lower()
        ft = "qlora" if leaf.startswith("qlora") else "lora" if "lora" in leaf else "full"
        cfg.set("finetuning", ft, r.where("model._component_"))
        cfg.set("base_model", comp, r.where("model._component_"))
    set_many(
        cfg,
        r,
        [
            ("learning_rate", "optimizer.lr", "num"),
            ("num_epochs", "epochs", "num"),
            ("micro_batch_size", "batch_size", "int"),
            ("gradient_accumulation_steps", "gradient_accumulation_steps", "int"),
            ("shuffle", "shuffle", "bool"),
            ("max_steps_per_epoch", "max_steps_per_epoch", "int"),
            ("warmup_steps", "lr_scheduler.num_warmup_steps", "num"),
            ("max_grad_norm", "clip_grad_norm", "num"),
            ("max_length", "tokenizer.max_seq_len", "int"),
            ("lora_r", "model.lora_rank", "int"),
            ("lora_alpha", "model.lora_alpha", "num"),
            ("lora_dropout", "model.lora_dropout", "num"),
            ("use_dora", "model.use_dora", "bool"),
            ("load_in_4bit", "model.quantize_base", "bool"),
            ("device", "device", "str"),
            ("save_adapter_weights_only", "save_adapter_weights_only", "bool"),
            ("checkpoint_model_type", "checkpointer.model_type", "str"),
        ],
    )
    if r.has("lr_scheduler._component_"):
        cfg.set(
            "lr_scheduler",
            str(r.get("lr_scheduler._component_")).rsplit(".", 1)[-1],
            r.where("lr_scheduler._component_"),
        )
    dtype = r.str_("dtype")
    if dtype:
        cfg.set("bf16", dtype in ("bf16", "bfloat16"), r.where("dtype"))
        cfg.set("fp16", dtype in ("fp16", "float16"), r.where("dtype"))
    mods = r.get("model.lora_attn_modules")
    if isinstance(mods, list):
        targets = [str(m) for m in mods]
        if r.bool_("model.apply_lora_to_mlp"):
            targets += ["w1", "w2", "w3"]
        if r.bool_("model.apply_lora_to_output"):
            targets += ["output"]
        cfg.set("lora_target_modules", targets, r.where("model.lora_attn_modules"))
    loss = r.get("loss._component_")
    if isinstance(loss, str) and _tt_loss_stage(loss.rsplit(".", 1)[-1]):
        cfg.set("stage", _tt_loss_stage(loss.rsplit(".", 1)[-1]), r.where("loss._component_"))
        if r.has("loss.beta"):  # torchtune.rlhf.loss.DPOLoss(beta=0.1) in recipes/configs/llama3_1/8B_lora_dpo.yaml
            cfg.set("beta", r.num("loss.beta"), r.where("loss.beta"))
    ds = r.get("dataset")
    dss = ds if isinstance(ds, list) else [ds] if isinstance(ds, dict) else []
    for i, d in enumerate(dss):
        key = f"dataset[{i}]" if isinstance(ds, list) else "dataset"
        if not isinstance(d, dict):
            continue
        dr = Reader(d, r.path)
        comp = d.get("_component_")
        leaf = comp.rsplit(".", 1)[-1] if isinstance(comp, str) else ""
        if "train_on_input" in d:
            cfg.set("train_on_inputs", dr.bool_("train_on_input"), r.where(f"{key}.train_on_input"))
        elif leaf in _TT_TRAIN_ON_INPUT:
            # the builder's own default is the run's setting: it counts as config, not as an unset default
            v = _TT_TRAIN_ON_INPUT[leaf]
            cfg.set("train_on_inputs", v, f"{r.where(key + '._component_')} ({leaf} defaults to train_on_input={v})")
        if "packed" in d:
            cfg.set("packing", dr.bool_("packed"), r.where(f"{key}.packed"))
        elif leaf:
            cfg.set("packing", False, f"{r.where(key + '._component_')} ({leaf} defaults to packed=False)")
        if leaf in _TT_STAGE:
            cfg.set("stage", _TT_STAGE[leaf], f"{r.where(key + '._component_')} ({leaf})")
    if cfg.max_length is None and r.has("tokenizer._component_"):
        cfg.set("truncation", "none", r.where("tokenizer.max_seq_len") + " (unset: no truncation)")


FORMAT = Format(
    name="torchtune",
    title="torchtune",
    read=read,
    order=3,
    claims=_has_component,
    trainer="torchtune",
    defaults=DEFAULTS,
)
