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
from typing import Any

import torch

from gradian.errors import GradianUserError
from gradian.gradients.lora import lora_blocks
from gradian.index.shards import GRAD_ABS_MAX
from gradian.safeio import file_number, short_repr

_FIX = "pass the optimizer.pt saved in the same checkpoint folder as the adapter (HF Trainer, AdamW)"


@dataclass
class AdamState:
    """Adam's moments for one LoRA matrix: ``exp_avg``/``exp_avg_sq`` (o, i), the step, betas and eps.

    Attributes:
        source: the ``optimizer.pt`` it was read from and the LoRA matrix (for messages).
    """

    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    step: float
    beta1: float
    beta2: float
    eps: float
    source: str = "optimizer.pt"

    def update(self, g: torch.Tensor) -> torch.Tensor:
        """Args: g (b, o, i) per-example gradients. Returns u (b, o, i), Adam's update direction (docstring).

        Raises:
            GradianUserError: naming ``optimizer.pt``, when a finite gradient's update is not finite or is
                beyond :data:`~gradian.index.shards.GRAD_ABS_MAX` (the saved state, not the gradient, is at
                fault: e.g. a tiny ``eps`` over a zero ``exp_avg_sq``, or betas next to 1).
        """
        m = self.exp_avg.to(device=g.device, dtype=g.dtype)
        v = self.exp_avg_sq.to(device=g.device, dtype=g.dtype)
        t = self.step + 1.0
        m1 = self.beta1 * m + (1.0 - self.beta1) * g
        v1 = self.beta2 * v + (1.0 - self.beta2) * g * g
        u = (m1 / (1.0 - self.beta1**t)) / ((v1 / (1.0 - self.beta2**t)).sqrt() + self.eps)
        sound_g = torch.isfinite(g) & (g.abs() <= GRAD_ABS_MAX)
        bad_u = ~torch.isfinite(u) | (u.abs() > GRAD_ABS_MAX)
        if bool((sound_g & bad_u).any()):
            raise GradianUserError(
                f"Adam's update direction is not finite (or beyond {GRAD_ABS_MAX:g}) for finite gradients: the saved "
                f"state (betas ({self.beta1:g}, {self.beta2:g}), eps {self.eps:g}, step {self.step:g}, "
                f"|exp_avg| up to {float(m.abs().max()):.3g}) cannot precondition them",
                where=self.source,
                fix=_FIX + ", or attribute without it (--optimizer none)",
            )
        return u


def _scalar(v: Any) -> Any:
    """A one-element real tensor as a Python number (torch may save ``step``, ``betas`` as tensors); else ``v``."""
    if isinstance(v, torch.Tensor) and v.numel() == 1 and not v.dtype.is_complex and v.dtype != torch.bool:
        return v.item()
    return v


def _moment(v: Any, where: str, key: str, shape: tuple[int, ...], lora: str, squares: bool = False) -> torch.Tensor:
    """``state[i][key]``: a dense real tensor of the LoRA matrix's shape, finite (and >= 0 with ``squares``); a DoRA
    magnitude's (out,) moment is returned as its block's (out, 1).
    """
    if not isinstance(v, torch.Tensor):
        raise GradianUserError(
            f"{key} is {short_repr(v, 40)}, not a tensor: not an Adam/AdamW state", where=where, fix=_FIX
        )
    if v.layout != torch.strided or not v.dtype.is_floating_point:
        raise GradianUserError(
            f"{key} is a {v.dtype} {str(v.layout).replace('torch.', '')} tensor, not a dense floating-point one",
            where=where,
            fix=_FIX,
        )
    if v.dim() == 1 and len(shape) == 2 and shape[1] == 1 and v.shape[0] == shape[0]:
        v = v.view(shape)
    if tuple(v.shape) != shape:
        raise GradianUserError(
            f"{key} has shape {tuple(v.shape)} but LoRA matrix {lora} is {shape}", where=where, fix=_FIX
        )
    if not bool(torch.isfinite(v).all()):
        raise GradianUserError(f"{key} holds NaN or inf", where=where, fix=_FIX)
    if squares and bool((v < 0).any()):
        raise GradianUserError(
            f"{key} holds negative values (a mean of squared gradients is >= 0)", where=where, fix=_FIX
        )
    return v


def read_adam_state(optimizer_pt: str | Path, model: torch.nn.Module) -> dict[str, AdamState]:
    """``{LoRA parameter name: AdamState}`` for every trainable LoRA matrix of ``model``.

    Every value is checked before use: ``param_groups[g].params`` are distinct whole numbers,
    ``betas`` two numbers in [0, 1), ``eps`` > 0 and finite; ``state[i].step`` a whole number >= 0,
    ``exp_avg``/``exp_avg_sq`` dense floating-point tensors of the LoRA matrix's shape, finite,
    ``exp_avg_sq`` >= 0.

    Raises:
        GradianUserError: the file is unreadable, not an Adam state, holds a value that is not finite
            or not possible (naming the key, e.g. ``param_groups[0].betas[1] = 1.0``), or does not match
            the adapter.
    """
    p = Path(optimizer_pt)
    where = str(p)
    try:
        sd = torch.load(str(p), map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise GradianUserError("optimizer.pt not found", where=where, fix=_FIX) from None
    except Exception as e:  # corrupt zip, a pickle with objects weights_only refuses, a truncated file, too deep
        raise GradianUserError(
            f"cannot read the optimizer state safely ({type(e).__name__})", where=where, fix=_FIX
        ) from None
    if (
        not isinstance(sd, dict)
        or not isinstance(sd.get("state"), dict)
        or not isinstance(sd.get("param_groups"), list)
    ):
        raise GradianUserError("not an optimizer state_dict (no state / param_groups)", where=where, fix=_FIX)
    order: list[tuple[int, dict, int]] = []
    seen: set[int] = set()
    for g, grp in enumerate(sd["param_groups"]):
        if not isinstance(grp, dict) or not isinstance(grp.get("params"), list):
            raise GradianUserError(f"param_groups[{g}] is not a group with a params list", where=where, fix=_FIX)
        for j, i in enumerate(grp["params"]):
            idx = int(
                file_number(i, where, f"param_groups[{g}].params[{j}]", "parameter index", lo=0, whole=True, fix=_FIX)
            )
            if idx in seen:
                raise GradianUserError(
                    f"param_groups[{g}].params[{j}] = {idx}: the parameter is in two groups", where=where, fix=_FIX
                )
            seen.add(idx)
            order.append((idx, grp, g))
    blocks = lora_blocks(model)
    trainable = [b for b in blocks if b.module.weight.requires_grad]
    if len(order) != len(trainable):
        raise GradianUserError(
            f"the optimizer holds {len(order)} parameters but the adapter has {len(trainable)} LoRA matrices",
            where=where,
            fix=_FIX,
        )
    hyper: dict[int, tuple[float, float, float]] = {}
    out: dict[str, AdamState] = {}
    for (idx, grp, g), blk in zip(order, trainable):
        if g not in hyper:
            betas = grp.get("betas", (0.9, 0.999))
            if not isinstance(betas, (list, tuple)) or len(betas) != 2:
                raise GradianUserError(
                    f"param_groups[{g}].betas = {short_repr(betas, 40)}: not a pair (beta1, beta2)",
                    where=where,
                    fix=_FIX,
                )
            b1, b2 = (
                file_number(
                    _scalar(b), where, f"param_groups[{g}].betas[{k}]", "beta", lo=0, hi=1, hi_open=True, fix=_FIX
                )
                for k, b in enumerate(betas)
            )
            eps = file_number(
                _scalar(grp.get("eps", 1e-8)), where, f"param_groups[{g}].eps", "eps", lo=0, lo_open=True, fix=_FIX
            )
            hyper[g] = (b1, b2, eps)
        b1, b2, eps = hyper[g]
        st = sd["state"].get(idx)
        if not isinstance(st, dict) or "exp_avg" not in st or "exp_avg_sq" not in st:
            raise GradianUserError(
                f"state[{idx}] has no Adam moments (exp_avg, exp_avg_sq): not an Adam/AdamW state",
                where=where,
                fix=_FIX,
            )
        m = _moment(st["exp_avg"], where, f"state[{idx}].exp_avg", blk.shape, blk.name)
        v = _moment(st["exp_avg_sq"], where, f"state[{idx}].exp_avg_sq", blk.shape, blk.name, squares=True)
        step = file_number(_scalar(st.get("step", 0)), where, f"state[{idx}].step", "step", lo=0, whole=True, fix=_FIX)
        out[blk.name] = AdamState(
            m.double(), v.double(), float(step), b1, b2, eps, f"{where}: state[{idx}] ({blk.name})"
        )
    return out
