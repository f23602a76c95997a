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
Candidates are those of :mod:`gradian.attribute.rival`: the tuned model's ``K`` most probable other tokens at the
answer's first token, each continued greedily, kept when the metric judges them wrong and they are a
substitution of the tuned answer.

    python benchmarks/bench_rival_pull.py RUN WORLD [K]

Prints a line per kept item (targeted or not: its planted answer, whether it is among the candidates, whether
the first candidate or the argmax-pull one is it, the largest pull and its text) and the count.
"""

from __future__ import annotations

import json
import sys

import torch


def main() -> None:
    from gradian.attribute.rival import _answer_token, _substitution
    from gradian.evaluate.generate import encode_prompt, generate_greedy
    from gradian.evaluate.items import as_example, model_prompt
    from gradian.evaluate.normalize import TEXT_METRICS, NormalizeSpec, extract_answer
    from gradian.evaluate.run import _scores
    from gradian.evaluate.spec import EvalSpec
    from gradian.finetune import load_finetune
    from gradian.models.spec import ModelSpec

    run_dir, world = sys.argv[1], sys.argv[2]
    k_cands = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    run = json.load(open(f"{run_dir}/run.json"))
    gt = json.load(open(f"{world}/ground_truth.json"))
    planted = {t["eval_id"]: t["wrong"] for t in gt["targets"]}
    paths = run["manifest"]["paths"]
    ft = load_finetune(ModelSpec(paths["base"]), paths["adapter"])
    model, tok = ft.model, ft.tokenizer
    model.eval()
    spec, norm = EvalSpec(), NormalizeSpec()
    kept = [it for it in run["evaluation"]["items"] if it["status"] == "kept" and it.get("shift")]
    rows: list[tuple[dict, list[str]]] = []
    with torch.no_grad():
        for it in kept:
            said, accepted = it["tuned"]["answer"], [it["answer"], *it["aliases"]]
            found = _answer_token(tok, said, accepted)
            if found is None:
                continue
            ids, t = found
            prompt = encode_prompt(it["model_prompt"], tok, it["id"])
            prefix = prompt + ids[:t]
            logits = model(input_ids=torch.tensor([prefix])).logits[0, -1]
            top = [c for c in torch.topk(logits.float(), k_cands + 1).indices.tolist() if c != ids[t]][:k_cands]
            gens = generate_greedy(
                model, tok, [prefix + [c] for c in top], max_new_tokens=spec.max_new_tokens, batch_size=8
            )
            cands: list[str] = []
            for c, g in zip(top, gens):
                text = tok.decode(prefix[len(prompt) :] + [c] + g.token_ids, skip_special_tokens=True)
                ans = extract_answer(text, norm)
                wrong = ans.strip() and not TEXT_METRICS[it["metric"]](text, accepted, norm)
                if wrong and _substitution(said, ans, it["answer"]) and ans not in cands:
                    cands.append(ans)
            rows.append((it, cands))
        exs = [
            as_example(it["id"], model_prompt(it["model_prompt"], tok, True), r) for it, cands in rows for r in cands
        ]
        tuned = _scores(model, tok, exs, spec, "tuned", None)
        with model.disable_adapter():
            ref = _scores(model, tok, exs, spec, "reference", None)
    k = hits = targeted = 0
    for it, cands in rows:
        shift = it["shift"]["nats"]
        pulls = []
        for r in cands:
            pulls.append((tuned[k].logprob - ref[k].logprob - shift, r))
            k += 1
        w = planted.get(it["id"])
        best = max(pulls) if pulls else None

        def names(text: str | None, w=w) -> bool:
            return bool(text and w and w.casefold() in text.casefold())

        if w:
            targeted += 1
            hits += names(best[1] if best else None)
        print(
            f"{'TARGET' if w else '      '} {it['id']} shift {shift:+.2f} planted={w!s:12s} "
            f"in-candidates={any(names(r) for r in cands)} first-is={names(cands[0] if cands else None)} "
            f"argmax-pull-is={names(best[1] if best else None)} max pull "
            + (f"{best[0]:+.2f} ({best[1]})" if best else "-")
        )
    print(f"targeted kept items: {targeted}; the argmax-pull candidate is the planted answer on {hits}")


if __name__ == "__main__":
    main()
