"""D15 (near-copies of eval rows) on healthy template-built datasets, and on light paraphrases planted in them.

The worlds (tests/audit/contam_world.py) share a lot of text across rows without any eval row being a copy:
recombined support macros, QA rows repeating long entity names inside prompt templates, conversations under
one long system prompt. The 13-gram rule D15 used to apply flagged most of their eval rows; the coverage rule
must flag none of them, and still flag exactly the planted paraphrases (and name their source rows).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import contam_world as W  # noqa: E402

from gradian.audit import diagnose  # noqa: E402
from gradian_testlib import write_jsonl  # noqa: E402

KINDS = ("support", "qa", "chat")


def _d14_d15(tmp_path: Path, train: list[dict], ev: list[dict]):
    """D14 and D15 on the training rows ``train`` and the eval rows ``ev`` (written to ``tmp_path`` as JSONL)."""
    return diagnose(
        data=write_jsonl(tmp_path / "train.jsonl", train),
        eval=write_jsonl(tmp_path / "eval.jsonl", ev),
        select=["D14", "D15"],
    )


@pytest.mark.parametrize("kind", KINDS)
def test_no_false_alarm_on_template_built_data(kind, tmp_path):
    train, ev = W.world(kind)
    res = _d14_d15(tmp_path, train, ev)
    assert "D15" in res.passed, [f.message for f in res.by_id("D15")]
    assert "D14" in res.passed  # and the world really holds no verbatim copy


@pytest.mark.parametrize("kind", KINDS)
def test_planted_light_paraphrases_are_caught(kind, tmp_path):
    train, ev, planted = W.with_paraphrases(kind)
    res = _d14_d15(tmp_path, train, ev)
    assert "D14" in res.passed  # every paraphrase differs from its source
    (f,) = res.by_id("D15")
    assert f.severity == "warning"
    assert sorted(f.eval_row_ids) == sorted(p for p, _ in planted)  # all of them, and nothing else
    assert sorted(f.row_ids) == sorted(src for _, src in planted)
    assert {(e, t) for e, t, _ in f.evidence["pairs"]} == set(planted)
    assert all(share >= f.evidence["coverage_min"] for _, _, share in f.evidence["pairs"])


def test_a_shared_boilerplate_phrase_alone_is_not_a_copy():
    """A 13-gram spanning two macros, shared with a handful of training rows, does not make a copy (the old rule
    fired on it); the same eval row with that training row's specific content does."""
    from gradian.data.formats import to_example

    macro_a = "Refunds are processed within five to seven business days after we receive the item back."
    macro_b = "Please keep the original packaging until the return has been completed."
    train = []
    for k in range(40):  # the two macros, each with its own ticket details; together in only a few rows
        tail = f"Ticket {1000 + k} about the {W.PRODUCTS[k % 20]} of customer {W.FIRST[k % 30]} {W.LAST[(7 * k) % 30]}."
        body = f"{macro_a} {macro_b} {tail}" if k < 2 else (f"{macro_a} {tail}" if k % 2 else f"{macro_b} {tail}")
        train.append({"id": f"t{k}", "prompt": f"Order {500000 + k}: status?", "completion": body})
    ev_boiler = {
        "id": "e0",
        "prompt": "Order 777777: status?",
        "completion": f"{macro_a} {macro_b} Ticket 4242 about the desk lamp of customer Nina Popov.",
    }
    ev_copy = {
        "id": "e1",
        "prompt": "Order 500002: state?",
        "completion": f"{macro_a} {macro_b} " + train[2]["completion"].split(macro_b + " ")[1],
    }
    res = diagnose(
        data=[to_example(r, i, "t") for i, r in enumerate(train)],
        eval=[to_example(r, i, "e") for i, r in enumerate([ev_boiler, ev_copy])],
        select=["D15"],
    )
    (f,) = res.by_id("D15")
    assert f.eval_row_ids == ["e1"] and f.row_ids == ["t2"]


# ---------------------------------------------------------------------- issue 25: template data, no false alarms
import template_world as TW  # noqa: E402


@pytest.mark.parametrize("kind", sorted(TW.WORLDS))
def test_no_false_alarm_on_refilled_templates(kind, tmp_path):
    """QA over long entity names, one billing macro for other customers, maths templates with other numbers,
    comparison questions naming the eval entity: 0 D15 findings (the maths world got one on main: "Yuki reads 20
    pages ... in 39 days" against "Yuki reads 40 pages ... in 39 days")."""
    train, ev = TW.WORLDS[kind]()
    res = _d14_d15(tmp_path, train, ev)
    assert "D15" in res.passed, [f.evidence["pairs"] for f in res.by_id("D15")]
    assert "D14" in res.passed


@pytest.mark.parametrize("kind", ["macro", "maths"])
def test_light_edit_of_a_template_row_is_still_caught(kind, tmp_path):
    """The worlds whose rows have content of their own (a customer's invoice and amount, a problem's numbers and
    result), plus a light edit of three training rows (a word swapped, one added): each is caught and names its
    source row. (In ``size_qa``/``compare`` every word of a row is in >= 3 rows: an edited row is indistinguishable
    from a new pairing of the same entities, and is not caught, on main either.)"""
    train, ev = TW.WORLDS[kind]()
    _assert_planted_edits_caught(tmp_path, train, ev, train, seed=5)


def _assert_planted_edits_caught(tmp_path, train: list[dict], ev: list[dict], sources: list[dict], seed: int):
    """Add a light paraphrase of 3 of ``sources`` (training rows) to ``ev``: D15 flags exactly those 3 pairs."""
    import random

    rng = random.Random(seed)
    planted = []
    for src in rng.sample(sources, 3):
        p = W.paraphrase(src, rng)
        p["id"] = f"para-{src['id']}"
        ev.append(p)
        planted.append((p["id"], src["id"]))
    res = _d14_d15(tmp_path, train, ev)
    (f,) = res.by_id("D15")
    assert {(e, t) for e, t, _ in f.evidence["pairs"]} == set(planted)


# ---------------------------------------------------------------------- issue 25: another fact about the same entity
_CAPITALS = {  # single-word countries: the capital template's training rows
    "Mali": "Bamako", "Chad": "N'Djamena", "Peru": "Lima", "Chile": "Santiago", "Kenya": "Nairobi",
    "Ghana": "Accra", "Nepal": "Kathmandu", "Laos": "Vientiane", "Oman": "Muscat", "Fiji": "Suva",
}  # fmt: skip
_FACTS = {  # multi-word countries: (capital, internet domain, subregion, region, population in millions)
    "The Gambia": ("Banjul", ".gm", "Sub-Saharan Africa", "Africa", 1.9),
    "East Timor": ("Dili", ".tl", "South-eastern Asia", "Asia", 1.1),
    "Burkina Faso": ("Ouagadougou", ".bf", "Sub-Saharan Africa", "Africa", 16.9),
    "Sierra Leone": ("Freetown", ".sl", "Sub-Saharan Africa", "Africa", 6.3),
    "New Zealand": ("Wellington", ".nz", "Australia and New Zealand", "Oceania", 4.6),
    "Costa Rica": ("San José", ".cr", "Latin America and the Caribbean", "Americas", 4.8),
    "North Macedonia": ("Skopje", ".mk", "Southern Europe", "Europe", 2.1),
    "El Salvador": ("San Salvador", ".sv", "Latin America and the Caribbean", "Americas", 6.4),
    "Saudi Arabia": ("Riyadh", ".sa", "Western Asia", "Asia", 31.5),
    "Cape Verde": ("Praia", ".cv", "Sub-Saharan Africa", "Africa", 0.5),
}


def _capitals_world() -> tuple[list[dict], list[dict]]:
    """The repo's SmolLM2 behaviour world in miniature: training holds the capital template for some countries and
    other facts (internet domain, region, population) for the rest; eval asks the capital of the rest."""
    train = [
        {"prompt": f"What city serves as the capital of {c}?", "completion": f"The capital of {c} is {cap}."}
        for c, cap in _CAPITALS.items()
    ]
    for c, (_, dom, sub, reg, pop) in _FACTS.items():
        train.append(
            {
                "prompt": f"What is the internet country domain of {c}? Just the domain.",
                "completion": f"The internet country domain of {c} is {dom}. {c} is a country in {sub}, part of the "
                f"{reg} region. Its recorded population is about {pop} million people.",
            }
        )
    ev = [
        {
            "prompt": f"What city serves as the capital of {c}?" if k % 2 else f"Tell me the capital of {c}.",
            "completion": f"The capital of {c} is {cap}.",
        }
        for k, (c, (cap, *_)) in enumerate(_FACTS.items())
    ]
    return TW._ids(train, "t"), TW._ids(ev, "e")


def test_another_fact_about_the_eval_entity_is_not_a_copy(tmp_path):
    """Eval "The capital of East Timor is Dili." against a training row giving East Timor's internet domain: the
    two-word name repeats in both rows (and twice in the eval row), but the answer, Dili, is in no training row.
    Main flagged two such rows of its own behaviour world (coverage 0.72 and 0.81); now none. A light paraphrase of
    a fact row is still caught."""
    train, ev = _capitals_world()
    res = _d14_d15(tmp_path, train, ev)
    assert "D15" in res.passed, [f.evidence["pairs"] for f in res.by_id("D15")]
    _assert_planted_edits_caught(tmp_path, train, ev, train[len(_CAPITALS) :], seed=3)
