"""The small shared helpers: ``errors.first_line`` (what a user error quotes of a library's exception) and
``util.by_name`` (the item called NAME)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gradian.errors import first_line
from gradian.util import by_name


def test_first_line_is_the_first_line_cut_to_the_limit():
    assert first_line(ValueError("bad value\nsecond line")) == "bad value"
    assert first_line(OSError("x" * 300)) == "x" * 160
    assert first_line(OSError("x" * 300), 120) == "x" * 120


def test_first_line_of_a_silent_exception_is_its_type():
    assert first_line(KeyError()) == "KeyError"
    assert first_line(RuntimeError("")) == "RuntimeError"


@dataclass
class _Item:
    name: str
    capability: str = ""


def test_by_name_finds_the_first_match_and_raises_key_error_otherwise():
    items = [_Item("a", "x"), _Item("b", "y"), _Item("b", "z")]
    assert by_name(items, "b") is items[1]
    assert by_name(items, "y", "capability") is items[1]
    with pytest.raises(KeyError, match="'c'"):
        by_name(items, "c")
