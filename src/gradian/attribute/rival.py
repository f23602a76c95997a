"""The wrong answer a weakened item is nearest to: the other side of its contrastive query.

A weakened item (``--weakened``) is one the tuned model still passes while holding its answer less firmly
than the reference (:class:`gradian.evaluate.result.Shift`). It has no wrong answer of the model's to
contrast with, and plain cross-entropy on the correct answer keeps the format direction that a fine-tune
mostly teaches (docs/how-it-works.md). So Gradian asks the tuned model for the nearest wrong answer, in the
same words as its own:

1. the tuned model's answer ``a`` (its tokens after the prompt) and the first token ``t`` of the accepted
   answer inside it ("The capital of France is **Paris**.": the token of "Paris");
2. the tuned model's next-token distribution at ``t``, given the prompt and ``a[:t]``; its most probable
   tokens other than ``a[t]`` (at most ``RIVAL_CANDIDATES``), each continued greedily to the end of the answer;
3. the rival is the first of those continuations, in order of probability, that the item's metric judges
   wrong and that is a substitution: it differs from ``a`` in one run of at most
   ``max(3, 2 × the accepted answer's words)`` words ("The capital of France is Lyon."; not "The capital of
   France is a country in Western Europe, part of …", which contrasts the answer with another kind of row).

The query is then ``∇ℓ(p → a) − ∇ℓ(p → rival)``: a minimal pair whose shared words, and the format they carry,
cancel, as for a lost item. None when the answer does not contain an accepted answer, or no candidate is wrong.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from gradian.evaluate.generate import encode_prompt, generate_greedy
from gradian.evaluate.normalize import TEXT_METRICS, NormalizeSpec, extract_answer

RIVAL_CANDIDATES = 5


def _answer_token(tokenizer, answer: str, accepted: Sequence[str]) -> tuple[list[int], int] | None:
    """The answer's token ids and the index of the first token of the earliest accepted answer in it."""
    low = answer.casefold()
    hits = [low.find(a.casefold()) for a in accepted if a.strip()]
    hits = [h for h in hits if h >= 0]
    if not hits:
        return None
    start = min(hits)
    enc = tokenizer(answer, add_special_tokens=False, return_offsets_mapping=True)
    for k, (_, b) in enumerate(enc["offset_mapping"]):
        if b > start:
            return list(enc["input_ids"]), k
    return None


def _substitution(said: str, rival: str, answer: str) -> bool:
    """``rival`` differs from ``said`` in one run of words, of at most ``max(3, 2 × len(answer words))``."""
    import difflib

    a, b = said.split(), rival.split()
    ops = [op for op in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes() if op[0] != "equal"]
    return len(ops) == 1 and ops[0][4] - ops[0][3] <= max(3, 2 * len(answer.split()))


@torch.no_grad()
def rival_answers(
    model,
    tokenizer,
    items: Sequence[Any],
    *,
    max_new_tokens: int,
    batch_size: int,
    normalize: NormalizeSpec | None = None,
) -> list[str | None]:
    """The nearest wrong answer of each item (module docstring), with the model as it is (the tuned adapter).

    Args:
        items: n :class:`gradian.evaluate.FailingItem` of ``kind="weakened"`` (``tuned_answer`` passes).

    Returns:
        n rival answers (extracted first lines), or None where none was found.
    """
    was_training = model.training
    model.eval()  # no dropout in the forward passes
    try:
        cands = rival_candidates(model, tokenizer, items, max_new_tokens, batch_size, normalize or NormalizeSpec())
        return [c[0] if c else None for c in cands]
    finally:
        model.train(was_training)


def rival_candidates(
    model, tokenizer, items: Sequence[Any], max_new_tokens: int, batch_size: int, norm: NormalizeSpec
) -> list[list[str]]:
    """Per item, every candidate of step 2 (module docstring) that passes step 3, in order of probability, without
    repeats: the rival is the first (:func:`rival_answers`; the model as it is, in eval mode, under no_grad).
    """
    device = next(model.parameters()).device
    # per item with an answer token: (item index, its answer, prompt length, prefix ids, candidate token ids)
    plans: list[tuple[int, str, int, list[int], list[int]]] = []
    for i, it in enumerate(items):
        said = it.tuned_answer or it.correct_completion
        found = _answer_token(tokenizer, said, [it.answer, *it.aliases])
        if found is None:
            continue
        ids, t = found
        prompt = encode_prompt(it.prompt, tokenizer, f"eval item {it.id}")
        prefix = prompt + ids[:t]
        logits = model(input_ids=torch.tensor([prefix], device=device)).logits[0, -1]
        top = torch.topk(logits.float(), RIVAL_CANDIDATES + 1).indices.tolist()
        plans.append((i, said, len(prompt), prefix, [c for c in top if c != ids[t]][:RIVAL_CANDIDATES]))
    starts = [prefix + [c] for *_, prefix, cands in plans for c in cands]
    gens = iter(generate_greedy(model, tokenizer, starts, max_new_tokens=max_new_tokens, batch_size=batch_size))
    out: list[list[str]] = [[] for _ in items]
    for i, said, n_prompt, prefix, cands in plans:
        it = items[i]
        for c, g in zip(cands, gens):  # this item's continuations, in order of probability
            text = tokenizer.decode(prefix[n_prompt:] + [c] + g.token_ids, skip_special_tokens=True)
            answer = extract_answer(text, norm)
            wrong = answer.strip() and not TEXT_METRICS[it.metric](text, [it.answer, *it.aliases], norm)
            if wrong and _substitution(said, answer, it.answer) and answer not in out[i]:
                out[i].append(answer)
    return out
