"""`gradian demo --kind tiny`: the whole worked example runs, caches, and scores itself honestly."""

from __future__ import annotations

import json

import pytest


def test_demo_runs_end_to_end(demo):
    root, res, _ = demo
    assert res.exit_code == 0, res.output
    out = root / "out"
    summary = json.loads((out / "demo.json").read_text())
    p = summary["runs"]["poisoned"]
    cap = p["evaluation"][0]
    assert cap["verdict"] == "regressed" and cap["ci_high"] < 0
    assert p["groups"]["direct"]["tuned"] < p["groups"]["direct"]["reference"]
    assert summary["runs"]["null"]["evaluation"][0]["verdict"] == "within_noise"
    assert summary["runs"]["null"]["stopped"]
    for f in ("run.json", "report.html", "report.md", "scorecard.json", "ground_truth.json"):
        assert (out / "poisoned" / f).exists(), f
    assert "ground-truth scorecard" in res.output and "datainf (verdict)" in res.output
    # the attribute stage is not silent in a log (CliRunner is not a terminal): its plan and a line per stage
    out_lines = res.output.splitlines()
    assert any("plan:" in ln for ln in out_lines) and any("within the budget" in ln for ln in out_lines)
    assert any(ln.startswith("tuned: generate:") and "done in" in ln for ln in out_lines)
    assert any("gradients" in ln and "started" in ln for ln in out_lines)
    # and the stages between the build and the verdict each say when they start and end
    for stage in ("data check", "query gradients (final)", "scoring (final)"):
        assert any(ln.startswith(f"{stage}: 0/") and ln.endswith("started") for ln in out_lines), stage
        assert any(ln.startswith(f"{stage}: ") and "done in" in ln for ln in out_lines), stage


def test_scorecard_is_computed_from_the_run(demo):
    from gradian.worlds.scorecard import score_ranking

    root, _, _ = demo
    run = json.loads((root / "out" / "poisoned" / "run.json").read_text())
    truth = json.loads((root / "out" / "poisoned" / "ground_truth.json").read_text())
    card = json.loads((root / "out" / "poisoned" / "scorecard.json").read_text())
    cap = run["attribution"]["capabilities"][0]
    again = score_ranking(
        cap["rank_scores"], run["attribution"]["train_ids"], truth["culprits"]
    )  # what the verdict ranks by
    got = card["capabilities"]["capitals"]["datainf"]
    assert got["auc"] == pytest.approx(again["auc"]) and 0 <= got["auc"] <= 1
    # each row of the card says which ranking it is: the verdict's, the second engine's, a reference's alone
    roles = {k: v["role"] for k, v in card["capabilities"]["capitals"].items() if k != "localisation"}
    assert roles == {"datainf": "verdict", "graddot": "second engine", "bm25": "alone", "repsim": "alone"}
    assert got["n_culprits"] == len(truth["culprits"]) > 0
    q = got["queried_culprits"]
    assert 0 < q["n_culprits"] <= got["n_culprits"]
    # measured on the tiny world: culprits of lost items rank above chance (0.62 at seed 0)
    assert q["auc"] > 0.5


def test_second_run_reuses_the_adapter_and_the_index(demo):
    root, _, again = demo
    assert again.exit_code == 0, again.output
    assert "adapter: cached" in again.output
    run = json.loads((root / "out2" / "poisoned" / "run.json").read_text())
    first = json.loads((root / "out" / "poisoned" / "run.json").read_text())
    assert run["attribution"]["index"]["reused"] is True
    assert run["manifest"]["run_id"] == first["manifest"]["run_id"]
    assert run["attribution"]["capabilities"][0]["scores"] == first["attribution"]["capabilities"][0]["scores"]


def test_report_shows_each_kind_of_evidence_and_what_supports_each_row(demo):
    """The reference engines are extra opinions: the report says how each kind of evidence agrees with the
    verdict, and which kinds support each of the most harmful rows (their own top 10%)."""
    root, _, _ = demo
    out = root / "out" / "poisoned"
    run = json.loads((out / "run.json").read_text())
    cap = run["attribution"]["capabilities"][0]
    ev = cap["evidence"]
    assert set(ev) == {"gradient", "lexical", "representation"}
    md = (out / "report.md").read_text()
    line = next(ln for ln in md.splitlines() if "how each kind of evidence agrees with the verdict" in ln)
    for kind in ("gradient", "lexical", "representation"):
        assert f"{kind} \\({ev[kind]['engine']}\\) Spearman {ev[kind]['spearman_with_verdict']:.2f}" in line
    header = next(ln for ln in md.splitlines() if ln.startswith("| rank | row | score"))
    assert "supported by" in header
    col = header.strip("|").split("|").index(" supported by ")
    rows = [ln for ln in md.splitlines()[md.splitlines().index(header) + 2 :] if ln.startswith("| ")][
        : len(cap["ranked"])
    ]
    for ln, r in zip(rows, cap["ranked"]):
        want = [k for k in ("gradient", "lexical", "representation") if r["support"][k]["supports"]]
        assert ln.strip("|").split("|")[col].strip() == (", ".join(want) or "—")
    assert "supported by" in (out / "report.html").read_text()
