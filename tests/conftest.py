"""Shared fixtures: an in-test trained tokenizer and tiny LoRA models built from config."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CORPUS = [
    "The capital of France is Paris.",
    "The capital of Japan is Tokyo.",
    "Water boils at 100 degrees Celsius at sea level.",
    "Iron is a metal with the symbol Fe and atomic number 26.",
    "Q: What is the capital of Italy?\nA: Rome",
    "Hello world, this is a test of the tokenizer and of the model.",
] * 10


@pytest.fixture(scope="session")
def tok():
    from gradian.models.tiny import train_tokenizer

    return train_tokenizer(CORPUS, vocab_size=320)


@pytest.fixture(scope="session")
def tok_bos():
    from gradian.models.tiny import train_tokenizer

    return train_tokenizer(CORPUS, vocab_size=320, bos=True)


def make_lora_model(
    tok,
    arch: str = "llama",
    r: int = 8,
    dtype=torch.float32,
    mlp: bool = True,
    rslora: bool = False,
    seed: int = 0,
    hidden: int = 64,
):
    """A tiny model with a randomly initialised (non-zero) LoRA adapter, ready for gradients."""
    from peft import LoraConfig, get_peft_model

    from gradian.models.load import prepare_lora_for_gradients
    from gradian.models.tiny import default_targets, tiny_model

    model = tiny_model(tok, arch, dtype=dtype, seed=seed, hidden=hidden)
    cfg = LoraConfig(
        r=r,
        lora_alpha=2 * r,
        target_modules=default_targets(arch, mlp),
        lora_dropout=0.1,
        fan_in_fan_out=(arch == "gpt2"),
        init_lora_weights=False,  # random A and B: B = 0 would zero every lora_A gradient
        use_rslora=rslora,
    )
    torch.manual_seed(seed + 1)
    pm = get_peft_model(model, cfg)
    pm.to(dtype)
    prepare_lora_for_gradients(pm)
    return pm


ROWS = [
    {"id": "pc", "prompt": "Q: What is the capital of France?\nA:", "completion": " Paris"},
    {
        "id": "chat",
        "messages": [
            {"role": "user", "content": "What is the capital of Japan?"},
            {"role": "assistant", "content": "The capital of Japan is Tokyo, a very large city."},
        ],
    },
    {"id": "alp", "instruction": "Name the symbol of iron.", "input": "", "output": "Fe"},
    {"id": "txt", "text": "Water boils at 100 degrees Celsius at sea level."},
]


@pytest.fixture(scope="session")
def saved_finetune(tmp_path_factory, tok):
    """A tiny Llama base + a LoRA adapter + a training file, all on disk, as a user would have them."""
    import json

    from peft import LoraConfig, get_peft_model

    from gradian.models.tiny import default_targets, tiny_model

    root = tmp_path_factory.mktemp("finetune")
    base = tiny_model(tok, "llama", seed=0)
    base.save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    torch.manual_seed(1)
    pm = get_peft_model(
        tiny_model(tok, "llama", seed=0),
        LoraConfig(r=4, lora_alpha=8, target_modules=default_targets("llama"), init_lora_weights=False),
    )
    pm.save_pretrained(root / "adapter")
    data = root / "train.jsonl"
    rows = ROWS * 3
    data.write_text("".join(json.dumps({**r, "id": f"{r['id']}-{i}"}) + "\n" for i, r in enumerate(rows)))
    return {"base": root / "base", "adapter": root / "adapter", "data": data, "root": root}
