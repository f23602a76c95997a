"""One hook collector for every per-token LoRA statistic.

Every LoRA matrix W is a plain ``nn.Linear`` applied at every token, ``y = x Wᵀ``. A forward
hook keeps its input ``X`` (b, t, i) and its output ``y``; after the caller has formed a loss
``L`` from the logits, one ``autograd.grad`` call w.r.t. every kept ``y`` returns each
``G = ∂L/∂y`` (b, t, o) at once. Asking for the outputs rather than the weights means autograd
never forms the summed weight gradients nobody needs.

What is built from ``(X, G)`` is the consumer's business:

* per-example gradients (:mod:`gradian.gradients.per_example`), with ``L = Σ_j ℓ_j``:
  ``g = einsum("bto,bti->boi", G, X)``, exact because row j only touches ℓ_j;
* EK-FAC covariances (:mod:`gradian.engines.ekfac`): ``A = Σ_t x_t x_tᵀ`` and
  ``S = Σ_t g_t g_tᵀ`` over the non-padding tokens (:func:`token_mask`), then per-example
  gradients again for the eigenvalue correction.

Both therefore see the same modules, the same loss and the same masks.

A DoRA magnitude block m (:mod:`gradian.gradients.lora`) is not a Linear, but its gradient has the same form:
the DoRA layer's output ``y`` is linear in m with ``∂y_t/∂m = v_t`` (b, t, o), so its hook returns
``y + u ⊙ v`` with ``u = 0`` (b, t, o) a leaf that requires grad (the value is unchanged) and keeps ``u`` as the
output and ``X = 1`` (b, t, 1): then ``G = ∂L/∂u = ∂L/∂y ⊙ v`` and every consumer's
``einsum("bto,bti->boi", G, X)`` (or its token masks) gives ``Σ_t G_t ⊙ v_t``, m's gradient, unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from gradian.gradients.lora import LoraBlock
from gradian.gradients.loss import lm_logits


def dora_direction(layer: torch.nn.Module, x: torch.Tensor, kwargs: dict) -> torch.Tensor:
    """``v = ∂y/∂m`` (b, t, o) of one call of PEFT's DoRA layer: ``(W x + s·B A x) / n`` with
    ``n = ‖W + s·BA‖`` per output row, the base output without its bias (PEFT's ``base_result`` when it passes
    one) and every term in ``x``'s dtype, as PEFT's ``DoraLinearLayer.forward`` forms them (no grad).

    Args:
        layer: the ``DoraLinearLayer`` (``lora_magnitude_vector[adapter]``).
        x: (b, t, i) its input.
        kwargs: the keywords PEFT called it with (``lora_A``, ``lora_B``, ``scaling``, ``base_layer``, and
            ``base_result`` when the dropout is the identity or the model is in eval mode).
    """
    import torch.nn.functional as F

    A, B, s, base_layer = kwargs["lora_A"].weight, kwargs["lora_B"].weight, kwargs["scaling"], kwargs["base_layer"]
    with torch.no_grad():
        W = base_layer.weight.to(x.dtype)
        if getattr(layer, "fan_in_fan_out", False):  # GPT-2 Conv1D stores (in, out)
            W = W.T
        n = torch.linalg.norm(W + s * (B @ A).to(x.dtype), dim=1)  # (o,)
        base = kwargs.get("base_result")
        if base is None:
            base = F.linear(x, W)
        elif base_layer.bias is not None:
            base = base - base_layer.bias
        return (base + F.linear(F.linear(x, A), B) * s) / n


@dataclass
class Capture:
    """One application of one LoRA matrix in a forward pass.

    Attributes:
        block: index into the collector's ``blocks``.
        X: (b, t, i) the input, detached.
        G: (b, t, o) ``∂L/∂y`` of the loss the caller backpropagated.
    """

    block: int
    X: torch.Tensor
    G: torch.Tensor


class LoraHooks:
    """Forward hooks on LoRA blocks for one forward pass and one backward pass.

    Usage::

        hooks = LoraHooks(blocks)
        logits = hooks.forward(model, batch)          # hooks live only during this call
        losses = per_example_loss(logits, labels)     # any loss built from the logits
        for c in hooks.backward(losses.sum()):        # one autograd.grad for every block
            ...  c.block, c.X, c.G

    A block that did not run with grad (e.g. a skipped layer) yields no capture.
    """

    def __init__(self, blocks: Sequence[LoraBlock]):
        self.blocks = list(blocks)
        self._seen: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (block index, X, y)

    def forward(
        self,
        model: torch.nn.Module,
        batch: dict[str, torch.Tensor],
        keep: torch.Tensor | None = None,
        states: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Run the model on ``batch`` (its forward kwargs) with the hooks on; returns the logits (b, T, V), or
        with ``keep`` (P,) positions only those positions' logits (b, P, V) (``logits_to_keep``); ``states``, when
        given, gets the last hidden state (b, T, d) (:func:`gradian.gradients.loss.lm_logits`).
        """
        self._seen = []
        handles = []

        def make_fwd(k: int) -> Callable:
            def fwd(module, inputs, output):
                # token applications only: PEFT's DoRA layer also runs lora_B(lora_A(I)) on an identity (in, in) to
                # form BA for its weight norm, which it detaches, so that call has no gradient to keep
                if output.requires_grad and inputs[0].dim() == 3:
                    self._seen.append((k, inputs[0].detach(), output))

            return fwd

        def make_magnitude(k: int) -> Callable:
            def fwd(module, args, kwargs, output):
                if not output.requires_grad:
                    return None
                v = dora_direction(module, args[0], kwargs)
                u = torch.zeros_like(output, requires_grad=True)
                self._seen.append((k, output.new_ones((*output.shape[:-1], 1)), u))
                return output + u * v  # the same value; ∂L/∂u = ∂L/∂output ⊙ v

            return fwd

        try:
            for k, b in enumerate(self.blocks):
                if b.kind == "M":
                    handles.append(b.module.register_forward_hook(make_magnitude(k), with_kwargs=True))
                else:
                    handles.append(b.module.register_forward_hook(make_fwd(k)))
            return lm_logits(model, batch, keep, states)
        finally:
            for h in handles:
                h.remove()

    def backward(self, loss: torch.Tensor) -> list[Capture]:
        """``G = ∂loss/∂y`` for every captured application (one ``autograd.grad`` call)."""
        seen, self._seen = self._seen, []
        if not seen:
            return []
        Gs = torch.autograd.grad(loss, [y for _, _, y in seen], allow_unused=True)
        return [Capture(k, X, G) for (k, X, _), G in zip(seen, Gs) if G is not None]


def token_mask(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(b, t) 1.0 on real tokens, 0.0 on padding: the tokens a covariance counts."""
    return batch["attention_mask"].to(torch.float64)


def sample_labels(logits: torch.Tensor, labels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Labels drawn from the model's own predictive distribution on the supervised tokens (true Fisher).

    Supervised positions (labels ≠ -100, unshifted as in HF) get a token sampled from
    ``softmax(logits)`` of the position before; everything else is unchanged, so the loss masks
    are the same as with the real labels. Drawn on the CPU with ``generator`` (reproducible).
    """
    from gradian.gradients.loss import IGNORE_INDEX

    with torch.no_grad():
        probs = torch.softmax(logits[:, :-1].detach().double(), dim=-1).cpu()
        drawn = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator).view(probs.shape[:-1])
        out = labels.clone()
        keep = labels[:, 1:] != IGNORE_INDEX
        out[:, 1:] = torch.where(keep, drawn.to(labels.device), labels[:, 1:])
    return out
