"""Evaluate: measure what changed, refuse to diagnose noise, bound the blame on the base model.

Public API::

    items = load_eval_set("eval.jsonl")                  # list[EvalItem]
    result = evaluate(peft_model, tokenizer, items,       # EvalResult
                      reference_adapter=None,             # None: base (adapter disabled)
                      spec=EvalSpec(max_new_tokens=32))
    result.capabilities                                   # list[CapabilityResult] with verdicts
    result.failing_items()                                # list[FailingItem] for attribution
    EvalResult.from_dict(result.to_dict())                # JSON round trip

See ``docs/evaluate.md`` for the eval-set format, normalisation, verdict rules,
base bounds and the JSON schema.
"""

from importlib import import_module
from typing import TYPE_CHECKING

# Names load on first use (PEP 562), so reading an eval set (gradian.evaluate.items, used by
# `gradian diagnose --eval`) does not import torch through run/generate/likelihood.
_WHERE = {
    "gradian.evaluate.bootstrap": ("BootstrapCI", "paired_bootstrap", "sign_test_p"),
    "gradian.evaluate.items": (
        "METRICS",
        "EvalItem",
        "as_example",
        "items_from_records",
        "load_eval_set",
        "model_prompt",
    ),
    "gradian.evaluate.normalize": ("NormalizeSpec", "contains", "exact_match", "extract_answer", "normalize_answer"),
    "gradian.evaluate.result": (
        "RESULT_JSON_SCHEMA",
        "SCHEMA_VERSION",
        "CapabilityResult",
        "EvalResult",
        "FailingItem",
        "ItemResult",
        "Margin",
        "ModelAnswer",
        "Shift",
    ),
    "gradian.evaluate.run": ("evaluate", "summarise"),
    "gradian.evaluate.spec": ("EvalSpec",),
    "gradian.evaluate.verdict": ("LOGLIK_QUERY_NOTE", "BaseBounds", "decide"),
}
_MODULE_OF = {name: mod for mod, names in _WHERE.items() for name in names}


def __getattr__(name: str):
    """Import a public name's module on first access."""
    mod = _MODULE_OF.get(name)
    if mod is None:
        raise AttributeError(f"module 'gradian.evaluate' has no attribute {name!r}")
    value = getattr(import_module(mod), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:  # for type checkers and IDEs: the same names, eagerly
    from gradian.evaluate.bootstrap import BootstrapCI, paired_bootstrap, sign_test_p
    from gradian.evaluate.items import (
        METRICS,
        EvalItem,
        as_example,
        items_from_records,
        load_eval_set,
        model_prompt,
    )
    from gradian.evaluate.normalize import NormalizeSpec, contains, exact_match, extract_answer, normalize_answer
    from gradian.evaluate.result import (
        RESULT_JSON_SCHEMA,
        SCHEMA_VERSION,
        CapabilityResult,
        EvalResult,
        FailingItem,
        ItemResult,
        Margin,
        ModelAnswer,
        Shift,
    )
    from gradian.evaluate.run import evaluate, summarise
    from gradian.evaluate.spec import EvalSpec
    from gradian.evaluate.verdict import LOGLIK_QUERY_NOTE, BaseBounds, decide

__all__ = [
    "BaseBounds",
    "BootstrapCI",
    "CapabilityResult",
    "EvalItem",
    "EvalResult",
    "EvalSpec",
    "FailingItem",
    "ItemResult",
    "LOGLIK_QUERY_NOTE",
    "METRICS",
    "Margin",
    "ModelAnswer",
    "NormalizeSpec",
    "RESULT_JSON_SCHEMA",
    "SCHEMA_VERSION",
    "Shift",
    "as_example",
    "contains",
    "decide",
    "evaluate",
    "exact_match",
    "extract_answer",
    "items_from_records",
    "load_eval_set",
    "model_prompt",
    "normalize_answer",
    "paired_bootstrap",
    "sign_test_p",
    "summarise",
]
