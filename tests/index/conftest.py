"""Fixtures of the index tests."""

from __future__ import annotations

import pytest

from gradian.finetune import load_finetune
from gradian.models.load import ModelSpec


@pytest.fixture(scope="module")
def ft(saved_finetune):
    """The saved fine-tune (tiny base and its LoRA adapter), loaded once per test module."""
    return load_finetune(ModelSpec(str(saved_finetune["base"])), saved_finetune["adapter"])
