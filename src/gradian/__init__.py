"""Gradian: training-data attribution for LoRA fine-tuned LLMs."""

__version__ = "0.1.0"

from gradian.gradients.per_example import per_example_grads  # noqa: E402

__all__ = ["per_example_grads", "__version__"]
