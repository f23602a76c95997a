"""Which training rows a verdict blames: one selection shared by the summary, ``gradian verify`` and the export.

A selection is read off ``run.json`` alone (no model, no index), per regressed capability:

* ``"blamed"``: the rows of the capability's clusters, i.e. its harmful tail (the most harmful rows, taken
  in ranking order until they hold the clusters' share of the harmful score: :func:`gradian.sign.harmful_tail`).
  These are the rows the report's summary blames and the rows ``gradian verify`` removes by default;
* ``"cluster N"``: the rows of cluster N (clusters are numbered in ranking order: cluster 1 holds the most
  harmful row; :mod:`gradian.attribute.clusters`);
* ``"top K"``: the K most harmful rows by the verdict's rank score (only rows whose score is harmful).

Rows come most harmful first; with several regressed capabilities, capability by capability in the run's
order, each row once.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from gradian.errors import GradianUserError

#: The forms ``drop`` takes.
DROP_FORMS = ("blamed", "cluster N", "top K")


def parse_drop(drop: str, where: str = "--drop") -> tuple[str, int | None]:
    """``"blamed"`` → ("blamed", None); ``"cluster 2"`` → ("cluster", 2); ``"top 10"`` → ("top", 10).

    Raises:
        GradianUserError: any other form (naming ``where``).
    """
    text = str(drop).strip().casefold()
    if text == "blamed":
        return "blamed", None
    m = re.fullmatch(r"(cluster|top)[\s:=]*(\d+)", text)
    if m and int(m.group(2)) >= 1:
        return m.group(1), int(m.group(2))
    raise GradianUserError(
        f"{str(drop)[:60]!r} is not a selection of rows",
        where=where,
        fix="use 'blamed' (the rows the summary blames), 'cluster N' (N ≥ 1) or 'top K' (K ≥ 1)",
    )


def _capabilities(run: dict[str, Any], capability: str | None) -> list[dict[str, Any]]:
    att = run.get("attribution") or {}
    caps = list(att.get("capabilities") or [])
    if not caps:
        raise GradianUserError(
            "this run attributed nothing (no capability regressed), so no row is blamed",
            where="run.json",
            fix="select rows from a run whose report ranks training rows",
        )
    if capability is not None:
        caps = [c for c in caps if c.get("capability") == capability]
        if not caps:
            names = ", ".join(str(c.get("capability")) for c in att["capabilities"])
            raise GradianUserError(
                f"the run attributed no capability {capability!r}", where="--capability", fix=f"use one of {names}"
            )
    return caps


def _ranked_ids(cap: dict[str, Any], ids: list[str]) -> list[str]:
    """The capability's harmful rows (rank score < 0), most harmful first."""
    from gradian.sign import harmful_rows

    scores = np.asarray(cap.get("rank_scores") or cap["scores"], dtype=float)
    return [ids[int(j)] for j in harmful_rows(scores)]


def select_capability(cap: dict[str, Any], train_ids: list[str], drop: str, where: str = "--drop") -> list[str]:
    """The rows ``drop`` selects from one capability's verdict (module docstring), most harmful first."""
    kind, num = parse_drop(drop, where)
    name = cap.get("capability")
    ranked = _ranked_ids(cap, train_ids)
    if kind == "top":
        return ranked[:num]
    clusters = list(cap.get("clusters") or [])
    if kind == "cluster":
        hit = [c for c in clusters if int(c.get("label", -1)) == num]
        if not hit:
            raise GradianUserError(
                f"capability {name!r} has no cluster {num}",
                where=where,
                fix=f"use a cluster of 1..{len(clusters)}" if clusters else "it has no harmful cluster; use 'top K'",
            )
        keep = set(hit[0]["row_ids"])
    else:
        keep = {r for c in clusters for r in c.get("row_ids") or []}
        if not keep:
            raise GradianUserError(
                f"capability {name!r} has no harmful tail to blame (no row has a harmful score)",
                where="run.json",
                fix="nothing to remove; or pass 'top K' to choose rows yourself",
            )
    rank = {r: i for i, r in enumerate(ranked)}
    return sorted(keep, key=lambda r: (rank.get(r, len(rank)), r))


def select(
    run: dict[str, Any], drop: str = "blamed", capability: str | None = None, where: str = "--drop"
) -> list[str]:
    """The row ids ``drop`` selects (module docstring): what the summary blames, verify removes, export drops.

    Args:
        run: a ``gradian.run/1`` dict (:func:`gradian.attribute.run.load_run`).
        drop: ``"blamed"``, ``"cluster N"`` or ``"top K"``.
        capability: only this capability's verdict (None: every regressed capability).
        where: the flag or field named in an error.

    Returns:
        row ids, most harmful first, each once.

    Raises:
        GradianUserError: nothing was attributed, an unknown ``drop`` / capability / cluster, or no harmful tail.
    """
    ids = list((run.get("attribution") or {}).get("train_ids") or [])
    out: list[str] = []
    seen: set[str] = set()
    for cap in _capabilities(run, capability):
        for r in select_capability(cap, ids, drop, where):
            if r not in seen:
                seen.add(r)
                out.append(r)
    return out
