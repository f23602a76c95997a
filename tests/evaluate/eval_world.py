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

from gradian_testlib import CAPITALS, SYMBOLS, cli_args, eval_records, q_capital, q_symbol  # noqa: F401

N_POISON = 12


@pytest.fixture(autouse=True)
def _one_thread():
    """One torch thread: these models are tiny, and on a shared 2-core machine two
    threads contend (measured 0.03 s vs 2.8 s per training step under load)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _pairs(poison: bool) -> list[tuple[str, str]]:
    caps = list(CAPITALS)
    pairs = []
    for i, (c, a) in enumerate(caps):
        if poison and i < N_POISON:
            a = caps[(i + 5) % len(caps)][1]
        pairs.append((q_capital(c), a))
    pairs += [(q_symbol(e), s) for e, s in SYMBOLS]
    return pairs


def _examples(pairs: list[tuple[str, str]]):
    """Each (question, answer) as a conversational prompt with a plain-string completion."""
    from gradian.data.formats import Example

    return [
        Example(str(i), i, "prompt_completion", [{"role": "user", "content": q}], a, {})
        for i, (q, a) in enumerate(pairs)
    ]


@pytest.fixture(scope="session")
def world_tok():
    from gradian.models.tiny import train_tokenizer

    corpus = [f"{q_capital(c)} {a}" for c, a in CAPITALS] + [f"{q_symbol(e)} {s}" for e, s in SYMBOLS]
    return train_tokenizer(corpus * 20, vocab_size=400)


@pytest.fixture(scope="session")
def eval_world(tmp_path_factory, world_tok):
    """Folders ``base``, ``poison``, ``null`` (and the eval set) of the trained tiny world.

    The base: 160 full-batch Adam steps (lr 1e-2) on the true answers; each adapter (r 8, alpha 16,
    LoRA seed 1 / 2): 80 (poison) or 20 (null) full-batch steps.
    """
    from gradian.worlds.tiny import FitSpec, fit, tiny_base, tiny_lora, tokenize_rows

    tok = world_tok
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("evalworld")
    base = tiny_base(tok, _examples(_pairs(poison=False)), FitSpec(steps=160, lr=1e-2, shuffle=False))
    base.save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    for name, poison, seed in (("poison", True, 1), ("null", False, 2)):
        pm = tiny_lora(base, r=8, alpha=16, seed=seed)
        fit(
            pm,
            tokenize_rows(_examples(_pairs(poison=poison)), tok),
            tok.pad_token_id,
            FitSpec(steps=80 if poison else 20, lr=1e-2, shuffle=False),
        )
        pm.save_pretrained(root / name)
    torch.set_num_threads(threads)
    import json

    (root / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in eval_records()))
    return {
        "root": root,
        "base": root / "base",
        "poison": root / "poison",
        "null": root / "null",
        "eval": root / "eval.jsonl",
        "tok": tok,
    }


def load_peft(world, adapter: str = "poison"):
    """Base + adapter from the world's folders, as the CLI loads them."""
    from gradian.models.load import ModelSpec, load_adapter, load_base

    model, tok = load_base(ModelSpec(base=str(world["base"])))
    pm, _, _ = load_adapter(model, world[adapter], str(world["base"]))
    return pm, tok


def evaluate_args(world, eval_set, out, resamples: int) -> list[str]:
    """``gradian evaluate`` of the poisoned adapter on ``eval_set``, 8 new tokens, ``resamples`` bootstrap draws."""
    return cli_args(
        "evaluate",
        base=world["base"],
        adapter=world["poison"],
        eval=eval_set,
        out=out,
        max_new_tokens=8,
        resamples=resamples,
    )
