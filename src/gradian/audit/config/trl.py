"""TRL ``SFTConfig`` (+ ``ModelConfig`` from a ``trl sft --config`` YAML).

Keys: ``max_length``, ``packing``, ``completion_only_loss`` ...; the preference and RL trainers' configs (DPO, KTO,
CPO, GRPO) are told by their own fields.
"""

from __future__ import annotations

from pathlib import Path

from gradian.audit.config.hf_args import HF_DEFAULTS, read_hf_args
from gradian.audit.config.model import TrainConfig
from gradian.audit.config.reader import BY_GRADIAN_TRAIN, SAVED_CLASS, Format, Reader, Row, set_many, spellings
from gradian.safeio import read_text

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
    ("shuffle_dataset", "shuffle_dataset", "bool"),  # TRL >= 0.26: the train set shuffled, seeded seed, once
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
    ("chat_template", "chat_template", "str"),  # alignment-handbook recipes put the Jinja template in the YAML
    ("attn_implementation", "attn_implementation", "str"),
    ("attn_implementation", "model_init_kwargs.attn_implementation", "str"),
    ("bnb_4bit_compute_dtype", "bnb_4bit_compute_dtype", "str"),
    # ModelConfig's 4-bit scheme and load dtype (a `trl sft --config` file)
    ("quant_type", "bnb_4bit_quant_type", "str"),
    ("double_quant", "use_bnb_nested_quant", "bool"),
    ("load_dtype", "torch_dtype", "str"),
    ("load_dtype", "dtype", "str"),
)

#: KTO's weights of the desirable and undesirable rows (KTOConfig names; LLaMA-Factory and axolotl rename them).
KTO_WEIGHTS: tuple[Row, ...] = (
    ("desirable_weight", "desirable_weight", "num"),
    ("undesirable_weight", "undesirable_weight", "num"),
)
#: The preference trainers' fields (DPOConfig, KTOConfig ...), read when the file is one of theirs.
PREFERENCE_FIELDS: tuple[Row, ...] = (
    ("beta", "beta", "num"),
    ("max_prompt_length", "max_prompt_length", "int"),
    *KTO_WEIGHTS,
)
#: How the reference model follows the policy (read after the reference model itself).
REF_SYNC_FIELDS: tuple[Row, ...] = (
    ("sync_ref_model", "sync_ref_model", "bool"),
    ("precompute_ref_log_probs", "precompute_ref_log_probs", "bool"),
)

#: ``TrainingArguments``' defaults, with ``SFTConfig``'s learning rate and its own fields.
DEFAULTS = {
    **HF_DEFAULTS,
    "learning_rate": 2e-5,
    "max_length": 1024,
    "truncation": "keep_start",
    "packing": False,
    "packing_strategy": "bfd",
    "quant_type": "nf4",  # trl/trainer/model_config.py: bnb_4bit_quant_type
    "double_quant": False,  # use_bnb_nested_quant
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


#: Fields every TRL preference config has (DPOConfig, ORPOConfig, KTOConfig, CPOConfig) and SFTConfig has not.
_PREF_KEYS = ("beta", "loss_type", "max_prompt_length", "generate_during_eval", "label_pad_token_id")
#: RewardConfig's own field.
_RM_KEYS = ("center_rewards_coefficient",)
#: A folder or file name that says the trainer, for a preference config whose fields are shared by several
#: (alignment-handbook keeps recipes as recipes/<model>/<dpo|orpo|kto>/config_*.yaml).
_STAGE_WORDS = ("orpo", "kto", "cpo", "simpo", "dpo", "ipo")
#: Each TRL trainer's own default learning rate (TRL 1.16.0: trainer/dpo_config.py, kto_config.py,
#: reward_config.py; experimental/orpo/orpo_config.py, experimental/cpo/cpo_config.py), replacing SFTConfig's 2e-5.
STAGE_LR = {
    "dpo": (1e-6, "DPOConfig"),
    "ipo": (1e-6, "DPOConfig"),
    "kto": (1e-6, "KTOConfig"),
    "orpo": (1e-6, "ORPOConfig"),
    "cpo": (1e-6, "CPOConfig"),
    "simpo": (1e-6, "CPOConfig"),
    "rm": (1e-4, "RewardConfig"),
}


#: A pickled TRL config's class (``training_args.bin``) → its trainer's stage; SFTConfig and TrainingArguments: none.
_CLASS_STAGE = {
    "DPOConfig": "dpo",
    "KTOConfig": "kto",
    "CPOConfig": "cpo",
    "ORPOConfig": "orpo",
    "RewardConfig": "rm",
    "GRPOConfig": "grpo",
    "PPOConfig": "ppo",
    "RLOOConfig": "rloo",
    "OnlineDPOConfig": "dpo",
    "BCOConfig": "bco",
}


def _stage(r: Reader) -> tuple[str, str] | None:
    """A TRL config's trainer, from fields only that trainer has: ``(stage, where)``; a preference field shared by
    several trainers (``beta``, ``loss_type``, ``max_prompt_length``) is DPO unless the file's path or its
    ``loss_type`` names another (``recipes/.../orpo/config_full.yaml``, ``loss_type: simpo``).

    A ``training_args.bin`` holds every field of its class, its defaults too (TRL 1.16's SFTConfig has a
    ``loss_type``), so there the class says the trainer (:data:`_CLASS_STAGE`; SimPO is a ``CPOConfig`` with
    ``loss_type: simpo``).
    """
    cls = r.raw.get(SAVED_CLASS)
    if isinstance(cls, str):
        name = cls.rsplit(".", 1)[-1]
        stage = _CLASS_STAGE.get(name)
        if stage is None:
            return None
        if stage == "cpo" and str(r.raw.get("loss_type")).lower() == "simpo":
            stage = "simpo"
        return stage, f"{Path(r.path).name} (it saved a {name})"
    for stage, keys in _STAGE_KEYS:
        for k in keys:
            if k in r.raw:
                return stage, r.where(k)
    for k in _RM_KEYS:
        if k in r.raw:
            return "rm", r.where(k)
    for k in _PREF_KEYS:
        if k in r.raw:
            lt = r.raw.get("loss_type")
            lt = (lt[0] if isinstance(lt, list) and lt else lt) if lt is not None else None
            if isinstance(lt, str) and lt.lower() in ("kto", "apo_zero_unpaired"):
                return "kto", r.where("loss_type")
            if isinstance(lt, str) and lt.lower() == "simpo":
                return "simpo", r.where("loss_type")
            parts = [x.lower() for x in Path(r.path).parts[-3:]]
            for w in _STAGE_WORDS:
                if any(w in x.replace("-", "_").split("_") or x.startswith(w) for x in parts):
                    return w, f"{r.where(k)} (a preference field; {w} from the file's path)"
            return "dpo", r.where(k)
    return None


def after_defaults(cfg: TrainConfig) -> None:
    """A preference trainer's own default learning rate replaces SFTConfig's (DPO/KTO/ORPO 1e-6, reward 1e-4)."""
    if cfg.stage in STAGE_LR and cfg.is_default("learning_rate"):
        lr, title = STAGE_LR[cfg.stage]
        cfg.learning_rate = lr
        cfg.sources["learning_rate"] = f"default (TRL {title})"


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
    ctp = r.str_("chat_template_path")
    if ctp and ctp.endswith((".jinja", ".j2")) and not r.has("chat_template"):
        f = Path(r.path).parent / ctp
        if f.is_file():  # TRL's chat_template_path may name a Jinja file: its text is the template trained with
            cfg.set("chat_template", read_text(f, "chat template"), r.where("chat_template_path"))
    splits = []
    if r.str_("dataset_train_split"):
        splits.append(
            {
                "dataset": r.str_("dataset_name") or "(dataset_name)",
                "split": r.str_("dataset_train_split"),
                "from": r.where("dataset_train_split"),
            }
        )
    mix = r.get("dataset_mixture")
    if isinstance(mix, dict) and isinstance(mix.get("datasets"), list):
        for i, d in enumerate(mix["datasets"]):
            if isinstance(d, dict) and isinstance(d.get("split"), str):
                name = d.get("id") or d.get("path") or d.get("name") or f"datasets[{i}]"
                splits.append(
                    {"dataset": str(name), "split": d["split"], "from": r.where(f"dataset_mixture.datasets[{i}].split")}
                )
    mixer, names = r.get("dataset_mixer"), r.get("dataset_splits")
    if isinstance(mixer, dict) and isinstance(names, list):
        # the old handbook layout (alignment-handbook <= 0.3 get_datasets): a split whose name holds "train" is
        # trained on, one holding "test" is the eval set
        for i, sp in enumerate(names):
            if isinstance(sp, str) and "train" in sp:
                for name in mixer:
                    splits.append({"dataset": str(name), "split": sp, "from": r.where(f"dataset_splits[{i}]")})
    if splits:
        cfg.set("train_splits", splits, splits[0]["from"])
    stage = _stage(r)
    if stage:
        cfg.set("stage", stage[0], stage[1])
        set_many(cfg, r, PREFERENCE_FIELDS)
        lt = r.raw.get("loss_type")
        if lt is not None:
            cfg.set("loss_type", ",".join(map(str, lt)) if isinstance(lt, list) else str(lt), r.where("loss_type"))
        for k in ("ref_model", "ref_model_name_or_path", "ref_adapter_name"):
            if r.str_(k):
                cfg.set("ref_model", r.str_(k), r.where(k))
                break
        set_many(cfg, r, REF_SYNC_FIELDS)
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


FORMAT = Format(
    name="trl",
    title="TRL SFTConfig",
    read=read,
    order=10,
    votes=KEYS,
    trainer="trl",
    defaults=DEFAULTS,
    after_defaults=after_defaults,
)
