"""RepSim: representation evidence, a reference engine beside the gradient engines.

Li et al. (2024) find that plain hidden-state similarity often beats influence
functions at tracing LLM behaviour to training data. A row's representation is
the tuned model's last hidden state (after the final norm), mean-pooled over the
row's supervised tokens:

    h_j = (1/|S_j|) Σ_{t ∈ S_j} H_L[j, t]            (d,)

and a failing item's are the same pooling over the tokens of what the model
said (``h_w``) and of the correct completion (``h_c``), each after the item's
prompt. In Gradian's sign convention (negative = evidence that j taught what
the model said):

    ``said``      mode:  score_j = − cos(h_w, h_j)
    ``contrast``  mode:  score_j = cos(h_c, h_j) − cos(h_w, h_j)

Training representations need one forward pass without gradients, one row a pass (shared by the ranks under
torchrun); they are cached by content (adapter, dataset, tokenisation) like the gradient index. The final
checkpoint's joint index build forwards every row alone at the same weights, so when it runs (one process, one row a
forward, on a CPU) it pools the same states on its way (:attr:`gradian.gradients.units.RowUnitGrads.state`, equal to
the bit: ``tests/index/test_joint.py``) and RepSim computes only the rows it did not.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from gradian.data.tokenize import TokenizedExample, collate, row_values

if TYPE_CHECKING:  # torch comes where the engine computes: its spec is read without it
    import torch


@dataclass(frozen=True)
class RepSimSpec:
    """Attributes: mode (``"said"`` or ``"contrast"``)."""

    mode: str = "said"

    def __post_init__(self) -> None:
        from gradian.validate import check_choice

        check_choice(self.mode, ("said", "contrast"), "RepSimSpec", "mode")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def pooled_states(
    model,
    items: Sequence[TokenizedExample],
    pad_token_id: int,
    batch_size: int = 8,
    progress: Callable[[int], None] | None = None,
) -> torch.Tensor:
    """Mean last hidden state over each item's supervised tokens: (n, d) float64.

    Batches are length-sorted (less padding); results come back in item order.
    """
    import torch

    from gradian.gradients.loss import keeps_logits, model_inputs, supervised_mean

    # the states only: the LM head at the last position alone (not (b, T, V) logits, 8 x 300 x 49,152 floats a
    # batch for SmolLM2), where the model takes ``logits_to_keep``; the hidden states are the same either way
    head = {"logits_to_keep": 1} if keeps_logits(model) else {}
    with torch.no_grad():  # as a decorator it would import torch with this module
        lengths = row_values(items, "length")
        order = sorted(range(len(items)), key=lambda r: (lengths[r], r))
        out: torch.Tensor | None = None
        device = next(model.parameters()).device
        for s in range(0, len(order), batch_size):
            rows = order[s : s + batch_size]
            batch = {k: v.to(device) for k, v in collate([items[r] for r in rows], pad_token_id).items()}
            hs = model(**model_inputs(batch), **head, output_hidden_states=True).hidden_states[-1]  # (b, T, d)
            pooled = supervised_mean(hs, batch["labels"])
            if out is None:
                out = torch.zeros(len(items), hs.shape[-1], dtype=torch.float64)
            out[torch.tensor(rows)] = pooled.cpu()
            if progress:
                progress(len(rows))
        return out if out is not None else torch.zeros(0, 0, dtype=torch.float64)


#: rows per block of :func:`cached_train_states`: blocks, not ranks, decide the work of each process
STATE_BLOCK = 256
#: the version of the cached states' computation (in their cache key): 3 = one row a forward (the joint build's
#: forward gives the same bits); 2 = length-sorted batches of 8
STATES_VERSION = 3


def cached_train_states(
    model,
    items,
    pad_token_id: int,
    identity: dict[str, Any],
    progress: Callable[[int], None] | None = None,
    known: dict[int, torch.Tensor] | None = None,
) -> torch.Tensor | None:
    """:func:`pooled_states` of the training rows, one row a forward, cached under ``<cache>/repsim/<id>.safetensors``.

    One row a forward (no padding) gives each row's state whatever rows are computed beside it, so the states the
    joint index build pooled at the final adapter's weights (``known``: row -> (d,)) stand in for those rows:
    only the others are computed. Collective under torchrun: the rows are computed in blocks of
    :data:`STATE_BLOCK`, each rank a contiguous run of blocks, and rank 0 gathers them, writes the cache and returns
    the (n, d) states; the other ranks return None.
    """
    import torch
    from safetensors.torch import load_file, save

    from gradian import distributed
    from gradian.paths import cache_dir
    from gradian.util import atomic_write_bytes, sha256_json

    d = distributed.current()
    key = sha256_json({"repsim": STATES_VERSION, **identity})[:16]
    path = Path(cache_dir()) / "repsim" / f"{key}.safetensors"
    hit: torch.Tensor | None = None
    if d.is_main and path.exists():
        try:
            t = load_file(str(path))["h"]
            if t.shape[0] == len(items) and torch.isfinite(t).all():
                hit = t
        except Exception:  # a damaged cache file is recomputed, never trusted
            pass
    if distributed.broadcast_object(hit is not None):
        return hit
    known = dict(known or {})
    if d.enabled:  # the build shares its states in one process only (gradian.index.joint.build_jointly)
        known = {}
    starts = list(range(0, len(items), STATE_BLOCK))
    sizes = [min(STATE_BLOCK, len(items) - s) for s in starts]
    mine = distributed.contiguous_blocks(sizes, d.world_size)[d.rank]
    parts: list[tuple[list[int], torch.Tensor]] = []  # (rows, their (k, d) states): whole blocks travel to rank 0
    for b in mine:
        todo = [j for j in range(starts[b], starts[b] + sizes[b]) if j not in known]
        if todo:
            parts.append((todo, pooled_states(model, [items[j] for j in todo], pad_token_id, 1, progress)))
    gathered = distributed.gather_objects_to_main(parts)
    if not d.is_main:
        return None
    rows = dict(known)
    for rank_parts in gathered:  # type: ignore[union-attr]
        for js, hs in rank_parts:
            rows.update(zip(js, hs))
    h = torch.stack([rows[j] for j in range(len(items))]) if items else torch.zeros(0, 0, dtype=torch.float64)
    atomic_write_bytes(path, save({"h": h.contiguous()}))
    return h


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp(min=1e-30)


def repsim_scores(
    train: torch.Tensor, said: torch.Tensor, correct: torch.Tensor | None, spec: RepSimSpec = RepSimSpec()
) -> np.ndarray:
    """Representation scores (m, n) from train (n, d), said (m, d) and correct (m, d) states (module docstring)."""
    t = _unit(train)
    s = -(_unit(said) @ t.T)
    if spec.mode == "contrast" and correct is not None:
        s = s + _unit(correct) @ t.T
    return s.numpy()
