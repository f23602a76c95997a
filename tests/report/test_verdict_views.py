"""The report's view of a verdict (issue 26): a long row shown around its harmful sentence, and an older
run (no verdict scores recorded) read on the same scale."""

from __future__ import annotations

import copy

import pytest
from report_world import real_run

from gradian.report import build_report
from gradian.report.builders import excerpt
from gradian.sign import SENTENCE_CONTEXT_SHOWN, verdict_scores


def test_a_long_row_is_shown_around_its_harmful_sentence():
    words = " ".join(f"word{i}" for i in range(40))
    text = f"{words} The capital of Peru is Caracas. {words}"
    a = text.index("The capital")
    b = a + len("The capital of Peru is Caracas.")
    x = excerpt(text[:600], {"text": text[a:b], "char_start": a, "char_end": b})  # an older run: no context stored
    assert x["sentence"] == "The capital of Peru is Caracas."  # whole, never cut to "…"
    assert x["cut_before"] and x["cut_after"]
    assert 0 < len(x["before"]) <= SENTENCE_CONTEXT_SHOWN and x["before"].startswith("word")
    assert 0 < len(x["after"]) <= SENTENCE_CONTEXT_SHOWN and text[b:].startswith(x["after"])
    assert text[:a].endswith(x["before"])
    # a row without a blamed sentence is cut at the width, and says so
    y = excerpt(text, None, width=50)
    assert y["sentence"] is None and len(y["before"]) == 49 and y["cut_after"]
    # a short row is shown whole
    z = excerpt("A. B.", {"text": "B.", "char_start": 3, "char_end": 5, "context_before": "A. ", "context_after": ""})
    assert (z["before"], z["sentence"], z["after"], z["cut_before"], z["cut_after"]) == ("A. ", "B.", "", False, False)


def test_an_older_run_reads_on_the_same_scale():
    run = copy.deepcopy(real_run()["run"])
    new = build_report(copy.deepcopy(run))
    for cap in run["attribution"]["capabilities"]:  # as a run written before the verdict scale was recorded
        cap.pop("verdict_scores", None)
        for r in cap["ranked"]:
            r.pop("verdict_score", None)
        for d in cap["drilldown"]:
            d.pop("verdict_score", None)
            for s in d["sentences"]:
                s.pop("verdict_score", None)
    old = build_report(run)
    a_new, a_old = new.capability("capitals").attribution, old.capability("capitals").attribution
    cap = next(c for c in run["attribution"]["capabilities"] if c["capability"] == "capitals")
    assert [r["verdict_score"] for r in a_old.ranked] == pytest.approx([r["verdict_score"] for r in a_new.ranked])
    assert [p[1] for p in a_old.profile.points] == pytest.approx(sorted(verdict_scores(cap["rank_scores"]).tolist()))
    for d_old, d_new in zip(a_old.drilldown, a_new.drilldown):
        assert d_old.verdict_score == pytest.approx(d_new.verdict_score)
        assert [s["verdict_score"] for s in d_old.sentences] == pytest.approx(
            [s["verdict_score"] for s in d_new.sentences]
        )
    assert [c.label for c in a_old.clusters] == [c.label for c in a_new.clusters]
    assert a_old.blamed == a_new.blamed
