"""Training configs, normalised into one typed view: :class:`TrainConfig`.

Readers for what a practitioner actually has:

==================  ======================================================================
format              recognised by
==================  ======================================================================
``trl``             TRL ``SFTConfig`` (+ ``ModelConfig`` from a ``trl sft --config`` YAML):
                    ``max_length``, ``max_seq_length``, ``packing``, ``completion_only_loss`` ...
``hf``              HF ``TrainingArguments`` JSON/YAML (``training_args.to_json_string()``)
``axolotl``         axolotl YAML: ``base_model``, ``sequence_len``, ``micro_batch_size``, ``adapter`` ...
``llamafactory``    LLaMA-Factory YAML: ``stage``, ``finetuning_type``, ``cutoff_len``, ``template`` ...
``llamafactory_v1`` LLaMA-Factory v1 YAML: ``model``, ``peft_config``, ``cutoff_len``, ``micro_batch_size`` ...
``torchtune``       torchtune YAML: ``_component_`` entries (``model``, ``tokenizer``, ``dataset``,
                    ``loss`` ...); a dataset builder's own defaults count (``alpaca_dataset``
                    trains on the prompt unless ``train_on_input: false``)
``gradian``         the ``training_config.yaml`` that ``gradian train`` writes (TRL names)
``peft``            PEFT ``adapter_config.json`` (or the adapter folder; its README's
                    "Framework versions" give library versions)
==================  ======================================================================

Every value records where it came from (``"axolotl.yaml: lora_r"``, or
``"default (TRL SFTConfig)"`` when the file left it unset and the trainer's
default applies), so a finding can cite the field. Several configs merge
(e.g. a TRL YAML and the adapter's ``adapter_config.json``): a value set
explicitly beats a default; two different explicit values are kept as the
first and recorded in :attr:`TrainConfig.conflicts`.

The training *stage* is read too (:attr:`TrainConfig.stage`): LLaMA-Factory's
``stage`` (``pt``, ``sft``, ``rm``, ``dpo``, ``kto``), axolotl's ``rl:``, torchtune's
loss and dataset components, TRL's preference and RL fields. Checks whose rule
is for SFT are skipped for other stages, with the reason.

Numbers are coerced (YAML 1.1 reads ``2e-4`` as a string); a value that is
not a number where one is needed is a :class:`GradianUserError` naming the
file and field. A number that is impossible for its field (a negative
learning rate, zero epochs, ``lora_r: 0``) is kept and reported by check C19.
Files are read through :mod:`gradian.safeio` (regular files only, size and
nesting limits). ``training_args.bin`` is a pickle and is refused.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from gradian.errors import GradianUserError
from gradian.safeio import parse_json, parse_yaml, read_text, short_repr

CONFIG_FORMATS = ("trl", "hf", "axolotl", "llamafactory", "llamafactory_v1", "torchtune", "peft", "gradian")

_FMT_NAME = {
    "trl": "TRL SFTConfig",
    "hf": "HF TrainingArguments",
    "axolotl": "axolotl",
    "llamafactory": "LLaMA-Factory",
    "llamafactory_v1": "LLaMA-Factory v1",
    "gradian": "gradian train",
    "torchtune": "torchtune",
    "peft": "PEFT LoraConfig",
}

# The defaults each stack applies when a field is left unset (see docs/diagnose.md).
DEFAULTS: dict[str, dict[str, Any]] = {
    "trl": {
        "learning_rate": 2e-5, "num_epochs": 3.0, "micro_batch_size": 8, "gradient_accumulation_steps": 1,
        "max_length": 1024, "truncation": "keep_start", "packing": False, "packing_strategy": "bfd",
        "padding_free": False, "assistant_only_loss": False, "dataset_text_field": "text",
        "lr_scheduler": "linear", "warmup_steps": 0, "warmup_ratio": 0.0, "eval_strategy": "no",
        "save_strategy": "steps", "save_steps": 500, "load_best_model_at_end": False, "group_by_length": False,
        "max_grad_norm": 1.0, "stage": "sft",
    },
    "hf": {
        "learning_rate": 5e-5, "num_epochs": 3.0, "micro_batch_size": 8, "gradient_accumulation_steps": 1,
        "lr_scheduler": "linear", "warmup_steps": 0, "warmup_ratio": 0.0, "eval_strategy": "no",
        "save_strategy": "steps", "save_steps": 500, "load_best_model_at_end": False, "group_by_length": False,
        "max_grad_norm": 1.0,
    },
    "axolotl": {
        "max_length": 512, "truncation": "drop", "micro_batch_size": 1, "gradient_accumulation_steps": 1,
        "num_epochs": 1.0, "train_on_inputs": False, "packing": False, "lr_scheduler": "cosine",
        "val_set_size": 0.0, "group_by_length": False, "finetuning": "full", "stage": "sft",
    },
    "llamafactory": {
        "finetuning": "lora", "lora_r": 8, "lora_dropout": 0.0, "lora_target_modules": "all",
        "max_length": 2048, "truncation": "truncate", "train_on_inputs": False, "packing": False,
        "learning_rate": 5e-5, "num_epochs": 3.0, "micro_batch_size": 8, "gradient_accumulation_steps": 1,
        "lr_scheduler": "linear", "warmup_steps": 0, "warmup_ratio": 0.0, "val_set_size": 0.0,
        "eval_strategy": "no", "stage": "sft",
    },
    "llamafactory_v1": {
        "finetuning": "full", "micro_batch_size": 1, "max_length": 2048, "learning_rate": 1e-4, "num_epochs": 3.0,
        "max_grad_norm": 1.0, "bf16": True, "truncation": "truncate", "train_on_inputs": False, "packing": False,
        "gradient_accumulation_steps": 1, "lora_r": 8, "lora_alpha": 16, "lora_target_modules": "all",
    },
    "torchtune": {
        "train_on_inputs": False, "packing": False, "gradient_accumulation_steps": 1, "truncation": "truncate",
        "stage": "sft",
    },
    "peft": {"lora_r": 8, "lora_alpha": 8, "lora_dropout": 0.0, "use_rslora": False, "use_dora": False},
}


#: What each training stage name means for the checks (see :attr:`TrainConfig.stage_kind`).
STAGE_KINDS = {
    "sft": "sft",
    "pt": "pretraining", "pretrain": "pretraining", "pretraining": "pretraining", "cpt": "pretraining",
    "dpo": "preference", "ipo": "preference", "kto": "preference", "orpo": "preference", "simpo": "preference",
    "cpo": "preference", "rm": "preference", "reward": "preference", "bco": "preference", "nca": "preference",
    "ppo": "rl", "grpo": "rl", "gdpo": "rl", "rloo": "rl", "online_dpo": "rl", "gkd": "rl",
}


@dataclass
class TrainConfig:
    """One view of a training run's settings, whatever file format they came from.

    Unknown values are ``None``. :meth:`source` gives the field each value came from.
    ``finetuning`` is ``"lora"``, ``"qlora"`` or ``"full"``.
    ``train_on_inputs`` True means the loss covers the prompt (axolotl ``train_on_inputs``,
    LLaMA-Factory ``train_on_prompt``, torchtune ``train_on_input``, TRL ``completion_only_loss=false``).
    ``max_length`` None with a known trainer means the trainer does not truncate.
    ``stage`` is the training stage (``sft``, ``pt``, ``dpo``, ``kto``, ``orpo``, ``rm``, ``grpo`` ...;
    None: not said, SFT assumed); ``dedup_exact`` True when the trainer drops exact duplicate rows
    (axolotl ``dataset_exact_deduplication``); ``messages_loss`` ``"final_assistant_turn"`` when
    the loss of a ``messages`` row covers its final assistant turn only (``gradian train``).
    """

    trainer: str | None = None
    base_model: str | None = None
    finetuning: str | None = None
    learning_rate: float | None = None
    num_epochs: float | None = None
    max_steps: int | None = None
    micro_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    total_batch_size: int | None = None
    warmup_steps: float | None = None
    warmup_ratio: float | None = None
    lr_scheduler: str | None = None
    max_grad_norm: float | None = None
    max_length: int | None = None
    truncation: str | None = None
    packing: bool | None = None
    packing_strategy: str | None = None
    padding_free: bool | None = None
    attn_implementation: str | None = None
    completion_only_loss: bool | None = None
    assistant_only_loss: bool | None = None
    train_on_inputs: bool | None = None
    dataset_text_field: str | None = None
    response_template: str | None = None
    instruction_template: str | None = None
    data_collator: str | None = None
    lora_r: int | None = None
    lora_alpha: float | None = None
    lora_dropout: float | None = None
    lora_target_modules: Any = None
    lora_target_linear: bool | None = None
    use_rslora: bool | None = None
    use_dora: bool | None = None
    modules_to_save: list[str] | None = None
    trainable_token_indices: Any = None
    load_in_4bit: bool | None = None
    load_in_8bit: bool | None = None
    bnb_4bit_compute_dtype: str | None = None
    bf16: bool | None = None
    fp16: bool | None = None
    eval_strategy: str | None = None
    eval_steps: float | None = None
    save_strategy: str | None = None
    save_steps: float | None = None
    load_best_model_at_end: bool | None = None
    val_set_size: float | None = None
    has_eval_dataset: bool | None = None
    group_by_length: bool | None = None
    chat_template: str | None = None
    chat_template_path: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    added_tokens: list[str] | None = None
    datasets: list[dict[str, Any]] | None = None
    stage: str | None = None
    dedup_exact: bool | None = None
    messages_loss: str | None = None

    paths: list[str] = field(default_factory=list)
    formats: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    conflicts: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    version_sources: dict[str, str] = field(default_factory=dict)

    # ------------------------------------------------------------------ access
    def source(self, name: str) -> str | None:
        """Where ``name``'s value came from (``"file: field"`` or ``"default (...)"``), or None."""
        return self.sources.get(name)

    def is_default(self, name: str) -> bool:
        s = self.sources.get(name)
        return s is not None and s.startswith("default")

    def cite(self, *names: str) -> dict[str, Any]:
        """``{name: {"value": v, "from": source}}`` for evidence."""
        return {n: {"value": getattr(self, n), "from": self.sources.get(n)} for n in names}

    @property
    def stage_kind(self) -> str:
        """``sft`` (also when no stage is said), ``pretraining``, ``preference``, ``rl`` or ``other``."""
        if not self.stage:
            return "sft"
        return STAGE_KINDS.get(self.stage.lower(), "other")

    @property
    def is_lora(self) -> bool | None:
        if self.finetuning is None:
            return None
        return self.finetuning in ("lora", "qlora")

    def effective_batch(self, world_size: int = 1) -> int | None:
        """Sequences per optimiser step: micro batch x grad accumulation x devices."""
        if self.total_batch_size and not (self.micro_batch_size and self.gradient_accumulation_steps):
            return self.total_batch_size
        if self.micro_batch_size is None:
            return None
        return self.micro_batch_size * (self.gradient_accumulation_steps or 1) * world_size

    def set(self, name: str, value: Any, where: str, *, default: bool = False) -> None:
        """Set ``name`` from ``where``; explicit values beat defaults; explicit conflicts are recorded."""
        if value is None:
            return
        cur = getattr(self, name)
        cur_src = self.sources.get(name)
        if cur is None or (cur_src or "").startswith("default") and not default:
            setattr(self, name, value)
            self.sources[name] = where
        elif not default and cur != value and not (cur_src or "").startswith("default"):
            self.conflicts.append(f"{name}: {cur!r} ({cur_src}) vs {value!r} ({where}); using the first")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name in _META:
                continue
            v = getattr(self, f.name)
            if v is not None:
                out[f.name] = {"value": v, "from": self.sources.get(f.name)}
        return {
            "paths": list(self.paths),
            "formats": list(self.formats),
            "values": out,
            "conflicts": list(self.conflicts),
            "notes": list(self.notes),
        }


_META = ("paths", "formats", "sources", "conflicts", "notes", "versions", "version_sources")


# ---------------------------------------------------------------------- parsing helpers
class _Reader:
    """Typed access to one config mapping, with errors that name the file and field."""

    def __init__(self, raw: dict[str, Any], path: str):
        self.raw = raw
        self.path = path

    def where(self, key: str) -> str:
        return f"{Path(self.path).name}: {key}"

    def get(self, key: str, default: Any = None) -> Any:
        cur: Any = self.raw
        for part in key.split("."):
            if not isinstance(cur, dict) or part not in cur:
                return default
            cur = cur[part]
        return cur

    def has(self, key: str) -> bool:
        sentinel = object()
        return self.get(key, sentinel) is not sentinel and self.get(key) is not None

    def has_key(self, key: str) -> bool:
        """True when ``key`` is present, even with a null value."""
        sentinel = object()
        return self.get(key, sentinel) is not sentinel

    def num(self, key: str) -> float | None:
        v = self.get(key)
        if v is None or isinstance(v, bool):
            return None if v is None else self._bad(key, v, "a number")
        if isinstance(v, (int, float)):
            try:
                return float(v)
            except OverflowError:  # an integer beyond float range
                return self._bad(key, v, "a number in float range")
        if isinstance(v, str):
            s = v.strip()
            if s.lower() in ("none", "null", ""):
                return None
            try:
                return float(s)
            except ValueError:
                return self._bad(key, v, "a number")
        return self._bad(key, v, "a number")

    def int_(self, key: str) -> int | None:
        v = self.num(key)
        if v is None:
            return None
        if not math.isfinite(v) or v != int(v):
            return self._bad(key, self.get(key), "a whole number")
        return int(v)

    def bool_(self, key: str) -> bool | None:
        v = self.get(key)
        if v is None or isinstance(v, bool):
            return v
        if isinstance(v, (int, float)) and v in (0, 1):
            return bool(v)
        if isinstance(v, str):
            s = v.strip().lower()
            if s in ("true", "yes", "1", "on"):
                return True
            if s in ("false", "no", "0", "off", "none", ""):
                return False
            if s == "auto":
                return None
        return self._bad(key, v, "true or false")

    def str_(self, key: str) -> str | None:
        v = self.get(key)
        if v is None:
            return None
        if isinstance(v, (dict, list)):
            return self._bad(key, v, "a string")
        return str(v)

    def list_(self, key: str) -> list[str] | str | None:
        v = self.get(key)
        if v is None:
            return None
        if isinstance(v, str):
            parts = [p.strip() for p in v.split(",")] if "," in v else [v.strip()]
            return parts if len(parts) > 1 else parts[0]
        if isinstance(v, (list, tuple)):
            return [str(x) for x in v]
        return self._bad(key, v, "a list of names or a string")

    def _bad(self, key: str, v: Any, want: str):
        raise GradianUserError(
            f"{key} is {short_repr(v)}, not {want}", where=f"{self.path}: {key}", fix=f"set {key} to {want}"
        )


def _parse_file(path: Path) -> dict[str, Any]:
    if path.name.endswith(".bin") or path.suffix in (".pt", ".pkl", ".pickle"):
        raise GradianUserError(
            "this is a pickle (e.g. training_args.bin); Gradian never unpickles user files",
            where=str(path),
            fix="export the arguments as JSON with training_args.to_json_string() and pass that file",
        )
    suffix = path.suffix.lower()
    if suffix not in (".json", ".yaml", ".yml"):
        raise GradianUserError(
            f"unknown config file type {suffix or '(no extension)'!r}",
            where=str(path),
            fix="pass a .json or .yaml config, or a PEFT adapter folder",
        )
    text = read_text(path, "config")
    obj = parse_json(text, str(path)) if suffix == ".json" else parse_yaml(text, str(path))
    if not isinstance(obj, dict):
        raise GradianUserError(
            f"top level is a {type(obj).__name__}, not a mapping of settings",
            where=str(path),
            fix="pass a config file whose top level is key: value settings",
        )
    bad_keys = [k for k in obj if not isinstance(k, str)]
    if bad_keys:
        raise GradianUserError(
            f"setting name {short_repr(bad_keys[0])} is not a string", where=str(path),
            fix="write every top-level setting as name: value (quote names YAML reads as numbers, dates or booleans)",
        )
    if text.startswith(GRADIAN_TRAIN_HEADER) and "use_peft" in obj:
        # written by gradian train (older versions wrote no messages_loss field, but always this header line)
        obj[_BY_GRADIAN_TRAIN] = True
    return obj


#: The first line of every training_config.yaml that ``gradian train`` writes.
GRADIAN_TRAIN_HEADER = "# gradian train:"
_BY_GRADIAN_TRAIN = "\x00written by gradian train"


_TRL_KEYS = {"max_length", "max_seq_length", "packing", "completion_only_loss", "assistant_only_loss",
             "dataset_text_field", "padding_free", "packing_strategy", "use_peft", "eval_packing",
             "chat_template_path", "dataset_kwargs", "truncation_mode", "model_init_kwargs", "dataset_name"}
_HF_KEYS = {"output_dir", "per_device_train_batch_size", "num_train_epochs", "learning_rate",
            "gradient_accumulation_steps", "eval_strategy", "evaluation_strategy", "warmup_ratio",
            "lr_scheduler_type", "logging_steps", "save_steps", "max_steps", "per_device_eval_batch_size"}
_AXOLOTL_KEYS = {"base_model", "sequence_len", "micro_batch_size", "num_epochs", "adapter", "sample_packing",
                 "train_on_inputs", "val_set_size", "lora_target_linear", "lora_model_dir", "special_tokens",
                 "evals_per_epoch", "pad_to_sequence_len", "dataset_prepared_path", "flash_attention",
                 "peft_use_rslora", "peft_use_dora", "excess_length_strategy", "eval_sample_packing",
                 "lora_modules_to_save", "base_model_config", "wandb_project"}
_LF_KEYS = {"stage", "finetuning_type", "cutoff_len", "lora_rank", "lora_target", "train_on_prompt",
            "val_size", "mask_history", "neat_packing", "template", "quantization_bit",
            "preprocessing_num_workers", "overwrite_cache", "plot_loss", "additional_target", "new_special_tokens"}


_LF_V1_KEYS = {"peft_config", "model_class", "train_dataset", "kernel_config", "dist_config", "quant_config",
               "sample_backend", "global_batch_size", "batching_strategy", "optim_config", "lr_scheduler_config"}


def detect_config_format(raw: dict[str, Any]) -> str | None:
    """``trl``/``hf``/``axolotl``/``llamafactory``/``llamafactory_v1``/``torchtune``/``peft``/``gradian``, or None."""
    if "peft_type" in raw:
        return "peft"
    if (raw.get("messages_loss") is not None and "use_peft" in raw) or raw.get(_BY_GRADIAN_TRAIN):
        return "gradian"
    keys = set(raw)
    if len(keys & _LF_V1_KEYS) >= 1 and ("cutoff_len" in keys or "model" in keys) \
            and not keys & {"stage", "finetuning_type", "base_model", "sequence_len"}:
        return "llamafactory_v1"

    def has_component(obj: Any, depth: int = 0) -> bool:
        if isinstance(obj, dict):
            if "_component_" in obj:
                return True
            return depth < 2 and any(has_component(v, depth + 1) for v in obj.values())
        if isinstance(obj, list):
            return depth < 2 and any(has_component(v, depth + 1) for v in obj)
        return False

    if has_component(raw):
        return "torchtune"
    lf = len(keys & _LF_KEYS)
    ax = len(keys & _AXOLOTL_KEYS)
    trl = len(keys & _TRL_KEYS)
    if max(lf, ax) > trl:
        return "llamafactory" if lf > ax else "axolotl"
    if trl:
        return "trl"
    if keys & _HF_KEYS:
        return "hf"
    return None


def read_config(path: str | Path) -> TrainConfig:
    """Read one config file (or PEFT adapter folder) into a :class:`TrainConfig` (no defaults applied)."""
    p = Path(path)
    if not p.exists():
        raise GradianUserError("config not found", where=str(p), fix="check the path")
    versions: dict[str, str] = {}
    if p.is_dir():
        cfg_path = p / "adapter_config.json"
        if not cfg_path.exists():
            raise GradianUserError(
                "folder has no adapter_config.json",
                where=str(p),
                fix="pass a PEFT adapter folder, or the config file itself",
            )
        versions = _framework_versions(p / "README.md")
        p = cfg_path
    raw = _parse_file(p)
    fmt = detect_config_format(raw)
    if fmt is None:
        shown = ", ".join(sorted(map(str, raw))[:8]) or "none"
        raise GradianUserError(
            f"unknown config format (keys: {shown})",
            where=str(p),
            fix="pass a TRL/HF TrainingArguments, axolotl, LLaMA-Factory or torchtune config, or a PEFT adapter_config.json",
        )
    cfg = TrainConfig()
    cfg.paths.append(str(p))
    cfg.formats.append(fmt)
    r = _Reader(raw, str(p))
    {"trl": _read_trl, "hf": _read_trl, "gradian": _read_trl, "axolotl": _read_axolotl, "llamafactory": _read_lf,
     "llamafactory_v1": _read_lf_v1, "torchtune": _read_torchtune, "peft": _read_peft}[fmt](cfg, r)
    if fmt in ("trl", "hf", "axolotl", "llamafactory", "torchtune"):
        cfg.set("trainer", fmt, f"{p.name} (format)")
    elif fmt == "llamafactory_v1":
        cfg.set("trainer", "llamafactory", f"{p.name} (format: LLaMA-Factory v1)")
    elif fmt == "gradian":
        # gradian train trains like TRL's SFTTrainer (same masks, same EOS rule); its file uses TRL names
        cfg.set("trainer", "trl", f"{p.name} (format: gradian train, TRL semantics)")
    if fmt == "peft":
        pv = r.str_("peft_version")
        if pv:
            versions.setdefault("peft", pv)
    for k, v in versions.items():
        cfg.versions[k] = v
        cfg.version_sources[k] = str(p.parent / "README.md") if p.name == "adapter_config.json" else str(p)
    return cfg


def load_config(paths: str | Path | list[str | Path] | tuple) -> TrainConfig:
    """Read and merge one or more configs, then fill the training stack's defaults.

    Args:
        paths: one path or several (e.g. a TRL YAML and the adapter folder).
    Returns:
        the merged :class:`TrainConfig`; ``sources`` tells, per field, the file and key
        (or ``"default (<stack>)"``).
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    merged = TrainConfig()
    for p in paths:
        one = read_config(p)
        merge_into(merged, one)
    apply_defaults(merged)
    return merged


def merge_into(dst: TrainConfig, src: TrainConfig) -> None:
    for f in fields(TrainConfig):
        if f.name in _META:
            continue
        v = getattr(src, f.name)
        if v is not None:
            dst.set(f.name, v, src.sources.get(f.name, "?"))
    dst.paths += src.paths
    dst.formats += src.formats
    dst.conflicts += src.conflicts
    dst.notes += [n for n in src.notes if n not in dst.notes]
    for k, v in src.versions.items():
        if k not in dst.versions:
            dst.versions[k] = v
            dst.version_sources[k] = src.version_sources.get(k, "?")


def apply_defaults(cfg: TrainConfig) -> None:
    """Fill unset fields with the defaults of the stacks that read them (trainer, then PEFT)."""
    stacks = []
    if cfg.trainer == "llamafactory" and "llamafactory_v1" in cfg.formats:
        stacks.append("llamafactory_v1")
    elif cfg.trainer:
        stacks.append(cfg.trainer)
    if "peft" in cfg.formats or cfg.is_lora:
        stacks.append("peft")
    for st in stacks:
        for k, v in DEFAULTS.get(st, {}).items():
            if getattr(cfg, k) is None:
                if k == "max_length" and cfg.truncation == "none":
                    continue
                if k.startswith("lora_") or k in ("use_rslora", "use_dora"):
                    if not cfg.is_lora:
                        continue
                cfg.set(k, v, f"default ({_FMT_NAME[st]})", default=True)
        if st == "llamafactory" and cfg.is_lora and cfg.lora_alpha is None and cfg.lora_r:
            cfg.set("lora_alpha", float(cfg.lora_r * 2), "default (LLaMA-Factory: lora_alpha = 2 x lora_rank)",
                    default=True)
    if "peft" in cfg.formats and cfg.finetuning is None:
        cfg.set("finetuning", "lora", "adapter_config.json (peft_type)")


# ---------------------------------------------------------------------- per-format readers
def _set_many(cfg: TrainConfig, r: _Reader, mapping: list[tuple[str, str, str]]) -> None:
    """mapping: (TrainConfig field, config key, kind) with kind in num/int/bool/str/list."""
    for name, key, kind in mapping:
        if not r.has(key):
            continue
        v = {"num": r.num, "int": r.int_, "bool": r.bool_, "str": r.str_, "list": r.list_}[kind](key)
        cfg.set(name, v, r.where(key))


def _read_trl(cfg: TrainConfig, r: _Reader) -> None:
    _set_many(cfg, r, [
        ("base_model", "model_name_or_path", "str"),
        ("learning_rate", "learning_rate", "num"),
        ("num_epochs", "num_train_epochs", "num"),
        ("micro_batch_size", "per_device_train_batch_size", "int"),
        ("gradient_accumulation_steps", "gradient_accumulation_steps", "int"),
        ("warmup_ratio", "warmup_ratio", "num"),
        ("lr_scheduler", "lr_scheduler_type", "str"),
        ("max_grad_norm", "max_grad_norm", "num"),
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
        ("bf16", "bf16", "bool"),
        ("fp16", "fp16", "bool"),
        ("eval_steps", "eval_steps", "num"),
        ("save_strategy", "save_strategy", "str"),
        ("save_steps", "save_steps", "num"),
        ("load_best_model_at_end", "load_best_model_at_end", "bool"),
        ("group_by_length", "group_by_length", "bool"),
        ("eos_token", "eos_token", "str"),
        ("pad_token", "pad_token", "str"),
        ("chat_template_path", "chat_template_path", "str"),
        ("attn_implementation", "attn_implementation", "str"),
        ("attn_implementation", "model_init_kwargs.attn_implementation", "str"),
        # TRL ModelConfig (``trl sft --config x.yaml`` puts it in the same file)
        ("lora_r", "lora_r", "int"),
        ("lora_alpha", "lora_alpha", "num"),
        ("lora_dropout", "lora_dropout", "num"),
        ("lora_target_modules", "lora_target_modules", "list"),
        ("modules_to_save", "lora_modules_to_save", "list"),
        ("use_rslora", "use_rslora", "bool"),
        ("use_dora", "use_dora", "bool"),
        ("load_in_4bit", "load_in_4bit", "bool"),
        ("load_in_8bit", "load_in_8bit", "bool"),
        ("bnb_4bit_compute_dtype", "bnb_4bit_compute_dtype", "str"),
    ])
    for key in ("eval_strategy", "evaluation_strategy"):
        if r.has(key):
            cfg.set("eval_strategy", str(r.get(key)).lower().replace("intervalstrategy.", ""), r.where(key))
    # max_length: TRL >= 0.16 spells it max_length, older max_seq_length; None means no truncation
    for key in ("max_length", "max_seq_length"):
        if key in r.raw:
            v = r.int_(key)
            if v is None:  # max_length: null -> TRL does not truncate
                cfg.set("truncation", "none", r.where(key) + " (null)")
            else:
                cfg.set("max_length", v, r.where(key))
            break
    ms = r.int_("max_steps")
    if ms is not None and ms > 0:
        cfg.set("max_steps", ms, r.where("max_steps"))
    ws = r.num("warmup_steps")
    if ws is not None:
        if 0 < ws < 1:  # transformers >= 4.57: a float below 1 is a ratio
            cfg.set("warmup_ratio", ws, r.where("warmup_steps"))
        else:
            cfg.set("warmup_steps", ws, r.where("warmup_steps"))
    if r.bool_("use_peft"):
        cfg.set("finetuning", "qlora" if (r.bool_("load_in_4bit") or r.bool_("load_in_8bit")) else "lora",
                r.where("use_peft"))
    elif r.has("use_peft"):
        cfg.set("finetuning", "full", r.where("use_peft"))
    elif _TRL_CLI_KEYS & set(r.raw):
        # a `trl sft --config` file (it names the model / dataset, which an SFTConfig dump never does):
        # TRL's ModelConfig.use_peft defaults to false, so the CLI fine-tunes every weight
        key = next(k for k in sorted(_TRL_CLI_KEYS) if k in r.raw)
        cfg.set("finetuning", "full", f"default (TRL ModelConfig: use_peft is false; a CLI config, {r.where(key)})",
                default=True)
    stage = _trl_stage(r)
    if stage:
        cfg.set("stage", stage[0], r.where(stage[1]))
    if r.has("messages_loss"):
        ml = r.str_("messages_loss")
        if ml != "final_assistant_turn":
            r._bad("messages_loss", ml, "'final_assistant_turn' (what gradian train does)")
        cfg.set("messages_loss", ml, r.where("messages_loss"))
    elif r.raw.get(_BY_GRADIAN_TRAIN):
        cfg.set("messages_loss", "final_assistant_turn",
                f"{Path(r.path).name} (written by gradian train, which trains a 'messages' row on its final "
                f"assistant turn)")
    if r.has("eval_dataset"):
        cfg.set("has_eval_dataset", True, r.where("eval_dataset"))
    elif r.has("dataset_test_split") and r.has("eval_strategy"):
        cfg.set("has_eval_dataset", True, r.where("dataset_test_split"))


_TRL_CLI_KEYS = {"model_name_or_path", "dataset_name", "dataset_config", "dataset_train_split"}
# Fields that only a preference or RL trainer's config has (TRL DPOConfig, KTOConfig, CPOConfig, GRPOConfig ...)
_TRL_STAGE_KEYS = (
    ("grpo", ("reward_funcs", "num_generations")),
    ("kto", ("desirable_weight", "undesirable_weight")),
    ("cpo", ("cpo_alpha",)),
    ("dpo", ("rpo_alpha", "precompute_ref_log_probs", "ref_adapter_name", "ref_model_init_kwargs", "sync_ref_model",
             "f_divergence_type", "ld_alpha", "reference_free")),
)


def _trl_stage(r: _Reader) -> tuple[str, str] | None:
    """A TRL config's trainer, from fields only that trainer has: ``(stage, field)``."""
    for stage, keys in _TRL_STAGE_KEYS:
        for k in keys:
            if k in r.raw:
                return stage, k
    return None


def _read_axolotl(cfg: TrainConfig, r: _Reader) -> None:
    _set_many(cfg, r, [
        ("base_model", "base_model", "str"),
        ("learning_rate", "learning_rate", "num"),
        ("num_epochs", "num_epochs", "num"),
        ("micro_batch_size", "micro_batch_size", "int"),
        ("gradient_accumulation_steps", "gradient_accumulation_steps", "int"),
        ("total_batch_size", "batch_size", "int"),
        ("warmup_ratio", "warmup_ratio", "num"),
        ("warmup_steps", "warmup_steps", "num"),
        ("lr_scheduler", "lr_scheduler", "str"),
        ("max_grad_norm", "max_grad_norm", "num"),
        ("max_length", "sequence_len", "int"),
        ("truncation", "excess_length_strategy", "str"),
        ("packing", "sample_packing", "bool"),
        ("train_on_inputs", "train_on_inputs", "bool"),
        ("lora_r", "lora_r", "int"),
        ("lora_alpha", "lora_alpha", "num"),
        ("lora_dropout", "lora_dropout", "num"),
        ("lora_target_modules", "lora_target_modules", "list"),
        ("lora_target_linear", "lora_target_linear", "bool"),
        ("modules_to_save", "lora_modules_to_save", "list"),
        ("use_rslora", "peft_use_rslora", "bool"),
        ("use_dora", "peft_use_dora", "bool"),
        ("load_in_4bit", "load_in_4bit", "bool"),
        ("load_in_8bit", "load_in_8bit", "bool"),
        ("bf16", "bf16", "bool"),
        ("fp16", "fp16", "bool"),
        ("eval_steps", "eval_steps", "num"),
        ("save_steps", "save_steps", "num"),
        ("load_best_model_at_end", "load_best_model_at_end", "bool"),
        ("val_set_size", "val_set_size", "num"),
        ("group_by_length", "group_by_length", "bool"),
        ("chat_template", "chat_template", "str"),
        ("attn_implementation", "attn_implementation", "str"),
    ])
    ms = r.int_("max_steps")
    if ms is not None and ms > 0:
        cfg.set("max_steps", ms, r.where("max_steps"))
    adapter = r.str_("adapter")
    if adapter:
        cfg.set("finetuning", "qlora" if adapter.lower() == "qlora" else "lora", r.where("adapter"))
    rl = r.get("rl")
    if rl is not None and rl is not False:
        cfg.set("stage", "dpo" if rl is True else str(rl).lower().replace("rltype.", ""), r.where("rl"))
    elif r.has("pretraining_dataset"):
        cfg.set("stage", "pt", r.where("pretraining_dataset"))
    if r.has("dataset_exact_deduplication"):
        cfg.set("dedup_exact", r.bool_("dataset_exact_deduplication"), r.where("dataset_exact_deduplication"))
    if r.has("eval_strategy"):
        cfg.set("eval_strategy", str(r.get("eval_strategy")).lower(), r.where("eval_strategy"))
    elif r.has("evals_per_epoch") and (r.int_("evals_per_epoch") or 0) > 0:
        cfg.set("eval_strategy", "steps", r.where("evals_per_epoch"))
    if r.has("test_datasets"):
        cfg.set("has_eval_dataset", True, r.where("test_datasets"))
    for key, impl in (("flash_attention", "flash_attention_2"), ("flex_attention", "flex_attention"),
                      ("sdp_attention", "sdpa"), ("xformers_attention", "xformers")):
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
    ds = r.get("datasets")
    if isinstance(ds, list):
        norm = []
        for i, d in enumerate(ds):
            if not isinstance(d, dict):
                continue
            def text(key: str) -> str | None:
                v = d.get(key)
                return v if isinstance(v, str) else None

            norm.append({
                "index": i,
                "path": text("path"),
                "type": text("type"),
                "field": text("field"),
                "field_messages": text("field_messages"),
                "roles_to_train": [str(x) for x in d["roles_to_train"]] if isinstance(d.get("roles_to_train"), list)
                else None,
                "train_on_eos": text("train_on_eos"),
                "chat_template": text("chat_template"),
            })
            if text("chat_template") and not r.has("chat_template"):
                cfg.set("chat_template", str(d["chat_template"]), r.where(f"datasets[{i}].chat_template"))
        cfg.set("datasets", norm, r.where("datasets"))


def _read_lf(cfg: TrainConfig, r: _Reader) -> None:
    _set_many(cfg, r, [
        ("base_model", "model_name_or_path", "str"),
        ("learning_rate", "learning_rate", "num"),
        ("num_epochs", "num_train_epochs", "num"),
        ("micro_batch_size", "per_device_train_batch_size", "int"),
        ("gradient_accumulation_steps", "gradient_accumulation_steps", "int"),
        ("warmup_ratio", "warmup_ratio", "num"),
        ("warmup_steps", "warmup_steps", "num"),
        ("lr_scheduler", "lr_scheduler_type", "str"),
        ("max_grad_norm", "max_grad_norm", "num"),
        ("max_length", "cutoff_len", "int"),
        ("train_on_inputs", "train_on_prompt", "bool"),
        ("lora_r", "lora_rank", "int"),
        ("lora_alpha", "lora_alpha", "num"),
        ("lora_dropout", "lora_dropout", "num"),
        ("lora_target_modules", "lora_target", "list"),
        ("modules_to_save", "additional_target", "list"),
        ("use_rslora", "use_rslora", "bool"),
        ("use_dora", "use_dora", "bool"),
        ("bf16", "bf16", "bool"),
        ("fp16", "fp16", "bool"),
        ("eval_steps", "eval_steps", "num"),
        ("save_steps", "save_steps", "num"),
        ("save_strategy", "save_strategy", "str"),
        ("load_best_model_at_end", "load_best_model_at_end", "bool"),
        ("val_set_size", "val_size", "num"),
        ("chat_template", "template", "str"),
        ("group_by_length", "group_by_length", "bool"),
    ])
    ms = r.int_("max_steps")
    if ms is not None and ms > 0:
        cfg.set("max_steps", ms, r.where("max_steps"))
    stage = (r.str_("stage") or "").strip().lower()
    if stage:
        pref = (r.str_("pref_loss") or "").strip().lower()
        if stage == "dpo" and pref in ("orpo", "simpo"):
            cfg.set("stage", pref, r.where("pref_loss"))
        else:
            cfg.set("stage", stage, r.where("stage"))
    if stage == "pt" and not r.has("packing") and not r.bool_("neat_packing"):
        cfg.set("packing", True, f"{r.where('stage')} (LLaMA-Factory turns packing on for stage pt)")
    ft = r.str_("finetuning_type")
    if ft:
        ft = ft.lower()
        q = r.int_("quantization_bit")
        cfg.set("finetuning", ("qlora" if q else "lora") if ft == "lora" else "full", r.where("finetuning_type"))
    qb = r.int_("quantization_bit")
    if qb == 4:
        cfg.set("load_in_4bit", True, r.where("quantization_bit"))
    elif qb == 8:
        cfg.set("load_in_8bit", True, r.where("quantization_bit"))
    if r.bool_("packing") or r.bool_("neat_packing"):
        cfg.set("packing", True, r.where("neat_packing" if r.bool_("neat_packing") else "packing"))
        if r.bool_("neat_packing"):
            cfg.set("attn_implementation", "neat_packing", r.where("neat_packing"))
    elif r.has("packing"):
        cfg.set("packing", False, r.where("packing"))
    for key in ("eval_strategy", "evaluation_strategy"):
        if r.has(key):
            cfg.set("eval_strategy", str(r.get(key)).lower(), r.where(key))
    if r.has("eval_dataset"):
        cfg.set("has_eval_dataset", True, r.where("eval_dataset"))
    fa = r.str_("flash_attn")
    if fa:
        cfg.set("attn_implementation", {"fa2": "flash_attention_2", "sdpa": "sdpa", "disabled": "eager"}.get(fa, fa),
                r.where("flash_attn"))
    toks = r.list_("new_special_tokens") or r.list_("add_special_tokens") or r.list_("add_tokens")
    if toks:
        key = next(k for k in ("new_special_tokens", "add_special_tokens", "add_tokens") if r.has(k))
        cfg.set("added_tokens", [toks] if isinstance(toks, str) else toks, r.where(key))


def _read_lf_v1(cfg: TrainConfig, r: _Reader) -> None:
    """LLaMA-Factory v1 (``llamafactory-cli sft|dpo|rm config.yaml``): ``model``, ``peft_config``, ``cutoff_len`` ..."""
    _set_many(cfg, r, [
        ("base_model", "model", "str"),
        ("learning_rate", "learning_rate", "num"),
        ("num_epochs", "num_train_epochs", "num"),
        ("micro_batch_size", "micro_batch_size", "int"),
        ("total_batch_size", "global_batch_size", "int"),
        ("max_length", "cutoff_len", "int"),
        ("max_grad_norm", "max_grad_norm", "num"),
        ("bf16", "bf16", "bool"),
        ("chat_template", "template", "str"),
    ])
    ms = r.int_("max_steps")
    if ms is not None and ms > 0:
        cfg.set("max_steps", ms, r.where("max_steps"))
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
            _set_many(cfg, r, [
                ("lora_r", "peft_config.r", "int"),
                ("lora_alpha", "peft_config.lora_alpha", "num"),
                ("lora_dropout", "peft_config.lora_dropout", "num"),
                ("lora_target_modules", "peft_config.target_modules", "list"),
            ])
        elif name:
            cfg.set("finetuning", "full" if name in ("freeze", "full") else name, r.where("peft_config.name"))
    mc = (r.str_("model_class") or "").lower()
    if mc == "cls":
        cfg.set("stage", "rm", f"{r.where('model_class')} (a classification head: reward modelling)")
    else:
        cfg.notes.append(f"{Path(r.path).name}: a LLaMA-Factory v1 config does not say its stage (it is the "
                         "llamafactory-cli command: sft, dpo or rm); the SFT rules were applied")


# torchtune dataset builders: what each does when the config leaves a field unset
# (torchtune/datasets/*.py; alpaca_cleaned_dataset is partial(alpaca_dataset, ...)).
_TT_TRAIN_ON_INPUT = {
    "alpaca_dataset": True, "alpaca_cleaned_dataset": True, "chat_dataset": False, "instruct_dataset": False,
    "grammar_dataset": False, "samsum_dataset": False, "slimorca_dataset": False,
}
_TT_STAGE = {
    "text_completion_dataset": "pt", "wikitext_dataset": "pt", "cnn_dailymail_articles_dataset": "pt",
    "preference_dataset": "dpo", "stack_exchange_paired_dataset": "dpo", "hh_rlhf_helpful_dataset": "dpo",
}


def _tt_loss_stage(leaf: str) -> str | None:
    low = leaf.lower()
    for key, stage in (("simpo", "simpo"), ("grpo", "grpo"), ("ppo", "ppo"), ("ipo", "ipo"), ("rso", "dpo"),
                       ("dpo", "dpo")):
        if key in low:
            return stage
    return None


def _read_torchtune(cfg: TrainConfig, r: _Reader) -> None:
    comp = str(r.get("model._component_") or "")
    if comp:
        leaf = comp.rsplit(".", 1)[-1].lower()
        ft = "qlora" if leaf.startswith("qlora") else "lora" if "lora" in leaf else "full"
        cfg.set("finetuning", ft, r.where("model._component_"))
        cfg.set("base_model", comp, r.where("model._component_"))
    _set_many(cfg, r, [
        ("learning_rate", "optimizer.lr", "num"),
        ("num_epochs", "epochs", "num"),
        ("micro_batch_size", "batch_size", "int"),
        ("gradient_accumulation_steps", "gradient_accumulation_steps", "int"),
        ("warmup_steps", "lr_scheduler.num_warmup_steps", "num"),
        ("max_grad_norm", "clip_grad_norm", "num"),
        ("max_length", "tokenizer.max_seq_len", "int"),
        ("lora_r", "model.lora_rank", "int"),
        ("lora_alpha", "model.lora_alpha", "num"),
        ("lora_dropout", "model.lora_dropout", "num"),
        ("use_dora", "model.use_dora", "bool"),
        ("load_in_4bit", "model.quantize_base", "bool"),
    ])
    if r.has("lr_scheduler._component_"):
        cfg.set("lr_scheduler", str(r.get("lr_scheduler._component_")).rsplit(".", 1)[-1], r.where("lr_scheduler._component_"))
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
    ds = r.get("dataset")
    dss = ds if isinstance(ds, list) else [ds] if isinstance(ds, dict) else []
    for i, d in enumerate(dss):
        key = f"dataset[{i}]" if isinstance(ds, list) else "dataset"
        if not isinstance(d, dict):
            continue
        dr = _Reader(d, r.path)
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


def _read_peft(cfg: TrainConfig, r: _Reader) -> None:
    pt = str(r.get("peft_type") or "").upper()
    if pt not in ("LORA",):
        cfg.set("finetuning", pt.lower() or "unknown", r.where("peft_type"))
    else:
        cfg.set("finetuning", "lora", r.where("peft_type"))
    _set_many(cfg, r, [
        ("base_model", "base_model_name_or_path", "str"),
        ("lora_r", "r", "int"),
        ("lora_alpha", "lora_alpha", "num"),
        ("lora_dropout", "lora_dropout", "num"),
        ("lora_target_modules", "target_modules", "list"),
        ("modules_to_save", "modules_to_save", "list"),
        ("use_rslora", "use_rslora", "bool"),
        ("use_dora", "use_dora", "bool"),
    ])
    if isinstance(cfg.modules_to_save, str):
        cfg.modules_to_save = [cfg.modules_to_save]
    if r.get("trainable_token_indices"):
        cfg.set("trainable_token_indices", r.get("trainable_token_indices"), r.where("trainable_token_indices"))


_FW_RE = re.compile(r"^\s*[-*]\s*(TRL|Transformers|PEFT|Pytorch|PyTorch|Datasets|Tokenizers)\s*:?\s*v?([0-9][\w.+-]*)",
                    re.IGNORECASE)


def _framework_versions(readme: Path) -> dict[str, str]:
    """Library versions from a model card's "Framework versions" list (TRL and PEFT write one)."""
    if not readme.exists():
        return {}
    out: dict[str, str] = {}
    try:
        text = read_text(readme, "model card")
    except GradianUserError:  # a model card we cannot read only costs the version hints
        return {}
    for line in text.splitlines():
        m = _FW_RE.match(line)
        if m:
            out.setdefault(m.group(1).lower().replace("pytorch", "torch"), m.group(2).rstrip("."))
    return out
