"""``--weakened NATS``: items the tuned model still passes but holds less firmly join the lost ones as queries."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))

from report_world import VISITS, real_run  # noqa: E402


def test_weakened_items_are_queried_after_the_lost_ones_and_averaged_with_them(tmp_path):
    from report_world import MAX_LENGTH
    from safetensors.numpy import load_file

    from gradian.attribute import AttributeSpec
    from gradian.attribute.ranking import robust_scale
    from gradian.attribute.run import RunInputs, RunSpecs, attribute_run
    from gradian.data.spans import SentenceUnit, row_min
    from gradian.data.tokenize import TokenizeSpec
    from gradian.evaluate import EvalResult, EvalSpec, contains
    from gradian.index.store import GradSpec
    from gradian.models.load import ModelSpec

    real = real_run()
    w = real["world"]
    base_run = real["run"]
    ev = EvalResult.from_dict(base_run["evaluation"])
    cap0 = base_run["attribution"]["capabilities"][0]
    c = cap0["capability"]
    shifts = sorted(it.shift.nats for it in ev.items if it.shift is not None and it.capability == c)
    assert shifts, "the world's regressed capability keeps some items"
    tau = -shifts[len(shifts) // 2]  # about half of the kept items are weakened by more than tau
    inputs = RunInputs(str(w["base"]), w["adapter"], w["data"], w["eval"], configs=(w["config"],), logs=w["logs"])
    specs = RunSpecs(
        model=ModelSpec(str(w["base"])),
        grad=GradSpec(tokenize=TokenizeSpec(max_length=MAX_LENGTH)),
        # (the drill-down's own weakened items stay off: this test counts the ranked ones in the report)
        attribute=AttributeSpec(top_k=10, drilldown_rows=6, weakened_nats=tau, drill_weakened_nats=None, visits=VISITS),
        eval=EvalSpec(resamples=2000, max_new_tokens=12, max_length=MAX_LENGTH),
    )
    out = tmp_path / "run"
    run = attribute_run(inputs, specs, out, index_root=real["run_dir"] / "index", save_evidence=True)
    assert run["manifest"]["identity"]["specs"]["attribute"]["weakened_nats"] == tau
    cap = run["attribution"]["capabilities"][0]
    lost = [q["item_id"] for q in cap0["queries"]]
    weak = [it for it in ev.items if it.capability == c and it.shift is not None and it.shift.nats < -tau]
    assert weak
    # each weakened item is queried against its rival, the nearest wrong answer, or not at all
    fi = {f["id"]: f for f in cap["failing_items"]}
    queried = [q["item_id"] for q in cap["queries"]]
    assert queried[: len(lost)] == lost and set(queried[len(lost) :]) <= {it.id for it in weak}
    assert len(queried) > len(lost), "this world's weakened items have rivals"
    assert [fi[i]["kind"] for i in queried] == ["lost"] * len(lost) + ["weakened"] * (len(queried) - len(lost))
    for q in cap["queries"][len(lost) :]:
        it = next(x for x in ev.items if x.id == q["item_id"])
        f = fi[q["item_id"]]
        assert q["kind"] == "contrastive" and q["said"] == f["rival"] and f["shift_nats"] == it.shift.nats
        assert not contains(f["rival"], it.aliases + [it.answer]) and contains(it.tuned.answer, [it.answer])
    # the lost items' rows of the score matrices, then the weakened ones'; the verdict averages all of them
    T = load_file(str(out / "evidence.safetensors"))
    n, m = cap["n_train"], len(queried)
    assert T[f"{c}/datainf/unit_cosine"].shape[0] == m and T[f"{c}/bm25"].shape == (m, n)
    units = [
        SentenceUnit(int(r), None if a < 0 else int(a), None if b < 0 else int(b), 0, int(s))
        for r, a, b, s in zip(T["units/row"], T["units/char_start"], T["units/char_end"], T["units/n_supervised"])
    ]
    per_item, _ = row_min(T[f"{c}/datainf/unit_cosine"], units, n)  # (m, n): every queried item, lost or weakened
    u, whole = per_item.mean(0), T[f"{c}/datainf/cosine"].mean(0)
    rows = u / robust_scale(u) + AttributeSpec().row_weight * whole / robust_scale(whole)
    np.testing.assert_allclose(rows, cap["evidence"]["gradient"]["scores"], rtol=1e-5, atol=1e-6)
    # the report names them as what they are
    from gradian.report import build_report, render_markdown

    md = render_markdown(build_report(run))
    assert md.count("still passes; weakened") == m - len(lost)


def test_a_reference_averages_only_the_queries_with_a_wrong_answer():
    from gradian.attribute.pipeline import reference_items
    from gradian.attribute.queries import Query

    def q(said):
        return Query("i", "c", "p", "right", said, "contrastive" if said else "cross_entropy")

    assert reference_items([q("wrong"), q(None), q("other")]).tolist() == [True, False, True]
    assert reference_items([q(None), q(None)]).tolist() == [True, True]  # loglik: all cross-entropy, all kept


def test_the_rival_is_found_at_the_answers_first_token():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from gradian.attribute.rival import _answer_token

    vocab = {w: i for i, w in enumerate(["[UNK]", "The", "capital", "is", "Par", "is_", "Paris", "."])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]")
    ids, t = _answer_token(tok, "The capital is Paris .", ["paris"])
    assert tok.convert_ids_to_tokens(ids)[t] == "Paris" and t == 3
    assert _answer_token(tok, "The capital is .", ["Paris"]) is None


def test_a_negative_threshold_is_a_one_line_error():
    from gradian.attribute import AttributeSpec
    from gradian.errors import GradianUserError

    with pytest.raises(GradianUserError, match="--weakened"):
        AttributeSpec(weakened_nats=-1.0)


def test_a_rival_must_be_a_substitution_of_the_answer():
    from gradian.attribute.rival import _substitution

    said = "The capital of Brazil is Brasília."
    assert _substitution(said, "The capital of Brazil is Lima.", "Brasília")
    assert _substitution(said, "The capital of Brazil is Rio de Janeiro.", "Brasília")
    assert not _substitution(said, "The capital of Brazil is a country in Eastern Asia, part of Asia.", "Brasília")
    assert not _substitution(said, "A capital of Brazil is Lima.", "Brasília")  # two runs differ
