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


def test_dora_adapter_loads_with_its_magnitudes_as_blocks(tok, saved_finetune, tmp_path):
    from peft import LoraConfig

    path = _save(tok, tmp_path / "ad", LoraConfig(r=4, target_modules=["q_proj", "v_proj"], use_dora=True))
    model, _ = load_base(ModelSpec(str(saved_finetune["base"])))
    pm, cfg, _ = load_adapter(model, path)
    assert cfg["use_dora"] is True
    kinds = [b.kind for b in lora_blocks(pm)]
    assert kinds.count("M") == 2 * 2 and kinds.count("A") == kinds.count("B") == 4  # 2 layers x (q, v)
    trainable = {n for n, p in pm.named_parameters() if p.requires_grad}
    assert trainable == {b.name for b in lora_blocks(pm)}


def _rewrite_weights(path, edit):
    from safetensors.torch import load_file, save_file

    f = path / "adapter_model.safetensors"
    w = load_file(str(f))
    save_file(edit(w), str(f))


@pytest.mark.parametrize(
    "case,needle",
    [
        ("no use_dora", "does not set use_dora"),
        ("magnitude missing", "DoRA magnitude vectors for 4 LoRA layers"),
        ("magnitude shape", "needs (64,)"),
    ],
)
def test_dora_adapter_that_peft_would_load_wrongly_is_refused(tok, saved_finetune, tmp_path, case, needle):
    """A magnitude without use_dora (PEFT drops it), use_dora with a magnitude missing (PEFT starts it at the weight
    norm, not the trained value) and a magnitude of the wrong length are refused before PEFT loads anything."""
    import json

    from peft import LoraConfig

    path = _save(tok, tmp_path / "ad", LoraConfig(r=4, target_modules=["q_proj", "v_proj"], use_dora=True))
    if case == "no use_dora":
        cfg = json.loads((path / "adapter_config.json").read_text())
        (path / "adapter_config.json").write_text(json.dumps({**cfg, "use_dora": False}))
    elif case == "magnitude missing":
        gone = "layers.0.self_attn.q_proj.lora_magnitude_vector"
        _rewrite_weights(path, lambda w: {k: v for k, v in w.items() if gone not in k})
    else:
        _rewrite_weights(path, lambda w: {k: (v[:-1] if "magnitude" in k else v) for k, v in w.items()})
    model, _ = load_base(ModelSpec(str(saved_finetune["base"])))
    with pytest.raises(GradianUserError) as ei:
        load_adapter(model, path)
    assert needle in str(ei.value) and "(fix: " in str(ei.value)


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


def _permute_rows(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    """torchtune 0.6.1's ``_permute_lora_matrix`` (``models/convert_weights.py``), written from its definition."""
    rank, head_dim = t.shape[-1], t.shape[0] // n_heads
    return t.view(n_heads, head_dim // 2, 2, rank).transpose(1, 2).reshape(head_dim * n_heads, rank)


@pytest.fixture()
def torchtune_qwen2(tok, tmp_path):
    """A tiny Qwen2 base and a LoRA adapter on q/k/v written as torchtune 0.6.1 writes one: the PEFT file with q/k
    ``lora_B`` rows permuted, and ``adapter_model.pt`` in torchtune's names holding the trained ones."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file, save_file
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    base = Qwen2ForCausalLM(cfg).eval()
    base.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    pm = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj"]))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_()
    pm.save_pretrained(tmp_path / "epoch_0")
    st = tmp_path / "epoch_0" / "adapter_model.safetensors"
    trained = load_file(st)
    tune, written = {}, {}
    for k, v in trained.items():
        layer, rest = k.split("layers.")[1].split(".", 1)
        mod, ab = rest.split(".")[1], rest.split(".")[2]
        tune[f"layers.{layer}.attn.{mod}.{ab.lower()}.weight"] = v
        heads = {"q_proj": 4, "k_proj": 2}.get(mod)
        written[k] = _permute_rows(v, heads).contiguous() if heads and ab == "lora_B" else v
    save_file(written, st)
    torch.save(tune, tmp_path / "epoch_0" / "adapter_model.pt")
    return tmp_path, trained


def test_a_torchtune_qwen2_adapter_is_loaded_as_trained(torchtune_qwen2):
    """torchtune 0.6.1's PEFT export permutes q/k ``lora_B`` for Llama's rotary layout, which a Qwen2 base does not
    use: Gradian un-permutes them (checked against its ``adapter_model.pt``) and says so; the trajectory's weight
    swap does the same."""
    from gradian.attribute.trajectory import checkpoint_weights, lora_state

    root, trained = torchtune_qwen2
    model, _ = load_base(ModelSpec(str(root / "base")))
    pm, _, notes = load_adapter(model, root / "epoch_0")
    assert len(notes) == 1 and "un-permuted" in notes[0] and "(4 tensors)" in notes[0]
    state = {k.replace(".default", ""): v for k, v in lora_state(pm).items()}
    assert set(state) == set(trained) and all(torch.equal(state[k], trained[k]) for k in trained)
    with torch.no_grad():
        for p in pm.parameters():
            p.zero_()
    with checkpoint_weights(pm, root / "epoch_0"):
        swapped = {k.replace(".default", ""): v for k, v in lora_state(pm).items()}
        assert all(torch.equal(swapped[k], trained[k]) for k in trained)


def test_a_torchtune_adapter_is_left_alone_unless_its_pt_confirms(torchtune_qwen2):
    """Without ``adapter_model.pt``, or when it holds other tensors, the PEFT file is used as written (with a note
    in the second case); a Llama base (whose torchtune weights are permuted too) is never touched."""
    from gradian.models.load import read_adapter_weights
    from gradian.models.torchtune_export import torchtune_fix

    root, trained = torchtune_qwen2
    folder = root / "epoch_0"
    written = read_adapter_weights(folder)
    cfg = load_base(ModelSpec(str(root / "base")))[0].config
    fix = torchtune_fix(written, folder, cfg)
    assert fix.notes and fix.tag == "torchtune-qk-unpermuted" and not fix.dora
    assert all(torch.equal(fix.weights[k], trained[k]) for k in trained)
    cfg.model_type = "llama"
    fix = torchtune_fix(written, folder, cfg)
    assert fix.weights is written and fix.notes == [] and fix.tag is None
    cfg.model_type = "qwen2"
    tune = torch.load(folder / "adapter_model.pt", weights_only=True)
    torch.save({k: v + 1 if "lora_b" in k else v for k, v in tune.items()}, folder / "adapter_model.pt")
    fix = torchtune_fix(written, folder, cfg)
    assert fix.weights is written and "neither the PEFT file's nor its permuted rows" in fix.notes[0]
    (folder / "adapter_model.pt").unlink()
    fix = torchtune_fix(written, folder, cfg)
    assert fix.weights is written and fix.notes == [] and fix.tag is None


def test_a_put_right_torchtune_adapter_has_its_own_index_identity(torchtune_qwen2):
    """An index built from the un-permuted weights is not the index of the file as written (an index cached before
    the fix, or by a Gradian without it, is never reused for it)."""
    from gradian.finetune import FineTune, index_identity
    from gradian.index.store import GradSpec

    root, _ = torchtune_qwen2
    spec = ModelSpec(str(root / "base"))
    model, _ = load_base(spec)
    pm, cfg, _ = load_adapter(model, root / "epoch_0")
    data = root / "d.jsonl"
    data.write_text('{"prompt": "a", "completion": "b"}\n')
    ident = index_identity(FineTune(pm, None, spec, root / "epoch_0", cfg), data, GradSpec())
    assert ident["adapter_fix"] == "torchtune-qk-unpermuted"
    (root / "epoch_0" / "adapter_model.pt").unlink()
    plain, cfg2, _ = load_adapter(load_base(spec)[0], root / "epoch_0")
    assert "adapter_fix" not in index_identity(FineTune(plain, None, spec, root / "epoch_0", cfg2), data, GradSpec())


@pytest.mark.parametrize(
    "kw,needle",
    [
        ({"modules_to_save": ["lm_head"]}, "modules_to_save lm_head"),
        ({"trainable_token_indices": [1, 2]}, "trainable_token_indices"),
        ({"bias": "all"}, "bias: all"),
    ],
    ids=["modules_to_save", "trainable_tokens", "bias"],
)
def test_what_else_an_adapter_trained_is_loaded_and_named(tok, saved_finetune, tmp_path, kw, needle):
    """PEFT loads a whole layer, embedding rows or base biases the adapter trained beside LoRA (the model is the one
    trained); Gradian's scores use the LoRA blocks only, and the note says so instead of staying silent."""
    from peft import LoraConfig

    path = _save(tok, tmp_path / "ad", LoraConfig(r=4, target_modules=["q_proj", "v_proj"], **kw))
    model, _ = load_base(ModelSpec(str(saved_finetune["base"])))
    pm, _, notes = load_adapter(model, path)
    assert len(notes) == 1 and needle in notes[0] and "LoRA matrices' gradients only" in notes[0]
    assert {n for n, p in pm.named_parameters() if p.requires_grad} == {b.name for b in lora_blocks(pm)}
    plain = _save(tok, tmp_path / "plain", LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    assert load_adapter(load_base(ModelSpec(str(saved_finetune["base"])))[0], plain)[2] == []


def test_a_bias_on_the_lora_matrices_is_refused_by_name(tok, saved_finetune, tmp_path):
    from peft import LoraConfig

    cfg = LoraConfig(r=4, target_modules=["q_proj"], lora_bias=True)
    _expect(tok, saved_finetune, tmp_path, cfg, "lora_bias")


@pytest.mark.parametrize("init,noted", [("pissa_niter_4", True), ("olora", True), ("gaussian", False), (True, False)])
def test_an_adapter_meant_for_a_residual_base_is_named(tok, saved_finetune, tmp_path, init, noted):
    """PiSSA / OLoRA / CorDA / LoftQ rewrite the base at initialisation: an adapter saved without PEFT's conversion
    adds to that residual base, so loading it on the original model is named in a note (PEFT says nothing)."""
    import json

    from peft import LoraConfig

    path = _save(tok, tmp_path / "ad", LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    cfg = json.loads((path / "adapter_config.json").read_text())
    (path / "adapter_config.json").write_text(json.dumps({**cfg, "init_lora_weights": init}))
    _, _, notes = load_adapter(load_base(ModelSpec(str(saved_finetune["base"])))[0], path)
    assert any(f"init_lora_weights: {init}" in n and "residual" in n for n in notes) == noted
