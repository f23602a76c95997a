"""``--drill-weakened NATS``: weakened items asked about by the sentence drill-down only, never by the ranking."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))

from report_world import VISITS, real_run  # noqa: E402


def test_drill_only_items_move_the_blamed_sentence_and_nothing_else(tmp_path):
    from report_world import MAX_LENGTH
    from safetensors.numpy import load_file

    from gradian.attribute import AttributeSpec
    from gradian.attribute.drilldown import blamed_units
    from gradian.attribute.run import RunInputs, RunSpecs, attribute_run
    from gradian.data.tokenize import TokenizeSpec
    from gradian.evaluate import EvalResult, EvalSpec
    from gradian.index.store import GradSpec
    from gradian.models.load import ModelSpec
    from gradian.runfile import check_run

    real = real_run()
    w = real["world"]
    ev = EvalResult.from_dict(real["run"]["evaluation"])
    c = real["run"]["attribution"]["capabilities"][0]["capability"]
    shifts = sorted(it.shift.nats for it in ev.items if it.shift is not None and it.capability == c)
    tau = -shifts[len(shifts) // 2]  # about half of the kept items are weakened by more than tau
    inputs = RunInputs(str(w["base"]), w["adapter"], w["data"], w["eval"], configs=(w["config"],), logs=w["logs"])

    def run_with(**attr):
        specs = RunSpecs(
            model=ModelSpec(str(w["base"])),
            grad=GradSpec(tokenize=TokenizeSpec(max_length=MAX_LENGTH)),
            attribute=AttributeSpec(top_k=10, drilldown_rows=6, visits=VISITS, **attr),
            eval=EvalSpec(resamples=2000, max_new_tokens=12, max_length=MAX_LENGTH),
        )
        out = tmp_path / f"run-{attr['drill_weakened_nats']}"
        return attribute_run(inputs, specs, out, index_root=real["run_dir"] / "index", save_evidence=True), out

    plain, _ = run_with(drill_weakened_nats=None)
    run, out = run_with(drill_weakened_nats=tau)
    check_run(run)  # run.json's schema holds the new lists
    p, cap = plain["attribution"]["capabilities"][0], run["attribution"]["capabilities"][0]
    # the ranking, its queries, the references and the clusters are the lost items' alone: unchanged
    assert cap["queries"] == p["queries"] and cap["failing_items"] == p["failing_items"]
    for key in ("rank_scores", "scores", "second_scores"):
        np.testing.assert_allclose(cap[key], p[key], rtol=1e-9, atol=1e-12)
    assert [r["id"] for r in cap["ranked"]] == [r["id"] for r in p["ranked"]]
    assert [c_["row_ids"] for c_ in cap["clusters"]] == [c_["row_ids"] for c_ in p["clusters"]]
    # the drill-only items: weakened by more than tau, each against its rival, listed apart from the lost ones
    dq, di = cap["drill_queries"], cap["drill_items"]
    assert dq and [q["item_id"] for q in dq] == [f["id"] for f in di]
    assert not {q["item_id"] for q in dq} & {q["item_id"] for q in cap["queries"]}
    assert all(f["kind"] == "weakened" and f["shift_nats"] < -tau and q["said"] == f["rival"] for q, f in zip(dq, di))
    assert p["drill_queries"] == [] and p["drill_items"] == []
    # the blamed sentence of a row is its most harmful one for any of the lost and drill-only items (MAD-scaled)
    T = load_file(str(out / "evidence.safetensors"))
    U = np.concatenate([T[f"{c}/datainf/unit_raw"], T[f"{c}/datainf/drill/unit_raw"]])
    assert U.shape[0] == len(cap["queries"]) + len(dq)
    rows, a, b = T["units/row"], T["units/char_start"], T["units/char_end"]
    by_row = blamed_units(U, rows, a >= 0)
    want = [None] * cap["n_train"]
    for j, (k, _) in by_row.items():
        want[j] = [int(a[k]), int(b[k])]
    assert cap["row_sentences"] == want  # (on this small world they pick the same sentences as the lost items)
    # a drill-down entry names the item its sentence hurts most, which may be a drill-only one
    names = {q["item_id"] for q in cap["queries"]} | {q["item_id"] for q in dq}
    assert cap["drilldown"] and all(d["item_id"] in names for d in cap["drilldown"])
    # the report names a drill-only item as what it is (here the first entry is pointed at one)
    from gradian.report import build_report, render_markdown
    from gradian.report.html import render_html

    cap["drilldown"][0]["item_id"] = dq[0]["item_id"]
    k = sum(d["item_id"] in {q["item_id"] for q in dq} for d in cap["drilldown"])
    rep = build_report(run)
    note = "asked by the drill-down only"
    assert k >= 1 and render_markdown(rep).count(note) == k and render_html(rep).count(note) == k


def test_a_drill_only_item_that_a_sentence_hurts_most_moves_the_blame_to_it():
    """Row 0 has units 0-2; the lost item blames unit 1, a drill-only item hurts unit 2 far more (in MADs)."""
    from gradian.attribute.evidence import CapabilityEvidence, EngineScores
    from gradian.attribute.pipeline import AttributeSpec, _blamed_by_row
    from gradian.data.spans import SentenceUnit

    rng = np.random.default_rng(1)
    units = [SentenceUnit(0, 0, 5, 0, 3), SentenceUnit(0, 6, 9, 0, 3), SentenceUnit(0, 10, 14, 0, 3)]
    units += [SentenceUnit(r, 0, 4, 0, 2) for r in range(1, 40)] + [SentenceUnit(r, 5, 9, 0, 2) for r in range(1, 40)]
    K = len(units)

    def scores(hot: int, by: float) -> EngineScores:
        U = rng.normal(size=(1, K))
        U[0, hot] = by
        return EngineScores("datainf", np.zeros((1, 40)), np.zeros((1, 40)), U, U.copy())

    lost, weak = scores(1, -8.0), scores(2, -30.0)
    spec = AttributeSpec()
    alone = CapabilityEvidence({"datainf": lost}, {}, units)
    both = CapabilityEvidence({"datainf": lost}, {}, units, drill={"datainf": weak})
    assert _blamed_by_row(alone, spec)[0] == (1, 0)
    assert _blamed_by_row(both.with_drill_items(), spec)[0] == (2, 1)  # unit 2, item 1 = the first drill-only item
    assert both.with_drill_items().engines["datainf"].unit_raw.shape == (2, K) and alone.with_drill_items() is alone


def test_the_flag_takes_nats_or_none():
    from gradian.attribute import AttributeSpec
    from gradian.commands.attribute import _nats_or_none
    from gradian.errors import GradianUserError

    assert _nats_or_none("0.25", "--drill-weakened") == 0.25
    assert _nats_or_none("none", "--drill-weakened") is None and _nats_or_none("OFF", "--drill-weakened") is None
    with pytest.raises(GradianUserError, match="--drill-weakened"):
        _nats_or_none("lots", "--drill-weakened")
    with pytest.raises(GradianUserError, match="--drill-weakened"):
        AttributeSpec(drill_weakened_nats=-0.5)


def test_stacking_and_splitting_items_are_inverse():
    from gradian.attribute.evidence import EngineScores, split_items, stack_items

    rng = np.random.default_rng(0)
    es = EngineScores("e", *(rng.normal(size=(5, k)) for k in (7, 7, 11, 11)))
    a, b = split_items(es, 3)
    assert a.raw.shape == (3, 7) and b.unit_cosine.shape == (2, 11)
    back = stack_items(a, b)
    for k in ("raw", "cosine", "unit_raw", "unit_cosine"):
        np.testing.assert_array_equal(getattr(back, k), getattr(es, k))
