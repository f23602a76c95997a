"""Checks that read what the rows say: answers already in the prompt, length outliers, the language mix,
and boilerplate, HTML or mojibake.

Each finding lists the affected training example ids in ``row_ids``; its evidence holds the measured value
against the threshold.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

import numpy as np

from gradian.audit import text as T
from gradian.audit.checks_dataset import ids, pct, share_hit
from gradian.audit.context import AuditContext
from gradian.audit.registry import Hit, NotApplicable, check


# ---------------------------------------------------------------------- D16
@check("D16", requires=("data",), severity="warning", rank=40)
def answer_in_prompt(ctx: AuditContext) -> list[Hit]:
    """The target is already in its prompt.

    Rule: the normalised target (>= 20 characters) appears verbatim inside its own prompt; > 5% warns, any is info
    (**H**)

    Fix: check for leakage: the model learns to copy, not to answer

    Source: heuristic
    """
    bad = [i for i, (p, c) in enumerate(zip(ctx.norm_prompt, ctx.norm_completion)) if len(c) >= 20 and c in p]
    if not bad:
        return []
    return share_hit(
        ctx, bad, f"{pct(len(bad), ctx.n)} contain their own target verbatim in the prompt (threshold 5%)", 0.05
    )


# ---------------------------------------------------------------------- D17
@check("D17", requires=("data",), reads=("tokenizer",), severity="warning", rank=40)
def length_outliers(ctx: AuditContext) -> list[Hit]:
    """Target length outliers.

    Rule: robust z-score of log target length > 5 (median/MAD, MAD floored at 0.1); tokens when a tokenizer is given,
    characters otherwise; > 1% of rows warns, any is info

    Fix: inspect the outliers: split very long targets, drop stubs

    Source: FastChat split_long_conversation
    """
    if ctx.tokenizer is not None:
        unit = "tokens"
        lens = [(tr.tx.full_length - tr.tx.prompt_length) if tr.tx is not None else None for tr in ctx.token_rows]
    else:
        unit = "characters"
        lens = [len(c) for c in ctx.completion_texts]
    pts = [(i, math.log1p(max(L, 0))) for i, L in enumerate(lens) if L is not None]
    if len(pts) < 20:
        raise NotApplicable(f"too few rows ({len(pts)}) for a robust length distribution (needs 20)")
    vals = np.array([v for _, v in pts])
    med = float(np.median(vals))
    mad = max(float(np.median(np.abs(vals - med))), 0.1)
    z = np.abs(vals - med) / (1.4826 * mad)
    out = [pts[k][0] for k in np.nonzero(z > 5)[0]]
    if not out:
        return []
    lv = [lens[i] for i in out]
    return share_hit(
        ctx,
        out,
        f"{pct(len(out), ctx.n)} have target lengths far from the median of {math.expm1(med):.0f} {unit} "
        f"(robust z > 5; outliers range {min(lv)}-{max(lv)} {unit})",
        0.01,
        {
            "z_threshold": 5,
            "unit": unit,
            "median": round(math.expm1(med), 1),
            "outlier_lengths": lv[:50],
        },
    )


# ---------------------------------------------------------------------- D18
@check("D18", requires=("data",), severity="warning", rank=40)
def language_mix(ctx: AuditContext) -> list[Hit]:
    """Unexpected language mix.

    Rule: language per row by script, and for Latin script by a stopword vote (en/fr/de/es/it/pt/nl): a minority
    language in 1-20% of rows, or prompt and target in different languages in > 5% of rows, warns; smaller shares are
    info (**H**)

    Fix: filter the rows in the wrong language (or ignore this for translation data)

    Source: FastChat optional_clean --skip-lang; DialogStudio ShareGPT README
    """
    langs, mism = [], []
    # only stopwords vote: each prompt's and completion's stopwords, in order, picked from the flat word table
    wid, vocab = ctx.row_word_ids
    _, off = ctx.row_word_flat
    at = np.flatnonzero(T.is_stopword(vocab)[wid])
    bounds = np.empty(2 * ctx.n + 1, dtype=np.int64)
    bounds[0::2] = off
    bounds[1::2] = off[:-1] + np.fromiter(map(len, ctx.prompt_words), dtype=np.int64, count=ctx.n)
    cut = np.searchsorted(at, bounds).tolist()
    sw = list(map(vocab.__getitem__, wid[at].tolist()))
    for i, (pt, ct) in enumerate(zip(ctx.prompt_texts, ctx.completion_texts)):
        sp, sc = sw[cut[2 * i] : cut[2 * i + 1]], sw[cut[2 * i + 1] : cut[2 * i + 2]]
        p = T.language_of(pt, sp) if ctx.prompt_words[i] else None
        c = T.language_of(ct, sc)
        both = c if p is None else p if c is None or p == c else T.language_of(pt + "\n" + ct, sp + sc)
        langs.append(both)
        if p and c and p != c:
            mism.append(i)
    known = [x for x in langs if x]
    if len(known) < 10:
        raise NotApplicable(f"language identified for only {len(known)} rows (needs 10)")
    counts = Counter(known)
    major = max(sorted(counts), key=lambda k: counts[k])
    minority = [i for i, x in enumerate(langs) if x and x != major]
    hits = []
    share = len(minority) / len(known)
    if minority:
        sev = "warning" if 0.01 <= share <= 0.20 else "info"
        hits.append(
            Hit(
                sev,
                f"{len(minority)} rows ({100 * share:.1f}% of rows with a known language) are not in "
                f"the majority language {major!r} (warn band 1-20%): {dict(counts.most_common(6))}",
                {"value": round(share, 4), "threshold": [0.01, 0.20], "majority": major, "counts": dict(counts)},
                row_ids=ids(ctx, minority),
            )
        )
    if mism:
        hits += share_hit(
            ctx, mism, f"{pct(len(mism), ctx.n)} answer in a different language from their prompt (threshold 5%)", 0.05
        )
    return hits


# ---------------------------------------------------------------------- D20
@check("D20", requires=("data",), severity="warning", rank=40)
def boilerplate_noise(ctx: AuditContext) -> list[Hit]:
    """Refusal boilerplate, HTML or mojibake.

    Rule: targets matching refusal/AI-disclaimer patterns ('as an AI language model', 'OpenAI'), or rows with HTML
    tags/entities or mojibake ('Ã©', 'â€™', U+FFFD); > 1% warns, any is info

    Fix: filter or clean these rows (ftfy fixes mojibake; strip HTML)

    Source: FastChat clean_sharegpt; airoboros-style filter lists
    """
    kinds: dict[str, list[int]] = defaultdict(list)
    for i, (p, c) in enumerate(zip(ctx.prompt_texts, ctx.completion_texts)):
        if T.refusal_in(c):
            kinds["refusal"].append(i)
        ascii_ = p.isascii() and c.isascii()
        if not ascii_ or "<" in p or "&" in p or "<" in c or "&" in c:  # else neither pattern can match
            both = p + "\n" + c
            if ("<" in both or "&" in both) and T.HTML.search(both):
                kinds["html"].append(i)
            if not ascii_ and T.MOJIBAKE.search(both):
                kinds["mojibake"].append(i)
    allrows = sorted({i for v in kinds.values() for i in v})
    if not allrows:
        return []
    return share_hit(
        ctx,
        allrows,
        f"{pct(len(allrows), ctx.n)} carry noise (threshold 1%): "
        + ", ".join(f"{k} {len(v)}" for k, v in sorted(kinds.items())),
        0.01,
        {
            "by_kind": {k: ids(ctx, v)[:20] for k, v in sorted(kinds.items())},
        },
    )
