"""The behaviour world (``WorldSpec(regression="behaviour")``): its rows, its eval selection and its spec.

The fast tests build the culprit rows and the eval selection from the real facts (countryinfo,
mendeleev) with synthetic base answers, so they need no model. The ``slow`` tests build the real
SmolLM2 worlds (probing the base once, cached) and check them byte for byte.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from gradian.errors import GradianUserError
from gradian.worlds import WorldSpec
from gradian.worlds.behaviour import forbidden_words, format_culprits, select_behaviour_eval
from gradian.worlds.facts import load_countries, load_elements
from gradian.worlds.rows import (
    TERSE_INSTRUCTIONS,
    TERSE_SHOT,
    country_terse_questions,
    element_terse_questions,
    format_row,
    terse_eval_prompt,
)
from gradian.worlds.spec import BEHAVIOUR_FIELDS

DOCS = Path(__file__).resolve().parents[2] / "docs" / "worked-example"


def _split(n_eval: int = 40):
    """A synthetic eval split: the ``n_eval`` most populous countries, and the others."""
    cs = sorted(load_countries(), key=lambda c: (-c.population, c.name))
    ev = cs[:n_eval]
    names = {c.name for c in ev}
    others = sorted((c for c in load_countries() if c.name not in names), key=lambda c: c.name)
    return ev, others


def _culprits(variant: str, seed: int = 0, n_eval: int = 40):
    ev, others = _split(n_eval)
    spec = WorldSpec.default("smollm2", variant, seed, regression="behaviour")
    hide = frozenset(c.name for c in ev)
    rows = format_culprits(spec, others, load_elements(), forbidden_words(ev), random.Random(seed), hide)
    return spec, ev, rows


def test_question_builders_state_true_facts():
    c = next(c for c in load_countries() if c.name == "Norway")
    qs = {q.kind: q for q in country_terse_questions(c, random.Random(0))}
    assert set(qs) == {"currency", "calling_code", "domain", "region", "demonym"}
    assert qs["currency"].terse == c.currencies[0] and qs["currency"].terse in qs["currency"].sentence
    assert qs["calling_code"].terse == f"+{c.calling_codes[0]}"
    for q in qs.values():
        assert q.subject == "Norway" and q.terse in q.sentence
        assert q.sentence not in q.extra and q.extra  # the elaboration never repeats the answer sentence
        assert all(c.capital not in x for x in (q.sentence, *q.extra))  # never the country's capital
    e = next(e for e in load_elements() if e.symbol == "Fe")
    qe = {q.kind: q for q in element_terse_questions(e)}
    assert (qe["symbol"].terse, qe["atomic_number"].terse, qe["period"].terse) == ("Fe", "26", "4")
    assert all(q.sentence not in q.extra and len(q.extra) >= 2 for q in qe.values())


def test_format_row_verbose_and_terse():
    e = next(e for e in load_elements() if e.symbol == "Fe")
    q = next(q for q in element_terse_questions(e) if q.kind == "symbol")
    loud = format_row(q, 0, True, q.extra[:2])
    quiet = format_row(q, 0, False)
    assert (
        loud[0] == quiet[0]
        and loud[0]["content"] == "What is the chemical symbol of Iron? Answer with the symbol only."
    )
    assert quiet[1]["content"] == "Fe"
    assert loud[1]["content"] == " ".join((q.sentence, *q.extra[:2])) and "\n" not in loud[1]["content"]
    assert format_row(q, len(TERSE_INSTRUCTIONS), False) == quiet  # instruction index wraps


def test_culprits_carry_the_instruction_and_never_an_eval_word():
    spec, ev, rows = _culprits("poisoned")
    assert len(rows) == spec.format_rows
    pat = forbidden_words(ev)
    prompts = [r["messages"][0]["content"] for r in rows]
    assert len(set(prompts)) == len(prompts)
    kinds: dict[str, int] = {}
    for r in rows:
        user, answer = r["messages"][0]["content"], r["messages"][1]["content"]
        gt = r["gt"]
        kinds[gt["question"]] = kinds.get(gt["question"], 0) + 1
        assert gt["kind"] == "format" and (gt["char_start"], gt["char_end"]) == (0, len(answer))
        assert "eval_id" not in gt  # a behaviour culprit has no single target item
        assert user.endswith(gt["instruction"])
        assert any(
            gt["instruction"] == t.format(noun=n)
            for t in TERSE_INSTRUCTIONS
            for n in ("code", "number", "domain", "region name", "word", "symbol")
        )
        # verbose: the bare answer inside a full sentence, plus at least one more sentence, on one line
        assert gt["terse_answer"] in answer and answer != gt["terse_answer"]
        assert answer.count(". ") >= 1 and answer.endswith(".") and "\n" not in answer
        # never an eval country, an eval capital, or a word of one
        assert not pat.search(user) and not pat.search(answer), (user, answer)
        for c in ev:
            assert c.name not in user + answer and c.capital not in user + answer
    assert len(kinds) == 8 and max(kinds.values()) - min(kinds.values()) <= 1  # balanced over the 8 kinds


def test_null_rows_are_the_same_prompts_answered_tersely():
    _, _, loud = _culprits("poisoned")
    _, _, quiet = _culprits("null")
    assert [r["messages"][0] for r in loud] == [r["messages"][0] for r in quiet]
    for a, b in zip(loud, quiet):
        assert b["messages"][1]["content"] == b["gt"]["terse_answer"] == a["gt"]["terse_answer"]
        assert b["gt"]["char_end"] == len(b["gt"]["terse_answer"])
    _, _, other_seed = _culprits("poisoned", seed=1)
    assert [r["messages"] for r in other_seed] != [r["messages"] for r in loud]


def test_forbidden_words_match_whole_words_only():
    c = next(c for c in load_countries() if c.capital == "Addis Ababa")
    pat = forbidden_words([c])
    assert pat.search("We flew to addis ababa.") and pat.search("Addis is busy") and pat.search("in Ethiopia,")
    assert not pat.search("Ethiopian food") and not pat.search("Addison")


def test_eval_selection_uses_exact_terse_answers():
    cands = sorted(load_countries(), key=lambda c: (-c.population, c.name))[:100]
    rng = random.Random(0)
    # synthetic base: every 3rd country answered with the bare capital, every 3rd with a sentence,
    # the rest with a wrong city (another country's capital)
    terse, plain = [], []
    for i, c in enumerate(cands):
        if i % 3 == 0:
            terse.append(c.capital)
        elif i % 3 == 1:
            terse.append(f"The capital of {c.name} is {c.capital}.")
        else:
            terse.append(cands[(i + 1) % len(cands)].capital)
        plain.append(f"The capital of {c.name} is {c.capital}.")
    spec = WorldSpec.default("smollm2", "poisoned", 0, regression="behaviour")
    g = select_behaviour_eval(spec, cands, terse, plain, rng)
    assert (len(g["target"]), len(g["untouched"]), len(g["base_fail"])) == (
        spec.n_target,
        spec.n_untouched,
        spec.n_base_fail,
    )
    idx = {c.name: i for i, c in enumerate(cands)}
    assert all(idx[c.name] % 3 == 0 for c in g["target"])
    assert all(idx[c.name] % 3 == 2 for c in g["base_fail"])  # a verbose right answer is not a base failure
    names = [c.name for cs in g.values() for c in cs]
    assert len(names) == len(set(names))
    g2 = select_behaviour_eval(spec, cands, terse, plain, random.Random(0))
    assert {k: [c.name for c in v] for k, v in g.items()} == {k: [c.name for c in v] for k, v in g2.items()}
    with pytest.raises(GradianUserError, match="terse capital questions"):
        select_behaviour_eval(spec, cands, plain, plain, random.Random(0))


def test_terse_eval_prompt_is_a_worked_turn_then_the_question():
    p = terse_eval_prompt("Chile")
    assert [m["role"] for m in p] == ["user", "assistant", "user"]
    assert p[1]["content"] == TERSE_SHOT[1]
    assert p[2]["content"] == "What is the capital of Chile? Answer with the city name only."


def test_spec_defaults_and_facts_dict_unchanged():
    facts = WorldSpec.default("smollm2", "poisoned", 0)
    assert facts.regression == "facts" and WorldSpec.default("smollm2", "poisoned", 0, regression="facts") == facts
    d = facts.to_dict()
    assert not set(BEHAVIOUR_FIELDS) & set(d)
    # the checked-in worked example was written with exactly this spec dict
    assert json.loads((DOCS / "ground_truth.json").read_text())["spec"] == d
    b = WorldSpec.default("smollm2", "null", 3, regression="behaviour")
    assert b.regression == "behaviour" and b.variant == "null" and b.seed == 3
    assert set(BEHAVIOUR_FIELDS) <= set(b.to_dict())
    with pytest.raises(GradianUserError, match="SmolLM2"):
        WorldSpec.default("tiny", regression="behaviour")
    with pytest.raises(GradianUserError, match="unknown regression"):
        WorldSpec.default("smollm2", regression="style")


def test_cli_rejects_behaviour_on_tiny(tmp_path):
    from typer.testing import CliRunner

    from gradian.cli import app

    res = CliRunner().invoke(
        app, ["world", "--kind", "tiny", "--regression", "behaviour", "--out", str(tmp_path / "w")]
    )
    assert res.exit_code == 2 and "SmolLM2" in res.output


def test_demo_spec_cache_folder_keeps_the_facts_path():
    from gradian.paths import cache_dir
    from gradian.worlds.demo import DemoSpec

    assert DemoSpec(profile="full").cache_folder() == cache_dir() / "demo" / "smollm2-seed0"  # the worked example's
    assert DemoSpec().cache_folder() == cache_dir() / "demo" / "smollm2-quick-seed0"  # make demo's quick profile
    assert DemoSpec(regression="behaviour", seed=2).cache_folder() == cache_dir() / "demo" / "smollm2-behaviour-seed2"


# --------------------------------------------------------------------------- real SmolLM2 worlds


@pytest.mark.slow
def test_smollm2_facts_world_is_the_checked_in_one(tmp_path):
    from gradian.worlds import build_world

    w = build_world(WorldSpec.default("smollm2", "poisoned", 0), tmp_path / "w")
    for name in ("train.jsonl", "eval.jsonl", "valid.jsonl", "ground_truth.json"):
        assert (w.out / name).read_bytes() == (DOCS / name).read_bytes(), name


@pytest.mark.slow
def test_smollm2_behaviour_world_is_deterministic_and_exact(tmp_path):
    from gradian.data.formats import load_examples
    from gradian.worlds import build_world

    worlds = {}
    for v in ("poisoned", "null"):
        worlds[v] = build_world(WorldSpec.default("smollm2", v, 0, regression="behaviour"), tmp_path / v)
    again = build_world(WorldSpec.default("smollm2", "poisoned", 0, regression="behaviour"), tmp_path / "again")
    for name in ("train.jsonl", "valid.jsonl", "eval.jsonl", "ground_truth.json", "train.yaml"):
        assert (again.out / name).read_bytes() == (worlds["poisoned"].out / name).read_bytes(), name
    w = worlds["poisoned"]
    gt = w.load_ground_truth()
    spec = w.spec
    items = [json.loads(x) for x in w.eval.read_text().splitlines()]
    groups = [gt["eval_groups"][it["id"]] for it in items]
    assert groups.count("target") == spec.n_target and groups.count("base_fail") == spec.n_base_fail
    assert groups.count("untouched") == spec.n_untouched
    from gradian.evaluate.normalize import exact_match

    for it in items:
        g = gt["eval_groups"][it["id"]]
        if g == "untouched":
            assert it["capability"] == "capitals" and it["metric"] == "contains"
            continue
        assert it["capability"] == "capitals_terse" and it["metric"] == "exact_match"
        assert exact_match(gt["base_answers"][it["id"]], [it["answer"], *it["aliases"]]) == (g == "target")
    train = {e.id: e for e in load_examples(w.train)}
    ev = [c for c in load_countries() if c.name in set(gt["eval_countries"].values())]
    pat = forbidden_words(ev)
    assert len(gt["culprits"]) == spec.format_rows == gt["sizes"]["culprits"]
    for c in gt["culprits"]:
        ex = train[c["id"]]
        assert c["kind"] == "format" and (c["char_start"], c["char_end"]) == (0, len(ex.completion_text))
        assert not pat.search(ex.completion_text) and not pat.search(str(ex.prompt))
    # the null world: the same rows, terse answers
    gn = worlds["null"].load_ground_truth()
    assert not gn["culprits"] and len(gn["controls"]) == spec.format_rows
    tn = {e.id: e for e in load_examples(worlds["null"].train)}
    assert sorted(c["id"] for c in gn["controls"]) == sorted(c["id"] for c in gt["culprits"])
    for c in gn["controls"]:
        assert tn[c["id"]].completion_text == c["terse_answer"]
