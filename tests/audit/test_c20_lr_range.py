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
    "lr,peft,kind,severity",
    [
        ("5.0e-7", "", "full", None),
        ("1.0e-5", "", "full", None),  # the bound itself
        ("3.0e-5", "", "full", "warning"),
        ("2.0e-4", "", "full", "error"),  # a LoRA rate on a full DPO: 20x the bound
        ("5.0e-6", _PEFT, "LoRA", None),
        ("5.0e-4", _PEFT, "LoRA", None),  # the bound itself (torchtune's example)
        ("2.0e-3", _PEFT, "LoRA", "warning"),  # 4x the bound is the error line, as C02's
        ("2.1e-3", _PEFT, "LoRA", "error"),
    ],
)
def test_trl_dpo_learning_rate_bound_depends_on_lora(tmp_path, lr, peft, kind, severity):
    _, hits, res = _c20(tmp_path / "dpo.yaml", _TRL_DPO.format(lr=lr, peft=peft))
    assert res.config["values"]["stage"]["value"] == "dpo"
    if severity is None:
        assert not hits and "C20" in res.passed, [f.message for f in hits]
        return
    (f,) = hits
    assert f" on a {kind} DPO run is above " in f.message and f.severity == severity
    assert f.evidence["threshold"] == (PREF_LR_HIGH_LORA if kind == "LoRA" else PREF_LR_HIGH_FULL)


def test_sft_learning_rate_rule_c02_does_not_judge_a_preference_run(tmp_path):
    # LoRA DPO at 1e-3: before, C02 (with SFT's fix text) and C20 both reported the same rate; now C02 is skipped on
    # preference stages and C20 alone judges it, with the preference ranges
    path = tmp_path / "dpo.yaml"
    path.write_text(_TRL_DPO.format(lr="1.0e-3", peft=_PEFT))
    res = diagnose(configs=[path], select=["C02", "C20"])
    assert not res.by_id("C02") and [f.severity for f in res.by_id("C20")] == ["warning"]
    (skip,) = [k.reason for k in res.skipped if k.id == "C02"]
    assert skip.startswith("not applicable: a dpo run (dpo.yaml: ")
    # the same rate on an SFT run still warns in C02
    sft = tmp_path / "sft.yaml"
    sft.write_text(
        _TRL_DPO.replace("beta: 0.1\n", "").replace("max_prompt_length: 512\n", "").format(lr="1.0e-3", peft=_PEFT)
    )
    res = diagnose(configs=[sft], select=["C02"])
    assert res.config["values"]["stage"]["value"] == "sft"
    assert [f.severity for f in res.by_id("C02")] == ["warning"]


def test_a_reward_model_run_gets_sfts_learning_rate_range(tmp_path):
    path = tmp_path / "rm.yaml"
    path.write_text("stage: rm\nfinetuning_type: lora\nmodel_name_or_path: Qwen/Qwen2.5-0.5B\nlearning_rate: 3.0e-3\n")
    res = diagnose(configs=[path], select=["C02", "C20"])
    assert res.config["values"]["stage"]["value"] == "rm" and not res.by_id("C02")
    (f,) = [f for f in res.by_id("C20") if "learning_rate" in f.message]
    assert f.severity == "error" and "a reward model trains like an SFT run" in f.message
