"""The per-example loss whose gradients Gradian attributes.

One example's loss is the **mean** token cross-entropy over its supervised
tokens (labels ≠ -100, after the causal shift):

    ℓ_j = (1 / |S_j|) Σ_{t ∈ S_j} −log p(x_{t+1} | x_{≤t})

so every example counts equally whatever its length (an example with no
supervised tokens has ℓ_j = 0 and a zero gradient). A batch's loss is the
plain **sum** over examples, L = Σ_j ℓ_j, so ∂L/∂θ = Σ_j ∂ℓ_j/∂θ and the
per-example gradients can be read off one backward pass.
"""

from __future__ import annotations

from typing import Any

import torch

IGNORE_INDEX = -100


def per_example_loss(logits: torch.Tensor, labels: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Mean supervised-token cross-entropy per example.

    Args:
        logits: (b, T, V); or with ``keep``, (b, P, V): the logits at positions ``keep`` only.
        labels: (b, T), -100 where not supervised (unshifted; shifted here).
        keep: (P,) positions t < T−1 whose logits were kept (:func:`supervised_positions`): logit t predicts
            label t+1, so every other position carries no loss and the result is the same.

    Returns:
        (b,) losses, in float32 or wider.
    """
    if keep is None:
        shift_logits = logits[:, :-1, :]
        shift_labels = labels[:, 1:]
    else:
        shift_logits = logits
        shift_labels = labels[:, 1:][:, keep]
    mask = shift_labels != IGNORE_INDEX
    safe = shift_labels.clamp(min=0)
    logp = torch.log_softmax(
        shift_logits.float() if shift_logits.dtype in (torch.float16, torch.bfloat16) else shift_logits, dim=-1
    )
    tok = -logp.gather(-1, safe.unsqueeze(-1)).squeeze(-1) * mask
    count = mask.sum(-1).clamp(min=1).to(tok.dtype)
    return tok.sum(-1) / count


def sequence_logprob(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed log-probability of the supervised tokens per example (nats).

    Args:
        logits: (b, T, V); labels: (b, T) with -100 on unscored tokens.

    Returns:
        (b,) Σ_t log p(x_{t+1} | x_{≤t}) over scored tokens.
    """
    shift_logits = logits[:, :-1, :].float()
    shift_labels = labels[:, 1:]
    mask = shift_labels != IGNORE_INDEX
    logp = torch.log_softmax(shift_logits, dim=-1).gather(-1, shift_labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (logp * mask).sum(-1)


def supervised_positions(labels: torch.Tensor) -> torch.Tensor:
    """(P,) the positions t < T−1 whose logits predict a supervised label in some row (``labels[:, t+1] ≠ -100``).

    Args:
        labels: (b, T) unshifted.
    """
    return (labels[:, 1:] != IGNORE_INDEX).any(0).nonzero()[:, 0]


def keeps_logits(model: torch.nn.Module) -> bool:
    """Whether the causal LM's forward takes ``logits_to_keep`` (transformers' models do): then the LM head
    is applied only at the supervised positions, which is where the loss is. For SmolLM2-135M the head
    (49,152 × 576) is a fifth of the model's multiply-adds per token and its log-softmax is over 49,152 words,
    while a chat row's supervised tokens are often a fifth of its tokens or fewer.
    """
    import inspect

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        return "logits_to_keep" in inspect.signature(inner.forward).parameters
    except (TypeError, ValueError):
        return False


def head_positions(model: torch.nn.Module, labels: torch.Tensor) -> torch.Tensor | None:
    """(P,) the positions the LM head must run at for the loss on ``labels`` (:func:`supervised_positions`), or None
    for every position: the model does not take ``logits_to_keep`` (:func:`keeps_logits`), or nothing is supervised
    (the full logits then give the zero loss its graph).
    """
    if not keeps_logits(model):
        return None
    keep = supervised_positions(labels)
    return keep if keep.numel() else None


def lm_logits(
    model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    keep: torch.Tensor | None = None,
    states: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """The model's logits on ``batch``: (b, T, V), or with ``keep`` (P,) (:func:`head_positions`) those positions'
    only, (b, P, V), the LM head run nowhere else.

    Args:
        states: when given, the last hidden state (b, T, d) (``output_hidden_states``' last, as RepSim reads it:
            :func:`supervised_mean`) is appended to it, detached.
    """
    extra: dict[str, Any] = {"logits_to_keep": keep} if keep is not None else {}
    if states is not None:
        extra["output_hidden_states"] = True
    out = model(**model_inputs(batch), **extra)
    if states is not None:
        states.append(out.hidden_states[-1].detach())
    return out.logits


def supervised_mean(hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Each row's hidden states averaged over its supervised tokens: (b, d) float64.

    ``h_j = (1/|S_j|) Σ_{t ∈ S_j} H[j, t]`` with ``S_j`` the tokens whose label is not -100 (HF labels, not yet
    shifted: the states at the tokens the loss predicts); a row with none gives zeros.

    Args:
        hidden: (b, T, d), e.g. the last hidden state; labels: (b, T).
    """
    w = (labels != IGNORE_INDEX).double()  # (b, T)
    return (hidden.double() * w.unsqueeze(-1)).sum(1) / w.sum(1, keepdim=True).clamp(min=1.0)


def model_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The forward kwargs (labels excluded: Gradian computes its own loss)."""
    keys = ("input_ids", "attention_mask", "position_ids")
    return {k: batch[k] for k in keys if k in batch}
