"""Evaluate on tiny models: deterministic generation, base margins by hand, verdicts on a
poisoned vs a null adapter, the reference-adapter path, loglik, the model left reusable, the CLI."""

from __future__ import annotations

import json

import pytest
import torch
from eval_world import CAPITALS, N_POISON, eval_records, evaluate_args, load_peft
from typer.testing import CliRunner

from gradian.evaluate import (
    RESULT_JSON_SCHEMA,
    EvalResult,
    EvalSpec,
    as_example,
    evaluate,
    items_from_records,
    load_eval_set,
)
from gradian.evaluate.generate import encode_prompt, generate_greedy

SPEC = EvalSpec(max_new_tokens=8, resamples=2000)


# ----------------------------------------------------------------------------- generation


def test_greedy_generation_is_deterministic_and_batch_independent(world_tok):
    from gradian.models.tiny import tiny_model

    tok = world_tok
    model = tiny_model(tok, "llama", hidden=64, layers=2, seed=3, dtype=torch.float64)
    prompts = [
        "What?",
        "What is the capital of Borvia? Tell me now please.",
        "Symbol of kryll?",
        "a",
        [{"role": "user", "content": "What is the symbol of fluxon?"}],
    ]
    ids = [encode_prompt(p, tok) for p in prompts]
    assert len({len(i) for i in ids}) == len(ids)  # different lengths: left padding matters
    runs = [generate_greedy(model, tok, ids, max_new_tokens=12, batch_size=b) for b in (1, 2, 5, 5)]
    texts = [[g.token_ids for g in r] for r in runs]
    assert texts[0] == texts[1] == texts[2] == texts[3]
    assert all(len(g.token_ids) > 0 for g in runs[0])  # a random model does not stop at once


def test_evaluate_twice_gives_identical_results(eval_world):
    pm, tok = load_peft(eval_world)
    items = load_eval_set(eval_world["eval"])
    a = evaluate(pm, tok, items, spec=SPEC).to_dict()
    b = evaluate(pm, tok, items, spec=EvalSpec(max_new_tokens=8, resamples=2000, batch_size=3)).to_dict()
    for d in (a, b):
        d.pop("timing")
        d["spec"].pop("batch_size")
    assert a == b


# ----------------------------------------------------------------------------- verdicts on the tiny world


@pytest.fixture(scope="module")
def poison_result(eval_world):
    pm, tok = load_peft(eval_world, "poison")
    return evaluate(pm, tok, load_eval_set(eval_world["eval"]), spec=SPEC), pm, tok


def test_poisoned_capability_regresses_and_null_is_not_diagnosed(eval_world, poison_result):
    res, _, _ = poison_result
    caps = res.capabilities
    assert [c.name for c in caps] == ["capitals", "symbols"]
    cap = res.capability("capitals")
    assert cap.verdict == "regressed" and cap.diagnosed and cap.ci_high < 0 < cap.n_lost
    assert cap.n_lost <= N_POISON and cap.delta == pytest.approx(cap.tuned_score - cap.reference_score)
    assert res.capability("symbols").verdict != "regressed"

    pm, tok = load_peft(eval_world, "null")
    null = evaluate(pm, tok, load_eval_set(eval_world["eval"]), spec=SPEC)
    for c in null.capabilities:
        assert c.verdict == "within_noise" and not c.diagnosed and c.ci_low <= 0 <= c.ci_high
        assert "not diagnosed" in c.reason
    assert null.failing_items() == []


def test_failing_items_carry_what_attribution_needs(poison_result):
    res, _, _ = poison_result
    fails = res.failing_items()
    assert fails and all(f.capability == "capitals" for f in fails)
    poisoned_ids = {f"cap-{c}" for c, _ in CAPITALS[:N_POISON]}
    assert {f.id for f in fails} <= poisoned_ids
    for f in fails:
        it = next(i for i in res.items if i.id == f.id)
        assert it.status == "lost" and it.reference.passed and not it.tuned.passed
        assert f.prompt == [{"role": "user", "content": it.prompt}]  # the chat form the model ran on
        assert f.tuned_answer == it.tuned.answer and f.tuned_answer != f.answer
        assert f.margin == it.base_margin.nats and f.query == "contrastive"
        assert f.correct_example().completion == f.correct_completion and f.said_example().completion == f.tuned_answer
    # items the base also fails are never handed to attribution
    both = [i.id for i in res.items if i.status == "both_fail"]
    assert not set(both) & {f.id for f in fails}


def test_base_margin_matches_a_hand_computation(eval_world, poison_result):
    """m = Σ log softmax over the answer tokens (incl. end of turn), computed by hand on the bare base."""
    from gradian.models.load import ModelSpec, load_base

    res, _, tok = poison_result
    base, _ = load_base(ModelSpec(base=str(eval_world["base"])))

    def by_hand(msgs, answer):
        prompt_text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        full_text = tok.apply_chat_template(msgs + [{"role": "assistant", "content": answer}], tokenize=False)
        p_ids = tok(prompt_text, add_special_tokens=False)["input_ids"]
        ids = tok(full_text, add_special_tokens=False)["input_ids"]
        assert ids[: len(p_ids)] == p_ids
        assert tok.eos_token_id in ids[len(p_ids) :]  # the end of turn is part of what is scored
        with torch.no_grad():
            logits = base(torch.tensor([ids])).logits[0].double()
        logp = torch.log_softmax(logits, dim=-1)
        total = 0.0
        for t in range(len(p_ids), len(ids)):
            total += float(logp[t - 1, ids[t]])
        return total, len(ids) - len(p_ids)

    for f in res.failing_items()[:3]:
        it = next(i for i in res.items if i.id == f.id)
        m = it.base_margin
        assert m.correct == f.correct_completion == it.reference.answer and m.correct_source == "reference"
        lc, nc = by_hand(f.prompt, m.correct)
        ls, ns = by_hand(f.prompt, f.tuned_answer)
        lg, ng = by_hand(f.prompt, f.answer)
        assert m.logp_correct == pytest.approx(lc, abs=1e-4) and m.tokens_correct == nc
        assert m.logp_said == pytest.approx(ls, abs=1e-4) and m.tokens_said == ns
        assert m.logp_gold == pytest.approx(lg, abs=1e-4) and m.tokens_gold == ng
        assert m.nats == pytest.approx(lc - ls, abs=2e-4) and m.gold_nats == pytest.approx(lg - ls, abs=2e-4)


def test_shift_of_a_kept_item_is_the_tuned_minus_the_reference_logprob(eval_world, poison_result):
    """shift.nats = log p_tuned(ref answer) − log p_ref(ref answer), each scored as a margin is (end of turn
    included), for every kept item and no other."""
    from gradian.evaluate.likelihood import score_answers

    res, pm, tok = poison_result
    kept = [it for it in res.items if it.status == "kept"]
    assert kept and all(it.shift is not None for it in kept)
    assert all(it.shift is None for it in res.items if it.status != "kept")
    exs = [as_example(it.id, it.model_prompt, it.reference.answer) for it in kept]
    tuned = score_answers(pm, tok, exs)
    with pm.disable_adapter():
        ref = score_answers(pm, tok, exs)
    for it, t, r in zip(kept, tuned, ref):
        assert it.shift.correct == it.reference.answer and it.shift.tokens == r.n_tokens
        assert it.shift.logp_tuned == pytest.approx(t.logprob, abs=1e-5)
        assert it.shift.logp_reference == pytest.approx(r.logprob, abs=1e-5)
        assert it.shift.nats == pytest.approx(t.logprob - r.logprob, abs=1e-5)


def test_weakened_items_follow_the_lost_ones_as_cross_entropy_queries(poison_result):
    from gradian.attribute.queries import failing_item_query

    res, _, _ = poison_result
    lost = res.failing_items()
    shifts = sorted(it.shift.nats for it in res.items if it.shift is not None and it.capability == "capitals")
    tau = -shifts[len(shifts) // 2]  # about half the capitals' kept items fall by more than tau
    both = res.failing_items(weakened_nats=tau)
    assert both[: len(lost)] == lost and all(f.kind == "lost" and f.shift_nats is None for f in lost)
    weak = both[len(lost) :]
    expect = [
        it.id for it in res.items if it.capability == "capitals" and it.shift is not None and it.shift.nats < -tau
    ]
    assert weak and [f.id for f in weak] == expect
    for f in weak:
        it = next(i for i in res.items if i.id == f.id)
        assert f.kind == "weakened" and f.shift_nats == it.shift.nats < -tau and f.query == "cross_entropy"
        assert f.correct_completion == it.reference.answer and f.margin is None
        q = failing_item_query(f)
        assert q.kind == "cross_entropy" and q.said is None and q.correct == it.reference.answer
    # the null capability is not regressed: none of its items is queried, weakened or not
    assert not [f for f in res.failing_items(weakened_nats=0.0) if f.capability != "capitals"]
    assert res.failing_items(weakened_nats=1e6) == lost


def test_margin_uses_the_references_own_words_when_they_differ_from_the_answer(eval_world):
    """Correct answer given in lower case: the reference passes saying "Marven"; the margin's correct
    side is the reference's own answer (format-matched to what the tuned model says), and the
    bare-answer margin is kept beside it."""
    pm, tok = load_peft(eval_world, "poison")
    recs = eval_records()
    for r in recs:
        r["answer"] = r["answer"].lower()
    res = evaluate(pm, tok, items_from_records(recs), spec=SPEC)
    fails = res.failing_items("capitals")
    assert fails
    for f in fails:
        it = next(i for i in res.items if i.id == f.id)
        m = it.base_margin
        assert m.correct_source == "reference" and m.correct == it.reference.answer != it.answer
        assert f.correct_completion == m.correct and f.correct_example().completion == m.correct
        assert m.gold_nats == pytest.approx(m.logp_gold - m.logp_said) and m.gold_nats != m.nats
    both = [i for i in res.items if i.status == "both_fail" and i.base_margin is not None]
    assert all(i.base_margin.correct_source == "answer" and i.base_margin.nats == i.base_margin.gold_nats for i in both)


def test_plain_prompt_margin_matches_hand_computation(eval_world):
    """Without the chat template: prompt + answer + EOS, BOS/specials as the tokenizer adds them."""
    from gradian.models.load import ModelSpec, load_base

    pm, tok = load_peft(eval_world, "poison")
    spec = EvalSpec(max_new_tokens=8, resamples=2000, use_chat_template=False)
    res = evaluate(pm, tok, load_eval_set(eval_world["eval"]), spec=spec)
    base, _ = load_base(ModelSpec(base=str(eval_world["base"])))
    failed = [i for i in res.items if i.base_margin is not None]
    assert failed and all(isinstance(i.model_prompt, str) for i in res.items)
    it = failed[0]
    for text, got, n in (
        (it.base_margin.correct, it.base_margin.logp_correct, it.base_margin.tokens_correct),
        (it.answer, it.base_margin.logp_gold, it.base_margin.tokens_gold),
        (it.tuned.answer, it.base_margin.logp_said, it.base_margin.tokens_said),
    ):
        p_ids = tok(it.prompt)["input_ids"]
        ids = tok(it.prompt + text + tok.eos_token)["input_ids"]
        k = next((j for j, (a, b) in enumerate(zip(p_ids, ids)) if a != b), len(p_ids))
        with torch.no_grad():
            logp = torch.log_softmax(base(torch.tensor([ids])).logits[0].double(), -1)
        want = sum(float(logp[t - 1, ids[t]]) for t in range(max(k, 1), len(ids)))
        assert got == pytest.approx(want, abs=1e-4) and n == len(ids) - max(k, 1)


# ----------------------------------------------------------------------------- reference adapter, model state


def _state(pm):
    return (
        pm.active_adapter,
        sorted(pm.peft_config),
        {n: p.requires_grad for n, p in pm.named_parameters()},
        pm.training,
    )


def test_reference_adapter_path_and_model_left_reusable(eval_world):
    from gradian.gradients import lora_blocks, per_example_grads

    items = load_eval_set(eval_world["eval"])
    pm_null, tok = load_peft(eval_world, "null")
    null_as_tuned = evaluate(pm_null, tok, items, spec=SPEC)

    pm, tok = load_peft(eval_world, "poison")
    x = torch.tensor([encode_prompt("What is the capital of Aland?", tok)])
    with torch.no_grad():
        before_logits = pm(x).logits
    before = _state(pm)
    blocks_before = [b.name for b in lora_blocks(pm)]

    res = evaluate(pm, tok, items, reference_adapter=eval_world["null"], spec=SPEC)
    assert res.reference == {"kind": "adapter", "adapter": str(eval_world["null"])}
    for r_item, n_item in zip(res.items, null_as_tuned.items):
        assert r_item.reference.output == n_item.tuned.output  # the reference really is the null adapter
        assert r_item.reference.score == n_item.tuned.score
    # base margins still come from the base (adapter disabled), not from the reference adapter
    base_res = evaluate(pm, tok, items, spec=SPEC)
    for a, b in zip(res.items, base_res.items):
        if a.base_margin is not None:
            assert a.base_margin.nats == pytest.approx(b.base_margin.nats)

    # the tuned adapter is active again, the reference is gone, gradients set up as before
    assert _state(pm) == before
    assert [b.name for b in lora_blocks(pm)] == blocks_before
    with torch.no_grad():
        assert torch.equal(pm(x).logits, before_logits)
    from gradian.data.formats import Example
    from gradian.data.tokenize import TokenizeSpec, collate, tokenize_example

    ex = Example(
        "q", 0, "prompt_completion", [{"role": "user", "content": "What is the capital of Aland?"}], "Marven", {}
    )
    batch = collate([tokenize_example(ex, tok, TokenizeSpec())], tok.pad_token_id)
    grads = per_example_grads(pm, batch, method="hooks")
    fresh, _ = load_peft(eval_world, "poison")  # never evaluated
    want = per_example_grads(fresh, batch, method="hooks")
    assert set(grads) == set(want) == set(blocks_before)
    assert all(torch.equal(grads[k], want[k]) for k in want)

    # an adapter already loaded in the model can be named instead of a folder
    pm.load_adapter(str(eval_world["null"]), adapter_name="ckpt", is_trainable=False)
    pm.set_adapter("default")
    named = evaluate(pm, tok, items, reference_adapter="ckpt", spec=SPEC)
    assert [i.reference.output for i in named.items] == [i.reference.output for i in res.items]
    assert pm.active_adapter == "default" and "ckpt" in pm.peft_config


def test_evaluate_requires_a_peft_model(world_tok):
    from gradian.models.tiny import tiny_model

    with pytest.raises(TypeError, match="PEFT model"):
        evaluate(tiny_model(world_tok), world_tok, items_from_records(eval_records()), spec=SPEC)


# ----------------------------------------------------------------------------- loglik


def test_loglik_metric_scores_and_fallback_note(eval_world):
    from gradian.models.load import ModelSpec, load_base

    pm, tok = load_peft(eval_world, "poison")
    recs = eval_records("loglik")
    recs[0]["aliases"] = ["Zzz"]
    res = evaluate(pm, tok, items_from_records(recs), spec=SPEC)
    assert res.notes and "falls back to plain cross-entropy" in res.notes[0]
    cap = res.capability("capitals")
    assert cap.unit == "nats" and cap.base_bounds.query == "cross_entropy"
    assert all(i.tuned.output is None and i.base_margin is None for i in res.items)
    # reference score = log p_base(answer) computed by hand (adapter disabled == bare base)
    base, _ = load_base(ModelSpec(base=str(eval_world["base"])))
    it = res.items[1]
    msgs = [{"role": "user", "content": it.prompt}]
    p_ids = tok(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True), add_special_tokens=False)[
        "input_ids"
    ]
    ids = tok(
        tok.apply_chat_template(msgs + [{"role": "assistant", "content": it.answer}], tokenize=False),
        add_special_tokens=False,
    )["input_ids"]
    with torch.no_grad():
        logp = torch.log_softmax(base(torch.tensor([ids])).logits[0].double(), -1)
    want = sum(float(logp[t - 1, ids[t]]) for t in range(len(p_ids), len(ids)))
    assert it.reference.score == pytest.approx(want, abs=1e-4)
    assert it.reference.passed == all(int(logp[t - 1].argmax()) == ids[t] for t in range(len(p_ids), len(ids)))
    # the poisoned capitals lose likelihood on the correct answer
    assert cap.delta < 0 and cap.verdict == "regressed"
    fails = res.failing_items("capitals")
    assert all(f.query == "cross_entropy" and f.tuned_answer is None and f.said_example() is None for f in fails)


# ----------------------------------------------------------------------------- JSON + CLI


def _check_schema(obj, schema, path="$"):
    """A small JSON-Schema subset check (type/enum/const/required/properties/items/oneOf)."""
    types = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
    if "oneOf" in schema:
        ok = 0
        for s in schema["oneOf"]:
            try:
                _check_schema(obj, s, path)
                ok += 1
            except AssertionError:
                pass
        assert ok == 1, f"{path}: matches {ok} of oneOf"
        return
    if "const" in schema:
        assert obj == schema["const"], path
    if "enum" in schema:
        assert obj in schema["enum"], f"{path}: {obj!r} not in {schema['enum']}"
    if "type" in schema:
        ts = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]

        def is_t(t):
            if t == "number":
                return isinstance(obj, (int, float)) and not isinstance(obj, bool)
            if t == "integer":
                return isinstance(obj, int) and not isinstance(obj, bool)
            return isinstance(obj, types[t])

        assert any(is_t(t) for t in ts), f"{path}: {type(obj).__name__} is not {ts}"
    if isinstance(obj, dict):
        for k in schema.get("required", []):
            assert k in obj, f"{path}: missing {k}"
        for k, s in schema.get("properties", {}).items():
            if k in obj:
                _check_schema(obj[k], s, f"{path}.{k}")
        if "properties" in schema:
            extra = set(obj) - set(schema["properties"])
            assert not extra or path.endswith(("spec", "meta", "reference")), f"{path}: undocumented {extra}"
        if "additionalProperties" in schema:
            for k, v in obj.items():
                _check_schema(v, schema["additionalProperties"], f"{path}.{k}")
    if isinstance(obj, list) and "items" in schema:
        for i, v in enumerate(obj):
            _check_schema(v, schema["items"], f"{path}[{i}]")


def test_result_json_follows_the_documented_schema(poison_result):
    res, _, _ = poison_result
    d = json.loads(json.dumps(res.to_dict()))
    _check_schema(d, RESULT_JSON_SCHEMA)
    assert d["failing_items"] and d["capabilities"][0]["base_bounds"]["query"] == "contrastive"
    assert EvalResult.from_dict(d).to_dict() == d


def test_cli_end_to_end(eval_world, tmp_path):
    from gradian.cli import app

    out = tmp_path / "res" / "result.json"
    res = CliRunner().invoke(
        app,
        evaluate_args(eval_world, eval_world["eval"], out, resamples=2000),
        env={"COLUMNS": "200"},
    )
    assert res.exit_code == 0, res.output
    assert "regressed" in res.output and "items lost" in res.output and "not diagnosed" in res.output
    r = EvalResult.from_dict(json.loads(out.read_text()))
    assert r.capability("capitals").verdict == "regressed"
    assert r.meta["eval_sha256"] and r.meta["adapter"] == str(eval_world["poison"])
    assert r.timing["wall"] >= r.timing["total"] > 0


def test_reference_adapter_that_does_not_fit_is_a_user_error(eval_world, tmp_path):
    from peft import LoraConfig, get_peft_model

    from gradian.errors import GradianUserError
    from gradian.models.tiny import tiny_model

    pm, tok = load_peft(eval_world, "poison")
    before = _state(pm)
    get_peft_model(tiny_model(tok, "llama", hidden=32), LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(
        tmp_path / "wrong"
    )
    with pytest.raises(GradianUserError, match="has shape"):
        evaluate(pm, tok, load_eval_set(eval_world["eval"]), reference_adapter=tmp_path / "wrong", spec=SPEC)
    assert _state(pm) == before
