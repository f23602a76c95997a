"""Base model + adapter loading, LoRA module discovery."""

from gradian.models.load import ModelSpec, check_adapter_fits, load_adapter, load_base, load_tokenizer

__all__ = ["ModelSpec", "load_base", "load_tokenizer", "load_adapter", "check_adapter_fits"]
