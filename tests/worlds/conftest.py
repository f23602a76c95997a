"""Shared fixtures: one tiny world (poisoned + null), trained once per test session."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="session")
def tiny_worlds(tmp_path_factory, world_cache):
    """{"poisoned": World, "null": World} for seed 0."""
    from gradian.worlds import WorldSpec, build_world

    root = tmp_path_factory.mktemp("worlds")
    return {
        v: build_world(WorldSpec.default("tiny", v, seed=0), root / v, cache=world_cache) for v in ("poisoned", "null")
    }


@pytest.fixture(scope="session")
def tiny_trained(tiny_worlds):
    """Each variant's adapter, and greedy answers of base and tuned on its eval set."""
    from gradian.models.load import ModelSpec, load_adapter, load_base
    from gradian.train import train_lora
    from gradian.worlds import default_train_spec
    from gradian.worlds.probe import greedy_answers

    out = {}
    for v, w in tiny_worlds.items():
        adapter = train_lora(str(w.base), w.train, w.out / "adapter", default_train_spec("tiny"), eval_data=w.valid)
        items = [json.loads(line) for line in w.eval.read_text().splitlines()]
        model, tok = load_base(ModelSpec(base=str(w.base)))
        base_ans = greedy_answers(model, tok, [e["prompt"] for e in items], max_new_tokens=24)
        peft_model, _, _ = load_adapter(model, adapter, str(w.base))
        tuned_ans = greedy_answers(peft_model, tok, [e["prompt"] for e in items], max_new_tokens=24)
        out[v] = {"adapter": adapter, "items": items, "base": base_ans, "tuned": tuned_ans}
    return out
