"""Verdicts on capability deltas, and the base bounds on later data verdicts.

Verdict (per capability, from the paired-bootstrap CI [lo, hi] of Δ = mean(tuned) − mean(reference)):

* n < ``min_items``      → ``within_noise``, not diagnosed (too few items for a CI);
* lo ≤ 0 ≤ hi            → ``within_noise``: the delta is reported and explicitly **not diagnosed**;
* hi < 0                 → ``regressed``: diagnosed, its lost items go to attribution;
* lo > 0                 → ``improved``: nothing to attribute.

Base bounds (confidence qualifiers on any later data verdict; never a claim about
the base model's training):

* **base also fails**: items the reference fails. No capability was lost on them,
  so no training example explains them; they are excluded from attribution.
* **low base score**: the reference pass rate on the capability is below
  ``low_base_threshold`` (default 0.5): there was little there to lose.
* **thin margin**: for a failing item (reference passes, tuned fails) the base
  preference margin m = log p_base(correct, in the model's own words: see
  :class:`~gradian.evaluate.result.Margin`) − log p_base(what the tuned model
  now says), in nats; m < ``thin_margin_nats`` (default 1) means the base held
  the capability so weakly that almost any fine-tune would have tipped it.
  Reported as a count and share of the failing items.
* With the ``loglik`` metric there is no generation, so no margin and no
  contrastive query: the query falls back to cross-entropy on the correct answer
  (:data:`LOGLIK_QUERY_NOTE`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Sequence

VERDICTS = ("regressed", "improved", "within_noise")

LOGLIK_QUERY_NOTE = (
    "loglik metric: no text is generated, so there is no 'what the model said' to subtract and the "
    "attribution query falls back to plain cross-entropy on the correct answer. That is weaker: for a "
    "substitution failure, cross-entropy on the correct answer gets the sign backwards, because what a "
    "fine-tune mostly teaches is answer format, which lowers the loss on the right answer too, so the "
    "harmful examples can rank as the most helpful ones; the contrastive query "
    "(correct answer minus what the model said) cancels that shared direction. "
    "Use exact_match or contains for factual capabilities."
)


def decide(n: int, low: float, high: float, *, min_items: int, confidence: float) -> tuple[str, bool, str]:
    """The verdict on one capability.

    Returns:
        ``(verdict, diagnosed, reason)``; ``diagnosed`` is True only for ``regressed``.
    """
    pct = f"{confidence * 100:g}%"
    ci = f"{pct} CI [{low:+.3f}, {high:+.3f}]"
    if n < min_items:
        return (
            "within_noise",
            False,
            f"only {n} item(s) (< {min_items}): too few for a bootstrap CI; not diagnosed",
        )
    if low <= 0.0 <= high:
        return "within_noise", False, f"{ci} includes zero: within noise, not diagnosed"
    if high < 0.0:
        return "regressed", True, f"{ci} excludes zero: regressed"
    return "improved", False, f"{ci} excludes zero: improved; nothing to attribute"


@dataclass
class BaseBounds:
    """Confidence qualifiers on a later data verdict for one capability.

    Attributes:
        base_fails: items the reference (base, or the reference adapter) fails.
        base_fail_share: ``base_fails / n``.
        base_score: the reference pass rate.
        low_base: ``base_score < low_base_threshold``.
        low_base_threshold: the threshold used.
        failing: items the reference passes and the tuned model fails (the lost items).
        margins_available: whether margins exist (False for ``loglik``).
        thin_margin: failing items with margin < ``thin_margin_nats``.
        thin_margin_share: ``thin_margin / failing`` (None without failing items or margins).
        thin_margin_nats: the threshold used.
        median_margin: median margin over the failing items (nats), or None.
        query: ``"contrastive"`` (generative metrics) or ``"cross_entropy"`` (loglik).
        qualifiers: human-readable sentences, one per qualifier that applies.
    """

    base_fails: int
    base_fail_share: float
    base_score: float
    low_base: bool
    low_base_threshold: float
    failing: int
    margins_available: bool
    thin_margin: int
    thin_margin_share: float | None
    thin_margin_nats: float
    median_margin: float | None
    query: str
    qualifiers: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__, qualifiers=list(self.qualifiers))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BaseBounds:
        return cls(**d)


def base_bounds(
    *,
    n: int,
    reference_passed: Sequence[bool],
    tuned_passed: Sequence[bool],
    margins: Sequence[float | None],
    generative: bool,
    low_base_threshold: float,
    thin_margin_nats: float,
) -> BaseBounds:
    """Compute the base bounds of one capability.

    Args:
        reference_passed, tuned_passed: (n,) pass/fail per item.
        margins: (n,) base preference margin per item (nats), None where not computed.
        generative: the metric generates text (exact_match / contains).
    """
    ref = list(reference_passed)
    tun = list(tuned_passed)
    base_fails = sum(1 for r in ref if not r)
    base_score = (n - base_fails) / n if n else 0.0
    lost = [i for i in range(n) if ref[i] and not tun[i]]
    lost_margins = [margins[i] for i in lost if margins[i] is not None]
    thin = sum(1 for m in lost_margins if m < thin_margin_nats)
    thin_share = thin / len(lost_margins) if lost_margins else None
    median = float(statistics.median(lost_margins)) if lost_margins else None
    low = base_score < low_base_threshold
    q: list[str] = []
    if base_fails:
        q.append(
            f"the base also fails {base_fails}/{n} items: no capability was lost on them, "
            "so they are excluded from attribution"
        )
    if low:
        # a loglik item passes when its answer is the reference's greedy continuation: the score is that share
        what = "" if generative else ", the share of items whose answer is the greedy continuation"
        q.append(f"low base score {base_score:.2f} (< {low_base_threshold:g}{what}): there was little there to lose")
    if generative and thin:
        q.append(
            f"{thin}/{len(lost_margins)} failing items have a base preference margin below "
            f"{thin_margin_nats:g} nat: the capability was held too weakly to blame the data for them"
        )
    if not generative:
        q.append(LOGLIK_QUERY_NOTE)
    return BaseBounds(
        base_fails=base_fails,
        base_fail_share=base_fails / n if n else 0.0,
        base_score=base_score,
        low_base=low,
        low_base_threshold=low_base_threshold,
        failing=len(lost),
        margins_available=generative,
        thin_margin=thin,
        thin_margin_share=thin_share,
        thin_margin_nats=thin_margin_nats,
        median_margin=None if median is None or math.isnan(median) else median,
        query="contrastive" if generative else "cross_entropy",
        qualifiers=q,
    )
