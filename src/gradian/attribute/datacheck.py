"""Is this the data the adapter was trained on? A cheap check before a long gradient build.

A LoRA adapter lowers the loss of the rows it was trained on. On a deterministic sample of up to
:data:`SAMPLE_ROWS` training rows (with at least one supervised token; the sample is seeded by the
dataset's content hash, so the same file gives the same rows), with the same tokenisation and loss
mask the index uses, it compares

    L_adapter = mean_j ℓ_j(θ_base + ΔW)        L_base = mean_j ℓ_j(θ_base)   (adapter disabled)

where ℓ_j is :func:`gradian.gradients.loss.per_example_loss` (mean token cross-entropy over the
row's supervised tokens). The rows are probably not the ones the adapter was trained on, and one
:class:`gradian.errors.GradianWarning` says so with both numbers, when either

- the relative drop ``(L_base − L_adapter) / L_base`` is below :data:`MIN_RELATIVE_DROP` (the
  adapter did not lower the loss, or barely), or
- ``L_adapter ≥ MAX_UNIFORM_FRACTION · ln V`` (V: the vocabulary, ``ln V`` the loss of a uniform
  guess): the adapter predicts these rows no better than half a uniform guess. A small base that
  does not model the text at all (loss above ``ln V``) can show a large relative drop on any text
  once an adapter smooths its predictions; this catches that case.

It is a warning, not an error: a run can legitimately show a small drop (an adapter trained for
very few steps or at a tiny learning rate, a dataset much larger than the sample).

Cost: ``2 · ceil(n / batch_size)`` forward passes under ``torch.no_grad()``, no backward (``batch_size``: the run's
``--rows-per-forward``, 1 by default, since padding is work on a CPU). Under torchrun every rank runs the same passes
on the same rows (no collective, so no rank can wait on another); only rank 0 prints the warning and writes run.json.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from gradian.errors import GradianWarning
from gradian.schema import BOOLEAN, INTEGER, NUMBER, finite, obj

#: At most this many training rows are scored (twice: with the adapter and without).
SAMPLE_ROWS = 32

#: Warn when ``(L_base - L_adapter) / L_base`` is below this. Measured on the tiny world (``gradian demo
#: --kind tiny``): its training rows drop 43%, held-out rows of the same kind 34%, chemical-symbol rows the
#: base was pretrained on but the adapter never saw 12%.
MIN_RELATIVE_DROP = 0.15

#: Warn when the adapter's mean loss is at least this fraction of ``ln V`` (a uniform guess). Tiny world:
#: training rows 0.23, held-out rows 0.37, unrelated router-support text 0.96 (its base loss is 1.5 ln V).
MAX_UNIFORM_FRACTION = 0.5


#: ``run.json`` ``manifest.data_check`` (:class:`DataCheck`); the manifest may lack it (nothing attributed).
DATA_CHECK_SCHEMA = obj(
    {
        "rows": INTEGER,
        "adapter_loss": finite(NUMBER),
        "base_loss": finite(NUMBER),
        "relative_drop": finite(NUMBER),
        "uniform_loss": finite(NUMBER),
        "threshold": NUMBER,
        "warned": BOOLEAN,
        "seconds": NUMBER,
    }
)


@dataclass
class DataCheck:
    """The outcome of :func:`check_data_matches_adapter` (``run.json`` ``manifest.data_check``).

    Attributes:
        rows: rows scored (≤ :data:`SAMPLE_ROWS`).
        adapter_loss: mean per-example loss with the adapter active (nats / supervised token).
        base_loss: the same with the adapter disabled.
        relative_drop: ``(base_loss - adapter_loss) / base_loss``.
        uniform_loss: ``ln V``, the loss of a uniform guess over the model's V output tokens.
        threshold: :data:`MIN_RELATIVE_DROP` used.
        warned: ``relative_drop < threshold`` or ``adapter_loss ≥ MAX_UNIFORM_FRACTION · uniform_loss``.
        seconds: wall time of the check.
    """

    rows: int
    adapter_loss: float
    base_loss: float
    relative_drop: float
    uniform_loss: float
    threshold: float
    warned: bool
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """The record written in run.json."""
        return asdict(self)

    def line(self) -> str:
        """One line for the terminal: both losses and the outcome."""
        verdict = "this may not be the data the adapter was trained on" if self.warned else "ok"
        return (
            f"data check on {self.rows} rows: mean loss {self.adapter_loss:.4f} with the adapter, "
            f"{self.base_loss:.4f} without ({self.relative_drop:+.1%} drop; warn below "
            f"{self.threshold:.0%} or at {MAX_UNIFORM_FRACTION:g} x ln V = "
            f"{MAX_UNIFORM_FRACTION * self.uniform_loss:.2f}): {verdict}"
        )


def sample_rows(n_supervised: Sequence[int], key: str, k: int = SAMPLE_ROWS) -> list[int]:
    """Up to ``k`` row indices with a supervised token, sorted, drawn without replacement with a
    generator seeded by ``key`` (the dataset's sha256 hex), so the sample is deterministic.
    """
    eligible = [i for i, n in enumerate(n_supervised) if n > 0]
    if len(eligible) <= k:
        return eligible
    rng = np.random.default_rng(int(key[:16], 16))
    return sorted(int(i) for i in rng.choice(eligible, size=k, replace=False))


def _mean_loss(model, items, pad_token_id: int, batch_size: int, tick=None) -> tuple[float, int]:
    from gradian.data.tokenize import collate
    from gradian.gradients.loss import head_positions, lm_logits, per_example_loss

    device = next(model.parameters()).device
    losses: list[float] = []
    vocab = 0
    # length-sorted batches: less padding (the quick SmolLM2 world's sample: 3,064 tokens a pass against 4,344 in
    # row order, 2,295 real); the mean over rows does not depend on the order
    items = sorted(items, key=lambda it: len(it.input_ids))
    for s in range(0, len(items), batch_size):
        batch = collate(items[s : s + batch_size], pad_token_id)
        batch = {k: v.to(device) for k, v in batch.items()}
        keep = head_positions(model, batch["labels"])  # the LM head only where the loss is, as the gradient passes
        logits = lm_logits(model, batch, keep)
        losses += per_example_loss(logits, batch["labels"], keep).double().tolist()
        vocab = int(logits.shape[-1])
        if tick is not None:
            tick(len(batch["labels"]))
    return float(np.mean(losses)), vocab


def check_data_matches_adapter(
    ft,
    data: str | Path,
    items: Sequence[Any],
    *,
    batch_size: int = 8,
    threshold: float = MIN_RELATIVE_DROP,
    warn: bool = True,
    progress=None,
) -> DataCheck | None:
    """Compare the adapter's mean loss on a sample of the training rows with the base model's.

    Args:
        ft: the loaded :class:`gradian.finetune.FineTune` (a PEFT model; its current LoRA weights are used).
        data: the training data path (its content hash seeds the sample).
        items: the tokenised rows (a list or a :class:`gradian.data.tokenize.TokenizedRows`).
        batch_size: rows per forward pass.
        threshold: warn when the relative drop is below it.
        warn: issue the :class:`GradianWarning` (False: only return the record).
        progress: ``progress(task, advance, total)``, called per batch (the rows with the adapter, then without).

    Returns:
        The :class:`DataCheck`, or None when no row has a supervised token or the model has no
        adapter to disable (nothing to compare).
    """
    import torch

    from gradian.data.tokenize import row_values
    from gradian.index.identity import dataset_identity

    model = ft.model
    if not hasattr(model, "disable_adapter"):
        return None
    t0 = time.perf_counter()
    rows = sample_rows(list(row_values(items, "n_supervised")), dataset_identity(data)["sha256"])
    if not rows:
        return None
    chosen = [items[r] for r in rows]
    pad = ft.tokenizer.pad_token_id if ft.tokenizer.pad_token_id is not None else 0
    training = model.training
    model.eval()  # no LoRA dropout
    tick = (lambda k: progress("data check", k, 2 * len(chosen))) if progress else None
    if tick is not None:
        tick(0)
    try:
        with torch.no_grad():
            adapter_loss, vocab = _mean_loss(model, chosen, pad, batch_size, tick)
            with model.disable_adapter():
                base_loss, _ = _mean_loss(model, chosen, pad, batch_size, tick)
    finally:
        model.train(training)
    drop = (base_loss - adapter_loss) / base_loss if base_loss > 0 else 0.0
    uniform = math.log(vocab)
    unlearned = adapter_loss >= MAX_UNIFORM_FRACTION * uniform
    res = DataCheck(
        rows=len(rows),
        adapter_loss=round(adapter_loss, 6),
        base_loss=round(base_loss, 6),
        relative_drop=round(drop, 6),
        uniform_loss=round(uniform, 6),
        threshold=threshold,
        warned=bool(drop < threshold or unlearned),
        seconds=round(time.perf_counter() - t0, 3),
    )
    if res.warned and warn:
        why = (
            f"a {res.relative_drop:+.1%} drop, below the {threshold:.0%} a trained adapter shows"
            if drop < threshold
            else f"over {MAX_UNIFORM_FRACTION:g} x ln V = {MAX_UNIFORM_FRACTION * uniform:.2f}, "
            "ln V being the loss of a uniform guess"
        )
        warnings.warn(
            f"{Path(data).name}: the adapter's mean loss on {res.rows} of these rows is {res.adapter_loss:.4f}, "
            f"the base model's {res.base_loss:.4f} ({why}): this may not be the data the adapter was trained on "
            "(check --data and --adapter)",
            GradianWarning,
            stacklevel=2,
        )
    return res
