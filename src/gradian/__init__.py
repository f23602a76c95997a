"""Gradian: training-data attribution for LoRA fine-tuned LLMs.

The public names are imported on first use (PEP 562), so ``import gradian`` and the torch-free commands
(``gradian diagnose``) do not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gradian.util import lazy_attributes
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


__getattr__, __dir__ = lazy_attributes("gradian", _LAZY, globals())
