"""Checks that read the training config (and the data size where it matters).

Evidence cites the config field each value came from (``TrainConfig.cite``),
including ``default (<stack>)`` when a field was left unset and the trainer's
default applied. Device count is not in any config: step arithmetic assumes
one device and says so.
"""

from __future__ import annotations

import math
import re

from gradian.audit.context import AuditContext
from gradian.audit.hf_order import trained_rows
from gradian.audit.registry import Hit, NotApplicable, check

LORA_LR_LOW = 5e-5
LORA_LR_HIGH = 5e-4
LORA_LR_HIGH_BIG = 2e-4
FULL_LR_HIGH = 5e-5


def _lora(ctx: AuditContext) -> bool:
    c = ctx.config
    if c.is_lora is None:
        raise NotApplicable("cannot tell whether the run used LoRA (no adapter / finetuning type in the config)")
    return c.is_lora


def _lora_config(ctx: AuditContext):
    """The run's config, for a rule on LoRA runs only (NotApplicable on full fine-tuning, or when unknown)."""
    if not _lora(ctx):
        raise NotApplicable("full fine-tuning")
    return ctx.config


# ---------------------------------------------------------------------- impossible values (C19)
def _bad_num(
    v, *, positive: bool = True, lo: float | None = None, hi: float | None = None, hi_open: bool = False
) -> str | None:
    """Why ``v`` is impossible for its field, or None."""
    if v is None:
        return None
    if isinstance(v, float) and not math.isfinite(v):
        return "not a finite number"
    if positive and v <= 0:
        return "must be > 0"
    if lo is not None and v < lo:
        return f"must be >= {lo:g}"
    if hi is not None and (v >= hi if hi_open else v > hi):
        return f"must be {'<' if hi_open else '<='} {hi:g}"
    return None


def impossible_values(c) -> dict[str, tuple[object, str]]:
    """``{field: (value, why)}`` for config values no trainer can run with (C19 reports them; the checks
    that compute with a field skip it instead of passing).
    """
    out: dict[str, tuple[object, str]] = {}
    checks = {
        "learning_rate": _bad_num(c.learning_rate),
        # num_train_epochs is ignored when max_steps > 0 (transformers), so 0 epochs is then fine
        "num_epochs": None
        if (c.max_steps and c.num_epochs is not None and math.isfinite(c.num_epochs) and c.num_epochs >= 0)
        else _bad_num(c.num_epochs),
        "micro_batch_size": _bad_num(c.micro_batch_size),
        "gradient_accumulation_steps": _bad_num(c.gradient_accumulation_steps),
        "total_batch_size": _bad_num(c.total_batch_size),
        "max_length": _bad_num(c.max_length),
        "lora_r": _bad_num(c.lora_r) if c.is_lora is not False else None,
        "lora_alpha": _bad_num(c.lora_alpha) if c.is_lora is not False else None,
        "lora_dropout": _bad_num(c.lora_dropout, positive=False, lo=0, hi=1, hi_open=True),
        "warmup_ratio": _bad_num(c.warmup_ratio, positive=False, lo=0, hi=1),
        "warmup_steps": _bad_num(c.warmup_steps, positive=False, lo=0),
    }
    for name, why in checks.items():
        if why:
            out[name] = (getattr(c, name), why)
    return out


def _require_possible(ctx: AuditContext, *names: str) -> None:
    """Skip (NotApplicable) when a field this check computes with is impossible: C19 reports it."""
    bad = impossible_values(ctx.config)
    hit = [n for n in names if n in bad]
    if hit:
        raise NotApplicable(", ".join(f"{n}={bad[n][0]!r} is impossible" for n in hit) + " (see C19)")


# A family name and its version (llama3_2, Qwen2.5, gemma-2): stripped before the size is read, so the
# version's digits are not taken for the size. Digits followed by "b" are a size, never a version.
_VERSIONED = re.compile(
    r"(llama|qwen|phi|gemma|mistral|deepseek|internlm|olmo|smollm|glm|yi|falcon)[-_ ]?v?"
    r"(\d+)(?:[._](\d+))?(?![\d.]*b(?![a-z]))"
)
# Minor versions that exist, per family and major (torchtune writes them with "_": qwen2_5, llama3_2); any other
# "_digits" after a family version starts the size (qwen3_0_6b is Qwen3 0.6B)
_MINORS = {
    ("llama", "3"): {"1", "2", "3"},
    ("qwen", "1"): {"5"},
    ("qwen", "2"): {"5"},
    ("phi", "3"): {"5"},
    ("phi", "1"): {"5"},
    ("deepseek", "2"): {"5"},
    ("gemma", "3"): set(),
    ("gemma", "2"): set(),
}
_SIZE = re.compile(r"(?<![\d.a-z])(\d+)(?:[._](\d+))?\s*b(?![a-z])")
_MOE = re.compile(r"(?<![\d.a-z])(\d+)x(\d+(?:\.\d+)?)\s*b(?![a-z])")


def _model_billions(name: str | None) -> float | None:
    """Parameter count in billions from a model name: ``Qwen2.5-1.5B`` and torchtune's ``qwen2_5_1_5b`` -> 1.5,
    ``lora_llama3_2_1b`` -> 1, ``qwen3_0_6b`` -> 0.6, ``Mixtral-8x7B`` -> 56; None when the name gives no size.
    """
    if not name:
        return None

    def strip_version(m: re.Match) -> str:
        fam, major, minor = m.group(1), m.group(2), m.group(3)
        if minor is not None and minor not in _MINORS.get((fam, major), set()):
            # not a minor version of this family: those digits begin the size
            return f"{fam}V{m.group(0)[len(m.group(0)) - len(minor) - 1 :]}"
        return f"{fam}V"

    low = _VERSIONED.sub(strip_version, name.lower())
    moe = _MOE.findall(low)
    if moe:
        return float(moe[-1][0]) * float(moe[-1][1])
    sizes = _SIZE.findall(low)
    if not sizes:
        return None
    whole, frac = sizes[-1]
    return float(f"{whole}.{frac}") if frac else float(whole)


def total_steps(ctx: AuditContext) -> tuple[int | None, str]:
    """Optimiser steps of the run: max_steps if set, else ceil(N / effective batch) x epochs (one device).

    None when unknown, or when a value it needs is impossible (C19 reports those).
    """
    c = ctx.config
    if c.max_steps:
        return c.max_steps, f"max_steps ({c.source('max_steps')})"
    bad = impossible_values(c).keys() & {
        "num_epochs",
        "micro_batch_size",
        "gradient_accumulation_steps",
        "total_batch_size",
    }
    if bad:
        return None, f"unknown ({', '.join(sorted(bad))} impossible, see C19)"
    eb = c.effective_batch()
    if ctx.examples is None or not eb or not c.num_epochs:
        return None, "unknown (needs --data and a batch size)"
    if c.dataloader_drop_last and c.micro_batch_size:  # the last short micro-batch of each epoch is never read
        micro = ctx.n // c.micro_batch_size
        spe = math.ceil(micro / (c.gradient_accumulation_steps or 1))
        how = f"ceil({micro} full micro-batches / accumulation {c.gradient_accumulation_steps or 1})"
        return int(math.ceil(spe * c.num_epochs)), f"{how} x {c.num_epochs:g} epochs, 1 device, dataloader_drop_last"
    # = the HF Trainer's ceil(ceil(rows / micro batch) / accumulation) per epoch (ceil(ceil(x/a)/b) = ceil(x/ab))
    spe = math.ceil(ctx.n / eb)
    return int(math.ceil(spe * c.num_epochs)), f"ceil({ctx.n} rows / batch {eb}) x {c.num_epochs:g} epochs, 1 device"


# ---------------------------------------------------------------------- C19
@check("C19", requires=("config",), severity="error", rank=50)
def impossible_value(ctx: AuditContext) -> list[Hit]:
    """A config value no trainer can run with.

    Rule: learning_rate <= 0, num_epochs <= 0 (without max_steps), a batch size or gradient accumulation <= 0,
    max_length <= 0, lora_r or lora_alpha <= 0, lora_dropout outside [0, 1), warmup_ratio outside [0, 1], warmup_steps <
    0, or any of them not finite (inf, nan); any is an error, and the checks that compute with that value are skipped
    instead of passing

    Fix: set the value the run actually used (e.g. learning_rate 2e-4, num_train_epochs 1-3, batch size >= 1, lora_r
    8-64)

    Source: transformers TrainingArguments / PEFT LoraConfig validation (the trainer refuses or trains nothing)
    """
    c = ctx.config
    bad = impossible_values(c)
    if not bad:
        return []
    parts = [f"{n}={v!r} ({c.source(n)}): {why}" for n, (v, why) in bad.items()]
    return [
        Hit(
            "error",
            f"{len(bad)} impossible value{'s' if len(bad) != 1 else ''}: "
            + "; ".join(parts)
            + ". The run cannot have used these: the config is not the one that trained, or the trainer refused it",
            {
                "value": {
                    n: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for n, (v, _) in bad.items()
                },
                "threshold": "possible values",
                **c.cite(*bad),
            },
        )
    ]


# ---------------------------------------------------------------------- C01
@check("C01", requires=("config",), severity="warning", rank=50, stages=("sft", "pretraining"))
def lr_fullft_on_lora(ctx: AuditContext) -> list[Hit]:
    """Full fine-tuning learning rate on a LoRA run.

    Rule: LoRA/QLoRA with learning_rate < {LORA_LR_LOW:g} (TRL's SFTConfig default 2e-5 is a full fine-tuning rate)

    Fix: use 1e-4 to 2e-4 for LoRA

    Source: trl docs sft_trainer.md (adapters ~1e-4; SFTConfig default 2e-5); lora_without_regret.md
    """
    c = _lora_config(ctx)
    if c.learning_rate is None:
        raise NotApplicable("learning rate unknown")
    _require_possible(ctx, "learning_rate")
    if c.learning_rate >= LORA_LR_LOW:
        return []
    d = " (the default, because learning_rate is unset)" if c.is_default("learning_rate") else ""
    return [
        Hit(
            "warning",
            f"learning_rate={c.learning_rate:g}{d} on a LoRA run is below {LORA_LR_LOW:g}: LoRA "
            f"needs roughly 10x the full fine-tuning rate, so the adapter barely moves",
            {"value": c.learning_rate, "threshold": LORA_LR_LOW, **c.cite("learning_rate", "finetuning")},
        )
    ]


# ---------------------------------------------------------------------- C02
@check("C02", requires=("config",), severity="error", rank=50, stages=("sft", "pretraining", "rl", "other"))
def lr_too_high(ctx: AuditContext) -> list[Hit]:
    """Learning rate far too high.

    Rule: LoRA (and LLaMA-Factory freeze tuning) lr > {LORA_LR_HIGH:g} (> {LORA_LR_HIGH_BIG:g} for models >= 13B) warns,
    > 4x that errors; full fine-tuning lr > {FULL_LR_HIGH:g} warns, > 4x errors

    Fix: lower the learning rate (LoRA 1e-4 to 2e-4; full fine-tuning 1e-5 to 2e-5)

    Source: artidoro/qlora README; Unsloth guide
    """
    c = ctx.config
    lr = c.learning_rate
    if lr is None:
        raise NotApplicable("learning rate unknown")
    _require_possible(ctx, "learning_rate")
    lora = _lora(ctx)
    size = _model_billions(c.base_model)
    freeze = c.finetuning == "freeze"  # a few layers trained, like an adapter: LoRA's range, not full FT's
    thr = (LORA_LR_HIGH_BIG if (size and size >= 13) else LORA_LR_HIGH) if (lora or freeze) else FULL_LR_HIGH
    if lr <= thr:
        return []
    sev = "error" if lr > 4 * thr else "warning"
    kind = "LoRA" if lora else "freeze tuning" if freeze else "full fine-tuning"
    sz = f" on a {size:g}B model" if size else ""
    return [
        Hit(
            sev,
            f"learning_rate={lr:g} is above {thr:g} for {kind}{sz} ({4 * thr:g} is the error line): "
            f"expect loss spikes and forgetting",
            {"value": lr, "threshold": thr, "model_billions": size, **c.cite("learning_rate", "finetuning")},
        )
    ]


# ---------------------------------------------------------------------- C03
@check("C03", requires=("config",), reads=("data",), severity="error", rank=50)
def too_many_epochs(ctx: AuditContext) -> list[Hit]:
    """Too many epochs for the data size.

    Rule: epochs > 3 warns; >= 5 epochs with fewer than 2,000 rows errors (12 x 400 fires); epochs implied by max_steps
    count

    Fix: train 1-3 epochs, and stop at the best eval loss

    Source: Unsloth guide ('more than 3 generally not optimal'); fast.ai/W&B 'Can LLMs learn from a single example?'
    """
    c = ctx.config
    _require_possible(ctx, "num_epochs", "micro_batch_size", "gradient_accumulation_steps", "total_batch_size")
    epochs, src = c.num_epochs, c.source("num_epochs")
    eb = c.effective_batch()
    if c.max_steps and ctx.examples is not None and eb:
        epochs = c.max_steps * eb / ctx.n
        src = f"max_steps={c.max_steps} x batch {eb} / {ctx.n} rows ({c.source('max_steps')})"
    if epochs is None:
        raise NotApplicable("epochs unknown")
    if epochs <= 3:
        return []
    n = ctx.n if ctx.examples is not None else None
    sev = "error" if (epochs >= 5 and n is not None and n < 2000) else "warning"
    size = f" over {n} rows" if n is not None else " (row count unknown: pass --data)"
    return [
        Hit(
            sev,
            f"{epochs:g} epochs{size} ({src}): past 3 epochs small sets are memorised "
            f"(thresholds: > 3 warns, >= 5 with < 2,000 rows errors)",
            {"value": round(epochs, 3), "threshold": 3, "n_rows": n, "from": src},
        )
    ]


# ---------------------------------------------------------------------- C04
@check("C04", requires=("config", "data"), severity="error", rank=50)
def step_budget(ctx: AuditContext) -> list[Hit]:
    """Step budget too small or mis-set.

    Rule: effective batch > rows (error); total optimiser steps < 30 (warning); max_steps > 0 silently overrides
    num_train_epochs (info), and max_steps x effective batch < rows ends the run inside its first epoch, so some
    rows were never trained (warning, with their ids where the run's sampler is reproduced: an HF Trainer or TRL SFT
    run's seeded random sampler; not judged for packed runs, whose steps hold several rows each); for a torchtune
    run, the rows its recipe never stepped on (warning, named: drop_last drops the same last rows every epoch when
    shuffle is off; max_steps_per_epoch; the last epoch's unstepped micro-batches); for a LLaMA-Factory run, the rows
    past max_samples (warning, named: it trains each dataset's first N); one device assumed

    Fix: lower the batch / gradient accumulation, or train more steps; remove max_steps to train by epochs

    Source: tf TrainingArguments (max_steps overrides num_train_epochs); accelerate SeedableRandomSampler (epoch e
    reads randperm(n) seeded data_seed or seed, + e), tests/audit/test_hf_order.py (transformers' Trainer and TRL's
    SFTTrainer read exactly those rows); torchtune lora_finetune_single_device (StatefulDistributedSampler seed 0,
    DataLoader drop_last=True), LLaMA-Factory data/loader.py (max_samples: dataset.select(range(N))),
    tests/data/test_framework_visits.py (both, against their own training loops); heuristic step floor
    """
    c = ctx.config
    _require_possible(ctx, "num_epochs", "micro_batch_size", "gradient_accumulation_steps", "total_batch_size")
    eb = c.effective_batch()
    if not eb:
        raise NotApplicable("batch size unknown")
    hits = []
    cite = c.cite("micro_batch_size", "gradient_accumulation_steps", "num_epochs", "max_steps")
    if eb > ctx.n:
        hits.append(
            Hit(
                "error",
                f"the effective batch ({eb} = micro batch x grad accumulation, 1 device) is larger "
                f"than the {ctx.n} training rows: every step sees the whole set",
                {"value": eb, "threshold": ctx.n, **cite},
            )
        )
    steps, how = total_steps(ctx)
    if steps is not None and steps < 30:
        hits.append(
            Hit(
                "warning",
                f"only {steps} optimiser steps ({how}): too few for the schedule and warmup to "
                f"mean anything (threshold 30)",
                {"value": steps, "threshold": 30, "how": how, **cite},
            )
        )
    if c.trainer == "torchtune":
        hits += _torchtune_never_trained(ctx, cite)
    given = trained_rows(c, ctx.n)  # LLaMA-Factory's max_samples keeps the first rows
    if given < ctx.n:
        ids = [e.id for e in ctx.examples[given:]]
        hits.append(
            Hit(
                "warning",
                f"max_samples={c.max_samples} keeps the dataset's first {given} rows: the other {len(ids)} of "
                f"{ctx.n} were never trained (LLaMA-Factory cuts each dataset before training). gradian attribute "
                "scores them 0",
                {"value": given, "threshold": ctx.n, "never_trained": len(ids), **c.cite("max_samples")},
                row_ids=ids,
                fix=f"remove max_samples to train every row, or pass only the first {given} rows as --data",
            )
        )
    implied = c.max_steps * eb / given if c.max_steps and c.max_steps > 0 else None
    if implied is not None and implied < 1 and not (c.packing or c.padding_free):
        hit = _never_trained(ctx, eb, implied, cite)
        hits += [hit] if hit is not None else []
    elif implied is not None and c.num_epochs and not c.is_default("num_epochs"):
        if abs(implied - c.num_epochs) / c.num_epochs > 0.25:
            hits.append(
                Hit(
                    "info",
                    f"max_steps={c.max_steps} overrides num_epochs={c.num_epochs:g}: the run "
                    f"trains {implied:.2f} epochs",
                    {"value": round(implied, 3), "threshold": c.num_epochs, **cite},
                )
            )
    return hits


def _never_trained(ctx: AuditContext, eb: int, implied: float, cite: dict) -> Hit | None:
    """C04's warning for a ``max_steps`` that ends the run inside its first epoch on one device: how many rows it
    never trained, and which, where the trainer's sampler is reproduced (:mod:`gradian.audit.hf_order`). None when
    the run's log shows several devices that read every row.
    """
    from gradian.audit.hf_order import devices_from_state, given_rows, order_rule, rows_read

    c = ctx.config
    rows, built = given_rows(c, ctx.n, *_token_facts(ctx))
    given = len(rows) if rows is not None else trained_rows(c, ctx.n)  # the rows the sampler drew from
    seed, how = order_rule(c, ctx.versions)
    if seed is not None and rows is None:  # axolotl's train set cannot be rebuilt: its sampler names nothing
        seed, how = None, built
    world, devices = 1, "1 device assumed"
    state = ctx.logs.state if ctx.logs is not None else {}
    if seed is not None and state.get("global_step") and state.get("epoch") is not None:
        fits, why = devices_from_state(c, given, int(state["global_step"]), float(state["epoch"]), "the log")
        if len(fits) != 1:  # other rows, or a device count the log cannot tell: the order would name the wrong rows
            seed, how = None, why
        elif fits[0] > 1:
            world, devices = fits[0], f"{why}, read from the log"
    seen = c.max_steps * eb * world
    ids, which = [], f"which ones, its shuffle decided ({how})"
    if seed is not None and rows is not None:
        read = rows_read(
            given, seed=seed, batch=c.micro_batch_size, accumulation=c.gradient_accumulation_steps or 1,
            steps=c.max_steps, drop_last=bool(c.dataloader_drop_last), world=world,
        )  # fmt: skip
        trained = {rows[k] for step in read for k in step}
        ids = [ctx.examples[j].id for j in sorted(set(rows) - trained)]
        built = f"; {built}" if built else ""
        which = f"the HF Trainer's sampler, {how}{built}, names them, if it was given the rows in this file's order"
    unseen = len(ids) if seed is not None else max(0, given - seen)
    if world > 1 and not unseen:
        return None
    after = (
        "gradian attribute scores them 0 (--visits auto: their influence on the run is none)"
        if seed is not None
        else "Their attribution scores say what they would have done, not what they did"
    )
    batch = f"the effective batch {eb}" + (f" on {world} devices" if world > 1 else "")
    return Hit(
        "warning",
        f"max_steps={c.max_steps} x {batch} covers {min(seen, given)} of the {given} training rows: the run "
        f"stopped {min(implied * world, 1.0):.0%} into its first epoch, so {unseen} rows ({unseen / given:.0%}) were "
        f"never trained ({which}; {devices}). {after}",
        {"value": seen, "threshold": given, "never_trained": unseen, "order": how if seed is not None else None,
         "devices": world, **cite},
        row_ids=ids,
        fix=f"set max_steps to at least {-(-given // (eb * world))} (one epoch at this batch), or remove it to train "
        "by epochs",
    )  # fmt: skip


def _token_facts(ctx: AuditContext) -> tuple[list[int] | None, list[bool] | None]:
    """``(lengths, unsupervised)``: each training row's token count as the run's tokenisation builds it, before any
    cut, and whether its ``max_length`` cut (keeping the start) leaves it no supervised token; ``(None, None)``
    without a tokenizer or when a row did not render. The train set a trainer built from them (axolotl's length
    filter, TRL's drop of fully masked rows) is :func:`gradian.audit.hf_order.given_rows`.
    """
    if ctx.tokenizer is None or any(tr.tx is None for tr in ctx.token_rows):
        return None, None
    c = ctx.config
    lengths = [tr.tx.full_length for tr in ctx.token_rows]
    if (c.truncation or "keep_start").lower() == "keep_end":
        return lengths, None
    limit = c.max_length if c.max_length is not None else float("inf")
    return lengths, [tr.first_sup >= min(limit, len(tr.tx.input_ids)) for tr in ctx.token_rows]


def _torchtune_never_trained(ctx: AuditContext, cite: dict) -> list[Hit]:
    """C04's warning for the rows torchtune's recipe never stepped on, named
    (:func:`gradian.audit.hf_order.torchtune_rows_read`: its DataLoader drops each epoch's last incomplete batch, the
    same rows every epoch with ``shuffle: false``; ``max_steps_per_epoch`` stops an epoch early; the last epoch's
    unstepped micro-batches).
    """
    from gradian.audit.hf_order import torchtune_order_rule, torchtune_rows_read

    c = ctx.config
    if torchtune_order_rule(c) is not None:
        return []
    read = torchtune_rows_read(
        ctx.n, shuffle=bool(c.shuffle), batch=c.micro_batch_size, accumulation=c.gradient_accumulation_steps or 1,
        epochs=int(math.ceil(c.num_epochs)), max_steps_per_epoch=c.max_steps_per_epoch,
    )  # fmt: skip
    trained = {r for step in read for r in step}
    ids = [e.id for k, e in enumerate(ctx.examples) if k not in trained]
    if not ids:
        return []
    why = (
        f"its DataLoader drops each epoch's last {ctx.n % c.micro_batch_size} row(s) (drop_last) and shuffle is off, "
        "so they are the same rows every epoch"
        if not c.shuffle and ctx.n % c.micro_batch_size
        else f"its seed-0 shuffle, drop_last, max_steps_per_epoch ({c.max_steps_per_epoch}) and the last epoch's "
        "unstepped micro-batches left them out"
    )
    return [
        Hit(
            "warning",
            f"torchtune's recipe never trained {len(ids)} of the {ctx.n} rows ({why}; 1 device assumed). "
            "gradian attribute scores them 0",
            {
                "value": ctx.n - len(ids),
                "threshold": ctx.n,
                "never_trained": len(ids),
                "order": "torchtune's recipe sampler, seed 0",
                **cite,
                **c.cite("shuffle", "max_steps_per_epoch"),
            },
            row_ids=ids,
            fix="set shuffle: true, or make the rows a multiple of batch_size (x gradient_accumulation_steps)",
        )
    ]


# ---------------------------------------------------------------------- C05
@check("C05", requires=("config",), reads=("data",), severity="error", rank=50)
def warmup(ctx: AuditContext) -> list[Hit]:
    """Warmup longer than sensible.

    Rule: warmup steps >= total steps (error); warmup ratio > 0.2 (warning); warmup_steps and warmup_ratio both set
    (warning: axolotl refuses, transformers uses the steps)

    Fix: warm up for 3-10% of the steps, with one of warmup_steps / warmup_ratio

    Source: axolotl validation.py check_warmup; tf TrainingArguments
    """
    c = ctx.config
    _require_possible(
        ctx,
        "warmup_steps",
        "warmup_ratio",
        "num_epochs",
        "micro_batch_size",
        "gradient_accumulation_steps",
        "total_batch_size",
    )
    hits = []
    ws, wr = c.warmup_steps or 0, c.warmup_ratio or 0
    cite = c.cite("warmup_steps", "warmup_ratio")
    if ws > 0 and wr > 0 and not c.is_default("warmup_steps") and not c.is_default("warmup_ratio"):
        hits.append(
            Hit(
                "warning",
                f"both warmup_steps={ws:g} and warmup_ratio={wr:g} are set: axolotl refuses this, "
                f"transformers silently uses warmup_steps",
                {"value": [ws, wr], "threshold": "one", **cite},
            )
        )
    if wr > 0.2:
        hits.append(
            Hit(
                "warning",
                f"warmup_ratio={wr:g} is above 0.2: a fifth of the run at a reduced learning rate",
                {"value": wr, "threshold": 0.2, **cite},
            )
        )
    steps, how = total_steps(ctx)
    if steps is not None and ws > 0 and ws >= steps:
        hits.append(
            Hit(
                "error",
                f"warmup_steps={ws:g} >= the run's {steps} steps ({how}): the learning rate never reaches its peak",
                {"value": ws, "threshold": steps, **cite},
            )
        )
    return hits


# ---------------------------------------------------------------------- C06
@check("C06", requires=("config",), reads=("data", "tokenizer"), severity="warning", rank=20)
def max_len_default(ctx: AuditContext) -> list[Hit]:
    """max_length left at the trainer's default.

    Rule: max_length unset, so the trainer's default applies (TRL 1024, axolotl 512, LLaMA-Factory 2048): info; a
    warning when the data's p95 length (with a tokenizer) exceeds it

    Fix: set max_length explicitly, at or above the data's p99 length

    Source: trl v0.12 'default to 1024' warning; axolotl config.py; LLaMA-Factory data_args.py
    """
    c = ctx.config
    if not c.is_default("max_length"):
        return []
    L = c.max_length
    ev = {"value": L, "threshold": "set explicitly", **c.cite("max_length")}
    if ctx.examples is not None and ctx.tokenizer is not None:
        lens = sorted(tr.tx.full_length for tr in ctx.token_rows if tr.tx is not None)
        if lens:
            p95 = lens[min(len(lens) - 1, int(0.95 * len(lens)))]
            ev["data_p95"] = p95
            if p95 > L:
                return [
                    Hit(
                        "warning",
                        f"max_length is unset, so {c.source('max_length')} = {L} applies, and the "
                        f"data's p95 length is {p95} tokens",
                        ev,
                    )
                ]
    return [Hit("info", f"max_length is unset, so {c.source('max_length')} = {L} applies", ev)]
