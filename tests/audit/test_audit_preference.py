"""Preference rows (DPO/ORPO pairs, KTO rows): what Audit reads from each documented format, what it finds on
planted faults, and the one-line refusal of attribution. Fixtures: tests/audit/pref_world.py."""

from __future__ import annotations

import pytest
from pref_world import axolotl_rows, llamafactory_rows, plant_pair_faults, trl_kto_rows, trl_rows
from typer.testing import CliRunner

from gradian.audit import diagnose
from gradian.cli import app
from gradian.data.formats import load_examples
from gradian.data.preference import PreferenceRowsError, to_preference

PREF_CHECKS = ("D22", "D23", "D24", "D25", "D26", "D27")
FIXTURES = {
    "trl": (trl_rows, "trl"),
    "axolotl": (axolotl_rows, "axolotl_intel"),
    "llamafactory": (llamafactory_rows, "llamafactory_sharegpt"),
}


def _pref_findings(res):
    return [f for f in res.findings if f.id in PREF_CHECKS]


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_clean_fixture_is_read_and_gives_no_preference_finding(world, name):
    make, kind = FIXTURES[name]
    path = world.data_with(make(), f"pref_{name}.jsonl")
    res = diagnose(data=path, tokenizer=world.tok_dir)
    assert res.inputs["data"]["formats"] == {kind: 24}
    assert _pref_findings(res) == []
    assert {"D22", "D23", "D25", "D26"} <= set(res.passed)
    reasons = {s.id: s.reason for s in res.skipped}
    assert reasons["D27"].startswith("not applicable: paired rows")
    # SFT-row checks say not applicable (they do not crash, and do not claim --data is missing)
    for cid in ("D01", "D11", "D13"):
        assert reasons[cid].startswith("not applicable: the training rows are preference rows"), reasons[cid]


def test_clean_kto_fixture(world):
    res = diagnose(data=world.data_with(trl_kto_rows(), "kto.jsonl"))
    assert res.inputs["data"]["formats"] == {"trl_kto": 24}
    assert _pref_findings(res) == []
    assert "D27" in res.passed


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_identical_pair_and_empty_rejected(world, name):
    make, _ = FIXTURES[name]
    rows = plant_pair_faults(make(), name)
    res = diagnose(data=world.data_with(rows, f"bad_{name}.jsonl"), select=["D22"])
    found = res.by_id("D22")
    msgs = " | ".join(f.message for f in found)
    assert all(f.severity == "error" for f in found)
    assert "chosen identical to rejected" in msgs and "an empty rejected response" in msgs
    assert {tuple(f.row_ids) for f in found} == {("3",), ("5",)}


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_length_bias(world, name):
    make, _ = FIXTURES[name]
    res = diagnose(data=world.data_with(make(biased=True), f"long_{name}.jsonl"), select=["D26"])
    (f,) = res.by_id("D26")
    assert f.severity == "warning" and f.evidence["value"] == 1.0 and f.evidence["mean_ratio"] > 1.5


def test_length_bias_needs_enough_pairs(world):
    res = diagnose(data=world.data_with(trl_rows(10, biased=True), "few.jsonl"), select=["D26"])
    assert not res.by_id("D26")
    assert [s.reason for s in res.skipped if s.id == "D26"][0].startswith("not applicable: 10 pairs")


def test_unbalanced_kto(world):
    res = diagnose(data=world.data_with(trl_kto_rows(20, 4), "kto_unbal.jsonl"), select=["D27"])
    (f,) = res.by_id("D27")
    assert f.severity == "warning" and f.evidence["value"] == 5.0
    assert "desirable_weight=0.27" in f.message
    res = diagnose(data=world.data_with(trl_kto_rows(24, 0), "kto_one.jsonl"), select=["D27"])
    (f,) = res.by_id("D27")
    assert f.severity == "error"


def test_duplicates_and_contamination(world):
    rows = trl_rows()
    rows += [dict(rows[0]), dict(rows[0])]
    res = diagnose(data=world.data_with(rows, "dup.jsonl"), select=["D23"])
    (f,) = res.by_id("D23")
    assert f.evidence["value"] == 2 and f.row_ids == ["24", "25"]
    ev = [{"id": "e1", "prompt": "What is the capital city of Peru?", "answer": "Lima.", "capability": "capitals"}]
    ev.append(
        {"id": "e2", "prompt": "What is the capital city of Atlantis?", "answer": "None.", "capability": "capitals"}
    )
    res = diagnose(data=world.data_with(trl_rows(), "tr.jsonl"), eval=world.data_with(ev, "ev.jsonl"), select=["D24"])
    (f,) = res.by_id("D24")
    assert f.eval_row_ids == ["e1"] and f.row_ids == ["3"]


def test_contamination_is_found_without_the_training_rows_system_turn(world):
    # axolotl chatml.intel rows carry a system prompt; an eval row asking one row's question without it, or with
    # another system turn in a message list, is the same question
    rows = axolotl_rows()
    q = rows[3]["question"]
    ev = [
        {"id": "plain", "prompt": q, "answer": rows[3]["chosen"], "capability": "c"},
        {"id": "with", "prompt": f"You are a geography tutor.\n\n{q}", "answer": "x", "capability": "c"},
        {
            "id": "other-system",
            "messages": [
                {"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": q},
            ],
            "answer": "x",
            "capability": "c",
        },
        {"id": "clean", "prompt": "What is the capital city of Atlantis?", "answer": "x", "capability": "c"},
    ]
    res = diagnose(data=world.data_with(rows, "ax.jsonl"), eval=world.data_with(ev, "ev.jsonl"), select=["D24"])
    (f,) = res.by_id("D24")
    assert sorted(f.eval_row_ids) == ["other-system", "plain", "with"] and f.row_ids == ["3"]
    assert f.evidence["verbatim"] == 1  # "plain" repeats the question and the chosen answer


def test_truncation_under_max_length(world):
    rows = trl_rows()
    res = diagnose(
        data=world.data_with(rows, "trunc.jsonl"),
        tokenizer=world.tok_dir,
        configs=[world.config_with(max_length=12)],
        select=["D25"],
    )
    (f,) = res.by_id("D25")
    assert f.severity == "warning" and f.evidence["max_length"] == 12 and f.row_ids


def test_preference_checks_not_applicable_on_sft_rows(world):
    res = diagnose(data=world.data, select=list(PREF_CHECKS))
    reasons = {s.id: s.reason for s in res.skipped}
    for cid in ("D22", "D23", "D26", "D27"):
        assert reasons[cid].startswith("not applicable: the training rows are SFT rows"), reasons[cid]


@pytest.mark.parametrize(
    "rec,kind,prompt,chosen,rejected",
    [
        (  # TRL implicit prompt: the shared leading turns
            {
                "chosen": [{"role": "user", "content": "Sky?"}, {"role": "assistant", "content": "Blue."}],
                "rejected": [{"role": "user", "content": "Sky?"}, {"role": "assistant", "content": "Green."}],
            },
            "trl",
            "Sky?",
            "Blue.",
            "Green.",
        ),
        ({"prompt": "Sky?", "chosen": " Blue.", "rejected": " Green."}, "trl", "Sky?", " Blue.", " Green."),
        ({"chosen": "Sky? It is blue.", "rejected": "Sky? It is green."}, "trl", "Sky? It is", " blue.", " green."),
        (
            {"system": "S", "instruction": "Sky?", "chosen_response": "Blue.", "rejected_response": "Green."},
            "axolotl_argilla",
            "S\n\nSky?",
            "Blue.",
            "Green.",
        ),
        (  # the row: conversation + chosen/rejected message objects (axolotl chat_template.default)
            {
                "conversation": [{"role": "user", "content": "Sky?"}],
                "chosen": {"role": "assistant", "content": "Blue."},
                "rejected": {"role": "assistant", "content": "Green."},
            },
            "axolotl_chat",
            "Sky?",
            "Blue.",
            "Green.",
        ),
        (
            {"instruction": "Sky?", "input": "Answer briefly.", "chosen": "Blue.", "rejected": "Green."},
            "llamafactory_alpaca",
            "Sky?\n\nAnswer briefly.",
            "Blue.",
            "Green.",
        ),
    ],
)
def test_reader_normalises(rec, kind, prompt, chosen, rejected):
    e = to_preference(rec, 0, "f.jsonl:1")
    assert (e.kind, e.prompt_text, e.chosen_text, e.rejected_text) == (kind, prompt, chosen, rejected)


def test_llamafactory_kto_tag():
    rec = {
        "messages": [{"role": "user", "content": "Sky?"}, {"role": "assistant", "content": "Blue."}],
        "kto_tag": False,
    }
    e = to_preference(rec, 0, "f.jsonl:1")
    assert (e.kind, e.prompt_text, e.chosen_text, e.label) == ("llamafactory_kto", "Sky?", "Blue.", False)


def test_sft_rows_unchanged(world):
    ex = load_examples(world.data)
    assert {e.format for e in ex} == {"prompt_completion"} and len(ex) == 400


@pytest.mark.parametrize("cmd", ["attribute", "index"])
def test_attribution_refuses_preference_rows(world, cmd):
    path = world.data_with(trl_rows(), "refuse.jsonl")
    with pytest.raises(PreferenceRowsError, match="preference losses .* are not supported yet"):
        load_examples(path)
    args = [cmd, "--base", world.root / "nobase", "--adapter", world.root / "noadapter", "--data", path]
    if cmd == "attribute":
        args += ["--eval", world.eval, "--out", world.root / "o"]
    else:
        args += ["--out", world.root / "ix"]
    res = CliRunner().invoke(app, [str(a) for a in args])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "preference rows (trl: chosen, prompt, rejected)" in lines[0], res.output
