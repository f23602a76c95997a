"""axolotl YAML: ``base_model``, ``sequence_len``, ``micro_batch_size``, ``adapter``, ``datasets`` ..."""

from __future__ import annotations

from pathlib import Path

from gradian.audit.config.hf_args import read_hf_args
from gradian.audit.config.model import TrainConfig
from gradian.audit.config.reader import Format, Reader, Row, set_many
from gradian.audit.config.trl import KTO_WEIGHTS

#: Keys only an axolotl config has (detection).
KEYS = frozenset(
    {
        "base_model",
        "sequence_len",
        "micro_batch_size",
        "num_epochs",
        "adapter",
        "sample_packing",
        "train_on_inputs",
        "val_set_size",
        "lora_target_linear",
        "lora_model_dir",
        "special_tokens",
        "evals_per_epoch",
        "pad_to_sequence_len",
        "dataset_prepared_path",
        "flash_attention",
        "peft_use_rslora",
        "peft_use_dora",
        "excess_length_strategy",
        "eval_sample_packing",
        "lora_modules_to_save",
        "base_model_config",
        "wandb_project",
    }
)

#: The attention axolotl 0.19 keeps packed rows apart with (``utils/schemas/config.py``
#: ``attn_decontaminates_packing``): for its packing-capable kernels (flash / flex / xformers / sage, varlen by
#: ``position_ids``) and for sdpa / eager, its trainer drops the packed batch's attention mask, so transformers masks
#: attention within each row from the restarting ``position_ids``. No ``attn_implementation`` keeps the mask (segment
#: ids 1, 2, ...), which the model reads as all ones: rows attend to the rows packed before them. Matched as a prefix
#: (``kernels-community/flash-attn2@v2``); read by the training setup and Audit's C12.
PACKING_APART = ("sdpa", "eager", "flash_attention", "flex_attention", "xformers", "sage", "kernels-community/")

#: axolotl's names for the shared TrainingArguments / LoRA keys (None: axolotl does not read that key).
RENAMED = {
    "model_name_or_path": "base_model",
    "num_train_epochs": "num_epochs",
    "per_device_train_batch_size": "micro_batch_size",
    "lr_scheduler_type": "lr_scheduler",
    "save_strategy": None,
    "use_rslora": "peft_use_rslora",
    "use_dora": "peft_use_dora",
}

#: axolotl's own keys.
FIELDS: tuple[Row, ...] = (
    ("total_batch_size", "batch_size", "int"),
    ("warmup_steps", "warmup_steps", "num"),
    ("max_length", "sequence_len", "int"),
    ("truncation", "excess_length_strategy", "str"),
    ("packing", "sample_packing", "bool"),
    ("train_on_inputs", "train_on_inputs", "bool"),
    ("lora_target_linear", "lora_target_linear", "bool"),
    ("val_set_size", "val_set_size", "num"),
    ("chat_template", "chat_template", "str"),
    ("attn_implementation", "attn_implementation", "str"),
    # the train set's order (utils/data/shared.py merge_datasets, utils/data/utils.py handle_long_seq_in_dataset)
    ("shuffle_dataset", "shuffle_merged_datasets", "bool"),
    ("min_sample_len", "min_sample_len", "int"),
    ("curriculum_sampling", "curriculum_sampling", "bool"),
    ("dataset_shards", "dataset_shard_num", "int"),
    # loaders/model.py (0.19.0): a qlora run's BitsAndBytesConfig, updated by bnb_config_kwargs
    ("quant_type", "bnb_config_kwargs.bnb_4bit_quant_type", "str"),
    ("double_quant", "bnb_config_kwargs.bnb_4bit_use_double_quant", "bool"),
)

DEFAULTS = {
    "quant_type": "nf4",
    "double_quant": True,
    "max_length": 512,
    "truncation": "drop",
    "micro_batch_size": 1,
    "gradient_accumulation_steps": 1,
    "num_epochs": 1.0,
    "train_on_inputs": False,
    "packing": False,
    "lr_scheduler": "cosine",
    "val_set_size": 0.0,
    "group_by_length": False,
    "finetuning": "full",
    "stage": "sft",
    "shuffle_dataset": True,
    "min_sample_len": 2,
}


def read(cfg: TrainConfig, r: Reader) -> None:
    """Read an axolotl config into ``cfg``."""
    read_hf_args(cfg, r, RENAMED, eval_keys=("eval_strategy",))
    set_many(cfg, r, FIELDS)
    adapter = r.str_("adapter")
    if adapter:
        cfg.set("finetuning", "qlora" if adapter.lower() == "qlora" else "lora", r.where("adapter"))
    rl = r.get("rl")
    if rl is not None and rl is not False:
        cfg.set("stage", "dpo" if rl is True else str(rl).lower().replace("rltype.", ""), r.where("rl"))
        for k in ("rl_beta", "dpo_beta", "orpo_alpha"):  # axolotl's beta spellings (orpo_alpha: ORPO's lambda)
            if r.has(k):
                cfg.set("beta", r.num(k), r.where(k))
                break
        set_many(cfg, r, KTO_WEIGHTS, prefix="kto_")  # examples/llama-3/qlora-1b-kto.yaml
    elif r.has("pretraining_dataset"):
        cfg.set("stage", "pt", r.where("pretraining_dataset"))
    if r.has("dataset_exact_deduplication"):
        cfg.set("dedup_exact", r.bool_("dataset_exact_deduplication"), r.where("dataset_exact_deduplication"))
    if not r.has("eval_strategy") and r.has("evals_per_epoch") and (r.int_("evals_per_epoch") or 0) > 0:
        cfg.set("eval_strategy", "steps", r.where("evals_per_epoch"))
    if r.has("test_datasets"):
        cfg.set("has_eval_dataset", True, r.where("test_datasets"))
    for key, impl in (
        ("flash_attention", "flash_attention_2"),
        ("flex_attention", "flex_attention"),
        ("sdp_attention", "sdpa"),
        ("xformers_attention", "xformers"),
    ):
        if r.bool_(key):
            cfg.set("attn_implementation", impl, r.where(key))
    toks: list[str] = []
    if isinstance(r.get("tokens"), list):
        toks += [str(t) for t in r.get("tokens")]
    if toks:
        cfg.set("added_tokens", toks, r.where("tokens"))
    st = r.get("special_tokens")
    if isinstance(st, dict) and st.get("eos_token"):
        cfg.set("eos_token", str(st["eos_token"]), r.where("special_tokens.eos_token"))
    if isinstance(st, dict) and st.get("pad_token"):
        cfg.set("pad_token", str(st["pad_token"]), r.where("special_tokens.pad_token"))
    if (r.str_("chat_template") or "").lower() == "jinja" and r.str_("chat_template_jinja"):
        cfg.chat_template = None  # axolotl's `chat_template: jinja` names the template given in chat_template_jinja
        cfg.set("chat_template", r.str_("chat_template_jinja"), r.where("chat_template_jinja"))
    ds = r.get("datasets")
    if isinstance(ds, list):
        norm = []
        for i, d in enumerate(ds):
            if not isinstance(d, dict):
                continue

            def text(key: str, d: dict = d) -> str | None:
                v = d.get(key)
                return v if isinstance(v, str) else None

            norm.append(
                {
                    "index": i,
                    "path": text("path"),
                    "type": text("type"),
                    "field": text("field"),
                    "field_messages": text("field_messages"),
                    "field_chosen": text("field_chosen"),
                    "field_rejected": text("field_rejected"),
                    "roles_to_train": [str(x) for x in d["roles_to_train"]]
                    if isinstance(d.get("roles_to_train"), list)
                    else None,
                    "train_on_eos": text("train_on_eos"),
                    "shards": d["shards"] if isinstance(d.get("shards"), int) else None,
                    "chat_template": text("chat_template"),
                    "type_mapping": {str(k): v for k, v in d["type"].items() if isinstance(v, str) or v is None}
                    if isinstance(d.get("type"), dict)
                    else None,
                }
            )
            if text("chat_template") and not r.has("chat_template"):
                cfg.set("chat_template", str(d["chat_template"]), r.where(f"datasets[{i}].chat_template"))
        cfg.set("datasets", norm, r.where("datasets"))
        splits = [
            {
                "dataset": str(d.get("path") or f"datasets[{i}]"),
                "split": d["split"],
                "from": r.where(f"datasets[{i}].split"),
            }
            for i, d in enumerate(ds)
            if isinstance(d, dict) and isinstance(d.get("split"), str)
        ]
        if splits:
            cfg.set("train_splits", splits, r.where("datasets"))


FORMAT = Format(name="axolotl", title="axolotl", read=read, order=11, votes=KEYS, trainer="axolotl", defaults=DEFAULTS)


_MAPPED = ("field_instruction", "field_input", "field_output", "field_system", "format", "no_input_format")


def custom_mapping(cfg: TrainConfig, data_path: str | None) -> tuple[dict[str, str], str] | None:
    """The axolotl ``datasets[i].type`` field mapping (``field_instruction``, ``field_output``, ``format`` ...) that
    applies to ``data_path``: the only entry, or the one whose ``path`` names the file; ``(mapping, where)``.
    """
    if cfg.trainer != "axolotl" or not cfg.datasets:
        return None
    entries = [
        d
        for d in cfg.datasets
        if d.get("type_mapping")
        and set(d["type_mapping"]) & set(_MAPPED)
        and not {"field_chosen", "field_rejected"} & set(d["type_mapping"])  # a preference mapping: preference_fields
    ]
    if not entries:
        return None
    if len(cfg.datasets) > 1 and data_path:
        name = Path(data_path).name
        entries = [d for d in entries if d.get("path") and Path(str(d["path"])).name == name]
    if len(entries) != 1:
        return None
    d = entries[0]
    return d["type_mapping"], f"{Path(cfg.paths[0]).name}: datasets[{d['index']}].type"


def _entry_for(cfg: TrainConfig, data_path: str | None, entries: list[dict]) -> dict | None:
    """The one dataset entry that applies to ``data_path`` (the only one, or the one whose path names the file)."""
    if len(cfg.datasets or []) > 1 and data_path:
        name = Path(data_path).name
        entries = [d for d in entries if d.get("path") and Path(str(d["path"])).name == name]
    return entries[0] if len(entries) == 1 else None


#: user_defined.default preference mapping keys (docs/rlhf.qmd) -> the row fields the preference reader knows
_PREF_MAPPED = {
    "field_prompt": "prompt",
    "field_system": "system",
    "field_chosen": "chosen",
    "field_rejected": "rejected",
}


def preference_fields(cfg: TrainConfig | None, data_path: str | None) -> tuple[dict[str, str], str] | None:
    """For an axolotl preference run (``rl:``), the renames its dataset entry implies, ``{row field: reader field}``,
    and where: ``chat_template.*`` types' ``field_messages`` / ``field_chosen`` / ``field_rejected``, or a
    ``user_defined.default`` ``type:`` mapping's ``field_prompt`` / ``field_system`` / ``field_chosen`` /
    ``field_rejected`` (axolotl docs/rlhf.qmd). None when nothing is renamed.
    """
    if cfg is None or cfg.trainer != "axolotl" or not cfg.datasets or cfg.stage in (None, "sft", "pt"):
        return None
    d = _entry_for(cfg, data_path, list(cfg.datasets))
    if d is None:
        return None
    where = f"{Path(cfg.paths[0]).name}: datasets[{d['index']}]"
    ren: dict[str, str] = {}
    if isinstance(d.get("type_mapping"), dict):
        ren = {v: _PREF_MAPPED[k] for k, v in d["type_mapping"].items() if k in _PREF_MAPPED and isinstance(v, str)}
        where += ".type"
    elif str(d.get("type") or "").startswith("chat_template"):
        for key, default in (
            ("field_messages", "messages"),
            ("field_chosen", "chosen"),
            ("field_rejected", "rejected"),
        ):
            if d.get(key):
                ren[str(d[key])] = default
    ren = {k: v for k, v in ren.items() if k != v}
    return (ren, where) if ren else None


def rename_fields(records: list, ren: dict[str, str]) -> list:
    """``records`` with top-level fields renamed by ``ren`` (other fields and non-dict rows as they were)."""
    return [{ren.get(k, k): v for k, v in r.items()} if isinstance(r, dict) else r for r in records]


def apply_mapping(records: list[dict], mapping: dict[str, str]) -> list[dict]:
    """Rows under an axolotl custom mapping, as prompt/completion records (their content, as the checks read it).

    The prompt is the instruction and input joined by a blank line (``system_prompt``/``field_system`` first when
    given); the completion is ``field_output``'s value. The mapping's ``format`` string is the prompt *template*
    (``"[INST] {instruction} [/INST]"``): it is not put into the text, so its markers are not read as content
    (D08). Records keep their ``id``.
    """
    # axolotl's UserDefinedDatasetConfig defaults; a key given empty (``field_input:`` in docs/dataset-formats'
    # own example, whose instruction field is named ``input``) names no field
    fi, fo = mapping.get("field_instruction") or "instruction", mapping.get("field_output") or "output"
    fin, fs = mapping.get("field_input", "input"), mapping.get("field_system", "system")
    out = []
    for r in records:
        if not isinstance(r, dict) or fi not in r or fo not in r:
            out.append(r)  # left as is: the row reader names what is missing
            continue
        ins = str(r.get(fi) or "")
        inp = str(r.get(fin) or "") if fin else ""
        prompt = ins + (f"\n\n{inp}" if inp else "")
        system = str(r.get(fs) or "") if fs and fs in r else (mapping.get("system_prompt") or "")
        if system:
            prompt = f"{system}\n\n{prompt}"
        keep = {k: v for k, v in r.items() if k in ("id",)}
        out.append({**keep, "prompt": prompt, "completion": str(r[fo])})
    return out
