"""``gradian train``'s settings: :class:`TrainSpec`, and its config file (``training_config.yaml``, a
``trl sft --config``-style YAML: ``SFTConfig`` fields, LoRA in TRL ``ModelConfig`` names) read and written.

:func:`load_train_config` reads a YAML/JSON config through the same reader ``gradian diagnose`` uses
(:mod:`gradian.audit.config`), :func:`spec_from_config` turns it (and CLI overrides) into a :class:`TrainSpec`,
:func:`write_train_config` writes one back. The trainer itself is :func:`gradian.train.train_lora`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from gradian.defaults import DEVICE, DTYPE, MAX_LENGTH
from gradian.errors import GradianUserError
from gradian.util import atomic_write_text

ALL_LINEAR_LLAMA = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


CONFIG_NAME = "training_config.yaml"


@dataclass(frozen=True)
class TrainSpec:
    """Every knob of a ``gradian train`` run (TRL ``SFTConfig`` names; LoRA fields as in PEFT's ``LoraConfig``).

    Attributes:
        learning_rate: peak AdamW learning rate (LoRA runs usually 1e-4 to 2e-4).
        num_train_epochs: passes over the data.
        per_device_train_batch_size: rows per micro-batch.
        gradient_accumulation_steps: micro-batches per optimizer step.
        warmup_ratio: fraction of the optimizer steps with linear warmup from 0.
        lr_scheduler_type: ``"linear"``, ``"cosine"`` or ``"constant"`` (HF names).
        weight_decay: AdamW weight decay.
        max_grad_norm: gradient clipping norm (0 disables).
        max_length: truncate rendered rows to this many tokens (keep the start); default
            :data:`gradian.defaults.MAX_LENGTH` (1024, TRL's ``SFTConfig`` default). Batches are padded to their
            longest row, so a larger limit costs nothing for rows shorter than it.
        completion_only_loss: loss on the completion only (False: on every token).
        packing: must be False (packing is not implemented).
        add_eos: append EOS to plain completions and text rows, as TRL does.
        group_by_length: batch rows of similar length together (less padding).
        seed: LoRA init, data order, dropout masks.
        logging_steps: log loss/grad_norm/learning_rate every this many optimizer steps.
        r, lora_alpha, lora_dropout, target_modules, use_rslora: the LoRA adapter.
        use_dora: a DoRA adapter (PEFT's ``use_dora``: a trained magnitude per output feature beside A and B).
            Left out of :meth:`to_dict` while false, so the ids of runs made before it existed stay the same.
        dtype: training dtype of the base weights and adapter (``"float32"`` on CPU).
        device: ``"auto"`` (default: CUDA, else MPS, else CPU), ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"``;
            resolved by :func:`gradian.models.load.resolve_device` (``gradian_train.json`` records the result).
        save_strategy: ``"epoch"`` (default) keeps a checkpoint per epoch in ``out/checkpoint-<step>/``
            (HF Trainer layout: adapter, ``optimizer.pt``, ``trainer_state.json``), the training
            trajectory ``gradian attribute`` scores over; ``"steps"`` one every ``save_steps`` optimizer steps;
            ``"no"`` keeps only the final adapter.
        save_steps: with ``save_strategy: steps``, the optimizer steps between checkpoints (0 otherwise). Left out
            of :meth:`to_dict` while 0, so the ids of runs made before it existed stay the same.
    """

    learning_rate: float = 2e-4
    num_train_epochs: float = 3.0
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    warmup_ratio: float = 0.05
    lr_scheduler_type: str = "linear"
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    max_length: int = MAX_LENGTH
    completion_only_loss: bool = True
    packing: bool = False
    add_eos: bool = True
    group_by_length: bool = True
    seed: int = 0
    logging_steps: int = 1
    r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    target_modules: tuple[str, ...] = ALL_LINEAR_LLAMA
    use_rslora: bool = False
    use_dora: bool = False
    dtype: str = DTYPE
    device: str = DEVICE
    save_strategy: str = "epoch"
    save_steps: int = 0

    def __post_init__(self) -> None:
        self.validate("TrainSpec")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["target_modules"] = list(self.target_modules)
        if not self.use_dora:
            del d["use_dora"]
        if not self.save_steps:
            del d["save_steps"]
        return d

    def replace(self, **kw: Any) -> TrainSpec:
        d = {**asdict(self), **{k: v for k, v in kw.items() if v is not None}}
        d["target_modules"] = tuple(d["target_modules"])
        return TrainSpec(**d)

    def to_config(self, base: str | None = None, has_eval: bool = False) -> dict[str, Any]:
        """The run as a ``trl sft --config`` YAML dict: SFTConfig fields + ModelConfig's LoRA fields.

        LoRA settings use TRL's ``ModelConfig`` names (``use_peft, lora_r,
        lora_alpha, lora_dropout, lora_target_modules, use_rslora``), as in a
        file TRL's CLI reads; ``add_eos``, ``dtype`` and ``device`` are Gradian's.
        """
        d = self.to_dict()
        cfg: dict[str, Any] = {}
        if base is not None:
            cfg["model_name_or_path"] = str(base)
        for k in (
            "learning_rate",
            "num_train_epochs",
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
            "warmup_ratio",
            "lr_scheduler_type",
            "weight_decay",
            "max_grad_norm",
            "max_length",
            "completion_only_loss",
            "packing",
            "group_by_length",
            "seed",
            "logging_steps",
        ):
            cfg[k] = d[k]
        cfg["eval_strategy"] = "epoch" if has_eval else "no"
        cfg["save_strategy"] = d["save_strategy"]
        if self.save_steps:
            cfg["save_steps"] = self.save_steps
        cfg["use_peft"] = True
        for k in ("r", "lora_alpha", "lora_dropout", "target_modules", "use_rslora"):
            cfg[_TRL_NAME.get(k, k)] = d[k]
        if self.use_dora:  # TRL's ModelConfig name; absent when false, as in to_dict
            cfg["use_dora"] = True
        # gradian's own mask for 'messages' rows, which no TRL field expresses (TRL's assistant_only_loss
        # trains every assistant turn, its default every token): gradian diagnose reads this
        cfg["messages_loss"] = "final_assistant_turn"
        cfg["add_eos"] = d["add_eos"]
        cfg["dtype"] = d["dtype"]
        cfg["device"] = d["device"]
        return cfg

    def validate(self, where: str = "train config") -> None:
        """Refuse values gradian train cannot run with (types, ranges, finiteness); the error's
        ``field`` attribute names the field (:func:`spec_from_config` maps it to the flag or file key).
        """

        def bad(name: str, why: str, fix: str) -> GradianUserError:
            e = GradianUserError(why, where=f"{where}: {name}", fix=fix)
            e.field = name  # type: ignore[attr-defined]
            return e

        import math

        from gradian.models.load import _DEVICE, DTYPES
        from gradian.validate import SEED_MAX

        for name, hi in (
            ("learning_rate", 1.0),
            ("num_train_epochs", 10_000.0),
            ("warmup_ratio", 1.0),
            ("weight_decay", 1e6),
            ("max_grad_norm", 1e12),
            ("lora_dropout", 1.0),
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise bad(name, f"{name} must be a finite number (got {v!r})", f"give {name} a number")
            if v > hi:
                raise bad(name, f"{name} must be at most {hi:g} (got {v:g})", f"give {name} a sensible value")
        for name, hi in (
            ("per_device_train_batch_size", 1_000_000),
            ("gradient_accumulation_steps", 1_000_000),
            ("max_length", 10**9),
            ("r", 4096),
            ("logging_steps", 10**9),
            ("save_steps", 10**9),
            ("seed", SEED_MAX),
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise bad(name, f"{name} must be a whole number (got {v!r})", f"give {name} a whole number")
            if v > hi:
                raise bad(name, f"{name} must be at most {hi:,} (got {v:,})", f"give {name} a sensible value")
        for name in ("completion_only_loss", "packing", "add_eos", "group_by_length", "use_rslora", "use_dora"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, f"{name} must be true or false (got {getattr(self, name)!r})", "give true or false")
        if (
            isinstance(self.lora_alpha, bool)
            or not isinstance(self.lora_alpha, (int, float))
            or not math.isfinite(self.lora_alpha)
            or not self.lora_alpha > 0
        ):
            raise bad("lora_alpha", f"lora_alpha must be a number > 0 (got {self.lora_alpha!r})", "use 2 x r, e.g. 32")
        if self.packing:
            raise bad("packing", "packing is not supported by gradian train", "set packing: false")
        if not self.learning_rate > 0:
            raise bad("learning_rate", f"learning_rate must be > 0 (got {self.learning_rate})", "use e.g. 2e-4")
        if not self.num_train_epochs > 0:
            raise bad("num_train_epochs", "num_train_epochs must be > 0", "use 1 to 3")
        for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "r", "logging_steps"):
            if int(getattr(self, name)) < 1:
                raise bad(name, f"{name} must be >= 1", f"set {name} to a positive integer")
        if self.max_length < 2:
            raise bad(
                "max_length",
                "max_length must be >= 2 (one prompt token and one target)",
                "use the length the rows need, e.g. 256",
            )
        if self.weight_decay < 0 or self.max_grad_norm < 0:
            name = "weight_decay" if self.weight_decay < 0 else "max_grad_norm"
            raise bad(name, f"{name} must be >= 0", f"set {name} to 0 or more")
        if self.seed < 0:
            raise bad("seed", "seed must be >= 0", f"use a seed in [0, {SEED_MAX}]")
        if not 0 <= self.warmup_ratio < 1:
            raise bad("warmup_ratio", "warmup_ratio must be in [0, 1)", "use 0.03 to 0.1")
        if not 0 <= self.lora_dropout < 1:
            raise bad("lora_dropout", "lora_dropout must be in [0, 1)", "use 0.0 to 0.1")
        if not isinstance(self.target_modules, tuple) or not all(isinstance(t, str) and t for t in self.target_modules):
            raise bad("target_modules", "target_modules must be a list of module names", "e.g. [q_proj, v_proj]")
        if not self.target_modules:
            raise bad("target_modules", "no LoRA target modules", "list module names such as q_proj, v_proj")
        if self.dtype not in DTYPES:
            raise bad("dtype", f"unknown dtype {self.dtype!r}", f"use one of {', '.join(DTYPES)}")
        if not isinstance(self.device, str) or not _DEVICE.match(self.device):
            raise bad("device", f"unknown device {self.device!r}", "use cpu, cuda, cuda:N, mps or auto")
        if self.save_strategy not in ("epoch", "steps", "no"):
            raise bad("save_strategy", f"unknown save_strategy {self.save_strategy!r}", "use epoch, steps or no")
        if (self.save_strategy == "steps") != (self.save_steps > 0):
            raise bad(
                "save_steps",
                f"save_steps {self.save_steps} with save_strategy {self.save_strategy!r}",
                "give save_steps > 0 with save_strategy: steps, and leave it out otherwise",
            )
        if self.lr_scheduler_type not in (
            "linear",
            "cosine",
            "constant",
            "constant_with_warmup",
            "cosine_with_restarts",
            "polynomial",
        ):
            raise bad("lr_scheduler_type", f"unknown scheduler {self.lr_scheduler_type!r}", "use linear or cosine")


_SPEC_FIELDS = {f.name for f in fields(TrainSpec)}


#: TrainSpec fields named as in PEFT's LoraConfig, with their TRL ModelConfig names (what the YAML holds).
_TRL_NAME = {"r": "lora_r", "target_modules": "lora_target_modules"}


_SPEC_NAME = {v: k for k, v in _TRL_NAME.items()}


# SFTConfig/TrainingArguments fields that do not change what gradian train computes; accepted and ignored.
_IGNORED = {
    "output_dir",
    "report_to",
    "logging_dir",
    "save_total_limit",
    "eval_strategy",
    "evaluation_strategy",
    "eval_steps",
    "per_device_eval_batch_size",
    "bf16",
    "fp16",
    "tf32",
    "optim",
    "dataset_text_field",
    "run_name",
    "push_to_hub",
    "peft_type",
    "task_type",
    "bias",
    "gradient_checkpointing",
    "dataloader_num_workers",
    "logging_first_step",
    "overwrite_output_dir",
    "do_train",
    "do_eval",
    "model_name_or_path",
    "use_peft",
    "torch_dtype",
}


def load_train_config(path: str | Path) -> dict[str, Any]:
    """Read a YAML/JSON training config into TrainSpec fields (``peft:`` section flattened).

    The file is loaded, and other tools' names for a setting resolved, by the same reader ``gradian diagnose``
    uses (:mod:`gradian.audit.config`). Unknown keys are refused with the key named, so a typo never silently
    falls back to a default.
    """
    from gradian.audit.config import canonical_key, read_mapping

    p = Path(path)
    if not p.exists():
        raise GradianUserError("config file not found", where=str(p), fix="check the path")
    raw, _ = read_mapping(p, "training config", any_suffix=True, empty_ok=True)
    flat: dict[str, Any] = {}
    for section in ("peft", "lora", "peft_config"):
        sub = raw.pop(section, None)
        if sub is None:
            continue
        if not isinstance(sub, dict):
            raise GradianUserError(
                f"{section} must be a mapping", where=f"{p}: {section}", fix="indent its fields under it"
            )
        flat.update(sub)
    flat.update(raw)
    out: dict[str, Any] = {}
    if flat.get("use_peft") is False:
        raise GradianUserError(
            "use_peft is false, but gradian train only trains LoRA adapters",
            where=f"{p}: use_peft",
            fix="set use_peft: true",
        )
    ml = flat.pop("messages_loss", "final_assistant_turn")
    if ml != "final_assistant_turn":
        raise GradianUserError(
            f"messages_loss is {ml!r}, but gradian train trains a 'messages' row on its final assistant turn only",
            where=f"{p}: messages_loss",
            fix="set messages_loss: final_assistant_turn, or drop it",
        )
    for k, v in flat.items():
        key = canonical_key(k)  # other tools' names (TRL < 0.16, axolotl, PEFT): the audit reader's aliases
        key = _SPEC_NAME.get(key, key)
        if key in _IGNORED:
            continue
        if key not in _SPEC_FIELDS:
            raise GradianUserError(
                f"unknown training setting {k!r}",
                where=f"{p}: {k}",
                fix=f"use one of {', '.join(sorted(_SPEC_FIELDS))}",
            )
        out[key] = v
    if out.get("save_strategy", "epoch") != "steps":  # a TRL config's save_steps beside another strategy: unused
        out.pop("save_steps", None)
    if "target_modules" in out:
        tm = out["target_modules"]
        if isinstance(tm, str):
            tm = ALL_LINEAR_LLAMA if tm == "all-linear" else [x.strip() for x in tm.split(",") if x.strip()]
        if not isinstance(tm, (list, tuple)):
            raise GradianUserError(
                "target_modules must be a list of module names",
                where=f"{p}: target_modules",
                fix="e.g. target_modules: [q_proj, v_proj]",
            )
        out["target_modules"] = tuple(tm)
    return out


#: The ``gradian train`` flag of each TrainSpec field (for error messages).
TRAIN_FLAGS = {
    "learning_rate": "--lr",
    "num_train_epochs": "--epochs",
    "r": "--r",
    "lora_alpha": "--alpha",
    "lora_dropout": "--dropout",
    "target_modules": "--targets",
    "max_length": "--max-length",
    "per_device_train_batch_size": "--batch-size",
    "gradient_accumulation_steps": "--grad-accum",
    "warmup_ratio": "--warmup-ratio",
    "lr_scheduler_type": "--scheduler",
    "completion_only_loss": "--loss-on-all",
    "use_dora": "--dora",
    "seed": "--seed",
    "logging_steps": "--logging-steps",
    "device": "--device",
    "dtype": "--dtype",
}


def spec_from_config(path: str | Path | None, **overrides: Any) -> TrainSpec:
    """A :class:`TrainSpec` from defaults ← config file ← non-None ``overrides``; validated.

    An error names where the bad value came from: the flag (``--lr``) or the file and key.
    """
    cfg = load_train_config(path) if path is not None else {}
    given = {k: v for k, v in overrides.items() if v is not None}
    unknown = sorted(set(given) - _SPEC_FIELDS)
    if unknown:
        raise GradianUserError(
            f"unknown training setting {unknown[0]!r}",
            where="flags",
            fix=f"use one of {', '.join(sorted(_SPEC_FIELDS))}",
        )

    def origin(name: str) -> str:
        if name in given:
            return f"{TRAIN_FLAGS.get(name, name)} (TrainSpec.{name})"
        if name in cfg:
            return f"{path}: {name}"
        return f"TrainSpec.{name} (default)"

    merged = {**asdict(TrainSpec()), **cfg, **given}
    # YAML gives strings for some numbers (e.g. "2e-4" is a str in YAML 1.1)
    typed: dict[str, Any] = {}
    for f in fields(TrainSpec):
        v = merged[f.name]
        try:
            if f.type in ("float",):
                if isinstance(v, bool):
                    raise ValueError(v)
                v = float(v)
            elif f.type in ("int",):
                if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
                    raise ValueError(v)
                v = int(v)
            elif f.type in ("bool",) and not isinstance(v, bool):
                raise ValueError(v)
            elif f.name == "target_modules":
                if isinstance(v, str) or not isinstance(v, (list, tuple)):
                    raise ValueError(v)
                v = tuple(v)
        except (TypeError, ValueError, OverflowError):
            raise GradianUserError(
                f"{f.name} must be a {f.type} (got {str(v)[:60]!r})",
                where=origin(f.name),
                fix=f"give {f.name} a {f.type}",
            ) from None
        typed[f.name] = v
    try:
        return TrainSpec(**typed)
    except GradianUserError as e:
        name = getattr(e, "field", None)
        if name is None:
            raise
        raise GradianUserError(e.what, where=origin(name), fix=e.fix) from None


def write_train_config(spec: TrainSpec, path: str | Path, base: str | None = None, has_eval: bool = False) -> None:
    """Write ``spec`` as a ``trl sft --config``-style YAML (see :meth:`TrainSpec.to_config`)."""
    import yaml

    from gradian.audit.config import GRADIAN_TRAIN_HEADER

    text = f"{GRADIAN_TRAIN_HEADER} TRL SFTConfig fields, LoRA in TRL ModelConfig names (trl sft --config style)\n"
    text += yaml.safe_dump(spec.to_config(base, has_eval), sort_keys=False)
    atomic_write_text(path, text)
