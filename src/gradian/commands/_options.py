"""CLI options that several commands share, each declared once: its flag, its default and its help.

``gradian index``, ``gradian attribute`` and ``gradian evaluate`` take the same model, adapter, tokenisation,
index and device options (``attribute`` runs Evaluate, so it takes ``evaluate``'s eval options too, and
``index``'s build options); declaring them here keeps one default and one help text per flag (the defaults
are the specs', and ``tests/test_api.py`` holds every command's defaults to the spec fields). Typer reads
an ``OptionInfo`` without changing it, so one instance can serve several commands. Nothing here imports
torch: ``gradian --help`` lists every command.
"""

from __future__ import annotations

import typer

from gradian import defaults
from gradian.data.tokenize import TokenizeSpec

# -- the help panels (`--help` groups each command's options under these headings)
INPUTS = "Inputs"
SETUP = "Training setup"
VERDICT = "Verdict"
ENGINES = "Engines"
STORAGE = "Output, index and storage"
DEVICES = "Devices"

#: The run folder that ``gradian report``, ``verify`` and ``export`` read (their one positional argument).
RUN_DIR = typer.Argument(..., help="The run folder `gradian attribute --out` wrote (holds run.json).")

# -- the four inputs
BASE = typer.Option(
    ..., "--base", help="Base model: a local folder (HF or GGUF) or a cached HF id.", rich_help_panel=INPUTS
)
ADAPTER = typer.Option(
    ..., "--adapter", help="The tuned LoRA adapter folder (PEFT save_pretrained).", rich_help_panel=INPUTS
)
DATA = typer.Option(
    ...,
    "--data",
    help="Training data the adapter was trained on: .jsonl/.json/.parquet or a save_to_disk folder.",
    rich_help_panel=INPUTS,
)
EVAL = typer.Option(..., "--eval", help="Eval set (JSONL/JSON/Parquet); see docs/evaluate.md.", rich_help_panel=INPUTS)
REFERENCE_ADAPTER = typer.Option(
    None,
    "--reference-adapter",
    help="Compare against this adapter (an earlier checkpoint) instead of the base.",
    rich_help_panel=INPUTS,
)


def configs(use: str, panel: str | None = SETUP):
    """The repeatable ``--config`` option of a command that reads the user's training configs; ``use``: what the
    command reads them for (one sentence fragment).
    """
    return typer.Option(
        None,
        "--config",
        help="Training config(s), repeatable: TRL/HF TrainingArguments JSON/YAML, axolotl, LLaMA-Factory or "
        f"torchtune YAML, PEFT adapter_config.json or the adapter folder; {use}.",
        rich_help_panel=panel,
    )


RUN_FOLDER = typer.Option(
    True,
    "--run-folder/--no-run-folder",
    help="Without --config: read the training config the trainer left beside the adapter (gradian train's "
    "training_config.yaml, torchtune's torchtune_config.yaml, LLaMA-Factory's training_args.yaml, axolotl's model "
    "card; a TRL or LLaMA-Factory model card: that trainer's defaults); attribute without --logs also reads its "
    "trainer log. --no-run-folder: Gradian's defaults.",
    rich_help_panel=SETUP,
)
BASE_QUANT = typer.Option(
    "auto",
    "--base-quant",
    help="The base as the run trained on it: 'auto' (default: a QLoRA config's 4-bit scheme, bitsandbytes' own "
    "quantisation, so gradients are taken at the weights the adapter was trained on), 'none' (the base as stored), "
    "or nf4, nf4-dq, fp4, fp4-dq.",
    rich_help_panel=SETUP,
)
CHECKPOINTS = typer.Option(
    None,
    "--checkpoints",
    help="Training trajectory: 'auto' (default: checkpoint-*/ children or siblings of --adapter), 'final' "
    "(the adapter only), or checkpoint folders (repeatable; a subset). Cost is linear in their number.",
    rich_help_panel=INPUTS,
)

# -- how rows become tokens (TokenizeSpec) and gradients (GradSpec)
MAX_LENGTH = typer.Option(
    TokenizeSpec.max_length,
    "--max-length",
    help=f"Truncate rendered rows to this many tokens, as in training (default {defaults.MAX_LENGTH}: TRL's SFTConfig "
    "default, and gradian train's; a --config gives the run's own, e.g. the adapter's training_config.yaml).",
    rich_help_panel=SETUP,
)
LOSS_ON = typer.Option(
    TokenizeSpec.loss_on,
    "--loss-on",
    help="'completion' (completion-only loss; a chat row's final assistant turn), 'all' or 'assistant' (every "
    "assistant turn).",
    rich_help_panel=SETUP,
)
MODULES = typer.Option(
    None,
    "--modules",
    help="Comma-separated LoRA layer-name filters, e.g. q_proj,v_proj (default: every layer).",
    rich_help_panel=ENGINES,
)
PROJECT_DIM = typer.Option(
    0, "--project-dim", help="JL projection: numbers kept per LoRA block (0 = exact).", rich_help_panel=ENGINES
)
MAX_INDEX_GB = typer.Option(
    None,
    "--max-index-gb",
    help="Budget for the new gradient indexes of the run, in GB (default: min(20, half the free disk where they "
    "live)). Exact storage over it: the plan chooses a --project-dim itself; a --project-dim given that does not "
    "fit is refused.",
    rich_help_panel=STORAGE,
)
PLAN_ONLY = typer.Option(
    False, "--plan-only", help="Print the run plan (indexes, sizes, time estimate) and stop.", rich_help_panel=STORAGE
)
STORAGE_DTYPE = typer.Option(
    "float32",
    "--storage-dtype",
    help="Gradient index storage: float32 | bfloat16 | float16 | float64 "
    "(2-byte types halve the index; ranking cost in docs/benchmarks.md).",
    rich_help_panel=STORAGE,
)
ROWS_PER_FORWARD = typer.Option(
    1,
    "--rows-per-forward",
    help="Rows sharing each forward and backward pass of the sentence build (a row needs one backward per "
    "sentence; b rows share them), and each forward of the data check. 1 on a CPU, where batching is no faster; "
    "on a GPU, where a pass costs about the same for 1 or 8 rows, e.g. 8 (it holds 8 rows' activations and "
    "gradients at once). The numbers agree to float rounding.",
    rich_help_panel=DEVICES,
)
SHARD_SIZE = typer.Option(
    256,
    "--shard-size",
    help="Rows per index shard file (rounded up to a multiple of --batch-size; fewer when a shard would pass "
    "256 MiB): the unit of work per process and of memory (one shard at a time).",
    rich_help_panel=STORAGE,
)
MAX_UNITS_PER_ROW = typer.Option(
    32,  # GradSpec.max_units_per_row (gradian.index.store imports torch; tests/test_api.py holds them equal)
    "--max-units-per-row",
    help="Sentence units: at most this many per row; a row with more sentences has this many units of "
    "consecutive sentences (docs/how-it-works.md). Bounds what one long row adds to the index.",
    rich_help_panel=STORAGE,
)
UNIT_GRADS = typer.Option(
    "positions",  # GradSpec.unit_grads (tests/test_api.py holds them equal)
    "--unit-grads",
    help="Sentence units: positions (the row's gradient split by the positions that predict each unit: one backward "
    "per row, an approximation; docs/how-it-works.md) | exact (each unit's own gradient: one backward per unit, "
    "2-3x the index build's time; needed by --separate).",
    rich_help_panel=STORAGE,
)
OPTIMIZER = typer.Option(
    "none",
    "--optimizer",
    help="Precondition training gradients with the checkpoint's Adam state (adam, LESS; needs optimizer.pt) | none.",
    rich_help_panel=SETUP,
)
ONE_PASS = typer.Option(
    True,
    "--one-pass/--separate",
    help="Build each checkpoint's row and sentence indexes in one pass per row (one forward, the row gradient "
    "derived from its sentences; the default, also under torchrun), or in two separate builds. The two "
    "agree to float rounding, not to the bit, and share the index ids.",
    rich_help_panel=STORAGE,
)

UNIT = typer.Option(
    "sentence",  # AttributeSpec.unit (tests/test_api.py holds them equal)
    "--unit",
    help="sentence: rank a row by its most harmful sentence for each failing item "
    "(builds the row index and the sentence-unit index) | "
    "row: whole rows (the row index only).",
    rich_help_panel=VERDICT,
)

#: Evaluate's generation limit (EvalSpec.max_new_tokens; tests/test_api.py holds them equal)
MAX_NEW_TOKENS = typer.Option(
    32, "--max-new-tokens", help="Greedy generation limit for Evaluate.", rich_help_panel=VERDICT
)

INDEX = typer.Option(
    None,
    "--index",
    help="The index folder: what `gradian index --out` wrote (the gradient indexes, one sub-folder per checkpoint "
    "and unit, by content id). Default: the cache (GRADIAN_CACHE/index).",
    rich_help_panel=STORAGE,
)
#: ``--index-dir``, the name ``--index`` had before issue 26: still read, not listed in ``--help``.
INDEX_DIR_OLD = typer.Option(None, "--index-dir", hidden=True, help="Old name of --index.")


def one_of_alias(value, old, flag: str, old_flag: str):
    """The value of ``flag``, or of its hidden old name ``old_flag`` (the two given with different values: a user
    error naming both).
    """
    from gradian.errors import GradianUserError

    if old is None:
        return value
    if value is not None and value != old:
        raise GradianUserError(
            f"{flag} and {old_flag} name different folders ({value} and {old})",
            where=f"{flag} / {old_flag}",
            fix=f"pass {flag} only ({old_flag} is its old name)",
        )
    return old


# -- the model (ModelSpec)
DTYPE = typer.Option(
    defaults.DTYPE, "--dtype", help="Model dtype: float32, bfloat16, float16 or float64.", rich_help_panel=DEVICES
)
DEVICE_HELP = "auto (default: cuda if available, else mps, else cpu), cpu, cuda, cuda:N or mps."
DEVICE = typer.Option(
    defaults.DEVICE,
    "--device",
    help=DEVICE_HELP,
    rich_help_panel=DEVICES,
)
TRUST_REMOTE_CODE = typer.Option(
    False, "--trust-remote-code", help="Run the model repository's own code (off by default).", rich_help_panel=DEVICES
)


def engine_help() -> str:
    """``"datainf (…) | ekfac (…) | graddot (…)"``: :func:`gradian.engines.registry.help_text`, read from the source.

    The engine files import torch, which ``gradian attribute --help`` does not need: each engine's ``name`` and
    ``summary`` are read from its file's ``@register`` class with :mod:`ast` (string literals, as every engine
    declares them). ``tests/test_architecture.py`` holds this equal to the registry's own text.
    """
    import ast
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / "engines"
    found: dict[str, str] = {}
    for path in sorted(folder.glob("*.py")):
        if path.stem.startswith("_") or path.stem in ("base", "registry"):
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            registered = isinstance(node, ast.ClassDef) and any(
                isinstance(d, ast.Name) and d.id == "register" for d in node.decorator_list
            )
            if not registered:
                continue
            attrs = {
                t.id: s.value.value
                for s in node.body
                if isinstance(s, (ast.Assign, ast.AnnAssign)) and isinstance(s.value, ast.Constant)
                for t in (s.targets if isinstance(s, ast.Assign) else [s.target])
                if isinstance(t, ast.Name)
            }
            if isinstance(attrs.get("name"), str):
                found[attrs["name"]] = attrs.get("summary") or ""
    return " | ".join(f"{n} ({s})" if s else n for n, s in sorted(found.items()))
