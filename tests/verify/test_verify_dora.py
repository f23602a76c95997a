"""``gradian verify`` retrains a DoRA run as DoRA: use_dora is mapped from the run's config, not listed as not
reproduced (gradian train trains DoRA adapters since ``--dora``)."""

from __future__ import annotations

import json

import pytest

from gradian.verify.retrain import _from_foreign


@pytest.mark.parametrize(
    "text",
    [
        "base_model: x\nadapter: lora\nlora_r: 4\nlora_alpha: 8\npeft_use_dora: true\nlora_target_modules: [q_proj]\n",
        "model_name_or_path: x\nuse_peft: true\nlora_r: 4\nlora_alpha: 8\nuse_dora: true\nmax_steps: 7\n",
    ],
    ids=["axolotl", "trl"],
)
def test_a_dora_config_retrains_dora(tmp_path, text):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(text)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"target_modules": ["q_proj", "v_proj"]}))
    trainer = _from_foreign("base", cfg, adapter)
    assert trainer.spec.use_dora is True and trainer.spec.r == 4
    assert "use_dora" not in trainer.unmapped
    assert trainer.identity()["spec"]["use_dora"] is True
