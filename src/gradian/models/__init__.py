"""Base model + adapter loading, LoRA module discovery.

The public names are imported on first use (PEP 562), so the torch-free spec (:mod:`gradian.models.spec`)
is read without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gradian.util import lazy_attributes

_LAZY = {
    "ModelSpec": "gradian.models.spec",
    "load_base": "gradian.models.load",
    "load_tokenizer": "gradian.models.load",
    "load_adapter": "gradian.models.load",
    "check_adapter_fits": "gradian.models.load",
}

__all__ = ["ModelSpec", "load_base", "load_tokenizer", "load_adapter", "check_adapter_fits"]

if TYPE_CHECKING:  # pragma: no cover
    from gradian.models.load import check_adapter_fits, load_adapter, load_base, load_tokenizer
    from gradian.models.spec import ModelSpec

__getattr__, __dir__ = lazy_attributes("gradian.models", _LAZY, globals())
