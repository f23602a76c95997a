"""Batched greedy generation with left padding.

Each prompt is encoded exactly as the prompt part of a training row
(:mod:`gradian.data.tokenize`): a message list is rendered by the tokenizer's
chat template with ``add_generation_prompt=True`` and encoded without extra
special tokens (the template writes them); a plain string is encoded with the
tokenizer's special tokens (e.g. BOS). Prompts are grouped into batches by
length (stable order), left padded, and decoded greedily
(``do_sample=False, num_beams=1``) for at most ``max_new_tokens`` tokens, until
EOS / end of turn. Greedy decoding has no randomness: the same model and
prompts give the same text, batched or one at a time (up to float ties).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from gradian.data.tokenize import render_chat


@dataclass
class Generation:
    """One generated continuation.

    Attributes:
        text: the new tokens decoded with special tokens skipped (cut at the first stop token).
        token_ids: the new token ids before the stop token.
        finished: a stop token (EOS / end of turn) was produced within ``max_new_tokens``.
    """

    text: str
    token_ids: list[int]
    finished: bool


def prompt_text(prompt: str | list[dict[str, str]], tokenizer, where: str = "eval item") -> str:
    """The prompt as the model runs it, as text: a message list rendered through the chat template with the
    assistant's generation prompt, a string as it is.
    """
    return render_chat(tokenizer, prompt, True, where) if isinstance(prompt, list) else prompt


def cut_at_stops(text: str, stops: Sequence[str]) -> str:
    """``text`` up to the first occurrence of any of ``stops`` (lm-eval's ``until``: ``text.split(s)[0]`` for each)."""
    for s in stops:
        if s:
            text = text.split(s)[0]
    return text


def encode_prompt(prompt: str | list[dict[str, str]], tokenizer, where: str = "eval item") -> list[int]:
    """Token ids of a prompt, as the prompt part of a training row."""
    special = not isinstance(prompt, list)  # a chat template writes BOS and the specials itself
    return list(tokenizer(prompt_text(prompt, tokenizer, where), add_special_tokens=special)["input_ids"])


def stop_token_ids(model, tokenizer) -> list[int]:
    """EOS of the tokenizer plus every EOS in the model's generation config (e.g. end of turn)."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gc = getattr(model, "generation_config", None)
    eos = getattr(gc, "eos_token_id", None) if gc is not None else None
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, (list, tuple)):
        ids.update(int(e) for e in eos)
    return sorted(ids)


def _pad_id(tokenizer) -> int:
    if tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id)
    return int(tokenizer.eos_token_id)


@torch.no_grad()
def generate_greedy(
    model,
    tokenizer,
    prompt_ids: Sequence[list[int]],
    *,
    max_new_tokens: int,
    batch_size: int,
    on_batch: Callable[[int], None] | None = None,
) -> list[Generation]:
    """Greedy continuations of tokenised prompts, in input order.

    Args:
        prompt_ids: n prompts, each a list of token ids.
        on_batch: called with the number of prompts finished after each batch.

    Returns:
        n :class:`Generation`.
    """
    from transformers import GenerationConfig

    n = len(prompt_ids)
    out: list[Generation | None] = [None] * n
    if n == 0:
        return []
    device = next(model.parameters()).device
    pad = _pad_id(tokenizer)
    stops = stop_token_ids(model, tokenizer)
    cfg = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        pad_token_id=pad,
        eos_token_id=stops or None,
    )
    order = sorted(range(n), key=lambda i: (len(prompt_ids[i]), i))
    for start in range(0, n, batch_size):
        idx = order[start : start + batch_size]
        T = max(len(prompt_ids[i]) for i in idx)
        input_ids = torch.full((len(idx), T), pad, dtype=torch.long)
        attn = torch.zeros((len(idx), T), dtype=torch.long)
        for r, i in enumerate(idx):
            ids = prompt_ids[i]
            input_ids[r, T - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attn[r, T - len(ids) :] = 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            seqs = model.generate(input_ids=input_ids.to(device), attention_mask=attn.to(device), generation_config=cfg)
        new = seqs[:, T:].tolist()
        for r, i in enumerate(idx):
            toks = new[r]
            cut = next((k for k, t in enumerate(toks) if t in stops), None)
            kept = toks if cut is None else toks[:cut]
            text = tokenizer.decode(kept, skip_special_tokens=True)
            out[i] = Generation(text=text, token_ids=kept, finished=cut is not None)
        if on_batch is not None:
            on_batch(len(idx))
    return out  # type: ignore[return-value]
