"""Shared fixtures: an in-test trained tokenizer and tiny LoRA models built from config."""

from __future__ import annotations

import os

import pytest
import torch
from typer.testing import CliRunner

from gradian_testlib import CORPUS, ROWS, gradian_cache  # noqa: F401

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tiny models gain nothing from intra-op threads, and OpenMP spinning makes them 20x slower
# whenever another process shares the cores. One thread keeps the suite fast and stable.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def world_cache(tmp_path_factory):
    """One cache for the tiny worlds of the whole session (their base model is built once)."""
    return tmp_path_factory.mktemp("gradian-cache")


@pytest.fixture(scope="session")
def tok():
    from gradian.models.tiny import train_tokenizer

    return train_tokenizer(CORPUS, vocab_size=320)


@pytest.fixture(scope="session")
def tok_bos():
    from gradian.models.tiny import train_tokenizer

    return train_tokenizer(CORPUS, vocab_size=320, bos=True)


@pytest.fixture(scope="session")
def saved_finetune(tmp_path_factory, tok):
    """A tiny Llama base + a LoRA adapter + a training file, all on disk, as a user would have them."""
    import json

    from gradian.models.tiny import tiny_model
    from gradian.worlds.tiny import tiny_lora

    root = tmp_path_factory.mktemp("finetune")
    base = tiny_model(tok, "llama", seed=0)
    base.save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    pm = tiny_lora(base, r=4, alpha=8, seed=1, random_init=True)
    pm.save_pretrained(root / "adapter")
    data = root / "train.jsonl"
    rows = ROWS * 3
    data.write_text("".join(json.dumps({**r, "id": f"{r['id']}-{i}"}) + "\n" for i, r in enumerate(rows)))
    return {"base": root / "base", "adapter": root / "adapter", "data": data, "root": root}


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    """`gradian demo --kind tiny --null` run once per session (twice: the second reuses the cache):
    ``(root, first CliResult, second CliResult)``; the cache is ``root/cache``."""
    root = tmp_path_factory.mktemp("demo")
    with gradian_cache(root / "cache"):
        from gradian.cli import app

        res = CliRunner().invoke(
            app, ["demo", "--kind", "tiny", "--out", str(root / "out"), "--project-dim", "0", "--null"]
        )
        again = CliRunner().invoke(app, ["demo", "--kind", "tiny", "--out", str(root / "out2"), "--project-dim", "0"])
    return root, res, again
