"""``gradian train``: a convenience LoRA trainer over the data formats Gradian reads.

Gradian is a debugger for fine-tunes that already exist; this trainer exists so
the worked example (and a user without a training stack) can produce one. It
leaves behind what a user's TRL run does, so every other command reads it the
same way:

* ``adapter_config.json`` + ``adapter_model.safetensors`` (PEFT ``save_pretrained``);
* ``training_config.yaml``: the run's settings as a ``trl sft --config`` YAML:
  ``SFTConfig`` fields (``learning_rate, num_train_epochs,
  per_device_train_batch_size, gradient_accumulation_steps, warmup_ratio,
  lr_scheduler_type, max_length, completion_only_loss, packing, seed, ...``)
  and the LoRA settings in TRL ``ModelConfig`` names (``use_peft, lora_r,
  lora_alpha, lora_dropout, lora_target_modules, use_rslora``); the same
  values are in PEFT's ``adapter_config.json``. ``--config`` reads this file
  back (a ``peft:``/``lora:`` section with PEFT names is accepted too). It also
  says what TRL's names cannot: ``messages_loss: final_assistant_turn`` (a
  ``messages`` row is trained on its final assistant turn only, see below), which
  ``gradian diagnose`` reads, so it does not mistake the run for TRL training
  every turn of a conversation;
* ``trainer_state.json`` (the HF ``TrainerState``: ``log_history`` with
  ``loss, grad_norm, learning_rate, epoch, step`` every ``logging_steps``
  steps, an ``eval_loss`` entry per epoch when an eval split is given, and the
  final ``train_runtime``/``train_loss`` entry);
* ``gradian_train.json``: base, data files and their sha256, dropped rows,
  library versions.

How it trains. PEFT LoRA on the base's Linear layers, HF ``Trainer`` (AdamW,
linear or cosine schedule with warmup), float32 on CPU unless told otherwise.
Rows are tokenised with :func:`gradian.data.tokenize.tokenize_example` and
batched with :func:`gradian.data.tokenize.collate`, so the loss mask the model
is trained on is exactly the mask the attribution lane differentiates
(TRL ``SFTTrainer`` semantics: completion-only loss, chat template for chat
rows, EOS appended to plain completions, truncation keeps the start at
``max_length``). The loss of a batch is the HF causal-LM loss: the mean of the
token cross-entropies over every supervised token in the batch (summed over
gradient-accumulation micro-batches and divided by their total token count).

Rows with no supervised token left (a prompt that fills ``max_length``) cannot
contribute a loss; they are dropped and listed in ``gradian_train.json``.
Packing is not implemented (``packing: true`` is refused).

Determinism: one ``seed`` sets the LoRA initialisation, the data order and the
LoRA dropout masks; on the same machine and thread count the adapter is
bit-identical across runs.

Writes are atomic: the run trains into a temporary sibling folder that is
renamed to ``out`` only when everything is written.
"""

from __future__ import annotations

import inspect
import json
import shutil
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable, Sequence

from gradian.errors import GradianUserError
from gradian.util import atomic_write_json, atomic_write_text, publish_folder, sha256_file

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
        max_length: truncate rendered rows to this many tokens (keep the start).
        completion_only_loss: loss on the completion only (False: on every token).
        packing: must be False (packing is not implemented).
        add_eos: append EOS to plain completions and text rows, as TRL does.
        group_by_length: batch rows of similar length together (less padding).
        seed: LoRA init, data order, dropout masks.
        logging_steps: log loss/grad_norm/learning_rate every this many optimizer steps.
        r, lora_alpha, lora_dropout, target_modules, use_rslora: the LoRA adapter.
        dtype: training dtype of the base weights and adapter (``"float32"`` on CPU).
        device: ``"cpu"``, ``"cuda"`` or ``"auto"``.
        save_strategy: ``"epoch"`` (default) keeps a checkpoint per epoch in ``out/checkpoint-<step>/``
            (HF Trainer layout: adapter, ``optimizer.pt``, ``trainer_state.json``), the training
            trajectory ``gradian attribute`` scores over; ``"no"`` keeps only the final adapter.
    """

    learning_rate: float = 2e-4
    num_train_epochs: float = 3.0
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    warmup_ratio: float = 0.05
    lr_scheduler_type: str = "linear"
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    max_length: int = 256
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
    dtype: str = "float32"
    device: str = "cpu"
    save_strategy: str = "epoch"

    def __post_init__(self) -> None:
        self.validate("TrainSpec")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["target_modules"] = list(self.target_modules)
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
        cfg["use_peft"] = True
        for k in ("r", "lora_alpha", "lora_dropout", "target_modules", "use_rslora"):
            cfg[_TRL_NAME.get(k, k)] = d[k]
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
            ("seed", SEED_MAX),
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise bad(name, f"{name} must be a whole number (got {v!r})", f"give {name} a whole number")
            if v > hi:
                raise bad(name, f"{name} must be at most {hi:,} (got {v:,})", f"give {name} a sensible value")
        for name in ("completion_only_loss", "packing", "add_eos", "group_by_length", "use_rslora"):
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
        if self.save_strategy not in ("epoch", "no"):
            raise bad("save_strategy", f"unknown save_strategy {self.save_strategy!r}", "use epoch or no")
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
    "save_steps",
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

    merged = {**TrainSpec().to_dict(), **cfg, **given}
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


# --------------------------------------------------------------------------- training


class _Rows:
    """Map-style dataset over tokenised rows; items are ``{"input_ids", "item"}``.

    ``input_ids`` gives the lengths the trainer groups by.
    """

    def __init__(self, items):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.items[i].input_ids, "item": self.items[i]}


def _training_args(spec: TrainSpec, output_dir: str, has_eval: bool, use_cpu: bool):
    from transformers import TrainingArguments

    params = inspect.signature(TrainingArguments.__init__).parameters
    kw: dict[str, Any] = dict(
        output_dir=output_dir,
        per_device_train_batch_size=spec.per_device_train_batch_size,
        per_device_eval_batch_size=spec.per_device_train_batch_size,
        gradient_accumulation_steps=spec.gradient_accumulation_steps,
        learning_rate=spec.learning_rate,
        num_train_epochs=spec.num_train_epochs,
        lr_scheduler_type=spec.lr_scheduler_type,
        weight_decay=spec.weight_decay,
        max_grad_norm=spec.max_grad_norm,
        logging_steps=spec.logging_steps,
        logging_first_step=True,
        save_strategy=spec.save_strategy,
        save_only_model=False,
        report_to=[],
        seed=spec.seed,
        data_seed=spec.seed,
        use_cpu=use_cpu,
        disable_tqdm=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        optim="adamw_torch",
    )
    if "warmup_ratio" in params:
        kw["warmup_ratio"] = spec.warmup_ratio
    else:  # transformers 5: a float warmup_steps in [0, 1) is a ratio
        kw["warmup_steps"] = float(spec.warmup_ratio)
    if "train_sampling_strategy" in params:
        kw["train_sampling_strategy"] = "group_by_length" if spec.group_by_length else "random"
    else:
        kw["group_by_length"] = spec.group_by_length
    key = "eval_strategy" if "eval_strategy" in params else "evaluation_strategy"
    kw[key] = "epoch" if has_eval else "no"
    return TrainingArguments(**kw)


def _progress_callback(on_event: Callable[[dict[str, Any]], None]):
    from transformers import TrainerCallback

    class _CB(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            on_event({"event": "begin", "max_steps": state.max_steps})

        def on_step_end(self, args, state, control, **kw):
            on_event({"event": "step", "step": state.global_step, "max_steps": state.max_steps})

        def on_log(self, args, state, control, logs=None, **kw):
            on_event({"event": "log", "step": state.global_step, **(logs or {})})

    return _CB()


def _rich_progress():
    """A rich progress bar driven by trainer events; returns (callback, context manager)."""
    from gradian.commands._common import console, rich_progress

    prog = rich_progress(console, info=True)
    state: dict[str, Any] = {"task": None}

    def on_event(ev: dict[str, Any]) -> None:
        if ev["event"] == "begin":
            state["task"] = prog.add_task("[bold]training[/]", total=ev["max_steps"], info="")
        elif ev["event"] == "step" and state["task"] is not None:
            prog.update(state["task"], completed=ev["step"])
        elif ev["event"] == "log" and state["task"] is not None:
            parts = []
            if "loss" in ev:
                parts.append(f"loss {ev['loss']:.3f}")
            if "eval_loss" in ev:
                parts.append(f"eval_loss {ev['eval_loss']:.3f}")
            if parts:
                prog.update(state["task"], info=" ".join(parts))

    return on_event, prog


def _tokenise_file(path: Path, tokenizer, spec: TrainSpec, tokenize=None):
    from gradian.data.formats import load_examples
    from gradian.data.tokenize import TokenizeSpec, tokenize_example

    if tokenize is not None:  # the rendering of the run being retrained (gradian verify)
        tspec = tokenize.for_tokenizer(tokenizer)
    else:
        tspec = TokenizeSpec(
            max_length=spec.max_length,
            loss_on="completion" if spec.completion_only_loss else "all",
            add_eos=spec.add_eos,
        )
    examples = load_examples(path)
    kept, dropped = [], []
    for ex in examples:
        tok = tokenize_example(ex, tokenizer, tspec, where=f"{path}:{ex.row + 1}")
        if tok.n_supervised == 0:
            dropped.append(ex.id)
        else:
            kept.append(tok)
    if not kept:
        raise GradianUserError(
            "no row has a supervised token left after tokenisation",
            where=str(path),
            fix="raise max_length or shorten the prompts",
        )
    return kept, dropped, tspec


def train_lora(
    base: str,
    data: str | Path,
    out: str | Path,
    spec: TrainSpec | None = None,
    *,
    eval_data: str | Path | None = None,
    overwrite: bool = False,
    progress: bool | Callable[[dict[str, Any]], None] = False,
    trust_remote_code: bool = False,
    tokenize=None,
) -> Path:
    """Train a LoRA adapter on ``data`` over the base model ``base``; write it to ``out``.

    Args:
        base: an HF model folder (or an id in the local HF cache).
        data: training rows (any format :func:`gradian.data.formats.load_examples` reads).
        out: the adapter folder to create (see the module docstring for its files).
        spec: the run's settings (defaults: :class:`TrainSpec`).
        eval_data: optional held-out rows; ``eval_loss`` is logged once per epoch.
        overwrite: replace an existing non-empty ``out``.
        progress: True for a rich progress bar, or a callable receiving trainer events.
        tokenize: a :class:`~gradian.data.tokenize.TokenizeSpec` that renders and masks the rows instead of the one
            ``spec``'s ``max_length`` / ``completion_only_loss`` / ``add_eos`` give (``gradian verify`` retraining a
            run with the run's own chat template, max length and loss mask). Its chat template, when it has one, is
            saved as ``out/chat_template.jinja`` (what the rows were rendered with).

    Returns:
        ``out`` as a Path.
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Trainer, set_seed

    import gradian
    from gradian.data.tokenize import collate
    from gradian.models.load import ModelSpec, load_base, resolve_device

    spec = spec or TrainSpec()
    spec.validate()
    out = Path(out)
    data = Path(data)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise GradianUserError(
            "output folder exists and is not empty", where=str(out), fix="pass --overwrite or choose another --out"
        )
    device = resolve_device(spec.device)
    model, tokenizer = load_base(
        ModelSpec(base=str(base), dtype=spec.dtype, device=device, trust_remote_code=trust_remote_code)
    )
    train_items, dropped, tspec = _tokenise_file(data, tokenizer, spec, tokenize)
    eval_items = None
    if eval_data is not None:
        eval_items, _, _ = _tokenise_file(Path(eval_data), tokenizer, spec, tokenize)

    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [t for t in spec.target_modules if t not in names]
    if missing:
        raise GradianUserError(
            f"target module(s) {', '.join(missing)} not found in the base model",
            where="target_modules",
            fix="use Linear layer names of this model (e.g. q_proj, v_proj for Llama; c_attn for GPT-2)",
        )
    set_seed(spec.seed)
    lcfg = LoraConfig(
        r=spec.r,
        lora_alpha=spec.lora_alpha,
        lora_dropout=spec.lora_dropout,
        target_modules=list(spec.target_modules),
        use_rslora=spec.use_rslora,
        bias="none",
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, lcfg)

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def collator(batch: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return collate([b["item"] for b in batch], pad_id, "right")

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=str(out.parent)))
    try:
        args = _training_args(spec, str(tmp / "_trainer"), eval_items is not None, use_cpu=(device == "cpu"))
        callbacks = []
        prog_ctx = None
        if progress is True:
            on_event, prog_ctx = _rich_progress()
            callbacks.append(_progress_callback(on_event))
        elif callable(progress):
            callbacks.append(_progress_callback(progress))
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=_Rows(train_items),
            eval_dataset=_Rows(eval_items) if eval_items is not None else None,
            data_collator=collator,
            callbacks=callbacks,
        )
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)  # disable_tqdm adds it; the log lands in trainer_state.json
        t0 = time.time()
        with warnings.catch_warnings():
            # raised by transformers' own Trainer internals, not by anything the user set
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            if prog_ctx is not None:
                with prog_ctx:
                    trainer.train()
            else:
                trainer.train()
        wall = time.time() - t0
        _keep_checkpoints(tmp / "_trainer", tmp)
        shutil.rmtree(tmp / "_trainer", ignore_errors=True)
        model.save_pretrained(str(tmp), safe_serialization=True)
        trainer.state.save_to_json(str(tmp / "trainer_state.json"))
        write_train_config(spec, tmp / CONFIG_NAME, base=str(base), has_eval=eval_items is not None)
        if tspec.chat_template is not None:
            atomic_write_text(tmp / "chat_template.jinja", tspec.chat_template)
        import peft
        import transformers

        atomic_write_json(
            tmp / "gradian_train.json",
            {
                "base": str(base),
                "data": {"path": str(data), "sha256": sha256_file(data), "rows": len(train_items) + len(dropped)},
                "eval_data": (
                    {"path": str(eval_data), "sha256": sha256_file(eval_data), "rows": len(eval_items or [])}
                    if eval_data is not None
                    else None
                ),
                "dropped_no_supervised_tokens": dropped,
                "tokenize": tspec.to_dict(),
                "spec": spec.to_dict(),
                "wall_seconds": round(wall, 2),
                "global_step": trainer.state.global_step,
                "versions": {
                    "gradian": gradian.__version__,
                    "torch": torch.__version__,
                    "transformers": transformers.__version__,
                    "peft": peft.__version__,
                },
                "threads": torch.get_num_threads(),
            },
        )
        return publish_folder(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# What a kept checkpoint holds (HF Trainer layout). The Trainer's pickled extras (training_args.bin,
# rng_state.pth, scheduler.pt) are dropped: nothing in Gradian reads them, and a folder we hand out
# should hold no pickles.
CHECKPOINT_FILES = ("adapter_config.json", "adapter_model.safetensors", "optimizer.pt", "trainer_state.json")


def _keep_checkpoints(trainer_dir: Path, out: Path) -> list[Path]:
    """Move the Trainer's ``checkpoint-<step>/`` folders into ``out`` with :data:`CHECKPOINT_FILES` only."""
    kept = []
    for ck in sorted(trainer_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1])):
        dst = out / ck.name
        dst.mkdir()
        for name in CHECKPOINT_FILES:
            if (ck / name).is_file():
                shutil.move(str(ck / name), str(dst / name))
        kept.append(dst)
    return kept


def read_trainer_state(folder: str | Path) -> dict[str, Any]:
    """The ``trainer_state.json`` a run wrote (HF ``TrainerState`` as JSON)."""
    return json.loads((Path(folder) / "trainer_state.json").read_text())
