"""Checks that read the rows themselves (train, and eval where given); no tokenizer needed.

Each finding lists the affected training example ids in ``row_ids`` (and eval ids in
``eval_row_ids``), and its evidence holds the measured value against the threshold.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from itertools import chain
from pathlib import Path

import numpy as np

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


def pct(k: int, n: int) -> str:
    """``k of n rows (p%)``, for messages."""
    return f"{k} of {n} rows ({100.0 * k / max(n, 1):.1f}%)"


def _schema(ex) -> str:
    if ex.format == "prompt_completion":
        return "prompt_completion (chat)" if ex.is_chat else "prompt_completion (text)"
    return ex.format


# ---------------------------------------------------------------------- D01
@check(
    "D01",
    "format_mixed",
    "Rows mix dataset schemas",
    requires=("data",),
    severity="error",
    rank=10,
    rule="rows whose schema (messages / prompt+completion / alpaca / text) differs from the majority: any warns; "
    "error when row 0 is in the minority (TRL picks the loss mode from the first row only)",
    fix="normalise every row to one schema (e.g. all messages, or all prompt/completion)",
    source="trl sft_trainer.py decides the dataset type from next(iter(train_dataset))",
)
def d01(ctx: AuditContext) -> list[Hit]:
    """D01 (format_mixed): Rows mix dataset schemas."""
    schemas = [_schema(e) for e in ctx.examples]
    counts = Counter(schemas)
    if len(counts) < 2:
        return []
    major = max(sorted(counts), key=lambda k: counts[k])
    minority = [i for i, s in enumerate(schemas) if s != major]
    first_minor = schemas[0] != major
    sev = "error" if first_minor else "warning"
    msg = (
        f"{pct(len(minority), ctx.n)} use a schema other than the majority {major!r} "
        f"(counts: {dict(sorted(counts.items()))})"
    )
    if first_minor:
        msg += f"; row 0 is {schemas[0]!r}, and TRL sets the loss mode for the whole dataset from the first row"
    return [
        Hit(
            sev,
            msg,
            {
                "value": len(minority),
                "threshold": 0,
                "counts": dict(counts),
                "majority": major,
                "first_row_schema": schemas[0],
            },
            row_ids=ids(ctx, minority),
        )
    ]


# ---------------------------------------------------------------------- D02
@check(
    "D02",
    "text_field_missing",
    "The trainer's text/messages field is missing from rows",
    requires=("data", "config"),
    severity="error",
    rank=10,
    rule="TRL: language-modeling rows (not messages, not prompt/completion) lack dataset_text_field "
    "(default 'text'); axolotl: rows lack the field its datasets[].type reads (field_messages, field, "
    "instruction/output); any",
    fix="rename the field in the data, or set dataset_text_field / field_messages to the field the rows have",
    source="trl sft_config.py dataset_text_field; axolotl datasets[].field_messages",
    stages=("sft", "pretraining"),
)
def d02(ctx: AuditContext) -> list[Hit]:
    """D02 (text_field_missing): The trainer's text/messages field is missing from rows."""
    c = ctx.config
    if c.trainer == "trl":
        field = c.dataset_text_field or "text"
        bad = [
            i
            for i, e in enumerate(ctx.examples)
            if e.format not in ("messages", "prompt_completion") and field not in e.raw
        ]
        if not bad:
            return []
        fmts = Counter(ctx.examples[i].format for i in bad)
        return [
            Hit(
                "error",
                f"{pct(len(bad), ctx.n)} have no {field!r} field, and TRL reads language-modeling rows "
                f"from dataset_text_field={field!r} ({c.source('dataset_text_field')}); their formats: "
                f"{dict(fmts)}",
                {
                    "value": len(bad),
                    "threshold": 0,
                    "field": field,
                    "from": c.source("dataset_text_field"),
                    "formats": dict(fmts),
                },
                row_ids=ids(ctx, bad),
                fix="convert the rows to prompt/completion or messages (TRL does not read alpaca fields), or "
                "set dataset_text_field to the field that holds the text",
            )
        ]
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
        return [
            Hit(
                "error",
                f"{pct(len(bad), ctx.n)} lack the field(s) {need} that axolotl's {where}.type={typ!r} reads",
                {
                    "value": len(bad),
                    "threshold": 0,
                    "fields": need,
                    "type": typ,
                    "from": f"{Path(c.paths[0]).name}: {where}",
                },
                row_ids=ids(ctx, bad),
                fix=f"set {where}.field_messages (or field) to the field the rows use, or rename it in the data",
            )
        ]
    raise NotApplicable(f"the trainer ({c.trainer or 'unknown'}) does not read a configurable text field")


# ---------------------------------------------------------------------- D03
@check(
    "D03",
    "empty_target",
    "Empty or whitespace-only targets",
    requires=("data",),
    severity="error",
    rank=10,
    rule="the completion / output / final assistant turn is empty or whitespace; any",
    fix="drop these rows or fill in their targets",
    source="axolotl utils/trainer.py drops 'samples with no trainable tokens'; trl PR #6320",
)
def d03(ctx: AuditContext) -> list[Hit]:
    """D03 (empty_target): Empty or whitespace-only targets."""
    bad = [i for i, c in enumerate(ctx.completion_texts) if not c.strip()]
    if not bad:
        return []
    return [
        Hit(
            "error",
            f"{pct(len(bad), ctx.n)} have an empty target: they train nothing, or teach the model to "
            f"answer with nothing",
            {"value": len(bad), "threshold": 0},
            row_ids=ids(ctx, bad),
        )
    ]


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


@check(
    "D09",
    "role_order",
    "Chat roles unknown or out of order",
    requires=("data",),
    severity="error",
    rank=10,
    rule="unknown role, system turn not first, first turn not the user, two user/assistant turns in a row, or "
    "last turn not the assistant; any",
    fix="remap roles to system/user/assistant, merge consecutive turns, and end each conversation with the assistant",
    source="templates that raise 'Conversation roles must alternate' (tf#34494); FastChat filter_sharegpt.py",
)
def d09(ctx: AuditContext) -> list[Hit]:
    """D09 (role_order): Chat roles unknown or out of order."""
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
    if not bad:
        return []
    return [
        Hit(
            "error",
            f"{pct(len(bad), ctx.n)} have chat roles a template rejects or silently drops: "
            + "; ".join(f"{k} ({v})" for k, v in kinds.most_common()),
            {"value": len(bad), "threshold": 0, "problems": dict(kinds), "first_example": examples},
            row_ids=ids(ctx, bad),
        )
    ]


# ---------------------------------------------------------------------- D11
@check(
    "D11",
    "dup_exact",
    "Exact duplicate rows",
    requires=("data",),
    reads=("config",),
    severity="warning",
    rank=40,
    rule="rows identical after NFC, casefold and whitespace normalisation; extra copies > 1% of rows warns, "
    "any is info. With axolotl's dataset_exact_deduplication on, byte-identical copies are dropped by the "
    "trainer and not counted; copies that differ in case or whitespace survive it and still count",
    fix="deduplicate (axolotl: dataset_exact_deduplication: true), or keep the copies only if the upweighting "
    "is intended",
    source="axolotl dataset_exact_deduplication (sha256 of each prepared row); cleanlab Datalab near_duplicate",
)
def d11(ctx: AuditContext) -> list[Hit]:
    """D11 (dup_exact): Exact duplicate rows."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(ctx.norm_row):
        groups[r].append(i)
    dups = [g for g in groups.values() if len(g) > 1]
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
    members = [i for g in dups for i in g]
    dups.sort(key=lambda g: (-len(g), g[0]))
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


def _clusters(pairs, n) -> list[list[int]]:
    parent = list(range(n))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b, _ in pairs:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    groups: dict[int, list[int]] = defaultdict(list)
    for a, b, _ in pairs:
        for x in (a, b):
            groups[find(x)].append(x)
    return [sorted(set(g)) for g in groups.values()]


@check(
    "D12",
    "dup_near",
    "Near-duplicate rows",
    requires=("data",),
    severity="warning",
    rank=40,
    rule="MinHash over word 5-gram shingles, verified by exact Jaccard >= 0.8 (exact copies excluded); rows "
    "beyond the first in each cluster > 5% warns, any is info",
    fix="deduplicate near-copies (keep one per cluster) unless the variation is the point",
    source="NeMo Curator fuzzy deduplication (Jaccard 0.8)",
)
def d12(ctx: AuditContext) -> list[Hit]:
    """D12 (dup_near): Near-duplicate rows."""
    pairs = near_dup_pairs(ctx)
    if not pairs:
        return []
    clusters = _clusters(pairs, ctx.n)
    extra = sum(len(c) - 1 for c in clusters)
    rate = extra / ctx.n
    sev = "warning" if rate > 0.05 else "info"
    clusters.sort(key=lambda c: (-len(c), c[0]))
    return [
        Hit(
            sev,
            f"{len(clusters)} clusters of near-duplicate rows (Jaccard >= 0.8); {extra} rows beyond the "
            f"first of each = {100 * rate:.1f}% of rows (threshold 5%)",
            {
                "value": round(rate, 4),
                "threshold": 0.05,
                "jaccard_min": 0.8,
                "n_clusters": len(clusters),
                "clusters": [ids(ctx, c) for c in clusters[:20]],
                "pairs": [[ctx.examples[a].id, ctx.examples[b].id, round(j, 3)] for a, b, j in pairs[:20]],
            },
            row_ids=ids(ctx, [i for c in clusters for i in c]),
        )
    ]


# ---------------------------------------------------------------------- D13
@check(
    "D13",
    "conflicting_targets",
    "One prompt, different targets",
    requires=("data",),
    severity="warning",
    rank=40,
    rule="the same normalised prompt appears with two or more different targets; > 1% of distinct prompts warns, "
    "any is info (**H**)",
    fix="reconcile the targets (keep the correct one), or make the prompts say what differs",
    source="cleanlab label issues (analogue, heuristic)",
)
def d13(ctx: AuditContext) -> list[Hit]:
    """D13 (conflicting_targets): One prompt, different targets."""
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
    sev = "warning" if rate > 0.01 else "info"
    conflicts.sort(key=lambda g: (-len(g), g[0]))
    return [
        Hit(
            sev,
            f"{len(conflicts)} of {len(by_prompt)} distinct prompts ({100 * rate:.1f}%; threshold 1%) have "
            f"conflicting targets across {sum(map(len, conflicts))} rows",
            {
                "value": round(rate, 4),
                "threshold": 0.01,
                "n_prompts": len(conflicts),
                "groups": [ids(ctx, g) for g in conflicts[:20]],
            },
            row_ids=ids(ctx, [i for g in conflicts for i in g]),
        )
    ]


# ---------------------------------------------------------------------- D14
@check(
    "D14",
    "contam_exact",
    "Eval rows found verbatim in training",
    requires=("data", "eval"),
    severity="error",
    rank=30,
    rule="an eval row's normalised prompt+target, or its prompt (>= 3 words), equals a training row's: any is an "
    "error; a long eval target (>= 8 words) found as a training target warns",
    fix="remove the contaminated rows from the training set (or from the eval set) and re-run",
    source="lm-eval-harness docs/decontamination.md; saurabhav88/EnviousWispr#2547",
)
def d14(ctx: AuditContext) -> list[Hit]:
    """D14 (contam_exact): Eval rows found verbatim in training."""
    train_rows: dict[str, list[int]] = defaultdict(list)
    train_prompts: dict[str, list[int]] = defaultdict(list)
    train_targets: dict[str, list[int]] = defaultdict(list)
    for i, (r, p, c) in enumerate(zip(ctx.norm_row, ctx.norm_prompt, ctx.norm_completion)):
        train_rows[r].append(i)
        if len(p.split(None, 2)) >= 3:  # >= 3 words
            train_prompts[p].append(i)
        if len(c.split(None, 7)) >= 8:  # >= 8 words
            train_targets[c].append(i)
    full, prompt_only, target_only = [], [], []
    tr_full, tr_prompt, tr_target = set(), set(), set()
    for j, (p, c) in enumerate(zip(ctx.eval_norm_prompt, ctx.eval_norm_completion)):
        row = p + "\x1f" + c
        if row in train_rows:
            full.append(j)
            tr_full.update(train_rows[row])
        elif p in train_prompts:
            prompt_only.append(j)
            tr_prompt.update(train_prompts[p])
        elif c in train_targets:
            target_only.append(j)
            tr_target.update(train_targets[c])
    n_eval = len(ctx.eval_examples)
    hits = []
    if full or prompt_only:
        ev = full + prompt_only
        hits.append(
            Hit(
                "error",
                f"{len(ev)} of {n_eval} eval rows ({100 * len(ev) / n_eval:.1f}%) appear in training: "
                f"{len(full)} verbatim (prompt and target), {len(prompt_only)} with the same prompt",
                {
                    "value": len(ev),
                    "threshold": 0,
                    "n_eval": n_eval,
                    "verbatim": len(full),
                    "same_prompt": len(prompt_only),
                },
                row_ids=ids(ctx, tr_full | tr_prompt),
                eval_row_ids=eval_ids(ctx, ev),
            )
        )
    if target_only:
        hits.append(
            Hit(
                "warning",
                f"{len(target_only)} eval targets (>= 8 words) appear verbatim as training targets",
                {"value": len(target_only), "threshold": 0, "n_eval": n_eval},
                row_ids=ids(ctx, tr_target),
                eval_row_ids=eval_ids(ctx, target_only),
            )
        )
    return hits


# ---------------------------------------------------------------------- D15
#: A word 3-gram, or a sentence/line, found in this many distinct training rows (exact and near-duplicate copies
#: counted once) is shared material (a template, a macro, a system prompt, an entity name), not one row's content.
SHARED_MIN_ROWS = 3
#: An eval row is a near-copy when at least this share of its content is covered by one training row ...
NEAR_COPY_COVERAGE = 0.65
#: ... and the covered content is at least this many words (fewer is not evidence of a copy).
MIN_COVERED_WORDS = 3
#: ... and at least this many distinct covered words are specific to few training rows (a word in < SHARED_MIN_ROWS
#: distinct rows). The share itself weighs each content word by its rarity in training (idf, below), so a template
#: refilled with common names and numbers ("Yuki reads 20 pages ... in 39 days: 780" against "Yuki reads 40 pages
#: ... in 39 days: 1560") is not one row's content: its new, rare words weigh most, and they are not covered.
MIN_SPECIFIC_WORDS = 1
_N = 3


def row_representatives(ctx: AuditContext) -> np.ndarray:
    """Per training row, the first row of its duplicate group (exact copies after normalisation, and D12's
    near-duplicate clusters), so a frequency over "distinct rows" counts a duplicated row once.
    """
    if "row_reps" in ctx.memo:
        return ctx.memo["row_reps"]
    parent = list(range(ctx.n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    first: dict[str, int] = {}
    for i, r in enumerate(ctx.norm_row):
        j = first.setdefault(r, i)
        if j != i:
            parent[find(i)] = find(j)
    for a, b, _ in near_dup_pairs(ctx):
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    reps = np.array([find(i) for i in range(ctx.n)], dtype=np.int64)
    ctx.memo["row_reps"] = reps
    return reps


def _key_table(
    keys: np.ndarray, rows: np.ndarray, reps: np.ndarray, with_rows: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Sorted unique keys and, for each, the number of distinct row groups holding it (exact, vectorised).

    Args:
        keys: (N,) uint64 keys (word 3-grams or segment hashes) of all training rows, end to end.
        rows: (N,) int64 the training row of each key.
        reps: (n_rows,) int64 each row's group (:func:`row_representatives`).
        with_rows: also return every key occurrence sorted by (key, row).

    Returns:
        ``(unique keys (U,), groups per key (U,), keys sorted (N,), rows in (key, row) order (N,))``; the last two
        are None unless ``with_rows``. A (key run, row) pair is packed in one uint64 (run index << 32 | row), so
        the per-key work is two plain sorts, not a lexicographic sort.
    """
    if not len(keys):
        e = np.zeros(0, dtype=np.int64)
        return (
            np.zeros(0, dtype=np.uint64),
            e,
            (np.zeros(0, dtype=np.uint64) if with_rows else None),
            (e if with_rows else None),
        )
    order = np.argsort(keys)
    ks = keys[order]
    rs = rows[order]
    new = np.empty(len(ks), dtype=bool)
    new[0] = True
    np.not_equal(ks[1:], ks[:-1], out=new[1:])
    run = (np.cumsum(new) - 1).astype(np.uint64) << np.uint64(32)
    pair = run | reps[rs].astype(np.uint64)
    pair.sort()
    first = np.empty(len(pair), dtype=bool)
    first[0] = True
    np.not_equal(pair[1:], pair[:-1], out=first[1:])
    df = np.bincount((pair[first] >> np.uint64(32)).astype(np.int64), minlength=int(new.sum()))
    if not with_rows:
        return ks[new], df, None, None
    by_row = run | rs.astype(np.uint64)
    by_row.sort()
    return ks[new], df, ks, (by_row & np.uint64(0xFFFFFFFF)).astype(np.int64)


def _lookup(sorted_keys: np.ndarray, counts: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Counts of the keys ``q`` (0 where absent)."""
    if not len(sorted_keys) or not len(q):
        return np.zeros(len(q), dtype=np.int64)
    pos = np.minimum(np.searchsorted(sorted_keys, q), len(sorted_keys) - 1)
    return np.where(sorted_keys[pos] == q, counts[pos], 0)


def _grams_flat(flat: np.ndarray, offsets: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Word n-grams of rows given end to end; rows shorter than n have none (not one gram of the whole row).

    Returns ``(grams (G,) uint64, gram offsets (n_rows+1,) int64)``.

    Gram hashes are :func:`text.ngram_hashes`' (``sum_k h_{i+k} P^k``), from one rolling pass over ``flat``.
    """
    lens = np.diff(offsets)
    counts = np.maximum(lens - (n - 1), 0)
    goff = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(counts, out=goff[1:])
    if not goff[-1]:
        return np.zeros(0, dtype=np.uint64), goff
    m = len(flat) - n + 1
    roll = np.zeros(m, dtype=np.uint64)
    mult = np.uint64(1)
    with np.errstate(over="ignore"):
        for k in range(n):
            roll += flat[k : k + m] * mult
            mult = mult * T._P
    # the grams of row i start at offsets[i] .. offsets[i] + counts[i] - 1
    starts = np.repeat(offsets[:-1] - goff[:-1], counts) + np.arange(goff[-1], dtype=np.int64)
    return roll[starts], goff


def _spread(starts: np.ndarray, n: int, length: int) -> np.ndarray:
    """Positions covered by n-grams starting at ``starts``."""
    out = np.zeros(length + n, dtype=bool)
    for k in range(n):
        out[starts + k] = True
    return out[:length]


def _segment_spans(
    flat: np.ndarray, off: np.ndarray, seg_lens: list[list[int]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every row's segments as word spans, all rows at once (:func:`text.span_hashes` of each row).

    Args:
        flat, off: the rows' word hashes end to end and the row offsets (``AuditContext.row_word_flat``).
        seg_lens: per row, the word count of each segment.

    Returns:
        ``(row, start, end, hash, span offsets)``: per non-empty segment its row, its start and end word in the
        row (clipped to the row), the hash of its words; row i's spans are ``span_off[i]:span_off[i+1]``.
    """
    n = len(seg_lens)
    n_seg = np.fromiter(map(len, seg_lens), dtype=np.int64, count=n)
    seg_row = np.repeat(np.arange(n, dtype=np.int64), n_seg)
    lens = np.fromiter(chain.from_iterable(seg_lens), dtype=np.int64, count=int(n_seg.sum()))
    ends = np.cumsum(lens)
    first_seg = np.cumsum(n_seg) - n_seg  # index of each row's first segment
    before = (ends - lens)[np.minimum(first_seg, max(len(lens) - 1, 0))] if len(lens) else np.zeros(n, np.int64)
    row_len = np.diff(off)[seg_row]
    local_end = ends - np.repeat(before, n_seg)
    keep = lens > 0  # empty segments skipped; spans clipped to the row
    a0 = np.minimum(local_end - lens, row_len)[keep]
    a1 = np.minimum(local_end, row_len)[keep]
    rows = seg_row[keep]
    base = off[:-1][rows]
    span_off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=span_off[1:])
    return rows, a0, a1, T.span_hash_flat(flat, base + a0, base + a1), span_off


def _shared_mask(
    L: int,
    grams: np.ndarray,
    spans: tuple[np.ndarray, np.ndarray, np.ndarray],
    g_keys,
    g_df,
    seg_keys,
    seg_df,
    df: np.ndarray | None = None,
) -> np.ndarray:
    """Positions of a row (of ``L`` words) inside shared material: a word 3-gram or a segment (``spans``: the
    row's segment starts, ends and hashes) found in >= SHARED_MIN_ROWS rows. ``df``: the grams' counts, when
    already looked up.
    """
    if df is None:
        df = _lookup(g_keys, g_df, grams)
    shared = _spread(np.nonzero(df >= SHARED_MIN_ROWS)[0], _N, L) if len(grams) else np.zeros(L, dtype=bool)
    a0, a1, hs = spans
    if len(hs):
        for a, b in zip(*(x[_lookup(seg_keys, seg_df, hs) >= SHARED_MIN_ROWS].tolist() for x in (a0, a1))):
            shared[a:b] = True
    return shared


@check(
    "D15",
    "contam_near",
    "Eval rows nearly copied from training",
    requires=("data", "eval"),
    severity="warning",
    rank=30,
    rule=f"an eval row (not already an exact match, D14) whose content is mostly (>= {NEAR_COPY_COVERAGE:.0%} of its "
    f"content weighed by idf over training rows, >= {MIN_COVERED_WORDS} words, >= {MIN_SPECIFIC_WORDS} of them in < "
    f"{SHARED_MIN_ROWS} training rows) one training row's. Content: the words outside shared material, i.e. "
    f"outside every word {_N}-gram and every sentence/line found in >= {SHARED_MIN_ROWS} distinct training rows "
    f"(template sentences, recombined macros, system prompts, entity names with their prompt template; exact "
    f"and near-duplicate copies counted once). The eval row is aligned word by word with each candidate row "
    f"(one sharing its rare 3-grams): content inside a run of >= 2 aligned words is covered; words that "
    f"replace the row's shared material are light edits, not new content. > 1% of eval rows warns, any is info",
    fix="decontaminate: drop the training rows that overlap the eval set",
    source="lm-eval-harness docs/decontamination.md (n-gram overlap, GPT-3 App. C); coverage rule and "
    "shared-material filter **H**",
)
def d15(ctx: AuditContext) -> list[Hit]:
    """D15 (contam_near): Eval rows nearly copied from training."""
    from difflib import SequenceMatcher

    exact_rows = set(ctx.norm_row)
    exact_prompts = {p for p in ctx.norm_prompt if len(p.split(None, 2)) >= 3}  # >= 3 words
    reps = row_representatives(ctx)
    n = ctx.n
    flat, off = ctx.row_word_flat
    # training side: how many distinct rows hold each 3-gram and each segment; which rows hold each 3-gram
    seg_rows, s0, s1, s_hash, s_off = _segment_spans(flat, off, ctx.row_segment_lengths)
    seg_keys, seg_df, _, _ = _key_table(s_hash, seg_rows, reps)
    g_flat, g_off = _grams_flat(flat, off, _N)
    t3 = [g_flat[g_off[i] : g_off[i + 1]] for i in range(n)]
    g_rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(g_off))
    g_keys, g_df, own_g, own_r = _key_table(g_flat, g_rows, reps, with_rows=True)
    w_keys, w_df, _, _ = _key_table(flat, np.repeat(np.arange(n, dtype=np.int64), np.diff(off)), reps)
    tables = (g_keys, g_df, seg_keys, seg_df)
    t_shared: dict[int, np.ndarray] = {}
    t3_sets: dict[int, set[int]] = {}

    flagged: list[int] = []
    tr: set[int] = set()
    pairs: list[list] = []
    # eval side, every row at once: its 3-grams' counts, which words are content (outside shared material), which
    # grams touch content and are rare, and the training rows holding each such gram
    ef, eo = ctx.eval_row_word_flat
    eg, ego = _grams_flat(ef, eo, _N)
    e_start = np.repeat(eo[:-1] - ego[:-1], np.diff(ego)) + np.arange(len(eg), dtype=np.int64)  # word of gram
    e_df = _lookup(g_keys, g_df, eg)
    shared = np.zeros(len(ef) + _N, dtype=np.int64)
    for k in range(_N):
        shared[e_start[e_df >= SHARED_MIN_ROWS] + k] = 1
    e_rows, e0, e1, e_hash, _ = _segment_spans(ef, eo, ctx.eval_segment_lengths)
    sh = _lookup(seg_keys, seg_df, e_hash) >= SHARED_MIN_ROWS
    edge = np.zeros(len(ef) + 1, dtype=np.int64)  # +1 at a shared segment's start, -1 at its end
    np.add.at(edge, eo[:-1][e_rows[sh]] + e0[sh], 1)
    np.add.at(edge, eo[:-1][e_rows[sh]] + e1[sh], -1)
    content_all = (shared[: len(ef)] == 0) & (np.cumsum(edge[:-1]) == 0)
    e_wdf = _lookup(w_keys, w_df, ef)
    specific_all = e_wdf < SHARED_MIN_ROWS  # words in few distinct training rows
    n_groups = len(np.unique(reps))
    # rarity weight of each eval word; a word absent from training weighs as one in a single row (a swapped-in
    # synonym or an added filler word is not more content than the row's own names)
    idf_all = np.log((n_groups + 1) / (np.maximum(e_wdf, 1) + 1)) + 1.0
    n_content_all = np.concatenate(([0], np.cumsum(content_all)))
    touch = np.zeros(len(eg), dtype=bool)  # gram k touches content when any of words k .. k+N-1 is content
    for k in range(_N):
        touch |= content_all[e_start + k]
    voting = np.flatnonzero(touch & (e_df > 0) & (e_df < SHARED_MIN_ROWS))
    v_cut = np.searchsorted(voting, ego).tolist()
    v_lo = np.searchsorted(own_g, eg[voting]).tolist()
    v_hi = np.searchsorted(own_g, eg[voting], side="right").tolist()
    for j, h in enumerate(ctx.eval_row_word_hashes):
        row = ctx.eval_norm_prompt[j] + "\x1f" + ctx.eval_norm_completion[j]
        if row in exact_rows or ctx.eval_norm_prompt[j] in exact_prompts:
            continue  # D14's
        g, L = eg[ego[j] : ego[j + 1]], len(h)
        if len(g) == 0:
            continue
        content = content_all[eo[j] : eo[j + 1]]
        specific = specific_all[eo[j] : eo[j + 1]]
        idf = idf_all[eo[j] : eo[j + 1]]
        w_content = float(idf[content].sum())
        n_content = int(n_content_all[eo[j + 1]] - n_content_all[eo[j]])
        if n_content < MIN_COVERED_WORDS:
            continue
        # candidates: the training rows holding the most rare 3-grams over the eval row's content; each gram's
        # rows in row order (at most the first 50)
        votes: Counter = Counter()
        for lo, hi in zip(v_lo[v_cut[j] : v_cut[j + 1]], v_hi[v_cut[j] : v_cut[j + 1]]):
            votes.update(set(own_r[lo : min(hi, lo + 50)].tolist()))
        best = (0.0, 0)
        hl = h.tolist()
        gl = g.tolist()
        for i, _ in votes.most_common(5):
            # cheap bound first: content inside 3-grams row i also has
            if i not in t3_sets:
                t3_sets[i] = set(t3[i].tolist())
            has = t3_sets[i]
            in_row = np.fromiter(map(has.__contains__, gl), dtype=bool, count=len(gl))  # np.isin(g, t3[i])
            if int((_spread(np.nonzero(in_row)[0], _N, L) & content).sum()) < MIN_COVERED_WORDS:
                continue
            if i not in t_shared:
                sl = slice(s_off[i], s_off[i + 1])
                t_shared[i] = _shared_mask(len(ctx.row_word_hashes[i]), t3[i], (s0[sl], s1[sl], s_hash[sl]), *tables)
            ts = t_shared[i]
            edits = 0.0
            ops = SequenceMatcher(None, hl, ctx.row_word_hashes[i].tolist(), autojunk=False).get_opcodes()
            # aligned[k + 1]: op k is an "equal" run (with a False at each end, for k = -1 and k = len(ops))
            aligned = [False, *(op[0] == "equal" for op in ops), False]
            cov = np.zeros(L, dtype=bool)
            for k, (tag, a0, a1, b0, b1) in enumerate(ops):
                if tag == "equal" and a1 - a0 >= 2:
                    cov[a0:a1] = content[a0:a1]
                elif (
                    tag in ("replace", "insert")
                    and aligned[k]
                    and aligned[k + 2]
                    and b1 - b0 <= 3
                    and a1 - a0 <= max(1, 2 * (b1 - b0))
                    and ts[b0:b1].all()
                ):
                    # a word or short phrase swapped or added, between aligned words, where row i has shared
                    # material: a light edit of row i, not new content
                    edits += float(idf[a0:a1][content[a0:a1]].sum())
            covered = int(cov.sum())
            # one short shared phrase is a coincidence; a copy shares content in several places (or a long run)
            places = int(cov[0]) + int((cov[1:] & ~cov[:-1]).sum())
            if covered < MIN_COVERED_WORDS or (places < 2 and covered < 2 * MIN_COVERED_WORDS):
                continue
            if len(set(h[cov & specific].tolist())) < MIN_SPECIFIC_WORDS:
                continue  # only words many training rows have: a template refilled, not this row's content
            best = max(best, (float(idf[cov].sum()) / max(1e-9, w_content - edits), -i))
        share, i = best[0], -best[1]
        if share >= NEAR_COPY_COVERAGE:
            flagged.append(j)
            tr.add(i)
            pairs.append([ctx.eval_examples[j].id, ctx.examples[i].id, round(share, 3)])
    if not flagged:
        return []
    n_eval = len(ctx.eval_examples)
    rate = len(flagged) / n_eval
    sev = "warning" if rate > 0.01 else "info"
    return [
        Hit(
            sev,
            f"{len(flagged)} of {n_eval} eval rows ({100 * rate:.1f}%; threshold 1%) are mostly one training "
            f"row: >= {NEAR_COPY_COVERAGE:.0%} of their content (the words outside template material shared "
            f"by >= {SHARED_MIN_ROWS} training rows) is in {len(tr)} training rows",
            {
                "value": round(rate, 4),
                "threshold": 0.01,
                "n_eval": n_eval,
                "coverage_min": NEAR_COPY_COVERAGE,
                "shared_min_rows": SHARED_MIN_ROWS,
                "pairs": pairs[:20] if NEAR_COPY_COVERAGE > 0 else pairs,
            },
            row_ids=ids(ctx, tr),
            eval_row_ids=eval_ids(ctx, flagged),
        )
    ]


# ---------------------------------------------------------------------- D16
@check(
    "D16",
    "answer_in_prompt",
    "The target is already in its prompt",
    requires=("data",),
    severity="warning",
    rank=40,
    rule="the normalised target (>= 20 characters) appears verbatim inside its own prompt; > 5% warns, any is "
    "info (**H**)",
    fix="check for leakage: the model learns to copy, not to answer",
    source="heuristic",
)
def d16(ctx: AuditContext) -> list[Hit]:
    """D16 (answer_in_prompt): The target is already in its prompt."""
    bad = [i for i, (p, c) in enumerate(zip(ctx.norm_prompt, ctx.norm_completion)) if len(c) >= 20 and c in p]
    if not bad:
        return []
    rate = len(bad) / ctx.n
    return [
        Hit(
            "warning" if rate > 0.05 else "info",
            f"{pct(len(bad), ctx.n)} contain their own target verbatim in the prompt (threshold 5%)",
            {"value": round(rate, 4), "threshold": 0.05},
            row_ids=ids(ctx, bad),
        )
    ]


# ---------------------------------------------------------------------- D17
@check(
    "D17",
    "length_outliers",
    "Target length outliers",
    requires=("data",),
    reads=("tokenizer",),
    severity="warning",
    rank=40,
    rule="robust z-score of log target length > 5 (median/MAD, MAD floored at 0.1); tokens when a tokenizer is "
    "given, characters otherwise; > 1% of rows warns, any is info",
    fix="inspect the outliers: split very long targets, drop stubs",
    source="FastChat split_long_conversation",
)
def d17(ctx: AuditContext) -> list[Hit]:
    """D17 (length_outliers): Target length outliers."""
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
    rate = len(out) / ctx.n
    lv = [lens[i] for i in out]
    return [
        Hit(
            "warning" if rate > 0.01 else "info",
            f"{pct(len(out), ctx.n)} have target lengths far from the median of {math.expm1(med):.0f} {unit} "
            f"(robust z > 5; outliers range {min(lv)}-{max(lv)} {unit})",
            {
                "value": round(rate, 4),
                "threshold": 0.01,
                "z_threshold": 5,
                "unit": unit,
                "median": round(math.expm1(med), 1),
                "outlier_lengths": lv[:50],
            },
            row_ids=ids(ctx, out),
        )
    ]


# ---------------------------------------------------------------------- D18
@check(
    "D18",
    "language_mix",
    "Unexpected language mix",
    requires=("data",),
    severity="warning",
    rank=40,
    rule="language per row by script, and for Latin script by a stopword vote (en/fr/de/es/it/pt/nl): a "
    "minority language in 1-20% of rows, or prompt and target in different languages in > 5% of rows, "
    "warns; smaller shares are info (**H**)",
    fix="filter the rows in the wrong language (or ignore this for translation data)",
    source="FastChat optional_clean --skip-lang; DialogStudio ShareGPT README",
)
def d18(ctx: AuditContext) -> list[Hit]:
    """D18 (language_mix): Unexpected language mix."""
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
        rate = len(mism) / ctx.n
        hits.append(
            Hit(
                "warning" if rate > 0.05 else "info",
                f"{pct(len(mism), ctx.n)} answer in a different language from their prompt (threshold 5%)",
                {"value": round(rate, 4), "threshold": 0.05},
                row_ids=ids(ctx, mism),
            )
        )
    return hits


# ---------------------------------------------------------------------- D20
@check(
    "D20",
    "boilerplate_noise",
    "Refusal boilerplate, HTML or mojibake",
    requires=("data",),
    severity="warning",
    rank=40,
    rule="targets matching refusal/AI-disclaimer patterns ('as an AI language model', 'OpenAI'), or rows with "
    "HTML tags/entities or mojibake ('Ã©', 'â€™', U+FFFD); > 1% warns, any is info",
    fix="filter or clean these rows (ftfy fixes mojibake; strip HTML)",
    source="FastChat clean_sharegpt; airoboros-style filter lists",
)
def d20(ctx: AuditContext) -> list[Hit]:
    """D20 (boilerplate_noise): Refusal boilerplate, HTML or mojibake."""
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
    rate = len(allrows) / ctx.n
    return [
        Hit(
            "warning" if rate > 0.01 else "info",
            f"{pct(len(allrows), ctx.n)} carry noise (threshold 1%): "
            + ", ".join(f"{k} {len(v)}" for k, v in sorted(kinds.items())),
            {
                "value": round(rate, 4),
                "threshold": 0.01,
                "by_kind": {k: ids(ctx, v)[:20] for k, v in sorted(kinds.items())},
            },
            row_ids=ids(ctx, allrows),
        )
    ]


# ---------------------------------------------------------------------- D21
@check(
    "D21",
    "no_eval_split",
    "No held-out eval set",
    requires=("data",),
    reads=("eval", "config"),
    severity="warning",
    rank=30,
    rule="no eval set given and the config holds none out (val_set_size / val_size / eval_strategy); info, "
    "a warning when the training set has fewer than 200 rows",
    fix="hold out 5-10% of the rows and watch eval loss (pass it here with --eval)",
    source="Unsloth fine-tuning guide (watch the eval loss)",
)
def d21(ctx: AuditContext) -> list[Hit]:
    """D21 (no_eval_split): No held-out eval set."""
    if ctx.eval_examples is not None:
        return []
    c = ctx.config
    if c is not None and (
        (c.val_set_size or 0) > 0
        or c.has_eval_dataset
        or (c.eval_strategy not in (None, "no") and not c.is_default("eval_strategy"))
    ):
        return []
    sev = "warning" if ctx.n < 200 else "info"
    why = "and the config holds none out" if c is not None else "and no config says one was used"
    return [
        Hit(
            sev,
            f"no eval set was given {why}; with {ctx.n} training rows (threshold 200) overfitting goes unseen",
            {"value": ctx.n, "threshold": 200},
        )
    ]
