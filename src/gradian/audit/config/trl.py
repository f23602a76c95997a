"""TRL ``SFTConfig`` (+ ``ModelConfig`` from a ``trl sft --config`` YAML).

Keys: ``max_length``, ``packing``, ``completion_only_loss`` ...; the preference and RL trainers' configs (DPO, KTO,
CPO, GRPO) are told by their own fields.
"""

from __future__ import annotations

from pathlib import Path

from gradian.audit.config.hf_args import HF_DEFAULTS, read_hf_args
from gradian.audit.config.model import TrainConfig
from gradian.audit.config.reader import BY_GRADIAN_TRAIN, Format, Reader, Row, set_many, spellings

#: Keys only a TRL config has (detection).
KEYS = frozenset(
    {
        "max_length",
        "max_seq_length",
        "packing",
        "completion_only_loss",
        "assistant_only_loss",
        "dataset_text_field",
        "padding_free",
        "packing_strategy",
        "use_peft",
        "eval_packing",
        "chat_template_path",
        "dataset_kwargs",
        "truncation_mode",
        "model_init_kwargs",
        "dataset_name",
    }
)

#: SFTConfig fields beyond TrainingArguments (and ModelConfig's ``bnb_4bit_compute_dtype``).
FIELDS: tuple[Row, ...] = (
    ("truncation", "truncation_mode", "str"),
    ("packing", "packing", "bool"),
    ("packing_strategy", "packing_strategy", "str"),
    ("padding_free", "padding_free", "bool"),
    ("completion_only_loss", "completion_only_loss", "bool"),
    ("assistant_only_loss", "assistant_only_loss", "bool"),
    ("dataset_text_field", "dataset_text_field", "str"),
    ("response_template", "response_template", "str"),
    ("instruction_template", "instruction_template", "str"),
    ("data_collator", "data_collator", "str"),
    ("eos_token", "eos_token", "str"),
    ("pad_token", "pad_token", "str"),
    ("chat_template_path", "chat_template_path", "str"),
    ("attn_implementation", "attn_implementation", "str"),
    ("attn_implementation", "model_init_kwargs.attn_implementation", "str"),
    ("bnb_4bit_compute_dtype", "bnb_4bit_compute_dtype", "str"),
)

#: ``TrainingArguments``' defaults, with ``SFTConfig``'s learning rate and its own fields.
DEFAULTS = {
    **HF_DEFAULTS,
    "learning_rate": 2e-5,
    "max_length": 1024,
    "truncation": "keep_start",
    "packing": False,
    "packing_strategy": "bfd",
    "padding_free": False,
    "assistant_only_loss": False,
    "dataset_text_field": "text",
    "stage": "sft",
}

# Keys a `trl sft --config` file has (it names the model / dataset), which an SFTConfig dump never has.
_CLI_KEYS = {"model_name_or_path", "dataset_name", "dataset_config", "dataset_train_split"}
# Fields that only a preference or RL trainer's config has (TRL DPOConfig, KTOConfig, CPOConfig, GRPOConfig ...)
_STAGE_KEYS = (
    ("grpo", ("reward_funcs", "num_generations")),
    ("kto", ("desirable_weight", "undesirable_weight")),
    ("cpo", ("cpo_alpha",)),
    (
        "dpo",
        (
            "rpo_alpha",
            "precompute_ref_log_probs",
            "ref_adapter_name",
            "ref_model_init_kwargs",
            "sync_ref_model",
            "f_divergence_type",
            "ld_alpha",
            "reference_free",
        ),
    ),
)


def _stage(r: Reader) -> tuple[str, str] | None:
    """A TRL config's trainer, from fields only that trainer has: ``(stage, field)``."""
    for stage, keys in _STAGE_KEYS:
        for k in keys:
            if k in r.raw:
                return stage, k
    return None


def read(cfg: TrainConfig, r: Reader) -> None:
    """Read a TRL (or HF TrainingArguments, or ``gradian train``) config into ``cfg``."""
    read_hf_args(cfg, r)
    set_many(cfg, r, FIELDS)
    # max_length: TRL >= 0.16 spells it max_length, older max_seq_length; None means no truncation
    for key in spellings("max_length"):
        if key in r.raw:
            v = r.int_(key)
            if v is None:  # max_length: null -> TRL does not truncate
                cfg.set("truncation", "none", r.where(key) + " (null)")
            else:
                cfg.set("max_length", v, r.where(key))
            break
    ws = r.num("warmup_steps")
    if ws is not None:
        if 0 < ws < 1:  # transformers >= 4.57: a float below 1 is a ratio
            cfg.set("warmup_ratio", ws, r.where("warmup_steps"))
        else:
            cfg.set("warmup_steps", ws, r.where("warmup_steps"))
    if r.bool_("use_peft"):
        cfg.set(
            "finetuning",
            "qlora" if (r.bool_("load_in_4bit") or r.bool_("load_in_8bit")) else "lora",
            r.where("use_peft"),
        )
    elif r.has("use_peft"):
        cfg.set("finetuning", "full", r.where("use_peft"))
    elif _CLI_KEYS & set(r.raw):
        # a `trl sft --config` file: TRL's ModelConfig.use_peft defaults to false, so the CLI fine-tunes every weight
        key = next(k for k in sorted(_CLI_KEYS) if k in r.raw)
        cfg.set(
            "finetuning",
            "full",
            f"default (TRL ModelConfig: use_peft is false; a CLI config, {r.where(key)})",
            default=True,
        )
    stage = _stage(r)
    if stage:
        cfg.set("stage", stage[0], r.where(stage[1]))
    if r.has("messages_loss"):
        ml = r.str_("messages_loss")
        if ml != "final_assistant_turn":
            r.bad("messages_loss", ml, "'final_assistant_turn' (what gradian train does)")
        cfg.set("messages_loss", ml, r.where("messages_loss"))
    elif r.raw.get(BY_GRADIAN_TRAIN):
        cfg.set(
            "messages_loss",
            "final_assistant_turn",
            f"{Path(r.path).name} (written by gradian train, which trains a 'messages' row on its final "
            f"assistant turn)",
        )
    if r.has("eval_dataset"):
        cfg.set("has_eval_dataset", True, r.where("eval_dataset"))
    elif r.has("dataset_test_split") and r.has("eval_strategy"):
        cfg.set("has_eval_dataset", True, r.where("dataset_test_split"))


FORMAT = Format(name="trl", title="TRL SFTConfig", read=read, order=10, votes=KEYS, trainer="trl", defaults=DEFAULTS)
