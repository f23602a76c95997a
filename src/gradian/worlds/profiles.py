"""Demo profiles: the world and training config ``gradian demo`` builds (issue 26, the demo decision).

* ``"full"``: the worked example of ``docs/worked-example.md``, exactly as ``gradian world --kind smollm2``
  writes it (:meth:`WorldSpec.default` and :func:`default_train_spec`): 276 rows, 3 epochs, about half an
  hour with an empty cache (training 608 s and the verdict 1,000 s on one thread, 2026-12-06).
  ``gradian demo --full`` / ``make demo-full``.
* ``"quick"``: ``make demo``'s default for SmolLM2 (facts world): a smaller world of its own, sized so
  that a first run with an empty cache fits 15 minutes on 2 quiet cores. It is the same generator,
  seeded the same way; only the sizes below and the training schedule change:

  ===================================  ===================  ==========================
  what                                 full (worked)        quick
  ===================================  ===================  ==========================
  candidates probed on the base        100                  40
  eval: direct / buried / untouched /  8 / 8 / 24 / 6       4 / 4 / 12 / 4
  base_fail items
  culprit rows per direct / buried     3 / 9                3 / 5
  target
  benign capitals / currency / region  60 / 30 / 25         24 / 10 / 8
  benign profiles / element symbols /  20 / 25 / 20         4 / 8 / 4
  element prose
  held-out rows (valid.jsonl)          16                   8
  sentences per long profile           8                    5
  training                             3 epochs, batch 8,   2 epochs, batch 4,
                                       lr 4e-4              lr 5e-4
  ===================================  ===================  ==========================

  That is 12 direct and 20 buried culprit rows among about 90 (35% culprits, as in the worked example).
  Two epochs leave two checkpoints, so the default verdict's trajectory has two terms instead of three,
  and every index is a third of the size. Batch 4 keeps the number of optimiser steps (46) near half
  the full run's (105) at a third of its compute; the learning rate stays at the audit lane's LoRA
  ceiling (5e-4), so the quick run's config draws no finding of its own. The knobs that
  :class:`~gradian.worlds.knobs.WorldKnobs` has (epochs, learning rate, sentences) go through
  :func:`~gradian.worlds.knobs.apply_train_knobs` / the spec; the sizes it has no knob for (eval groups,
  element rows, the probe pool) are set on the :class:`~gradian.worlds.builder.WorldSpec` directly.

The tiny world and the behaviour world have one size each: their profile is ``"full"``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gradian.errors import GradianUserError
from gradian.worlds.knobs import WorldKnobs, apply_train_knobs

PROFILES = ("quick", "full")

#: The quick profile's world sizes (fields of :class:`~gradian.worlds.builder.WorldSpec`).
QUICK_WORLD: dict[str, Any] = {
    "candidate_pool": 40,
    "n_direct": 4,
    "n_buried": 4,
    "n_untouched": 12,
    "n_base_fail": 4,
    "direct_rows": 3,
    "buried_rows": 5,
    "n_capitals": 24,
    "n_currency": 10,
    "n_region": 8,
    "n_profiles": 4,
    "n_symbols": 8,
    "n_element_prose": 4,
    "n_valid": 8,
    "profile_sentences": 5,
}
#: The quick profile's training knobs (:class:`~gradian.worlds.knobs.WorldKnobs`).
QUICK_KNOBS = WorldKnobs(epochs=2, learning_rate=5e-4)
#: Training fields the knobs do not cover (:class:`~gradian.train.TrainSpec`).
QUICK_TRAIN: dict[str, Any] = {"per_device_train_batch_size": 4}


def default_profile(kind: str, regression: str = "facts") -> str:
    """``"quick"`` for the SmolLM2 facts world (``make demo``), ``"full"`` for every other world."""
    return "quick" if kind == "smollm2" and regression == "facts" else "full"


def check_profile(profile: str, kind: str, regression: str = "facts") -> None:
    """Raise :class:`GradianUserError` for an unknown profile, or ``quick`` on a world that has no quick size."""
    if profile not in PROFILES:
        raise GradianUserError(f"unknown demo profile {profile!r}", where="--quick/--full", fix="use quick or full")
    if profile == "quick" and default_profile(kind, regression) != "quick":
        raise GradianUserError(
            f"the quick profile exists for the SmolLM2 facts world only (got --kind {kind} --regression {regression})",
            where="--quick",
            fix="leave out --quick (this world has one size) or use --kind smollm2 --regression facts",
        )


def demo_world(profile: str, kind: str, variant: str, seed: int, faults: bool = False, regression: str = "facts"):
    """``(WorldSpec, TrainSpec)`` of a demo profile; ``"full"`` is :meth:`WorldSpec.default` and its train spec."""
    from gradian.worlds.builder import WorldSpec, default_train_spec

    check_profile(profile, kind, regression)
    spec = WorldSpec.default(kind, variant, seed, faults=faults, regression=regression)
    tspec = default_train_spec(kind, seed)
    if profile == "full":
        return spec, tspec
    return replace(spec, **QUICK_WORLD), apply_train_knobs(tspec, QUICK_KNOBS).replace(**QUICK_TRAIN)
