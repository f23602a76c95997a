"""Checks that read tokens and chat templates (plus the data and config they apply to).

Token-level checks use :attr:`AuditContext.token_rows`: each row tokenised by
:func:`gradian.data.tokenize.tokenize_example` exactly as the trainer (and the
attribution lane) does, under the run's loss mode and EOS rule. Without a
tokenizer they are skipped, except D08, which falls back to a plain string
search for well-known template markers.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from gradian.audit import text as T
from gradian.audit.checks_dataset import count_hits, ids, pct, rate_hit, share_hit
from gradian.audit.context import AuditContext
from gradian.audit.registry import Hit, NotApplicable, check
from gradian.libversions import before


def _need_max_length(ctx: AuditContext) -> tuple[int, str]:
    L, src = ctx.max_length()
    if L is None:
        raise NotApplicable(src)
    return L, src


def _rendered(ctx: AuditContext) -> list[int]:
    return [i for i, tr in enumerate(ctx.token_rows) if tr.tx is not None]


def _pctl(vals, q) -> int:
    return int(np.percentile(np.array(vals), q)) if vals else 0


# ---------------------------------------------------------------------- D04
@check("D04", requires=("data", "tokenizer"), reads=("config",), severity="error", rank=20)
def truncated(ctx: AuditContext) -> list[Hit]:
    """Rows longer than max_length.

    Rule: rendered tokens (template + EOS) > the run's max_length (config, else TRL's default 1024): any warns, > 2% of
    rows errors

    Fix: raise max_length to at least the p99 length, or split/drop the long rows

    Source: trl sft_config.py truncation_mode keep_start cuts the completion and EOS; LF#3143
    """
    L, src = _need_max_length(ctx)
    rows = _rendered(ctx)
    lens = [ctx.token_rows[i].tx.full_length for i in rows]
    bad = [i for i in rows if ctx.token_rows[i].tx.full_length > L]
    if not bad:
        return []
    lost = sum(max(0, ctx.token_rows[i].last_sup + 1 - max(L, ctx.token_rows[i].first_sup)) for i in bad)
    rate = len(bad) / ctx.n
    p99 = _pctl(lens, 99)
    drop = ctx.config is not None and ctx.config.trainer == "axolotl" and (ctx.config.truncation or "drop") == "drop"
    effect = (
        "axolotl drops them (excess_length_strategy: drop)"
        if drop
        else "their ends, including the EOS, are cut, so the model learns to stop mid-answer"
    )
    return [
        Hit(
            "error" if rate > 0.02 else "warning",
            f"{pct(len(bad), ctx.n)} are longer than max_length={L} ({src}); {effect}. Lengths p50 "
            f"{_pctl(lens, 50)}, p95 {_pctl(lens, 95)}, p99 {p99}, max {max(lens)} tokens; {lost} supervised "
            f"tokens are lost (thresholds: any warns, > 2% errors)",
            {
                "value": round(rate, 4),
                "threshold": 0.02,
                "max_length": L,
                "max_length_from": src,
                "p50": _pctl(lens, 50),
                "p95": _pctl(lens, 95),
                "p99": p99,
                "max": max(lens),
                "supervised_tokens_lost": lost,
                "dropped": drop,
            },
            row_ids=ids(ctx, bad),
            fix=f"set max_length >= {int(-(-p99 // 64) * 64)} (the p99 length, rounded up to 64), or split/drop "
            f"the long rows",
        )
    ]


# ---------------------------------------------------------------------- D05
@check("D05", requires=("data", "tokenizer"), reads=("config",), severity="error", rank=20)
def prompt_fills_window(ctx: AuditContext) -> list[Hit]:
    """The prompt fills the whole window.

    Rule: the first supervised token lies at or beyond max_length, so the truncated row trains 0 tokens; any

    Fix: shorten the prompts (or raise max_length), or drop these rows

    Source: tf#34494; trl PR #6320 (rows with no trainable tokens)
    """
    L, src = _need_max_length(ctx)
    bad = [i for i in _rendered(ctx) if ctx.token_rows[i].last_sup >= 0 and ctx.token_rows[i].first_sup >= L]
    if not bad:
        return []
    plens = [ctx.token_rows[i].tx.prompt_length for i in bad]
    return count_hits(
        ctx,
        bad,
        "error",
        f"have prompts of >= max_length={L} tokens ({src}): after "
        f"truncation they train nothing (prompt lengths {min(plens)}-{max(plens)})",
        {"max_length": L, "prompt_lengths": plens[:50]},
    )


# ---------------------------------------------------------------------- D06
def end_of_turn(ctx: AuditContext) -> str | None:
    """The special token the chat template writes right after an assistant message, if any."""
    tok = ctx.tokenizer
    if not ctx.tok_info.chat_template:
        return None
    marker = "GRADIANXQZ"
    try:
        s = tok.apply_chat_template(
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": marker}], tokenize=False
        )
    except Exception:
        return None
    k = s.rfind(marker)
    if k < 0:
        return None
    rest = s[k + len(marker) :]
    best = None
    for sp in ctx.tok_info.special_strings:
        j = rest.find(sp)
        if j >= 0 and rest[:j].strip() == "" and (best is None or j < best[0]):
            best = (j, sp)
    return best[1] if best else None


def stop_ids(ctx: AuditContext) -> set[int]:
    """Token ids that end a generation: the generation EOS ids, the EOS token and the end-of-turn token."""
    tok = ctx.tokenizer
    out = set(ctx.tok_info.generation_eos_ids)
    if ctx.tok_info.eos_id is not None:
        out.add(ctx.tok_info.eos_id)
    eot = end_of_turn(ctx)
    if eot:
        i = tok.convert_tokens_to_ids(eot)
        if isinstance(i, int):
            out.add(i)
    return out


def _last_content_token(tx, last_sup: int) -> int | None:
    k = last_sup
    while k >= 0 and tx.labels[k] != -100:
        s, e = tx.offsets[k]
        if tx.text[s:e].strip():
            return tx.input_ids[k]
        k -= 1
    return None


@check("D06", requires=("data", "tokenizer"), reads=("config",), severity="error", rank=20)
def no_eos(ctx: AuditContext) -> list[Hit]:
    """Targets do not end with EOS / end-of-turn.

    Rule: the last supervised non-whitespace token is not EOS, the template's end-of-turn or a generation stop id, under
    the trainer's EOS rule (TRL < 0.16 appends no EOS to plain text): > 10% errors, > 1% warns, any is info

    Fix: append the EOS token to every target (or upgrade TRL to >= 0.16, which appends it), or use the chat template

    Source: trl#1623, trl#931, trl PR #3091
    """
    stops = stop_ids(ctx)
    if not stops:
        raise NotApplicable("the tokenizer has no EOS token")
    bad, last_tokens = [], Counter()
    for i in _rendered(ctx):
        tr = ctx.token_rows[i]
        if tr.last_sup < 0:
            continue
        t = _last_content_token(tr.tx, tr.last_sup)
        if t is not None and t not in stops:
            bad.append(i)
            last_tokens[ctx.tokenizer.convert_ids_to_tokens(t)] += 1
    if not bad:
        return []
    rate = len(bad) / ctx.n
    sev = "error" if rate > 0.10 else "warning" if rate > 0.01 else "info"
    appends, why = ctx.pipeline_appends_eos()
    return rate_hit(
        ctx,
        bad,
        sev,
        f"{pct(len(bad), ctx.n)} end their supervised tokens without EOS/end-of-turn "
        f"({why}); the model does not learn to stop (thresholds: 10% errors, 1% warns)",
        rate,
        0.10,
        {
            "stop_tokens": sorted(str(ctx.tokenizer.convert_ids_to_tokens(s)) for s in stops),
            "pipeline_appends_eos": appends,
            "last_tokens": dict(last_tokens.most_common(5)),
        },
    )


# ---------------------------------------------------------------------- D07
@check("D07", requires=("data", "tokenizer"), severity="error", rank=20)
def double_bos(ctx: AuditContext) -> list[Hit]:
    """BOS token twice at the start.

    Rule: the tokenised row starts with two BOS ids (text that already begins with the BOS string, tokenised with
    add_special_tokens=True); any

    Fix: strip the BOS string from the text, or tokenise with add_special_tokens=False

    Source: OpenRLHF#393; deepseek-ai/DeepSeek-R1#151; alignment-handbook#127
    """
    bos = ctx.tok_info.bos_id
    if bos is None:
        raise NotApplicable("the tokenizer has no BOS token")
    bad = [i for i in _rendered(ctx) if ctx.token_rows[i].tx.input_ids[:2] == [bos, bos]]
    if not bad:
        return []
    return count_hits(
        ctx,
        bad,
        "error",
        f"start with BOS twice ({ctx.tok_info.bos_token!r}; the tokenizer adds one and the text has one)",
        {
            "first_ids": list(ctx.token_rows[bad[0]].tx.input_ids[:5]),
            "adds_bos": ctx.tok_info.adds_bos,
        },
    )


# ---------------------------------------------------------------------- D08
_PLAIN_MARKER_FAMILIES = ("alpaca", "vicuna")  # plain text, not control strings


@check("D08", requires=("data",), reads=("tokenizer",), severity="error", rank=20)
def control_tokens_in_content(ctx: AuditContext) -> list[Hit]:
    """Special / template tokens inside message content.

    Rule: prompt, target or message content contains a special-token string of the tokenizer (error), or a well-known
    template marker such as <|im_end|>, [INST], <start_of_turn> (warning); a target's trailing EOS is allowed; 'text'
    rows are left to C08/T03; any

    Fix: escape or remove these strings, or tokenise content with split_special_tokens=True

    Source: PrimeIntellect-ai/renderers PR #116; FranxYao/Long-Context-Data-Engineering#14
    """
    specials = set()
    if ctx.tokenizer is not None:
        specials = {s for s in ctx.tok_info.special_strings if len(s) >= 3}
    markers = {m for fam, ms in T.TEMPLATE_MARKERS.items() if fam not in _PLAIN_MARKER_FAMILIES for m in ms}
    markers -= specials
    eos = ctx.tok_info.eos_token if ctx.tokenizer is not None else None
    # A cheap prefilter: a special/marker string always contains one of these characters.
    hit_special, hit_marker, found = [], [], Counter()
    for i, e in enumerate(ctx.examples):
        if e.format == "text":
            continue
        parts: list[str] = []
        for side in (e.prompt, e.completion):
            if isinstance(side, list):
                parts += [m.get("content", "") for m in side]
            else:
                parts.append(side)
        if parts and eos and isinstance(e.completion, str) and parts[-1].endswith(eos):
            parts[-1] = parts[-1][: -len(eos)]
        blob = "\n".join(parts)
        if "<" not in blob and "[" not in blob and "｜" not in blob:
            continue
        s_hits = [s for s in specials if s in blob]
        m_hits = [m for m in markers if m in blob]
        if s_hits:
            hit_special.append(i)
        elif m_hits:
            hit_marker.append(i)
        found.update(s_hits + m_hits)
    hits = []
    hits += count_hits(
        ctx,
        hit_special,
        "error",
        f"contain special-token strings in their content "
        f"({', '.join(sorted(s for s in found if s in specials))}); they tokenise to the "
        f"control tokens themselves (e.g. a premature end of turn)",
        {"strings": dict(found)},
    )
    hits += count_hits(
        ctx,
        hit_marker,
        "warning",
        f"contain chat-template markers in their content ({', '.join(sorted(s for s in found if s in markers))})",
        {"strings": dict(found)},
    )
    return hits


# ---------------------------------------------------------------------- D10
@check("D10", requires=("data", "config"), reads=("tokenizer",), severity="error", rank=20, stages=("sft",))
def response_marker_missing(ctx: AuditContext) -> list[Hit]:
    """Response template not found in rows.

    Rule: with DataCollatorForCompletionOnlyLM's response_template set: rows whose token ids (tokenised in context) do
    not contain the template's ids (string search without a tokenizer) get every label masked; > 1% errors, any warns

    Fix: pass the response template as the token ids it has in context (tokenise it with its preceding characters and
    drop those), or move to prompt/completion data (TRL >= 0.20)

    Source: trl#1820, trl#588, trl#980 ('Could not find response key')
    """
    rt = ctx.config.response_template
    if not rt:
        raise NotApplicable("no response_template in the config (no DataCollatorForCompletionOnlyLM)")
    bad = []
    mode = "string"
    if ctx.tokenizer is not None:
        mode = "token ids"
        want = ctx.tokenizer(rt, add_special_tokens=False)["input_ids"]
        for i in _rendered(ctx):
            got = ctx.token_rows[i].tx.input_ids
            if not _contains(got, want):
                bad.append(i)
    else:
        for i, e in enumerate(ctx.examples):
            if e.is_chat:
                continue
            if rt not in (e.prompt_text + e.completion_text):
                bad.append(i)
    if not bad:
        return []
    rate = len(bad) / ctx.n
    note = ""
    if before(ctx.versions, "trl", "0.20") is False:
        note = f"; note TRL {ctx.versions['trl']} no longer has DataCollatorForCompletionOnlyLM"
    return rate_hit(
        ctx,
        bad,
        "error" if rate > 0.01 else "warning",
        f"{pct(len(bad), ctx.n)} do not contain response_template={rt!r} (matched as {mode}): the collator "
        f"masks all their labels, so they train nothing{note}",
        rate,
        0.01,
        {
            "response_template": rt,
            "from": ctx.config.source("response_template"),
            "matched_as": mode,
        },
    )


def _contains(hay: list[int], needle: list[int]) -> bool:
    if not needle:
        return True
    n0 = needle[0]
    k = len(needle)
    for i in range(len(hay) - k + 1):
        if hay[i] == n0 and hay[i : i + k] == needle:
            return True
    return False


# ---------------------------------------------------------------------- D19
@check("D19", requires=("data", "tokenizer"), severity="warning", rank=20)
def boundary_whitespace(ctx: AuditContext) -> list[Hit]:
    """Prompt/target boundary tokens merge.

    Rule: tokens(prompt) is not a prefix of tokens(prompt + target): the boundary token merges, and the mask starts at
    the common prefix; > 5% warns, any is info

    Fix: end prompts with the separator (space/newline) and start targets without it, so the boundary is a token
    boundary

    Source: trl sft_trainer.py warning 'Mismatch between tokenized prompt and the start of tokenized prompt+completion'
    """
    plens = ctx.prompt_token_lengths
    bad, diffs = [], []
    for i, pl in enumerate(plens):
        tr = ctx.token_rows[i]
        if pl is None or tr.tx is None:
            continue
        if tr.tx.prompt_length < pl:
            bad.append(i)
            diffs.append(pl - tr.tx.prompt_length)
    if not bad:
        return []
    ex = ctx.token_rows[bad[0]].tx
    k = ex.prompt_length
    return share_hit(
        ctx,
        bad,
        f"{pct(len(bad), ctx.n)} tokenise differently at the prompt/target boundary (threshold 5%): "
        f"the last prompt token(s) merge with the target's first characters",
        0.05,
        {
            "tokens_merged": dict(Counter(diffs)),
            "example": {
                "id": ex.id,
                "boundary_ids": list(ex.input_ids[max(0, k - 2) : k + 2]),
                "boundary_text": ex.text[ex.offsets[max(0, k - 1)][0] : ex.offsets[min(k + 1, len(ex.offsets) - 1)][1]],
            },
        },
    )
