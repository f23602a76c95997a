"""Answer normalisation and the exact_match / contains metrics, edge cases included."""

from __future__ import annotations

import pytest

from gradian.evaluate import NormalizeSpec, contains, exact_match, extract_answer, normalize_answer


@pytest.mark.parametrize(
    "text,expected",
    [
        ("  Paris.  ", "paris"),
        ("The Hague", "hague"),
        ("U.S.A.", "usa"),
        ("Guinea-Bissau", "guineabissau"),
        ("3.14", "3.14"),
        ("1,000", "1.000"),
        ("ＰＡＲＩＳ", "paris"),  # full-width folds under NFKC
        ("Straße", "strasse"),
        ("a  b\tc", "b c"),  # article "a" dropped, whitespace collapsed
        ("Theodore", "theodore"),  # "the" only as a whole word
        ("«Rome»!", "rome"),
        ("$5", "5"),
        ("", ""),
    ],
)
def test_normalize_rules(text, expected):
    assert normalize_answer(text) == expected


def test_extract_first_line_and_leading_whitespace():
    assert extract_answer("\n\n  Paris\nIt is in France.") == "Paris"
    assert extract_answer("") == ""
    assert extract_answer("   \n  ") == ""
    assert extract_answer("Paris\nLyon", NormalizeSpec(first_line=False)) == "Paris\nLyon"


def test_exact_match_cases():
    assert exact_match("Paris.", ["Paris"])
    assert exact_match("  the paris\n", ["Paris"])
    assert not exact_match("Paris is the capital", ["Paris"])
    assert exact_match("Lutetia", ["Paris", "Lutetia"])  # alias
    assert not exact_match("", ["Paris"])  # empty output never matches
    assert not exact_match("...", ["Paris"])  # normalises to empty
    # multi-line output: only the first line is judged
    assert exact_match("Paris\nor maybe Lyon", ["Paris"])
    assert not exact_match("Lyon\nParis", ["Paris"])
    assert exact_match("Lyon\nParis", ["Paris"], NormalizeSpec(first_line=False)) is False
    # case sensitivity and punctuation are switchable
    assert not exact_match("paris", ["Paris"], NormalizeSpec(casefold=False))
    assert not exact_match("Paris.", ["Paris"], NormalizeSpec(strip_punctuation=False))
    assert not exact_match("The Hague", ["Hague"], NormalizeSpec(strip_articles=False))


def test_contains_cases():
    assert contains("The capital is Paris.", ["Paris"])
    assert not contains("Parisian food", ["Paris"])  # whole words only
    assert contains("It is New York City", ["new york"])
    assert not contains("", ["Paris"])
    assert contains("Maybe Lutetia", ["Paris", "Lutetia"])
    assert not contains("Lyon.\nParis", ["Paris"])  # first line only by default
    assert contains("Lyon.\nParis", ["Paris"], NormalizeSpec(first_line=False))
    assert not contains("3.14159", ["3.14"])  # decimals are not split into words
