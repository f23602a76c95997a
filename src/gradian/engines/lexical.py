"""BM25: lexical evidence, a reference engine beside the gradient engines.

When a fine-tune makes a model repeat a wrong fact, the training rows that
state it share its words; fact-tracing work (TrackStar, Chang et al. 2024)
finds BM25 hard to beat there. It is blind to regressions that repeat no words
(a changed answer language or format, verbosity, refusals), which is why it is
an extra opinion, never the only one.

Documents are training rows (prompt and completion text). For a failing item
with prompt ``p``, the model's answer ``w`` and the correct completion ``c``,
the lexical score of row j, in Gradian's sign convention (negative = evidence
that j taught what the model said), is

    ``said``      mode:  score_j = − BM25(p + w, j)
    ``contrast``  mode:  score_j = BM25(p + c, j) − BM25(p + w, j)

BM25 is a sum over query tokens, so ``contrast`` keeps only the words that
differ between the two answers (the prompt cancels). Each item's scores are
divided by their largest magnitude over rows, so every item weighs the same
in a capability's mean. Uses the ``bm25s`` library (Lucene BM25, k1 = 1.5,
b = 0.75, English stop words).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np


@dataclass(frozen=True)
class BM25Spec:
    """Attributes: mode (``"contrast"``, the default, or ``"said"``), k1 and b (BM25's saturation and length norm).

    ``contrast`` ranks the planted culprits better on the SmolLM2 worked example (AUC 0.869 against
    0.541 for ``said``), because ``said`` also matches every row that shares the question's words.
    """

    mode: str = "contrast"
    k1: float = 1.5
    b: float = 0.75

    def __post_init__(self) -> None:
        from gradian.validate import check_choice, check_float

        check_choice(self.mode, ("contrast", "said"), "BM25Spec", "mode")
        check_float(self.k1, "BM25Spec", "k1", lo=0.0, hi=100.0, fix="use BM25's usual 1.2-2.0, e.g. 1.5")
        check_float(self.b, "BM25Spec", "b", lo=0.0, hi=1.0, fix="use a length normalisation in [0, 1], e.g. 0.75")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _tok(texts: Sequence[str]) -> list[list[str]]:
    import bm25s

    return bm25s.tokenize(list(texts), stopwords="en", return_ids=False, show_progress=False)


def bm25_scores(
    documents: Sequence[str], said: Sequence[str], correct: Sequence[str | None], spec: BM25Spec = BM25Spec()
) -> np.ndarray:
    """Lexical scores (m, n) of ``documents`` for m failing items (module docstring).

    Args:
        documents: n training-row texts.
        said: m query texts of what the model said (prompt + answer).
        correct: m query texts of the correct side (prompt + correct answer); used by ``contrast``.

    Returns:
        (m, n) float64, per item scaled to max |score| = 1 (rows no query word touches score 0).
    """
    import bm25s

    model = bm25s.BM25(k1=spec.k1, b=spec.b)
    model.index(_tok(documents), show_progress=False)
    vocab = set(model.vocab_dict)
    out = np.zeros((len(said), len(documents)))

    def get(tokens: list[str]) -> np.ndarray:
        kept = [t for t in tokens if t in vocab]
        return np.asarray(model.get_scores(kept), dtype=np.float64) if kept else np.zeros(len(documents))

    said_t = _tok(said)
    corr_t = _tok([c or "" for c in correct])
    for q in range(len(said)):
        s = -get(said_t[q])
        if spec.mode == "contrast" and correct[q]:
            s = s + get(corr_t[q])
        peak = np.abs(s).max()
        out[q] = s / peak if peak > 0 else s
    return out
