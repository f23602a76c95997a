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
  the device trained on (``device``: what ``auto`` resolved to), library versions.

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

The settings (:class:`~gradian.trainconfig.TrainSpec`) and their config file are read and written by
:mod:`gradian.trainconfig`.
"""

from __future__ import annotations

import inspect
import json
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

from gradian.errors import GradianUserError
from gradian.trainconfig import CONFIG_NAME, TrainSpec, write_train_config
from gradian.util import atomic_write_json, atomic_write_text, publish_folder, sha256_file


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


#: The TrainSpec fields that are TrainingArguments' own names, passed on as they are (the rest: :func:`_training_args`).
_AS_NAMED = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "learning_rate",
    "num_train_epochs",
    "lr_scheduler_type",
    "weight_decay",
    "max_grad_norm",
    "logging_steps",
    "save_strategy",
    "seed",
)


def _training_args(spec: TrainSpec, output_dir: str, has_eval: bool, use_cpu: bool):
    from transformers import TrainingArguments

    params = inspect.signature(TrainingArguments.__init__).parameters
    kw: dict[str, Any] = dict(
        output_dir=output_dir,
        **{name: getattr(spec, name) for name in _AS_NAMED},
        per_device_eval_batch_size=spec.per_device_train_batch_size,
        logging_first_step=True,
        save_only_model=False,
        report_to=[],
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
    if spec.save_strategy == "steps":
        kw["save_steps"] = spec.save_steps
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
        use_dora=spec.use_dora,
        bias="none",
        task_type="CAUSAL_LM",
    )
    with warnings.catch_warnings():
        # PEFT asks transformers' deprecated ``is_gradient_checkpointing`` (a FutureWarning the user can do nothing
        # about; the one inside trainer.train() is silenced below too)
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
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
                "device": device,  # what spec.device resolved to on this machine (auto: cuda, else mps, else cpu)
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


def read_train_record(folder: str | Path) -> dict[str, Any]:
    """The ``gradian_train.json`` a run wrote (empty when there is none: an adapter trained elsewhere)."""
    path = Path(folder) / "gradian_train.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def read_trainer_state(folder: str | Path) -> dict[str, Any]:
    """The ``trainer_state.json`` a run wrote (HF ``TrainerState`` as JSON)."""
    return json.loads((Path(folder) / "trainer_state.json").read_text())
