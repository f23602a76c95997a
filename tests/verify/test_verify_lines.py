"""Honest verify lines (issue 26): what did not run is said, "verified" never hides a missing seed band,
and a recovery CI is shown within what is possible (0..100%) with the raw range beside it when clipped."""

from __future__ import annotations

import numpy as np

from gradian.report.views import verification_legend, verify_word
from gradian.verify.run import verdict_line


def _fix(recovery=0.8, ci=(0.5, 0.95)):
    return {"removed": 17, "recovery": recovery, "recovery_ci": list(ci), "score": 0.8, "delta": 0.3}


REF, TUNED = np.array([1.0, 1.0, 1.0]), np.array([0.0, 1.0, 0.0])


def test_no_seed_band_is_said_and_verified_is_qualified():
    ctrl = [{"recovery": 0.1, "delta": 0.0}]
    line = verdict_line("capitals", _fix(), ctrl, [], 0.0, True, REF, TUNED)
    assert line.startswith("verified without a seed band: removing the 17 blamed rows recovers 80%")
    assert "no seed retrain ran (--seed-band 0)" in line and "another seed" not in line
    seeds = [{"delta": 0.05}]
    line = verdict_line("capitals", _fix(), ctrl, seeds, 0.05, True, REF, TUNED)
    assert line.startswith("verified: ") and "another seed (1 retrain) moves it by up to +0.05" in line
    assert "no seed retrain" not in line
    line = verdict_line("capitals", _fix(), [], seeds, 0.05, False, REF, TUNED)
    assert line.startswith("not verified: ") and "no control retrain ran (--controls 0)" in line


def test_recovery_ci_is_clipped_and_explained():
    line = verdict_line("capitals", _fix(0.9, (0.25, 1.33)), [], [], 0.0, False, REF, TUNED)
    assert "[25%, 100%]" in line and "bootstrap range 25%..133%, clipped" in line and "133%]" not in line
    line = verdict_line("capitals", _fix(0.8, (0.5, 0.95)), [], [], 0.0, False, REF, TUNED)
    assert "[50%, 95%]" in line and "clipped" not in line
    line = verdict_line("capitals", _fix(float("nan"), (float("nan"), float("nan"))), [], [], 0.0, False, REF, TUNED)
    assert "recovers n/a" in line and "[n/a]" in line


def _record(kinds):
    return {
        "trainer": {"trainer": "gradian"},
        "retrains": {f"{k}-{i}": {"retrain": {"kind": k}} for i, k in enumerate(kinds)},
    }


def test_report_panel_names_only_the_retrains_that_ran():
    text = verification_legend(_record(["fix", "control", "control"]))
    assert "2 controls" in text and "seed" not in text.split("Not run:")[0]
    assert "Not run: no seed retrain ran (--seed-band 0)" in text
    text = verification_legend(_record(["fix", "control", "seed"]))
    assert "1 other seed" in text and "Not run" not in text
    assert verify_word({"verified": True, "seed_retrains": 0}) == "verified without a seed band"
    assert verify_word({"verified": True, "seed_retrains": 1, "line": "verified: …"}) == "verified"
    assert verify_word({"verified": False}) == "not verified"


def test_verify_tables_clip_the_recovery_ci():
    from gradian.report.views import recovery_text

    assert recovery_text(0.9, [0.25, 1.33]) == "90% [25%, 100%]*"
    assert recovery_text(0.5, [0.2, 0.7]) == "50% [20%, 70%]"
    assert recovery_text(-0.1, [-0.4, 0.2]) == "-10% [0%, 20%]*"
    assert recovery_text(float("nan"), [float("nan"), float("nan")]) == "n/a [n/a]"
