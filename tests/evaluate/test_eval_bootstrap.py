"""Paired bootstrap: coverage of a known effect, nominal coverage under the null, verdicts, base bounds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gradian.errors import GradianUserError
from gradian.evaluate import EvalSpec, ItemResult, ModelAnswer, paired_bootstrap, sign_test_p, summarise
from gradian.evaluate.bootstrap import bootstrap_means
from gradian.evaluate.result import Margin
from gradian.evaluate.verdict import base_bounds, decide


def _paired_binary(rng, n, p_ref, p_lost, p_gained):
    """Reference 0/1 scores with pass rate p_ref; tuned loses a pass w.p. p_lost, gains a fail w.p. p_gained."""
    ref = (rng.random(n) < p_ref).astype(float)
    u = rng.random(n)
    tuned = np.where(ref == 1, (u >= p_lost).astype(float), (u < p_gained).astype(float))
    return ref, tuned


def _tolerance(p: float, trials: int, z: float = 3.0) -> float:
    return z * math.sqrt(p * (1 - p) / trials)


def test_null_effect_ci_includes_zero_at_nominal_rate():
    """Under a null effect (P(lost) = P(gained)), the 95% CI includes 0 in ~95% of 200 data sets."""
    trials, n = 200, 100
    hits = 0
    for s in range(trials):
        rng = np.random.default_rng(10_000 + s)
        # symmetric flips: E[tuned - ref] = 0.6*(-0.2) + 0.4*(0.3) = 0
        ref, tuned = _paired_binary(rng, n, p_ref=0.6, p_lost=0.2, p_gained=0.3)
        ci = paired_bootstrap(ref, tuned, resamples=2000, seed=s)
        hits += ci.includes_zero
    rate = hits / trials
    assert abs(rate - 0.95) <= _tolerance(0.95, trials), rate


def test_ci_covers_a_known_effect():
    """With a true delta of -0.3, the CI covers -0.3 at ~95% and excludes 0 every time."""
    trials, n = 200, 100
    true_delta = 0.8 * (-0.4) + 0.2 * 0.1  # = -0.30
    covered = excluded_zero = 0
    for s in range(trials):
        rng = np.random.default_rng(20_000 + s)
        ref, tuned = _paired_binary(rng, n, p_ref=0.8, p_lost=0.4, p_gained=0.1)
        ci = paired_bootstrap(ref, tuned, resamples=2000, seed=s)
        covered += ci.low <= true_delta <= ci.high
        excluded_zero += ci.high < 0
    assert abs(covered / trials - 0.95) <= _tolerance(0.95, trials), covered
    assert excluded_zero == trials


def test_bootstrap_is_seeded_and_chunking_does_not_change_it():
    rng = np.random.default_rng(0)
    d = rng.normal(size=37)
    a = bootstrap_means(d, 5000, seed=3)
    b = bootstrap_means(d, 5000, seed=3, chunk_elems=100)  # many small chunks, same stream
    assert np.array_equal(a, b)
    assert not np.array_equal(a, bootstrap_means(d, 5000, seed=4))
    # the replicates are means of resamples of d: centred on mean(d), spread ~ sd/sqrt(n)
    assert abs(a.mean() - d.mean()) < 0.02
    assert abs(a.std() - d.std() / math.sqrt(len(d))) < 0.02
    ci1 = paired_bootstrap(np.zeros(37), d, seed=3)
    assert ci1 == paired_bootstrap(np.zeros(37), d, seed=3)
    assert ci1.low < ci1.delta < ci1.high and ci1.delta == pytest.approx(d.mean())


def test_degenerate_and_shape_errors():
    ci = paired_bootstrap(np.ones(12), np.ones(12), resamples=1000)
    assert (ci.low, ci.high, ci.delta) == (0.0, 0.0, 0.0) and ci.includes_zero
    ci = paired_bootstrap(np.ones(12), np.zeros(12), resamples=1000)
    assert (ci.low, ci.high) == (-1.0, -1.0)
    with pytest.raises(ValueError):
        paired_bootstrap(np.ones(3), np.ones(4))


def test_sign_test_matches_exact_binomial():
    ref = np.array([1, 1, 1, 1, 1, 0, 0, 1.0])
    tuned = np.array([0, 0, 0, 0, 0, 0, 0, 1.0])
    assert sign_test_p(ref, tuned) == pytest.approx(2 * 0.5**5)  # 5 of 5 discordant pairs go one way
    assert sign_test_p(ref, ref) == 1.0


@pytest.mark.parametrize(
    "n,low,high,verdict,diagnosed,phrase",
    [
        (40, -0.30, -0.05, "regressed", True, "excludes zero: regressed"),
        (40, 0.05, 0.30, "improved", False, "nothing to attribute"),
        (40, -0.20, 0.05, "within_noise", False, "includes zero: within noise, not diagnosed"),
        (40, -0.20, 0.0, "within_noise", False, "includes zero"),  # touching zero counts as including it
        (40, 0.0, 0.0, "within_noise", False, "includes zero"),
        (5, -1.0, -1.0, "within_noise", False, "too few for a bootstrap CI; not diagnosed"),
    ],
)
def test_verdict_rules(n, low, high, verdict, diagnosed, phrase):
    v, d, reason = decide(n, low, high, min_items=10, confidence=0.95)
    assert (v, d) == (verdict, diagnosed) and phrase in reason


def test_base_bounds_numbers():
    ref = [True] * 6 + [False] * 4
    tuned = [False, False, False, False, True, True, False, False, True, False]
    margins = [0.5, 2.0, 0.9, 3.0, None, None, -1.0, 0.2, None, 5.0]
    b = base_bounds(
        n=10,
        reference_passed=ref,
        tuned_passed=tuned,
        margins=margins,
        generative=True,
        low_base_threshold=0.5,
        thin_margin_nats=1.0,
    )
    assert b.base_fails == 4 and b.base_fail_share == 0.4 and b.base_score == 0.6 and not b.low_base
    assert b.failing == 4  # items 0..3: reference passes, tuned fails
    assert b.thin_margin == 2 and b.thin_margin_share == 0.5  # 0.5 and 0.9 < 1 nat; 2.0 and 3.0 are not
    assert b.median_margin == pytest.approx(1.45)
    assert b.query == "contrastive"
    assert any("base also fails 4/10" in q for q in b.qualifiers)
    assert any("2/4 failing items have a base preference margin below 1 nat" in q for q in b.qualifiers)
    low = base_bounds(
        n=10,
        reference_passed=[True] * 4 + [False] * 6,
        tuned_passed=[False] * 10,
        margins=[None] * 10,
        generative=False,
        low_base_threshold=0.5,
        thin_margin_nats=1.0,
    )
    assert low.low_base and low.base_score == 0.4 and low.query == "cross_entropy"
    assert not low.margins_available and low.thin_margin_share is None
    assert any("cross-entropy on the correct answer" in q and "sign backwards" in q for q in low.qualifiers)
    # a loglik capability's score is in nats: the low-base line says which rate it means
    assert any(
        q.startswith("low base score 0.40 (< 0.5, the share of items whose answer is the greedy")
        for q in low.qualifiers
    )


def _item(i, cap, r, t, metric="exact_match", margin=None):
    status = {(1, 1): "kept", (1, 0): "lost", (0, 1): "gained", (0, 0): "both_fail"}[(r, t)]
    m = Margin(margin, "a", "reference", -1.0, -1.0 - margin, 2, 2, margin, -1.0, 2) if margin is not None else None
    return ItemResult(
        id=f"{cap}-{i}",
        row=i,
        capability=cap,
        metric=metric,
        prompt="q",
        model_prompt="q",
        answer="a",
        aliases=[],
        reference=ModelAnswer(float(r), bool(r), "a" if r else "b", "a" if r else "b", True),
        tuned=ModelAnswer(float(t), bool(t), "a" if t else "b", "a" if t else "b", True),
        status=status,
        base_margin=m,
    )


def test_summarise_and_failing_items():
    from gradian.evaluate import EvalResult

    spec = EvalSpec(resamples=2000)
    # "lost": 12 of 20 items flip from pass to fail, 2 thin margins; "same": identical scores
    items = [_item(i, "lost", 1, 0, margin=0.5 if i < 2 else 4.0) for i in range(12)]
    items += [_item(i, "lost", 1, 1) for i in range(12, 18)] + [_item(i, "lost", 0, 0, margin=2.0) for i in (18, 19)]
    items += [_item(i, "same", i % 2, i % 2) for i in range(20)]
    caps = {c.name: c for c in summarise(items, spec)}
    lost, same = caps["lost"], caps["same"]
    assert lost.verdict == "regressed" and lost.diagnosed and lost.ci_high < 0
    assert lost.reference_score == 0.9 and lost.tuned_score == 0.3 and lost.delta == pytest.approx(-0.6)
    assert (lost.n_kept, lost.n_lost, lost.n_gained, lost.n_both_fail) == (6, 12, 0, 2)
    assert lost.base_bounds.thin_margin == 2 and lost.base_bounds.failing == 12
    assert same.verdict == "within_noise" and not same.diagnosed and "not diagnosed" in same.reason
    res = EvalResult(spec=spec, reference={"kind": "base"}, capabilities=list(caps.values()), items=items)
    fails = res.failing_items()
    assert [f.id for f in fails] == [f"lost-{i}" for i in range(12)]  # both_fail items are excluded
    assert [f.thin_margin for f in fails[:3]] == [True, True, False]
    assert res.failing_items("same") == []  # within noise: nothing to attribute
    assert len(res.failing_items("same", include_undiagnosed=True)) == 0
    with pytest.raises(KeyError):
        res.failing_items("nope")
    round_trip = EvalResult.from_dict(res.to_dict())
    assert round_trip.to_dict() == res.to_dict()


def test_spec_validation_and_manifest_dict():
    with pytest.raises(GradianUserError, match="resamples must be at least 1000"):
        EvalSpec(resamples=999)
    with pytest.raises(GradianUserError, match="max_new_tokens"):
        EvalSpec(max_new_tokens=0)
    d = EvalSpec().to_dict()
    assert d["resamples"] >= 1000 and d["confidence"] == 0.95 and d["normalize"]["first_line"] is True
    assert EvalSpec.from_dict(d) == EvalSpec()
