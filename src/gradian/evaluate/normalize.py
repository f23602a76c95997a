"""Answer extraction and normalisation, and the two text metrics.

Two steps, applied to the model's output (``extract`` then ``normalize``) and
to the correct answer and aliases (``normalize`` only):

**extract** (what the model *said*; this raw text is also what the contrastive
query subtracts): drop leading whitespace; with ``first_line`` keep only the
text before the first line break; strip surrounding whitespace.

**normalize** (what is compared), in order:

1. Unicode NFKC (full-width and compatibility forms fold to plain ones);
2. ``casefold`` (case-insensitive, Unicode aware: "Straße" == "strasse");
3. ``strip_punctuation``: delete every Unicode punctuation character
   (categories P*) and symbol (S*), except a ``.`` or ``,`` between two digits,
   which is kept as ``.`` (a decimal point, so "3.14" != "314"; a thousands
   comma "1,000" becomes "1.000" on both sides, consistently);
   deletion, not replacement, so "U.S.A." == "USA" (as in SQuAD's normaliser);
4. ``strip_articles``: drop the English words "a", "an", "the";
5. collapse runs of whitespace to one space and strip.

Metrics on the normalised strings (``pred`` = normalised extracted output,
``golds`` = normalised answer and aliases):

* ``exact_match``: ``pred == g`` for some ``g`` in ``golds``;
* ``contains``: some ``g`` occurs in ``pred`` as a whole-word sequence, i.e.
  ``" " + g + " "`` is a substring of ``" " + pred + " "``
  ("paris" is in "it is paris", not in "parisian").

An empty output never matches (the correct answer is never empty after
normalisation: the eval-set reader refuses such rows at evaluation time).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import asdict, dataclass
from typing import Any, Iterable

_ARTICLES = re.compile(r"\b(a|an|the)\b", flags=re.UNICODE)
_WS = re.compile(r"\s+", flags=re.UNICODE)
_DIGIT_SEP = re.compile(r"(?<=\d)[.,](?=\d)")
_KEEP = "\u0000"  # placeholder for a kept decimal separator while punctuation is deleted


@dataclass(frozen=True)
class NormalizeSpec:
    """How answers are compared. Serialised into the manifest (it changes scores).

    Attributes:
        first_line: judge only the first line of the model's output.
        casefold: compare case-insensitively (Unicode ``casefold``).
        strip_punctuation: delete punctuation and symbols (keeping decimal points).
        strip_articles: drop the English articles "a", "an", "the".
    """

    first_line: bool = True
    casefold: bool = True
    strip_punctuation: bool = True
    strip_articles: bool = True

    def __post_init__(self) -> None:
        from gradian.validate import check_bool

        for name in ("first_line", "casefold", "strip_punctuation", "strip_articles"):
            check_bool(getattr(self, name), "NormalizeSpec", name)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def extract_answer(output: str, spec: NormalizeSpec = NormalizeSpec()) -> str:
    """The answer the model gave, as raw text: leading whitespace dropped, first line, stripped."""
    text = output.lstrip()
    if spec.first_line:
        text = text.splitlines()[0] if text else ""
    return text.strip()


def normalize_answer(text: str, spec: NormalizeSpec = NormalizeSpec()) -> str:
    """Normalised form used for comparison (see the module docstring for the rules)."""
    s = unicodedata.normalize("NFKC", text)
    if spec.casefold:
        s = s.casefold()
    if spec.strip_punctuation:
        s = _DIGIT_SEP.sub(_KEEP, s)
        s = "".join(ch for ch in s if ch == _KEEP or unicodedata.category(ch)[0] not in ("P", "S"))
        s = s.replace(_KEEP, ".")
    if spec.strip_articles:
        s = _ARTICLES.sub(" ", s) if spec.casefold else re.sub(r"\b([Aa]|[Aa]n|[Tt]he)\b", " ", s)
    return _WS.sub(" ", s).strip()


def exact_match(pred: str, golds: Iterable[str], spec: NormalizeSpec = NormalizeSpec()) -> bool:
    """Whether the normalised extracted ``pred`` equals a normalised gold answer.

    ``pred`` is the model's full output; it is extracted (first line) here.
    """
    p = normalize_answer(extract_answer(pred, spec), spec)
    if not p:
        return False
    return any(p == g for g in (normalize_answer(x, spec) for x in golds) if g)


def contains(pred: str, golds: Iterable[str], spec: NormalizeSpec = NormalizeSpec()) -> bool:
    """Whether a normalised gold answer occurs as a whole-word sequence in the normalised extracted ``pred``."""
    p = normalize_answer(extract_answer(pred, spec), spec)
    if not p:
        return False
    padded = f" {p} "
    return any(f" {g} " in padded for g in (normalize_answer(x, spec) for x in golds) if g)


TEXT_METRICS = {"exact_match": exact_match, "contains": contains}
