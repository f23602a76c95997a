"""Probe, not a feature (issue 23): would a rival chosen by its *pull* find the culprits of items that still pass?

On the SmolLM2 held-out world most planted culprits target eval items the tuned model still passes, so no
default query asks about them. ``--weakened`` queries kept items whose correct answer lost log-probability,
against the tuned model's most probable wrong substitution (:mod:`gradian.attribute.rival`); on the tiny family
that rival was often not the planted answer. This probe asks whether choosing, among the same candidates, the
one the fine-tune moved toward most, relative to the correct answer,

    pull(r) = [log p_tuned(r) − log p_ref(r)] − [log p_tuned(c) − log p_ref(c)]      (nats; c: the kept answer)

names the planted wrong answer on culprit-targeted items and stays low on the others. It reads a run of
``gradian attribute`` (its ``run.json``: kept items, their shifts, the base and adapter) and the world's
``ground_truth.json`` (each target's planted ``wrong`` answer); the reference is the base (adapter disabled).
Candidates are :func:`gradian.attribute.rival.rival_candidates`, the rival's own: the tuned model's 5 most
probable other tokens at the answer's first token, each continued greedily, kept when the metric judges them
wrong and they are a substitution of the tuned answer.

    python benchmarks/bench_rival_pull.py RUN WORLD

Prints a line per kept item (targeted or not: its planted answer, whether it is among the candidates, whether
the first candidate or the argmax-pull one is it, the largest pull and its text) and the count.
"""

from __future__ import annotations

import json
import math
import sys

import torch


def main() -> None:
    from gradian.attribute.rival import rival_candidates
    from gradian.evaluate.items import as_example
    from gradian.evaluate.result import EvalResult
    from gradian.evaluate.run import _scores
    from gradian.finetune import load_finetune
    from gradian.models.spec import ModelSpec

    run_dir, world = sys.argv[1], sys.argv[2]
    run = json.load(open(f"{run_dir}/run.json"))
    gt = json.load(open(f"{world}/ground_truth.json"))
    planted = {t["eval_id"]: t["wrong"] for t in gt["targets"]}
    paths = run["manifest"]["paths"]
    ft = load_finetune(ModelSpec(paths["base"]), paths["adapter"])
    model, tok = ft.model, ft.tokenizer
    model.eval()
    ev = EvalResult.from_dict(run["evaluation"])
    # every kept item with a shift, as the weakened items of an infinitely lax --weakened
    kept = [f for f in ev.failing_items(weakened_nats=-math.inf) if f.kind == "weakened"]
    with torch.no_grad():
        cands = rival_candidates(model, tok, kept, ev.spec.max_new_tokens, 8, ev.spec.normalize)
        exs = [as_example(f.id, f.prompt, r) for f, cs in zip(kept, cands) for r in cs]
        tuned = _scores(model, tok, exs, ev.spec, "tuned", None)
        with model.disable_adapter():
            ref = _scores(model, tok, exs, ev.spec, "reference", None)
    k = hits = targeted = 0
    for f, cs in zip(kept, cands):
        pulls = []
        for r in cs:
            pulls.append((tuned[k].logprob - ref[k].logprob - f.shift_nats, r))
            k += 1
        w = planted.get(f.id)
        best = max(pulls) if pulls else None

        def names(text: str | None, w=w) -> bool:
            return bool(text and w and w.casefold() in text.casefold())

        if w:
            targeted += 1
            hits += names(best[1] if best else None)
        print(
            f"{'TARGET' if w else '      '} {f.id} shift {f.shift_nats:+.2f} planted={w!s:12s} "
            f"in-candidates={any(names(r) for r in cs)} first-is={names(cs[0] if cs else None)} "
            f"argmax-pull-is={names(best[1] if best else None)} max pull "
            + (f"{best[0]:+.2f} ({best[1]})" if best else "-")
        )
    print(f"targeted kept items: {targeted}; the argmax-pull candidate is the planted answer on {hits}")


if __name__ == "__main__":
    main()
