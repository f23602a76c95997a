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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from gradian.data.formats import Example
from gradian.data.tokenize import IGNORE_INDEX, TokenizeSpec, collate, tokenize_example
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
