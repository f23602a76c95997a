"""LoRA module discovery on a PEFT model.

Every PEFT LoRA layer wraps a base Linear (or GPT-2 Conv1D) and owns, per
adapter, two plain ``nn.Linear`` modules: ``lora_A`` (in → r) and ``lora_B``
(r → out). Its forward adds ``lora_B(lora_A(dropout(x))) * scaling``. The
scaling (``alpha/r``, or ``alpha/√r`` with rsLoRA) is applied *after*
``lora_B``, so it is part of the graph and of every captured output gradient:
per-example gradients need no separate scaling correction.

**DoRA** (``use_dora``) adds, per adapter, a magnitude vector ``m`` (out,)
(``lora_magnitude_vector[adapter].weight``). PEFT's layer computes, with the
column norm ``n = ‖W + s·BA‖`` (per output row, detached from the graph as the
DoRA paper's section 4.3 asks):

    y = W x + (m/n − 1) ⊙ W x + (m/n) ⊙ s·B A x

so ``lora_B``'s output gradient carries ``(m/n)·s`` and the A/B factorisation
above stays exact. ``m`` is one more block, of kind ``"M"`` and shape (out, 1):
``∂y_t/∂m = v_t = (W x_t + s·B A x_t) / n``, so its per-example gradient is
``Σ_t G_t ⊙ v_t``, i.e. the same ``einsum("bto,bti->boi", G', X')`` with
``G' = G ⊙ v`` and ``X' = 1`` (b, t, 1) (:mod:`gradian.gradients.hooks`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LoraBlock:
    """One trainable LoRA matrix: a block of the per-example gradient.

    Attributes:
        name: the parameter's name in ``model.named_parameters()``.
        module: the ``nn.Linear`` (``lora_A[adapter]`` or ``lora_B[adapter]``), or for ``"M"`` PEFT's DoRA layer
            (``lora_magnitude_vector[adapter]``, whose ``weight`` is m).
        kind: ``"A"`` (weight r×in), ``"B"`` (weight out×r) or ``"M"`` (DoRA magnitude, out; a block of
            shape (out, 1)).
        layer: the name of the wrapping LoRA layer (e.g. ``...q_proj``).
    """

    name: str
    module: torch.nn.Linear
    kind: str
    layer: str

    @property
    def shape(self) -> tuple[int, int]:
        """(o, i) of the block's gradient: the weight's shape, (out, 1) for a DoRA magnitude."""
        if self.kind == "M":
            return (int(self.module.weight.shape[0]), 1)
        return tuple(self.module.weight.shape)  # type: ignore[return-value]

    @property
    def numel(self) -> int:
        return self.module.weight.numel()


def lora_blocks(model: torch.nn.Module, modules: list[str] | None = None) -> list[LoraBlock]:
    """All LoRA ``A``/``B`` matrices (and DoRA magnitudes) of the active adapter, in ``named_parameters`` order.

    Args:
        modules: optional substrings; keep only layers whose name contains one
            (e.g. ``["q_proj", "v_proj"]``).
    """
    param_names = {id(p): n for n, p in model.named_parameters()}
    blocks: list[LoraBlock] = []
    for lname, layer in model.named_modules():
        la = getattr(layer, "lora_A", None)
        lb = getattr(layer, "lora_B", None)
        if not isinstance(la, torch.nn.ModuleDict) or not isinstance(lb, torch.nn.ModuleDict):
            continue
        if modules and not any(m in lname for m in modules):
            continue
        active = getattr(layer, "active_adapters", None) or list(la.keys())
        for adapter in active:
            if adapter not in la:
                continue
            for kind, mod in (("A", la[adapter]), ("B", lb[adapter])):
                if not isinstance(mod, torch.nn.Linear):
                    raise TypeError(f"{lname}.lora_{kind}[{adapter}] is {type(mod).__name__}, expected Linear")
                if mod.bias is not None:
                    raise TypeError(f"{lname}.lora_{kind} has a bias; LoRA bias is not supported")
                blocks.append(LoraBlock(param_names[id(mod.weight)], mod, kind, lname))
            mag = getattr(layer, "lora_magnitude_vector", None)
            if (
                isinstance(mag, torch.nn.ModuleDict)
                and adapter in mag
                and (getattr(layer, "use_dora", {}) or {}).get(adapter)
            ):
                blocks.append(LoraBlock(param_names[id(mag[adapter].weight)], mag[adapter], "M", lname))
    order = {n: i for i, (n, _) in enumerate(model.named_parameters())}
    blocks.sort(key=lambda b: order[b.name])
    return blocks
