"""Clusters of the harmful tail, by gradient direction, and what their rows share.

The harmful tail is the most negative rows, taken in order until they hold
``tail_share`` of the total negative score (at most ``max_rows``, at least 2):
:func:`gradian.sign.harmful_tail`.
Rows are clustered by what they teach: the direction of their training gradient
and their content. The similarity of rows i and j is

    sim_ij = (1 − w) · cos(g_i, g_j) + w · cos(t_i, t_j)

with g the rows' training gradients, t their tf-idf word vectors (prompt and
completion; idf over the whole dataset, so words every row has, such as a
template's, count for little) and ``w = content_weight``. Average-linkage
agglomerative clustering on ``1 − sim`` (``scipy.cluster.hierarchy``) is cut where
the mean similarity inside a merge would drop below ``min_cosine``. The content
term keeps a culprit out of a group of benign rows whose gradients happen to
point its way (the benign rows say something else), and keeps copies of one wrong
fact together. Each cluster reports its size, its share of the total harmful
score, its exemplars (most negative first) and what its rows have in common:
row format, length, truncation, missing EOS, and words that are frequent in the
cluster but rare in the rest of the dataset.

Clusters are numbered **in ranking order**: cluster 1 holds the most harmful row,
cluster 2 the most harmful row not in cluster 1, and so on (``best_rank``: the
1-based rank of a cluster's first row). Numbering them by their summed score let a
large cluster of mildly harmful rows (benign rows sharing words with the failing
answers) outrank the few culprits at the top of the ranking; in ranking order a
cluster can lead only with the row that leads the ranking.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from gradian.data.formats import Example
from gradian.data.tokenize import TokenizedExample
from gradian.sign import harmful_share, harmful_tail, sort_most_harmful_first

if TYPE_CHECKING:  # torch comes where gradients are computed: the module is read without it
    from gradian.index.store import GradientIndex


@dataclass(frozen=True)
class ClusterSpec:
    """How the harmful tail is clustered (module docstring).

    Attributes:
        tail_share: the tail holds this share of the total negative score, in (0, 1].
        max_rows: at most this many rows in the tail.
        min_cosine: a merge whose mean similarity would drop below this is not made, in [-1, 1].
        exemplars: rows shown per cluster.
        content_weight: ``w``, the weight of the rows' content (tf-idf cosine) beside their gradient
            direction in the similarity (module docstring), in [0, 1]; 0: gradient directions alone.
    """

    tail_share: float = 0.8
    max_rows: int = 100
    min_cosine: float = 0.3
    exemplars: int = 3
    content_weight: float = 0.5

    def __post_init__(self) -> None:
        from gradian.validate import check_float, check_int

        check_float(self.tail_share, "ClusterSpec", "tail_share", lo=0.0, lo_open=True, hi=1.0, fix="use e.g. 0.8")
        check_int(self.max_rows, "ClusterSpec", "max_rows", lo=2, hi=1_000_000, fix="use e.g. 100")
        check_float(self.min_cosine, "ClusterSpec", "min_cosine", lo=-1.0, hi=1.0, fix="use e.g. 0.3")
        check_int(self.exemplars, "ClusterSpec", "exemplars", lo=1, hi=1_000, fix="use e.g. 3")
        check_float(self.content_weight, "ClusterSpec", "content_weight", lo=0.0, hi=1.0, fix="use e.g. 0.5")

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Cluster:
    """One cluster of the harmful tail: its rows (most harmful first), share of harmful mass, exemplars.

    ``best_rank``: the 1-based rank (in the verdict's ranking) of the cluster's most harmful row.
    """

    label: int
    row_ids: list[str]
    size: int
    harmful_share: float
    score: float
    exemplars: list[dict[str, Any]]
    common: dict[str, Any] = field(default_factory=dict)
    best_rank: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def gradient_cosine(index: GradientIndex, rows: Sequence[int], chunk: int | None = None) -> np.ndarray:
    """(k, k) cosine similarity of the training gradients of ``rows`` (k of them, in that order), over all blocks.

    ``cos_ij = ⟨g_i, g_j⟩ / (‖g_i‖ ‖g_j‖)`` with ``g`` the row's gradient concatenated over blocks (Σ_l d_l), the
    Gram matrix summed in float64. The rows are gathered in float32, which holds every storage dtype of an index
    exactly, and the Gram matrix is formed ``chunk`` columns at a time (default: 2^23 numbers, 64 MB, a step), so
    the memory is k × Σ_l d_l × 4 bytes: a float64 copy of 100 exact rows of an all-linear r=16 SmolLM2-135M
    adapter would be 3.9 GB, twice over while it was stacked. A row whose gradient is zero is similar to no row (0).
    """
    import torch

    want = sorted(set(int(r) for r in rows))
    pos = {r: i for i, r in enumerate(want)}
    offsets = np.cumsum([0] + [int(b["dim"]) for b in index.blocks])
    G = torch.empty(len(want), int(offsets[-1]), dtype=torch.float32)
    for start, shard in index.iter_shards(torch.float32):
        local = [r for r in want if start <= r < start + shard.n]
        if local:
            at = [pos[r] for r in local]
            for b, lo, hi in zip(index.blocks, offsets[:-1], offsets[1:]):
                G[at, int(lo) : int(hi)] = shard[b["name"]][[r - start for r in local]]
    gram = torch.zeros(len(want), len(want), dtype=torch.float64)
    chunk = chunk or max(1, (1 << 23) // max(1, len(want)))
    for lo in range(0, G.shape[1], chunk):
        c = G[:, lo : lo + chunk].double()
        gram += c @ c.T
    del G
    norm = gram.diagonal().clamp(min=0).sqrt().clamp(min=1e-30)
    cos = (gram / norm.unsqueeze(0) / norm.unsqueeze(1)).clamp(-1, 1).numpy()
    at = [pos[int(r)] for r in rows]
    return cos[np.ix_(at, at)]


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[A-Za-z][A-Za-z'-]{2,}", text.casefold())}


def content_cosine(rows: Sequence[int], examples: Sequence[Example], doc_freq: Counter) -> np.ndarray:
    """(k, k) cosine similarity of the rows' tf-idf word vectors (binary tf, ``idf = ln(n / df)``).

    Words of the prompt and the completion (:func:`_words`); ``doc_freq`` counts, per word, the rows of the
    whole dataset (n of them) that have it. A row with no weighted word is similar to no other row (0).
    """
    n = max(1, len(examples))
    words = [_words(examples[r].completion_text + " " + examples[r].prompt_text) for r in rows]
    vocab = sorted(set().union(*words)) if words else []
    col = {w: i for i, w in enumerate(vocab)}
    X = np.zeros((len(rows), len(vocab)))
    for i, ws in enumerate(words):
        for w in ws:
            X[i, col[w]] = np.log(n / max(1, doc_freq[w]))
    norm = np.linalg.norm(X, axis=1, keepdims=True)
    X = np.divide(X, norm, out=np.zeros_like(X), where=norm > 0)
    return X @ X.T


def lacks_eos(it: TokenizedExample, eos_ids: set[int], whitespace_ids: set[int]) -> bool:
    """True when the supervised tokens do not end in EOS / end-of-turn.

    Trailing whitespace-only tokens are skipped first: ChatML templates put a
    newline after ``<|im_end|>``, and that newline is supervised too.
    """
    sup = [t for t in it.labels if t != -100]
    while sup and sup[-1] in whitespace_ids:
        sup.pop()
    return bool(sup) and sup[-1] not in eos_ids


def whitespace_token_ids(tokenizer, items: Sequence[TokenizedExample]) -> set[int]:
    """Ids among the rows' last supervised tokens that decode to whitespace only."""
    cands = set()
    for it in items:
        sup = [t for t in it.labels if t != -100]
        cands.update(sup[-3:])
    return {t for t in cands if not tokenizer.decode([t]).strip() and t not in (tokenizer.all_special_ids or [])}


def describe_rows(
    rows: Sequence[int],
    examples: Sequence[Example],
    items: Sequence[TokenizedExample],
    no_eos: Sequence[bool],
    doc_freq: Counter,
) -> dict[str, Any]:
    """What a set of rows shares: formats, lengths, truncation, missing EOS, distinctive words."""
    n_all = len(examples)
    fmts = Counter(examples[r].format for r in rows)
    lengths = [items[r].full_length for r in rows]
    trunc = sum(items[r].truncated for r in rows)
    missing = sum(bool(no_eos[r]) for r in rows)
    local = Counter()
    for r in rows:
        local.update(_words(examples[r].completion_text + " " + examples[r].prompt_text))
    distinctive = []
    # ties in alphabetical order: the words come from sets, whose order changes with each process's
    # string hash seed, and a run must read the same in every process (and under torchrun)
    for w, c in sorted(local.items(), key=lambda wc: (-wc[1], wc[0])):
        share_here = c / len(rows)
        share_else = (doc_freq[w] - c) / max(1, n_all - len(rows))
        if share_here >= 0.5 and share_here >= 3 * share_else:
            distinctive.append(
                {"word": w, "share_in_cluster": round(share_here, 3), "share_elsewhere": round(share_else, 3)}
            )
    return {
        "formats": dict(fmts),
        "tokens_median": float(np.median(lengths)) if lengths else 0.0,
        "truncated_share": trunc / len(rows),
        "missing_eos_share": missing / len(rows),
        "distinctive_words": distinctive[:8],
    }


def cluster_tail(
    index: GradientIndex,
    scores: np.ndarray,
    examples: Sequence[Example],
    items: Sequence[TokenizedExample],
    no_eos: Sequence[bool],
    spec: ClusterSpec = ClusterSpec(),
) -> list[Cluster]:
    """Cluster the harmful tail of ``scores`` (aligned with ``examples``).

    Args:
        no_eos: per row, whether its supervised tokens lack EOS (see :func:`lacks_eos`).
    """
    from scipy.cluster.hierarchy import fcluster, linkage

    tail = harmful_tail(scores, spec.tail_share, spec.max_rows)
    if len(tail) == 0:
        return []
    doc_freq: Counter = Counter()
    for ex in examples:
        doc_freq.update(_words(ex.completion_text + " " + ex.prompt_text))
    if len(tail) == 1:
        labels = np.array([1])
    else:
        cos = gradient_cosine(index, tail)
        w = spec.content_weight
        if w > 0:
            cos = (1.0 - w) * cos + w * content_cosine([int(r) for r in tail], examples, doc_freq)
        dist = 1.0 - cos[np.triu_indices(len(tail), 1)]
        Z = linkage(np.clip(dist, 0, 2), method="average")
        labels = fcluster(Z, t=1.0 - spec.min_cosine, criterion="distance")
    rank_of = {int(r): i + 1 for i, r in enumerate(tail)}  # the tail is in ranking order
    clusters = []
    for lab in sorted(set(labels.tolist())):
        rows = sort_most_harmful_first((int(r) for r, lb in zip(tail, labels) if lb == lab), lambda r: scores[r])
        clusters.append(
            Cluster(
                label=0,
                row_ids=[examples[r].id for r in rows],
                size=len(rows),
                harmful_share=harmful_share(scores, rows),
                score=float(scores[rows].sum()),
                exemplars=[
                    {
                        "id": examples[r].id,
                        "score": float(scores[r]),
                        "prompt": examples[r].prompt_text[:300],
                        "completion": examples[r].completion_text[:500],
                    }
                    for r in rows[: spec.exemplars]
                ],
                common=describe_rows(rows, examples, items, no_eos, doc_freq),
                best_rank=min(rank_of[r] for r in rows),
            )
        )
    clusters.sort(key=lambda c: c.best_rank)  # ranking order (module docstring), never summed score
    for i, c in enumerate(clusters, start=1):
        c.label = i
    return clusters
