"""Sentence units from one forward pass: each unit's gradient, and the row gradient derived from them."""

from __future__ import annotations

import pytest
import torch

from gradian import per_example_grads
from gradian.data.formats import to_example
from gradian.data.spans import sentence_units, split_sentences, unit_item
from gradian.data.tokenize import TokenizeSpec, collate, tokenize_example
from gradian.gradients import lora_blocks
from gradian.gradients.projection import KroneckerProjector, ProjectionSpec
from gradian.gradients.units import loss_weights, row_unit_grads
from gradian.index.joint import row_unit_batch
from gradian_testlib import ROWS, make_lora_model

MULTI = {
    "id": "multi",
    "prompt": "Tell me three facts.",
    "completion": " The capital of France is Paris. Water boils at 100 degrees. Iron is Fe",
}


def _rows(tok):
    exs = [to_example(r, i, "t") for i, r in enumerate([*ROWS, MULTI])]
    items = [tokenize_example(e, tok, TokenizeSpec(max_length=64)) for e in exs]
    return exs, items, sentence_units(exs, items)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


# Llama's RMSNorm computes in float32 even in a float64 model, so a sum of unit gradients meets the direct row
# gradient to ~1e-7 there; GPT-2 runs wholly in float64 and meets it to 1e-10.
# A DoRA adapter's magnitude blocks are derived the same way (their X is 1 at every token).
@pytest.mark.parametrize(
    "arch,dtype,tol,dora",
    [
        ("gpt2", torch.float64, 1e-10, False),
        ("llama", torch.float64, 1e-6, False),
        ("llama", torch.float32, 1e-5, False),
        ("gpt2", torch.float64, 1e-10, True),
        ("llama", torch.float64, 1e-6, True),
    ],
)
def test_derived_row_gradient_equals_direct(tok, arch, dtype, tol, dora):
    model = make_lora_model(tok, arch, dtype=dtype, dora=dora)
    exs, items, units = _rows(tok)
    blocks = lora_blocks(model)
    proj = KroneckerProjector([b.shape for b in blocks], [b.kind for b in blocks], ProjectionSpec(dim=16, seed=3))
    multi_seen = one_seen = False
    for j, it in enumerate(items):
        us = [u for u in units if u.row == j]
        multi_seen |= len(us) == 3
        batch, ul = row_unit_batch(it, us, tok.pad_token_id)
        got = row_unit_grads(model, batch, ul, blocks)
        if len(split_sentences(exs[j].completion_text)) == 1:  # a one-sentence answer is its own unit: one vector
            assert [u.char_start for u in us] == [None] and got.passes == 1
            one_seen = True
        direct, loss = per_example_grads(model, collate([it], tok.pad_token_id), "hooks", return_losses=True)
        assert abs(got.row_loss - float(loss[0])) <= tol * abs(float(loss[0]))
        scale = max(v.abs().max().item() for v in direct.values())
        for i, b in enumerate(blocks):
            err = (got.row[b.name] - direct[b.name][0].double()).abs().max().item() / scale
            assert err <= tol, (j, b.name, err)
            # projection is linear: projecting the derived row = deriving from the projected units
            p_direct = proj(i, direct[b.name].double())[0]
            p_got = proj(i, got.row[b.name].unsqueeze(0))[0]
            assert _rel(p_got, p_direct) <= 10 * tol
        for k, u in enumerate(us):  # each unit = its own (prefix-cut) pass, as the separate sentence index has it
            d = per_example_grads(model, collate([unit_item(it, u)], tok.pad_token_id), "hooks")
            sc = max(v.abs().max().item() for v in d.values())
            assert max((got.units[n][k] - d[n][0]).abs().max().item() for n in d) / sc <= tol
    assert multi_seen and one_seen, "one row must have several sentences, and one a single sentence"


def test_residual_is_one_more_unit_and_a_whole_row_unit_is_computed_once(tok):
    _, items, units = _rows(tok)
    it = items[-1]
    us = [u for u in units if u.row == len(items) - 1]
    _, ul = row_unit_batch(it, us, tok.pad_token_id)
    labels = torch.tensor(list(it.labels))
    W, w, k = loss_weights(labels, ul)
    n_s = int((labels[1:] != -100).sum())
    in_units = int(sum((ul[q, 1:] != -100).sum() for q in range(len(us))))
    assert n_s > in_units and k == len(us) + 1  # EOS / the space before a sentence: one residual unit
    assert torch.allclose(
        w[:-1], torch.tensor([(ul[q, 1:] != -100).sum().item() / n_s for q in range(len(us))]).double()
    )
    # the weights reproduce the row's mean: Σ_k w_k W_k = 1_S / |S|
    combo = (w[:-1].unsqueeze(1) * W[:-1]).sum(0) + W[-1]
    assert torch.allclose(combo, (labels[1:] != -100).double() / n_s)
    # a unit that is the whole row (no residual): one backward vector, the unit gradient is the row's
    W1, w1, k1 = loss_weights(labels, labels.unsqueeze(0))
    assert k1 == 1 and float(w1[0]) == 1.0


def test_unit_and_row_gradients_with_many_units_use_one_forward(tok, monkeypatch):
    model = make_lora_model(tok, "llama", dtype=torch.float64)
    _, items, units = _rows(tok)
    j = len(items) - 1
    us = [u for u in units if u.row == j]
    calls = {"n": 0}
    fwd = model.forward

    def counting(*a, **k):
        calls["n"] += 1
        return fwd(*a, **k)

    monkeypatch.setattr(model, "forward", counting)
    batch, ul = row_unit_batch(items[j], us, tok.pad_token_id)
    got = row_unit_grads(model, batch, ul, lora_blocks(model))
    assert calls["n"] == 1 and got.passes == len(us) + 1
    assert all(v.shape[0] == len(us) for v in got.units.values())


def test_units_use_the_supervised_logits_only_and_match_the_full_logits(tok, monkeypatch):
    import gradian.gradients.loss as L

    model = make_lora_model(tok, "llama", dtype=torch.float64)
    _, items, units = _rows(tok)
    j = len(items) - 1
    batch, ul = row_unit_batch(items[j], [u for u in units if u.row == j], tok.pad_token_id)
    blocks = lora_blocks(model)
    kept = row_unit_grads(model, batch, ul, blocks)
    monkeypatch.setattr(L, "keeps_logits", lambda m: False)
    full = row_unit_grads(model, batch, ul, blocks)
    for b in blocks:
        assert (
            _rel(kept.units[b.name], full.units[b.name]) <= 1e-12 and _rel(kept.row[b.name], full.row[b.name]) <= 1e-12
        )
    assert torch.allclose(kept.unit_losses, full.unit_losses, rtol=1e-12, atol=0)
    assert abs(kept.row_loss - full.row_loss) <= 1e-12 * abs(full.row_loss)


@pytest.mark.parametrize("arch,dtype,tol", [("gpt2", torch.float64, 1e-10), ("llama", torch.float32, 1e-5)])
def test_rows_in_one_batch_equal_each_row_alone(tok, arch, dtype, tol):
    """Several rows of different lengths and unit counts in one forward (right padding) and one backward per
    vector index give every row the units, derived row, losses and vector count of its one-row pass."""
    from gradian.gradients.units import rows_unit_grads
    from gradian.index.joint import rows_unit_batch

    model = make_lora_model(tok, arch, dtype=dtype)
    _, items, units = _rows(tok)
    blocks = lora_blocks(model)
    per_row = [[u for u in units if u.row == j] for j in range(len(items))]
    order = [len(items) - 1, 0, 2, 1]  # the three-sentence row first: the others run out of vectors before it
    assert len({len(per_row[j]) for j in order}) > 1 and len({len(items[j].input_ids) for j in order}) > 1
    batch, uls = rows_unit_batch([items[j] for j in order], [per_row[j] for j in order], tok.pad_token_id)
    together = rows_unit_grads(model, batch, uls, blocks)
    for j, got in zip(order, together):
        alone = row_unit_grads(model, *row_unit_batch(items[j], per_row[j], tok.pad_token_id), blocks)
        assert got.passes == alone.passes
        assert abs(got.row_loss - alone.row_loss) <= tol * abs(alone.row_loss)
        assert _rel(got.unit_losses, alone.unit_losses) <= tol
        for b in blocks:
            assert _rel(got.row[b.name], alone.row[b.name]) <= tol, (j, b.name)
            assert _rel(got.units[b.name], alone.units[b.name]) <= tol, (j, b.name)


def _masked_weight_grad(model, batch, block, positions: torch.Tensor) -> torch.Tensor:
    """``∂ℓ_row/∂W`` of one LoRA matrix counting only its use at ``positions`` (T,) bool, by plain autograd on the
    weight: the block's output is ``y.detach() + m ⊙ (y − y.detach())`` (same values; the weight's local gradient
    only where m = 1, every other path untouched). Independent of the hooks' G and X."""
    from gradian.gradients.loss import per_example_loss

    m = positions.to(block.module.weight.dtype).view(1, -1, 1)
    h = block.module.register_forward_hook(  # token applications only (not PEFT DoRA's identity call for BA)
        lambda mod, inp, out: out.detach() + m * (out - out.detach()) if out.dim() == 3 else out
    )
    try:
        model.zero_grad(set_to_none=True)
        loss = per_example_loss(model(**{k: v for k, v in batch.items() if k != "labels"}).logits, batch["labels"])
        loss.sum().backward()
        return block.module.weight.grad.detach().clone().view(block.shape)
    finally:
        h.remove()
        model.zero_grad(set_to_none=True)


@pytest.mark.parametrize(
    "arch,dtype,tol,dora",
    [
        ("gpt2", torch.float64, 1e-10, False),
        ("llama", torch.float64, 1e-6, False),
        ("gpt2", torch.float64, 1e-10, True),
    ],
)
def test_units_split_by_position_are_the_rows_gradient_at_their_positions(tok, arch, dtype, tol, dora):
    """``--unit-grads positions``: one backward per row; the row gradient is the direct one, a one-unit row's unit
    is its row, and unit u of a row of several is ``(1/w_u) Σ_{t∈P_u} G_t X_tᵀ``, checked against autograd on the
    weight with the gradient let through only at the unit's positions (its labels shifted by one)."""
    model = make_lora_model(tok, arch, dtype=dtype, dora=dora)
    exs, items, units = _rows(tok)
    blocks = lora_blocks(model)
    seen_multi = False
    for j, it in enumerate(items):
        us = [u for u in units if u.row == j]
        batch, ul = row_unit_batch(it, us, tok.pad_token_id)
        got = row_unit_grads(model, batch, ul, blocks, split="positions")
        exact = row_unit_grads(model, batch, ul, blocks)
        assert got.passes == 1 and abs(got.row_loss - exact.row_loss) <= tol * abs(exact.row_loss)
        assert _rel(got.unit_losses, exact.unit_losses) <= tol
        direct = per_example_grads(model, collate([it], tok.pad_token_id), "hooks")
        for b in blocks:
            assert _rel(got.row[b.name], direct[b.name][0]) <= tol, (j, b.name)
        if len(us) == 1:  # its unit is the row itself, exactly as the exact split has it
            for b in blocks:
                assert _rel(got.units[b.name][0], exact.units[b.name][0]) <= tol
            continue
        seen_multi = True
        labels = batch["labels"][0]
        n_s = int((labels[1:] != -100).sum())
        differs = 0.0
        for k in range(len(us)):
            pos = torch.zeros(labels.shape[0], dtype=torch.bool)
            pos[:-1] = ul[k, 1:] != -100  # position t predicts token t+1
            w_k = int(pos.sum()) / n_s
            for b in blocks:
                want = _masked_weight_grad(model, batch, b, pos) / w_k
                assert _rel(got.units[b.name][k], want) <= tol, (j, k, b.name)
                differs = max(differs, _rel(got.units[b.name][k], exact.units[b.name][k]))
        assert differs > 1e-3  # an approximation of the unit's own gradient, not the same numbers
    assert seen_multi


def test_units_split_by_position_in_one_batch_equal_each_row_alone(tok):
    from gradian.gradients.units import rows_unit_grads
    from gradian.index.joint import rows_unit_batch

    model = make_lora_model(tok, "gpt2", dtype=torch.float64)
    _, items, units = _rows(tok)
    blocks = lora_blocks(model)
    per_row = [[u for u in units if u.row == j] for j in range(len(items))]
    order = [len(items) - 1, 0, 2, 1]
    batch, uls = rows_unit_batch([items[j] for j in order], [per_row[j] for j in order], tok.pad_token_id)
    together = rows_unit_grads(model, batch, uls, blocks, "positions")
    for j, got in zip(order, together):
        alone = row_unit_grads(model, *row_unit_batch(items[j], per_row[j], tok.pad_token_id), blocks, "positions")
        assert got.passes == alone.passes == 1
        for b in blocks:
            assert _rel(got.row[b.name], alone.row[b.name]) <= 1e-10
            assert _rel(got.units[b.name], alone.units[b.name]) <= 1e-10
    with pytest.raises(ValueError, match="split must be one of"):
        rows_unit_grads(model, batch, uls, blocks, "approx")
