"""The adapter's identity: the same adapter saved twice (PEFT lists ``target_modules`` in set order) is one adapter."""

from __future__ import annotations

import json
from pathlib import Path

from gradian.index.identity import adapter_identity, adapter_unchanged, legacy_adapter_sha


def _adapter(folder: Path, modules: list[str], weights: bytes = b"w" * 64, r: int = 8) -> Path:
    folder.mkdir(parents=True)
    cfg = {"peft_type": "LORA", "r": r, "lora_alpha": 16, "target_modules": modules, "layers_to_transform": None}
    (folder / "adapter_config.json").write_text(json.dumps(cfg, indent=2))
    (folder / "adapter_model.safetensors").write_bytes(weights)
    return folder


def test_target_modules_order_does_not_change_the_identity(tmp_path):
    a = _adapter(tmp_path / "a", ["q_proj", "v_proj", "down_proj"])
    b = _adapter(tmp_path / "b", ["down_proj", "q_proj", "v_proj"])
    assert (a / "adapter_config.json").read_bytes() != (b / "adapter_config.json").read_bytes()
    assert adapter_identity(a) == adapter_identity(b)


def test_what_the_adapter_is_still_changes_the_identity(tmp_path):
    base = adapter_identity(_adapter(tmp_path / "a", ["q_proj", "v_proj"]))
    assert adapter_identity(_adapter(tmp_path / "m", ["q_proj", "k_proj"])) != base  # other modules
    assert adapter_identity(_adapter(tmp_path / "r", ["q_proj", "v_proj"], r=16)) != base  # another rank
    assert adapter_identity(_adapter(tmp_path / "w", ["q_proj", "v_proj"], weights=b"x" * 64)) != base  # weights


def test_a_run_recorded_with_the_raw_file_hash_is_not_changed(tmp_path):
    a = _adapter(tmp_path / "a", ["v_proj", "q_proj"])
    old = legacy_adapter_sha(a)
    assert old != adapter_identity(a)["sha256"]
    assert adapter_unchanged(a, old) and adapter_unchanged(a, adapter_identity(a)["sha256"])
    (a / "adapter_model.safetensors").write_bytes(b"y" * 64)
    assert not adapter_unchanged(a, old)


def test_a_config_that_is_not_json_is_hashed_as_bytes(tmp_path):
    a = _adapter(tmp_path / "a", ["q_proj"])
    (a / "adapter_config.json").write_text("{not json")
    first = adapter_identity(a)
    (a / "adapter_config.json").write_text("{not json either")
    assert adapter_identity(a) != first
