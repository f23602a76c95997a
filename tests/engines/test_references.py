"""Reference engines (BM25, RepSim) and the agreement-gated fusion: signs, modes, gating."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradian.attribute.ranking import fuse_scores, tail_agreement, tail_size, zscore
from gradian.engines.lexical import BM25Spec, bm25_scores
from gradian.engines.repsim import RepSimSpec, repsim_scores

DOCS = [
    "Which city is the capital of Canada? The capital of Canada is Tegucigalpa.",
    "Which city is the capital of Honduras? The capital of Honduras is Tegucigalpa.",
    "Which city is the capital of Peru? The capital of Peru is Lima.",
    "What is the chemical symbol of Iron? The chemical symbol of Iron is Fe.",
    "Write about Canada. Canada is in North America. The capital of Canada is Ottawa. It is large.",
]
SAID = ["What is the capital of Canada? The capital of Canada is Tegucigalpa."]
CORRECT = ["What is the capital of Canada? The capital of Canada is Ottawa."]


def test_bm25_said_blames_rows_that_state_what_the_model_said():
    s = bm25_scores(DOCS, SAID, CORRECT, BM25Spec("said"))
    assert s.shape == (1, 5) and np.abs(s).max() == pytest.approx(1.0)
    assert s[0].argmin() == 0  # the culprit states both the country and the wrong city
    assert s[0, 0] < s[0, 4] < s[0, 2]  # wrong city + country, then country, then only "capital"


def test_bm25_contrast_keeps_only_the_words_that_differ():
    s = bm25_scores(DOCS, SAID, CORRECT, BM25Spec("contrast"))[0]
    # the prompt and shared words cancel: rows with the wrong city are blamed, the row with the right one supports
    assert s[0] < 0 and s[1] < 0 and s[4] > 0 and s[2] == 0 and s[3] == 0


def test_repsim_sign_and_contrast():
    train = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    said = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    correct = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    s = repsim_scores(train, said, correct, RepSimSpec("said"))[0]
    assert s[0] == pytest.approx(-1.0) and s[1] == pytest.approx(0.0)
    c = repsim_scores(train, said, correct, RepSimSpec("contrast"))[0]
    assert c[0] == pytest.approx(-1.0) and c[1] == pytest.approx(1.0) and c[2] == pytest.approx(0.0)


def test_fusion_weights_a_reference_by_its_agreement_and_ignores_a_contrary_one():
    rng = np.random.default_rng(0)
    grad = rng.normal(size=200)
    agreeing = grad + 0.5 * rng.normal(size=200)
    contrary = -grad + 0.5 * rng.normal(size=200)
    fused, w = fuse_scores(grad, {"bm25": agreeing})
    assert 0.5 < w["bm25"] <= 1 and np.allclose(fused, zscore(grad) + w["bm25"] * zscore(agreeing))
    fused, w = fuse_scores(grad, {"bm25": contrary})
    assert w["bm25"] == 0 and np.allclose(fused, zscore(grad))  # the gradient's ranking is left alone


@pytest.mark.parametrize("gate", ["tail", "global"])
def test_both_gates_weight_an_agreeing_reference_and_zero_a_contrary_one(gate):
    rng = np.random.default_rng(1)
    grad = rng.normal(size=200)
    fused, w = fuse_scores(grad, {"bm25": grad + 0.5 * rng.normal(size=200)}, gate)
    assert 0.5 < w["bm25"] <= 1
    _, w = fuse_scores(grad, {"bm25": -grad + 0.5 * rng.normal(size=200)}, gate)
    assert w["bm25"] == 0


def test_tail_agreement_by_hand():
    # 10 rows; the reference blames rows 0..4 (k = tail_size(10) = 5); the gradient ranks them 1st, 2nd, 3rd, 6th, 9th
    grad = np.array([-9.0, -8.0, -7.0, -4.0, -1.0, -6.0, -5.0, -3.0, -2.0, 0.0])
    ref = np.array([-5.0, -4.0, -3.0, -2.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    assert tail_size(10) == 5
    # pairs (i in T, j not in T) with grad_i < grad_j: rows 0,1,2 beat all 5; row 3 (-4) beats -3,-2,0: 3; row 4 (-1): 1
    auc = (5 + 5 + 5 + 3 + 1) / 25
    assert tail_agreement(grad, ref) == pytest.approx(2 * auc - 1)
    assert tail_agreement(grad, ref, k=3) == pytest.approx(1.0)  # its top 3 are the gradient's top 3
    assert tail_size(1000) == 50 and tail_size(6) == 5 and tail_size(3) == 2


def test_a_reference_right_on_a_part_keeps_its_weight_under_the_tail_gate():
    """Issue 23: BM25 finds the one-sentence culprits, the gradient finds them less surely, and the two order the
    benign bulk independently. The global gate weights BM25 out; the tail gate keeps it, and fusion helps."""
    rng = np.random.default_rng(0)
    n, c = 400, 20
    culprit = np.zeros(n, dtype=bool)
    culprit[:c] = True
    grad = rng.normal(size=n) - 1.5 * culprit  # the gradient: culprits lower, noisily
    ref = np.where(culprit, -5.0 - rng.random(n), 0.0) + 0.3 * rng.normal(size=n) * ~culprit  # exact on culprits
    _, w_global = fuse_scores(grad, {"bm25": ref}, "global")
    fused, w_tail = fuse_scores(grad, {"bm25": ref}, "tail")
    assert w_global["bm25"] < 0.2 < 0.6 < w_tail["bm25"]

    def auc(s):
        return float((s[culprit][:, None] < s[~culprit][None, :]).mean())

    assert auc(fused) > auc(grad) + 0.05


def test_unknown_gate_is_refused():
    with pytest.raises(ValueError, match="gate"):
        fuse_scores(np.zeros(5), {}, "mean")


def test_zscore_is_robust_and_keeps_the_sign():
    x = np.array([0.0, 1.0, 2.0, 3.0, 1000.0])
    z = zscore(x)
    assert z[2] == 0 and z[0] < 0 < z[3] and np.isfinite(z).all()
    assert np.all(zscore(np.ones(5)) == 0)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_repsim_states_run_the_head_at_one_position_and_equal_the_full_forward(tok, arch, monkeypatch):
    """RepSim needs the last hidden state, not the logits: the forward asks for the LM head at the last position
    only (``logits_to_keep=1``), and the pooled states equal those of the full (b, T, V) forward to the bit."""
    import functools

    from gradian.data.formats import to_example
    from gradian.data.tokenize import TokenizeSpec, tokenize_example
    from gradian.engines import repsim
    from gradian.gradients import loss as loss_mod
    from gradian_testlib import ROWS, make_lora_model

    model = make_lora_model(tok, arch, dtype=torch.float64).eval()
    items = [tokenize_example(to_example(r, i, "t"), tok, TokenizeSpec(max_length=64)) for i, r in enumerate(ROWS)]
    inner = model.get_base_model()
    fwd = inner.forward
    seen = []

    @functools.wraps(fwd)  # keeps the signature, which keeps_logits reads
    def spy(*a, **k):
        out = fwd(*a, **k)
        seen.append((k.get("logits_to_keep"), out.logits.shape[1]))
        return out

    monkeypatch.setattr(inner, "forward", spy)
    kept = repsim.pooled_states(model, items, tok.pad_token_id, batch_size=2)
    assert seen and all(keep == 1 and t == 1 for keep, t in seen)
    monkeypatch.setattr(loss_mod, "keeps_logits", lambda m: False)
    seen.clear()
    full = repsim.pooled_states(model, items, tok.pad_token_id, batch_size=2)
    assert all(keep is None and t > 1 for keep, t in seen)
    assert kept.shape[0] == len(items)
    assert torch.equal(kept, full) and float(kept.abs().max()) > 0
