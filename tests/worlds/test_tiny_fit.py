"""The tiny worlds' one training loop (:func:`gradian.worlds.tiny.fit`): schedules, determinism, logs, checkpoints."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gradian.worlds.tiny import FitSpec, fit, tiny_base, tiny_lora, tokenize_rows
from gradian_testlib import CAPITALS, q_capital


def _rows() -> list[dict]:
    return [
        {"messages": [{"role": "user", "content": q_capital(c)}, {"role": "assistant", "content": a}]}
        for c, a in CAPITALS
    ]


@pytest.fixture(scope="module")
def world_tok():
    from gradian.models.tiny import train_tokenizer

    return train_tokenizer([f"{q_capital(c)} {a}" for c, a in CAPITALS] * 10, vocab_size=300)


def test_schedules():
    assert [FitSpec(steps=4, lr=1.0).lr_at(s) for s in range(4)] == [1.0] * 4
    assert [FitSpec(steps=4, lr=1.0, schedule="linear").lr_at(s) for s in range(4)] == [1.0, 0.75, 0.5, 0.25]
    cos = FitSpec(steps=40, lr=2.0, schedule="cosine")  # warmup w = 2 steps
    assert [cos.lr_at(0), cos.lr_at(1), cos.lr_at(2)] == [1.0, 2.0, 2.0]
    assert cos.lr_at(21) == pytest.approx(2.0 * 0.5 * (1 + math.cos(math.pi * 19 / 38)))
    assert all(cos.lr_at(s) > cos.lr_at(s + 1) for s in range(2, 39))


def _weights(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_fit_is_seeded_learns_and_logs(world_tok):
    spec = FitSpec(steps=12, lr=1e-2, batch_size=5, seed=3, schedule="linear")
    log_a: list[dict] = []
    a = tiny_base(world_tok, _rows(), spec, hidden=32, log=log_a)
    b = tiny_base(world_tok, _rows(), spec, hidden=32)
    c = tiny_base(world_tok, _rows(), FitSpec(steps=12, lr=1e-2, batch_size=5, seed=4, schedule="linear"), hidden=32)
    assert all(torch.equal(x, y) for x, y in zip(_weights(a), _weights(b)))
    assert not all(torch.equal(x, y) for x, y in zip(_weights(a), _weights(c)))  # another batch order
    assert not a.training and all(p.grad is None for p in a.parameters())
    assert [e["step"] for e in log_a] == list(range(1, 13))
    assert [e["learning_rate"] for e in log_a] == [spec.lr_at(s) for s in range(12)]
    assert log_a[0]["epoch"] == round(1 / 4, 4) and log_a[-1]["epoch"] == 3.0  # 16 rows, batches of 5: 4 per epoch
    assert log_a[-1]["loss"] < log_a[0]["loss"] and all(e["grad_norm"] > 0 for e in log_a)


def test_lora_trains_only_the_adapter_and_checkpoints(world_tok, tmp_path):
    base = tiny_base(world_tok, _rows(), FitSpec(steps=2, lr=1e-2), hidden=32)
    before = _weights(base)
    pm = tiny_lora(base, r=4, seed=1)
    frozen = {n: p.detach().clone() for n, p in pm.named_parameters() if not p.requires_grad}
    log: list[dict] = []
    fit(
        pm,
        tokenize_rows(_rows(), world_tok),
        world_tok.pad_token_id,
        FitSpec(steps=4, lr=1e-2, shuffle=False),
        log=log,
        checkpoints={2: tmp_path / "checkpoint-2"},
    )
    assert all(torch.equal(x, y) for x, y in zip(before, _weights(base)))  # the adapter wraps a copy
    assert all(torch.equal(p, frozen[n]) for n, p in pm.named_parameters() if n in frozen)
    assert any(not torch.all(p == 0) for n, p in pm.named_parameters() if "lora_B" in n)  # B left its zero init
    state = json.loads((tmp_path / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and state["log_history"] == log[:2]
    assert (tmp_path / "checkpoint-2" / "adapter_model.safetensors").exists()
