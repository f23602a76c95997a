"""Comparing library versions (``trl=0.19.0``, ``transformers=4.46``) when a rule's answer depends on them.

Torch-free and at the bottom layer, so the training setup (:mod:`gradian.data.setup`) and Audit's checks
(:mod:`gradian.audit.versions`, which also parses ``--versions``) read them the same way.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version


def vt(v: str | None) -> Version | None:
    """``v`` parsed as a version, or None when absent or unparseable."""
    if v is None:
        return None
    try:
        return Version(v)
    except InvalidVersion:
        return None


def before(versions: dict[str, str], lib: str, bound: str) -> bool | None:
    """True if ``lib``'s version is below ``bound``; None when unknown."""
    v = vt(versions.get(lib))
    return None if v is None else v < Version(bound)


def within(versions: dict[str, str], lib: str, lo: str, hi: str) -> bool | None:
    """True if ``lo <= version < hi``; None when unknown."""
    v = vt(versions.get(lib))
    return None if v is None else Version(lo) <= v < Version(hi)
