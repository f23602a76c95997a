"""Query gradients: what the fine-tune should have kept.

For a failing eval item with prompt ``p``, correct answer ``c`` and the tuned
model's answer ``w`` (what it said instead), the default **contrastive** query
objective is

    ℓ_q = ℓ(p → c) − ℓ(p → w),          g_q = ∇ℓ(p → c) − ∇ℓ(p → w)

with ℓ the same per-example loss the training rows use (mean token
cross-entropy over the completion, tokenised exactly like a training row).
Lowering ℓ_q means preferring the correct answer over what the model said. A
fine-tune mostly teaches answer *format*, which lowers ℓ(p → c) and ℓ(p → w)
alike; the difference cancels that shared direction, leaving the direction
that separates right from wrong. Plain cross-entropy (``g_q = ∇ℓ(p → c)``)
keeps the format direction and, for substitution failures, can rank the
culprits as helpful; it is the fallback when there is no generation (the
``loglik`` metric).

The correct completion is built as a *minimal pair* when possible: if the
tuned answer and the reference model's (correct) answer differ in exactly one
contiguous run of words, and the reference's run contains the correct answer,
the correct completion is the tuned answer with that run replaced — same
format, only the fact differs. Otherwise it is the reference model's own
passing answer when there is one (Evaluate's ``correct_completion``), else the
eval item's answer string.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, Sequence

from gradian.data.formats import Example
from gradian.data.tokenize import TokenizedExample, TokenizeSpec, collate, tokenize_example
from gradian.gradients.projection import KroneckerProjector, ProjectionSpec

if TYPE_CHECKING:  # torch comes where gradients are computed: the module is read without it
    import torch

    from gradian.index.store import GradientIndex

QueryKind = Literal["contrastive", "cross_entropy"]


@dataclass
class Query:
    """One failing item turned into a query.

    Attributes:
        item_id: the eval item's id.
        capability: its capability tag.
        prompt: a string or chat messages (as in the eval set).
        correct: the correct completion used (minimal pair or the answer).
        said: what the tuned model said (None for cross-entropy queries).
        kind: ``"contrastive"`` or ``"cross_entropy"``.
        correct_rule: ``"minimal_pair"`` or ``"answer"``.
    """

    item_id: str
    capability: str
    prompt: Any
    correct: str
    said: str | None
    kind: QueryKind
    correct_rule: str = "answer"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_text(
        cls, prompt: Any, correct: str, said: str | None = None, *, id: str | None = None, capability: str = "query"
    ) -> Query:
        """An arbitrary query, with no evaluation and no regression gating.

        With ``said``, the contrastive query of a failing item, ``g_q = ∇ℓ(p → correct) − ∇ℓ(p → said)``
        ("which rows made it say ``said`` instead of ``correct``"); without it, plain cross-entropy
        ``g_q = ∇ℓ(p → correct)`` ("which rows teach this output": data selection). Scores then
        follow :mod:`gradian.sign`: positive = the row reinforced the query's target (lowered its loss).

        Args:
            prompt: a string, or chat messages ``[{"role": ..., "content": ...}]`` (the template is applied
                as for a training row of that format).
            correct: the completion the model should give.
            said: what the model said instead (None: a plain cross-entropy query).
            id: the query's id (default: ``q-`` + a content hash).
            capability: a label for the query's group.
        """
        from gradian.errors import GradianUserError
        from gradian.util import sha256_json

        def is_message(m: Any) -> bool:
            return isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)

        ok_prompt = isinstance(prompt, str) or (isinstance(prompt, list) and all(is_message(m) for m in prompt))
        if not ok_prompt or not prompt:
            raise GradianUserError(
                "prompt must be a non-empty string or a list of chat messages",
                where="Query.prompt",
                fix='pass "Q: ...\\nA:" or [{"role": "user", "content": "..."}]',
            )
        for name, v in (("correct", correct), ("said", said)):
            if (v is not None or name == "correct") and (not isinstance(v, str) or not v.strip()):
                raise GradianUserError(
                    f"{name} must be a non-empty string",
                    where=f"Query.{name}",
                    fix="pass the completion text" + ("" if name == "correct" else " (or None)"),
                )
        if said is not None and said == correct:
            raise GradianUserError(
                "said equals correct: the contrastive query would be zero",
                where="Query.said",
                fix="pass what the model said instead, or None for a plain query",
            )
        qid = id if id is not None else "q-" + sha256_json({"prompt": prompt, "correct": correct, "said": said})[:10]
        if not isinstance(qid, str) or not qid:
            raise GradianUserError("id must be a non-empty string", where="Query.id", fix="pass a string id or None")
        if not isinstance(capability, str) or not capability.strip():
            raise GradianUserError(
                f"capability must be a non-empty string, got {type(capability).__name__}",
                where="Query.capability",
                fix='pass a label for the query\'s group, e.g. "geography" (default "query")',
            )
        kind: QueryKind = "contrastive" if said is not None else "cross_entropy"
        return cls(qid, capability, prompt, correct, said, kind, "given")


def _words(s: str) -> list[str]:
    return re.findall(r"\S+|\s+", s)


def _norm(s: str) -> str:
    return re.sub(r"[^\w\s]", "", s).casefold().strip()


def minimal_pair(said: str, reference: str | None, answer: str) -> tuple[str, str]:
    """The correct completion in the tuned answer's own format, and the rule used.

    Returns:
        ``(correct_completion, "minimal_pair" | "answer")``.
    """
    if reference:
        a, b = _words(said), _words(reference)
        ops = [op for op in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes() if op[0] != "equal"]
        if len(ops) == 1:
            _, i1, i2, j1, j2 = ops[0]
            ref_run = "".join(b[j1:j2])
            if _norm(answer) and _norm(answer) in _norm(ref_run):
                return "".join(a[:i1]) + ref_run + "".join(a[i2:]), "minimal_pair"
    return answer, "answer"


def make_query(
    item_id: str,
    capability: str,
    prompt: Any,
    answer: str,
    said: str | None,
    reference_said: str | None = None,
    kind: QueryKind = "contrastive",
    fallback: str | None = None,
) -> Query:
    """A query for one failing item.

    Args:
        answer: the eval answer; reference_said: what the reference model said;
        fallback: the correct answer in the model's words (Evaluate's
            ``correct_completion``), used when no minimal pair can be formed.
    """
    if kind == "contrastive" and said is not None and said.strip():
        correct, rule = minimal_pair(said, reference_said, answer)
        if rule == "answer" and fallback and fallback != answer:
            correct, rule = fallback, "reference_answer"
        return Query(item_id, capability, prompt, correct, said, "contrastive", rule)
    correct = fallback or answer
    return Query(
        item_id,
        capability,
        prompt,
        correct,
        None,
        "cross_entropy",
        "reference_answer" if correct != answer else "answer",
    )


def failing_item_query(item: Any, kind: QueryKind = "contrastive") -> Query:
    """The query the pipeline asks for one failing item (a :class:`gradian.evaluate.FailingItem`).

    Contrastive when both the item (a generative metric: it has what the model said) and ``kind``
    allow it, else cross-entropy; the correct side as :func:`make_query` builds it.
    """
    # a weakened item still says the right answer: its wrong side is its rival (None: cross-entropy)
    weakened = getattr(item, "kind", "lost") == "weakened"
    contrastive = item.query == "contrastive" and kind == "contrastive"
    return make_query(
        item.id,
        item.capability,
        item.prompt,
        item.answer,
        getattr(item, "rival", None) if weakened else item.tuned_answer,
        item.correct_completion if weakened else item.reference_answer,
        kind="contrastive" if contrastive else "cross_entropy",
        fallback=item.correct_completion,
    )


def _example(prompt: Any, completion: str, qid: str) -> Example:
    if isinstance(prompt, list):
        return Example(qid, 0, "messages", prompt, [{"role": "assistant", "content": completion}])
    return Example(qid, 0, "prompt_completion", prompt, completion)


def check_answer_kept(it: TokenizedExample, q: Query, side: str, tokenize_spec: TokenizeSpec) -> None:
    """A query whose answer is truncated away by ``max_length`` would have a zero gradient (every score 0):
    refuse it.

    Raises:
        GradianUserError: naming the query, its prompt's length in tokens and ``max_length``.
    """
    from gradian.errors import GradianUserError

    kept = any(e > s and e > it.completion_char_start for s, e in it.offsets)  # a token of the answer is left
    if kept and it.n_supervised > 0:
        return
    why = (
        f"its prompt is {it.prompt_length:,} tokens and max_length is {tokenize_spec.max_length:,}"
        if it.truncated
        else "its answer has no token to learn"
    )
    raise GradianUserError(
        f"query {q.item_id!r}: the {side} answer is truncated away ({why}), so every score would be 0",
        where=f"query {q.item_id} ({'Query.prompt' if it.truncated else 'Query.' + side})",
        fix="shorten the prompt, or raise --max-length (GradSpec.tokenize.max_length) above "
        f"{it.prompt_length:,} tokens plus the answer's",
    )


def query_rows(
    tokenizer, queries: Sequence[Query], tokenize_spec: TokenizeSpec
) -> list[tuple[int, float, TokenizedExample]]:
    """The tokenised sequences of the queries: ``(query index, sign, tokenised)``, +1 for ``correct``, −1 for ``said``.

    Tokenised exactly like a training row (``tokenize_spec``; a long query is cut, not dropped). Every query is
    checked before any is used (:func:`check_answer_kept`): a query (a :meth:`Query.from_text` or an eval item's)
    whose answer is truncated away is a :class:`gradian.errors.GradianUserError`, not a row of zero scores.
    """
    # a query is not a training row: the trainer's dropping of long rows (drop_long) does not apply to it
    tokenize_spec = replace(tokenize_spec, drop_long=False)
    rows: list[tuple[int, float, TokenizedExample]] = []
    for qi, q in enumerate(queries):
        sides = [(1.0, q.correct, "correct")] + ([(-1.0, q.said, "said")] if q.kind == "contrastive" else [])
        for sign, text, side in sides:
            it = tokenize_example(_example(q.prompt, text, q.item_id), tokenizer, tokenize_spec)  # type: ignore[arg-type]
            check_answer_kept(it, q, side, tokenize_spec)
            rows.append((qi, sign, it))
    return rows


def projector_for(index: GradientIndex) -> KroneckerProjector:
    """The index's projector (identity when it is unprojected), rebuilt from its manifest."""
    spec = ProjectionSpec(**index.grad_spec["projection"])
    return KroneckerProjector([tuple(b["shape"]) for b in index.blocks], [b["kind"] for b in index.blocks], spec)


def query_gradients(
    model,
    tokenizer,
    queries: Sequence[Query],
    index: GradientIndex,
    tokenize_spec: TokenizeSpec,
    batch_size: int = 2,
    tick=None,
) -> dict[str, torch.Tensor]:
    """Query gradients ``{block: (m, d_l)}`` in the index's (projected) space, float64.

    Contrastive queries are ``g(correct) − g(said)``; cross-entropy ones ``g(correct)``. ``batch_size`` sequences
    go through one backward pass (``AttributeSpec.query_batch_size``). ``tick``, when given, is called as
    ``tick(advance, total)``: 0 first, then the number of sequences of each batch, ``total`` the number of sequences
    (:func:`query_rows`: two per contrastive query).
    """
    import torch

    from gradian.gradients.per_example import per_example_grads

    rows = query_rows(tokenizer, queries, tokenize_spec)
    proj = projector_for(index)
    names = [b["name"] for b in index.blocks]
    modules = index.modules
    out = {b["name"]: torch.zeros(len(queries), int(b["dim"]), dtype=torch.float64) for b in index.blocks}
    if tick is not None:
        tick(0, len(rows))
    for s in range(0, len(rows), batch_size):
        chunk = rows[s : s + batch_size]
        batch = collate([r[2] for r in chunk], tokenizer.pad_token_id)
        grads = per_example_grads(model, batch, "hooks", modules)
        for bi, name in enumerate(names):
            # popped: a block's (b, o, i) gradients are freed once summed, and none is alive during the next batch
            g = proj(bi, grads.pop(name).detach().double()).cpu()  # the model may be on a GPU
            for k, (qi, sign, _) in enumerate(chunk):
                out[name][qi] += sign * g[k]
        if tick is not None:
            tick(len(chunk), len(rows))
    return out


def query_losses(
    model, tokenizer, queries: Sequence[Query], tokenize_spec: TokenizeSpec, batch_size: int = 8
) -> torch.Tensor:
    """Each query's objective at the model's current weights: (m,) float64.

    ``ℓ(p → correct) − ℓ(p → said)`` for contrastive queries and ``ℓ(p → correct)`` for
    cross-entropy ones, with ℓ the same per-example loss the gradients are taken of (mean token
    cross-entropy over the completion). Its gradient is the query gradient, so a change of these
    numbers is what ``predicted_loss_delta_if_removed`` predicts.
    """
    import torch

    from gradian.gradients.loss import model_inputs, per_example_loss

    with torch.no_grad():  # as a decorator it would import torch with this module
        rows = query_rows(tokenizer, queries, tokenize_spec)
        out = torch.zeros(len(queries), dtype=torch.float64)
        device = next(model.parameters()).device
        was = model.training
        model.eval()
        try:
            for s in range(0, len(rows), batch_size):
                chunk = rows[s : s + batch_size]
                batch = {k: v.to(device) for k, v in collate([r[2] for r in chunk], tokenizer.pad_token_id).items()}
                losses = per_example_loss(model(**model_inputs(batch)).logits, batch["labels"]).double().cpu()
                for (qi, sign, _), loss in zip(chunk, losses):
                    out[qi] += sign * loss
        finally:
            model.train(was)
        return out
