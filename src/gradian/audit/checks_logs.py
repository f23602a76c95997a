"""Checks that read the trainer's logged history (``trainer_state.json`` or JSONL).

Findings carry the logged ``steps`` they point at. These are symptoms; they
rank after the data and config causes that usually explain them.
"""

from __future__ import annotations

import math
import statistics

from gradian.audit.context import AuditContext
from gradian.audit.logs import is_finite
from gradian.audit.registry import Hit, NotApplicable, check


def _finite(series):
    return [p for p in series if is_finite(p.value)]


def _logged(ctx: AuditContext, key: str, at_least: int, reason: str) -> list:
    """The finite train-log points of ``key``; NotApplicable (``reason``, ``{n}`` = how many) if fewer than
    ``at_least``.
    """
    pts = _finite(ctx.logs.series(key))
    if len(pts) < at_least:
        raise NotApplicable(reason.format(n=len(pts)))
    return pts


def _warmup_end(ctx: AuditContext) -> int:
    """Last warmup step: from the config, else 10% of the logged steps."""
    log = ctx.logs
    last = log.global_step or (log.train[-1]["step"] if log.train else 0)
    c = ctx.config
    if c is not None:
        if c.warmup_steps:
            return int(c.warmup_steps)
        if c.warmup_ratio:
            total = log.state.get("max_steps") or last
            return int(math.ceil(c.warmup_ratio * total))
    return int(0.1 * last)


# ---------------------------------------------------------------------- L01
@check("L01", requires=("logs",), severity="error", rank=70)
def nan_inf(ctx: AuditContext) -> list[Hit]:
    """NaN or inf in the logs.

    Rule: any NaN/inf in loss, eval_loss, grad_norm or learning_rate

    Fix: use bf16 instead of fp16, lower the learning rate, clip gradients (max_grad_norm 1.0)

    Source: google/gemma_pytorch#24; tf#27809
    """
    log = ctx.logs
    bad: dict[str, list[int]] = {}
    for key, src in (("loss", "train"), ("grad_norm", "train"), ("learning_rate", "train"), ("eval_loss", "eval")):
        steps = [p.step for p in log.series(key, src) if not is_finite(p.value)]
        if steps:
            bad[key] = steps
    if not bad:
        return []
    first = min(s for v in bad.values() for s in v)
    allsteps = sorted({s for v in bad.values() for s in v})
    return [
        Hit(
            "error",
            f"non-finite values from step {first}: " + ", ".join(f"{k} at {len(v)} logs" for k, v in bad.items()),
            {"value": {k: len(v) for k, v in bad.items()}, "threshold": 0, "first_step": first},
            steps=allsteps,
        )
    ]


# ---------------------------------------------------------------------- L02
@check("L02", requires=("logs",), severity="error", rank=70)
def zero_loss(ctx: AuditContext) -> list[Hit]:
    """Loss collapsed to zero.

    Rule: train or eval loss <= 1e-4 on >= 2 consecutive logs

    Fix: check the loss mask (all labels -100?), padding and fp16 overflow

    Source: shibing624/MedicalGPT#252; trl PR #550
    """
    hits = []
    for key, src in (("loss", "train"), ("eval_loss", "eval")):
        pts = ctx.logs.series(key, src)
        run, best = [], []
        for p in pts:
            if is_finite(p.value) and p.value <= 1e-4:
                run.append(p.step)
                if len(run) > len(best):
                    best = list(run)
            else:
                run = []
        if len(best) >= 2:
            hits.append(
                Hit(
                    "error",
                    f"{key} is <= 1e-4 on {len(best)} consecutive logs from step {best[0]}: nothing "
                    f"is being learned (usually every label is masked)",
                    {"value": len(best), "threshold": 2, "key": key},
                    steps=best,
                )
            )
    return hits


# ---------------------------------------------------------------------- L03
@check("L03", requires=("logs",), reads=("config",), severity="warning", rank=70)
def loss_spike(ctx: AuditContext) -> list[Hit]:
    """Loss spikes after warmup.

    Rule: after warmup, train loss > 2x the median of the previous 10 logs: >= 3 consecutive such logs warn, isolated
    ones are info; info only under group_by_length (periodic swings)

    Fix: lower the learning rate, clip gradients, and inspect the batches at those steps

    Source: axolotl loss_watchdog_threshold (~2x start); group_by_length description
    """
    pts = _logged(ctx, "loss", 8, "only {n} finite train-loss logs (needs 8)")
    w = _warmup_end(ctx)
    flagged = []
    for k in range(5, len(pts)):
        if pts[k].step <= w:
            continue
        med = statistics.median(p.value for p in pts[max(0, k - 10) : k])
        if med > 0 and pts[k].value > 2 * med:
            flagged.append(k)
    if not flagged:
        return []
    runs, cur = [], [flagged[0]]
    for a, b in zip(flagged, flagged[1:]):
        if b == a + 1:
            cur.append(b)
        else:
            runs.append(cur)
            cur = [b]
    runs.append(cur)
    longest = max(runs, key=len)
    gbl = ctx.config is not None and ctx.config.group_by_length
    sev = "warning" if len(longest) >= 3 and not gbl else "info"
    steps = [pts[k].step for k in flagged]
    worst = max(flagged, key=lambda k: pts[k].value)
    return [
        Hit(
            sev,
            f"train loss exceeds 2x its rolling median at {len(flagged)} logs after warmup (step {w}); "
            f"longest run {len(longest)} logs from step {pts[longest[0]].step} (threshold 3); worst "
            f"{pts[worst].value:.3g} at step {pts[worst].step}" + (" (group_by_length is on)" if gbl else ""),
            {"value": len(longest), "threshold": 3, "ratio": 2, "warmup_end": w, "group_by_length": bool(gbl)},
            steps=steps,
        )
    ]


# ---------------------------------------------------------------------- L04
@check("L04", requires=("logs",), severity="warning", rank=70)
def grad_explosion(ctx: AuditContext) -> list[Hit]:
    """Gradient-norm explosions.

    Rule: grad_norm > 10x the running median of the previous logs (after 5), or > 100

    Fix: lower the learning rate and clip gradients (max_grad_norm 1.0)

    Source: google/gemma_pytorch#24
    """
    pts = _logged(ctx, "grad_norm", 1, "no grad_norm logged")
    flagged = []
    for k, p in enumerate(pts):
        prev = [q.value for q in pts[max(0, k - 20) : k]]
        med = statistics.median(prev) if len(prev) >= 5 else None
        if p.value > 100 or (med and med > 0 and p.value > 10 * med):
            flagged.append(p)
    if not flagged:
        return []
    worst = max(flagged, key=lambda p: p.value)
    return [
        Hit(
            "warning",
            f"grad_norm explodes at {len(flagged)} logs (> 10x its running median or > 100); worst "
            f"{worst.value:.3g} at step {worst.step}",
            {"value": worst.value, "threshold": 100, "ratio": 10},
            steps=[p.step for p in flagged],
        )
    ]


# ---------------------------------------------------------------------- L05
@check("L05", requires=("logs",), severity="warning", rank=70)
def overfit(ctx: AuditContext) -> list[Hit]:
    """Eval loss rising while train loss falls.

    Rule: after its minimum, eval_loss rises on >= 2 consecutive evals and ends >= 5% above the minimum, while train
    loss at the end is below train loss at the best step

    Fix: stop at the best step (load_best_model_at_end, early stopping), or train fewer epochs

    Source: fast.ai/W&B 'Can LLMs learn from a single example?'; Unsloth guide
    """
    ev = _finite(ctx.logs.series("eval_loss", "eval"))
    if len(ev) < 3:
        raise NotApplicable(f"only {len(ev)} eval_loss logs (needs 3)")
    kmin = min(range(len(ev)), key=lambda k: (ev[k].value, k))
    after = ev[kmin:]
    rises = max_run = 0
    for a, b in zip(after, after[1:]):
        rises = rises + 1 if b.value > a.value else 0
        max_run = max(max_run, rises)
    final, best = ev[-1].value, ev[kmin].value
    if max_run < 2 or final < 1.05 * best:
        return []
    tr = _finite(ctx.logs.series("loss"))

    def train_near(step):
        near = [p.value for p in tr if abs(p.step - step) <= max(1, 0.05 * (tr[-1].step if tr else 1))]
        return statistics.mean(near) if near else None

    t_best, t_end = train_near(ev[kmin].step), (statistics.mean(p.value for p in tr[-3:]) if tr else None)
    if t_best is not None and t_end is not None and t_end >= t_best:
        return []
    return [
        Hit(
            "warning",
            f"eval_loss bottoms at {best:.4g} (step {ev[kmin].step}) and ends at {final:.4g} "
            f"(+{100 * (final / best - 1):.1f}%, threshold 5%) while train loss keeps falling"
            + (f" ({t_best:.3g} -> {t_end:.3g})" if t_best is not None else ""),
            {
                "value": round(final / best - 1, 4),
                "threshold": 0.05,
                "best_step": ev[kmin].step,
                "best_eval_loss": best,
                "final_eval_loss": final,
            },
            steps=[p.step for p in after],
            fix=f"use the checkpoint at step {ev[kmin].step} (or enable load_best_model_at_end), and train fewer "
            f"epochs",
        )
    ]


# ---------------------------------------------------------------------- L06
@check("L06", requires=("logs",), severity="warning", rank=70)
def epoch_staircase(ctx: AuditContext) -> list[Hit]:
    """Train loss drops in steps at epoch boundaries.

    Rule: mean train loss in the first 5% of epoch k >= 2 is > 25% below the mean of the last logs of epoch k-1

    Fix: fewer epochs or a lower learning rate: the model is memorising rows it has seen

    Source: fast.ai/W&B report; arXiv 2410.10056
    """
    pts = [p for p in _finite(ctx.logs.series("loss")) if p.epoch is not None]
    if len(pts) < 8 or pts[-1].epoch < 1.02:
        raise NotApplicable("no epoch-tagged train logs beyond the first epoch")
    drops = []
    for k in range(1, int(math.floor(pts[-1].epoch)) + 1):
        # a log at epoch == k is the last step of epoch k (Trainer logs epoch = step / steps_per_epoch)
        pre = [p.value for p in pts if k - 0.1 < p.epoch <= k][-3:]
        post = [p for p in pts if k < p.epoch <= k + 0.05]
        if not post:
            first = next((p for p in pts if p.epoch > k), None)
            post = [first] if first is not None and first.epoch <= k + 0.1 else []
        if not pre or not post:
            continue
        a, b = statistics.mean(pre), statistics.mean(p.value for p in post)
        if a > 0 and 1 - b / a > 0.25:
            drops.append((k, a, b, post[0].step))
    if not drops:
        return []
    desc = "; ".join(f"epoch {k + 1}: {a:.3g} -> {b:.3g} (-{100 * (1 - b / a):.0f}%)" for k, a, b, _ in drops)
    worst = max(1 - b / a for _, a, b, _ in drops)
    return [
        Hit(
            "warning",
            f"train loss falls in a staircase at epoch starts ({desc}; threshold 25%): the model "
            f"recognises rows it has seen",
            {"value": round(worst, 4), "threshold": 0.25},
            steps=[s for *_, s in drops],
        )
    ]


# ---------------------------------------------------------------------- L07
@check("L07", requires=("logs",), severity="warning", rank=70)
def memorised(ctx: AuditContext) -> list[Hit]:
    """Training set memorised.

    Rule: final train loss < 0.2 or mean_token_accuracy > 0.97, with final eval_loss / train loss > 1.5 (warning);
    without eval logs, info (**H**)

    Fix: train less (fewer epochs, lower lr, smaller rank), or add data

    Source: heuristic
    """
    tr = _logged(ctx, "loss", 3, "fewer than 3 finite train-loss logs")
    t_end = statistics.mean(p.value for p in tr[-3:])
    acc = _finite(ctx.logs.series("mean_token_accuracy"))
    a_end = acc[-1].value if acc else None
    low = t_end < 0.2 or (a_end is not None and a_end > 0.97)
    if not low or t_end <= 1e-4:  # a collapsed loss is L02's
        return []
    ev = _finite(ctx.logs.series("eval_loss", "eval"))
    what = f"final train loss {t_end:.3g}" + (f", token accuracy {a_end:.3f}" if a_end is not None else "")
    if ev:
        ratio = ev[-1].value / t_end
        if ratio <= 1.5:
            return []
        return [
            Hit(
                "warning",
                f"{what} while eval loss is {ev[-1].value:.3g} ({ratio:.1f}x train; threshold 1.5x): "
                f"the training set is memorised",
                {"value": round(ratio, 3), "threshold": 1.5, "train_loss": t_end, "token_accuracy": a_end},
                steps=sorted({tr[-1].step, ev[-1].step}),
            )
        ]
    return [
        Hit(
            "info",
            f"{what} (threshold 0.2 / 0.97) and no eval loss was logged to tell memorising from learning",
            {"value": round(t_end, 4), "threshold": 0.2, "token_accuracy": a_end},
            steps=[tr[-1].step],
        )
    ]


# ---------------------------------------------------------------------- L08
@check("L08", requires=("logs",), severity="warning", rank=70)
def no_learning(ctx: AuditContext) -> list[Hit]:
    """Loss does not go down.

    Rule: mean loss over the last 10% of train logs >= 0.95x the first 10%, over >= 100 steps and >= 10 logs

    Fix: check the learning rate, the loss mask, and that the adapter's parameters are trainable

    Source: PEFT troubleshooting ('Training runs but the model does not improve')
    """
    tr = _finite(ctx.logs.series("loss"))
    if len(tr) < 10 or tr[-1].step - tr[0].step < 100:
        raise NotApplicable("fewer than 10 train logs or 100 steps")
    k = max(1, len(tr) // 10)
    first, last = statistics.mean(p.value for p in tr[:k]), statistics.mean(p.value for p in tr[-k:])
    if first <= 0 or last < 0.95 * first:
        return []
    return [
        Hit(
            "warning",
            f"train loss is flat: last-10% mean {last:.4g} vs first-10% mean {first:.4g} "
            f"({last / first:.3f}x; threshold 0.95x) over {tr[-1].step - tr[0].step} steps",
            {"value": round(last / first, 4), "threshold": 0.95},
            steps=[tr[0].step, tr[-1].step],
        )
    ]


# ---------------------------------------------------------------------- L09
@check("L09", requires=("logs",), reads=("config",), severity="warning", rank=70)
def loss_scale(ctx: AuditContext) -> list[Hit]:
    """Loss on the wrong scale.

    Rule: first logged train loss > 8 on a pretrained LM (**H**); with gradient accumulation G > 1 and first loss / G in
    a normal range, the loss was summed over micro-batches

    Fix: check that the tokenizer matches the model; upgrade transformers (>= 4.48 fixed the accumulated loss scale)

    Source: tf#37197, tf PR #35438, LF#7443
    """
    tr = _logged(ctx, "loss", 1, "no finite train loss logged")
    first = tr[0].value
    if first <= 8:
        return []
    ga = ctx.config.gradient_accumulation_steps if ctx.config is not None else None
    msg = f"the first logged loss is {first:.3g} (threshold 8): above a pretrained LM's usual 1-4"
    if ga and ga > 1 and 0.5 <= first / ga <= 4:
        msg += f"; /{ga} (gradient accumulation) gives {first / ga:.3g}, so the loss is summed, not averaged"
    else:
        msg += "; check that the tokenizer and chat template belong to the base model"
    return [
        Hit("warning", msg, {"value": first, "threshold": 8, "gradient_accumulation_steps": ga}, steps=[tr[0].step])
    ]


# ---------------------------------------------------------------------- L10
@check("L10", requires=("logs",), reads=("config",), severity="error", rank=70)
def lr_schedule(ctx: AuditContext) -> list[Hit]:
    """Learning-rate schedule off.

    Rule: logged lr stays <= 1e-8 (error); peak logged lr < 0.5x the configured lr (warning); on a finished
    linear/cosine run, the last lr > the schedule's value at that point + 5% of peak (warning)

    Fix: fix warmup and the scheduler (warmup shorter than the run, a decaying schedule)

    Source: shibing624/MedicalGPT#252 (lr stuck at 1.05e-07)
    """
    lr = _logged(ctx, "learning_rate", 3, "fewer than 3 learning_rate logs")
    peak = max(p.value for p in lr)
    steps = [p.step for p in lr]
    if peak <= 1e-8:
        return [
            Hit(
                "error",
                f"the learning rate never rises above {peak:.3g}: nothing is trained",
                {"value": peak, "threshold": 1e-8},
                steps=steps,
            )
        ]
    hits = []
    c = ctx.config
    if c is not None and c.learning_rate and not c.is_default("learning_rate") and peak < 0.5 * c.learning_rate:
        hits.append(
            Hit(
                "warning",
                f"the logged lr peaks at {peak:.3g}, under half the configured "
                f"{c.learning_rate:g} ({c.source('learning_rate')}): warmup longer than the run?",
                {"value": peak, "threshold": 0.5 * c.learning_rate},
                steps=steps,
            )
        )
    log = ctx.logs
    total = log.state.get("max_steps") or (c.max_steps if c is not None else None)
    sched = (c.lr_scheduler or "").lower() if c is not None else ""
    if total and sched in ("linear", "cosine") and (log.global_step or 0) >= total and lr[-1].step > 0:
        f = min(1.0, lr[-1].step / total)
        expected = peak * ((1 - f) if sched == "linear" else 0.5 * (1 + math.cos(math.pi * f)))
        if lr[-1].value > expected + 0.05 * peak:
            hits.append(
                Hit(
                    "warning",
                    f"the {sched} schedule should be near {expected:.3g} at step {lr[-1].step} of "
                    f"{total}, but the lr is {lr[-1].value:.3g} (peak {peak:.3g})",
                    {"value": lr[-1].value, "threshold": expected + 0.05 * peak},
                    steps=[lr[-1].step],
                )
            )
    return hits


# ---------------------------------------------------------------------- L11
@check("L11", requires=("logs",), reads=("config",), severity="warning", rank=70)
def incomplete(ctx: AuditContext) -> list[Hit]:
    """The run did not finish.

    Rule: trainer_state global_step < max_steps (warning); no final summary (train_runtime/train_loss) in the log of a
    run that did not reach max_steps or num_train_epochs (info)

    Fix: resume from the last checkpoint (resume_from_checkpoint) or check why it stopped

    Source: transformers TrainerState fields
    """
    log = ctx.logs
    gs = log.global_step
    ms = log.state.get("max_steps") or (ctx.config.max_steps if ctx.config is not None else None)
    hits = []
    if gs is not None and ms and gs < ms:
        hits.append(
            Hit(
                "warning",
                f"the log stops at step {gs} of {ms} ({100 * gs / ms:.0f}%)",
                {"value": gs, "threshold": ms},
                steps=[gs],
            )
        )
    if log.summary is None and not hits and not log.completed:
        hits.append(
            Hit(
                "info",
                "the log has no final summary (train_runtime / train_loss): a checkpoint's state, or "
                "a run that did not return from train()",
                {"value": None, "threshold": "summary"},
                steps=[gs] if gs is not None else [],
            )
        )
    return hits
