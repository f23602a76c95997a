"""Checks that read the eval set against the training rows: verbatim and near copies (contamination), and
whether there is a held-out eval set at all.

Each finding lists the affected training example ids in ``row_ids`` and eval ids in ``eval_row_ids``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from gradian.audit import text as T
from gradian.audit.checks_dataset import eval_ids, group_roots, ids, near_dup_pairs
from gradian.audit.context import AuditContext
from gradian.audit.registry import Hit, check


@dataclass
class ExactMatches:
    """The eval rows found verbatim in training by :func:`exact_matches`, and the training rows they were found in.

    Attributes:
        verbatim: eval rows whose prompt + target equals a training row's.
        same_prompt: the others whose prompt (>= 3 words) equals a training row's.
        same_target: the others whose target equals a long training target (only when ``target_words`` is given).
        train_verbatim, train_prompt, train_target: the training rows each kind was found in.
    """

    verbatim: list[int] = field(default_factory=list)
    same_prompt: list[int] = field(default_factory=list)
    same_target: list[int] = field(default_factory=list)
    train_verbatim: set[int] = field(default_factory=set)
    train_prompt: set[int] = field(default_factory=set)
    train_target: set[int] = field(default_factory=set)


def exact_matches(
    train_prompts: list[tuple[str, str]],
    train_targets: list[str],
    eval_prompts: list[tuple[str, str]],
    eval_targets: list[str],
    target_words: int | None = None,
) -> ExactMatches:
    """D14's rule (D24 applies it to prompt + chosen response): each eval row's normalised prompt + target, else
    its prompt (>= 3 words), else (with ``target_words``) its target, looked up among the training rows'.

    A prompt counts with and without its system turns: a chat row's system prompt is not the item's content, and the
    same question asked under another (or no) system prompt is the same eval item.

    Args:
        train_prompts: per training row, its normalised prompt as written and without its system turns.
        train_targets: per training row, its normalised target.
        eval_prompts, eval_targets: the same for each eval row.
        target_words: also match an eval target alone against training targets of at least this many words
            (None: targets alone are not matched).
    """
    rows: dict[str, list[int]] = defaultdict(list)
    prompts: dict[str, list[int]] = defaultdict(list)
    targets: dict[str, list[int]] = defaultdict(list)
    for i, (forms, c) in enumerate(zip(train_prompts, train_targets)):
        for q in set(forms):
            rows[q + "\x1f" + c].append(i)
            if len(q.split(None, 2)) >= 3:  # >= 3 words
                prompts[q].append(i)
        if target_words is not None and len(c.split(None, target_words - 1)) >= target_words:
            targets[c].append(i)
    m = ExactMatches()
    for j, (forms, c) in enumerate(zip(eval_prompts, eval_targets)):
        forms = tuple(dict.fromkeys(forms))
        row = next((r for r in (q + "\x1f" + c for q in forms) if r in rows), None)
        prompt = next((q for q in forms if q in prompts), None)
        if row is not None:
            m.verbatim.append(j)
            m.train_verbatim.update(rows[row])
        elif prompt is not None:
            m.same_prompt.append(j)
            m.train_prompt.update(prompts[prompt])
        elif c in targets:
            m.same_target.append(j)
            m.train_target.update(targets[c])
    return m


# ---------------------------------------------------------------------- D14
@check("D14", requires=("data", "eval"), severity="error", rank=30)
def contam_exact(ctx: AuditContext) -> list[Hit]:
    """Eval rows found verbatim in training.

    Rule: an eval row's normalised prompt+target, or its prompt (>= 3 words), equals a training row's, with or without
    the prompts' system turns: any is an error; a long eval target (>= 8 words) found as a training target warns

    Fix: remove the contaminated rows from the training set (or from the eval set) and re-run

    Source: lm-eval-harness docs/decontamination.md; saurabhav88/EnviousWispr#2547
    """
    m = exact_matches(
        list(zip(ctx.norm_prompt, ctx.norm_prompt_without_system)),
        ctx.norm_completion,
        list(zip(ctx.eval_norm_prompt, ctx.eval_norm_prompt_without_system)),
        ctx.eval_norm_completion,
        target_words=8,
    )
    full, prompt_only, target_only = m.verbatim, m.same_prompt, m.same_target
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
                row_ids=ids(ctx, m.train_verbatim | m.train_prompt),
                eval_row_ids=eval_ids(ctx, ev),
            )
        )
    if target_only:
        hits.append(
            Hit(
                "warning",
                f"{len(target_only)} eval targets (>= 8 words) appear verbatim as training targets",
                {"value": len(target_only), "threshold": 0, "n_eval": n_eval},
                row_ids=ids(ctx, m.train_target),
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
#: ... and at least this share (by rarity weight) of the answer's own content words, those of the completion the
#: prompt does not hold: a training row about the same entity that gives another fact of it is not a copy
ANSWER_COVERAGE = 0.5
_N = 3


def row_representatives(ctx: AuditContext) -> np.ndarray:
    """Per training row, the first row of its duplicate group (exact copies after normalisation, and D12's
    near-duplicate clusters), so a frequency over "distinct rows" counts a duplicated row once.
    """
    if "row_reps" in ctx.memo:
        return ctx.memo["row_reps"]
    first: dict[str, int] = {}
    copies = [(i, first.setdefault(r, i)) for i, r in enumerate(ctx.norm_row)]  # each row and its first copy
    reps = np.array(group_roots(ctx.n, chain(copies, near_dup_pairs(ctx))), dtype=np.int64)
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
    # (np.cumsum of a bool array without dtype= takes a slow cast path: 10x the time of dtype=)
    run = np.cumsum(new, dtype=np.uint64)
    run -= np.uint64(1)
    run <<= np.uint64(32)
    pair = reps.astype(np.uint64)[rs]
    pair |= run
    pair.sort()
    first = np.empty(len(pair), dtype=bool)
    first[0] = True
    np.not_equal(pair[1:], pair[:-1], out=first[1:])
    df = np.bincount((pair[first] >> np.uint64(32)).astype(np.int64), minlength=int(new.sum()))
    if not with_rows:
        return ks[new], df, None, None
    by_row = rs.astype(np.uint64)
    by_row |= run
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
    roll = T.rolling_hashes(flat, n)  # some row has n words or more: len(flat) >= n
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


@check("D15", requires=("data", "eval"), severity="warning", rank=30)
def contam_near(ctx: AuditContext) -> list[Hit]:
    """Eval rows nearly copied from training.

    Rule: an eval row (not already an exact match, D14) whose content is mostly (>= {NEAR_COPY_COVERAGE:.0%} of its
    content weighed by idf over training rows, >= {MIN_COVERED_WORDS} words, >= {MIN_SPECIFIC_WORDS} of them in <
    {SHARED_MIN_ROWS} training rows) one training row's. Content: the words outside shared material, i.e. outside every
    word {_N}-gram and every sentence/line found in >= {SHARED_MIN_ROWS} distinct training rows (template sentences,
    recombined macros, system prompts, entity names with their prompt template; exact and near-duplicate copies counted
    once). The eval row is aligned word by word with each candidate row (one sharing its rare 3-grams): content inside a
    run of >= 2 aligned words is covered; words that replace the row's shared material are light edits, not new content.
    > 1% of eval rows warns, any is info

    Fix: decontaminate: drop the training rows that overlap the eval set

    Source: lm-eval-harness docs/decontamination.md (n-gram overlap, GPT-3 App. C); coverage rule and shared-material
    filter **H**
    """
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
    n_content_all = np.concatenate(([0], np.cumsum(content_all, dtype=np.int64)))
    touch = np.zeros(len(eg), dtype=bool)  # gram k touches content when any of words k .. k+N-1 is content
    for k in range(_N):
        touch |= content_all[e_start + k]
    voting = np.flatnonzero(touch & (e_df > 0) & (e_df < SHARED_MIN_ROWS))
    v_cut = np.searchsorted(voting, ego).tolist()
    v_lo = np.searchsorted(own_g, eg[voting]).tolist()
    v_hi = np.searchsorted(own_g, eg[voting], side="right").tolist()
    n_prompt_words = [len(T.find_words(p)) for p in ctx.eval_norm_prompt]
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
        # each distinct content word counts once: a name the eval row repeats ("... of The Gambia? The capital of
        # The Gambia is Banjul.") is one piece of content, not two, so a training row sharing only the name does not
        # cover most of the row. type_of[k]: the index of word k's first occurrence
        _, first, type_of = np.unique(h, return_index=True, return_inverse=True)
        w_type = np.zeros(len(first))
        w_type[type_of[content]] = idf[content]
        w_content = float(w_type.sum())
        # the answer's own content: the completion's content words the prompt does not already hold
        n_p = n_prompt_words[j]
        own = np.zeros(len(first), dtype=bool)
        own[type_of[n_p:][content[n_p:]]] = True
        own[type_of[:n_p]] = False
        w_own = float(w_type[own].sum())
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
            edited = np.zeros(L, dtype=bool)
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
                    edited[a0:a1] = content[a0:a1]
            covered = int(cov.sum())
            # one short shared phrase is a coincidence; a copy shares content in several places (or a long run)
            places = int(cov[0]) + int((cov[1:] & ~cov[:-1]).sum())
            if covered < MIN_COVERED_WORDS or (places < 2 and covered < 2 * MIN_COVERED_WORDS):
                continue
            if len(set(h[cov & specific].tolist())) < MIN_SPECIFIC_WORDS:
                continue  # only words many training rows have: a template refilled, not this row's content
            t_cov = np.zeros(len(first), dtype=bool)
            t_cov[type_of[cov]] = True
            t_edit = np.zeros(len(first), dtype=bool)
            t_edit[type_of[edited]] = True
            t_edit &= ~t_cov
            share = float(w_type[t_cov].sum()) / max(1e-9, w_content - float(w_type[t_edit].sum()))
            if w_own > 0 and float(w_type[own & (t_cov | t_edit)].sum()) < ANSWER_COVERAGE * w_own:
                continue  # the row shares the question's names but not the answer: another fact about them
            best = max(best, (share, -i))
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


# ---------------------------------------------------------------------- D21
@check("D21", requires=("data",), reads=("eval", "config"), severity="warning", rank=30)
def no_eval_split(ctx: AuditContext) -> list[Hit]:
    """No held-out eval set.

    Rule: no eval set given and the config holds none out (val_set_size / val_size / eval_strategy); info, a warning
    when the training set has fewer than 200 rows

    Fix: hold out 5-10% of the rows and watch eval loss (pass it here with --eval)

    Source: Unsloth fine-tuning guide (watch the eval loss)
    """
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
