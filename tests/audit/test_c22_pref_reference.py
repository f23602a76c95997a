"""C22: the reference model of a preference run (issue 25, stage-aware rules).

LLaMA-Factory's LoRA DPO/KTO computes the reference with the adapter disabled (``create_ref_model`` returns None
for LoRA; ``compute_reference_log_probs`` uses ``disable_adapter()``). Its published DPO example trains a fresh
adapter on the base, where that is right; pointing the same config at an SFT adapter (``adapter_name_or_path``)
resumes that adapter as the trained one, so the reference becomes the base without it. TRL refuses ``sync_ref_model``
with a PEFT adapter, and with ``precompute_ref_log_probs``.
"""

from __future__ import annotations

from pathlib import Path

import published_examples as P
import pytest

from gradian.audit import diagnose

SFT = "saves/qwen3-4b/lora/sft"


def _c22(tmp_path: Path, text: str, name: str = "qwen3_lora_dpo.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return diagnose(configs=[path], select=["C22"])


@pytest.mark.parametrize("example", ["LF_QWEN3_LORA_DPO", "LF_QWEN3_LORA_KTO"])
def test_lf_published_preference_examples_pass(tmp_path, example):
    res = _c22(tmp_path, getattr(P, example))
    assert "C22" in res.passed, [f.message for f in res.by_id("C22")]


@pytest.mark.parametrize("example", ["LF_QWEN3_LORA_DPO", "LF_QWEN3_LORA_KTO"])
def test_lf_preference_on_a_resumed_sft_adapter_warns(tmp_path, example):
    res = _c22(tmp_path, getattr(P, example) + f"adapter_name_or_path: {SFT}\n")
    (f,) = res.by_id("C22")
    assert f.severity == "warning"
    stage = "DPO" if "DPO" in example else "KTO"
    assert f.message.startswith(f"the {stage} reference is the base model, not the model the run starts from")
    assert f"{SFT} (qwen3_lora_dpo.yaml: adapter_name_or_path) is resumed" in f.message
    assert "create_new_adapter is not set" in f.message
    assert f.evidence["value"] == SFT
    assert res.config["values"]["init_adapters"]["value"] == [SFT]


def test_lf_two_adapters_merges_the_first_into_the_reference(tmp_path):
    res = _c22(tmp_path, P.LF_QWEN3_LORA_DPO + f"adapter_name_or_path: saves/a,{SFT}\n")
    (f,) = res.by_id("C22")
    assert "reference is the base model with saves/a merged" in f.message and f"{SFT} (" in f.message


def test_lf_the_fixes_pass(tmp_path):
    text = P.LF_QWEN3_LORA_DPO + f"adapter_name_or_path: {SFT}\n"
    for extra in ("create_new_adapter: true\n", f"ref_model: Qwen/Qwen3-4B-Instruct-2507\nref_model_adapters: {SFT}\n"):
        res = _c22(tmp_path, text + extra)
        assert "C22" in res.passed, (extra, [f.message for f in res.by_id("C22")])


def test_lf_qlora_does_not_merge_so_create_new_adapter_does_not_help(tmp_path):
    res = _c22(
        tmp_path, P.LF_QWEN3_LORA_DPO + f"adapter_name_or_path: {SFT}\ncreate_new_adapter: true\nquantization_bit: 4\n"
    )
    (f,) = res.by_id("C22")
    assert "quantization_bit is set, so LLaMA-Factory does not merge adapters" in f.message


def test_lf_orpo_and_simpo_have_no_reference(tmp_path):
    for loss in ("orpo", "simpo"):
        res = _c22(
            tmp_path,
            P.LF_QWEN3_LORA_DPO.replace("pref_loss: sigmoid", f"pref_loss: {loss}") + f"adapter_name_or_path: {SFT}\n",
        )
        assert "C22" in res.passed, loss


def test_lf_sft_stage_is_not_judged(tmp_path):
    res = _c22(tmp_path, P.LF_QWEN3_LORA_DPO.replace("stage: dpo", "stage: sft") + f"adapter_name_or_path: {SFT}\n")
    assert "C22" not in res.passed and not res.by_id("C22")


_TRL_DPO = (
    "model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct\ndataset_name: trl-lib/ultrafeedback_binarized\n"
    "beta: 0.1\nlearning_rate: 5.0e-6\nmax_length: 1024\n"
)
_PEFT = "use_peft: true\nlora_r: 16\nlora_alpha: 32\n"


@pytest.mark.parametrize(
    "extra,n_errors",
    [
        (_PEFT, 0),  # TRL's default LoRA DPO: the adapter-disabled base is the reference
        ("sync_ref_model: true\n", 0),  # TR-DPO on a full fine-tune: supported
        (_PEFT + "sync_ref_model: true\n", 1),
        ("sync_ref_model: true\nprecompute_ref_log_probs: true\n", 1),
        (_PEFT + "sync_ref_model: true\nprecompute_ref_log_probs: true\n", 2),
        (_PEFT + "precompute_ref_log_probs: true\n", 0),
    ],
)
def test_trl_sync_ref_model(tmp_path, extra, n_errors):
    res = _c22(tmp_path, _TRL_DPO + extra, "dpo.yaml")
    hits = res.by_id("C22")
    assert len(hits) == n_errors and all(f.severity == "error" for f in hits), [f.message for f in hits]
    if n_errors == 0:
        assert "C22" in res.passed
    if _PEFT in extra and "sync" in extra:
        assert any("there is no reference model to sync" in f.message for f in hits)


def test_axolotl_is_not_judged(tmp_path):
    res = _c22(tmp_path, P.AX_DPO_LORA_8B, "instruct-dpo-lora-8b.yml")
    assert "C22" not in res.passed and any(s["id"] == "C22" for s in res.to_dict()["skipped"])
