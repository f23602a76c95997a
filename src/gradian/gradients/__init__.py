"""Per-example LoRA gradients: hooks (main), loop and vmap (references).

The public names are imported on first use (PEP 562), so the torch-free projection spec
(:class:`gradian.gradients.projection.ProjectionSpec`) is read without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gradian.util import lazy_attributes

_LAZY = {
    "LoraBlock": "gradian.gradients.lora",
    "lora_blocks": "gradian.gradients.lora",
    "per_example_loss": "gradian.gradients.loss",
    "sequence_logprob": "gradian.gradients.loss",
    "per_example_grads": "gradian.gradients.per_example",
}

__all__ = [
    "LoraBlock",
    "lora_blocks",
    "per_example_loss",
    "sequence_logprob",
    "per_example_grads",
]

if TYPE_CHECKING:  # pragma: no cover
    from gradian.gradients.lora import LoraBlock, lora_blocks
    from gradian.gradients.loss import per_example_loss, sequence_logprob
    from gradian.gradients.per_example import per_example_grads

__getattr__, __dir__ = lazy_attributes("gradian.gradients", _LAZY, globals())
