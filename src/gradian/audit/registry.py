"""The one registry of Audit checks.

A check is a function ``fn(ctx) -> list[Hit]`` decorated with :func:`check`,
which records its stable id, title, the inputs it needs (``requires``: the
check is skipped, with the reason, when one is missing), the inputs it reads
(``reads``, a superset of ``requires``), the rule with its threshold, the fix,
the source that backs it, and its fix-first ``rank``.

A check returns :class:`Hit` objects (severity, message, evidence, affected
ids); the runner turns them into :class:`gradian.audit.model.Finding`. A
check that does not apply to the given run raises :class:`NotApplicable`
(recorded as skipped, with the reason). A check whose rule holds for some training
stages only declares them (``stages``); for a run of another stage (a DPO run, a
continued-pretraining run, from :attr:`gradian.audit.config.TrainConfig.stage_kind`)
the runner skips it with the reason.

Fix-first ranks (lower = fix first; findings sort by severity, then rank):

=====  ===================================================================
  10   the rows cannot be read as meant (format, fields, roles, empty targets)
  20   what the model is trained on is wrong (masks, truncation, EOS, template)
  30   evaluation is not trustworthy (contamination, no eval split)
  40   the data teaches the wrong thing (duplicates, conflicts, noise)
  50   the optimisation is mis-set (lr, epochs, steps, warmup, LoRA shape)
  60   secondary config risks (precision, attention, eval plumbing)
  70   symptoms in the logs (usually consequences of the above)
=====  ===================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from gradian.audit.model import INPUTS, SEVERITIES

if TYPE_CHECKING:  # pragma: no cover
    from gradian.audit.context import AuditContext


#: Training-stage kinds (:attr:`gradian.audit.config.TrainConfig.stage_kind`); "other" is any stage Gradian
#: does not classify.
STAGE_KINDS = ("sft", "pretraining", "preference", "rl", "other")
_STAGE_WORDS = {
    "sft": "SFT",
    "pretraining": "continued pretraining",
    "preference": "preference tuning (DPO, KTO, ORPO, reward models)",
    "rl": "online RL (PPO, GRPO)",
    "other": "other stages",
}


def stage_words(kinds: tuple[str, ...]) -> str:
    """``("sft", "pretraining")`` -> ``"SFT and continued pretraining"``."""
    words = [_STAGE_WORDS[k] for k in kinds]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


class NotApplicable(Exception):
    """Raised by a check that does not apply to this run; the message is the reason."""


@dataclass
class Hit:
    """What a check reports; the runner adds the check's id, title, reads and default fix."""

    severity: str
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    row_ids: list[str] = field(default_factory=list)
    eval_row_ids: list[str] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    fix: str | None = None

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")


@dataclass(frozen=True)
class CheckSpec:
    """One registered check.

    Attributes:
        id: stable id, e.g. ``"D04"`` (D = data, C = config, T = tokenizer/template, L = logs).
        name: short snake_case name, e.g. ``"truncated"``.
        title: one-line title.
        requires: inputs that must be given, else the check is skipped.
        reads: every input the check reads (``requires`` plus optional ones).
        severity: the worst severity the check can raise.
        rule: the rule and its thresholds, in words.
        fix: the default fix.
        source: where the failure and the threshold come from (**H** = heuristic).
        rank: fix-first rank (see module docstring).
        fn: ``fn(ctx) -> list[Hit]``.
        stages: the training-stage kinds the rule holds for (default: all).
        preference: the check reads preference rows (:mod:`gradian.data.preference`); a check that requires
            ``data`` and is not marked is skipped as not applicable when the training rows are preference rows.
    """

    id: str
    name: str
    title: str
    requires: tuple[str, ...]
    reads: tuple[str, ...]
    severity: str
    rule: str
    fix: str
    source: str
    rank: int
    fn: Callable[[AuditContext], list[Hit]] = field(repr=False, compare=False)
    module: str = ""
    stages: tuple[str, ...] = STAGE_KINDS
    preference: bool = False

    @property
    def group(self) -> str:
        return {"D": "data", "C": "config", "T": "tokenizer/template", "L": "logs"}[self.id[0]]


REGISTRY: dict[str, CheckSpec] = {}


def check(
    id: str,
    name: str,
    title: str,
    *,
    requires: tuple[str, ...],
    reads: tuple[str, ...] = (),
    severity: str,
    rule: str,
    fix: str,
    source: str,
    rank: int,
    stages: tuple[str, ...] = STAGE_KINDS,
    preference: bool = False,
):
    """Register a check function (see module docstring)."""

    def deco(fn: Callable[[AuditContext], list[Hit]]):
        if id in REGISTRY:
            raise ValueError(f"duplicate check id {id}")
        all_reads = tuple(i for i in INPUTS if i in set(requires) | set(reads))
        for i in all_reads:
            if i not in INPUTS:
                raise ValueError(f"{id}: unknown input {i}")
        if severity not in SEVERITIES:
            raise ValueError(f"{id}: unknown severity {severity}")
        if not stages or any(k not in STAGE_KINDS for k in stages):
            raise ValueError(f"{id}: unknown stage kind in {stages}")
        REGISTRY[id] = CheckSpec(
            id=id,
            name=name,
            title=title,
            requires=tuple(requires),
            reads=all_reads,
            severity=severity,
            rule=rule,
            fix=fix,
            source=source,
            rank=rank,
            fn=fn,
            module=fn.__module__.rsplit(".", 1)[-1],
            stages=tuple(k for k in STAGE_KINDS if k in stages),
            preference=preference,
        )
        return fn

    return deco


def _id_key(cid: str) -> tuple[int, int]:
    return ("DCTL".index(cid[0]), int(cid[1:]))


def all_checks() -> list[CheckSpec]:
    """Every registered check, in id order (D, C, T, L); importing :mod:`gradian.audit` registered them."""
    return [REGISTRY[k] for k in sorted(REGISTRY, key=_id_key)]
