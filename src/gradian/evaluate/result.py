"""The Evaluate lane's result model and its JSON form (schema ``gradian.evaluate/1``).

The JSON is ``EvalResult.to_dict()``; ``EvalResult.from_dict`` reads it back
(round trip exact). Field-by-field documentation: ``docs/evaluate.md`` and
:data:`RESULT_JSON_SCHEMA` (a JSON Schema, draft 2020-12).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gradian.data.formats import Example
from gradian.evaluate.items import as_example
from gradian.evaluate.spec import EvalSpec
from gradian.evaluate.verdict import BaseBounds
from gradian.schema import BOOLEAN, INTEGER, NUMBER, OBJECT, STRING, arr, nullable, obj
from gradian.util import attrs, by_name

SCHEMA_VERSION = "gradian.evaluate/1"
STATUSES = ("kept", "lost", "gained", "both_fail")


class _Flat:
    """A record of plain fields whose JSON form is its fields."""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class ModelAnswer(_Flat):
    """One model's result on one item.

    Attributes:
        score: the item score: 1.0/0.0 for exact_match and contains; for loglik the
            best log p(accepted answer | prompt) in nats (≤ 0).
        passed: exact_match/contains: the metric matched; loglik: some accepted answer
            is the greedy continuation under teacher forcing.
        output: the full decoded generation (None for loglik).
        answer: what the model said, as judged: the extracted first line (None for loglik).
        finished: the generation ended with EOS / end of turn within max_new_tokens (None for loglik).
    """

    score: float
    passed: bool
    output: str | None = None
    answer: str | None = None
    finished: bool | None = None


@dataclass
class Margin(_Flat):
    """Base preference margin of an item the tuned model fails (adapter disabled), in nats.

    ``nats = logp_correct − logp_said``: ``correct`` is the correct answer *in the
    model's own words* when the reference passed the item (its extracted answer,
    ``correct_source="reference"``), else the eval set's answer
    (``correct_source="answer"``); ``said`` is the tuned model's extracted answer.
    ``gold_nats = logp_gold − logp_said`` uses the eval set's bare answer instead
    (equal to ``nats`` when ``correct_source == "answer"``). Each log-probability is
    summed over the completion's supervised tokens, including the end of the
    answer (EOS / end of turn).
    """

    nats: float
    correct: str
    correct_source: str
    logp_correct: float
    logp_said: float
    tokens_correct: int
    tokens_said: int
    gold_nats: float
    logp_gold: float
    tokens_gold: int


@dataclass
class Shift(_Flat):
    """How far the tuned model moved off an answer both models give (a ``kept`` item), in nats.

    ``nats = logp_tuned − logp_reference`` of ``correct``, the reference's own passing answer, each
    summed over the answer's supervised tokens (end of answer included), tuned adapter against the
    reference (the base, or ``--reference-adapter``). Negative: the tuned model holds the answer less
    firmly; an item still passed can have been pushed toward failing. Attribution can query such a
    *weakened* item (``nats < −weakened_nats``) beside the lost ones
    (:meth:`EvalResult.failing_items`).
    """

    nats: float
    correct: str
    logp_reference: float
    logp_tuned: float
    tokens: int


@dataclass
class ItemResult:
    """Per-item result.

    Attributes:
        prompt: the prompt as given in the eval set.
        model_prompt: the prompt as the model ran on it (a message list when the chat
            template was applied, else the string).
        status: ``kept`` (both pass), ``lost`` (reference passes, tuned fails),
            ``gained`` (tuned passes, reference fails), ``both_fail``.
        base_margin: computed for every item the tuned model fails under a generative
            metric; None otherwise.
        shift: for every ``kept`` item under a generative metric, the tuned model's log-probability
            of the reference's answer against the reference's (:class:`Shift`); None otherwise.
    """

    id: str
    row: int
    capability: str
    metric: str
    prompt: str | list[dict[str, str]]
    model_prompt: str | list[dict[str, str]]
    answer: str
    aliases: list[str]
    reference: ModelAnswer
    tuned: ModelAnswer
    status: str
    base_margin: Margin | None = None
    shift: Shift | None = None

    @property
    def chat(self) -> bool:
        return isinstance(self.model_prompt, list)

    def to_dict(self) -> dict[str, Any]:
        return {
            **attrs(self, "id", "row", "capability", "metric", "prompt", "model_prompt", "chat", "answer"),
            "aliases": list(self.aliases),
            "reference": self.reference.to_dict(),
            "tuned": self.tuned.to_dict(),
            "status": self.status,
            "base_margin": self.base_margin.to_dict() if self.base_margin else None,
            "shift": self.shift.to_dict() if self.shift else None,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ItemResult:
        return cls(
            id=d["id"],
            row=d["row"],
            capability=d["capability"],
            metric=d["metric"],
            prompt=d["prompt"],
            model_prompt=d["model_prompt"],
            answer=d["answer"],
            aliases=list(d["aliases"]),
            reference=ModelAnswer(**d["reference"]),
            tuned=ModelAnswer(**d["tuned"]),
            status=d["status"],
            base_margin=Margin(**d["base_margin"]) if d.get("base_margin") else None,
            shift=Shift(**d["shift"]) if d.get("shift") else None,
        )


@dataclass
class CapabilityDelta:
    """A capability's measured change: the part of :class:`CapabilityResult` that every report shows
    (:class:`gradian.report.views.CapabilityView` extends it too).

    Attributes:
        name, metric: the capability and its metric (``exact_match``, ``contains``, ``loglik``).
        unit: ``"accuracy"`` (exact_match/contains: scores are pass rates) or
            ``"nats"`` (loglik: scores are mean log-likelihoods).
        n: items scored.
        reference_score, tuned_score: mean item score.
        delta: ``tuned_score − reference_score``.
        ci_low, ci_high: paired-bootstrap CI of ``delta`` at ``confidence``.
    """

    name: str
    metric: str
    unit: str
    n: int
    reference_score: float
    tuned_score: float
    delta: float
    ci_low: float
    ci_high: float
    confidence: float


@dataclass
class CapabilityResult(CapabilityDelta):
    """Per-capability summary with its verdict (:class:`CapabilityDelta`'s fields first).

    Attributes:
        resamples, seed: the paired bootstrap's.
        sign_test_p: exact two-sided sign test on the paired differences (cross-check).
        verdict: ``regressed`` | ``improved`` | ``within_noise``.
        diagnosed: True only for ``regressed`` (its lost items go to attribution).
        reason: one sentence explaining the verdict ("... includes zero: within noise, not diagnosed").
        n_kept, n_lost, n_gained, n_both_fail: item status counts.
    """

    resamples: int
    seed: int
    sign_test_p: float
    verdict: str
    diagnosed: bool
    reason: str
    reference_pass_rate: float
    tuned_pass_rate: float
    n_kept: int
    n_lost: int
    n_gained: int
    n_both_fail: int
    base_bounds: BaseBounds

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["base_bounds"] = self.base_bounds.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CapabilityResult:
        return cls(**{**d, "base_bounds": BaseBounds.from_dict(d["base_bounds"])})


@dataclass
class FailingItem:
    """An item to attribute: in a regressed capability, the reference passes and the tuned model fails.

    Attributes:
        prompt: the prompt as the model ran on it (message list when the chat template
            was applied, else a string): build queries from this.
        answer: the correct answer.
        tuned_answer: what the tuned model said instead (extracted first line); None for loglik.
        correct_completion: the correct answer in the model's own words (the reference's
            passing answer) when there is one, else ``answer``: the positive side of the
            contrastive query, matched in format to ``tuned_answer`` so the query cancels format.
        margin: base preference margin in nats, correct_completion vs tuned_answer (None for loglik).
        thin_margin: ``margin < thin_margin_nats`` (None for loglik).
        query: ``"contrastive"`` (∇ℓ(correct) − ∇ℓ(said)) or ``"cross_entropy"`` (loglik fallback, and
            every weakened item: the tuned model still says the correct answer, so there is no wrong one).
        kind: ``"lost"`` (the reference passes, the tuned model fails) or ``"weakened"`` (both pass, but the
            tuned model's log-probability of the answer fell by more than the threshold: :class:`Shift`).
        shift_nats: the item's :attr:`Shift.nats` (None when Evaluate computed none: lost and loglik items).
        rival: a weakened item's nearest wrong answer (:mod:`gradian.attribute.rival`), the other side of its
            contrastive query; None until attribution finds one (and for lost items).
    """

    id: str
    capability: str
    metric: str
    prompt: str | list[dict[str, str]]
    answer: str
    aliases: list[str]
    tuned_answer: str | None
    reference_answer: str | None
    correct_completion: str
    margin: float | None
    thin_margin: bool | None
    query: str
    kind: str = "lost"
    shift_nats: float | None = None
    rival: str | None = None

    @property
    def chat(self) -> bool:
        return isinstance(self.prompt, list)

    def correct_example(self) -> Example:
        """(prompt, ``correct_completion``) as a training-row Example, tokenised like the margin was."""
        return as_example(self.id, self.prompt, self.correct_completion)

    def said_example(self) -> Example | None:
        """(prompt, what the tuned model said) as an Example; None for loglik."""
        if self.tuned_answer is None:
            return None
        return as_example(self.id, self.prompt, self.tuned_answer)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__, aliases=list(self.aliases), chat=self.chat)


@dataclass
class EvalResult:
    """The whole evaluation.

    Attributes:
        spec: the :class:`EvalSpec` used.
        reference: ``{"kind": "base"}`` (adapter disabled) or
            ``{"kind": "adapter", "adapter": <dir or name>}``.
        capabilities: per-capability summaries, sorted by name.
        items: per-item results, in eval-set order.
        notes: run-level notes (e.g. the loglik fallback).
        timing: seconds: ``generate``, ``score``, ``total``.
        meta: free-form context filled by the caller (base, adapter, eval file and hash, versions).
    """

    spec: EvalSpec
    reference: dict[str, Any]
    capabilities: list[CapabilityResult]
    items: list[ItemResult]
    notes: list[str] = field(default_factory=list)
    timing: dict[str, float] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    schema: str = SCHEMA_VERSION

    def capability(self, name: str) -> CapabilityResult:
        return by_name(self.capabilities, name)

    @property
    def regressed(self) -> list[CapabilityResult]:
        return [c for c in self.capabilities if c.verdict == "regressed"]

    def failing_items(
        self,
        capability: str | None = None,
        *,
        include_undiagnosed: bool = False,
        weakened_nats: float | None = None,
    ) -> list[FailingItem]:
        """Items for attribution: reference passes, tuned fails, in a regressed capability.

        Args:
            capability: keep only this capability.
            include_undiagnosed: also return lost items of capabilities that are not
                ``regressed`` (for inspection; attributing them is attributing noise).
            weakened_nats: also return, after the lost items, the ``kept`` items whose answer the tuned
                model holds more than this many nats less firmly than the reference
                (``shift.nats < −weakened_nats``), as ``kind="weakened"`` (a cross-entropy query until attribution
                finds its rival answer, :mod:`gradian.attribute.rival`). None: lost items only.
        """
        caps = {c.name: c for c in self.capabilities}
        if capability is not None and capability not in caps:
            raise KeyError(capability)

        def asked(it: ItemResult) -> bool:
            return (capability is None or it.capability == capability) and (
                include_undiagnosed or caps[it.capability].verdict == "regressed"
            )

        lost = [it for it in self.items if it.status == "lost" and asked(it)]
        weak = [
            it
            for it in self.items
            if weakened_nats is not None and it.shift is not None and it.shift.nats < -weakened_nats and asked(it)
        ]
        return [self._failing(it) for it in lost] + [self._failing(it, weakened=True) for it in weak]

    def _failing(self, it: ItemResult, weakened: bool = False) -> FailingItem:
        """``it`` as a :class:`FailingItem`: a lost item with its base margin, or a weakened one with its shift."""
        m = it.base_margin.nats if it.base_margin and not weakened else None
        if weakened:
            correct, query = it.shift.correct, "cross_entropy"  # type: ignore[union-attr]
        else:
            correct = it.base_margin.correct if it.base_margin else it.answer
            query = "cross_entropy" if it.metric == "loglik" else "contrastive"
        return FailingItem(
            **attrs(it, "id", "capability", "metric", "answer"),
            prompt=it.model_prompt,
            aliases=list(it.aliases),
            tuned_answer=it.tuned.answer,
            reference_answer=it.reference.answer,
            correct_completion=correct,
            margin=m,
            thin_margin=None if m is None else m < self.spec.thin_margin_nats,
            query=query,
            kind="weakened" if weakened else "lost",
            shift_nats=it.shift.nats if weakened else None,  # type: ignore[union-attr]
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "spec": self.spec.to_dict(),
            "reference": dict(self.reference),
            "capabilities": [c.to_dict() for c in self.capabilities],
            "items": [i.to_dict() for i in self.items],
            "failing_items": [f.to_dict() for f in self.failing_items()],
            "notes": list(self.notes),
            "timing": dict(self.timing),
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EvalResult:
        if d.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"not a {SCHEMA_VERSION} result (schema={d.get('schema')!r})")
        return cls(
            spec=EvalSpec.from_dict(d["spec"]),
            reference=dict(d["reference"]),
            capabilities=[CapabilityResult.from_dict(c) for c in d["capabilities"]],
            items=[ItemResult.from_dict(i) for i in d["items"]],
            notes=list(d.get("notes", [])),
            timing=dict(d.get("timing", {})),
            meta=dict(d.get("meta", {})),
        )


# ----------------------------------------------------------------------------- JSON Schema

_messages = arr(obj({"role": STRING, "content": STRING}))
_prompt = {"oneOf": [STRING, _messages]}
_model_answer = obj(
    {
        "score": NUMBER,
        "passed": BOOLEAN,
        "output": nullable(STRING),
        "answer": nullable(STRING),
        "finished": nullable(BOOLEAN),
    }
)
_margin = obj(
    {
        "nats": NUMBER,
        "correct": STRING,
        "correct_source": {"enum": ["reference", "answer"]},
        "logp_correct": NUMBER,
        "logp_said": NUMBER,
        "tokens_correct": INTEGER,
        "tokens_said": INTEGER,
        "gold_nats": NUMBER,
        "logp_gold": NUMBER,
        "tokens_gold": INTEGER,
    },
    nullable=True,
)
_shift = obj(
    {"nats": NUMBER, "correct": STRING, "logp_reference": NUMBER, "logp_tuned": NUMBER, "tokens": INTEGER},
    nullable=True,
)
# written since weakened items were added: a reader of an older result meets neither
_failing_optional = {"kind": {"enum": ["lost", "weakened"]}, "shift_nats": nullable(NUMBER), "rival": nullable(STRING)}
_bounds = obj(
    {
        "base_fails": INTEGER,
        "base_fail_share": NUMBER,
        "base_score": NUMBER,
        "low_base": BOOLEAN,
        "low_base_threshold": NUMBER,
        "failing": INTEGER,
        "margins_available": BOOLEAN,
        "thin_margin": INTEGER,
        "thin_margin_share": nullable(NUMBER),
        "thin_margin_nats": NUMBER,
        "median_margin": nullable(NUMBER),
        "query": {"enum": ["contrastive", "cross_entropy"]},
        "qualifiers": arr(STRING),
    }
)

RESULT_JSON_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": SCHEMA_VERSION,
    **obj(
        {
            "schema": {"const": SCHEMA_VERSION},
            "spec": OBJECT,
            "reference": obj({"kind": {"enum": ["base", "adapter"]}}),
            "capabilities": {
                "type": "array",
                "items": obj(
                    {
                        "name": STRING,
                        "metric": {"enum": ["exact_match", "contains", "loglik"]},
                        "unit": {"enum": ["accuracy", "nats"]},
                        "n": INTEGER,
                        "reference_score": NUMBER,
                        "tuned_score": NUMBER,
                        "delta": NUMBER,
                        "ci_low": NUMBER,
                        "ci_high": NUMBER,
                        "confidence": NUMBER,
                        "resamples": INTEGER,
                        "seed": INTEGER,
                        "sign_test_p": NUMBER,
                        "verdict": {"enum": ["regressed", "improved", "within_noise"]},
                        "diagnosed": BOOLEAN,
                        "reason": STRING,
                        "reference_pass_rate": NUMBER,
                        "tuned_pass_rate": NUMBER,
                        "n_kept": INTEGER,
                        "n_lost": INTEGER,
                        "n_gained": INTEGER,
                        "n_both_fail": INTEGER,
                        "base_bounds": _bounds,
                    }
                ),
            },
            "items": {
                "type": "array",
                "items": obj(
                    {
                        "id": STRING,
                        "row": INTEGER,
                        "capability": STRING,
                        "metric": {"enum": ["exact_match", "contains", "loglik"]},
                        "prompt": _prompt,
                        "model_prompt": _prompt,
                        "chat": BOOLEAN,
                        "answer": STRING,
                        "aliases": arr(STRING),
                        "reference": _model_answer,
                        "tuned": _model_answer,
                        "status": {"enum": list(STATUSES)},
                        "base_margin": _margin,
                    },
                    optional={"shift": _shift},
                ),
            },
            "failing_items": {
                "type": "array",
                "items": obj(
                    {
                        "id": STRING,
                        "capability": STRING,
                        "metric": STRING,
                        "prompt": _prompt,
                        "chat": BOOLEAN,
                        "answer": STRING,
                        "aliases": arr(STRING),
                        "tuned_answer": nullable(STRING),
                        "reference_answer": nullable(STRING),
                        "correct_completion": STRING,
                        "margin": nullable(NUMBER),
                        "thin_margin": nullable(BOOLEAN),
                        "query": {"enum": ["contrastive", "cross_entropy"]},
                    },
                    optional=_failing_optional,
                ),
            },
            "notes": arr(STRING),
            "timing": {"type": "object", "additionalProperties": NUMBER},
            "meta": OBJECT,
        }
    ),
}
