"""Gradian: training-data attribution for LoRA fine-tuned LLMs.

The public names are imported on first use (PEP 562), so ``import gradian`` and the torch-free commands
(``gradian diagnose``) do not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gradian.version import __version__

#: Public name -> the module that defines it (imported on first access).
_LAZY = {
    "per_example_grads": "gradian.gradients.per_example",
    "Attributor": "gradian.attributor",
    "Query": "gradian.attributor",
    "Run": "gradian.runtypes",
    "EvalResult": "gradian.evaluate.result",
}

__all__ = ["Attributor", "EvalResult", "Query", "Run", "per_example_grads", "__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from gradian.attributor import Attributor, Query
    from gradian.evaluate.result import EvalResult
    from gradian.gradients.per_example import per_example_grads
    from gradian.runtypes import Run


def __getattr__(name: str) -> Any:
    """Import a public name's module on first access and cache the name in this module."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gradian' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """Module attributes, the lazy public names included."""
    return sorted(set(globals()) | set(_LAZY))
