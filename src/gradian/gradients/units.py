"""Sentence-unit gradients of one row from one forward pass, and the row gradient derived from them.

A row's supervised tokens S (after the causal shift) carry token losses ``c_t``. The row's loss and a
unit's (:mod:`gradian.data.spans`; u ⊆ S, the tokens of one sentence) are means:

    ℓ_row = (1/|S|) Σ_{t∈S} c_t,        ℓ_u = (1/|u|) Σ_{t∈u} c_t.

Every unit of the row sees the same tokens up to its cut (causal attention), so one forward pass over
the whole row gives every ``c_t`` and every LoRA input ``X`` (t, i). The units' losses are rows of one
weight matrix over the token losses, ``ℓ = W c`` (K, ), and one backward per unit over that one graph
(``autograd.grad(ℓ_u, ys, retain_graph=True)``) gives the unit's ``G_u = ∂ℓ_u/∂y`` (t, o); the unit
gradient is ``g_u = G_uᵀ X`` (o, i), as in :mod:`gradian.gradients.per_example`, formed at once so that
only one unit's G is alive. (A batched backward over the K vectors, ``is_grads_batched=True``, holds K of
every block's G and K copies of every activation gradient: +4.6 GB of RSS for one 242-token SmolLM2 row with
14 vectors, against +1.6 GB this way, which also took 19 s instead of 30 s and gives the same float32 numbers
to the bit: docs/benchmarks.md.)

**The row from its units.** With ``w_u = |u|/|S|``,

    ℓ_row = Σ_u w_u ℓ_u + ℓ_res,        ℓ_res = Σ_t ρ_t c_t,   ρ_t = (1 − n_t)/|S|  (t ∈ S),

where ``n_t`` is the number of units holding token t. When the units partition S (every supervised token
in exactly one sentence) ρ = 0 except on the residual tokens (EOS / end of turn, text between sentences),
where ρ_t = 1/|S|: the residual is one more unit. A token two sentences share gets ρ_t = −1/|S|, so the
identity is exact in every case. The gradient is linear in the loss, hence

    g_row = Σ_u w_u g_u + g_res,

a fixed weighted sum; so is any linear map of it (a projection P: P g_row = Σ_u w_u P g_u + P g_res). No
separate row pass is needed. A row whose one unit is all of S (ρ = 0) is computed once: g_row = g_u; every row
with one unit is such a row (:func:`gradian.data.spans.sentence_units`: a one-sentence answer is its own unit).

**The row's gradient split by position** (``split="positions"``, ``--unit-grads positions``; an approximation,
not the unit's own gradient). One backward of the row's loss gives ``G = ∂ℓ_row/∂y`` (t, o), hence the exact
``g_row = Gᵀ X``. A unit u is predicted from its own positions ``P_u = {t : token t+1 ∈ u}``; its gradient is taken as
the part of the row's gradient that flows through the LoRA weights at those positions, on the unit's loss scale:

    g̃_u = (1/w_u) Σ_{t∈P_u} G_t X_tᵀ,        Σ_u w_u g̃_u = Σ_{t ∈ ∪P_u} G_t X_tᵀ  (the rest: prompt, residual).

Against the exact ``g_u = Σ_s (∂ℓ_u/∂y_s) X_sᵀ`` it keeps, at the unit's positions, what the later tokens' losses
pull through them (attention), and drops what the unit's loss pulls through the earlier positions (the prompt,
the sentences before it). One backward per row instead of K'; the row gradient stays exact; a one-unit row's
unit is its row gradient, exactly. Measured in docs/benchmarks.md ("Sentence units from one backward").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from gradian.gradients.hooks import LoraHooks
from gradian.gradients.lora import LoraBlock
from gradian.gradients.loss import IGNORE_INDEX, head_positions, supervised_mean

#: how a unit's gradient is formed (``GradSpec.unit_grads``, ``--unit-grads``; module docstring)
SPLITS = ("exact", "positions")


@dataclass
class RowUnitGrads:
    """One row's unit gradients and its derived row gradient.

    Attributes:
        units: ``{block name: (K, o, i)}`` the K units' gradients (in the order of ``unit_labels``).
        row: ``{block name: (o, i)}`` the row's gradient, ``Σ_u w_u g_u + g_res``.
        unit_losses: (K,) each unit's mean token loss; ``row_loss`` the row's.
        passes: backward vectors used (K, plus one when the row has a residual; 1 with ``split="positions"``).
        state: with ``states=True``, the row's last hidden state mean-pooled over its supervised tokens (d,) float64
            (:func:`gradian.gradients.loss.supervised_mean`: RepSim's representation of the row); else None.
    """

    units: dict[str, torch.Tensor]
    row: dict[str, torch.Tensor]
    unit_losses: torch.Tensor
    row_loss: float
    passes: int
    state: torch.Tensor | None = None


def _token_losses(logits: torch.Tensor, labels: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """(b, T−1) per-position cross-entropy after the causal shift (0 where the label is ignored); with ``keep``
    (P,), ``logits`` (b, P, V) are those positions' only and the result is (b, P).

    Args:
        logits: (b, T, V), or (b, P, V) with ``keep``.
        labels: (b, T) unshifted.
    """
    shift = logits[:, :-1, :] if keep is None else logits
    if shift.dtype in (torch.float16, torch.bfloat16):
        shift = shift.float()
    lab = labels[:, 1:] if keep is None else labels[:, 1:][:, keep]
    logp = torch.log_softmax(shift, dim=-1)
    return -logp.gather(-1, lab.clamp(min=0).unsqueeze(-1)).squeeze(-1) * (lab != IGNORE_INDEX)


def loss_weights(row_labels: torch.Tensor, unit_labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The weights ``W`` (K', T−1) with ``ℓ = W c``, the row weights ``w`` (K',) and K' (module docstring).

    Args:
        row_labels: (T,) the row's labels (-100 off the loss).
        unit_labels: (K, T) each unit's labels over the row's tokens (-100 outside the unit).

    Returns:
        ``(W, w, K')``: the K unit rows ``1_u/|u|`` then, when ρ ≠ 0, the residual row ρ (weight 1);
        ``w`` the coefficients of ``g_row = Σ w_k g_k``.
    """
    S = (row_labels[1:] != IGNORE_INDEX).to(torch.float64)  # (T-1,)
    M = (unit_labels[:, 1:] != IGNORE_INDEX).to(torch.float64)  # (K, T-1)
    M = M * S  # a unit supervises only row-supervised tokens
    size = M.sum(-1)  # (K,)
    n_s = S.sum()
    W = M / size.clamp(min=1).unsqueeze(-1)
    w = size / n_s.clamp(min=1)
    rho = (S - M.sum(0)) / n_s.clamp(min=1)  # (T-1,)
    if bool((rho != 0).any()):
        W = torch.cat([W, rho.unsqueeze(0)])
        w = torch.cat([w, torch.ones(1, dtype=w.dtype)])
    return W, w, W.shape[0]


def row_unit_grads(
    model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    unit_labels: torch.Tensor,
    blocks: Sequence[LoraBlock],
    split: str = "exact",
) -> RowUnitGrads:
    """Every unit's gradient of one row from one forward and one backward per vector (module docstring).

    Args:
        model: a PEFT LoRA model (eval mode; LoRA weights require grad).
        batch: ONE row, as :func:`gradian.data.tokenize.collate` gives it (``input_ids`` etc. (1, T)).
        unit_labels: (K, T) the units' labels on the row's tokens.
        blocks: the LoRA blocks (:func:`gradian.gradients.lora.lora_blocks`).
        split: ``"exact"`` (each unit's own gradient) or ``"positions"`` (the row's gradient split by position).

    Returns:
        :class:`RowUnitGrads`; gradients in the accumulation dtype of the hooks path (float32 for a half model).
    """
    if batch["input_ids"].shape[0] != 1:
        raise ValueError("row_unit_grads takes one row")
    return rows_unit_grads(model, batch, [unit_labels], blocks, split)[0]


def rows_unit_grads(
    model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    unit_labels: Sequence[torch.Tensor],
    blocks: Sequence[LoraBlock],
    split: str = "exact",
    states: bool = False,
) -> list[RowUnitGrads]:
    """:func:`row_unit_grads` for b rows at once: one forward over the batch, then one backward per vector index.

    Rows of a batch do not interact (causal attention within a row, padding masked), so the backward of
    ``L_k = Σ_b ℓ_{b,k}`` (the k-th vector of every row that has one) gives each row's own
    ``G_{b,k} = ∂ℓ_{b,k}/∂y_b`` (b, t, o), and ``g_{b,k} = G_{b,k}ᵀ X_b`` (o, i), as the hooks path gives per-example
    gradients. The backward passes drop from ``Σ_b K'_b`` to ``max_b K'_b``; each carries the whole batch. Padding
    tokens get ``G = 0``, so every row's gradient equals its one-row result up to float summation order.

    Args:
        model: a PEFT LoRA model (eval mode; LoRA weights require grad).
        batch: b rows, as :func:`gradian.data.tokenize.collate` gives them (``input_ids`` etc. (b, T)).
        unit_labels: per row, (K_b, T) its units' labels on the batch's T tokens (-100 outside the unit).
        blocks: the LoRA blocks (:func:`gradian.gradients.lora.lora_blocks`).
        split: ``"exact"``, or ``"positions"``: one backward of ``Σ_b ℓ_row,b`` and every unit's gradient the row's
            split by position (module docstring), ``g̃_{b,u} = (1/w_u) Σ_{t∈P_u} G_{b,t} X_{b,t}ᵀ``.
        states: also pool each row's last hidden state from the same forward (:attr:`RowUnitGrads.state`), so
            RepSim needs no forward of its own over the rows this pass computes.

    Returns:
        one :class:`RowUnitGrads` per row, in order.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    device = blocks[0].module.weight.device
    batch = {k: v.to(device) for k, v in batch.items()}
    if "position_ids" not in batch:
        batch["position_ids"] = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    lab = batch["labels"]
    B = lab.shape[0]
    if len(unit_labels) != B:
        raise ValueError(f"{len(unit_labels)} unit-label sets for {B} rows")
    Ks = [int(u.shape[0]) for u in unit_labels]
    weights = [loss_weights(lab[b].cpu(), unit_labels[b].cpu()) for b in range(B)]  # (W (K'_b, T-1), w, K'_b)
    hooks = LoraHooks(blocks)
    keep = head_positions(model, lab)
    hidden: list[torch.Tensor] | None = [] if states else None
    if keep is not None:  # the LM head only at the supervised positions (of any row): c_t = 0 elsewhere
        c = _token_losses(hooks.forward(model, batch, keep, hidden), lab, keep)  # (b, P)
        cols = keep.cpu()
    else:
        c = _token_losses(hooks.forward(model, batch, None, hidden), lab)  # (b, T-1)
        cols = slice(None)
    pooled = supervised_mean(hidden[0], lab).cpu() if hidden else None  # (b, d)
    losses = [W[:, cols].to(device=device, dtype=c.dtype) @ c[b] for b, (W, _, _) in enumerate(weights)]  # (K'_b,)
    seen, hooks._seen = hooks._seen, []
    if split == "positions":
        res = _split_by_position(seen, blocks, weights, losses, Ks)
        for b, r in enumerate(res):
            r.state = pooled[b] if pooled is not None else None
        return res
    ys = [y for _, _, y in seen]
    k_alls = [k for _, _, k in weights]
    out: list[dict[str, torch.Tensor]] = []
    for b in range(B):
        acc_b: dict[str, torch.Tensor] = {}
        for blk in blocks:
            acc_b[blk.name] = torch.zeros((k_alls[b], *blk.shape), dtype=_accumulation_dtype(blk), device=device)
        out.append(acc_b)
    # one backward per vector index over the same graph: only one vector's G (b, t, o) per block is alive at a time
    k_max = max(k_alls) if ys else 0
    for k in range(k_max):
        rows = [b for b in range(B) if k < k_alls[b]]
        total = losses[rows[0]][k]
        for b in rows[1:]:
            total = total + losses[b][k]
        Gs = torch.autograd.grad(total, ys, retain_graph=k < k_max - 1, allow_unused=True)
        for (kb, X, _), G in zip(seen, Gs):
            if G is None:
                continue
            name = blocks[kb].name
            for b in rows:
                g = out[b][name]
                g[k] += G[b].to(g.dtype).T @ X[b].to(g.dtype)  # (o, i) = Σ_t G_t X_tᵀ
        del Gs
    res = []
    for b, (_, w, k_all) in enumerate(weights):
        wd = w.to(device=device, dtype=torch.float64)
        units = {blk.name: out[b][blk.name][: Ks[b]] for blk in blocks}
        row = {blk.name: torch.einsum("k,koi->oi", wd, out[b][blk.name].to(torch.float64)) for blk in blocks}
        lossd = losses[b].detach().to(torch.float64)
        row_loss = float((w.to(lossd.device) * lossd).sum())
        state = pooled[b] if pooled is not None else None
        res.append(RowUnitGrads(units, row, losses[b].detach()[: Ks[b]], row_loss, k_all, state))
    return res


def _accumulation_dtype(block: LoraBlock) -> torch.dtype:
    """float32 sums for a half-precision LoRA weight, its own dtype otherwise (as the hooks path)."""
    wdt = block.module.weight.dtype
    return torch.float32 if wdt in (torch.float16, torch.bfloat16) else wdt


def _split_by_position(
    seen: list[tuple[int, torch.Tensor, torch.Tensor]],
    blocks: Sequence[LoraBlock],
    weights: list[tuple[torch.Tensor, torch.Tensor, int]],
    losses: list[torch.Tensor],
    Ks: list[int],
) -> list[RowUnitGrads]:
    """``split="positions"`` of :func:`rows_unit_grads`: one backward of ``Σ_b ℓ_row,b`` over the captured outputs.

    Row b's loss is ``ℓ_row = Σ_k w_k ℓ_k`` (the row weights of :func:`loss_weights`, residual included), so
    ``G = ∂(Σ_b ℓ_row,b)/∂y`` (b, t, o) is each row's own ``∂ℓ_row/∂y`` (rows do not interact). Then
    ``g_row = G_bᵀ X_b`` and ``g̃_u = (1/w_u) Σ_{t∈P_u} G_{b,t} X_{b,t}ᵀ`` with ``P_u`` the unit's positions: the
    non-zero columns of its row of ``W`` (its labels shifted by one, within the row's supervised tokens); a row with
    one unit and no residual gets ``g_row`` as its unit.
    """
    device = blocks[0].module.weight.device
    row_losses = [(w.to(device=device, dtype=losses[b].dtype) * losses[b]).sum() for b, (_, w, _) in enumerate(weights)]
    Gs = torch.autograd.grad(torch.stack(row_losses).sum(), [y for _, _, y in seen], allow_unused=True)
    res = []
    for b, (W, w, k_all) in enumerate(weights):
        K = Ks[b]
        whole = K == 1 and k_all == 1  # the unit is all of S: its gradient is the row's
        where = [torch.nonzero(W[k]).squeeze(-1).to(device) for k in range(K)]  # P_u (Σ_u |P_u| ≤ T: one pass)
        inv_w = (1.0 / w[:K].clamp(min=1e-30)).tolist()
        # zeros for a block that did not run or that the loss does not reach, as the exact path; a block applied
        # more than once in the forward sums its applications, as there
        row = {blk.name: torch.zeros(blk.shape, dtype=torch.float64, device=device) for blk in blocks}
        units = {
            blk.name: torch.zeros((K, *blk.shape), dtype=_accumulation_dtype(blk), device=device) for blk in blocks
        }
        for (kb, X, _), G in zip(seen, Gs):
            if G is None:
                continue
            blk = blocks[kb]
            acc = _accumulation_dtype(blk)
            Gb, Xb = G[b].to(acc), X[b].to(acc)  # (T, o), (T, i)
            g_row = Gb.T @ Xb  # (o, i)
            row[blk.name] += g_row.to(torch.float64)
            if whole:
                units[blk.name][0] += g_row
            else:  # position t < T-1 predicts token t+1: g̃_u = (1/w_u) G[P_u]ᵀ X[P_u]
                units[blk.name] += torch.stack([(Gb[p].T @ Xb[p]) * iw for p, iw in zip(where, inv_w)])
        row_loss = float(row_losses[b].detach())
        res.append(RowUnitGrads(units, row, losses[b].detach()[:K], row_loss, 1))
    return res
