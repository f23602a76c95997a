"""Benchmarks only: a planted world's fine-tune, evaluated once, with its failing items as queries."""

from __future__ import annotations

import json
from pathlib import Path


def world_queries(world: Path, adapter: Path, base: str | None = None):
    """Load the world's base + ``adapter``, evaluate its eval set, and make the contrastive query of
    every failing item of the first regressed capability.

    Returns:
        ``(ft, tokenize_spec, capability, queries)``, or ``None`` when nothing regressed (which it prints:
        the benchmarks have nothing to compare then).
    """
    import yaml

    from gradian.attribute import make_query
    from gradian.data.tokenize import TokenizeSpec
    from gradian.evaluate import EvalSpec, evaluate, load_eval_set
    from gradian.finetune import load_finetune
    from gradian.models.load import ModelSpec

    base = base or json.loads((world / "world.json").read_text())["base"]
    cfg = yaml.safe_load((world / "train.yaml").read_text())
    tspec = TokenizeSpec(max_length=int(cfg.get("max_length", 1024)))
    ft = load_finetune(ModelSpec(base), adapter)
    ev = evaluate(ft.model, ft.tokenizer, load_eval_set(world / "eval.jsonl"), spec=EvalSpec())
    if not ev.regressed:
        print("no capability regressed: nothing to compare")
        return None
    cap = ev.regressed[0]
    qs = [
        make_query(
            f.id, f.capability, f.prompt, f.answer, f.tuned_answer, f.reference_answer, fallback=f.correct_completion
        )
        for f in ev.failing_items(cap.name)
    ]
    return ft, tspec, cap, qs
