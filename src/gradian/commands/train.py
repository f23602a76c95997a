"""``gradian train``: a convenience LoRA fine-tune (PEFT + HF Trainer) over the formats Gradian reads."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from gradian.commands import _options as O
from gradian.commands._common import console, user_errors
from gradian.defaults import DTYPE, MAX_LENGTH


def _override(flag: str, help: str, panel: str = O.SETUP):
    """A ``gradian train`` flag that overrides one field of the training config.

    Its default, None, means "not given": the ``--config`` value, else the default its ``help`` names
    (:func:`gradian.trainconfig.spec_from_config` resolves it).
    """
    return typer.Option(None, flag, help=help, rich_help_panel=panel)


@user_errors
def train_cmd(
    base: str = typer.Option(
        ..., "--base", help="Base model: a local HF folder (or an HF id in the local cache).", rich_help_panel=O.INPUTS
    ),
    data: Path = typer.Option(
        ...,
        "--data",
        help="Training rows: JSONL/JSON/Parquet (messages, prompt/completion, alpaca, text).",
        rich_help_panel=O.INPUTS,
    ),
    out: Path = typer.Option(
        ...,
        "--out",
        help="The adapter folder it writes (adapter_config.json, adapter_model.safetensors, training_config.yaml, "
        "trainer_state.json, gradian_train.json, checkpoint-*/): what index/attribute/evaluate --adapter take.",
        rich_help_panel=O.STORAGE,
    ),
    config: Path | None = typer.Option(
        None,
        "--config",
        help="Training config YAML/JSON (trl sft --config style; flags below override it).",
        rich_help_panel=O.INPUTS,
    ),
    eval_data: Path | None = typer.Option(
        None, "--eval-data", help="Held-out rows: eval_loss is logged once per epoch.", rich_help_panel=O.INPUTS
    ),
    epochs: float | None = _override("--epochs", "num_train_epochs (default 3)."),
    lr: float | None = _override("--lr", "learning_rate (default 2e-4)."),
    r: int | None = _override("--r", "LoRA rank (default 16)."),
    alpha: int | None = _override("--alpha", "lora_alpha (default 32)."),
    dropout: float | None = _override("--dropout", "lora_dropout (default 0.05)."),
    targets: str | None = _override(
        "--targets", "Comma-separated LoRA target modules, or all-linear (default: every Llama Linear)."
    ),
    max_length: int | None = _override(
        "--max-length",
        f"Truncate rows to this many tokens (default {MAX_LENGTH}, TRL's SFTConfig default; the batches are "
        "padded to their longest row, not to it).",
    ),
    batch_size: int | None = _override("--batch-size", "per_device_train_batch_size (default 8)."),
    grad_accum: int | None = _override("--grad-accum", "gradient_accumulation_steps (default 1)."),
    warmup_ratio: float | None = _override("--warmup-ratio", "Linear warmup fraction (default 0.05)."),
    scheduler: str | None = _override("--scheduler", "lr_scheduler_type: linear (default), cosine, constant."),
    loss_on_all: bool = typer.Option(
        False,
        "--loss-on-all",
        help="Supervise prompt tokens too (completion_only_loss: false).",
        rich_help_panel=O.SETUP,
    ),
    dora: bool = typer.Option(
        False,
        "--dora",
        help="Train a DoRA adapter (PEFT use_dora: a trained magnitude per output feature).",
        rich_help_panel=O.SETUP,
    ),
    seed: int | None = _override("--seed", "LoRA init, data order and dropout masks (default 0)."),
    logging_steps: int | None = _override("--logging-steps", "Log every N optimizer steps (default 1)."),
    device: str | None = _override(
        "--device", O.DEVICE_HELP + " The device used is recorded in gradian_train.json.", O.DEVICES
    ),
    dtype: str | None = _override("--dtype", f"{DTYPE} (default), bfloat16, float16.", O.DEVICES),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace an existing non-empty --out folder.", rich_help_panel=O.STORAGE
    ),
    trust_remote_code: bool = O.TRUST_REMOTE_CODE,
) -> None:
    """Train a LoRA adapter and leave behind what a TRL run does."""
    from gradian.train import read_train_record, read_trainer_state, train_lora
    from gradian.trainconfig import ALL_LINEAR_LLAMA, CONFIG_NAME, spec_from_config

    tm = None
    if targets is not None:
        tm = (
            ALL_LINEAR_LLAMA
            if targets.strip() == "all-linear"
            else tuple(t.strip() for t in targets.split(",") if t.strip())
        )
    spec = spec_from_config(
        config,
        num_train_epochs=epochs,
        learning_rate=lr,
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=tm,
        max_length=max_length,
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=grad_accum,
        warmup_ratio=warmup_ratio,
        lr_scheduler_type=scheduler,
        completion_only_loss=False if loss_on_all else None,
        use_dora=True if dora else None,
        seed=seed,
        logging_steps=logging_steps,
        device=device,
        dtype=dtype,
    )
    console.print(
        f"[bold]gradian train[/] base={escape(str(base))} data={escape(str(data))} "
        f"lr={spec.learning_rate:g} epochs={spec.num_train_epochs:g} r={spec.r} alpha={spec.lora_alpha} "
        f"batch={spec.per_device_train_batch_size}x{spec.gradient_accumulation_steps} max_length={spec.max_length}"
        + (" dora" if spec.use_dora else ""),
        highlight=False,
        soft_wrap=True,
    )
    folder = train_lora(
        base,
        data,
        out,
        spec,
        eval_data=eval_data,
        overwrite=overwrite,
        progress=True,
        trust_remote_code=trust_remote_code,
    )
    state = read_trainer_state(folder)
    final = next((e for e in reversed(state.get("log_history", [])) if "train_loss" in e), {})
    evals = [e["eval_loss"] for e in state.get("log_history", []) if "eval_loss" in e]
    line = (
        f"done in {final.get('train_runtime', 0):.1f} s, {state.get('global_step')} steps, "
        f"train_loss {final.get('train_loss', float('nan')):.4f}"
    )
    if evals:
        line += f", eval_loss {evals[-1]:.4f}"
    used = read_train_record(folder).get("device")
    if used:
        line += f", on {used}" + (f" (--device {spec.device})" if spec.device != used else "")
    console.print(line, highlight=False)
    console.print(
        f"adapter: {escape(str(folder))} (adapter_config.json, adapter_model.safetensors, {CONFIG_NAME}, "
        "trainer_state.json)",
        highlight=False,
        soft_wrap=True,
    )
    console.print(  # attribute reads the config and log above from the adapter folder
        f"next: gradian attribute --base {escape(str(base))} --adapter {escape(str(folder))} --data "
        f"{escape(str(data))} --eval EVAL.jsonl --out run    # EVAL.jsonl: the eval set that got worse "
        "(docs/evaluate.md)",
        highlight=False,
        soft_wrap=True,
    )


def register(app: typer.Typer) -> None:
    """Add ``gradian train`` (the convenience LoRA trainer) to ``app``."""
    app.command(
        "train",
        help="Train a LoRA adapter (PEFT + HF Trainer, TRL-style loss masks). Writes the adapter, "
        "training_config.yaml and trainer_state.json. A convenience: Gradian debugs fine-tunes made anywhere.",
    )(train_cmd)
