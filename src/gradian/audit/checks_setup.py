"""Checks that read the training setup in the config: the loss mask, packing, LoRA, precision, evaluation,
the batch, preference tuning and the data splits (the learning rate, the schedule and impossible values are in
:mod:`gradian.audit.checks_config`).

Evidence cites the config field each value came from (``TrainConfig.cite``), including ``default (<stack>)``
when a field was left unset and the trainer's default applied.
"""

from __future__ import annotations

import re

from gradian.audit.checks_config import FULL_LR_HIGH, LORA_LR_HIGH, _lora_config, _require_possible, total_steps
from gradian.audit.checks_dataset import count_hits
from gradian.audit.config.axolotl import PACKING_APART
from gradian.audit.context import AuditContext
from gradian.audit.registry import Hit, NotApplicable, check
from gradian.libversions import before, within

# ---------------------------------------------------------------------- C08
_RESPONSE_MARKERS = (
    "### Response:",
    "### Answer:",  # "### Question: ... ### Answer:" (trl sft docs' completion-only example)
    "### Assistant:",
    "<|im_start|>assistant",
    "[/INST]",
    "<|start_header_id|>assistant",
    "<start_of_turn>model",
    "<|assistant|>",
    "ASSISTANT:",
    "\nAssistant:",
)


@check("C08", requires=(), reads=("config", "data"), severity="warning", rank=20, stages=("sft",))
def loss_on_prompt(ctx: AuditContext) -> list[Hit]:
    """The loss covers the prompt.

    Rule: train_on_inputs / train_on_prompt / train_on_input true, completion_only_loss false, TRL on 'messages' rows
    without assistant_only_loss (every turn is trained), or 'text' rows that hold a flattened prompt and response ('###
    Response:', '### Answer:', '<|im_start|>assistant', '[/INST]' ...) unless the config's
    DataCollatorForCompletionOnlyLM response_template is in the row

    Fix: train on completions only: prompt/completion rows with completion_only_loss, assistant_only_loss for
    conversations, or train_on_inputs: false

    Source: trl sft_config.py (completion_only_loss); axolotl training.py (train_on_inputs default false)
    """
    if ctx.config is None and ctx.examples is None:
        raise NotApplicable("needs --config or --data")
    c = ctx.config
    hits = []
    if c is not None:
        if c.train_on_inputs and not c.is_default("train_on_inputs"):
            hits.append(
                Hit(
                    "warning",
                    f"the loss covers the prompt ({c.source('train_on_inputs')} = true): the model "
                    f"spends capacity learning to write prompts",
                    {"value": True, "threshold": False, **c.cite("train_on_inputs")},
                )
            )
        if c.completion_only_loss is False:
            pc = sum(1 for e in ctx.examples or [] if e.format == "prompt_completion")
            hits.append(
                Hit(
                    "warning",
                    f"completion_only_loss=false ({c.source('completion_only_loss')}): "
                    f"prompt tokens are trained{f' on {pc} prompt/completion rows' if pc else ''}",
                    {"value": False, "threshold": True, **c.cite("completion_only_loss")},
                )
            )
        if c.trains_every_message_turn and ctx.examples is not None:
            msg_rows = [i for i, e in enumerate(ctx.examples) if e.format == "messages"]
            hits += count_hits(
                ctx,
                msg_rows,
                "warning",
                f"are 'messages' conversations and "
                f"assistant_only_loss is off ({c.source('assistant_only_loss')}): TRL trains "
                f"on every turn, user turns included",
                c.cite("assistant_only_loss"),
                fix="set assistant_only_loss: true (with a {% generation %} template), or convert "
                "to prompt/completion rows",
            )
    if ctx.examples is not None:
        rt = c.response_template if c is not None else None
        flat = [
            i
            for i, e in enumerate(ctx.examples)
            if e.format == "text"
            and any(m in e.completion_text for m in _RESPONSE_MARKERS)
            # DataCollatorForCompletionOnlyLM masks everything up to its response_template: a row holding the
            # template is trained on the response only (a row without it is C14's)
            and not (rt and rt.strip() and rt.strip() in e.completion_text)
        ]
        hits += count_hits(
            ctx,
            flat,
            "warning",
            "are 'text' rows holding a flattened prompt and "
            "response: text rows are trained on every token, the prompt included",
            fix="split them into prompt/completion (or messages) rows",
        )
    return hits


# ---------------------------------------------------------------------- C11
@check("C11", requires=("config",), reads=("data",), severity="error", rank=20, stages=("sft",))
def packing_with_completion_mask(ctx: AuditContext) -> list[Hit]:
    """Packing with completion-only masking.

    Rule: packing with a response_template collator (TRL <= 0.14 errors, later silently wrong): error;
    completion/assistant-only loss with packing on TRL 0.18-0.19 (masks dropped): error; TRL version unknown: warning;
    packing_strategy 'wrapped' (rows cut across boundaries): warning

    Fix: upgrade to TRL >= 0.20 and use packing_strategy 'bfd', or turn packing off

    Source: trl#1163; trl#3728, fixed in PR #3749 (v0.20)
    """
    c = ctx.config
    if not c.packing:
        raise NotApplicable("packing is off")
    if c.trainer != "trl":
        raise NotApplicable(f"{c.trainer or 'this trainer'} packs with its own per-row masks")
    cite = c.cite("packing", "packing_strategy", "completion_only_loss", "assistant_only_loss")
    if c.response_template:
        return [
            Hit(
                "error",
                "packing=true with DataCollatorForCompletionOnlyLM (response_template set): TRL <= 0.14 "
                "refuses it and later versions mask the wrong tokens in packed sequences",
                {"value": True, "threshold": False, **cite},
            )
        ]
    if ctx.examples is not None:
        pc = any(e.format == "prompt_completion" for e in ctx.examples)
    else:
        pc = True
    completion_only = c.assistant_only_loss or c.completion_only_loss or (c.completion_only_loss is None and pc)
    if not completion_only:
        return []
    hits = []
    v = ctx.versions.get("trl")
    if within(ctx.versions, "trl", "0.18", "0.20"):
        hits.append(
            Hit(
                "error",
                f"packing with completion-only/assistant-only loss on TRL {v} "
                f"({ctx.version_sources.get('trl') or 'versions'}): the masks are dropped "
                f"when sequences are packed, so prompts are trained",
                {"value": v, "threshold": ">=0.20", "trl_from": ctx.version_sources.get("trl"), **cite},
            )
        )
    elif v is None:
        hits.append(
            Hit(
                "warning",
                "packing with completion-only loss is correct only on TRL >= 0.20 (0.18-0.19 drop "
                "the masks); pass --versions trl=X to confirm",
                {"value": None, "threshold": ">=0.20", **cite},
            )
        )
    if (c.packing_strategy or "").lower() == "wrapped":
        hits.append(
            Hit(
                "warning",
                "packing_strategy='wrapped' cuts rows across sequence boundaries: completions lose their prompts",
                {"value": "wrapped", "threshold": "bfd", **cite},
            )
        )
    return hits


# ---------------------------------------------------------------------- C12
_VARLEN = (
    "flash_attention_2",
    "flash_attention_3",
    "flash_attention",
    "flex_attention",
    "kernels-community",
)


@check("C12", requires=("config",), severity="warning", rank=60, stages=("sft", "preference", "rl", "other"))
def packing_no_varlen_attn(ctx: AuditContext) -> list[Hit]:
    """Packing without variable-length attention.

    Rule: packing / padding_free / sample_packing without flash or flex attention: packed rows attend to each other
    (warning); a TRL run on TRL >= 1.16 with transformers >= 5.24 keeps them apart (padding-free position_ids,
    use_cache=False, transformers' packed-sequence mask: passes), and one whose versions are unknown is info; so
    does an axolotl >= 0.19 run with attn_implementation sdpa / eager / xformers / sage (it drops the packed mask;
    version unknown: info); axolotl with no attn_implementation keeps its segment-id mask (warning); LLaMA-Factory
    keeps rows apart with neat_packing (passes) and never without it, flash attention included (warning)

    Fix: set attn_implementation: flash_attention_2 (or flex_attention); LLaMA-Factory: neat_packing: true

    Source: trl sft_trainer.py warning (cross-contamination); axolotl check_sample_packing_without_attention;
    transformers#39194 (packed masks for sdpa/eager, 2025-07); tests/data/test_trl_packing.py (TRL 1.16, transformers
    5.24, sdpa: each packed batch's gradient is its rows' own); axolotl 0.19.0 utils/schemas/config.py
    attn_decontaminates_packing, tests/data/test_framework_packing.py (its trainer: sdpa / eager kept apart, none not);
    LLaMA-Factory 0.9.5 data/collator.py SFTDataCollatorWith4DAttentionMask (the same test runs its trainer); torchtune
    0.6.1 padded_collate_packed (block-causal masks; the same test runs its LoRA recipe)
    """
    c = ctx.config
    if not (c.packing or c.padding_free):
        raise NotApplicable("packing and padding_free are off")
    if c.trainer == "torchtune":
        raise NotApplicable("torchtune packs with block-causal masks (its recipe keeps packed rows apart)")
    impl = (c.attn_implementation or "").lower()
    if c.trainer == "llamafactory":  # its collator decides, not the attention
        if (c.packing_strategy or "").lower() == "neat":
            return []  # measured: sdpa / eager (block-diagonal 4D mask) kept apart; fa2 by position_ids
        return [
            Hit(
                "warning",
                "packing is on without neat_packing: LLaMA-Factory keeps the packed attention mask all ones, so "
                "packed rows attend to each other whatever the attention (flash attention included)",
                {"value": impl or None, "threshold": "neat_packing: true", **c.cite("packing", "attn_implementation")},
            )
        ]
    if any(v in impl for v in _VARLEN):
        return []
    cite = {
        "value": impl or None,
        "threshold": "flash_attention_2 / flex_attention",
        **c.cite("packing", "padding_free", "attn_implementation"),
    }
    attn = impl or "the default (sdpa/eager)"
    if c.trainer == "axolotl" and impl.startswith(PACKING_APART):  # the varlen kernels passed above
        old_axolotl = before(ctx.versions, "axolotl", "0.19")
        if old_axolotl is False:
            return []  # measured: axolotl 0.19 drops the packed mask (tests/data/test_framework_packing.py)
        if old_axolotl is None:
            return [
                Hit(
                    "info",
                    f"sample_packing is on and attention is {attn}: axolotl 0.19 drops the packed attention mask for "
                    "it and keeps packed rows apart (position_ids restart); older axolotl kept the mask for sdpa / "
                    "eager; pass --versions axolotl=X",
                    {**cite, "versions": {"axolotl": None}},
                )
            ]
    if c.trainer == "trl" and (c.packing_strategy or "bfd").lower() != "wrapped":
        old = [
            lib for lib, v in (("trl", "1.16"), ("transformers", "5.24")) if before(ctx.versions, lib, v) is not False
        ]
        if not old:
            return []  # measured: rows stay apart (tests/data/test_trl_packing.py)
        if all(ctx.versions.get(lib) is None for lib in old):
            return [
                Hit(
                    "info",
                    f"packing is on and attention is {attn}: TRL 1.16 with transformers 5.24 keeps packed rows apart "
                    "(position_ids restart, transformers' packed-sequence mask); older transformers (before the "
                    "mask, 2025-07) let them attend across their boundaries; pass --versions trl=X,transformers=Y",
                    {**cite, "versions": {lib: None for lib in old}},
                )
            ]
    return [
        Hit(
            "warning",
            f"packing is on and attention is {attn}: sequences packed together attend across their boundaries",
            cite,
        )
    ]


# ---------------------------------------------------------------------- C13
@check("C13", requires=("config",), reads=("data",), severity="warning", rank=50)
def lora_alpha_rank(ctx: AuditContext) -> list[Hit]:
    """Unusual LoRA rank / alpha.

    Rule: without rsLoRA: alpha/r outside [0.5, 4] is info, outside [0.25, 8] warns; r > 64 with < 1,000 rows warns; r <
    4 is info

    Fix: r 16-32 with alpha r to 2r (or use_rslora for large r)

    Source: PEFT LoraConfig use_rslora help; Unsloth guide; axolotl examples
    """
    c = _lora_config(ctx)
    _require_possible(ctx, "lora_r", "lora_alpha")
    r, a = c.lora_r, c.lora_alpha
    if not r or a is None:
        raise NotApplicable("LoRA rank or alpha unknown")
    cite = c.cite("lora_r", "lora_alpha", "use_rslora")
    hits = []
    ratio = a / r
    if not c.use_rslora and not 0.5 <= ratio <= 4:
        sev = "warning" if not 0.25 <= ratio <= 8 else "info"
        hits.append(
            Hit(
                sev,
                f"lora_alpha/r = {a:g}/{r} = {ratio:.3g}, outside [0.5, 4]: the update is scaled by "
                f"{ratio:.3g}, which the learning rate must make up for",
                {"value": round(ratio, 4), "threshold": [0.5, 4], **cite},
            )
        )
    if r > 64 and ctx.examples is not None and ctx.n < 1000:
        hits.append(
            Hit(
                "warning",
                f"rank {r} over only {ctx.n} rows (threshold: r > 64 with < 1,000 rows): capacity to memorise",
                {"value": r, "threshold": 64, "n_rows": ctx.n, **cite},
            )
        )
    if r < 4:
        hits.append(Hit("info", f"rank {r} is below 4", {"value": r, "threshold": 4, **cite}))
    return hits


# ---------------------------------------------------------------------- C14
_ATTN = {
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "q",
    "k",
    "v",
    "o",
    "query",
    "key",
    "value",
    "c_attn",
    "qkv_proj",
    "wqkv",
    "query_key_value",
    "output_proj",
    "out_proj",
    "dense",
    "self_attn",
    "attn",
    "attention",
}


@check("C14", requires=("config",), severity="warning", rank=50)
def narrow_targets(ctx: AuditContext) -> list[Hit]:
    """LoRA targets attention only, or repeats modules.

    Rule: target_modules lists a module twice (warning), or covers attention projections only (info)

    Fix: target all linear layers ('all-linear'; axolotl lora_target_linear: true)

    Source: trl lora_without_regret.md; a torchtune config variant listing v_proj twice
    """
    c = _lora_config(ctx)
    t = c.lora_target_modules
    if c.lora_target_linear:
        return []
    if t is None:
        raise NotApplicable("target modules unknown")
    if isinstance(t, str):
        if t.lower() in ("all-linear", "all", "all_linear"):
            return []
        raise NotApplicable(f"target_modules is a pattern ({t!r})")
    hits = []
    dup = sorted({m for m in t if t.count(m) > 1})
    cite = c.cite("lora_target_modules")
    if dup:
        hits.append(
            Hit("warning", f"target_modules lists {dup} more than once", {"value": dup, "threshold": "unique", **cite})
        )
    if t and all(m.split(".")[-1].lower() in _ATTN for m in t):
        hits.append(
            Hit(
                "info",
                f"LoRA targets attention only ({sorted(set(t))}): MLP layers hold most of what SFT changes",
                {"value": sorted(set(t)), "threshold": "all-linear", **cite},
            )
        )
    return hits


# ---------------------------------------------------------------------- C16
_BF16_NATIVE = re.compile(r"llama-?3|qwen|gemma|mistral|mixtral|phi-?3|phi-?4|smollm|olmo|deepseek", re.IGNORECASE)


@check("C16", requires=("config",), reads=("tokenizer",), severity="error", rank=60)
def precision_risk(ctx: AuditContext) -> list[Hit]:
    """Risky precision settings.

    Rule: bf16 and fp16 both on, or 4/8-bit quantisation without an adapter (error); fp16 on a bf16-native model
    (config.json torch_dtype, or the model name), or 4-bit with float16 compute (warning)

    Fix: use bf16 (or fp32 on hardware without bf16); train quantised models through LoRA only

    Source: qlora README (known issue 3); google/gemma_pytorch#24; axolotl peft.py validate_adapter
    """
    c = ctx.config
    hits = []
    cite = c.cite("bf16", "fp16", "load_in_4bit", "load_in_8bit")
    if c.bf16 and c.fp16:
        hits.append(Hit("error", "bf16 and fp16 are both true", {"value": "bf16+fp16", "threshold": "one", **cite}))
    if (c.load_in_4bit or c.load_in_8bit) and c.is_lora is False:
        hits.append(
            Hit(
                "error",
                "the model is loaded in 4/8-bit but no adapter is trained: quantised weights cannot be "
                "fine-tuned directly",
                {"value": "quantised full fine-tune", "threshold": "LoRA", **cite},
            )
        )
    if c.fp16 and not c.bf16:
        native = None
        if ctx.tokenizer is not None and str(ctx.tok_info.torch_dtype or "") == "bfloat16":
            native = "config.json torch_dtype=bfloat16"
        elif c.base_model and _BF16_NATIVE.search(c.base_model):
            native = f"model {c.base_model!r} is released in bf16"
        if native:
            hits.append(
                Hit(
                    "warning",
                    f"fp16 training on a bf16-native model ({native}): activations overflow fp16's "
                    f"range, giving NaN/inf losses",
                    {"value": "fp16", "threshold": "bf16", **cite},
                )
            )
    if c.load_in_4bit and (c.bnb_4bit_compute_dtype or "").lower() in ("float16", "fp16", "torch.float16"):
        hits.append(
            Hit(
                "warning",
                "4-bit weights with float16 compute: the QLoRA README's known instability",
                {"value": c.bnb_4bit_compute_dtype, "threshold": "bfloat16", **c.cite("bnb_4bit_compute_dtype")},
            )
        )
    return hits


# ---------------------------------------------------------------------- C17
@check("C17", requires=("config",), reads=("eval", "data"), severity="error", rank=60)
def eval_misconfig(ctx: AuditContext) -> list[Hit]:
    """Evaluation mis-configured.

    Rule: an eval set exists but eval_strategy is 'no' (warning); eval_steps > total steps (warning);
    load_best_model_at_end with eval and save strategies that differ, or save_steps not a multiple of eval_steps (error:
    transformers refuses)

    Fix: set eval_strategy (and save_strategy) to 'steps' with eval_steps dividing save_steps

    Source: tf TrainingArguments __post_init__
    """
    c = ctx.config
    if c.trainer not in ("trl", "hf", "llamafactory", "axolotl"):
        raise NotApplicable(f"{c.trainer or 'this trainer'} does not use TrainingArguments' eval settings")
    hits = []
    cite = c.cite("eval_strategy", "eval_steps", "save_strategy", "save_steps", "load_best_model_at_end")
    has_eval = bool(c.has_eval_dataset or (c.val_set_size or 0) > 0)
    es = (c.eval_strategy or "no").lower()
    if has_eval and es == "no" and c.trainer != "axolotl":
        hits.append(
            Hit(
                "warning",
                f"an eval set is configured but eval_strategy is 'no' ({c.source('eval_strategy')}):"
                f" it is never evaluated",
                {"value": "no", "threshold": "steps/epoch", **cite},
            )
        )
    steps, how = total_steps(ctx)
    if es == "steps" and c.eval_steps and c.eval_steps >= 1 and steps is not None and c.eval_steps > steps:
        hits.append(
            Hit(
                "warning",
                f"eval_steps={c.eval_steps:g} is beyond the run's {steps} steps ({how}): it never evaluates",
                {"value": c.eval_steps, "threshold": steps, **cite},
            )
        )
    if c.load_best_model_at_end:
        ss = (c.save_strategy or "steps").lower()
        if ss != es:
            hits.append(
                Hit(
                    "error",
                    f"load_best_model_at_end needs save_strategy == eval_strategy ({ss!r} vs "
                    f"{es!r}): transformers refuses to start",
                    {"value": [ss, es], "threshold": "equal", **cite},
                )
            )
        elif (
            ss == "steps"
            and c.save_steps
            and c.eval_steps
            and c.save_steps >= 1
            and c.eval_steps >= 1
            and c.save_steps % c.eval_steps
        ):
            hits.append(
                Hit(
                    "error",
                    f"load_best_model_at_end needs save_steps ({c.save_steps:g}) to be a multiple of "
                    f"eval_steps ({c.eval_steps:g})",
                    {"value": c.save_steps, "threshold": f"multiple of {c.eval_steps:g}", **cite},
                )
            )
    return hits


# ---------------------------------------------------------------------- C18
@check("C18", requires=("config",), severity="warning", rank=50)
def big_batch_lora(ctx: AuditContext) -> list[Hit]:
    """Large effective batch for LoRA.

    Rule: LoRA effective batch (micro batch x grad accumulation, 1 device) > 32 is info, > 128 warns

    Fix: keep LoRA's effective batch at 32 or below

    Source: trl lora_without_regret.md (LoRA is less tolerant of large batches)
    """
    c = _lora_config(ctx)
    _require_possible(ctx, "micro_batch_size", "gradient_accumulation_steps", "total_batch_size")
    eb = c.effective_batch()
    if not eb:
        raise NotApplicable("batch size unknown")
    if eb <= 32:
        return []
    return [
        Hit(
            "warning" if eb > 128 else "info",
            f"effective batch {eb} (micro batch x grad accumulation, 1 device) is above 32 for LoRA",
            {
                "value": eb,
                "threshold": 32,
                **c.cite("micro_batch_size", "gradient_accumulation_steps", "total_batch_size"),
            },
        )
    ]


# ---------------------------------------------------------------------- C20
#: Preference tuning (DPO/KTO, with a reference model) moves far less than SFT, and how far depends on what trains.
#: Full fine-tunes: alignment-handbook's full DPO recipes use 5e-7, TRL's DPOConfig/KTOConfig default 1e-6; above
#: ~1e-5 a full DPO collapses the policy. LoRA/QLoRA adapters (a low-rank update, and the reference is the frozen
#: base) are published from 5e-6 to 5e-4: alignment-handbook zephyr-7b-beta dpo/config_qlora.yaml 5e-6,
#: LLaMA-Factory examples/train_lora/qwen3_lora_dpo.yaml and qwen3_lora_kto.yaml 5e-6, axolotl
#: examples/llama-3/instruct-dpo-lora-8b.yml and qlora-1b-kto.yaml 2e-4, torchtune
#: recipes/configs/llama3_1/8B_lora_dpo.yaml 5e-4 (tests/audit/published_examples.py holds them, with their commits).
#: So LoRA warns only above the top of that published range.
PREF_LR_HIGH_FULL = 1e-5
PREF_LR_HIGH_LORA = 5e-4
#: DPO/KTO/ORPO beta: TRL default 0.1; recipes use 0.01 to 0.5 (SimPO's beta is on another scale, 2 to 10).
PREF_BETA_HIGH = 1.0
#: Preference stages without a reference model (their loss includes the SFT NLL): ORPO, SimPO, CPO.
REF_FREE_STAGES = ("orpo", "simpo", "cpo")


@check("C20", requires=("config",), severity="warning", rank=50, stages=("preference",))
def preference_settings(ctx: AuditContext) -> list[Hit]:
    """Preference-tuning settings out of range.

    Rule: a DPO/ORPO/KTO/CPO run (TRL's preference fields, axolotl rl:, LLaMA-Factory stage): learning_rate >
    {PREF_LR_HIGH_FULL:g} on a full fine-tune or > {PREF_LR_HIGH_LORA:g} on LoRA warns, 4x that errors (ORPO/SimPO/CPO,
    which have no reference model and include the SFT loss, and reward models: SFT's {FULL_LR_HIGH:g} /
    {LORA_LR_HIGH:g}; C02 does not run on preference stages) (each trainer's own default learning rate when unset:
    DPO/KTO/ORPO/CPO 1e-6, reward 1e-4); beta <= 0 is an error, beta > {PREF_BETA_HIGH:g} warns (not for SimPO);
    max_prompt_length >= max_length leaves no room for the response: an error (**H** ranges)

    Fix: use the published ranges: full DPO/KTO ~5e-7 to 1e-6, LoRA DPO/KTO 5e-6 to 5e-4; beta 0.01 to 0.5;
    max_prompt_length below max_length

    Source: trl trainer/dpo_config.py, kto_config.py, experimental/orpo/orpo_config.py (defaults); alignment-handbook
    recipes (zephyr-7b-beta dpo full and qlora, zephyr-141b orpo); LoRA DPO/KTO examples shipped by axolotl (llama-3
    instruct-dpo-lora-8b, qlora-1b-kto: 2e-4), torchtune (llama3_1 8B_lora_dpo: 5e-4) and LLaMA-Factory (qwen3_lora_dpo,
    qwen3_lora_kto: 5e-6)

    The learning-rate bound depends on what trains: a full fine-tune warns above :data:`PREF_LR_HIGH_FULL`, a LoRA
    run above :data:`PREF_LR_HIGH_LORA`, the top of the LoRA DPO/KTO rates the frameworks ship in their own examples
    (axolotl 2e-4, torchtune 5e-4; the handbook and LLaMA-Factory 5e-6), so those examples are not flagged.
    """
    c = ctx.config
    hits = []
    lr = c.learning_rate
    if lr is not None and c.is_lora is not None:
        # ORPO, SimPO and CPO have no reference model: their loss is SFT's NLL plus a preference term, so SFT's
        # ranges (C02's) apply (axolotl's published examples/mistral/orpo runs LoRA ORPO at 2e-4); a reward model
        # is a classifier trained on pairs, with no reference either: SFT's ranges too
        ref_free = c.stage in REF_FREE_STAGES or any(k in (c.loss_type or "") for k in ("simpo", "cpo"))
        if c.stage in ("rm", "reward"):
            hi = LORA_LR_HIGH if c.is_lora else FULL_LR_HIGH
            why = "a reward model trains like an SFT run (no reference model), and SFT's range ends there"
        elif ref_free:
            hi = LORA_LR_HIGH if c.is_lora else FULL_LR_HIGH
            why = f"{c.stage.upper()} trains the SFT loss plus a preference term, and SFT's range ends there"
        else:
            hi = PREF_LR_HIGH_LORA if c.is_lora else PREF_LR_HIGH_FULL
            why = "preference tuning moves the policy away from its reference quickly, and high rates collapse it"
        if lr > hi:
            kind = "LoRA" if c.is_lora else "full"
            sev = "error" if lr > 4 * hi else "warning"  # C02's error line, which preference stages do not run
            hits.append(
                Hit(
                    sev,
                    f"learning_rate={lr:g} on a {kind} {c.stage.upper()} run is above {hi:g} ({4 * hi:g} is the "
                    f"error line): {why}",
                    {"value": lr, "threshold": hi, **c.cite("learning_rate", "stage", "finetuning")},
                )
            )
    if c.beta is not None:
        simpo = c.stage == "simpo" or "simpo" in (c.loss_type or "")
        if c.beta <= 0:
            hits.append(
                Hit(
                    "error",
                    f"beta={c.beta:g} ({c.source('beta')}): the preference loss needs beta > 0",
                    {"value": c.beta, "threshold": 0, **c.cite("beta")},
                )
            )
        elif c.beta > PREF_BETA_HIGH and not simpo:
            hits.append(
                Hit(
                    "warning",
                    f"beta={c.beta:g} ({c.source('beta')}) is above {PREF_BETA_HIGH:g}: the policy is held so close "
                    f"to its reference that it barely learns the preferences (recipes use 0.01 to 0.5)",
                    {"value": c.beta, "threshold": PREF_BETA_HIGH, **c.cite("beta")},
                )
            )
    if c.max_prompt_length is not None and c.max_length is not None and c.max_prompt_length >= c.max_length:
        hits.append(
            Hit(
                "error",
                f"max_prompt_length={c.max_prompt_length} >= max_length={c.max_length}: a prompt that long leaves no "
                f"room for the chosen/rejected response, which is truncated away",
                {"value": c.max_prompt_length, "threshold": c.max_length, **c.cite("max_prompt_length", "max_length")},
            )
        )
    return hits


# ---------------------------------------------------------------------- C21
@check("C21", requires=("config",), severity="warning", rank=30)
def trains_on_test_split(ctx: AuditContext) -> list[Hit]:
    """A published test split is used for training.

    Rule: a training dataset split named test* (test, test_sft, test_prefs ...) in TRL dataset_train_split,
    alignment-handbook dataset_mixture.datasets[].split (every entry is trained on) or axolotl datasets[].split: any
    warns. The old handbook dataset_splits list trains on its *train* names only (test_* is its eval set)

    Fix: train on the train split (train_sft, train_prefs ...); if you evaluate on that benchmark, the test rows you
    trained on contaminate it

    Source: HuggingFaceH4/ultrachat_200k and ultrafeedback_binarized split names (train_*/test_*); heuristic
    """
    c = ctx.config
    if not c.train_splits:
        raise NotApplicable("the config names no training split")
    bad = [d for d in c.train_splits if str(d["split"]).strip().lower().startswith("test")]
    return [
        Hit(
            "warning",
            f"the run trains on the {d['split']!r} split of {d['dataset']} ({d['from']}): a test split is held "
            f"out for evaluation, and evaluating on it after training on it is contaminated",
            {"value": d["split"], "threshold": "train*", "dataset": d["dataset"], "from": d["from"]},
        )
        for d in bad
    ]


# ---------------------------------------------------------------------- C22
@check("C22", requires=("config",), severity="warning", rank=40, stages=("preference",))
def pref_reference(ctx: AuditContext) -> list[Hit]:
    """The preference run's reference model is not the model it starts from.

    Rule: LLaMA-Factory DPO/KTO with LoRA and adapter_name_or_path (an SFT adapter resumed as the trained adapter), no
    create_new_adapter and no ref_model: the reference is the model with its adapter disabled, i.e. the base without the
    SFT adapter (warning); TRL sync_ref_model with a LoRA/QLoRA policy (TRL refuses it: there is no separate reference
    to sync) or with precompute_ref_log_probs (fixed reference log-probs go stale): errors

    Fix: make the reference the model the run starts from (LLaMA-Factory: create_new_adapter: true, or ref_model +
    ref_model_adapters); TRL: sync_ref_model: false with an adapter or with precompute_ref_log_probs

    Source: LLaMA-Factory model/adapter.py (adapter_to_merge / adapter_to_resume), train/trainer_utils.py
    create_ref_model (LoRA: no reference model) and train/dpo/trainer.py compute_reference_log_probs (disable_adapter);
    trl trainer/dpo_trainer.py (sync_ref_model with PEFT, with precompute_ref_log_probs)

    the reference model a DPO/KTO loss is measured against.

    The loss is ``-log σ(β [(log π(y_w|x) - log π_ref(y_w|x)) - (log π(y_l|x) - log π_ref(y_l|x))])``: the policy
    is held near ``π_ref``. A run meant to refine an SFT model must use that SFT model as ``π_ref``; LLaMA-Factory's
    LoRA DPO/KTO, when it resumes the SFT adapter, computes ``π_ref`` with the adapter disabled: the base model.
    """
    c = ctx.config
    hits = []
    if c.trainer not in ("llamafactory", "trl"):
        raise NotApplicable(f"the reference-model rules read LLaMA-Factory and TRL configs, not {c.trainer or 'this'}")
    uses_ref = c.stage in ("dpo", "ipo", "kto")  # ORPO/SimPO/CPO have no reference (REF_FREE_STAGES)
    if c.trainer == "llamafactory" and uses_ref and c.is_lora and c.init_adapters and not c.ref_model:
        quantized = c.finetuning == "qlora"
        if not c.create_new_adapter or quantized:
            resumed = c.init_adapters[-1]
            merged = c.init_adapters[:-1]
            base = f"the base model{' with ' + ', '.join(merged) + ' merged' if merged else ''}"
            why = (
                "quantization_bit is set, so LLaMA-Factory does not merge adapters and create_new_adapter does not help"
                if quantized and c.create_new_adapter
                else "create_new_adapter is not set"
            )
            hits.append(
                Hit(
                    "warning",
                    f"the {c.stage.upper()} reference is {base}, not the model the run starts from: {resumed} "
                    f"({c.source('init_adapters')}) is resumed as the trained adapter ({why}) and no ref_model is "
                    f"set, so the reference log-probs are computed with that adapter disabled; the loss pulls the "
                    f"policy back toward the model before {resumed}",
                    {
                        "value": resumed,
                        "threshold": "reference = the starting model",
                        **c.cite("init_adapters", "create_new_adapter", "ref_model", "stage", "finetuning"),
                    },
                    fix=(
                        ""
                        if quantized
                        else "set create_new_adapter: true (the SFT adapter is merged into the base and a new adapter "
                        "trains on top, so disabling it gives the SFT model), or "
                    )
                    + f"set ref_model: <the base> with ref_model_adapters: {resumed}, or export the merged SFT model "
                    "(llamafactory-cli export) and train the preference stage on it",
                )
            )
    if c.sync_ref_model and c.is_lora:
        hits.append(
            Hit(
                "error",
                f"sync_ref_model=true ({c.source('sync_ref_model')}) on a {c.finetuning} run: with a PEFT adapter "
                f"TRL's reference is the policy with its adapter disabled, so there is no reference model to sync "
                f"and DPOTrainer refuses the run",
                {"value": True, "threshold": False, **c.cite("sync_ref_model", "finetuning")},
                fix="set sync_ref_model: false (the adapter-disabled base stays the reference), or train the full "
                "model with a ref_model if you need TR-DPO",
            )
        )
    if c.sync_ref_model and c.precompute_ref_log_probs:
        hits.append(
            Hit(
                "error",
                f"sync_ref_model=true ({c.source('sync_ref_model')}) with precompute_ref_log_probs=true "
                f"({c.source('precompute_ref_log_probs')}): the reference log-probs are computed once, before "
                f"training, while TR-DPO moves the reference every ref_model_sync_steps; TRL refuses the pair",
                {"value": True, "threshold": False, **c.cite("sync_ref_model", "precompute_ref_log_probs")},
                fix="set precompute_ref_log_probs: false, or sync_ref_model: false",
            )
        )
    return hits
