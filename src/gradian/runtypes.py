"""The run, typed: :class:`Run` and its parts (:class:`Manifest`, :class:`Attribution`, :class:`CapabilityRun`,
:class:`AuditSummary`, :class:`Verification`), ``run.json`` (:mod:`gradian.runfile`) read back.

``Run.from_dict(d).to_dict() == d``: keys a class does not type are kept in its ``extra``, in their order.
Like :mod:`gradian.runfile` it stands at the bottom of the package and imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

from gradian.errors import GradianUserError
from gradian.runfile import RUN_SCHEMA, _whole_evaluation, check_run, load_run
from gradian.sign import SIGN_CONVENTION
from gradian.util import by_name


def _record_fields(cls: type) -> list[str]:
    from dataclasses import fields

    return [f.name for f in fields(cls) if f.name not in ("extra", "keys", "run_dir")]


def _read_record(cls: type, d: dict[str, Any], convert: dict[str, Callable[[Any], Any]] | None = None):
    """``cls(**typed fields of d, extra=the other keys, keys=d's key order)``; a missing key keeps its default."""
    if not isinstance(d, dict):
        raise GradianUserError(
            f"{cls.__name__} must be read from a JSON object, got {type(d).__name__}",
            where="run.json",
            fix="pass a run folder written by `gradian attribute`",
        )
    names = _record_fields(cls)
    convert = convert or {}
    kw = {k: (convert[k](d[k]) if k in convert and d[k] is not None else d[k]) for k in names if k in d}
    return cls(**kw, extra={k: v for k, v in d.items() if k not in names}, keys=tuple(d))


def _write_record(obj: Any, convert: dict[str, Callable[[Any], Any]] | None = None) -> dict[str, Any]:
    """The inverse of :func:`_read_record`: the keys it was read with, in their order (all fields when built here)."""
    convert = convert or {}
    names = _record_fields(type(obj))
    keys = obj.keys if obj.keys is not None else (*names, *obj.extra)
    out: dict[str, Any] = {}
    for k in keys:
        if k in names:
            v = getattr(obj, k)
            out[k] = convert[k](v) if k in convert and v is not None else v
        else:
            out[k] = obj.extra[k]
    return out


_R = TypeVar("_R", bound="_Record")


class _Record:
    """A part of run.json read as a dataclass (:func:`_read_record`): the typed fields, the other keys in
    ``extra``, the key order in ``keys``; ``to_dict`` writes it back as it was read.
    """

    @classmethod
    def from_dict(cls: type[_R], d: dict[str, Any]) -> _R:
        """Read this part of run.json (keys not typed here are kept in ``extra``)."""
        return _read_record(cls, d)

    def to_dict(self) -> dict[str, Any]:
        """This part of run.json, as it was read (:meth:`from_dict` inverts it)."""
        return _write_record(self)


@dataclass
class Manifest(_Record):
    """``run.json`` ``manifest``: what the run was computed from (module docstring).

    Attributes:
        run_id: hash of ``identity`` (the same inputs and specs give the same id).
        identity: every input's content hash and every spec (``identity["specs"]``: model, grad,
            attribute, eval, seed), the index id and the trajectory.
        paths: where the inputs were (base, adapter, data, eval, configs, logs).
        sign_convention: :data:`gradian.sign.SIGN_CONVENTION`.
        notes: remarks made while loading the model and adapter.
        extra: any other key, kept as read.
        keys: the key order it was read with (None: built here).
    """

    run_id: str = ""
    identity: dict[str, Any] = field(default_factory=dict)
    paths: dict[str, Any] = field(default_factory=dict)
    sign_convention: str = SIGN_CONVENTION
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] | None = None

    @property
    def specs(self) -> dict[str, Any]:
        """``identity["specs"]``: the model, grad, attribute and eval specs as dicts, and the seed."""
        return dict(self.identity.get("specs") or {})


@dataclass
class CapabilityRun:
    """``run.json`` ``attribution.capabilities[*]``: one regressed capability's verdict.

    The fields are :class:`gradian.attribute.pipeline.CapabilityAttribution`'s (as JSON), plus the
    failing items it was computed from. Scores follow :mod:`gradian.sign` (negative = degraded).

    Attributes:
        capability: the capability's name.
        engine: the primary gradient engine.
        n_train: n, the training rows.
        scores: (n,) the primary engine's influence per row (``predicted_loss_delta_if_removed = score / n``).
        rank_scores: (n,) the verdict's rank score per row (what orders ``ranked``).
        verdict_scores: (n,) the rank scores on the verdict's one scale (:func:`gradian.sign.verdict_scores`),
            or None (a run written before it was recorded).
        second_scores: (n,) the second engine's rank score, or None.
        queries: the queries, one per failing item (:class:`gradian.attribute.queries.Query` as dicts).
        ranked: the top-k most harmful rows, most harmful first.
        ranking: how ``rank_scores`` was formed.
        agreement: the two gradient engines' agreement, or None.
        evidence: per evidence kind, its (n,) scores and agreement with the verdict.
        clusters: the harmful tail's clusters.
        drilldown: sentence scores of the most harmful rows.
        per_item_top: per failing item, its 5 most harmful rows.
        row_sentences: per row, the ``[char_start, char_end]`` its verdict blames, or None.
        failing_items: the evaluation's failing items of this capability.
        drill_queries, drill_items: the weakened items the sentence drill-down alone asked about
            (``--drill-weakened``; empty otherwise and in older runs), as queries and as failing items.
    """

    capability: str = ""
    engine: str = ""
    n_train: int = 0
    scores: list[float] = field(default_factory=list)
    rank_scores: list[float] = field(default_factory=list)
    verdict_scores: list[float] | None = None
    second_scores: list[float] | None = None
    queries: list[dict[str, Any]] = field(default_factory=list)
    ranked: list[dict[str, Any]] = field(default_factory=list)
    ranking: dict[str, Any] = field(default_factory=dict)
    agreement: dict[str, Any] | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    clusters: list[dict[str, Any]] = field(default_factory=list)
    drilldown: list[dict[str, Any]] = field(default_factory=list)
    per_item_top: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    row_sentences: list[list[int] | None] | None = None
    failing_items: list[Any] = field(default_factory=list)  # list[gradian.evaluate.FailingItem]
    drill_queries: list[dict[str, Any]] = field(default_factory=list)
    drill_items: list[Any] = field(default_factory=list)  # list[gradian.evaluate.FailingItem]
    extra: dict[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CapabilityRun:
        """Read this part of run.json (keys not typed here are kept in ``extra``)."""
        items = lambda fs: [_failing_item(f) for f in fs]  # noqa: E731
        return _read_record(cls, d, {"failing_items": items, "drill_items": items})

    def to_dict(self) -> dict[str, Any]:
        """This part of run.json, as it was read (:meth:`from_dict` inverts it)."""
        items = lambda fs: [f.to_dict() for f in fs]  # noqa: E731
        return _write_record(self, {"failing_items": items, "drill_items": items})


def _failing_item(d: dict[str, Any]):
    from gradian.evaluate import FailingItem

    return FailingItem(**{k: v for k, v in d.items() if k != "chat"})  # ``chat`` is derived from the prompt


@dataclass
class Attribution:
    """``run.json`` ``attribution``: the index, the trajectory and every regressed capability's verdict.

    Attributes:
        index: the final checkpoint's row index: ``id``, ``root``, ``reused``, ``n``, ``blocks``, ``dims``.
        trajectory: the checkpoints scored over, their weights and indexes.
        train_ids: (n,) the training rows' ids, in index order (the columns of every score list).
        train_meta: (n,) per row its format, tokens, truncation and supervised tokens.
        capabilities: per regressed capability, its verdict.
    """

    index: dict[str, Any] = field(default_factory=dict)
    trajectory: dict[str, Any] | None = None
    train_ids: list[str] = field(default_factory=list)
    train_meta: list[dict[str, Any]] = field(default_factory=list)
    capabilities: list[CapabilityRun] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] | None = None

    def capability(self, name: str) -> CapabilityRun:
        """The verdict of capability ``name`` (KeyError if it was not attributed)."""
        return by_name(self.capabilities, name, "capability")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Attribution:
        """Read this part of run.json (keys not typed here are kept in ``extra``)."""
        return _read_record(cls, d, {"capabilities": lambda cs: [CapabilityRun.from_dict(c) for c in cs]})

    def to_dict(self) -> dict[str, Any]:
        """This part of run.json, as it was read (:meth:`from_dict` inverts it)."""
        return _write_record(self, {"capabilities": lambda cs: [c.to_dict() for c in cs]})


@dataclass
class AuditSummary(_Record):
    """``run.json`` ``audit``: the Audit lane's report (``gradian.audit.Report.to_dict()``).

    Attributes:
        counts: findings per severity, and checks skipped / passed / registered.
        findings: the findings, what to fix first first (each: ``id``, ``severity``, ``message``, ``row_ids`` ...).
        skipped: checks that did not run, with the reason.
        passed: ids of the checks that ran and found nothing.
    """

    counts: dict[str, int] = field(default_factory=dict)
    findings: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] | None = None


@dataclass
class Verification(_Record):
    """``run.json`` ``verification`` (written by ``gradian verify``): the retrains and what they measured.

    Attributes:
        capabilities: per capability, ``verified``, its one-line summary and the retrains' numbers.
        retrains: per retrain, its adapter and whether it was reused.
        spec: the :class:`gradian.verify.run.VerifySpec` as a dict.
    """

    capabilities: dict[str, dict[str, Any]] = field(default_factory=dict)
    retrains: dict[str, dict[str, Any]] = field(default_factory=dict)
    spec: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] | None = None


@dataclass
class Run:
    """One attribution run, typed: ``run.json`` (schema ``gradian.run/1``) read back.

    ``Run.from_dict(d).to_dict() == d`` for every run.json: keys this class does not type are
    kept in ``extra`` (and in each part's own ``extra``), in their order. The report reads the dict
    (:meth:`to_dict`).

    Attributes:
        evaluation: the Evaluate lane's :class:`gradian.evaluate.EvalResult`.
        attribution: the verdict per regressed capability, or None (nothing regressed).
        audit: the Audit lane's report, or None.
        manifest: inputs, specs and the run id.
        timing: seconds per stage.
        stopped: why the run stopped after Evaluate, or None.
        verification: the retrain check, once ``gradian verify`` has run; else None.
        run_dir: the folder it was read from or written to (not part of run.json).
    """

    evaluation: Any = None  # gradian.evaluate.EvalResult
    attribution: Attribution | None = None
    audit: AuditSummary | None = None
    manifest: Manifest | None = None
    timing: dict[str, float] = field(default_factory=dict)
    stopped: str | None = None
    verification: Verification | None = None
    schema: str = RUN_SCHEMA
    extra: dict[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] | None = None
    run_dir: Path | None = field(default=None, compare=False)

    @property
    def run_id(self) -> str | None:
        """The manifest's run id."""
        return self.manifest.run_id if self.manifest is not None else None

    @property
    def capabilities(self) -> list[CapabilityRun]:
        """The attributed capabilities (empty when nothing regressed)."""
        return list(self.attribution.capabilities) if self.attribution is not None else []

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Run:
        """Read a run dict (``json.load`` of run.json); a user error if it is not a valid ``gradian.run/1`` run
        (:func:`check_run`).
        """
        from gradian.evaluate import EvalResult

        check_run(d)
        return _read_record(
            cls,
            d,
            {
                "evaluation": lambda e: EvalResult.from_dict(_whole_evaluation(e)),
                "attribution": Attribution.from_dict,
                "audit": AuditSummary.from_dict,
                "manifest": Manifest.from_dict,
                "verification": Verification.from_dict,
            },
        )

    def to_dict(self) -> dict[str, Any]:
        """The run.json dict (what the report reads)."""
        return _write_record(
            self,
            {k: (lambda v: v.to_dict()) for k in ("evaluation", "attribution", "audit", "manifest", "verification")},
        )

    @classmethod
    def load(cls, run_dir: str | Path) -> Run:
        """Read ``RUN_DIR/run.json`` (:func:`load_run`)."""
        run = cls.from_dict(load_run(run_dir))
        run.run_dir = Path(run_dir) if Path(run_dir).is_dir() else Path(run_dir).parent
        return run
