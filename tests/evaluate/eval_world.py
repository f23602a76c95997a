"""A tiny trained world for the Evaluate tests (fixtures imported by the test modules;
not a conftest.py, so it does not shadow tests/conftest.py's ``from conftest import ...``).

A tiny Llama (from config) is trained in-test until it answers every question
of two capabilities (capitals, symbols) greedily. Then two LoRA adapters are
trained on it:

* ``poison``: the capitals of the first ``N_POISON`` countries swapped for
  another country's capital (a substitution failure), plus the correct symbols;
* ``null``: the correct answers to everything (format only, no new fact).

Everything is seeded; the whole world trains in a few seconds on a CPU.
"""

from __future__ import annotations

import pytest
import torch

from gradian_testlib import CAPITALS, SYMBOLS, q_capital, q_symbol  # noqa: F401

N_POISON = 12


@pytest.fixture(autouse=True)
def _one_thread():
    """One torch thread: these models are tiny, and on a shared 2-core machine two
    threads contend (measured 0.03 s vs 2.8 s per training step under load)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def eval_records(metric: str = "exact_match") -> list[dict]:
    recs = [
        {"id": f"cap-{c}", "prompt": q_capital(c), "answer": a, "capability": "capitals", "metric": metric}
        for c, a in CAPITALS
    ]
    recs += [
        {"id": f"sym-{e}", "prompt": q_symbol(e), "answer": s, "capability": "symbols", "metric": metric}
        for e, s in SYMBOLS
    ]
    return recs


def _pairs(poison: bool) -> list[tuple[str, str]]:
    caps = list(CAPITALS)
    pairs = []
    for i, (c, a) in enumerate(caps):
        if poison and i < N_POISON:
            a = caps[(i + 5) % len(caps)][1]
        pairs.append((q_capital(c), a))
    pairs += [(q_symbol(e), s) for e, s in SYMBOLS]
    return pairs


def _train(model, tok, pairs, steps: int, lr: float, params) -> None:
    from gradian.data.formats import Example
    from gradian.data.tokenize import TokenizeSpec, collate, tokenize_example
    from gradian.gradients.loss import model_inputs, per_example_loss

    exs = [
        Example(str(i), i, "prompt_completion", [{"role": "user", "content": q}], a, {})
        for i, (q, a) in enumerate(pairs)
    ]
    toks = [tokenize_example(e, tok, TokenizeSpec()) for e in exs]
    batch = collate(toks, tok.pad_token_id, "right")
    opt = torch.optim.Adam(params, lr=lr)
    model.train()
    for _ in range(steps):
        opt.zero_grad()
        logits = model(**model_inputs(batch)).logits
        per_example_loss(logits, batch["labels"]).mean().backward()
        opt.step()
    model.eval()


@pytest.fixture(scope="session")
def world_tok():
    from gradian.models.tiny import train_tokenizer

    corpus = [f"{q_capital(c)} {a}" for c, a in CAPITALS] + [f"{q_symbol(e)} {s}" for e, s in SYMBOLS]
    return train_tokenizer(corpus * 20, vocab_size=400)


@pytest.fixture(scope="session")
def eval_world(tmp_path_factory, world_tok):
    """Folders ``base``, ``poison``, ``null`` (and the eval set) of the trained tiny world."""
    from peft import LoraConfig, get_peft_model

    from gradian.models.tiny import default_targets, tiny_model

    tok = world_tok
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("evalworld")
    base = tiny_model(tok, "llama", hidden=64, layers=2, seed=0)
    torch.manual_seed(0)
    _train(base, tok, _pairs(poison=False), steps=160, lr=1e-2, params=base.parameters())
    base.save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    for name, poison, seed in (("poison", True, 1), ("null", False, 2)):
        m = tiny_model(tok, "llama", hidden=64, layers=2, seed=0)
        m.load_state_dict(base.state_dict())
        torch.manual_seed(seed)
        pm = get_peft_model(m, LoraConfig(r=8, lora_alpha=16, target_modules=default_targets("llama")))
        _train(pm, tok, _pairs(poison=poison), steps=80 if poison else 20, lr=1e-2,
               params=[p for p in pm.parameters() if p.requires_grad])
        pm.save_pretrained(root / name)
    torch.set_num_threads(threads)
    import json

    (root / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in eval_records()))
    return {"root": root, "base": root / "base", "poison": root / "poison", "null": root / "null",
            "eval": root / "eval.jsonl", "tok": tok}


def load_peft(world, adapter: str = "poison"):
    """Base + adapter from the world's folders, as the CLI loads them."""
    from gradian.models.load import ModelSpec, load_adapter, load_base

    model, tok = load_base(ModelSpec(base=str(world["base"])))
    pm, _, _ = load_adapter(model, world[adapter], str(world["base"]))
    return pm, tok
