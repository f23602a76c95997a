"""The check registry reads a check's title, rule, fix and source from its docstring."""

from __future__ import annotations

import textwrap

import pytest

from gradian.audit import all_checks
from gradian.audit.registry import doc_fields

LOW = 2e-5


def _fn(doc: str, name: str = "lr_low"):
    def f(ctx):  # pragma: no cover - never run
        return []

    f.__name__ = name
    f.__doc__ = textwrap.dedent(doc)
    return f


def test_fields_are_joined_onto_one_line_and_constants_are_formatted():
    f = _fn(
        """Learning rate too low.

        Rule: LoRA with learning_rate < {LOW:g}, where
        {% generation %} stays as written

        Fix: raise it

        Source: trl docs

        A note for the reader: Rule: is not read here.
        """
    )
    assert doc_fields(f) == {
        "title": "Learning rate too low",
        "rule": "LoRA with learning_rate < 2e-05, where {% generation %} stays as written",
        "fix": "raise it",
        "source": "trl docs",
    }


@pytest.mark.parametrize(
    "doc,msg",
    [
        ("Title without a period\n\nRule: r\n\nFix: f\n\nSource: s\n", "must end with a period"),
        ("Title.\n\nRule: r\n\nSource: s\n", "no 'Fix:' paragraph"),
        ("Title.\n\nRule: r\n\nRule: again\n\nFix: f\n\nSource: s\n", "two 'Rule:' paragraphs"),
        ("Title.\n\nRule: below {MISSING_CONSTANT}\n\nFix: f\n\nSource: s\n", "names {MISSING_CONSTANT}"),
    ],
)
def test_a_malformed_docstring_is_refused_with_the_check_named(doc, msg):
    with pytest.raises(ValueError, match=msg) as e:
        doc_fields(_fn(doc))
    assert "lr_low" in str(e.value)


def test_every_registered_check_is_named_for_its_function_and_documented():
    for c in all_checks():
        assert c.fn.__name__ == c.name
        assert c.title and c.rule and c.fix and c.source, c.id
        assert "{" not in c.rule.replace("{%", "").replace("{{", ""), (c.id, c.rule)  # every constant formatted
