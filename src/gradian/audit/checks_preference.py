"""Checks on preference rows (DPO/ORPO pairs, KTO rows): :mod:`gradian.data.preference`.

They run when the training rows are preference rows (``AuditContext.preference``) and say "not
applicable" on SFT rows; the SFT-row checks say "not applicable" on preference rows (runner).
"""

from __future__ import annotations

from gradian.audit import text as T
from gradian.audit.checks_dataset import duplicate_groups, pct
from gradian.audit.checks_eval import exact_matches
from gradian.audit.context import AuditContext
from gradian.audit.registry import Hit, NotApplicable, check
from gradian.data.preference import PreferenceExample

#: TRL's DPOConfig / KTOConfig default ``max_length`` (trl 1.16.0 trainer/dpo_config.py).
TRL_PREF_MAX_LENGTH = 1024
#: Length bias: the chosen response is longer in more than this share of pairs ...
LONGER_SHARE = 0.8
#: ... or the mean chosen length over the mean rejected length is above this.
MEAN_RATIO = 1.5
#: Length bias is judged on at least this many pairs with distinct responses.
MIN_PAIRS = 20
#: TRL's KTO docs: (desirable_weight x n_desirable) / (undesirable_weight x n_undesirable) in [1, 4/3].
KTO_RATIO = (1.0, 4.0 / 3.0)


def _rows(ctx: AuditContext) -> list[PreferenceExample]:
    if ctx.preference is None:
        raise NotApplicable("the training rows are SFT rows, not preference rows (chosen/rejected or KTO labels)")
    return ctx.preference


def _ids(rows: list[PreferenceExample], idxs) -> list[str]:
    return [rows[i].id for i in sorted(set(idxs))]


def _count_hit(rows: list[PreferenceExample], idxs: list[int], severity: str, says: str, more: dict) -> Hit:
    """The finding of a count rule (any affected row counts) on the preference rows at indices ``idxs``: the
    message ``f"{pct(len(idxs), len(rows))} {says}"`` and the evidence ``{"value": len(idxs), "threshold": 0,
    **more}`` (:func:`gradian.audit.checks_dataset.count_hits` for preference rows).
    """
    evidence = {"value": len(idxs), "threshold": 0, **more}
    return Hit(severity, f"{pct(len(idxs), len(rows))} {says}", evidence, row_ids=_ids(rows, idxs))


@check("D22", requires=("data",), severity="error", rank=10, preference=True)
def pref_empty_or_identical(ctx: AuditContext) -> list[Hit]:
    """Preference rows with an empty or identical chosen/rejected response.

    Rule: a pair whose chosen or rejected response is empty (after stripping), or whose chosen equals its rejected
    (normalised text), or a KTO row with an empty completion: any is an error

    Fix: drop or repair these rows: an identical pair has zero preference margin and an empty response teaches the model
    to stop (or nothing)

    Source: the DPO loss (Rafailov et al. 2023) compares log-ratios of chosen and rejected: equal responses give no
    signal; TRL docs, dataset formats (preference)
    """
    rows = _rows(ctx)
    empty_c, empty_r, same = [], [], []
    for i, e in enumerate(rows):
        c = e.chosen_text.strip()
        if not c:
            empty_c.append(i)
        if e.is_kto:
            continue
        r = e.rejected_text.strip()
        if not r:
            empty_r.append(i)
        elif c and T.normalise(c) == T.normalise(r):
            same.append(i)
    hits = []
    what = "completion" if rows[0].is_kto else "chosen"
    for idxs, name, after in (
        (empty_c, f"an empty {what} response", ""),
        (empty_r, "an empty rejected response", ""),
        (same, "chosen identical to rejected", ": zero preference signal"),
    ):
        if idxs:
            says = f"have {name} (first: {rows[idxs[0]].where}){after}"
            hits.append(_count_hit(rows, idxs, "error", says, {"n_rows": len(rows)}))
    return hits


def _key(e: PreferenceExample) -> str:
    label = "" if e.label is None else str(e.label)
    return "\x1f".join((T.normalise(e.prompt_text), T.normalise(e.chosen_text), T.normalise(e.rejected_text), label))


@check("D23", requires=("data",), severity="warning", rank=40, preference=True)
def pref_duplicates(ctx: AuditContext) -> list[Hit]:
    """Duplicated preference rows.

    Rule: rows with the same normalised prompt + chosen + rejected (KTO: prompt + completion + label) beyond the first
    copy: any warns

    Fix: deduplicate: a repeated pair is weighted once per copy in the preference loss

    Source: same rule as D11 (exact duplicates), on the preference fields (**H**)
    """
    rows = _rows(ctx)
    dup = duplicate_groups(_key(e) for e in rows)
    if not dup:
        return []
    extra = sum(len(g) - 1 for g in dup)
    first = rows[dup[0][1]]
    return [
        Hit(
            "warning",
            f"{pct(extra, len(rows))} repeat an earlier row's prompt, chosen and rejected ({len(dup)} groups; "
            f"first: {first.where} repeats {rows[dup[0][0]].where})",
            {"value": extra, "threshold": 0, "groups": len(dup), "n_rows": len(rows)},
            row_ids=_ids(rows, [i for g in dup for i in g[1:]]),
        )
    ]


@check("D24", requires=("data", "eval"), severity="error", rank=30, preference=True)
def pref_contamination(ctx: AuditContext) -> list[Hit]:
    """Eval rows found verbatim in preference training rows.

    Rule: an eval row's normalised prompt (>= 3 words), or prompt + target, equals a training row's prompt (+ chosen
    response), with or without their system turns: any is an error (D14's rule, on prompt + chosen)

    Fix: remove the contaminated rows from the training set (or from the eval set) and re-run

    Source: lm-eval-harness docs/decontamination.md (as D14)

    Each prompt is keyed twice: as written, and without its system turns (a chat prompt's ``system`` messages), so
    an eval row asking a training row's question without the training set's system prompt (or with another one)
    is still found.
    """
    rows = _rows(ctx)
    m = exact_matches(
        [(T.normalise(e.prompt_text), T.normalise(e.prompt_without_system)) for e in rows],
        [T.normalise(e.chosen_text) for e in rows],
        list(zip(ctx.eval_norm_prompt, ctx.eval_norm_prompt_without_system)),
        ctx.eval_norm_completion,
    )
    verbatim, same_prompt, tr = m.verbatim, m.same_prompt, m.train_verbatim | m.train_prompt
    ev_ex = ctx.eval_examples or []
    ev = verbatim + same_prompt
    if not ev:
        return []
    n_eval = len(ev_ex)
    return [
        Hit(
            "error",
            f"{len(ev)} of {n_eval} eval rows ({100 * len(ev) / n_eval:.1f}%) appear in the preference training rows: "
            f"{len(verbatim)} verbatim (prompt and chosen response), {len(same_prompt)} with the same prompt",
            {"value": len(ev), "threshold": 0, "n_eval": n_eval, "verbatim": len(verbatim)},
            row_ids=_ids(rows, tr),
            eval_row_ids=[ev_ex[j].id for j in sorted(ev)],
        )
    ]


def _n_tokens(tok, prompt, response) -> tuple[int, int]:
    """Tokens of the prompt, and of prompt + response (the chat template's rendering for message lists)."""
    if isinstance(prompt, list) or isinstance(response, list):
        p = prompt if isinstance(prompt, list) else ([{"role": "user", "content": prompt}] if prompt else [])
        r = response if isinstance(response, list) else [{"role": "assistant", "content": str(response)}]
        if getattr(tok, "chat_template", None):

            def count(text: str) -> int:
                return len(tok(text, add_special_tokens=False)["input_ids"])

            n_p = count(tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True)) if p else 0
            return n_p, count(tok.apply_chat_template(p + r, tokenize=False))
        ptext = "\n".join(m["content"] for m in p)
        rtext = "".join(m["content"] for m in r)
    else:
        ptext, rtext = str(prompt), str(response)
    n_p = len(tok(ptext, add_special_tokens=True)["input_ids"])
    return n_p, n_p + len(tok(rtext, add_special_tokens=False)["input_ids"]) + 1  # + EOS


@check("D25", requires=("data", "tokenizer"), reads=("config",), severity="warning", rank=20, preference=True)
def pref_truncated(ctx: AuditContext) -> list[Hit]:
    """Preference rows cut by max_length / max_prompt_length.

    Rule: prompt + chosen or prompt + rejected longer than max_length (the config's, else TRL DPOConfig's 1024), or a
    prompt longer than max_prompt_length (when the config sets it): any warns

    Fix: raise max_length (and max_prompt_length), or drop/shorten the long rows: a truncated pair is compared on cut
    responses, often where they no longer differ

    Source: TRL DPOConfig max_length (default 1024, keep_start; trl 1.16.0 trainer/dpo_config.py); same failure as D04
    """
    rows = _rows(ctx)
    cfg = ctx.config
    if cfg is not None and cfg.max_length is not None and cfg.max_length > 0:
        max_len, src = int(cfg.max_length), cfg.source("max_length") or "config"
    else:
        max_len, src = TRL_PREF_MAX_LENGTH, f"assumed: TRL DPOConfig's default max_length={TRL_PREF_MAX_LENGTH}"
    max_prompt = cfg.max_prompt_length if cfg is not None and cfg.max_prompt_length else None
    long_rows, long_prompts, worst = [], [], 0
    for i, e in enumerate(rows):
        lens = [_n_tokens(ctx.tokenizer, e.prompt, e.chosen)]
        if e.rejected is not None:
            lens.append(_n_tokens(ctx.tokenizer, e.prompt, e.rejected))
        total = max(t for _, t in lens)
        worst = max(worst, total)
        if total > max_len:
            long_rows.append(i)
        if max_prompt is not None and lens[0][0] > max_prompt:
            long_prompts.append(i)
    hits = []
    if long_rows:
        says = (
            f"are longer than max_length={max_len} ({src}) with their response "
            f"(longest {worst} tokens; first: {rows[long_rows[0]].where})"
        )
        hits.append(_count_hit(rows, long_rows, "warning", says, {"max_length": max_len, "longest": worst}))
    if long_prompts:
        says = f"have a prompt longer than max_prompt_length={max_prompt} ({cfg.source('max_prompt_length')})"
        hits.append(_count_hit(rows, long_prompts, "warning", says, {"max_prompt_length": max_prompt}))
    return hits


@check("D26", requires=("data",), severity="warning", rank=40, preference=True)
def pref_length_bias(ctx: AuditContext) -> list[Hit]:
    """Chosen responses systematically longer than rejected.

    Rule: over >= {MIN_PAIRS} pairs with distinct responses: chosen has more words than rejected in > {LONGER_SHARE:.0%}
    of pairs, or mean chosen words / mean rejected words > {MEAN_RATIO} (**H**)

    Fix: balance lengths (pair long with long), or use a length-controlled loss (e.g. TRL DPO's ld_alpha, SimPO's length
    normalisation): otherwise the model learns that longer is better

    Source: Singhal et al. 2023, A Long Way to Go: Investigating Length Correlations in RLHF (arXiv 2310.03716); Park et
    al. 2024, Disentangling Length from Quality in DPO (arXiv 2403.19159); thresholds **H**

    share of pairs with the longer chosen, and the mean length ratio.
    """
    rows = _rows(ctx)
    if rows[0].is_kto:
        raise NotApplicable("KTO rows are unpaired (no rejected response to compare lengths with)")
    pairs = [(len(e.chosen_text.split()), len(e.rejected_text.split())) for e in rows]
    pairs = [(c, r) for c, r in pairs if c and r]
    if len(pairs) < MIN_PAIRS:
        raise NotApplicable(f"{len(pairs)} pairs with non-empty responses, fewer than {MIN_PAIRS}")
    longer = sum(1 for c, r in pairs if c > r)
    share = longer / len(pairs)
    ratio = (sum(c for c, _ in pairs) / len(pairs)) / max(sum(r for _, r in pairs) / len(pairs), 1e-9)
    if share <= LONGER_SHARE and ratio <= MEAN_RATIO:
        return []
    return [
        Hit(
            "warning",
            f"chosen is longer than rejected in {longer} of {len(pairs)} pairs ({share:.0%}; mean length ratio "
            f"{ratio:.2f}): the preference signal is confounded with length",
            {
                "value": round(share, 4),
                "threshold": LONGER_SHARE,
                "mean_ratio": round(ratio, 3),
                "ratio_max": MEAN_RATIO,
            },
        )
    ]


@check("D27", requires=("data",), severity="error", rank=40, preference=True)
def kto_label_balance(ctx: AuditContext) -> list[Hit]:
    """KTO desirable/undesirable imbalance.

    Rule: KTO rows: only one label present is an error; (desirable_weight x n_desirable) / (undesirable_weight x
    n_undesirable) outside [1, 4/3] warns (the config's weights: TRL desirable_weight/undesirable_weight, axolotl
    kto_desirable_weight/kto_undesirable_weight, LLaMA-Factory kto_chosen_weight/kto_rejected_weight; else 1.0)

    Fix: set KTOConfig desirable_weight / undesirable_weight so that (desirable_weight x n_desirable) /
    (undesirable_weight x n_undesirable) is between 1 and 4/3, or rebalance the rows

    Source: TRL docs, KTO Trainer (desirable_weight/undesirable_weight: ratio 1:1 to 4:3); Ethayarajh et al. 2024, KTO
    (arXiv 2402.01306)

    ratio = (w_d x n_desirable) / (w_u x n_undesirable), the weights from the config
    (1.0 when unset).
    """
    rows = _rows(ctx)
    if not rows[0].is_kto:
        raise NotApplicable("paired rows (chosen/rejected), not KTO rows")
    pos = sum(1 for e in rows if e.label)
    neg = len(rows) - pos
    if pos == 0 or neg == 0:
        return [
            Hit(
                "error",
                f"all {len(rows)} KTO rows are {'desirable' if neg == 0 else 'undesirable'}: KTO needs both labels",
                {"value": pos, "threshold": 1, "n_desirable": pos, "n_undesirable": neg},
            )
        ]
    c = ctx.config
    wd = c.desirable_weight if c is not None and c.desirable_weight is not None else 1.0
    wu = c.undesirable_weight if c is not None and c.undesirable_weight is not None else 1.0
    if wd <= 0 or wu <= 0:
        return []  # a zero weight drops a label on purpose; nothing to balance
    ratio = (wd * pos) / (wu * neg)
    lo, hi = KTO_RATIO
    if lo <= ratio <= hi:
        return []
    w = (lo if ratio < lo else hi) / ratio * wd
    at = (
        "weights 1.0"
        if (wd, wu) == (1.0, 1.0)
        else "desirable_weight "
        + f"{wd:g} ({c.source('desirable_weight') or 'default 1.0'}), undesirable_weight {wu:g} "
        + f"({c.source('undesirable_weight') or 'default 1.0'})"
    )
    return [
        Hit(
            "warning",
            f"{pos} desirable and {neg} undesirable KTO rows (weighted ratio {ratio:.2f}, outside 1 to 4/3 at {at}): "
            f"e.g. desirable_weight={w:.2f} brings it to {ratio * w / wd:.2f}",
            {
                "value": round(ratio, 4),
                "threshold": [lo, round(hi, 4)],
                "n_desirable": pos,
                "n_undesirable": neg,
                "desirable_weight": wd,
                "undesirable_weight": wu,
            },
        )
    ]
