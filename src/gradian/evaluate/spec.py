"""The typed evaluation spec: every knob that changes an Evaluate number."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gradian.defaults import MAX_LENGTH
from gradian.errors import GradianUserError
from gradian.evaluate.normalize import NormalizeSpec

MIN_RESAMPLES = 1000


@dataclass(frozen=True)
class EvalSpec:
    """How an evaluation is run and judged. Serialised into the manifest via :meth:`to_dict`.

    Attributes:
        max_new_tokens: greedy generation stops after this many new tokens (or at EOS/end of turn).
        batch_size: prompts per generation / scoring batch (does not change results).
        seed: seeds the bootstrap's generator (generation is greedy, hence seed-free).
        resamples: bootstrap resamples B (at least 1000).
        confidence: the CI's coverage, e.g. 0.95.
        min_items: a capability with fewer items is not diagnosed (too few for a bootstrap CI).
        low_base_threshold: a reference pass rate below this is flagged as a low base score.
        thin_margin_nats: a base preference margin below this (nats) is "thin".
        use_chat_template: run string prompts through the tokenizer's chat template as a
            user turn when it has one (message-list prompts always use it).
        max_length: token limit when scoring prompt + answer (margins, loglik), as in training.
        normalize: answer normalisation rules.
    """

    max_new_tokens: int = 32
    batch_size: int = 8
    seed: int = 0
    resamples: int = 10_000
    confidence: float = 0.95
    min_items: int = 10
    low_base_threshold: float = 0.5
    thin_margin_nats: float = 1.0
    use_chat_template: bool = True
    max_length: int = MAX_LENGTH
    normalize: NormalizeSpec = field(default_factory=NormalizeSpec)

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise GradianUserError(
                f"max_new_tokens must be at least 1, got {self.max_new_tokens}",
                where="--max-new-tokens",
                fix="use e.g. 32",
            )
        if self.batch_size < 1:
            raise GradianUserError(
                f"batch_size must be at least 1, got {self.batch_size}", where="--batch-size", fix="use e.g. 8"
            )
        if self.resamples < MIN_RESAMPLES:
            raise GradianUserError(
                f"resamples must be at least {MIN_RESAMPLES}, got {self.resamples}",
                where="--resamples",
                fix="use 10000 (the default) or more",
            )
        if not 0.5 <= self.confidence < 1.0:
            raise GradianUserError(
                f"confidence must be in [0.5, 1), got {self.confidence}", where="confidence", fix="use 0.95"
            )
        if self.min_items < 1:
            raise GradianUserError(
                f"min_items must be at least 1, got {self.min_items}", where="min_items", fix="use 10"
            )
        from gradian.validate import LENGTH_MAX, check_bool, check_float, check_int, check_seed, check_type

        # the types and upper bounds (the checks above keep their long-standing messages)
        check_int(self.max_new_tokens, "EvalSpec", "max_new_tokens", flag="--max-new-tokens", lo=1, hi=100_000)
        check_int(self.batch_size, "EvalSpec", "batch_size", flag="--batch-size", lo=1, hi=1_000_000)
        check_seed(self.seed, "EvalSpec")
        check_int(
            self.resamples,
            "EvalSpec",
            "resamples",
            flag="--resamples",
            lo=MIN_RESAMPLES,
            hi=1_000_000,
            fix="use 10000 (the default); more than 1,000,000 resamples only costs memory",
        )
        check_float(self.confidence, "EvalSpec", "confidence", lo=0.5, hi=1.0, hi_open=True, fix="use 0.95")
        check_int(self.min_items, "EvalSpec", "min_items", lo=1, hi=1_000_000)
        check_float(self.low_base_threshold, "EvalSpec", "low_base_threshold", lo=0.0, hi=1.0, fix="use 0.5")
        check_float(self.thin_margin_nats, "EvalSpec", "thin_margin_nats", lo=0.0, hi=1e6, fix="use 1.0")
        check_bool(self.use_chat_template, "EvalSpec", "use_chat_template", flag="--chat-template")
        check_int(self.max_length, "EvalSpec", "max_length", flag="--max-length", lo=2, hi=LENGTH_MAX)
        check_type(self.normalize, NormalizeSpec, "EvalSpec", "normalize")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["normalize"] = self.normalize.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EvalSpec:
        from gradian.validate import spec_kwargs

        return cls(**spec_kwargs(cls, d, {"normalize": NormalizeSpec}))
