"""Exact per-example gradients over every LoRA matrix.

Three paths compute the same quantity, ``∂ℓ_j/∂W`` for every example j in a
batch and every LoRA matrix W (see :mod:`gradian.gradients.loss` for ℓ_j):

``hooks`` (default, one forward + one backward, :class:`gradian.gradients.hooks.LoraHooks`)
    For a LoRA Linear ``y = x Wᵀ`` applied at every token, a forward hook keeps
    its input ``X`` (b, t, i) and its output ``y``; one backward pass
    (``autograd.grad`` w.r.t. every kept ``y``) gives ``G = ∂L/∂y`` (b, t, o).
    Because ``L = Σ_j ℓ_j`` and example j only touches row j,
    ``G[j] = ∂ℓ_j/∂y[j]`` and

        g = einsum("bto,bti->boi", G, X)          # (b, o, i) = per-example ∂ℓ_j/∂W

    Padding tokens carry no loss and are masked from attention, so G is zero
    there and they contribute nothing, whichever side the padding is on.
    In a bfloat16/float16 model the forward and backward run in that dtype, but
    the token sum of the einsum runs in float32 (G and X are upcast first), so
    a long row's gradient does not lose its small terms; the result is float32.
``loop`` (reference)
    One forward/backward per example at batch size 1, padding stripped.
``vmap`` (reference)
    ``torch.func.vmap(torch.func.grad(ℓ))`` over the batch with the LoRA
    weights as functional parameters.

The test suite holds the three to float tolerance.
"""

from __future__ import annotations

from typing import Literal

import torch

from gradian.gradients.hooks import LoraHooks
from gradian.gradients.lora import lora_blocks
from gradian.gradients.loss import head_positions, model_inputs, per_example_loss

Method = Literal["hooks", "loop", "vmap"]


def _hooks(model, batch, blocks) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """One forward and one backward through the shared :class:`~gradian.gradients.hooks.LoraHooks`
    collector; every block's per-example gradient is ``einsum("bto,bti->boi", G, X)``.
    """
    hooks = LoraHooks(blocks)
    keep = head_positions(model, batch["labels"])
    logits = hooks.forward(model, batch, keep)  # the LM head only where the loss is
    losses = per_example_loss(logits, batch["labels"], keep)
    b = batch["input_ids"].shape[0]
    out: dict[str, torch.Tensor] = {}
    captures = hooks.backward(losses.sum())[::-1]
    while captures:  # in capture order; each (X, G) is freed once its gradient is formed, not after the last one
        c = captures.pop()
        acc = torch.float32 if c.G.dtype in (torch.float16, torch.bfloat16) else c.G.dtype  # half models: f32 sums
        g = torch.einsum("bto,bti->boi", c.G.to(acc), c.X.to(acc))  # (b, o, i)
        name = blocks[c.block].name
        out[name] = g if name not in out else out[name] + g
    for blk in blocks:
        if blk.name not in out:  # the block never ran with grad (e.g. a skipped layer)
            wd = blk.module.weight.dtype
            out[blk.name] = torch.zeros(
                (b, *blk.shape),
                dtype=torch.float32 if wd in (torch.float16, torch.bfloat16) else wd,
                device=blk.module.weight.device,
            )
    return {blk.name: out[blk.name] for blk in blocks}, losses.detach()


def _loop(model, batch, blocks) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    params = [b.module.weight for b in blocks]
    n = batch["input_ids"].shape[0]
    per: dict[str, list[torch.Tensor]] = {b.name: [] for b in blocks}
    losses = []
    for j in range(n):
        keep = batch["attention_mask"][j].bool()
        single = {k: v[j][keep].unsqueeze(0) for k, v in batch.items()}
        single["position_ids"] = torch.arange(int(keep.sum()), device=keep.device).unsqueeze(0)
        logits = model(**model_inputs(single)).logits
        loss = per_example_loss(logits, single["labels"])[0]
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        for blk, g, p in zip(blocks, grads, params):
            per[blk.name].append(
                torch.zeros(blk.shape, dtype=p.dtype, device=p.device) if g is None else g.view(blk.shape)
            )
        losses.append(loss.detach())
    return {k: torch.stack(v) for k, v in per.items()}, torch.stack(losses)


def _vmap(model, batch, blocks) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    from torch.func import functional_call, grad_and_value, vmap

    params = {b.name: b.module.weight.detach() for b in blocks}

    def loss_one(p, input_ids, mask4d, position_ids, labels):
        out = functional_call(
            model,
            p,
            args=(),
            kwargs={
                "input_ids": input_ids.unsqueeze(0),
                "attention_mask": mask4d.unsqueeze(0),
                "position_ids": position_ids.unsqueeze(0),
            },
            strict=False,
        )
        return per_example_loss(out.logits, labels.unsqueeze(0))[0]

    fn = vmap(grad_and_value(loss_one), in_dims=(None, 0, 0, 0, 0), randomness="error")
    mask4d = _prepared_mask(model, batch["attention_mask"])
    grads, losses = fn(params, batch["input_ids"], mask4d, batch["position_ids"], batch["labels"])
    return {b.name: grads[b.name].reshape(-1, *b.shape) for b in blocks}, losses.detach()


def _prepared_mask(model, attention_mask: torch.Tensor) -> torch.Tensor:
    """A ready 4D mask (b, 1, T, T) so that no data-dependent mask logic runs under vmap.

    Query t may attend key s iff s ≤ t and s is a real token; a padding query
    attends only itself (its output never reaches a real token, and a fully
    masked row would produce NaN in SDPA). transformers ≥ 5 passes a 4D mask
    through unchanged: boolean (True = attend) for SDPA, additive otherwise.
    """
    T = attention_mask.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool, device=attention_mask.device).tril()
    allowed = causal.unsqueeze(0) & attention_mask.bool().unsqueeze(1)
    allowed = allowed | torch.eye(T, dtype=torch.bool, device=attention_mask.device).unsqueeze(0)
    allowed = allowed.unsqueeze(1)
    impl = getattr(model.config, "_attn_implementation", None) or "sdpa"
    if impl == "sdpa":
        return allowed
    dtype = next(model.parameters()).dtype
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)


_METHODS = {"hooks": _hooks, "loop": _loop, "vmap": _vmap}


def per_example_grads(
    model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    method: Method = "hooks",
    modules: list[str] | None = None,
    return_losses: bool = False,
):
    """Per-example gradients of each example's loss w.r.t. every LoRA matrix.

    Args:
        model: a PEFT LoRA model (eval mode; LoRA weights require grad).
        batch: ``input_ids``, ``attention_mask``, ``labels`` (b, T), optional
            ``position_ids`` (b, T) (derived from the mask when absent), as
            produced by :func:`gradian.data.collate`.
        method: ``"hooks"`` (one backward; default), ``"loop"`` or ``"vmap"``.
        modules: optional layer-name substrings to restrict the blocks.
        return_losses: also return the (b,) per-example losses.

    Returns:
        ``{param_name: (b, *param_shape)}`` — for ``lora_A`` (b, r, in), for
        ``lora_B`` (b, out, r), for a DoRA magnitude (b, out, 1) (float32 for a half-precision model with
        ``hooks``); with
        ``return_losses``, ``(grads, losses)``.
    """
    if method not in _METHODS:
        raise ValueError(f"method must be one of {sorted(_METHODS)}, got {method!r}")
    blocks = lora_blocks(model, modules)
    if not blocks:
        raise ValueError("model has no LoRA layers (attach an adapter with gradian.models.load_adapter)")
    batch = dict(batch)
    if "position_ids" not in batch:
        batch["position_ids"] = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    device = blocks[0].module.weight.device
    batch = {k: v.to(device) for k, v in batch.items()}
    grads, losses = _METHODS[method](model, batch, blocks)
    return (grads, losses) if return_losses else grads
