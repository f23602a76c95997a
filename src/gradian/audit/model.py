"""The Audit result model: findings, skipped checks, counts, and the JSON schema.

One :class:`Finding` is one problem a check found, with its evidence. A check
can raise several findings (e.g. one per sub-rule) or none. A check whose
inputs were not given, or that does not apply to the given run, is listed in
:attr:`AuditResult.skipped` with the reason; a check that ran and found
nothing is listed in :attr:`AuditResult.passed`. Every registered check lands
in exactly one of the three places, so nothing is silently dropped.

Row-level findings carry the affected training example ids in
:attr:`Finding.row_ids` (``Example.id`` strings from
:func:`gradian.data.formats.load_examples`) and affected eval ids in
:attr:`Finding.eval_row_ids`; log findings carry the logged steps in
:attr:`Finding.steps`. The report joins attribution clusters to findings on
``row_ids``.

The JSON form (:meth:`AuditResult.to_dict`) follows :data:`JSON_SCHEMA`
(schema id ``gradian.audit/1``); ``docs/diagnose.md`` documents it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gradian.util import attrs

SCHEMA_ID = "gradian.audit/1"

SEVERITIES = ("error", "warning", "info")
SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2}
INPUTS = ("data", "eval", "config", "logs", "tokenizer")


@dataclass
class Finding:
    """One problem found by one check.

    Attributes:
        id: the check's stable id (``"D04"``).
        name: the check's short name (``"truncated"``).
        title: one-line title of the check.
        severity: ``"error"``, ``"warning"`` or ``"info"``.
        reads: inputs the check read (subset of ``data, eval, config, logs, tokenizer``).
        message: what was measured, against which threshold, in one or two sentences.
        evidence: machine-readable evidence: always ``value`` and ``threshold`` where the rule
            is a threshold, plus check-specific fields (percentiles, groups, config sources ...).
        row_ids: affected training example ids (``Example.id``), in data order.
        eval_row_ids: affected eval example ids.
        steps: affected log steps (``global_step`` of the log entries).
        fix: the concrete fix.
        fraction: share of training rows affected (``len(row_ids) / n_rows``) for row-level findings.
    """

    id: str
    name: str
    title: str
    severity: str
    reads: list[str]
    message: str
    evidence: dict[str, Any]
    fix: str
    row_ids: list[str] = field(default_factory=list)
    eval_row_ids: list[str] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    fraction: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            **attrs(self, "id", "name", "title", "severity"),
            "reads": list(self.reads),
            "message": self.message,
            "evidence": _jsonable(self.evidence),
            "row_ids": list(self.row_ids),
            "eval_row_ids": list(self.eval_row_ids),
            "steps": [int(s) for s in self.steps],
            "fraction": self.fraction,
            "fix": self.fix,
        }


@dataclass
class SkippedCheck:
    """A check that did not run: its input was not given, or it does not apply to this run."""

    id: str
    name: str
    title: str
    reads: list[str]
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "title": self.title, "reads": list(self.reads), "reason": self.reason}


@dataclass
class AuditResult:
    """Everything ``gradian diagnose`` found.

    Attributes:
        findings: ordered by what to fix first (severity, then the check's fix-first rank,
            then the share of rows affected).
        skipped: checks that did not run, with the reason.
        passed: ids of checks that ran and found nothing.
        inputs: what was given (paths, row counts, config formats, tokenizer name).
        config: the normalised training config (values and the source field of each), or None.
        versions: library versions used by version-dependent checks, and where each came from.
        notes: remarks about the inputs (e.g. conflicting values between two configs).
    """

    findings: list[Finding]
    skipped: list[SkippedCheck]
    passed: list[str]
    inputs: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] | None = None
    versions: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    n_checks: int = 0

    @property
    def counts(self) -> dict[str, int]:
        """Findings per severity, plus checks skipped / passed / registered."""
        c = {s: 0 for s in SEVERITIES}
        for f in self.findings:
            c[f.severity] += 1
        c["skipped"] = len(self.skipped)
        c["passed"] = len(self.passed)
        c["checks"] = self.n_checks
        return c

    def at_or_above(self, level: str) -> list[Finding]:
        """Findings whose severity is ``level`` or worse (``level`` in error/warning/info)."""
        if level not in SEVERITY_RANK:
            raise ValueError(f"unknown severity {level!r}")
        return [f for f in self.findings if SEVERITY_RANK[f.severity] <= SEVERITY_RANK[level]]

    def by_id(self, check_id: str) -> list[Finding]:
        return [f for f in self.findings if f.id == check_id]

    def to_dict(self) -> dict[str, Any]:
        from gradian.version import __version__

        return {
            "schema": SCHEMA_ID,
            "gradian_version": __version__,
            "counts": self.counts,
            "findings": [f.to_dict() for f in self.findings],
            "skipped": [s.to_dict() for s in self.skipped],
            "passed": list(self.passed),
            "inputs": _jsonable(self.inputs),
            "config": _jsonable(self.config),
            "versions": _jsonable(self.versions),
            "notes": list(self.notes),
        }


def _jsonable(obj: Any) -> Any:
    """Plain JSON types only: floats that are NaN/inf become strings ("nan", "inf")."""
    import math

    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        if math.isnan(obj):
            return "nan"
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
        return obj
    try:  # numpy scalars
        import numpy as np

        if isinstance(obj, np.generic):
            return _jsonable(obj.item())
    except ImportError:  # pragma: no cover
        pass
    return str(obj)


_STR = {"type": "string"}
_STRS = {"type": "array", "items": {"type": "string"}}
_READS = {"type": "array", "items": {"type": "string", "enum": list(INPUTS)}}

#: JSON Schema (draft 2020-12 subset) of :meth:`AuditResult.to_dict`.
JSON_SCHEMA: dict[str, Any] = {
    "$id": SCHEMA_ID,
    "type": "object",
    "required": [
        "schema",
        "gradian_version",
        "counts",
        "findings",
        "skipped",
        "passed",
        "inputs",
        "config",
        "versions",
        "notes",
    ],
    "additionalProperties": False,
    "properties": {
        "schema": {"type": "string", "enum": [SCHEMA_ID]},
        "gradian_version": _STR,
        "counts": {
            "type": "object",
            "required": ["error", "warning", "info", "skipped", "passed", "checks"],
            "additionalProperties": False,
            "properties": {k: {"type": "integer"} for k in ("error", "warning", "info", "skipped", "passed", "checks")},
        },
        "findings": {
            "type": "array",
            "items": {
                "type": "object",
                "required": [
                    "id",
                    "name",
                    "title",
                    "severity",
                    "reads",
                    "message",
                    "evidence",
                    "row_ids",
                    "eval_row_ids",
                    "steps",
                    "fraction",
                    "fix",
                ],
                "additionalProperties": False,
                "properties": {
                    "id": _STR,
                    "name": _STR,
                    "title": _STR,
                    "severity": {"type": "string", "enum": list(SEVERITIES)},
                    "reads": _READS,
                    "message": _STR,
                    "evidence": {"type": "object"},
                    "row_ids": _STRS,
                    "eval_row_ids": _STRS,
                    "steps": {"type": "array", "items": {"type": "integer"}},
                    "fraction": {"type": ["number", "null"]},
                    "fix": _STR,
                },
            },
        },
        "skipped": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "name", "title", "reads", "reason"],
                "additionalProperties": False,
                "properties": {"id": _STR, "name": _STR, "title": _STR, "reads": _READS, "reason": _STR},
            },
        },
        "passed": _STRS,
        "inputs": {"type": "object"},
        "config": {"type": ["object", "null"]},
        "versions": {"type": "object"},
        "notes": _STRS,
    },
}
