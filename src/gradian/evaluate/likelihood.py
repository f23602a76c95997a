r"""Teacher-forced log-probability of answers: base margins and the ``loglik`` metric.

A (prompt, answer) pair is tokenised exactly like a training row: an
:class:`~gradian.data.formats.Example` with ``prompt`` = the prompt in the
form the model runs on and ``completion`` = the answer, through
:func:`gradian.data.tokenize.tokenize_example` with
``TokenizeSpec(loss_on="completion")``. So the scored tokens are the
completion tokens the trainer would supervise, **including the end of the
answer**: EOS appended to a plain completion, or the chat template's
end-of-turn token (and whatever the template writes after it, e.g. ``"\n"``
in ChatML) for chat prompts. Ending there is part of what the model says.

For one pair with supervised positions S (labels ≠ -100, after the causal
shift), :func:`gradian.gradients.sequence_logprob` gives

    log p(answer | prompt) = Σ_{t ∈ S} log softmax(z_{t−1})[x_t]      (nats)

and the answer is the *greedy* continuation when every supervised token is
the arg-max of its predictive distribution.

An lm-evaluation-harness ``loglikelihood`` request is scored by lm-eval's own rule instead
(:func:`score_continuations`): ``log p(continuation | context)`` over the continuation's tokens alone, no end
token; a sample's logged number is that (``tests/evaluate/test_eval_lm_eval_real.py`` holds the two equal on a real
lm-eval 0.4.13 run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from gradian.data.formats import Example
from gradian.data.tokenize import (
    IGNORE_INDEX,
    TokenIds,
    TokenizedExample,
    TokenizeSpec,
    TokenOffsets,
    collate,
    tokenize_example,
)
from gradian.defaults import MAX_LENGTH
from gradian.gradients.loss import model_inputs, sequence_logprob


@dataclass
class AnswerScore:
    """Teacher-forced score of one (prompt, answer) pair.

    Attributes:
        logprob: Σ log p over the answer's supervised tokens (nats, ≤ 0).
        n_tokens: number of supervised tokens.
        greedy: every supervised token is the arg-max prediction.
        truncated: the pair was cut at ``max_length`` (the score covers only the kept tokens).
    """

    logprob: float
    n_tokens: int
    greedy: bool
    truncated: bool


@torch.no_grad()
def score_answers(
    model,
    tokenizer,
    examples: Sequence[Example],
    *,
    max_length: int = MAX_LENGTH,
    batch_size: int = 8,
    on_batch: Callable[[int], None] | None = None,
) -> list[AnswerScore]:
    """Score each example's completion given its prompt (see the module docstring).

    Args:
        examples: n examples (prompt = model-form prompt, completion = the answer).

    Returns:
        n :class:`AnswerScore`, in input order.
    """
    spec = TokenizeSpec(max_length=max_length, loss_on="completion", add_eos=True)
    toks = [tokenize_example(ex, tokenizer, spec, where=f"eval item {ex.id}") for ex in examples]
    return _score_tokenized(model, tokenizer, toks, batch_size, on_batch)


@torch.no_grad()
def score_continuations(
    model,
    tokenizer,
    pairs: Sequence[tuple[str, str, str]],
    *,
    max_length: int = MAX_LENGTH,
    batch_size: int = 8,
    on_batch: Callable[[int], None] | None = None,
) -> list[AnswerScore]:
    """lm-eval's ``loglikelihood`` of each ``(id, context, continuation)``, as lm-eval computes it.

    ``Σ log p`` over the continuation's tokens, by lm-evaluation-harness 0.4.13's rule for a causal model
    (``TemplateLM._encode_pair`` and ``HFLM.tok_encode`` with ``add_bos_token`` unset):

    * the context's trailing whitespace moves to the start of the continuation;
    * ``whole = encode(context + continuation)``, ``ctx = encode(context)``, and the scored tokens are
      ``whole[len(ctx):]``; no end-of-sequence or end-of-turn token is added;
    * ``encode`` adds the tokenizer's special tokens unless the string starts with its BOS text (a chat template
      that writes BOS itself).

    ``greedy`` is lm-eval's ``is_greedy``. A pair longer than ``max_length`` keeps its first tokens (lm-eval keeps
    the last); it is marked ``truncated``.
    """
    bos_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    bos = tokenizer.decode([bos_id]) if bos_id is not None else ""

    def encode(text: str) -> list[int]:
        special = not (bos and text.startswith(bos))
        return list(tokenizer(text, add_special_tokens=special)["input_ids"])

    toks = []
    for item_id, context, continuation in pairs:
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
        whole, ctx = encode(context + continuation), encode(context)
        labels = [IGNORE_INDEX] * len(ctx) + whole[len(ctx) :]
        if labels:
            labels[0] = IGNORE_INDEX  # the first token has no context (as tokenize_example)
        full, text = len(whole), context + continuation
        toks.append(
            TokenizedExample(
                id=item_id,
                input_ids=TokenIds(whole[:max_length]),
                labels=TokenIds(labels[:max_length]),
                offsets=TokenOffsets([]),
                text=text,
                completion_char_start=len(context),
                full_length=full,
                truncated=full > max_length,
                prompt_length=len(ctx),
            )
        )
    return _score_tokenized(model, tokenizer, toks, batch_size, on_batch)


def _score_tokenized(model, tokenizer, toks, batch_size: int, on_batch) -> list[AnswerScore]:
    """Teacher-forced :class:`AnswerScore` of tokenised pairs (their supervised tokens), in input order."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(model.parameters()).device
    out: list[AnswerScore | None] = [None] * len(toks)
    order = sorted(range(len(toks)), key=lambda i: (len(toks[i].input_ids), i))
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        batch = collate([toks[i] for i in idx], int(pad), padding_side="right")
        batch = {k: v.to(device) for k, v in batch.items()}
        logits = model(**model_inputs(batch)).logits  # (b, T, V)
        lp = sequence_logprob(logits, batch["labels"])  # (b,)
        shift_labels = batch["labels"][:, 1:]
        mask = shift_labels != IGNORE_INDEX
        hit = (logits[:, :-1, :].argmax(-1) == shift_labels) | ~mask
        greedy = hit.all(-1)
        for r, i in enumerate(idx):
            out[i] = AnswerScore(
                logprob=float(lp[r]),
                n_tokens=int(mask[r].sum()),
                greedy=bool(greedy[r]) and bool(mask[r].any()),
                truncated=toks[i].truncated,
            )
        if on_batch is not None:
            on_batch(len(idx))
    return out  # type: ignore[return-value]
