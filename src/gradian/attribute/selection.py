"""Which training rows a run's verdict blames: one selection for ``gradian verify`` and ``gradian export``.

``select(run, drop)`` reads a ``run.json`` (a dict) and returns the ids of the rows to drop, most
harmful first, without duplicates, in this order: for each regressed capability in the run's order,
that capability's selected rows (a row blamed by two capabilities is listed once, where it first
appears). ``drop`` is one of

* ``"blamed"``: the verdict's harmful tail, as many rows as the capability's clusters hold, taken in
  rank order (most negative rank score first, :func:`gradian.sign.most_harmful_first`); this is
  what ``gradian verify`` removes by default;
* ``"cluster N"``: the rows of cluster N (1 = the most harmful) of each capability;
* ``"top K"``: the K most harmful rows of each capability (``verify --remove K``).

A selection the run cannot serve (no attribution, no cluster N, an empty tail) is a
:class:`~gradian.errors.GradianUserError` naming ``where`` (the flag the caller took ``drop`` from).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from gradian.errors import GradianUserError

#: the forms ``drop`` takes (module docstring)
DROP_FORMS = ("blamed", "cluster N", "top K")

_PATTERN = re.compile(r"^\s*(blamed|cluster\s+(\d+)|top\s+(\d+))\s*$")


def parse_drop(drop: str, where: str = "--drop") -> tuple[str, int | None]:
    """``"blamed"`` → ("blamed", None); ``"cluster 2"`` → ("cluster", 2); ``"top 15"`` → ("top", 15)."""
    m = _PATTERN.match(drop) if isinstance(drop, str) else None
    if m is None:
        raise GradianUserError(
            f"{drop!r} is not a selection", where=where, fix="use 'blamed', 'cluster N' or 'top K' (N, K ≥ 1)"
        )
    if m.group(2) is not None:
        n = int(m.group(2))
        kind = "cluster"
    elif m.group(3) is not None:
        n = int(m.group(3))
        kind = "top"
    else:
        return "blamed", None
    if n < 1:
        raise GradianUserError(f"{drop!r}: {kind} must be 1 or more", where=where, fix=f"e.g. '{kind} 1'")
    return kind, n


def capability_selection(cap: dict[str, Any], train_ids: list[str], drop: str, where: str = "--drop") -> list[str]:
    """The ids one capability's verdict selects (module docstring), most harmful first.

    Args:
        cap: one ``attribution.capabilities[i]`` of a run (``scores``/``rank_scores``: (n,) per training row;
            ``clusters``: ``[{"label", "row_ids"}]``).
        train_ids: (n,) ``attribution.train_ids``, the columns of the score lists.
    """
    from gradian.sign import most_harmful_first

    kind, n = parse_drop(drop, where)
    clusters = list(cap.get("clusters") or [])
    name = cap.get("capability", "?")
    if kind == "cluster":
        hit = [c for c in clusters if int(c["label"]) == n]
        if not hit:
            raise GradianUserError(
                f"capability {name!r} has no cluster {n}",
                where=where,
                fix=f"use a cluster 1..{len(clusters)}" if clusters else "use 'blamed' or 'top K' (it has no clusters)",
            )
        return list(hit[0]["row_ids"])
    scores = np.asarray(cap.get("rank_scores") or cap["scores"], dtype=float)
    k = n if kind == "top" else sum(len(c["row_ids"]) for c in clusters)
    if k is None or k < 1:
        raise GradianUserError(
            f"capability {name!r} has no harmful tail to select",
            where="run.json",
            fix="select the K most harmful rows instead ("
            + ("--remove K" if where.startswith("--remove") else f"{where} 'top K'")
            + ")",
        )
    return [train_ids[j] for j in most_harmful_first(scores)[:k]]


def select(run: dict[str, Any], drop: str = "blamed", *, where: str = "--drop") -> list[str]:
    """The ids of the rows ``drop`` selects over every attributed capability (module docstring).

    Args:
        run: a ``gradian.run/1`` dict (:func:`gradian.attribute.run.load_run`).
        drop: ``"blamed"``, ``"cluster N"`` or ``"top K"``.
        where: the flag named in an error.

    Returns:
        the selected ids, each once, most harmful first per capability.

    Raises:
        GradianUserError: the run attributed nothing, or the selection does not exist in it.
    """
    att = run.get("attribution")
    if not att or not att.get("capabilities"):
        raise GradianUserError(
            "this run attributed nothing (no capability regressed), so no row is blamed",
            where="run.json",
            fix="use a run whose report ranks training rows",
        )
    ids = list(att["train_ids"])
    out: list[str] = []
    seen: set[str] = set()
    for cap in att["capabilities"]:
        for r in capability_selection(cap, ids, drop, where):
            if r not in seen:
                seen.add(r)
                out.append(r)
    return out
