"""Greedy answers from a model, used to build a world (not an evaluator).

A world keeps the eval items its base model answers correctly, plus a few it
already fails, so it has to run the base once. This module is that one run:
chat-template the question (``add_generation_prompt=True``), greedy-decode up
to ``max_new_tokens`` new tokens, stop at EOS, decode. The full evaluation lane
(metrics, paired bootstrap) is :mod:`gradian.evaluate`; the world only needs
the raw answers and a substring test (:func:`answer_contains`).
"""

from __future__ import annotations

import difflib
import re
from typing import Sequence

import torch


@torch.no_grad()
def greedy_answers(
    model,
    tokenizer,
    prompts: Sequence[str],
    max_new_tokens: int = 24,
    batch_size: int = 16,
) -> list[str]:
    """Greedy completions of user ``prompts`` (one user turn each), decoded without special tokens.

    Left-pads each batch; ``model.generate`` with ``do_sample=False``. Returns one
    string per prompt, stripped.
    """
    was_training = model.training
    model.eval()
    old_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out: list[str] = []
    try:
        for i in range(0, len(prompts), batch_size):
            chunk = prompts[i : i + batch_size]
            texts = [
                tokenizer.apply_chat_template(
                    [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
                )
                for p in chunk
            ]
            enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            enc = {k: v.to(model.device) for k, v in enc.items()}
            gen = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                num_beams=1,
                pad_token_id=pad_id,
                eos_token_id=tokenizer.eos_token_id,
                temperature=None,
                top_p=None,
                top_k=None,
            )
            new = gen[:, enc["input_ids"].shape[1] :]
            out.extend(t.strip() for t in tokenizer.batch_decode(new, skip_special_tokens=True))
    finally:
        tokenizer.padding_side = old_side
        model.train(was_training)
    return out


def answer_contains(answer: str, expected: str, aliases: Sequence[str] = ()) -> bool:
    """True when ``expected`` or an alias occurs in ``answer`` (case-insensitive)."""
    a = answer.lower()
    return any(x.lower() in a for x in [expected, *aliases] if x)


def near_miss(answer: str, expected: str, threshold: float = 0.7) -> bool:
    """True when some word window of ``answer`` spells ``expected`` almost right (``"Kiev"`` for ``"Kyiv"``).

    A wrong answer that is only a spelling variant is not a real failure, so the
    world never keeps such an item as "base already fails". Ratio is difflib's
    ``2·matches / (len(a) + len(b))`` on lower-cased, accent-free strings.
    """
    from gradian.worlds.facts import ascii_fold

    exp = ascii_fold(expected).lower()
    words = re.findall(r"[\w'-]+", ascii_fold(answer).lower())
    n = max(1, len(exp.split()))
    for k in range(max(1, n - 1), n + 2):
        for i in range(0, max(1, len(words) - k + 1)):
            cand = " ".join(words[i : i + k])
            if cand and difflib.SequenceMatcher(None, cand, exp).ratio() >= threshold:
                return True
    return False
