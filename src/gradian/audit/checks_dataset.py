"""Checks that read the rows themselves (train, and eval where given); no tokenizer needed.

Each finding lists the affected training example ids in ``row_ids`` (and eval ids in
``eval_row_ids``), and its evidence holds the measured value against the threshold.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Iterable

from gradian.audit import text as T
from gradian.audit.context import AuditContext
from gradian.audit.registry import Hit, NotApplicable, check


def ids(ctx: AuditContext, idxs) -> list[str]:
    """The ids of the training rows at indices ``idxs`` (sorted, each once)."""
    ex = ctx.examples or []
    return [ex[i].id for i in sorted(set(idxs))]


def eval_ids(ctx: AuditContext, idxs) -> list[str]:
    """The ids of the eval rows at indices ``idxs`` (sorted, each once)."""
    ex = ctx.eval_examples or []
    return [ex[i].id for i in sorted(set(idxs))]


def rate_hit(
    ctx: AuditContext, rows, severity: str, message: str, rate: float, threshold: float, more: dict | None = None
) -> list[Hit]:
    """The one finding of a rate rule: evidence ``{"value": round(rate, 4), "threshold": threshold, **more}``,
    on the training rows at indices ``rows``.
    """
    return [
        Hit(
            severity, message, {"value": round(rate, 4), "threshold": threshold, **(more or {})}, row_ids=ids(ctx, rows)
        )
    ]


def count_hits(
    ctx: AuditContext, rows, severity: str, says: str, more: dict | None = None, fix: str | None = None
) -> list[Hit]:
    """The finding of a count rule (any affected row counts), on the training rows at indices ``rows``: none when
    ``rows`` is empty, else one with the message ``f"{pct(len(rows), n)} {says}"`` and the evidence
    ``{"value": len(rows), "threshold": 0, **more}``.
    """
    if not rows:
        return []
    evidence = {"value": len(rows), "threshold": 0, **(more or {})}
    return [Hit(severity, f"{pct(len(rows), ctx.n)} {says}", evidence, row_ids=ids(ctx, rows), fix=fix)]


def warn_above_hit(
    ctx: AuditContext, rows, message: str, rate: float, threshold: float, more: dict | None = None
) -> list[Hit]:
    """The finding of a rate rule that warns above ``threshold`` and is info at or below it, on the training rows
    at indices ``rows`` (evidence as :func:`rate_hit`'s).
    """
    return rate_hit(ctx, rows, "warning" if rate > threshold else "info", message, rate, threshold, more)


def share_hit(ctx: AuditContext, rows, message: str, threshold: float, more: dict | None = None) -> list[Hit]:
    """The finding of a share rule, on the training rows at indices ``rows``: ``rate = len(rows) / n``, a warning
    above ``threshold``, info at or below it (evidence as :func:`rate_hit`'s).
    """
    return warn_above_hit(ctx, rows, message, len(rows) / ctx.n, threshold, more)


def largest_first(groups: list[list[int]]) -> list[int]:
    """Sort ``groups`` (lists of row indices, each sorted) in place, largest first and then by first row; return
    their rows in that order.
    """
    groups.sort(key=lambda g: (-len(g), g[0]))
    return [i for g in groups for i in g]


def duplicate_groups(keys) -> list[list[int]]:
    """The indices of equal ``keys``, one group per key that occurs more than once (groups in the order their key
    first occurs, each group's indices in order).
    """
    groups: dict[Any, list[int]] = defaultdict(list)
    for i, k in enumerate(keys):
        groups[k].append(i)
    return [g for g in groups.values() if len(g) > 1]


def pct(k: int, n: int) -> str:
    """``k of n rows (p%)``, for messages."""
    return f"{k} of {n} rows ({100.0 * k / max(n, 1):.1f}%)"


def _schema(ex) -> str:
    if ex.format == "prompt_completion":
        return "prompt_completion (chat)" if ex.is_chat else "prompt_completion (text)"
    return ex.format


# ---------------------------------------------------------------------- D01
@check("D01", requires=("data",), severity="error", rank=10)
def format_mixed(ctx: AuditContext) -> list[Hit]:
    """Rows mix dataset schemas.

    Rule: rows whose schema (messages / prompt+completion / alpaca / text) differs from the majority: any warns; error
    when row 0 is in the minority (TRL picks the loss mode from the first row only)

    Fix: normalise every row to one schema (e.g. all messages, or all prompt/completion)

    Source: trl sft_trainer.py decides the dataset type from next(iter(train_dataset))
    """
    schemas = [_schema(e) for e in ctx.examples]
    counts = Counter(schemas)
    if len(counts) < 2:
        return []
    major = max(sorted(counts), key=lambda k: counts[k])
    minority = [i for i, s in enumerate(schemas) if s != major]
    first_minor = schemas[0] != major
    sev = "error" if first_minor else "warning"
    msg = f"use a schema other than the majority {major!r} (counts: {dict(sorted(counts.items()))})"
    if first_minor:
        msg += f"; row 0 is {schemas[0]!r}, and TRL sets the loss mode for the whole dataset from the first row"
    return count_hits(
        ctx, minority, sev, msg, {"counts": dict(counts), "majority": major, "first_row_schema": schemas[0]}
    )


# ---------------------------------------------------------------------- D02
@check("D02", requires=("data", "config"), severity="error", rank=10, stages=("sft", "pretraining"))
def text_field_missing(ctx: AuditContext) -> list[Hit]:
    """The trainer's text/messages field is missing from rows.

    Rule: TRL: language-modeling rows (not messages, not prompt/completion) lack dataset_text_field (default 'text');
    axolotl: rows lack the field its datasets[].type reads (field_messages, field, instruction/output); any

    Fix: rename the field in the data, or set dataset_text_field / field_messages to the field the rows have

    Source: trl sft_config.py dataset_text_field; axolotl datasets[].field_messages
    """
    c = ctx.config
    if c.trainer == "trl":
        field = c.dataset_text_field or "text"
        bad = [
            i
            for i, e in enumerate(ctx.examples)
            if e.format not in ("messages", "prompt_completion") and field not in e.raw
        ]
        fmts = Counter(ctx.examples[i].format for i in bad)
        return count_hits(
            ctx,
            bad,
            "error",
            f"have no {field!r} field, and TRL reads language-modeling rows "
            f"from dataset_text_field={field!r} ({c.source('dataset_text_field')}); their formats: "
            f"{dict(fmts)}",
            {
                "field": field,
                "from": c.source("dataset_text_field"),
                "formats": dict(fmts),
            },
            fix="convert the rows to prompt/completion or messages (TRL does not read alpaca fields), or "
            "set dataset_text_field to the field that holds the text",
        )
    if c.trainer == "axolotl" and c.datasets:
        entry = None
        if len(c.datasets) == 1:
            entry = c.datasets[0]
        elif ctx.data_path:
            stem = Path(ctx.data_path).name
            entry = next((d for d in c.datasets if d.get("path") and Path(str(d["path"])).name == stem), None)
        if entry is None:
            raise NotApplicable("cannot tell which axolotl datasets[] entry is the given data file")
        typ = (entry.get("type") or "").split(".")[0].lower()
        if typ in ("chat_template", "sharegpt"):
            need = [entry.get("field_messages") or ("messages" if typ == "chat_template" else "conversations")]
        elif typ == "completion":
            need = [entry.get("field") or "text"]
        elif typ.startswith("alpaca"):
            need = ["instruction", "output"]
        elif typ == "input_output":
            need = ["segments"]
        else:
            raise NotApplicable(f"axolotl dataset type {typ or '(custom)'!r} has no known field layout")
        bad = [i for i, e in enumerate(ctx.examples) if any(k not in e.raw for k in need)]
        if not bad:
            return []
        where = f"datasets[{entry['index']}]"
        return count_hits(
            ctx,
            bad,
            "error",
            f"lack the field(s) {need} that axolotl's {where}.type={typ!r} reads",
            {
                "fields": need,
                "type": typ,
                "from": f"{Path(c.paths[0]).name}: {where}",
            },
            fix=f"set {where}.field_messages (or field) to the field the rows use, or rename it in the data",
        )
    raise NotApplicable(f"the trainer ({c.trainer or 'unknown'}) does not read a configurable text field")


# ---------------------------------------------------------------------- D03
@check("D03", requires=("data",), severity="error", rank=10)
def empty_target(ctx: AuditContext) -> list[Hit]:
    """Empty or whitespace-only targets.

    Rule: the completion / output / final assistant turn is empty or whitespace; any

    Fix: drop these rows or fill in their targets

    Source: axolotl utils/trainer.py drops 'samples with no trainable tokens'; trl PR #6320
    """
    bad = [i for i, c in enumerate(ctx.completion_texts) if not c.strip()]
    return count_hits(
        ctx,
        bad,
        "error",
        "have an empty target: they train nothing, or teach the model to answer with nothing",
    )


# ---------------------------------------------------------------------- D09
KNOWN_ROLES = {"system", "user", "assistant", "tool", "function", "ipython", "developer"}


_SHAREGPT_ROLES = {"human": "user", "gpt": "assistant"}


def _raw_roles(raw: dict) -> list[str] | None:
    msgs = raw.get("messages", raw.get("conversations"))
    if not isinstance(msgs, list):
        if isinstance(raw.get("prompt"), list) and isinstance(raw.get("completion"), list):
            msgs = raw["prompt"] + raw["completion"]
        else:
            return None
    roles = []
    for m in msgs:
        if not isinstance(m, dict):
            return None
        r = m.get("role", m.get("from"))
        roles.append(_SHAREGPT_ROLES.get(r, str(r)))
    return roles


def role_problems(roles: list[str]) -> list[str]:
    """What is wrong with a conversation's role sequence (unknown roles, system not first, ...); empty when nothing."""
    probs = []
    unknown = sorted({r for r in roles if r not in KNOWN_ROLES})
    if unknown:
        probs.append(f"unknown role(s) {unknown}")
    for k, r in enumerate(roles):
        if r == "system" and k > 0:
            probs.append(f"system turn at position {k}")
            break
    conv = [r for r in roles if r in ("user", "assistant")]
    if conv and conv[0] != "user":
        probs.append("first turn after the system prompt is not from the user")
    for a, b in zip(conv, conv[1:]):
        if a == b:
            probs.append(f"two {a} turns in a row")
            break
    if roles and roles[-1] != "assistant":
        probs.append(f"last turn is {roles[-1]!r}, not the assistant (it is dropped from training)")
    return probs


@check("D09", requires=("data",), severity="error", rank=10)
def role_order(ctx: AuditContext) -> list[Hit]:
    """Chat roles unknown or out of order.

    Rule: unknown role, system turn not first, first turn not the user, two user/assistant turns in a row, or last turn
    not the assistant; any

    Fix: remap roles to system/user/assistant, merge consecutive turns, and end each conversation with the assistant

    Source: templates that raise 'Conversation roles must alternate' (tf#34494); FastChat filter_sharegpt.py
    """
    bad: list[int] = []
    kinds: Counter = Counter()
    examples: dict[str, str] = {}
    chat_rows = 0
    for i, e in enumerate(ctx.examples):
        roles = _raw_roles(e.raw)
        if roles is None:
            continue
        chat_rows += 1
        probs = role_problems(roles)
        if probs:
            bad.append(i)
            for p in probs:
                key = p.split(" at position")[0].split(" [")[0]
                kinds[key] += 1
                examples.setdefault(key, e.id)
    if chat_rows == 0:
        raise NotApplicable("no chat (messages) rows")
    return count_hits(
        ctx,
        bad,
        "error",
        "have chat roles a template rejects or silently drops: "
        + "; ".join(f"{k} ({v})" for k, v in kinds.most_common()),
        {"problems": dict(kinds), "first_example": examples},
    )


# ---------------------------------------------------------------------- D11
@check("D11", requires=("data",), reads=("config",), severity="warning", rank=40)
def dup_exact(ctx: AuditContext) -> list[Hit]:
    """Exact duplicate rows.

    Rule: rows identical after NFC, casefold and whitespace normalisation; extra copies > 1% of rows warns, any is info.
    With axolotl's dataset_exact_deduplication on, byte-identical copies are dropped by the trainer and not counted;
    copies that differ in case or whitespace survive it and still count

    Fix: deduplicate (axolotl: dataset_exact_deduplication: true), or keep the copies only if the upweighting is
    intended

    Source: axolotl dataset_exact_deduplication (sha256 of each prepared row); cleanlab Datalab near_duplicate
    """
    dups = duplicate_groups(ctx.norm_row)
    c = ctx.config
    dedup = bool(c is not None and c.dedup_exact)
    if dedup:
        # the trainer keeps one of each byte-identical set: count what survives its exact deduplication
        kept = []
        for g in dups:
            first_of: dict[tuple[str, str], int] = {}
            for i in g:
                e = ctx.examples[i]
                first_of.setdefault((e.prompt_text, e.completion_text), i)
            if len(first_of) > 1:
                kept.append(sorted(first_of.values()))
        dups = kept
    if not dups:
        return []
    extra = sum(len(g) - 1 for g in dups)
    rate = extra / ctx.n
    sev = "warning" if rate > 0.01 else "info"
    members = largest_first(dups)
    ev = {
        "value": round(rate, 4),
        "threshold": 0.01,
        "n_extra_copies": extra,
        "n_groups": len(dups),
        "groups": [ids(ctx, g) for g in dups[:20]],
    }
    if dedup:
        ev.update(c.cite("dedup_exact"))
        return [
            Hit(
                sev,
                f"{extra} extra copies in {len(dups)} groups of rows that differ only in case or whitespace "
                f"({100 * rate:.1f}% of rows; threshold 1%): dataset_exact_deduplication "
                f"({c.source('dedup_exact')}) drops byte-identical copies only, so these survive it",
                ev,
                row_ids=ids(ctx, members),
                fix="normalise case and whitespace before training (then the exact deduplication removes them), "
                "or drop the copies",
            )
        ]
    return [
        Hit(
            sev,
            f"{extra} extra copies in {len(dups)} groups of identical rows ({100 * rate:.1f}% of rows; "
            f"threshold 1%); the largest group has {len(dups[0])} copies",
            ev,
            row_ids=ids(ctx, members),
        )
    ]


# ---------------------------------------------------------------------- D12
def near_dup_pairs(ctx: AuditContext, threshold: float = 0.8) -> list[tuple[int, int, float]]:
    """Training row pairs ``(i, j, jaccard)``, i < j, whose word 5-gram sets have Jaccard >= ``threshold`` (exact
    copies excluded); MinHash/LSH candidates verified exactly, computed once per context (D12 and D15 share them).
    """
    key = f"near_dup_pairs:{threshold}"
    if key not in ctx.memo:
        ctx.memo[key] = _near_dup_pairs(ctx, threshold)
    return ctx.memo[key]


def _near_dup_pairs(ctx: AuditContext, threshold: float) -> list[tuple[int, int, float]]:
    sig = ctx.signatures
    valid = [len(s) > 0 for s in ctx.shingles5]
    cands = T.lsh_candidates(sig, bands=16, valid=valid)
    sets: dict[int, set] = {}

    def s(i: int) -> set:
        if i not in sets:
            sets[i] = set(ctx.shingles5[i].tolist())
        return sets[i]

    out = []
    for a, b in sorted(cands):
        if ctx.norm_row[a] == ctx.norm_row[b]:
            continue
        j = T.jaccard(s(a), s(b))
        if j >= threshold:
            out.append((a, b, j))
    return out


def group_roots(n: int, pairs: Iterable[tuple]) -> list[int]:
    """Union-find over the rows ``0..n-1``: each row's group, named by its smallest row, once the rows ``a`` and
    ``b`` of every pair ``(a, b, ...)`` of ``pairs`` are joined (in any order: the groups are the same).
    """
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b, *_ in pairs:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return [find(x) for x in range(n)]


def _clusters(pairs, n) -> list[list[int]]:
    root = group_roots(n, pairs)
    groups: dict[int, list[int]] = defaultdict(list)
    for a, b, _ in pairs:
        for x in (a, b):
            groups[root[x]].append(x)
    return [sorted(set(g)) for g in groups.values()]


@check("D12", requires=("data",), severity="warning", rank=40)
def dup_near(ctx: AuditContext) -> list[Hit]:
    """Near-duplicate rows.

    Rule: MinHash over word 5-gram shingles, verified by exact Jaccard >= 0.8 (exact copies excluded); rows beyond the
    first in each cluster > 5% warns, any is info

    Fix: deduplicate near-copies (keep one per cluster) unless the variation is the point

    Source: NeMo Curator fuzzy deduplication (Jaccard 0.8)
    """
    pairs = near_dup_pairs(ctx)
    if not pairs:
        return []
    clusters = _clusters(pairs, ctx.n)
    extra = sum(len(c) - 1 for c in clusters)
    rate = extra / ctx.n
    rows = largest_first(clusters)
    return warn_above_hit(
        ctx,
        rows,
        f"{len(clusters)} clusters of near-duplicate rows (Jaccard >= 0.8); {extra} rows beyond the "
        f"first of each = {100 * rate:.1f}% of rows (threshold 5%)",
        rate,
        0.05,
        {
            "jaccard_min": 0.8,
            "n_clusters": len(clusters),
            "clusters": [ids(ctx, c) for c in clusters[:20]],
            "pairs": [[ctx.examples[a].id, ctx.examples[b].id, round(j, 3)] for a, b, j in pairs[:20]],
        },
    )


# ---------------------------------------------------------------------- D13
@check("D13", requires=("data",), severity="warning", rank=40)
def conflicting_targets(ctx: AuditContext) -> list[Hit]:
    """One prompt, different targets.

    Rule: the same normalised prompt appears with two or more different targets; > 1% of distinct prompts warns, any is
    info (**H**)

    Fix: reconcile the targets (keep the correct one), or make the prompts say what differs

    Source: cleanlab label issues (analogue, heuristic)
    """
    by_prompt: dict[str, list[int]] = defaultdict(list)
    for i, (e, p) in enumerate(zip(ctx.examples, ctx.norm_prompt)):
        if e.format != "text" and p:
            by_prompt[p].append(i)
    if not by_prompt:
        raise NotApplicable("no rows with a prompt")
    conflicts = [g for g in by_prompt.values() if len({ctx.norm_completion[i] for i in g}) > 1]
    if not conflicts:
        return []
    rate = len(conflicts) / len(by_prompt)
    rows = largest_first(conflicts)
    return warn_above_hit(
        ctx,
        rows,
        f"{len(conflicts)} of {len(by_prompt)} distinct prompts ({100 * rate:.1f}%; threshold 1%) have "
        f"conflicting targets across {sum(map(len, conflicts))} rows",
        rate,
        0.01,
        {
            "n_prompts": len(conflicts),
            "groups": [ids(ctx, g) for g in conflicts[:20]],
        },
    )
