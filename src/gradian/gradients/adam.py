"""Adam-preconditioned per-example gradients (LESS, Xia et al. 2024), from a checkpoint's ``optimizer.pt``.

An Adam step does not move the adapter along ``−g`` but along the update
direction ``−u``. LESS scores a training row by the update Adam would take if
that row were the next batch, given the optimizer state ``(m, v, t)`` saved
with the checkpoint (β1, β2, ε from its parameter group):

    m' = β1·m + (1−β1)·g            v' = β2·v + (1−β2)·g⊙g
    u  = (m' / (1−β1^{t+1})) / (√(v' / (1−β2^{t+1})) + ε)

elementwise per LoRA matrix, applied to each per-example gradient ``g``
(b, o, i) *before* any projection (the map is not linear). Query gradients stay
plain (LESS uses SGD gradients for the validation side).

The state is read with ``torch.load(weights_only=True)`` (never unpickled
freely) and mapped to the LoRA parameters by order and shape: HF's Trainer
builds its parameter groups from ``model.named_parameters()`` filtered to
trainable parameters (decay group, then no-decay group), so state k belongs to
the k-th trainable LoRA matrix in that order. Counts and every shape are
checked; a mismatch is a user error naming the file. Two LoRA matrices of the
same shape swapped by a custom optimizer grouping cannot be detected.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from gradian.errors import GradianUserError
from gradian.gradients.lora import lora_blocks

_FIX = "pass the optimizer.pt saved in the same checkpoint folder as the adapter (HF Trainer, AdamW)"


@dataclass
class AdamState:
    """Adam's moments for one LoRA matrix: ``exp_avg``/``exp_avg_sq`` (o, i), the step, betas and eps."""

    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    step: float
    beta1: float
    beta2: float
    eps: float

    def update(self, g: torch.Tensor) -> torch.Tensor:
        """Args: g (b, o, i) per-example gradients. Returns u (b, o, i), Adam's update direction (docstring)."""
        m = self.exp_avg.to(device=g.device, dtype=g.dtype)
        v = self.exp_avg_sq.to(device=g.device, dtype=g.dtype)
        t = self.step + 1.0
        m1 = self.beta1 * m + (1.0 - self.beta1) * g
        v1 = self.beta2 * v + (1.0 - self.beta2) * g * g
        return (m1 / (1.0 - self.beta1**t)) / ((v1 / (1.0 - self.beta2**t)).sqrt() + self.eps)


def read_adam_state(optimizer_pt: str | Path, model: torch.nn.Module) -> dict[str, AdamState]:
    """``{LoRA parameter name: AdamState}`` for every trainable LoRA matrix of ``model``.

    Raises:
        GradianUserError: the file is unreadable, not an Adam state, or does not match the adapter.
    """
    p = Path(optimizer_pt)
    try:
        sd = torch.load(str(p), map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise GradianUserError("optimizer.pt not found", where=str(p), fix=_FIX) from None
    except Exception as e:  # corrupt zip, a pickle with objects weights_only refuses, a truncated file
        raise GradianUserError(
            f"cannot read the optimizer state safely ({type(e).__name__})", where=str(p), fix=_FIX
        ) from None
    if (
        not isinstance(sd, dict)
        or not isinstance(sd.get("state"), dict)
        or not isinstance(sd.get("param_groups"), list)
    ):
        raise GradianUserError("not an optimizer state_dict (no state / param_groups)", where=str(p), fix=_FIX)
    order: list[tuple[int, dict]] = []
    for grp in sd["param_groups"]:
        if not isinstance(grp, dict) or not isinstance(grp.get("params"), list):
            raise GradianUserError("malformed param_groups", where=str(p), fix=_FIX)
        order.extend((int(i), grp) for i in grp["params"])
    blocks = lora_blocks(model)
    trainable = [b for b in blocks if b.module.weight.requires_grad]
    if len(order) != len(trainable):
        raise GradianUserError(
            f"the optimizer holds {len(order)} parameters but the adapter has {len(trainable)} LoRA matrices",
            where=str(p),
            fix=_FIX,
        )
    out: dict[str, AdamState] = {}
    for k, ((idx, grp), blk) in enumerate(zip(order, trainable)):
        st = sd["state"].get(idx)
        if not isinstance(st, dict) or "exp_avg" not in st or "exp_avg_sq" not in st:
            raise GradianUserError(
                f"parameter {idx} has no Adam moments (exp_avg, exp_avg_sq): not an Adam/AdamW state",
                where=str(p),
                fix=_FIX,
            )
        m, v = st["exp_avg"], st["exp_avg_sq"]
        if tuple(m.shape) != blk.shape or tuple(v.shape) != blk.shape:
            raise GradianUserError(
                f"optimizer state {k} has shape {tuple(m.shape)} but LoRA matrix {blk.name} is {blk.shape}",
                where=str(p),
                fix=_FIX,
            )
        if not (torch.isfinite(m).all() and torch.isfinite(v).all()) or (v < 0).any():
            raise GradianUserError(
                f"optimizer state {k} ({blk.name}) holds non-finite or negative moments", where=str(p), fix=_FIX
            )
        step = st.get("step", 0)
        step = float(step.item() if isinstance(step, torch.Tensor) else step)
        betas = grp.get("betas", (0.9, 0.999))
        out[blk.name] = AdamState(
            m.double(), v.double(), step, float(betas[0]), float(betas[1]), float(grp.get("eps", 1e-8))
        )
    return out
