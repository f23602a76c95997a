"""A fine-tune and its training set: load the base and adapter, tokenise the training rows, build the gradient index.

The Python API a script uses is :class:`gradian.attributor.Attributor` (``docs/api.md``), built on
this module. The lanes' own entry points are ``gradian.evaluate.evaluate``,
``gradian.audit.diagnose`` and ``gradian.attribute.run.attribute_run`` (the whole
``gradian attribute`` pipeline); this module holds what they share: loading the inputs once
(:func:`load_finetune`), and the training-gradient index (:func:`training_index`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from gradian.data.formats import Example, load_examples
from gradian.data.tokenize import TokenizedExample, row_values, tokenize_example
from gradian.errors import GradianUserError
from gradian.index.build import build_index
from gradian.index.identity import adapter_identity, dataset_identity, file_hash, library_versions, model_identity
from gradian.index.store import GradientIndex, GradSpec, default_index_root, index_id
from gradian.models.load import ModelSpec, load_adapter, load_base

if TYPE_CHECKING:
    from gradian.index.identity import Checkpoint


@dataclass
class FineTune:
    """A loaded fine-tune: the PEFT model (LoRA active), its tokenizer and where they came from."""

    model: torch.nn.Module
    tokenizer: Any
    model_spec: ModelSpec
    adapter: Path
    adapter_config: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def load_finetune(model_spec: ModelSpec, adapter: str | Path) -> FineTune:
    """Load base + adapter (checked), ready for per-example gradients."""
    base, tok = load_base(model_spec)
    model, cfg, notes = load_adapter(base, adapter, base_name=model_spec.base)
    return FineTune(model, tok, model_spec, Path(adapter), cfg, notes)


def tokenize_training_set(
    examples: list[Example], tokenizer, spec: GradSpec, path: str | Path, *, lazy: bool = False
) -> Sequence[TokenizedExample]:
    """Tokenise every row as the trainer did; errors name ``path`` and the row.

    Args:
        lazy: return a :class:`gradian.data.tokenize.TokenizedRows`, which keeps a few numbers a row
            and tokenises a row again when it is read (``gradian index``: the build's memory does
            not grow with the rows' tokens); otherwise a list of every tokenised row.
    """

    def one(ex: Example) -> TokenizedExample:
        where = f"{path}:{ex.row + 1}" if str(path).endswith(".jsonl") else f"{path}[{ex.row}]"
        return tokenize_example(ex, tokenizer, spec.tokenize, where=where)

    if lazy:
        from gradian.data.tokenize import TokenizedRows

        return TokenizedRows(examples, one)
    return [one(ex) for ex in examples]


def index_identity(
    ft: FineTune, data: str | Path, spec: GradSpec, seed: int = 0, checkpoint: Checkpoint | None = None
) -> dict[str, Any]:
    """Everything that decides the stored training gradients (hashed into the index id).

    Args:
        checkpoint: the trajectory point whose weights are loaded (default: the final adapter).
    """
    ident = {
        "base": model_identity(ft.model_spec.base),
        "model_dtype": ft.model_spec.dtype,
        "adapter": adapter_identity(checkpoint.path if checkpoint is not None else ft.adapter),
        "dataset": dataset_identity(data),
        "grad_spec": spec.identity(),
        "seed": seed,
        "versions": library_versions(),
    }
    fix = getattr(ft.model, "gradian_adapter_fix", None)
    # the adapter was put right on loading (a torchtune export, models.torchtune_export): not the file as written
    if fix:
        ident["adapter_fix"] = fix
    if ft.model_spec.quantize:  # a QLoRA run's base, quantised as trained (absent otherwise: ids unchanged)
        ident["base_quant"] = {"scheme": ft.model_spec.quantize, "from": ft.model_spec.quantize_from}
    if spec.optimizer != "none":
        opt = _optimizer_file(ft, checkpoint)
        ident["optimizer"] = {"kind": spec.optimizer, "sha256": file_hash(opt)}
    return ident


def _optimizer_file(ft: FineTune, checkpoint: Checkpoint | None) -> Path:
    opt = checkpoint.optimizer if checkpoint is not None else (ft.adapter / "optimizer.pt")
    if opt is None or not Path(opt).is_file():
        where = checkpoint.path if checkpoint is not None else ft.adapter
        raise GradianUserError(
            "Adam preconditioning needs the optimizer.pt saved with this adapter, and there is none",
            where=str(where),
            fix="pass HF Trainer checkpoint folders (checkpoint-*/ with optimizer.pt) or use --optimizer none",
        )
    return Path(opt)


def adam_transform(ft: FineTune, checkpoint: Checkpoint | None) -> Callable[[str, torch.Tensor], torch.Tensor]:
    """Adam preconditioning at ``checkpoint`` (default: the final adapter), read from its ``optimizer.pt``:
    ``(LoRA block name, g) -> states[name].update(g)``, Adam's update direction for per-example gradients ``g``
    (:meth:`gradian.gradients.adam.AdamState.update`).
    """
    from gradian.gradients.adam import read_adam_state

    states = read_adam_state(_optimizer_file(ft, checkpoint), ft.model)
    return lambda name, g: states[name].update(g)


def training_index(
    ft: FineTune,
    data: str | Path,
    spec: GradSpec,
    *,
    seed: int = 0,
    root: str | Path | None = None,
    parent: str | Path | None = None,
    batch_size: int = 8,
    shard_size: int = 256,
    progress_factory: Callable[[int], Callable[[int], None]] | None = None,
    examples: list[Example] | None = None,
    checkpoint: Checkpoint | None = None,
    items: Sequence[TokenizedExample] | None = None,
    announce: Callable[[str], None] | None = None,
) -> tuple[GradientIndex, list[Example], Sequence[TokenizedExample], bool]:
    """Open the training-gradient index for this fine-tune, building (or resuming) it if needed.

    Collective under torchrun (:mod:`gradian.distributed`): rank 0 decides whether a finished
    index exists, the ranks share checking its shards, and a build divides the missing shards.

    Args:
        announce: called with the size estimate line before a build computes anything.
        checkpoint: the trajectory point whose LoRA weights are loaded in ``ft.model`` now
            (default: the final adapter); it decides the index identity.
        items: the tokenised rows, when the caller has them already.
        root: the index folder; default ``parent/<index id>``, or the cache's when ``parent`` is None too.
        parent: a folder holding indexes by content id (``--out`` / ``--index-dir``).

    Returns:
        ``(index, examples, tokenized rows, reused)``; ``reused`` is True when no
        gradient had to be computed (a free re-query). With ``spec.unit == "sentence"``
        the index holds one gradient per sentence unit (:func:`gradian.data.spans.sentence_units`).
    """
    examples = examples if examples is not None else load_examples(data)
    items = items if items is not None else tokenize_training_set(examples, ft.tokenizer, spec, data)
    if not any(row_values(items, "n_supervised")):
        raise GradianUserError(
            "no row has a supervised token after masking and truncation",
            where=str(data),
            fix="check the completion fields and --max-length",
        )
    identity = index_identity(ft, data, spec, seed, checkpoint)
    transform = None
    if spec.optimizer == "adam":
        transform = adam_transform(ft, checkpoint)
    elif spec.optimizer != "none":
        raise GradianUserError(
            f"unknown optimizer preconditioning {spec.optimizer!r}", where="--optimizer", fix="use none or adam"
        )
    units = items
    if spec.unit == "sentence":
        from gradian.data.spans import SentenceItems, sentence_units

        units = SentenceItems(sentence_units(examples, items, spec.max_units_per_row), items)  # built shard by shard
    elif spec.unit != "row":
        raise GradianUserError(f"unknown index unit {spec.unit!r}", where="--unit", fix="use row or sentence")
    if root is not None:
        root = Path(root)
    else:
        root = Path(parent) / index_id(identity) if parent is not None else default_index_root(identity)
    from gradian import distributed

    complete = False
    if distributed.current().is_main:
        try:
            complete = GradientIndex(root).complete
        except FileNotFoundError:
            pass
    if distributed.broadcast_object(complete):
        existing = GradientIndex(root)
        if not existing.verify(collective=True):
            return existing, examples, items, True
    idx = build_index(
        ft.model,
        units,
        identity,
        spec,
        pad_token_id=ft.tokenizer.pad_token_id,
        root=root,
        batch_size=batch_size,
        shard_size=shard_size,
        progress_factory=progress_factory,
        announce=announce,
        transform=transform,
    )
    return idx, examples, items, False
