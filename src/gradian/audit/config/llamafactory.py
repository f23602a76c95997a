"""LLaMA-Factory YAML: ``stage``, ``finetuning_type``, ``cutoff_len``, ``template``, ``lora_rank`` ..."""

from __future__ import annotations

from gradian.audit.config.hf_args import HF_DEFAULTS, read_hf_args
from gradian.audit.config.model import TrainConfig
from gradian.audit.config.reader import Format, Reader, Row, set_many
from gradian.audit.config.trl import KTO_WEIGHTS

#: Keys only a LLaMA-Factory config has (detection).
KEYS = frozenset(
    {
        "stage",
        "finetuning_type",
        "cutoff_len",
        "lora_rank",
        "lora_target",
        "train_on_prompt",
        "val_size",
        "mask_history",
        "neat_packing",
        "template",
        "quantization_bit",
        "preprocessing_num_workers",
        "overwrite_cache",
        "plot_loss",
        "additional_target",
        "new_special_tokens",
    }
)

#: LLaMA-Factory's names for the shared TrainingArguments / LoRA keys (None: it does not read that key).
RENAMED = {
    "lora_r": "lora_rank",
    "lora_target_modules": "lora_target",
    "lora_modules_to_save": "additional_target",
    "load_in_4bit": None,  # LLaMA-Factory says quantization_bit
    "load_in_8bit": None,
}

#: LLaMA-Factory's own keys.
FIELDS: tuple[Row, ...] = (
    ("warmup_steps", "warmup_steps", "num"),
    ("max_length", "cutoff_len", "int"),
    ("train_on_inputs", "train_on_prompt", "bool"),
    ("val_set_size", "val_size", "num"),
    ("max_samples", "max_samples", "int"),
    ("disable_shuffling", "disable_shuffling", "bool"),
    ("chat_template", "template", "str"),
    ("create_new_adapter", "create_new_adapter", "bool"),
    ("ref_model", "ref_model", "str"),
)

DEFAULTS = {
    # hparams/model_args.py QuantizationArguments (0.9.5)
    "quant_type": "nf4",
    "double_quant": True,
    "quant_method": "bnb",
    "finetuning": "lora",
    "lora_r": 8,
    "lora_dropout": 0.0,
    "lora_target_modules": "all",
    "max_length": 2048,
    "truncation": "truncate",
    "train_on_inputs": False,
    "packing": False,
    # its training arguments are HF TrainingArguments: their defaults, for the fields it reads
    **{
        k: HF_DEFAULTS[k]
        for k in (
            "learning_rate",
            "num_epochs",
            "micro_batch_size",
            "gradient_accumulation_steps",
            "lr_scheduler",
            "warmup_steps",
            "warmup_ratio",
        )
    },
    "val_set_size": 0.0,
    "eval_strategy": HF_DEFAULTS["eval_strategy"],
    "stage": "sft",
}


def _after_defaults(cfg: TrainConfig) -> None:
    if cfg.is_lora and cfg.lora_alpha is None and cfg.lora_r:
        cfg.set(
            "lora_alpha", float(cfg.lora_r * 2), "default (LLaMA-Factory: lora_alpha = 2 x lora_rank)", default=True
        )


def read(cfg: TrainConfig, r: Reader) -> None:
    """Read a LLaMA-Factory config into ``cfg``."""
    read_hf_args(cfg, r, RENAMED)
    set_many(cfg, r, FIELDS)
    stage = (r.str_("stage") or "").strip().lower()
    if stage:
        pref = (r.str_("pref_loss") or "").strip().lower()
        if stage == "dpo" and pref in ("orpo", "simpo"):
            cfg.set("stage", pref, r.where("pref_loss"))
        else:
            cfg.set("stage", stage, r.where("stage"))
        if stage in ("dpo", "kto") and r.has("pref_beta"):
            cfg.set("beta", r.num("pref_beta"), r.where("pref_beta"))
        set_many(
            cfg, r, KTO_WEIGHTS, {"desirable_weight": "kto_chosen_weight", "undesirable_weight": "kto_rejected_weight"}
        )
    ad = r.list_("adapter_name_or_path")
    if ad:
        cfg.set("init_adapters", [ad] if isinstance(ad, str) else ad, r.where("adapter_name_or_path"))
    if stage == "pt" and not r.has("packing") and not r.bool_("neat_packing"):
        cfg.set("packing", True, f"{r.where('stage')} (LLaMA-Factory turns packing on for stage pt)")
    ft = r.str_("finetuning_type")
    if ft:
        ft = ft.lower()
        q = r.int_("quantization_bit")
        kind = ("qlora" if q else "lora") if ft == "lora" else "freeze" if ft == "freeze" else "full"
        cfg.set("finetuning", kind, r.where("finetuning_type"))
    qb = r.int_("quantization_bit")
    set_many(
        cfg,
        r,
        [
            ("quant_type", "quantization_type", "str"),
            ("double_quant", "double_quantization", "bool"),
            ("quant_method", "quantization_method", "str"),
        ],
    )
    if qb == 4:
        cfg.set("load_in_4bit", True, r.where("quantization_bit"))
    elif qb == 8:
        cfg.set("load_in_8bit", True, r.where("quantization_bit"))
    if r.bool_("packing") or r.bool_("neat_packing"):
        cfg.set("packing", True, r.where("neat_packing" if r.bool_("neat_packing") else "packing"))
        if r.bool_("neat_packing"):  # rows packed apart (a block-diagonal mask, or flash attention's varlen)
            cfg.set("packing_strategy", "neat", r.where("neat_packing"))
    elif r.has("packing"):
        cfg.set("packing", False, r.where("packing"))
    if r.has("eval_dataset"):
        cfg.set("has_eval_dataset", True, r.where("eval_dataset"))
    ds = r.get("dataset")
    names = [x.strip() for x in ds.split(",")] if isinstance(ds, str) else ds if isinstance(ds, list) else []
    if names:  # resolved against dataset_info.json by gradian.audit.config.lf_dataset_info
        ddir = r.str_("dataset_dir") or "data"
        entries = [{"name": str(n), "index": i, "dataset_dir": ddir} for i, n in enumerate(names) if str(n)]
        cfg.set("datasets", entries, r.where("dataset"))
    fa = r.str_("flash_attn")
    if fa:
        cfg.set(
            "attn_implementation",
            {"fa2": "flash_attention_2", "sdpa": "sdpa", "disabled": "eager"}.get(fa, fa),
            r.where("flash_attn"),
        )
    toks = r.list_("new_special_tokens") or r.list_("add_special_tokens") or r.list_("add_tokens")
    if toks:
        key = next(k for k in ("new_special_tokens", "add_special_tokens", "add_tokens") if r.has(k))
        cfg.set("added_tokens", [toks] if isinstance(toks, str) else toks, r.where(key))


FORMAT = Format(
    name="llamafactory",
    title="LLaMA-Factory",
    read=read,
    order=12,
    votes=KEYS,
    trainer="llamafactory",
    defaults=DEFAULTS,
    after_defaults=_after_defaults,
)
