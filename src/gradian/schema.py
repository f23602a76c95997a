"""Helpers for writing JSON Schemas (draft 2020-12 subset) as Python dicts.

The JSON forms of Evaluate (:data:`gradian.evaluate.result.RESULT_JSON_SCHEMA`) and of the report
(:data:`gradian.report.schema.REPORT_JSON_SCHEMA`) are described with these, so both follow one
convention: every property of an object is required (a field that may be absent is written as null), except
fields added after a format was published, which files written before them lack (``obj(..., optional=)``).
"""

from __future__ import annotations

import math
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


def obj(props: dict[str, Any], nullable: bool = False, optional: dict[str, Any] | None = None) -> dict[str, Any]:
    """An object with these ``properties``, all of them ``required`` (in the order given).

    Args:
        props: ``{name: schema}``.
        nullable: the object may also be null.
        optional: ``{name: schema}`` of properties that may be absent: fields added after a format was
            published, which files written before them lack.
    """
    out = {"type": ["object", "null"] if nullable else "object", "required": list(props), "properties": props}
    if optional:  # named, so that problem() still treats the object as one obj() wrote (closed shuts it)
        out["properties"] = {**props, **optional}
        out["optional"] = list(optional)
    return out


def finite(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` (a number, or an array of numbers) whose numbers must also be finite (no NaN, no ±inf).

    ``"finite": true`` is a keyword of this module's :func:`problem` (JSON Schema ignores unknown keywords;
    strict JSON has no NaN, but Python's ``json`` reads one).
    """
    return {**schema, "finite": True}


_KIND = {"string": "a string", "integer": "a whole number", "number": "a number", "boolean": "true or false"}
_KIND.update({"object": "an object", "array": "a list", "null": "null"})
_PLURAL = {"string": "strings", "integer": "whole numbers", "number": "numbers", "boolean": "booleans"}
_PLURAL.update({"object": "objects", "array": "lists", "null": "nulls"})


def _is(value: Any, t: str) -> bool:
    if t == "string":
        return isinstance(value, str)
    if t == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if t == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t == "boolean":
        return isinstance(value, bool)
    if t == "object":
        return isinstance(value, dict)
    if t == "array":
        return isinstance(value, list)
    return value is None  # "null"


def _shown(value: Any) -> str:
    r = repr(value)
    return r if len(r) <= 40 else r[:39] + "…"


def closed(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` in which every object written with :func:`obj` (all properties required) takes no other key.

    ``"closed": true`` is a keyword of :func:`problem`, inherited by the whole subtree: what a reader builds with
    ``cls(**d)`` must not meet a key its class has no field for.
    """
    return {**schema, "closed": True}


def problem(
    value: Any, schema: dict[str, Any], path: str = "", *, partial: bool = False, shut: bool = False
) -> str | None:
    """The first place where ``value`` breaks ``schema`` (``"path: what is wrong"``), or None.

    A strict validator for the subset of JSON Schema this package writes: ``type`` (one or a list),
    ``const``, ``enum``, ``oneOf`` / ``anyOf``, ``properties``, ``required``, ``additionalProperties``
    (false or a schema), ``items``, ``minimum`` / ``maximum``, plus ``finite`` (:func:`finite`).
    ``path`` names the field the way a user finds it in the file: ``a.b[3].c``.

    Args:
        partial: do not require the ``required`` keys (check only what is there).
        shut: inside a :func:`closed` subtree (set by the recursion).
    """
    at = path or "(top level)"
    shut = shut or bool(schema.get("closed"))
    if "const" in schema and value != schema["const"]:
        return f"{at}: is {_shown(value)}, expected {schema['const']!r}"
    if "enum" in schema and not any(value == e and type(value) is type(e) for e in schema["enum"]):
        return f"{at}: is {_shown(value)}, expected one of {', '.join(map(repr, schema['enum']))}"
    for key in ("oneOf", "anyOf"):
        if key in schema:
            found = [problem(value, s, path, partial=partial, shut=shut) for s in schema[key]]
            if all(found):
                return min(found, key=len)  # the closest alternative's complaint
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else list(types)
        if not any(_is(value, t) for t in types):
            return f"{at}: is {_shown(value)}, expected {' or '.join(_KIND[t] for t in types)}"
    if schema.get("finite") and isinstance(value, float) and not math.isfinite(value):
        return f"{at}: is {value}, expected a finite number"
    if _is(value, "number"):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{at}: is {_shown(value)}, expected at least {schema['minimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{at}: is {_shown(value)}, expected at most {schema['maximum']}"
    if isinstance(value, dict):
        props = schema.get("properties", {})
        if not partial:
            for k in schema.get("required", ()):
                if k not in value:
                    return f"{path + '.' if path else ''}{k}: missing"
        all_required = bool(props) and [*schema.get("required", ()), *schema.get("optional", ())] == list(props)
        extra = schema.get("additionalProperties", not (shut and all_required))
        for k, v in value.items():
            sub = f"{path}.{k}" if path else str(k)
            if k in props:
                p = problem(v, props[k], sub, partial=partial, shut=shut)
            elif extra is False:
                p = f"{sub}: unknown field"
            elif isinstance(extra, dict):
                p = problem(v, extra, sub, partial=partial, shut=shut)
            else:
                p = None
            if p:
                return p
    if isinstance(value, list) and "items" in schema:
        items = schema["items"]
        simple = set(items) <= {"type", "finite"} and isinstance(items.get("type"), str)
        for i, v in enumerate(value):
            p = problem(v, items, f"{path}[{i}]", partial=partial, shut=shut)
            if p and simple:  # a list of plain values: name the list, then the bad item
                kind = ("finite " if items.get("finite") else "") + _PLURAL[items["type"]]
                return f"{at} is not a list of {kind} ([{i}] {p.split(': ', 1)[1]})"
            if p:
                return p
    if schema.get("finite") and isinstance(value, list):
        for i, v in enumerate(value):
            if isinstance(v, float) and not math.isfinite(v):
                return f"{path}[{i}]: is {v}, expected a finite number"
    return None
