"""A QLoRA run's base, quantised by Gradian as transformers + bitsandbytes quantised it for training.

The reference is transformers' own 4-bit load (``BitsAndBytesConfig(load_in_4bit=True, ...)``, bitsandbytes on the
CPU): every quantised layer's weight read back (``dequantize_4bit``) must equal Gradian's to the bit, the layers
left in full precision must be the same, and the model with a LoRA adapter must give the 4-bit model's logits.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("bitsandbytes")

from gradian.errors import GradianUserError  # noqa: E402
from gradian.models.load import ModelSpec, load_adapter, load_base  # noqa: E402
from gradian.models.tiny import tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def bases(tok, tmp_path_factory):
    """The tiny Llama stored in float32 and in bfloat16 (a QLoRA base is usually stored in bfloat16)."""
    root = tmp_path_factory.mktemp("quant")
    m = tiny_model(tok, "llama")
    m.save_pretrained(root / "f32")
    m.to(torch.bfloat16).save_pretrained(root / "bf16")
    for d in ("f32", "bf16"):
        tok.save_pretrained(root / d)
    return root


def _transformers_4bit(folder, kind: str, dq: bool, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    cfg = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type=kind, bnb_4bit_use_double_quant=dq, bnb_4bit_compute_dtype=torch.float32
    )
    return AutoModelForCausalLM.from_pretrained(folder, quantization_config=cfg, device_map="cpu", dtype=dtype).eval()


@pytest.mark.parametrize("scheme", ["nf4", "nf4-dq", "fp4", "fp4-dq"])
@pytest.mark.parametrize("stored", ["f32", "bf16"])
def test_gradian_s_base_is_transformers_4bit_base(bases, scheme, stored):
    import bitsandbytes as bnb
    import bitsandbytes.functional as bnbf

    kind, dq = scheme.split("-")[0], scheme.endswith("-dq")
    dtype = torch.float32 if stored == "f32" else torch.bfloat16
    ref = _transformers_4bit(bases / stored, kind, dq, dtype)
    ours, _ = load_base(ModelSpec(str(bases / stored), quantize=scheme))
    assert ours.gradian_quantization["source_dtype"] == str(dtype).split(".")[-1]
    theirs = dict(ref.named_modules())
    n4 = 0
    for name, mod in ours.named_modules():
        if not isinstance(mod, torch.nn.Linear):
            continue
        t = theirs[name]
        if isinstance(t, bnb.nn.Linear4bit):
            w = bnbf.dequantize_4bit(t.weight.data, t.weight.quant_state).float()
            assert torch.equal(mod.weight, w), name
            n4 += 1
        else:  # left in full precision by both (the LM head)
            assert name in ours.gradian_quantization["kept"] and torch.equal(mod.weight, t.weight.float()), name
    assert n4 == ours.gradian_quantization["layers"] == 2 * 7
    plain, _ = load_base(ModelSpec(str(bases / stored)))
    assert any(not torch.equal(a, b) for a, b in zip(plain.parameters(), ours.parameters()))  # it did quantise


def test_a_qlora_adapter_on_gradian_s_base_gives_the_4bit_model_s_logits(bases, tok, tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model

    pm = get_peft_model(tiny_model(tok, "llama"), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(std=0.05)
    pm.save_pretrained(tmp_path / "adapter")
    x = torch.tensor([[1, 5, 9, 20, 33, 40]])
    # computed in float32 on both sides (a bfloat16 base computes its norms and LoRA in bfloat16 there)
    trained = PeftModel.from_pretrained(
        _transformers_4bit(bases / "f32", "nf4", True, torch.float32), tmp_path / "adapter"
    )
    base, _ = load_base(ModelSpec(str(bases / "f32"), quantize="nf4-dq"))
    ours, _, _ = load_adapter(base, tmp_path / "adapter")
    plain, _, _ = load_adapter(load_base(ModelSpec(str(bases / "f32")))[0], tmp_path / "adapter")
    with torch.no_grad():
        want = trained.eval()(input_ids=x).logits.float()
        got, full = ours(input_ids=x).logits, plain(input_ids=x).logits
    assert (got - want).abs().max() < 1e-4 < (full - want).abs().max()


def test_an_unknown_scheme_is_one_line(bases):
    with pytest.raises(GradianUserError, match="--base-quant"):
        ModelSpec(str(bases / "f32"), quantize="int3")
    assert "quantize" not in ModelSpec(str(bases / "f32")).to_dict()
