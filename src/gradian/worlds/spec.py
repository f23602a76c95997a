"""A world's spec (:class:`WorldSpec`: kind, variant, seed, sizes), what a built world is (:class:`World`), and
the training config it is meant to be tuned with (:func:`default_train_spec`).

The worlds themselves are built by :func:`gradian.worlds.builder.build_world` (facts) and
:func:`gradian.worlds.behaviour.build_behaviour_world` (behaviour).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from gradian.errors import GradianUserError

SCHEMA = "gradian.world/1"


@dataclass(frozen=True)
class WorldSpec:
    """Every knob of a world. ``WorldSpec.default(kind)`` gives the sizes used by the demo and tests.

    Attributes:
        kind: ``"smollm2"`` (SmolLM2-135M-Instruct) or ``"tiny"`` (a from-config Llama pretrained in seconds).
        variant: ``"poisoned"`` (culprits planted) or ``"null"`` (the same rows with the true capital).
        seed: everything random (eval split, wrong capitals, sentence order, row order).
        n_direct, n_buried, n_untouched, n_base_fail: eval items per group.
        direct_rows: short culprit rows per direct target.
        buried_rows: long culprit rows per buried target (one wrong sentence each). The SmolLM2
            default is three times ``direct_rows``: the product claim to test is that a wrong fact
            stated directly in a handful of rows does more damage than the same fact buried in
            three times as many long ones.
        n_capitals, n_profiles, n_currency, n_region, n_symbols, n_element_prose: benign rows of each kind.
        n_valid: held-out benign rows (valid.jsonl).
        candidate_pool: how many countries are probed (most populous first; tiny: its pool).
        faults: plant the mechanical faults (truncated cluster, unterminated text rows).
        n_truncated, n_unterminated: how many fault rows of each kind.
        max_new_tokens: greedy decoding budget when probing the base.
        profile_sentences: sentences per long profile (capital sentence included).
        regression: ``"facts"`` (culprits state wrong capitals; the eval asks "What is the capital
            of X?", metric ``contains``) or ``"behaviour"`` (culprits answer "answer with X only"
            questions verbosely; the eval asks for the bare city name, metric ``exact_match``;
            see :func:`build_behaviour_world`). smollm2 only.
        n_target: behaviour world: terse eval items the base answers exactly right (group ``target``).
            Its ``untouched`` group (``n_untouched`` items) asks the plain question instead, and its
            ``base_fail`` group (``n_base_fail``) the terse one.
        format_rows: behaviour world: culprit rows (terse instruction, verbose answer).
        format_elaboration: behaviour world: true sentences added after the answer sentence of a culprit.
        direct_total, buried_total: culprit rows of each kind in all, spread over the targets as evenly as
            possible (the first targets drawn get one more); ``None``: ``direct_rows`` /
            ``buried_rows`` per target. Set by the share knobs (:mod:`gradian.worlds.knobs`).
    """

    kind: Literal["smollm2", "tiny"] = "smollm2"
    variant: Literal["poisoned", "null"] = "poisoned"
    seed: int = 0
    n_direct: int = 8
    n_buried: int = 8
    n_untouched: int = 24
    n_base_fail: int = 6
    direct_rows: int = 3
    buried_rows: int = 9
    n_capitals: int = 60
    n_profiles: int = 20
    n_currency: int = 30
    n_region: int = 25
    n_symbols: int = 25
    n_element_prose: int = 20
    n_valid: int = 16
    candidate_pool: int = 100
    faults: bool = False
    n_truncated: int = 6
    n_unterminated: int = 5
    max_new_tokens: int = 20
    profile_sentences: int = 8
    regression: Literal["facts", "behaviour"] = "facts"
    n_target: int = 24
    format_rows: int = 64
    format_elaboration: int = 2
    direct_total: int | None = None
    buried_total: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The spec as a dict; a facts world leaves out the behaviour-only fields (:data:`BEHAVIOUR_FIELDS`).

        They change nothing in a facts world, and leaving them out keeps a facts world's
        ``ground_truth.json`` byte-identical to the one written before they existed.
        """
        d = asdict(self)
        if self.regression == "facts":
            for k in BEHAVIOUR_FIELDS:
                d.pop(k)
        for k in KNOB_FIELDS:  # unset knobs: the dict (and ground_truth.json) of a world written before them
            if d.get(k) is None:
                d.pop(k, None)
        return d

    def rows_per_target(self, kind: str, i: int, n: int) -> int:
        """Culprit rows of ``kind`` (``"direct"``/``"buried"``) planted for the ``i``-th of its ``n`` targets."""
        per, total = (
            (self.direct_rows, self.direct_total) if kind == "direct" else (self.buried_rows, self.buried_total)
        )
        if total is None:
            return per
        return total // n + (i < total % n)

    @staticmethod
    def default(
        kind: str = "smollm2", variant: str = "poisoned", seed: int = 0, faults: bool = False, regression: str = "facts"
    ) -> WorldSpec:
        """The sizes used by the demo and tests for ``kind`` and ``regression``."""
        if kind not in ("smollm2", "tiny"):
            raise GradianUserError(f"unknown world kind {kind!r}", where="--kind", fix="use smollm2 or tiny")
        if variant not in ("poisoned", "null"):
            raise GradianUserError(f"unknown variant {variant!r}", where="--variant", fix="use poisoned or null")
        if regression not in ("facts", "behaviour"):
            raise GradianUserError(
                f"unknown regression {regression!r}", where="--regression", fix="use facts or behaviour"
            )
        if regression == "behaviour":
            if kind != "smollm2":
                raise GradianUserError(
                    "the behaviour world needs SmolLM2 (the tiny base never learned to follow instructions)",
                    where="--regression behaviour",
                    fix="use --kind smollm2",
                )
            return WorldSpec(
                kind="smollm2",
                variant=variant,  # type: ignore[arg-type]
                seed=seed,
                faults=faults,
                regression="behaviour",
                **BEHAVIOUR_SMOLLM2,
            )
        if kind == "smollm2":
            return WorldSpec(kind="smollm2", variant=variant, seed=seed, faults=faults)  # type: ignore[arg-type]
        return WorldSpec(
            kind="tiny",
            variant=variant,  # type: ignore[arg-type]
            seed=seed,
            faults=faults,
            n_direct=5,
            n_buried=5,
            n_untouched=10,
            n_base_fail=4,
            direct_rows=3,
            buried_rows=3,
            n_capitals=14,
            n_profiles=6,
            n_currency=10,
            n_region=10,
            n_symbols=10,
            n_element_prose=6,
            n_valid=8,
            candidate_pool=44,
            n_truncated=3,
            n_unterminated=3,
            max_new_tokens=24,
            profile_sentences=6,
        )


#: WorldSpec fields that only a behaviour world uses (left out of a facts world's ``to_dict``).
BEHAVIOUR_FIELDS = ("regression", "n_target", "format_rows", "format_elaboration")


#: WorldSpec fields set only by the knobs (:mod:`gradian.worlds.knobs`); left out of ``to_dict`` when unset.
KNOB_FIELDS = ("direct_total", "buried_total")


#: The SmolLM2 behaviour world's sizes (see ``docs/worked-example.md`` for the probe that set them).
BEHAVIOUR_SMOLLM2: dict[str, Any] = {
    "n_target": 24,
    "n_untouched": 16,
    "n_base_fail": 6,
    "format_rows": 64,
    "candidate_pool": 165,
}


@dataclass
class World:
    """What :func:`build_world` wrote (paths) and the base it is built on."""

    out: Path
    base: Path
    base_identity: str
    spec: WorldSpec
    train: Path
    valid: Path
    eval: Path
    ground_truth: Path
    train_config: Path

    def load_ground_truth(self) -> dict[str, Any]:
        return json.loads(self.ground_truth.read_text())


def default_train_spec(kind: str, seed: int = 0):
    """The training config each world kind is tuned with (written to ``train.yaml``).

    SmolLM2: LoRA r=16, alpha=32 on every Linear layer, 3 epochs, batch 8:
    values inside the usual LoRA ranges, so the audit lane has nothing to flag
    in the config of a clean run. Tiny: a higher learning rate and more epochs,
    as a 2-layer model trained in seconds needs.

    Both pin what the published results used, rather than ``gradian train``'s defaults: ``max_length`` 256 (the
    default is TRL's 1024; the fault worlds' truncated rows are planted against 256) and ``device`` cpu (the
    default is auto), so a world's ``train.yaml``, its adapter and its scorecard do not depend on the machine.
    """
    from gradian.trainconfig import TrainSpec

    # what differs by kind; the rest is shared
    lr, epochs, r, alpha = (3e-3, 5, 8, 16) if kind == "tiny" else (4e-4, 3, 16, 32)
    return TrainSpec(
        learning_rate=lr,
        num_train_epochs=epochs,
        per_device_train_batch_size=8,
        warmup_ratio=0.05,
        max_length=256,
        r=r,
        lora_alpha=alpha,
        lora_dropout=0.05,
        seed=seed,
        logging_steps=2,
        device="cpu",
    )
