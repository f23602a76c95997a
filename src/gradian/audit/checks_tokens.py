"""Checks that read tokens and chat templates (plus the data and config they apply to).

Token-level checks use :attr:`AuditContext.token_rows`: each row tokenised by
:func:`gradian.data.tokenize.tokenize_example` exactly as the trainer (and the
attribution lane) does, under the run's loss mode and EOS rule. Without a
tokenizer they are skipped, except D08, which falls back to a plain string
search for well-known template markers.
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np

from gradian.audit import text as T
from gradian.audit.checks_dataset import ids, pct
from gradian.audit.context import AuditContext
from gradian.audit.registry import Hit, NotApplicable, check
from gradian.audit.versions import before


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
@check(
    "D04",
    "truncated",
    "Rows longer than max_length",
    requires=("data", "tokenizer"),
    reads=("config",),
    severity="error",
    rank=20,
    rule="rendered tokens (template + EOS) > the run's max_length (config, else TRL's default 1024): any warns, "
    "> 2% of rows errors",
    fix="raise max_length to at least the p99 length, or split/drop the long rows",
    source="trl sft_config.py truncation_mode keep_start cuts the completion and EOS; LF#3143",
)
def d04(ctx: AuditContext) -> list[Hit]:
    """D04 (truncated): Rows longer than max_length."""
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
@check(
    "D05",
    "prompt_fills_window",
    "The prompt fills the whole window",
    requires=("data", "tokenizer"),
    reads=("config",),
    severity="error",
    rank=20,
    rule="the first supervised token lies at or beyond max_length, so the truncated row trains 0 tokens; any",
    fix="shorten the prompts (or raise max_length), or drop these rows",
    source="tf#34494; trl PR #6320 (rows with no trainable tokens)",
)
def d05(ctx: AuditContext) -> list[Hit]:
    """D05 (prompt_fills_window): The prompt fills the whole window."""
    L, src = _need_max_length(ctx)
    bad = [i for i in _rendered(ctx) if ctx.token_rows[i].last_sup >= 0 and ctx.token_rows[i].first_sup >= L]
    if not bad:
        return []
    plens = [ctx.token_rows[i].tx.prompt_length for i in bad]
    return [
        Hit(
            "error",
            f"{pct(len(bad), ctx.n)} have prompts of >= max_length={L} tokens ({src}): after "
            f"truncation they train nothing (prompt lengths {min(plens)}-{max(plens)})",
            {"value": len(bad), "threshold": 0, "max_length": L, "prompt_lengths": plens[:50]},
            row_ids=ids(ctx, bad),
        )
    ]


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


@check(
    "D06",
    "no_eos",
    "Targets do not end with EOS / end-of-turn",
    requires=("data", "tokenizer"),
    reads=("config",),
    severity="error",
    rank=20,
    rule="the last supervised non-whitespace token is not EOS, the template's end-of-turn or a generation stop "
    "id, under the trainer's EOS rule (TRL < 0.16 appends no EOS to plain text): > 10% errors, > 1% warns, "
    "any is info",
    fix="append the EOS token to every target (or upgrade TRL to >= 0.16, which appends it), or use the chat template",
    source="trl#1623, trl#931, trl PR #3091",
)
def d06(ctx: AuditContext) -> list[Hit]:
    """D06 (no_eos): Targets do not end with EOS / end-of-turn."""
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
    return [
        Hit(
            sev,
            f"{pct(len(bad), ctx.n)} end their supervised tokens without EOS/end-of-turn "
            f"({why}); the model does not learn to stop (thresholds: 10% errors, 1% warns)",
            {
                "value": round(rate, 4),
                "threshold": 0.10,
                "stop_tokens": sorted(str(ctx.tokenizer.convert_ids_to_tokens(s)) for s in stops),
                "pipeline_appends_eos": appends,
                "last_tokens": dict(last_tokens.most_common(5)),
            },
            row_ids=ids(ctx, bad),
        )
    ]


# ---------------------------------------------------------------------- D07
@check(
    "D07",
    "double_bos",
    "BOS token twice at the start",
    requires=("data", "tokenizer"),
    severity="error",
    rank=20,
    rule="the tokenised row starts with two BOS ids (text that already begins with the BOS string, tokenised "
    "with add_special_tokens=True); any",
    fix="strip the BOS string from the text, or tokenise with add_special_tokens=False",
    source="OpenRLHF#393; deepseek-ai/DeepSeek-R1#151; alignment-handbook#127",
)
def d07(ctx: AuditContext) -> list[Hit]:
    """D07 (double_bos): BOS token twice at the start."""
    bos = ctx.tok_info.bos_id
    if bos is None:
        raise NotApplicable("the tokenizer has no BOS token")
    bad = [i for i in _rendered(ctx) if ctx.token_rows[i].tx.input_ids[:2] == [bos, bos]]
    if not bad:
        return []
    return [
        Hit(
            "error",
            f"{pct(len(bad), ctx.n)} start with BOS twice ({ctx.tok_info.bos_token!r}; the tokenizer "
            f"adds one and the text has one)",
            {
                "value": len(bad),
                "threshold": 0,
                "first_ids": list(ctx.token_rows[bad[0]].tx.input_ids[:5]),
                "adds_bos": ctx.tok_info.adds_bos,
            },
            row_ids=ids(ctx, bad),
        )
    ]


# ---------------------------------------------------------------------- D08
_PLAIN_MARKER_FAMILIES = ("alpaca", "vicuna")  # plain text, not control strings


@check(
    "D08",
    "control_tokens_in_content",
    "Special / template tokens inside message content",
    requires=("data",),
    reads=("tokenizer",),
    severity="error",
    rank=20,
    rule="prompt, target or message content contains a special-token string of the tokenizer (error), or a "
    "well-known template marker such as <|im_end|>, [INST], <start_of_turn> (warning); a target's trailing "
    "EOS is allowed; 'text' rows are left to C08/T03; any",
    fix="escape or remove these strings, or tokenise content with split_special_tokens=True",
    source="PrimeIntellect-ai/renderers PR #116; FranxYao/Long-Context-Data-Engineering#14",
)
def d08(ctx: AuditContext) -> list[Hit]:
    """D08 (control_tokens_in_content): Special / template tokens inside message content."""
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
    if hit_special:
        hits.append(
            Hit(
                "error",
                f"{pct(len(hit_special), ctx.n)} contain special-token strings in their content "
                f"({', '.join(sorted(s for s in found if s in specials))}); they tokenise to the "
                f"control tokens themselves (e.g. a premature end of turn)",
                {"value": len(hit_special), "threshold": 0, "strings": dict(found)},
                row_ids=ids(ctx, hit_special),
            )
        )
    if hit_marker:
        hits.append(
            Hit(
                "warning",
                f"{pct(len(hit_marker), ctx.n)} contain chat-template markers in their content "
                f"({', '.join(sorted(s for s in found if s in markers))})",
                {"value": len(hit_marker), "threshold": 0, "strings": dict(found)},
                row_ids=ids(ctx, hit_marker),
            )
        )
    return hits


# ---------------------------------------------------------------------- D10
@check(
    "D10",
    "response_marker_missing",
    "Response template not found in rows",
    requires=("data", "config"),
    reads=("tokenizer",),
    severity="error",
    rank=20,
    rule="with DataCollatorForCompletionOnlyLM's response_template set: rows whose token ids (tokenised in "
    "context) do not contain the template's ids (string search without a tokenizer) get every label masked; "
    "> 1% errors, any warns",
    fix="pass the response template as the token ids it has in context (tokenise it with its preceding "
    "characters and drop those), or move to prompt/completion data (TRL >= 0.20)",
    source="trl#1820, trl#588, trl#980 ('Could not find response key')",
    stages=("sft",),
)
def d10(ctx: AuditContext) -> list[Hit]:
    """D10 (response_marker_missing): Response template not found in rows."""
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
    return [
        Hit(
            "error" if rate > 0.01 else "warning",
            f"{pct(len(bad), ctx.n)} do not contain response_template={rt!r} (matched as {mode}): the collator "
            f"masks all their labels, so they train nothing{note}",
            {
                "value": round(rate, 4),
                "threshold": 0.01,
                "response_template": rt,
                "from": ctx.config.source("response_template"),
                "matched_as": mode,
            },
            row_ids=ids(ctx, bad),
        )
    ]


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
@check(
    "D19",
    "boundary_whitespace",
    "Prompt/target boundary tokens merge",
    requires=("data", "tokenizer"),
    severity="warning",
    rank=20,
    rule="tokens(prompt) is not a prefix of tokens(prompt + target): the boundary token merges, and the mask "
    "starts at the common prefix; > 5% warns, any is info",
    fix="end prompts with the separator (space/newline) and start targets without it, so the boundary is a "
    "token boundary",
    source="trl sft_trainer.py warning 'Mismatch between tokenized prompt and the start of tokenized "
    "prompt+completion'",
)
def d19(ctx: AuditContext) -> list[Hit]:
    """D19 (boundary_whitespace): Prompt/target boundary tokens merge."""
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
    rate = len(bad) / ctx.n
    ex = ctx.token_rows[bad[0]].tx
    k = ex.prompt_length
    return [
        Hit(
            "warning" if rate > 0.05 else "info",
            f"{pct(len(bad), ctx.n)} tokenise differently at the prompt/target boundary (threshold 5%): "
            f"the last prompt token(s) merge with the target's first characters",
            {
                "value": round(rate, 4),
                "threshold": 0.05,
                "tokens_merged": dict(Counter(diffs)),
                "example": {
                    "id": ex.id,
                    "boundary_ids": list(ex.input_ids[max(0, k - 2) : k + 2]),
                    "boundary_text": ex.text[
                        ex.offsets[max(0, k - 1)][0] : ex.offsets[min(k + 1, len(ex.offsets) - 1)][1]
                    ],
                },
            },
            row_ids=ids(ctx, bad),
        )
    ]


# ---------------------------------------------------------------------- C07
@check(
    "C07",
    "max_len_over_model",
    "max_length beyond the model's context",
    requires=("config", "tokenizer"),
    reads=("data",),
    severity="error",
    rank=20,
    rule="the run's max_length > max_position_embeddings (config.json) or the tokenizer's model_max_length; "
    "or, with no truncation, rows longer than that; any",
    fix="cap max_length at the model's context length (or use a RoPE-scaled model)",
    source="LF#5952",
)
def c07(ctx: AuditContext) -> list[Hit]:
    """C07 (max_len_over_model): max_length beyond the model's context."""
    ti = ctx.tok_info
    limit, lsrc = (
        (ti.max_position_embeddings, "config.json max_position_embeddings")
        if ti.max_position_embeddings
        else (ti.model_max_length, "tokenizer model_max_length")
    )
    if not limit:
        raise NotApplicable(
            "the tokenizer folder states no context length (no max_position_embeddings / model_max_length)"
        )
    L, src = ctx.max_length()
    if L is None and "impossible" in src:
        raise NotApplicable(src)
    if L is not None:
        if L > limit:
            return [
                Hit(
                    "error",
                    f"max_length={L} ({src}) is above the model's {limit} ({lsrc}): positions past "
                    f"{limit} were never trained",
                    {"value": L, "threshold": limit, "from": src, "limit_from": lsrc},
                )
            ]
        return []
    if ctx.examples is None or ctx.tokenizer is None:
        return []
    bad = [i for i in _rendered(ctx) if ctx.token_rows[i].tx.full_length > limit]
    if not bad:
        return []
    return [
        Hit(
            "error",
            f"the trainer does not truncate ({src}) and {pct(len(bad), ctx.n)} are longer than the "
            f"model's {limit} tokens ({lsrc})",
            {"value": len(bad), "threshold": limit},
            row_ids=ids(ctx, bad),
        )
    ]


# ---------------------------------------------------------------------- C09
@check(
    "C09",
    "assistant_mask_template",
    "assistant_only_loss with a template that cannot mask",
    requires=("config", "tokenizer"),
    severity="warning",
    rank=20,
    rule="assistant_only_loss=true and the chat template has no {% generation %} block, or the block leaves the "
    "assistant's end-of-turn token out of the mask",
    fix="use a training chat template whose {% generation %} block covers the end-of-turn token",
    source="trl PR #4201; trl sft_trainer.py 'the model may not learn to stop'; marin-community/marin#7237",
    stages=("sft",),
)
def c09(ctx: AuditContext) -> list[Hit]:
    """C09 (assistant_mask_template): assistant_only_loss with a template that cannot mask."""
    c = ctx.config
    if not c.assistant_only_loss:
        raise NotApplicable("assistant_only_loss is off")
    own = c.chat_template if c.chat_template and "{%" in c.chat_template else None  # the config installs its own
    tpl = own or ctx.tok_info.chat_template
    if not tpl:
        raise NotApplicable("the tokenizer has no chat template (T01 reports it)")
    if not re.search(r"\{%-?\s*generation\s*-?%\}", tpl):
        where = f" ({c.source('chat_template')})" if own else ""
        return [
            Hit(
                "warning",
                f"assistant_only_loss=true but the chat template{where} has no {{% generation %}} block: older "
                "TRL raises 'no assistant tokens', newer TRL swaps in a training template only for "
                "the model families it knows",
                {"value": False, "threshold": True, **c.cite("assistant_only_loss")},
            )
        ]
    try:
        enc = ctx.tokenizer.apply_chat_template(
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "again"},
            ],
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
            **({"chat_template": own} if own else {}),
        )
    except Exception as e:  # a template the tokenizer cannot mask with
        return [
            Hit(
                "warning",
                f"the template's assistant mask cannot be computed ({type(e).__name__})",
                {"error": str(e)[:200]},
            )
        ]
    ids_, mask = list(enc["input_ids"]), list(enc["assistant_masks"])
    on = [k for k, m in enumerate(mask) if m]
    eot = end_of_turn(ctx)
    eot_id = ctx.tokenizer.convert_tokens_to_ids(eot) if eot else ctx.tok_info.eos_id
    if on and eot_id is not None and ids_[on[-1]] != eot_id and eot_id in ids_[on[-1] :]:
        return [
            Hit(
                "warning",
                f"the {{% generation %}} block ends before the end-of-turn token {eot!r}: the "
                f"model is never trained to stop",
                {"value": False, "threshold": True, "end_of_turn": eot},
            )
        ]
    return []


# ---------------------------------------------------------------------- C10
_PAD_MASKING = ("DataCollatorForLanguageModeling", "DataCollatorForCompletionOnlyLM")


@check(
    "C10",
    "pad_is_eos",
    "Pad token is EOS and the collator masks pads",
    requires=("tokenizer",),
    reads=("config",),
    severity="error",
    rank=20,
    rule="pad id == EOS id (or no pad token, so trainers use EOS) with a collator that masks labels by pad id "
    "(transformers DataCollatorForLanguageModeling, TRL's DataCollatorForCompletionOnlyLM, TRL < 0.16): "
    "error; with the collator unknown: info",
    fix="give the tokenizer a separate pad token (e.g. '<|finetune_right_pad_id|>' or a new '<pad>')",
    source="trl#1623, trl PR #3091, mlabonne/llm-course#33, open-r1 PR #494",
)
def c10(ctx: AuditContext) -> list[Hit]:
    """C10 (pad_is_eos): Pad token is EOS and the collator masks pads."""
    ti = ctx.tok_info
    c = ctx.config
    pad_id = ti.pad_id
    if c is not None and c.pad_token:
        pad_id = ctx.tokenizer.convert_tokens_to_ids(c.pad_token)
    same = pad_id is None or pad_id == ti.eos_id
    if not same or ti.eos_id is None:
        return []
    desc = "has no pad token (trainers fall back to EOS)" if pad_id is None else f"pads with EOS {ti.eos_token!r}"
    ev = {"value": pad_id, "threshold": f"!= eos id {ti.eos_id}"}
    collator = (c.data_collator or "") if c else ""
    if any(k in collator for k in _PAD_MASKING) or (c is not None and c.response_template):
        return [
            Hit(
                "error",
                f"the tokenizer {desc} and the collator ({collator or 'DataCollatorForCompletionOnlyLM'}) "
                f"masks labels equal to the pad id: every EOS label is dropped, so the model never "
                f"learns to stop",
                ev,
            )
        ]
    if c is not None and c.trainer == "trl" and before(ctx.versions, "trl", "0.16"):
        return [
            Hit(
                "error",
                f"the tokenizer {desc} and TRL {ctx.versions['trl']} (< 0.16) masks labels by pad id: "
                f"every EOS label is dropped",
                ev,
            )
        ]
    if c is not None and c.trainer == "hf":
        return [
            Hit(
                "warning",
                f"the tokenizer {desc}; with HF Trainer the usual DataCollatorForLanguageModeling "
                f"masks every EOS label",
                ev,
            )
        ]
    if c is not None and c.trainer in ("axolotl", "llamafactory", "torchtune"):
        return []
    if c is not None and c.trainer == "trl" and before(ctx.versions, "trl", "0.16") is False:
        return []
    return [
        Hit(
            "info",
            f"the tokenizer {desc}; harmless with TRL >= 0.16 (masks by position), fatal with a "
            f"collator that masks by pad id; pass --versions trl=X to decide",
            ev,
        )
    ]


# ---------------------------------------------------------------------- C15
_EMBED_NAMES = (
    "embed_tokens",
    "lm_head",
    "wte",
    "embed_out",
    "tok_embeddings",
    "output",
    "word_embeddings",
    "embed_in",
)


@check(
    "C15",
    "new_tokens_untrained",
    "New tokens with frozen embeddings",
    requires=("config",),
    reads=("tokenizer",),
    severity="error",
    rank=20,
    rule="tokens are added (config tokens/new_special_tokens, a cloned chat template, or the training template's "
    "markers missing from the tokenizer) while a LoRA run trains neither embed_tokens/lm_head "
    "(modules_to_save) nor trainable_token_indices; any",
    fix="add embed_tokens and lm_head to modules_to_save (or set trainable_token_indices), or use the model's "
    "own chat template",
    source="axolotl loaders/utils.py; trl sft_trainer.py warning; PEFT troubleshooting.md",
)
def c15(ctx: AuditContext) -> list[Hit]:
    """C15 (new_tokens_untrained): New tokens with frozen embeddings."""
    c = ctx.config
    if not c.is_lora:
        raise NotApplicable(
            "not a LoRA run (full fine-tuning trains the embeddings)"
            if c.is_lora is False
            else "cannot tell whether the run used LoRA"
        )
    added: list[str] = list(c.added_tokens or [])
    why = [c.source("added_tokens")] if c.added_tokens else []
    if c.chat_template_path:
        why.append(f"{c.source('chat_template_path')} (clone_chat_template adds the source's tokens)")
    if ctx.tokenizer is not None and c.chat_template and c.chat_template not in ("tokenizer_default", "default"):
        fam = T.TEMPLATE_NAME_FAMILY.get(c.chat_template.lower())
        if fam and fam not in _PLAIN_MARKER_FAMILIES:
            vocab = ctx.tokenizer.get_vocab()
            missing = [m for m in T.TEMPLATE_MARKERS[fam] if m not in vocab]
            if missing:
                added += missing
                why.append(
                    f"{c.source('chat_template')}={c.chat_template!r} writes {missing}, absent from the "
                    f"tokenizer's vocabulary"
                )
    if not added and not c.chat_template_path:
        return []
    trained = [m for m in (c.modules_to_save or []) if any(n in m for n in _EMBED_NAMES)]
    if trained or c.trainable_token_indices:
        return []
    return [
        Hit(
            "error",
            f"new tokens {sorted(set(added)) or '(from the cloned template)'} get random, untrained "
            f"embeddings: the LoRA run saves no embed_tokens/lm_head ({'; '.join(why)})",
            {
                "value": sorted(set(added)),
                "threshold": "embed_tokens and lm_head in modules_to_save",
                **c.cite("modules_to_save", "trainable_token_indices"),
            },
        )
    ]


# ---------------------------------------------------------------------- T01
@check(
    "T01",
    "chat_template_missing",
    "Chat rows without a usable chat template",
    requires=("data", "tokenizer"),
    severity="error",
    rank=20,
    rule="conversational rows and a tokenizer with no chat_template, or a template that rejects the rows "
    "(error); a template with no add_generation_prompt branch (warning); any",
    fix="set a chat template (TRL: clone_chat_template / chat_template_path), or fix the rows the template rejects",
    source="trl docs (conversational datasets need a chat template); LF#5213",
)
def t01(ctx: AuditContext) -> list[Hit]:
    """T01 (chat_template_missing): Chat rows without a usable chat template."""
    chat = [i for i, e in enumerate(ctx.examples) if e.is_chat]
    if not chat:
        raise NotApplicable("no conversational rows")
    tpl = ctx.tok_info.chat_template
    if not tpl:
        return [
            Hit(
                "error",
                f"{pct(len(chat), ctx.n)} are conversations, and the tokenizer has no chat template",
                {"value": None, "threshold": "a chat_template"},
                row_ids=ids(ctx, chat),
            )
        ]
    hits = []
    failed = [i for i in chat if ctx.token_rows[i].error]
    if failed:
        errs = Counter(ctx.token_rows[i].error.split(": ", 1)[-1][:120] for i in failed)
        hits.append(
            Hit(
                "error",
                f"the chat template rejects {pct(len(failed), ctx.n)}: {errs.most_common(1)[0][0]}",
                {"value": len(failed), "threshold": 0, "errors": dict(errs.most_common(5))},
                row_ids=ids(ctx, failed),
            )
        )
    if "add_generation_prompt" not in tpl:
        hits.append(
            Hit(
                "warning",
                "the chat template has no add_generation_prompt branch: prompts at inference (and "
                "TRL's prompt/completion split) do not open the assistant turn",
                {"value": False, "threshold": True},
            )
        )
    return hits


# ---------------------------------------------------------------------- T02
_FOREIGN_STOPS = (
    "</s>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<end_of_turn>",
    "<|im_end|>",
    "<|end|>",
    "<eos>",
)


@check(
    "T02",
    "eos_vs_end_of_turn",
    "EOS differs from the template's end-of-turn",
    requires=("tokenizer",),
    reads=("data",),
    severity="warning",
    rank=20,
    rule="the template ends assistant turns with a token that is neither the tokenizer's EOS nor a generation "
    "stop id (e.g. Qwen base <|endoftext|> vs <|im_end|>; Llama-3 <|end_of_text|> vs <|eot_id|>); or targets "
    "end in another model's stop string; any",
    fix="set SFTConfig.eos_token (or the tokenizer's eos_token) to the template's end-of-turn token, and list it "
    "in generation_config.eos_token_id",
    source="trl sft_trainer.md (eos_token); meta-llama/llama3#104; vllm#4180; uns#5386",
)
def t02(ctx: AuditContext) -> list[Hit]:
    """T02 (eos_vs_end_of_turn): EOS differs from the template's end-of-turn."""
    ti = ctx.tok_info
    hits = []
    eot = end_of_turn(ctx)
    eos = ctx.config.eos_token if ctx.config is not None and ctx.config.eos_token else ti.eos_token
    if eot and eos and eot != eos:
        eot_id = ctx.tokenizer.convert_tokens_to_ids(eot)
        if eot_id not in ti.generation_eos_ids:
            hits.append(
                Hit(
                    "warning",
                    f"the template ends turns with {eot!r} but EOS is {eos!r} and generation stops "
                    f"only on ids {ti.generation_eos_ids or [ti.eos_id]}: a chat-trained model "
                    f"keeps generating past its turn",
                    {"value": eot, "threshold": eos, "generation_eos_ids": ti.generation_eos_ids},
                )
            )
    if ctx.examples is not None:
        foreign = [s for s in _FOREIGN_STOPS if s != ti.eos_token and s != eot]
        bad, seen = [], Counter()
        for i, e in enumerate(ctx.examples):
            c = e.completion_text.rstrip()
            for s in foreign:
                if c.endswith(s):
                    bad.append(i)
                    seen[s] += 1
                    break
        if bad:
            hits.append(
                Hit(
                    "warning",
                    f"{pct(len(bad), ctx.n)} end in another model's stop string "
                    f"({dict(seen)}), not this tokenizer's {ti.eos_token!r}",
                    {"value": len(bad), "threshold": 0, "strings": dict(seen)},
                    row_ids=ids(ctx, bad),
                )
            )
    if not hits and not eot and ctx.examples is None:
        raise NotApplicable("the tokenizer has no chat template and no data was given")
    return hits


# ---------------------------------------------------------------------- T03
@check(
    "T03",
    "template_mismatch",
    "Training template differs from the model's template",
    requires=("tokenizer",),
    reads=("config", "data"),
    severity="warning",
    rank=20,
    rule="the training template (axolotl chat_template / LLaMA-Factory template, or markers written into "
    "'text' rows) belongs to a different family than the tokenizer's chat template (chatml, llama3, "
    "llama2/mistral, gemma, phi3, alpaca, ...); any",
    fix="train and serve with one template: use the tokenizer's own (axolotl chat_template: tokenizer_default)",
    source="uns#2160; LLaMA-Factory 'template' help text",
)
def t03(ctx: AuditContext) -> list[Hit]:
    """T03 (template_mismatch): Training template differs from the model's template."""
    model_fam = T.template_family(ctx.tok_info.chat_template)
    hits = []
    c = ctx.config
    if c is not None and c.chat_template and model_fam:
        name = c.chat_template.lower()
        fam = T.TEMPLATE_NAME_FAMILY.get(name)
        if fam and fam != model_fam:
            hits.append(
                Hit(
                    "warning",
                    f"the run trains with template {c.chat_template!r} ({fam}; "
                    f"{c.source('chat_template')}) but the tokenizer's template is {model_fam}: "
                    f"inference prompts will not look like training prompts",
                    {"value": fam, "threshold": model_fam, **c.cite("chat_template")},
                )
            )
    if ctx.examples is not None and model_fam is not None:
        bad, fams = [], Counter()
        for i, e in enumerate(ctx.examples):
            if e.is_chat:
                continue
            s = e.prompt_text + e.completion_text
            if not re.search(r"[<\[#]|USER:", s):
                continue
            found = T.markers_in(s)
            if found and model_fam not in found:
                bad.append(i)
                fams.update(found)
        if bad:
            hits.append(
                Hit(
                    "warning",
                    f"{pct(len(bad), ctx.n)} are pre-formatted with {dict(fams)} markers, but the "
                    f"model's template is {model_fam}",
                    {"value": dict(fams), "threshold": model_fam},
                    row_ids=ids(ctx, bad),
                )
            )
    if not hits and model_fam is None and (c is None or not c.chat_template):
        raise NotApplicable("neither the tokenizer's template family nor a training template is known")
    return hits
