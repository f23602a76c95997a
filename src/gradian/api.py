"""The Python face of Gradian: load a fine-tune, build its gradient index.

Lanes add their own entry points (``gradian.evaluate.evaluate``,
``gradian.audit.diagnose``, ``gradian.attribute.attribute``); this module holds
what they share: loading the four inputs once, and the training-gradient index.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from gradian.data.formats import Example, load_examples
from gradian.data.tokenize import TokenizedExample, tokenize_example
from gradian.errors import GradianUserError
from gradian.index.identity import adapter_identity, dataset_identity, library_versions, model_identity
from gradian.index.store import GradientIndex, GradSpec, build_index, default_index_root
from gradian.models.load import ModelSpec, load_adapter, load_base


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


def tokenize_training_set(examples: list[Example], tokenizer, spec: GradSpec, path: str | Path) -> list[TokenizedExample]:
    """Tokenise every row as the trainer did; errors name ``path`` and the row."""
    out = []
    for ex in examples:
        where = f"{path}:{ex.row + 1}" if str(path).endswith(".jsonl") else f"{path}[{ex.row}]"
        out.append(tokenize_example(ex, tokenizer, spec.tokenize, where=where))
    return out


def index_identity(ft: FineTune, data: str | Path, spec: GradSpec, seed: int = 0) -> dict[str, Any]:
    """Everything that decides the stored training gradients (hashed into the index id)."""
    return {
        "base": model_identity(ft.model_spec.base),
        "model_dtype": ft.model_spec.dtype,
        "adapter": adapter_identity(ft.adapter),
        "dataset": dataset_identity(data),
        "grad_spec": spec.to_dict(),
        "seed": seed,
        "versions": library_versions(),
    }


def training_index(
    ft: FineTune,
    data: str | Path,
    spec: GradSpec,
    *,
    seed: int = 0,
    root: str | Path | None = None,
    batch_size: int = 8,
    shard_size: int = 256,
    progress_factory: Callable[[int], Callable[[int], None]] | None = None,
    examples: list[Example] | None = None,
) -> tuple[GradientIndex, list[Example], list[TokenizedExample], bool]:
    """Open the training-gradient index for this fine-tune, building (or resuming) it if needed.

    Returns:
        ``(index, examples, tokenized, reused)``; ``reused`` is True when no
        gradient had to be computed (a free re-query).
    """
    examples = examples if examples is not None else load_examples(data)
    items = tokenize_training_set(examples, ft.tokenizer, spec, data)
    if all(it.n_supervised == 0 for it in items):
        raise GradianUserError(
            "no row has a supervised token after masking and truncation",
            where=str(data),
            fix="check the completion fields and --max-length",
        )
    identity = index_identity(ft, data, spec, seed)
    root = Path(root) if root is not None else default_index_root(identity)
    try:
        existing = GradientIndex(root)
        if existing.complete and not existing.verify():
            return existing, examples, items, True
    except FileNotFoundError:
        pass
    progress = progress_factory(len(items)) if progress_factory else None
    idx = build_index(
        ft.model,
        items,
        identity,
        spec,
        pad_token_id=ft.tokenizer.pad_token_id,
        root=root,
        batch_size=batch_size,
        shard_size=shard_size,
        progress=progress,
    )
    return idx, examples, items, False
