"""``--save-evidence``: the score matrices behind a verdict, written as safetensors, reproduce its ranking."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))

from report_world import VISITS, real_run  # noqa: E402


def test_evidence_file_reproduces_the_verdict_and_a_stale_one_is_removed(tmp_path):
    from report_world import MAX_LENGTH
    from safetensors.numpy import load_file

    from gradian.attribute import AttributeSpec
    from gradian.attribute.ranking import fuse_scores
    from gradian.attribute.run import RunInputs, RunSpecs, attribute_run
    from gradian.data.spans import SentenceUnit, row_min
    from gradian.data.tokenize import TokenizeSpec
    from gradian.evaluate import EvalSpec
    from gradian.index.store import GradSpec
    from gradian.models.load import ModelSpec

    real = real_run()
    w = real["world"]
    inputs = RunInputs(str(w["base"]), w["adapter"], w["data"], w["eval"], configs=(w["config"],), logs=w["logs"])

    def specs():
        return RunSpecs(
            model=ModelSpec(str(w["base"])),
            grad=GradSpec(tokenize=TokenizeSpec(max_length=MAX_LENGTH)),
            attribute=AttributeSpec(top_k=10, drilldown_rows=6, visits=VISITS),
            eval=EvalSpec(resamples=2000, max_new_tokens=12, max_length=MAX_LENGTH),
        )

    out = tmp_path / "run"
    run = attribute_run(inputs, specs(), out, index_root=real["run_dir"] / "index", save_evidence=True)
    T = load_file(str(out / "evidence.safetensors"))
    cap = run["attribution"]["capabilities"][0]
    c, n, m = cap["capability"], cap["n_train"], len(cap["queries"])
    assert T[f"{c}/datainf/raw"].shape == (m, n) and T[f"{c}/bm25"].shape == (m, n)
    units = [
        SentenceUnit(int(r), None if a < 0 else int(a), None if b < 0 else int(b), 0, int(s))
        for r, a, b, s in zip(T["units/row"], T["units/char_start"], T["units/char_end"], T["units/n_supervised"])
    ]
    assert T[f"{c}/datainf/unit_cosine"].shape == (m, len(units))
    # each checkpoint's own matrices, unweighted: the trajectory's weighted sum of them is the file's matrix
    wts = T["trajectory/weights"]
    assert len(wts) == len(run["attribution"]["trajectory"]["checkpoints"]) >= 2
    for e in ("datainf", "graddot"):
        for kind in ("raw", "cosine", "unit_raw", "unit_cosine"):
            total = sum(wt * T[f"{c}/{e}/ck{t}/{kind}"] for t, wt in enumerate(wts))
            np.testing.assert_allclose(total, T[f"{c}/{e}/{kind}"], rtol=1e-12, atol=1e-12 * np.abs(total).max())
    # the row score: per failing item, the row's most harmful sentence; then the mean over the items, u; plus half
    # the whole row's score w, each over its robust scale; then the references (BM25 and RepSim by default) folded in
    # by the spec's gate
    per_item, _ = row_min(T[f"{c}/datainf/unit_cosine"], units, n)
    u, whole = per_item.mean(0), T[f"{c}/datainf/cosine"].mean(0)
    spec = AttributeSpec()
    assert spec.row_weight == cap["ranking"]["row_weight"] == 0.5

    def scale(x):
        return 1.4826 * np.median(np.abs(x - np.median(x)))

    rows = u / scale(u) + 0.5 * whole / scale(whole)
    np.testing.assert_allclose(rows, cap["evidence"]["gradient"]["scores"], rtol=1e-5, atol=1e-6)
    assert cap["ranking"]["fuse"] == list(spec.fuse) == ["bm25", "repsim"]
    fused, weights = fuse_scores(rows, {r: T[f"{c}/{r}"].mean(0) for r in spec.fuse}, cap["ranking"]["fuse_gate"])
    assert cap["ranking"]["fuse_gate"] == spec.fuse_gate and weights == cap["ranking"]["fuse_weights"]
    np.testing.assert_allclose(fused, cap["rank_scores"], rtol=1e-5, atol=1e-5)
    # benchmarks/bench_rank_rule.py reads the same file the same way: the run is recognised as the default rule
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from bench_rank_rule import rank_rules

    rules, ids, facts = rank_rules(out)
    assert facts["made_with"] == "default" and ids == run["attribution"]["train_ids"]
    np.testing.assert_allclose(rules["per item, then mean, + 0.5 x whole row (default)"], fused, rtol=1e-6, atol=1e-6)
    for before in ("per item, then mean (before 2026-12-06)", "min of the items' mean (before 2026-12-02)"):
        assert not np.allclose(rules[before], fused)  # the rules differ on this world
    # each drill-down opens with the sentence the row blames (both read the item-specific score), and its list is
    # in that score's order
    assert cap["drilldown"]
    for d in cap["drilldown"]:
        top = d["top_sentence"]
        assert cap["row_sentences"][ids.index(d["id"])] == [top["char_start"], top["char_end"]]
        assert [x["score"] for x in d["sentences"]] == sorted(x["score"] for x in d["sentences"])
    # and benchmarks/bench_fusion.py re-forms the run's own fusion set from run.json alone
    from bench_fusion import fusions

    sets, fids = fusions(out)
    assert fids == ids
    np.testing.assert_allclose(sets["bm25 + repsim"][0], cap["rank_scores"], rtol=1e-5, atol=1e-5)
    assert sets["bm25 + repsim"][1] == weights and sets["bm25"][1] == {"bm25": weights["bm25"]}
    # a later run into the same folder without the flag does not leave matrices that no longer match
    attribute_run(inputs, specs(), out, index_root=real["run_dir"] / "index")
    assert not (out / "evidence.safetensors").exists() and (out / "run.json").exists()
