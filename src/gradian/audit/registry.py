"""The one registry of Audit checks.

A check is a function ``fn(ctx) -> list[Hit]`` decorated with :func:`check`,
which records its stable id, the inputs it needs (``requires``: the check is
skipped, with the reason, when one is missing), the inputs it reads (``reads``,
a superset of ``requires``), its worst severity and its fix-first ``rank``. The
function's name is the check's name, and its docstring is the check's
documentation, read into the registry (:func:`doc_fields`)::

    @check("C10", requires=("tokenizer",), reads=("config",), severity="error", rank=20)
    def pad_is_eos(ctx: AuditContext) -> list[Hit]:

with the docstring::

    Pad token is EOS and the collator masks pads.

    Rule: pad id == EOS id ... with a collator that masks labels by pad id: error

    Fix: give the tokenizer a separate pad token

    Source: trl#1623

The summary line (less its period) is the title; the paragraphs that begin
``Rule:``, ``Fix:`` and ``Source:`` are the rule with its thresholds, the
default fix and what backs it, each joined onto one line. ``{NAME}`` or
``{NAME:spec}`` in them is the module constant ``NAME`` formatted with
``spec`` (``{LORA_LR_LOW:g}``), so a threshold is written once. Any other
paragraph is a note for the reader.

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

import inspect
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from gradian.audit.model import INPUTS, SEVERITIES

if TYPE_CHECKING:  # pragma: no cover
    from gradian.audit.context import AuditContext


#: Training-stage kinds (:attr:`gradian.audit.config.TrainConfig.stage_kind`); "other" is any stage Gradian
#: does not classify.
STAGE_KINDS = ("sft", "pretraining", "preference", "rl", "other")
#: a check's fix-first rank: what a finding of that rank spoils (lower is fixed first)
RANK_NAMES = {
    10: "rows unreadable as meant",
    20: "wrong training signal",
    30: "untrustworthy evaluation",
    40: "data teaches the wrong thing",
    50: "optimisation mis-set",
    60: "secondary config risks",
    70: "symptoms in the logs",
}
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


#: The docstring paragraphs :func:`check` reads, and the :class:`CheckSpec` field each fills.
DOC_FIELDS = {"Rule": "rule", "Fix": "fix", "Source": "source"}
_CONSTANT = re.compile(r"\{([A-Za-z_]\w*)(?::([^{}]*))?\}")


def doc_fields(fn: Callable[..., Any]) -> dict[str, str]:
    """A check's title, rule, fix and source, from its docstring (see module docstring).

    Raises:
        ValueError: the docstring has no summary line ending in a period, misses a field or repeats one, or
            names a constant the module does not define.
    """
    where = f"{fn.__module__}.{fn.__name__}"
    paras = [" ".join(p.split("\n")) for p in re.split(r"\n\s*\n", inspect.cleandoc(fn.__doc__ or ""))]
    if not paras[0].endswith("."):
        raise ValueError(f"{where}: the docstring's summary line (the title) must end with a period")
    out = {"title": paras[0][:-1]}
    for p in paras[1:]:
        label, sep, text = p.partition(": ")
        if sep and label in DOC_FIELDS:
            if DOC_FIELDS[label] in out:
                raise ValueError(f"{where}: two '{label}:' paragraphs")

            def constant(m: re.Match, label: str = label) -> str:
                if m[1] not in fn.__globals__:
                    raise ValueError(f"{where}: '{label}:' names {{{m[1]}}}, which the module does not define")
                return format(fn.__globals__[m[1]], m[2] or "")

            out[DOC_FIELDS[label]] = _CONSTANT.sub(constant, text)
    missing = [k for k, v in DOC_FIELDS.items() if v not in out]
    if missing:
        raise ValueError(f"{where}: the docstring has no {', '.join(repr(k + ':') for k in missing)} paragraph")
    return out


def check(
    id: str,
    *,
    requires: tuple[str, ...],
    reads: tuple[str, ...] = (),
    severity: str,
    rank: int,
    stages: tuple[str, ...] = STAGE_KINDS,
    preference: bool = False,
):
    """Register a check function; its name and docstring give the rest (see module docstring)."""

    def deco(fn: Callable[[AuditContext], list[Hit]]):
        if id in REGISTRY:
            raise ValueError(f"duplicate check id {id}")
        all_reads = tuple(i for i in INPUTS if i in set(requires) | set(reads))
        for i in all_reads:
            if i not in INPUTS:
                raise ValueError(f"{id}: unknown input {i}")
        if severity not in SEVERITIES:
            raise ValueError(f"{id}: unknown severity {severity}")
        if rank not in RANK_NAMES:
            raise ValueError(f"{id}: rank {rank} is not one of {sorted(RANK_NAMES)}")
        if not stages or any(k not in STAGE_KINDS for k in stages):
            raise ValueError(f"{id}: unknown stage kind in {stages}")
        REGISTRY[id] = CheckSpec(
            id=id,
            name=fn.__name__,
            requires=tuple(requires),
            reads=all_reads,
            severity=severity,
            rank=rank,
            fn=fn,
            module=fn.__module__.rsplit(".", 1)[-1],
            stages=tuple(k for k in STAGE_KINDS if k in stages),
            preference=preference,
            **doc_fields(fn),
        )
        return fn

    return deco


def _id_key(cid: str) -> tuple[int, int]:
    return ("DCTL".index(cid[0]), int(cid[1:]))


def all_checks() -> list[CheckSpec]:
    """Every registered check, in id order (D, C, T, L); importing :mod:`gradian.audit` registered them."""
    return [REGISTRY[k] for k in sorted(REGISTRY, key=_id_key)]
