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


def test_trl_s_gradient_on_a_4bit_base_is_gradian_s(bases, tok, tmp_path):
    """TRL 1.16's SFTTrainer on transformers' own 4-bit base (bitsandbytes, nf4 with double quantisation): the LoRA
    gradient of its ``compute_loss`` on a batch equals the token-weighted sum of Gradian's per-row gradients on the
    base Gradian quantised (``Σ n_r g_r / Σ n_r``, rows tokenised with the setup read from the same ``SFTConfig``); on
    the full-precision base it does not. TRL casts a quantised model's LoRA weights to bfloat16 when it is built
    (QLoRA's recipe); they are saved after that and compared in float32 on both sides, as Gradian computes."""
    pytest.importorskip("trl")
    import json

    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from trl import SFTConfig, SFTTrainer

    from gradian.data.formats import load_examples
    from gradian.data.setup import setup_from_files
    from gradian.data.tokenize import collate, tokenize_example
    from gradian.gradients import per_example_grads

    rows = [{"prompt": f"Q: capital {i}?\nA:", "completion": f" It is city {i} of the north."} for i in range(4)]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    torch.manual_seed(0)
    model = get_peft_model(
        _transformers_4bit(bases / "f32", "nf4", True, torch.float32),
        LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"),
    )
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(std=0.05)
    model.eval()
    args = SFTConfig(
        output_dir=str(tmp_path / "trl"),
        report_to=[],
        dataset_num_proc=None,
        use_cpu=True,
        per_device_train_batch_size=4,
    )
    tr = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok)
    model.save_pretrained(tmp_path / "adapter")  # the bfloat16 values TRL trains
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.float()
    batch = next(iter(tr.get_train_dataloader()))
    model.zero_grad()
    tr.compute_loss(model, dict(batch)).backward()
    theirs = {n.replace(".default", ""): p.grad.double() for n, p in model.named_parameters() if p.grad is not None}
    cfg = tmp_path / "sft_config.json"
    cfg.write_text(args.to_json_string())
    spec = setup_from_files([cfg], data).tokenize_spec()
    ours_by_ids = {
        tuple(it.input_ids.tolist()): it for it in (tokenize_example(e, tok, spec) for e in load_examples(data))
    }
    trl_rows = [tuple(ids[m.bool()].tolist()) for ids, m in zip(batch["input_ids"], batch["attention_mask"])]
    assert sorted(trl_rows) == sorted(ours_by_ids)  # the same four rows, token for token (TRL shuffles them)
    items = [ours_by_ids[r] for r in trl_rows]
    n = torch.tensor([float(it.n_supervised) for it in items], dtype=torch.float64)
    for scheme, same in (("nf4-dq", True), (None, False)):
        base, _ = load_base(ModelSpec(str(bases / "f32"), quantize=scheme))
        ours, _, _ = load_adapter(base, tmp_path / "adapter")
        grads = per_example_grads(ours, collate(items, tok.pad_token_id))
        close = []
        for name, g in grads.items():
            want = theirs[name.replace(".default", "")]
            got = (g.double() * n.view(-1, *[1] * want.dim())).sum(0) / n.sum()
            close.append(torch.allclose(got, want, rtol=1e-4, atol=1e-7))
        assert all(close) is same and len(close) == len(theirs)
