"""``evaluate()``: reference vs tuned on an eval set, on an already-loaded PEFT model.

Steps (all under ``torch.no_grad``; the model is left as it was found: same
active adapter, same ``requires_grad`` flags, same train/eval mode, so the
attribution lane can reuse it):

1. **tuned**: the active adapter. Generative items (exact_match / contains) are
   generated greedily in batches and judged (:mod:`gradian.evaluate.normalize`);
   loglik items are scored by teacher forcing (:mod:`gradian.evaluate.likelihood`).
2. **reference**: the same with the adapter disabled (``peft_model.disable_adapter()``),
   or with a second adapter (an earlier checkpoint) loaded under a temporary name,
   activated with ``set_adapter``, and deleted afterwards.
3. **base margins**: for every generative item the tuned model fails, with the
   adapter disabled, m = log p_base(correct) − log p_base(tuned model's answer), where
   "correct" is the reference's own passing answer when it has one (same format as
   the tuned answer, so the margin measures the fact, not the phrasing), else the
   eval set's answer; the margin with the bare eval-set answer is kept beside it.
4. **shifts**: for every generative item both models pass (``kept``), the log-probability of the
   reference's own answer under the reference and under the tuned model, ``nats = logp_tuned −
   logp_reference`` (:class:`~gradian.evaluate.result.Shift`): how far the tuned model moved off an
   answer it still gives. Attribution can query the items it weakened most (``--weakened``).
5. **per capability**: scores, delta, paired-bootstrap CI, verdict, base bounds.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from gradian.errors import GradianUserError
from gradian.evaluate.bootstrap import paired_bootstrap, sign_test_p
from gradian.evaluate.generate import cut_at_stops, encode_prompt, generate_greedy, prompt_text
from gradian.evaluate.items import GENERATIVE_METRICS, EvalItem, as_example, check_items, model_prompt
from gradian.evaluate.likelihood import score_answers, score_continuations
from gradian.evaluate.normalize import TEXT_METRICS, extract_answer, normalize_answer
from gradian.evaluate.result import STATUSES, CapabilityResult, EvalResult, ItemResult, Margin, ModelAnswer, Shift
from gradian.evaluate.spec import EvalSpec
from gradian.evaluate.verdict import LOGLIK_QUERY_NOTE, base_bounds, decide
from gradian.models.load import dora_cached
from gradian.util import attrs

#: progress(task, advance, total): ``task`` names the stage, ``advance`` items just finished.
Progress = Callable[[str, int, int], None]

REFERENCE_ADAPTER_NAME = "gradian_reference"


def _require_peft(model) -> None:
    if not hasattr(model, "disable_adapter") or not hasattr(model, "peft_config"):
        raise TypeError(
            "evaluate() needs a PEFT model (the base with the tuned adapter loaded, "
            "e.g. from gradian.models.load.load_adapter)"
        )


def _snapshot(model) -> dict[str, Any]:
    return {
        "grad": {n: p.requires_grad for n, p in model.named_parameters()},
        "training": model.training,
        "active": model.active_adapter,
    }


def _restore(model, snap: dict[str, Any]) -> None:
    if model.active_adapter != snap["active"]:
        model.set_adapter(snap["active"])
    for n, p in model.named_parameters():
        if n in snap["grad"]:
            p.requires_grad_(snap["grad"][n])
    model.train(snap["training"])


class _UnwrappedModules:
    """Presents a PEFT model's modules with each LoRA wrapper replaced by its base layer,
    so :func:`gradian.models.load.check_adapter_fits` can check a second adapter.
    """

    def __init__(self, peft_model) -> None:
        self._m = peft_model.get_base_model()

    def named_modules(self):
        for name, mod in self._m.named_modules():
            yield name, getattr(mod, "base_layer", mod)


@contextlib.contextmanager
def _reference_active(model, reference_adapter: str | Path | None) -> Iterator[dict[str, Any]]:
    """Make the reference model current for the duration of the block."""
    if reference_adapter is None:
        with model.disable_adapter():
            yield {"kind": "base"}
        return
    from gradian.models.load import check_adapter_fits, read_adapter_config

    original = model.active_adapter
    ref = str(reference_adapter)
    loaded = False
    if ref in model.peft_config:
        name = ref
    else:
        cfg = read_adapter_config(ref)
        check_adapter_fits(_UnwrappedModules(model), ref, cfg)  # type: ignore[arg-type]
        name = REFERENCE_ADAPTER_NAME
        k = 1
        while name in model.peft_config:
            k += 1
            name = f"{REFERENCE_ADAPTER_NAME}_{k}"
        model.load_adapter(ref, adapter_name=name, is_trainable=False)
        loaded = True
    if name == original:
        raise GradianUserError(
            "the reference adapter is the tuned adapter itself",
            where="--reference-adapter",
            fix="pass an earlier checkpoint, or omit it to compare against the base model",
        )
    try:
        model.set_adapter(name, inference_mode=True)
        model.eval()
        yield {"kind": "adapter", "adapter": ref}
    finally:
        model.set_adapter(original)
        if loaded:
            model.delete_adapter(name)


def adapter_active(model, adapter: str | Path):
    """A context manager: another adapter folder loaded beside the tuned one and made current for the
    block (checked against the base first), then removed; the tuned adapter is current again after.
    """
    return _reference_active(model, adapter)


def _run_model(
    model,
    tokenizer,
    items: Sequence[EvalItem],
    prompts: Sequence[str | list[dict[str, str]]],
    spec: EvalSpec,
    label: str,
    progress: Progress | None,
) -> tuple[list[ModelAnswer], float, float]:
    """Score every item with the currently active model. Returns (answers, generate_s, score_s)."""
    answers: list[ModelAnswer | None] = [None] * len(items)
    gen_idx = [i for i, it in enumerate(items) if it.metric in GENERATIVE_METRICS]
    ll_idx = [i for i, it in enumerate(items) if it.metric == "loglik"]

    t0 = time.perf_counter()
    if gen_idx:
        ids = [encode_prompt(prompts[i], tokenizer, items[i].where or f"eval item {items[i].id}") for i in gen_idx]
        task = f"{label}: generate"
        cb = (lambda k: progress(task, k, len(gen_idx))) if progress else None
        gens = generate_greedy(
            model, tokenizer, ids, max_new_tokens=spec.max_new_tokens, batch_size=spec.batch_size, on_batch=cb
        )
        for i, g in zip(gen_idx, gens):
            it = items[i]
            text = cut_at_stops(g.text, it.stop)
            ok = TEXT_METRICS[it.metric](text, it.accepted, spec.normalize)
            answers[i] = ModelAnswer(
                score=1.0 if ok else 0.0,
                passed=ok,
                output=text,
                answer=extract_answer(text, spec.normalize),
                finished=g.finished,
            )
    t1 = time.perf_counter()
    if ll_idx:
        exs, pairs, owner, pair_owner = [], [], [], []
        for i in ll_idx:
            it = items[i]
            for a in it.accepted:
                if it.ends:
                    exs.append(as_example(it.id, prompts[i], a))
                    owner.append(i)
                else:  # an lm-eval sample: lm-eval's own rule, over the prompt as the model runs it
                    pairs.append((it.id, prompt_text(prompts[i], tokenizer, it.where or it.id), a))
                    pair_owner.append(i)
        task = f"{label}: loglik"
        scores = _scores(model, tokenizer, exs, spec, task, progress)
        scores += _scores(model, tokenizer, pairs, spec, task, progress, score=score_continuations)
        best: dict[int, float] = {}
        greedy: dict[int, bool] = {}
        for i, s in zip(owner + pair_owner, scores):
            best[i] = max(best.get(i, -np.inf), s.logprob)
            greedy[i] = greedy.get(i, False) or s.greedy
        for i in ll_idx:
            answers[i] = ModelAnswer(score=float(best[i]), passed=bool(greedy[i]))
    t2 = time.perf_counter()
    return answers, t1 - t0, t2 - t1  # type: ignore[return-value]


def _scores(
    model, tokenizer, exs: Sequence, spec: EvalSpec, task: str, progress: Progress | None, score=score_answers
) -> list:
    """``score`` (:func:`score_answers`, or :func:`score_continuations` for lm-eval's pairs) of ``exs`` with the
    active model, reported to ``progress`` as ``task``.
    """
    if not exs:
        return []
    cb = (lambda k: progress(task, k, len(exs))) if progress else None
    return score(model, tokenizer, exs, max_length=spec.max_length, batch_size=spec.batch_size, on_batch=cb)


def _status(ref_pass: bool, tuned_pass: bool) -> str:
    if ref_pass and tuned_pass:
        return "kept"
    if ref_pass:
        return "lost"
    if tuned_pass:
        return "gained"
    return "both_fail"


@dora_cached  # a DoRA layer forms BA and its weight norm once, not for every generated token
def evaluate(
    model,
    tokenizer,
    eval_items: Sequence[EvalItem],
    *,
    reference_adapter: str | Path | None = None,
    spec: EvalSpec | None = None,
    progress: Progress | None = None,
    meta: dict[str, Any] | None = None,
) -> EvalResult:
    """Evaluate the tuned adapter against its reference on ``eval_items``.

    Args:
        model: a PEFT model whose active adapter is the tuned one (base + adapter, loaded once).
        tokenizer: its tokenizer.
        eval_items: from :func:`gradian.evaluate.load_eval_set`.
        reference_adapter: None → the base model (adapter disabled); else an adapter folder
            (an earlier checkpoint), or the name of an adapter already loaded in ``model``.
        spec: the :class:`EvalSpec` (defaults if None).
        progress: optional callback ``progress(task, advance, total)``.
        meta: free-form context stored in the result (paths, hashes).

    Returns:
        :class:`EvalResult`. The model comes back with the tuned adapter active and its
        ``requires_grad`` flags and train/eval mode unchanged.
    """
    _require_peft(model)
    spec = spec or EvalSpec()
    items = list(eval_items)
    check_items(items)
    for it in items:
        if it.metric in GENERATIVE_METRICS and not any(normalize_answer(a, spec.normalize) for a in it.accepted):
            raise GradianUserError(
                f"field 'answer' ({it.answer!r}) is empty after normalisation, so no output can match it",
                where=it.where or f"eval item {it.id}",
                fix="give an answer with letters or digits, or use the loglik metric",
            )
    prompts = [model_prompt(it.prompt, tokenizer, spec.use_chat_template and not it.raw) for it in items]
    torch.manual_seed(spec.seed)
    t_start = time.perf_counter()
    snap = _snapshot(model)
    timing = {"generate": 0.0, "score": 0.0}
    try:
        model.eval()
        tuned, g, s = _run_model(model, tokenizer, items, prompts, spec, "tuned", progress)
        timing["generate"] += g
        timing["score"] += s
        with _reference_active(model, reference_adapter) as ref_info:
            ref, g, s = _run_model(model, tokenizer, items, prompts, spec, "reference", progress)
            t0 = time.perf_counter()
            kept = [
                i
                for i, it in enumerate(items)
                if it.metric in GENERATIVE_METRICS and ref[i].passed and tuned[i].passed and ref[i].answer
            ]
            kept_exs = [as_example(items[i].id, prompts[i], ref[i].answer) for i in kept]
            ref_kept = _scores(model, tokenizer, kept_exs, spec, "reference: shifts", progress)
        ref_kept_s = time.perf_counter() - t0
        timing["generate"] += g
        timing["score"] += s + ref_kept_s
        t0 = time.perf_counter()
        tuned_kept = _scores(model, tokenizer, kept_exs, spec, "tuned: shifts", progress)
        shifts: list[Shift | None] = [None] * len(items)
        for i, r, tk in zip(kept, ref_kept, tuned_kept):
            shifts[i] = Shift(
                nats=tk.logprob - r.logprob,
                correct=ref[i].answer,
                logp_reference=r.logprob,
                logp_tuned=tk.logprob,
                tokens=r.n_tokens,
            )
        timing["score"] += time.perf_counter() - t0

        # base margins for every generative item the tuned model fails (adapter disabled)
        need = [i for i, it in enumerate(items) if it.metric in GENERATIVE_METRICS and not tuned[i].passed]
        margins: list[Margin | None] = [None] * len(items)
        if need:
            t0 = time.perf_counter()
            exs, slots = [], []
            for i in need:
                own = ref[i].answer if ref[i].passed and ref[i].answer else None
                texts = {"said": tuned[i].answer or "", "gold": items[i].answer}
                if own is not None and own != items[i].answer:
                    texts["own"] = own
                slot = {}
                for key, text in texts.items():
                    slot[key] = len(exs)
                    exs.append(as_example(items[i].id, prompts[i], text))
                slots.append((texts, slot))
            with model.disable_adapter():
                sc = _scores(model, tokenizer, exs, spec, "base: margins", progress)
            for i, (texts, slot) in zip(need, slots):
                said, gold = sc[slot["said"]], sc[slot["gold"]]
                key = "own" if "own" in slot else "gold"
                corr = sc[slot[key]]
                margins[i] = Margin(
                    nats=corr.logprob - said.logprob,
                    correct=texts[key],
                    correct_source="reference" if ref[i].passed and ref[i].answer else "answer",
                    logp_correct=corr.logprob,
                    logp_said=said.logprob,
                    tokens_correct=corr.n_tokens,
                    tokens_said=said.n_tokens,
                    gold_nats=gold.logprob - said.logprob,
                    logp_gold=gold.logprob,
                    tokens_gold=gold.n_tokens,
                )
            timing["score"] += time.perf_counter() - t0
    finally:
        _restore(model, snap)

    item_results = [
        ItemResult(
            **attrs(it, "id", "row", "capability", "metric", "prompt", "answer"),
            model_prompt=prompts[i],
            aliases=list(it.aliases),
            reference=ref[i],
            tuned=tuned[i],
            status=_status(ref[i].passed, tuned[i].passed),
            base_margin=margins[i],
            shift=shifts[i],
        )
        for i, it in enumerate(items)
    ]
    caps = summarise(item_results, spec)
    notes = []
    if any(it.metric == "loglik" for it in items):
        notes.append(LOGLIK_QUERY_NOTE)
    timing["total"] = time.perf_counter() - t_start
    return EvalResult(
        spec=spec,
        reference=ref_info,
        capabilities=caps,
        items=item_results,
        notes=notes,
        timing={k: round(v, 3) for k, v in timing.items()},
        meta=dict(meta or {}),
    )


def answer_items(
    model,
    tokenizer,
    eval_items: Sequence[EvalItem],
    spec: EvalSpec | None = None,
    progress: Progress | None = None,
    label: str = "tuned",
) -> list[ModelAnswer]:
    """The active adapter's answers and scores on ``eval_items`` only (no reference, no margins).

    What :func:`evaluate` does for its tuned side, for callers that already hold the other side's
    per-item scores (``gradian verify`` compares retrained adapters with the original tuned one).
    The model's state is restored afterwards.
    """
    spec = spec or EvalSpec()
    items = list(eval_items)
    check_items(items)
    prompts = [model_prompt(it.prompt, tokenizer, spec.use_chat_template and not it.raw) for it in items]
    snap = _snapshot(model)
    try:
        model.eval()
        answers, _, _ = _run_model(model, tokenizer, items, prompts, spec, label, progress)
    finally:
        _restore(model, snap)
    return answers


def summarise(items: Sequence[ItemResult], spec: EvalSpec) -> list[CapabilityResult]:
    """Per-capability scores, paired-bootstrap CI, verdict and base bounds (sorted by name).

    The bootstrap seed of a capability is ``spec.seed``, so every capability's CI
    is reproducible on its own.
    """
    by_cap: dict[str, list[ItemResult]] = {}
    for it in items:
        by_cap.setdefault(it.capability, []).append(it)
    out = []
    for name in sorted(by_cap):
        its = by_cap[name]
        n = len(its)
        metric = its[0].metric
        r = np.array([it.reference.score for it in its], dtype=np.float64)
        t = np.array([it.tuned.score for it in its], dtype=np.float64)
        ci = paired_bootstrap(r, t, resamples=spec.resamples, confidence=spec.confidence, seed=spec.seed)
        verdict, diagnosed, reason = decide(n, ci.low, ci.high, min_items=spec.min_items, confidence=spec.confidence)
        statuses = [it.status for it in its]
        bounds = base_bounds(
            n=n,
            reference_passed=[it.reference.passed for it in its],
            tuned_passed=[it.tuned.passed for it in its],
            margins=[it.base_margin.nats if it.base_margin else None for it in its],
            generative=metric in GENERATIVE_METRICS,
            low_base_threshold=spec.low_base_threshold,
            thin_margin_nats=spec.thin_margin_nats,
        )
        out.append(
            CapabilityResult(
                name=name,
                metric=metric,
                unit="nats" if metric == "loglik" else "accuracy",
                n=n,
                reference_score=float(r.mean()),
                tuned_score=float(t.mean()),
                delta=ci.delta,
                ci_low=ci.low,
                ci_high=ci.high,
                **attrs(spec, "confidence", "resamples", "seed"),  # the bootstrap's
                sign_test_p=sign_test_p(r, t),
                verdict=verdict,
                diagnosed=diagnosed,
                reason=reason,
                reference_pass_rate=float(np.mean([it.reference.passed for it in its])),
                tuned_pass_rate=float(np.mean([it.tuned.passed for it in its])),
                **{f"n_{s}": statuses.count(s) for s in STATUSES},
                base_bounds=bounds,
            )
        )
    return out
