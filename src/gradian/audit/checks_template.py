"""Checks that read the tokenizer and its chat template against the config: the model's context, assistant
masks, the pad token, new tokens, and the template itself (the token-level checks of the rows are in
:mod:`gradian.audit.checks_tokens`).
"""

from __future__ import annotations

import re
from collections import Counter

from gradian.audit import text as T
from gradian.audit.checks_dataset import count_hits, ids, pct
from gradian.audit.checks_tokens import _PLAIN_MARKER_FAMILIES, _rendered, end_of_turn
from gradian.audit.context import AuditContext
from gradian.audit.registry import Hit, NotApplicable, check
from gradian.libversions import before


# ---------------------------------------------------------------------- C07
@check("C07", requires=("config", "tokenizer"), reads=("data",), severity="error", rank=20)
def max_len_over_model(ctx: AuditContext) -> list[Hit]:
    """max_length beyond the model's context.

    Rule: the run's max_length > max_position_embeddings (config.json) or the tokenizer's model_max_length; or, with no
    truncation, rows longer than that; any

    Fix: cap max_length at the model's context length (or use a RoPE-scaled model)

    Source: LF#5952
    """
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
@check("C09", requires=("config", "tokenizer"), severity="warning", rank=20, stages=("sft",))
def assistant_mask_template(ctx: AuditContext) -> list[Hit]:
    """assistant_only_loss with a template that cannot mask.

    Rule: assistant_only_loss=true and the template the run trained with (the run's saved template, a .jinja
    chat_template_path, else the tokenizer's) has no {% generation %} block TRL can patch in, or the last non-whitespace
    token of its assistant mask is not an added token (TRL is_chat_template_stop_token_trained)

    Fix: use a training chat template whose {% generation %} block covers the end-of-turn token

    Source: trl PR #4201; trl sft_trainer.py 'the model may not learn to stop'; marin-community/marin#7237

    Judges the template the run trained with (:attr:`AuditContext.training_template`) by TRL
    1.16's rules: without ``{% generation %}`` markers TRL swaps in its training template for the
    families it knows (``trl.chat_template_utils.get_training_chat_template``, used when TRL is
    installed) and otherwise fails; with markers, [user, assistant, user] is rendered with
    ``return_assistant_tokens_mask=True`` and the last masked token that does not decode to
    whitespace must be an added (special) token, the end of turn
    (``is_chat_template_stop_token_trained``).
    """
    c = ctx.config
    if not c.assistant_only_loss:
        raise NotApplicable("assistant_only_loss is off")
    tpl, where = ctx.training_template
    if not tpl:
        raise NotApplicable("the tokenizer has no chat template (T01 reports it)")
    if not _GENERATION.search(tpl):
        swapped = _trl_training_template(ctx.tokenizer, tpl)
        if swapped is None:
            return [
                Hit(
                    "warning",
                    f"assistant_only_loss=true but the chat template ({where}) has no {{% generation %}} block: "
                    f"older TRL raises 'no assistant tokens', newer TRL swaps in a training template only for "
                    f"the model families it knows",
                    {"value": False, "threshold": True, "template": where, **c.cite("assistant_only_loss")},
                )
            ]
        tpl, where = swapped, f"TRL's training template for {where}"
    try:
        enc = ctx.tokenizer.apply_chat_template(
            [
                {"role": "user", "content": "dummy"},
                {"role": "assistant", "content": "dummy"},
                {"role": "user", "content": "dummy"},
            ],
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
            chat_template=tpl,
        )
    except Exception as e:  # a template the tokenizer cannot mask with
        return [
            Hit(
                "warning",
                f"the template's assistant mask cannot be computed ({type(e).__name__}; {where})",
                {"error": str(e)[:200], "template": where},
            )
        ]
    ids_, mask = list(enc["input_ids"]), list(enc["assistant_masks"])
    added = set(ctx.tokenizer.get_added_vocab().values())
    last = None
    for t, m in zip(reversed(ids_), reversed(mask)):
        if m and ctx.tokenizer.decode([t]).strip() != "":
            last = t
            break
    if last is not None and last in added:
        return []
    eot = end_of_turn(ctx)
    said = "masks no assistant token" if last is None else "ends before the end-of-turn token"
    return [
        Hit(
            "warning",
            f"the {{% generation %}} block of the training template ({where}) {said}"
            f"{f' {eot!r}' if eot and last is not None else ''}: the model is never trained to stop",
            {"value": False, "threshold": True, "end_of_turn": eot, "template": where},
        )
    ]


_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


def _trl_training_template(tok, tpl: str) -> str | None:
    """TRL's training template (with ``{% generation %}``) for ``tpl``, when TRL is installed and knows it."""
    try:
        from trl.chat_template_utils import get_training_chat_template
    except Exception:  # TRL absent, or a TRL without the helper
        return None
    saved = tok.chat_template
    try:
        tok.chat_template = tpl
        return get_training_chat_template(tok)
    except Exception:  # ValueError: TRL cannot patch this template
        return None
    finally:
        tok.chat_template = saved


# ---------------------------------------------------------------------- C10
_PAD_MASKING = ("DataCollatorForLanguageModeling", "DataCollatorForCompletionOnlyLM")


@check("C10", requires=("tokenizer",), reads=("config",), severity="error", rank=20)
def pad_is_eos(ctx: AuditContext) -> list[Hit]:
    """Pad token is EOS and the collator masks pads.

    Rule: pad id == EOS id (or no pad token, so trainers use EOS) with a collator that masks labels by pad id
    (transformers DataCollatorForLanguageModeling, TRL's DataCollatorForCompletionOnlyLM, TRL < 0.16): error; with the
    collator unknown: info

    Fix: give the tokenizer a separate pad token (e.g. '<|finetune_right_pad_id|>' or a new '<pad>')

    Source: trl#1623, trl PR #3091, mlabonne/llm-course#33, open-r1 PR #494
    """
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


@check("C15", requires=("config",), reads=("tokenizer",), severity="error", rank=20)
def new_tokens_untrained(ctx: AuditContext) -> list[Hit]:
    """New tokens with frozen embeddings.

    Rule: tokens are added (config tokens/new_special_tokens, a chat template cloned from a tokenizer: a
    chat_template_path that is not a .jinja/.j2 file, or the training template's markers missing from the tokenizer)
    while a LoRA run trains neither embed_tokens/lm_head (modules_to_save) nor trainable_token_indices; any

    Fix: add embed_tokens and lm_head to modules_to_save (or set trainable_token_indices), or use the model's own chat
    template

    Source: axolotl loaders/utils.py; trl sft_trainer.py warning; PEFT troubleshooting.md
    """
    c = ctx.config
    if not c.is_lora:
        raise NotApplicable(
            "not a LoRA run (full fine-tuning trains the embeddings)"
            if c.is_lora is False
            else "cannot tell whether the run used LoRA"
        )
    added: list[str] = list(c.added_tokens or [])
    why = [c.source("added_tokens")] if c.added_tokens else []
    # TRL 1.16 (sft_trainer.py): a .jinja/.j2 chat_template_path is read into the tokenizer as is (no tokens
    # added); anything else is a tokenizer to clone_chat_template from, which adds the source's tokens.
    cloned = bool(c.chat_template_path) and not c.chat_template_path.endswith((".jinja", ".j2"))
    if cloned:
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
    if not added and not cloned:
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
@check("T01", requires=("data", "tokenizer"), severity="error", rank=20)
def chat_template_missing(ctx: AuditContext) -> list[Hit]:
    """Chat rows without a usable chat template.

    Rule: conversational rows and a tokenizer with no chat_template, or a template that rejects the rows (error); a
    template with no add_generation_prompt branch (warning); any

    Fix: set a chat template (TRL: clone_chat_template / chat_template_path), or fix the rows the template rejects

    Source: trl docs (conversational datasets need a chat template); LF#5213
    """
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


@check("T02", requires=("tokenizer",), reads=("data",), severity="warning", rank=20)
def eos_vs_end_of_turn(ctx: AuditContext) -> list[Hit]:
    """EOS differs from the template's end-of-turn.

    Rule: the template ends assistant turns with a token that is neither the tokenizer's EOS nor a generation stop id
    (e.g. Qwen base <|endoftext|> vs <|im_end|>; Llama-3 <|end_of_text|> vs <|eot_id|>); or targets end in another
    model's stop string; any

    Fix: set SFTConfig.eos_token (or the tokenizer's eos_token) to the template's end-of-turn token, and list it in
    generation_config.eos_token_id

    Source: trl sft_trainer.md (eos_token); meta-llama/llama3#104; vllm#4180; uns#5386
    """
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
        hits += count_hits(
            ctx,
            bad,
            "warning",
            f"end in another model's stop string ({dict(seen)}), not this tokenizer's {ti.eos_token!r}",
            {"strings": dict(seen)},
        )
    if not hits and not eot and ctx.examples is None:
        raise NotApplicable("the tokenizer has no chat template and no data was given")
    return hits


# ---------------------------------------------------------------------- T03
@check("T03", requires=("tokenizer",), reads=("config", "data"), severity="warning", rank=20)
def template_mismatch(ctx: AuditContext) -> list[Hit]:
    """Training template differs from the model's template.

    Rule: the training template (axolotl chat_template / LLaMA-Factory template, or markers written into 'text' rows)
    belongs to a different family than the tokenizer's chat template (chatml, llama3, llama2/mistral, gemma, phi3,
    alpaca, ...); any

    Fix: train and serve with one template: use the tokenizer's own (axolotl chat_template: tokenizer_default)

    Source: uns#2160; LLaMA-Factory 'template' help text
    """
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
