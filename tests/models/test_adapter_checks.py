"""Adapters that do not fit the base, or that Gradian cannot attribute, are refused clearly."""

from __future__ import annotations

import pytest
import torch

from gradian.errors import GradianUserError
from gradian.gradients import lora_blocks
from gradian.models.load import ModelSpec, load_adapter, load_base
from gradian.models.tiny import default_targets, tiny_model


def _save(tok, path, peft_config, arch="llama", hidden=64):
    from peft import get_peft_model

    pm = get_peft_model(tiny_model(tok, arch, hidden=hidden), peft_config)
    pm.save_pretrained(path)
    return path


def test_good_adapter_loads_with_only_lora_trainable(tok, saved_finetune):
    model, _ = load_base(ModelSpec(str(saved_finetune["base"])))
    pm, cfg, notes = load_adapter(model, saved_finetune["adapter"], base_name=str(saved_finetune["base"]))
    trainable = [n for n, p in pm.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert len(lora_blocks(pm)) == 2 * 7 * 2  # 2 layers x 7 linears x (A, B)
    assert not pm.training


def _expect(tok, saved_finetune, tmp_path, peft_config, needle, **kw):
    path = _save(tok, tmp_path / "ad", peft_config, **kw)
    model, _ = load_base(ModelSpec(str(saved_finetune["base"])))
    with pytest.raises(GradianUserError) as ei:
        load_adapter(model, path)
    assert needle in str(ei.value) and "(fix: " in str(ei.value)


def test_shape_mismatch_refused(tok, saved_finetune, tmp_path):
    from peft import LoraConfig

    cfg = LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False)
    _expect(tok, saved_finetune, tmp_path, cfg, "needs", hidden=32)


def test_missing_target_module_refused(tok, saved_finetune, tmp_path):
    from peft import LoraConfig

    cfg = LoraConfig(r=4, target_modules=["c_attn"], fan_in_fan_out=True)
    _expect(tok, saved_finetune, tmp_path, cfg, "does not have", arch="gpt2")


def test_dora_refused(tok, saved_finetune, tmp_path):
    from peft import LoraConfig

    _expect(tok, saved_finetune, tmp_path, LoraConfig(r=4, target_modules=["q_proj"], use_dora=True), "DoRA")


@pytest.mark.parametrize("kind", ["ia3", "prompt"])
def test_other_adapter_types_refused(tok, saved_finetune, tmp_path, kind):
    from peft import IA3Config, PromptTuningConfig, TaskType

    cfg = (
        IA3Config(target_modules=["k_proj", "v_proj", "down_proj"], feedforward_modules=["down_proj"])
        if kind == "ia3"
        else PromptTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=4)
    )
    _expect(tok, saved_finetune, tmp_path, cfg, "not supported")


def test_missing_folder_and_files(tmp_path, saved_finetune):
    model, _ = load_base(ModelSpec(str(saved_finetune["base"])))
    with pytest.raises(GradianUserError, match="adapter folder not found"):
        load_adapter(model, tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(GradianUserError, match="no adapter_config.json"):
        load_adapter(model, tmp_path / "empty")


def test_gpt2_conv1d_adapter_fits(tok, tmp_path):
    from peft import LoraConfig

    base = tiny_model(tok, "gpt2")
    base.save_pretrained(tmp_path / "g")
    tok.save_pretrained(tmp_path / "g")
    _save(
        tok, tmp_path / "ad", LoraConfig(r=2, target_modules=default_targets("gpt2"), fan_in_fan_out=True), arch="gpt2"
    )
    model, _ = load_base(ModelSpec(str(tmp_path / "g")))
    pm, _, _ = load_adapter(model, tmp_path / "ad")
    assert len(lora_blocks(pm)) == 2 * 4 * 2  # c_attn, attn.c_proj, c_fc, mlp.c_proj


def test_bin_adapter_read_without_unpickling(tok, saved_finetune, tmp_path):
    """A .bin adapter is read with weights_only=True; a pickle carrying code is refused."""
    import pickle
    import shutil

    from safetensors.torch import load_file

    from gradian.models.load import read_adapter_weights

    ad = tmp_path / "binad"
    shutil.copytree(saved_finetune["adapter"], ad)
    sd = load_file(str(ad / "adapter_model.safetensors"))
    (ad / "adapter_model.safetensors").unlink()
    torch.save(sd, ad / "adapter_model.bin")
    assert set(read_adapter_weights(ad)) == set(sd)

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    with open(ad / "adapter_model.bin", "wb") as f:
        pickle.dump(Evil(), f)
    with pytest.raises(GradianUserError, match="never unpickles"):
        read_adapter_weights(ad)
