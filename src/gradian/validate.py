"""Field validation for the specs (``TokenizeSpec``, ``GradSpec``, ``EngineSpec``, ``AttributeSpec``,
``EvalSpec``, ``ModelSpec``, ``TrainSpec`` ...).

Every number and enum a user can set reaches Gradian through one of the specs, and every spec
checks its fields in ``__post_init__`` with these helpers. So ``gradian index --batch-size -3``
and ``GradSpec(...)`` from Python fail the same way: one :class:`GradianUserError` line naming
the flag and the field, what is wrong and the fix, and the CLI exits with code 2. Nothing
reaches a computation (or the content-addressed cache) with a negative, zero, non-finite or
absurd value.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

from gradian.errors import GradianUserError

#: Seeds are handed to numpy, torch and Python's random, which agree on [0, 2**32 - 1].
SEED_MAX = 2**32 - 1
#: Token lengths beyond this are not a model's context: Audit uses 10**9 for "unbounded".
LENGTH_MAX = 10**9


def where(flag: str | None, owner: str, name: str) -> str:
    """``"--batch-size (EvalSpec.batch_size)"``: the flag a CLI user set and the field a Python user set."""
    return f"{flag} ({owner}.{name})" if flag else f"{owner}.{name}"


def spec_kwargs(
    cls: type, d: dict[str, Any], nested: dict[str, Callable[..., Any]] | None = None, tuples: Iterable[str] = ()
) -> dict[str, Any]:
    """The keyword arguments a spec's ``from_dict`` builds ``cls(**kw)`` with, from its ``to_dict()`` form.

    Keys that are not fields of the dataclass ``cls`` are dropped; a dict under a key of ``nested`` is read by it
    (``nested[k](**d[k])``: a spec class, or a function such as an engine's lookup), in ``nested``'s order; a list
    under a key of ``tuples`` becomes a tuple. The values are checked by
    ``cls`` itself (its ``__post_init__``).
    """
    from dataclasses import fields

    known = {f.name for f in fields(cls)}
    kw = {k: v for k, v in d.items() if k in known}
    for k, spec in (nested or {}).items():
        if isinstance(kw.get(k), dict):
            kw[k] = spec(**kw[k])
    for k in tuples:
        if isinstance(kw.get(k), list):
            kw[k] = tuple(kw[k])
    return kw


def _show(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:59] + "…"


def check_int(
    value: Any,
    owner: str,
    name: str,
    *,
    flag: str | None = None,
    lo: int | None = None,
    hi: int | None = None,
    fix: str | None = None,
) -> int:
    """``value`` must be an int (not a bool) in ``[lo, hi]``."""
    w = where(flag, owner, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise GradianUserError(
            f"{name} must be a whole number, got {_show(value)}", where=w, fix=fix or "give a whole number"
        )
    if lo is not None and value < lo:
        raise GradianUserError(f"{name} must be at least {lo}, got {value}", where=w, fix=fix or f"use a value >= {lo}")
    if hi is not None and value > hi:
        raise GradianUserError(
            f"{name} must be at most {hi:,}, got {value:,}", where=w, fix=fix or f"use a value <= {hi:,}"
        )
    return value


def check_float(
    value: Any,
    owner: str,
    name: str,
    *,
    flag: str | None = None,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
    fix: str | None = None,
) -> float:
    """``value`` must be a finite real number in the interval (``*_open``: the bound is excluded)."""
    w = where(flag, owner, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GradianUserError(f"{name} must be a number, got {_show(value)}", where=w, fix=fix or "give a number")
    if not math.isfinite(value):
        raise GradianUserError(
            f"{name} must be a finite number, got {value}", where=w, fix=fix or "give a finite number"
        )
    if lo is not None and (value <= lo if lo_open else value < lo):
        raise GradianUserError(
            f"{name} must be {'>' if lo_open else '>='} {lo:g}, got {value:g}",
            where=w,
            fix=fix or f"use a value {'>' if lo_open else '>='} {lo:g}",
        )
    if hi is not None and (value >= hi if hi_open else value > hi):
        raise GradianUserError(
            f"{name} must be {'<' if hi_open else '<='} {hi:g}, got {value:g}",
            where=w,
            fix=fix or f"use a value {'<' if hi_open else '<='} {hi:g}",
        )
    return float(value)


def check_choice(
    value: Any, choices: Iterable[Any], owner: str, name: str, *, flag: str | None = None, fix: str | None = None
) -> Any:
    """``value`` must be one of ``choices`` (compared only among values of the choices' own types)."""
    choices = tuple(choices)
    ok = any(type(value) is type(c) and value == c for c in choices)
    if not ok:
        shown = ", ".join(str(c) for c in choices)
        raise GradianUserError(
            f"unknown {name} {_show(value)}", where=where(flag, owner, name), fix=fix or f"use one of {shown}"
        )
    return value


def check_bool(value: Any, owner: str, name: str, *, flag: str | None = None) -> bool:
    """``value`` must be a real ``bool`` (``0``, ``1`` and ``"true"`` are refused); returns it.

    Raises:
        GradianUserError: naming ``flag`` and ``owner.name`` when it is anything else.
    """
    if not isinstance(value, bool):
        raise GradianUserError(
            f"{name} must be true or false, got {_show(value)}",
            where=where(flag, owner, name),
            fix="give true or false",
        )
    return value


def check_seed(value: Any, owner: str, name: str = "seed", *, flag: str | None = "--seed") -> int:
    """``value`` must be a whole number in ``[0, SEED_MAX]`` (a seed numpy, torch and ``random`` all accept)."""
    return check_int(value, owner, name, flag=flag, lo=0, hi=SEED_MAX, fix=f"use a seed in [0, {SEED_MAX}]")


def check_type(value: Any, cls: type, owner: str, name: str) -> Any:
    """``value`` must be an instance of ``cls`` (a nested spec, say); returns it.

    Raises:
        GradianUserError: naming ``owner.name``, the type wanted and the type given.
    """
    if not isinstance(value, cls):
        raise GradianUserError(
            f"{name} must be a {cls.__name__}, got {type(value).__name__}",
            where=where(None, owner, name),
            fix=f"pass a {cls.__name__}",
        )
    return value
