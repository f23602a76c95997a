"""Helpers for writing JSON Schemas (draft 2020-12 subset) as Python dicts.

The JSON forms of Evaluate (:data:`gradian.evaluate.result.RESULT_JSON_SCHEMA`) and of the report
(:data:`gradian.report.schema.REPORT_JSON_SCHEMA`) are described with these, so both follow one
convention: every property of an object is required (a field that may be absent is written as null).
"""

from __future__ import annotations

from typing import Any

STRING: dict[str, Any] = {"type": "string"}
INTEGER: dict[str, Any] = {"type": "integer"}
NUMBER: dict[str, Any] = {"type": "number"}
BOOLEAN: dict[str, Any] = {"type": "boolean"}
OBJECT: dict[str, Any] = {"type": "object"}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """The nullable variant of a simple ``{"type": T}`` schema: ``{"type": [T, "null"]}``."""
    return {"type": [schema["type"], "null"]}


def arr(items: dict[str, Any]) -> dict[str, Any]:
    """An array whose every element follows ``items``."""
    return {"type": "array", "items": items}


def obj(props: dict[str, Any], nullable: bool = False) -> dict[str, Any]:
    """An object with these ``properties``, all of them ``required`` (in the order given).

    Args:
        props: ``{name: schema}``.
        nullable: the object may also be null.
    """
    return {"type": ["object", "null"] if nullable else "object", "required": list(props), "properties": props}
