"""C20's preference learning-rate range depends on LoRA vs full fine-tune (issue 25).

The frameworks' own LoRA DPO/KTO examples (axolotl 2e-4, torchtune 5e-4, in ``published_examples``) pass; clearly
wrong rates still warn: LoRA DPO at 2e-3, a full DPO at 2e-4.
"""

from __future__ import annotations

from pathlib import Path

import published_examples as P
import pytest

from gradian.audit import diagnose
from gradian.audit.checks_setup import PREF_LR_HIGH_FULL, PREF_LR_HIGH_LORA


def _c20(path: Path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    res = diagnose(configs=[path], select=["C20"])
    lr = res.config["values"]["learning_rate"]["value"]
    return lr, [f for f in res.by_id("C20") if "learning_rate" in f.message], res


@pytest.mark.parametrize(
    "name,fname,old,new",
    [
        ("AX_DPO_LORA_8B", "instruct-dpo-lora-8b.yml", "learning_rate: 0.0002", "learning_rate: 0.002"),
        ("AX_KTO_QLORA_1B", "qlora-1b-kto.yaml", "learning_rate: 0.0002", "learning_rate: 0.002"),
        ("TT_LLAMA31_8B_LORA_DPO", "8B_lora_dpo.yaml", "lr: 5e-4", "lr: 2e-3"),
    ],
)
def test_published_lora_preference_examples_pass_and_ten_times_their_rate_warns(tmp_path, name, fname, old, new):
    text = getattr(P, name)
    assert old in text
    lr, hits, res = _c20(tmp_path / "ok" / fname, text)
    assert lr <= PREF_LR_HIGH_LORA and not hits and "C20" in res.passed, [f.message for f in hits]
    lr, hits, _ = _c20(tmp_path / "bad" / fname, text.replace(old, new))
    assert lr == 2e-3
    (f,) = hits
    assert f.severity == "warning" and "learning_rate=0.002 on a LoRA" in f.message
    assert f.evidence["threshold"] == PREF_LR_HIGH_LORA


_TRL_DPO = (
    "model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct\ndataset_name: trl-lib/ultrafeedback_binarized\n"
    "beta: 0.1\nlearning_rate: {lr}\nmax_length: 1024\nmax_prompt_length: 512\n{peft}"
)
_PEFT = "use_peft: true\nlora_r: 16\nlora_alpha: 32\n"


@pytest.mark.parametrize(
    "lr,peft,kind,warns",
    [
        ("5.0e-7", "", "full", False),
        ("1.0e-5", "", "full", False),  # the bound itself
        ("2.0e-4", "", "full", True),  # a LoRA rate on a full DPO
        ("5.0e-6", _PEFT, "LoRA", False),
        ("5.0e-4", _PEFT, "LoRA", False),  # the bound itself (torchtune's example)
        ("2.0e-3", _PEFT, "LoRA", True),
    ],
)
def test_trl_dpo_learning_rate_bound_depends_on_lora(tmp_path, lr, peft, kind, warns):
    _, hits, res = _c20(tmp_path / "dpo.yaml", _TRL_DPO.format(lr=lr, peft=peft))
    assert res.config["values"]["stage"]["value"] == "dpo"
    if not warns:
        assert not hits and "C20" in res.passed, [f.message for f in hits]
        return
    (f,) = hits
    assert f" on a {kind} DPO run is above " in f.message
    assert f.evidence["threshold"] == (PREF_LR_HIGH_LORA if kind == "LoRA" else PREF_LR_HIGH_FULL)
