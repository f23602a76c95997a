"""The three per-example gradient paths agree, and sum to the batch gradient."""

from __future__ import annotations

import pytest
import torch

from gradian import per_example_grads
from gradian.data.formats import to_example
from gradian.data.tokenize import TokenizeSpec, collate, tokenize_example
from gradian.gradients import lora_blocks, per_example_loss
from gradian_testlib import ROWS, make_lora_model


def _batch(tok, side, rows=ROWS):
    exs = [to_example(r, i, "t") for i, r in enumerate(rows)]
    items = [tokenize_example(e, tok, TokenizeSpec(max_length=64)) for e in exs]
    assert len({len(it.input_ids) for it in items}) > 1, "the batch must mix lengths"
    return collate(items, tok.pad_token_id, side)


def _rel_maxdiff(a: dict, b: dict) -> float:
    scale = max(v.abs().max().item() for v in b.values())
    assert scale > 0
    return max((a[k] - b[k]).abs().max().item() for k in b) / scale


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)], ids=["f64", "f32"])
@pytest.mark.parametrize("r", [1, 8])
@pytest.mark.parametrize("side", ["right", "left"])
def test_hooks_loop_vmap_agree(tok, arch, dtype, tol, r, side):
    model = make_lora_model(tok, arch, r=r, dtype=dtype, rslora=(r == 8))
    batch = _batch(tok, side)
    loop = per_example_grads(model, batch, "loop")
    hooks = per_example_grads(model, batch, "hooks")
    vmap = per_example_grads(model, batch, "vmap")
    names = [b.name for b in lora_blocks(model)]
    assert set(loop) == set(hooks) == set(vmap) == set(names)
    # LoRA on attention and MLP, A and B matrices
    assert any("mlp" in n for n in names) and any("attn" in n for n in names)
    assert any(".lora_A." in n for n in names) and any(".lora_B." in n for n in names)
    for n, g in hooks.items():
        p = dict(model.named_parameters())[n]
        assert g.shape == (batch["input_ids"].shape[0], *p.shape)
    assert _rel_maxdiff(hooks, loop) <= tol
    assert _rel_maxdiff(vmap, loop) <= tol


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_sum_of_per_example_equals_batch_gradient(tok, arch):
    model = make_lora_model(tok, arch, dtype=torch.float64)
    batch = _batch(tok, "right")
    grads = per_example_grads(model, batch, "hooks")
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
    ).logits
    total = per_example_loss(logits, batch["labels"]).sum()
    full = torch.autograd.grad(total, list(params.values()))
    for (n, _), g in zip(params.items(), full):
        torch.testing.assert_close(grads[n].sum(0), g, rtol=1e-10, atol=1e-12)


def test_padding_side_does_not_change_gradients(tok):
    model = make_lora_model(tok, "llama", dtype=torch.float64)
    right = per_example_grads(model, _batch(tok, "right"))
    left = per_example_grads(model, _batch(tok, "left"))
    assert _rel_maxdiff(left, right) <= 1e-10


def test_rslora_scaling_enters_gradients(tok):
    """With rsLoRA the scale is alpha/sqrt(r), not alpha/r: lora_B gradients scale with it."""
    plain = make_lora_model(tok, "llama", r=4, dtype=torch.float64, rslora=False, seed=3)
    rs = make_lora_model(tok, "llama", r=4, dtype=torch.float64, rslora=True, seed=3)
    layer = next(m for m in rs.modules() if hasattr(m, "lora_A") and isinstance(getattr(m, "scaling", None), dict))
    assert layer.scaling["default"] == pytest.approx(8 / 4**0.5)
    # Make both models compute the same function: scale rsLoRA's B down by the ratio of scalings.
    ratio = (8 / 4) / (8 / 4**0.5)
    with torch.no_grad():
        for (n, p), (_, q) in zip(plain.named_parameters(), rs.named_parameters()):
            if ".lora_B." in n:
                q.copy_(p * ratio)
            else:
                q.copy_(p)
    batch = _batch(tok, "right")
    gp = per_example_grads(plain, batch)
    gr = per_example_grads(rs, batch)
    for n in gp:
        if ".lora_A." in n:  # same function, same A: identical gradients
            torch.testing.assert_close(gr[n], gp[n], rtol=1e-9, atol=1e-12)
        else:  # dL/dB scales with the scaling factor
            torch.testing.assert_close(gr[n] * ratio, gp[n], rtol=1e-9, atol=1e-12)


def test_example_without_supervised_tokens_has_zero_gradient(tok):
    from gradian.data.tokenize import TokenizedExample

    model = make_lora_model(tok, "llama", dtype=torch.float64)
    ex = to_example(ROWS[0], 0, "t")
    it = tokenize_example(ex, tok, TokenizeSpec(max_length=64))
    masked = TokenizedExample(**{**it.__dict__, "labels": [-100] * len(it.labels)})
    grads = per_example_grads(model, collate([it, masked], tok.pad_token_id))
    for g in grads.values():
        assert g[1].abs().max().item() == 0.0
        assert g[0].abs().max().item() > 0.0


def test_unknown_method_is_refused(tok):
    model = make_lora_model(tok, "llama")
    with pytest.raises(ValueError, match="method"):
        per_example_grads(model, _batch(tok, "right"), "bogus")


@pytest.mark.parametrize("dora", [False, True], ids=["lora", "dora"])
def test_bfloat16_model_sums_per_example_gradients_in_float32(tok, dora):
    """The --dtype bfloat16 path (meant for GPUs; bfloat16 runs on CPU too): the hook path returns
    float32 per-example gradients, within bfloat16 noise of the batch-size-1 loop and of the same
    adapter in float32 (a DoRA adapter's magnitude blocks too)."""
    f32 = make_lora_model(tok, "llama", r=8, dtype=torch.float32, dora=dora)
    bf16 = make_lora_model(tok, "llama", r=8, dtype=torch.bfloat16, dora=dora)
    batch = _batch(tok, "right")
    hooks = per_example_grads(bf16, batch, "hooks")
    loop = per_example_grads(bf16, batch, "loop")
    ref = per_example_grads(f32, batch, "hooks")
    assert all(v.dtype == torch.float32 for v in hooks.values())
    # measured: 0.007 against the loop, 0.028 against float32 (the bfloat16 loop itself: 0.035); DoRA 0.004 / 0.013
    assert _rel_maxdiff(hooks, {k: v.float() for k, v in loop.items()}) <= 2e-2
    assert _rel_maxdiff(hooks, ref) <= 4e-2
    mags = [n for n in hooks if ".lora_magnitude_vector." in n]
    assert bool(mags) == dora  # each magnitude block against its own scale: 0.004-0.014 from the bfloat16 loop
    assert all(_rel_maxdiff({n: hooks[n]}, {n: loop[n].float().view(hooks[n].shape)}) <= 2e-2 for n in mags)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_the_lm_head_runs_only_at_the_supervised_positions_and_nothing_changes(tok, arch, monkeypatch):
    """The hooks path asks the model for the logits at the supervised positions only (``logits_to_keep``):
    same gradients and losses as the full logits, to float64 rounding; a batch with nothing supervised
    still gives zero gradients (it falls back to the full logits).
    """
    import functools

    import gradian.gradients.loss as loss_mod

    model = make_lora_model(tok, arch, dtype=torch.float64)
    batch = _batch(tok, "right", ROWS[:3])  # prompts off the loss (the text row has every token on it)
    seen = []
    inner = model.get_base_model()
    fwd = inner.forward

    @functools.wraps(fwd)  # keeps the signature, which keeps_logits reads
    def spy(*a, **k):
        seen.append(k.get("logits_to_keep"))
        return fwd(*a, **k)

    monkeypatch.setattr(inner, "forward", spy)
    kept, kept_loss = per_example_grads(model, batch, "hooks", return_losses=True)
    keep = seen[-1]
    sup = (batch["labels"][:, 1:] != -100).any(0)
    assert keep is not None and torch.equal(keep, sup.nonzero()[:, 0]) and len(keep) < batch["labels"].shape[1] - 1
    monkeypatch.setattr(loss_mod, "keeps_logits", lambda m: False)
    full, full_loss = per_example_grads(model, batch, "hooks", return_losses=True)
    assert seen[-1] is None
    assert _rel_maxdiff(kept, full) <= 1e-12 and torch.allclose(kept_loss, full_loss, rtol=1e-12, atol=0)
    monkeypatch.undo()
    none = dict(batch, labels=torch.full_like(batch["labels"], -100))
    zero = per_example_grads(model, none, "hooks")
    assert all(float(v.abs().max()) == 0.0 for v in zero.values())


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_dora_hooks_loop_vmap_agree_and_sum_to_peft_s_batch_gradient(tok, arch, side):
    """DoRA: PEFT's layer output is linear in the magnitude m, ``∂y_t/∂m = (W x_t + s·B A x_t)/n``, so the hooks
    path's magnitude block is ``Σ_t G_t ⊙ v_t``; A and B keep the plain einsum (n is detached in PEFT's forward).
    Every trainable parameter of PEFT's DoRA model is a block, the three paths agree, and the blocks summed over
    the batch equal autograd's gradient of PEFT's own forward for every trainable parameter.
    """
    model = make_lora_model(tok, arch, r=4, dtype=torch.float64, dora=True)
    batch = _batch(tok, side)
    blocks = lora_blocks(model)
    mags = [b for b in blocks if b.kind == "M"]
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert mags and {b.name for b in blocks} == set(trainable)
    hooks = per_example_grads(model, batch, "hooks")
    loop = per_example_grads(model, batch, "loop")
    vmap = per_example_grads(model, batch, "vmap")
    for b in mags:
        assert hooks[b.name].shape == (batch["input_ids"].shape[0], trainable[b.name].shape[0], 1)
    assert _rel_maxdiff(hooks, loop) <= 1e-10
    assert _rel_maxdiff(vmap, loop) <= 1e-10
    mag_scale = max(float(hooks[b.name].abs().max()) for b in mags)
    assert mag_scale > 1e-3  # the magnitude blocks are not zero: the comparison above tests them
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
    ).logits
    full = torch.autograd.grad(per_example_loss(logits, batch["labels"]).sum(), list(trainable.values()))
    for (n, p), g in zip(trainable.items(), full):
        torch.testing.assert_close(hooks[n].sum(0).view(p.shape), g, rtol=1e-10, atol=1e-12)


def test_dora_at_its_starting_magnitudes_is_plain_lora_and_not_after(tok):
    """With m = n (the weight norms PEFT starts the magnitudes at) a DoRA layer computes what plain LoRA with the same
    A and B computes, and its A/B blocks equal plain LoRA's; once m moves off n (training does) B's output is scaled
    by m/n and the blocks differ, so a DoRA adapter read as plain LoRA would give other gradients.
    """
    plain = make_lora_model(tok, "llama", r=4, dtype=torch.float64, seed=5)
    dora = make_lora_model(tok, "llama", r=4, dtype=torch.float64, seed=5, dora=True)
    pp = dict(plain.named_parameters())
    with torch.no_grad():
        for n, p in dora.named_parameters():
            if n in pp:
                p.copy_(pp[n])
        for layer in dora.modules():
            mag = getattr(layer, "lora_magnitude_vector", None)
            if mag and "default" in mag:
                W, A, B = layer.base_layer.weight, layer.lora_A["default"].weight, layer.lora_B["default"].weight
                mag["default"].weight.copy_(torch.linalg.norm(W + layer.scaling["default"] * (B @ A), dim=1))
    batch = _batch(tok, "right")
    gp, gd = per_example_grads(plain, batch), per_example_grads(dora, batch)
    assert _rel_maxdiff({n: gd[n] for n in gp}, gp) <= 1e-10
    with torch.no_grad():
        for n, p in dora.named_parameters():
            if ".lora_magnitude_vector." in n:
                p.mul_(1.3)
    moved = per_example_grads(dora, batch)
    assert _rel_maxdiff({n: moved[n] for n in gp if ".lora_B." in n}, {n: gp[n] for n in gp if ".lora_B." in n}) > 1e-2
