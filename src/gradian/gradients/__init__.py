"""Per-example LoRA gradients: hooks (main), loop and vmap (references)."""

from gradian.gradients.lora import LoraBlock, lora_blocks
from gradian.gradients.loss import per_example_loss, sequence_logprob
from gradian.gradients.per_example import per_example_grads

__all__ = [
    "LoraBlock",
    "lora_blocks",
    "per_example_loss",
    "sequence_logprob",
    "per_example_grads",
]
