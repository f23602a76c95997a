"""The report's views (schema ``gradian.report/1``): the dataclasses every renderer reads.

:class:`Report` is the whole report; ``Report.to_dict()`` is its JSON form and
``Report.from_dict`` reads it back (the round trip is exact). The views are built
by :func:`gradian.report.builders.build_report`; their JSON Schema is
:data:`gradian.report.schema.REPORT_JSON_SCHEMA`.

The strings are kept exactly as the run recorded them (the JSON form is data);
renderers show them only through :mod:`gradian.report.safe`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from gradian.evaluate.result import CapabilityDelta
from gradian.runfile import RUN_SCHEMA
from gradian.util import by_name

REPORT_SCHEMA = "gradian.report/1"

#: Clusters listed in the summary per capability.
SUMMARY_CLUSTERS = 3

#: How every renderer labels the verdict score (:func:`gradian.sign.verdict_scores`).
VERDICT_SCORE_LABEL = "score (% of harm)"

#: Column headings of the most-harmful-rows table, the same in every renderer: the verdict score orders it;
#: the raw influence and the predicted change of the query loss stay beside it, labelled as such.
HARMFUL_ROW_COLUMNS = (
    "rank",
    "row",
    VERDICT_SCORE_LABEL,
    "raw influence",
    "Δ query loss if removed",
    "tokens",
    "cluster",
    "audit",
    "supported by",
    "completion (harmful sentence marked)",
)

#: Column headings of the verification table (``gradian verify``), the same in every renderer and the CLI.
VERIFY_COLUMNS = (
    "retrain",
    "rows removed",
    "score",
    "Δ vs tuned [95% CI]",
    "recovery [95% CI]",
    "Δ query loss predicted",
    "measured",
)

LEVELS = ("ok", "caution", "warning")

#: The kinds of evidence a ranked row can be supported by (``row["support"]``).
EVIDENCE_KINDS = ("gradient", "lexical", "representation")


@dataclass
class Qualifier:
    """One confidence qualifier on a capability's verdict or its data verdict.

    Attributes:
        kind: ``noise_band`` | ``few_items`` | ``base_fails`` | ``low_base`` | ``thin_margin`` |
            ``margins`` | ``loglik_query`` | ``engine_agreement`` | ``single_engine`` | ``evidence`` | ``base_bound`` |
            ``audit_setup`` (Audit found an error-level setup problem: :func:`gradian.report.join.setup_errors`).
        level: ``ok`` (supports the verdict), ``caution``, or ``warning`` (weakens it).
        text: one sentence.
    """

    kind: str
    level: str
    text: str


@dataclass
class ScoreProfile:
    """The distribution of one capability's verdict scores over all training rows.

    The scores are the verdict's one scale (:func:`gradian.sign.verdict_scores`: a signed share of the
    harmful total, in percent; the harmful rows add up to −100).

    Attributes:
        n, n_negative, n_positive: rows; rows with score < 0 (degraded), > 0 (reinforced).
        min, max, median: of the scores.
        total_negative: ``Σ_{s_j<0} −s_j`` (the harmful mass).
        tail_n: rows in the harmful tail (the rows the clusters hold).
        tail_mass: the tail's share of ``total_negative``.
        points: ``[rank, score, in_tail]`` sorted most harmful first (rank 0-based over all n
            rows); every row when ``n ≤ PROFILE_POINTS`` (:mod:`gradian.report.builders`), else
            every tail row plus evenly spaced ranks of the rest, always including the first and last.
    """

    n: int
    n_negative: int
    n_positive: int
    min: float
    max: float
    median: float
    total_negative: float
    tail_n: int
    tail_mass: float
    points: list[list[Any]]


@dataclass
class ClusterView:
    """A harmful cluster (from the Attribute lane) with its explanations (see :mod:`gradian.report.join`).

    Attributes:
        mechanics: ``{"truncated": {"share", "source"}, "missing_eos": {...}}``: the share of the
            cluster's rows that are truncated / lack EOS. ``source`` is the Audit check (``"D04"``,
            ``"D06"``) when Audit ran it (its row ids decide), else ``"attribute"`` (the cluster's
            own ``common`` statistics).
        best_rank: the 1-based rank of the cluster's most harmful row (clusters are listed in this order).
        verdict_score: the sum of its rows' verdict scores (:func:`gradian.sign.verdict_scores`; = −100 ×
            its harmful share when all its rows are harmful).
    """

    label: int
    size: int
    harmful_share: float
    score: float
    row_ids: list[str]
    exemplars: list[dict[str, Any]]
    common: dict[str, Any]
    explanations: list[dict[str, Any]]
    mechanics: dict[str, Any] = field(default_factory=dict)
    best_rank: int = 0
    verdict_score: float = float("nan")

    @property
    def explained(self) -> bool:
        """Whether an Audit finding explains the cluster (not only its own statistics)."""
        return any(e["source"] == "audit" for e in self.explanations)


@dataclass
class DrilldownView:
    """One row's sentence scores, with the row text cut into segments for display.

    Attributes:
        text: the completion text the spans index into (``text_source``: ``"row"`` when the
            ranked row's stored completion covers every span, else ``"sentences"``: the
            sentences placed at their offsets with single spaces in the gaps).
        segments: ``{"text", "sentence"}`` in text order; ``sentence`` is the index into
            ``sentences`` (most harmful first) or None for text between sentences.
    """

    id: str
    item_id: str
    row_score_for_item: float
    text: str
    text_source: str
    segments: list[dict[str, Any]]
    sentences: list[dict[str, Any]]
    #: the row's verdict score; each sentence's ``verdict_score`` is it apportioned by the sentence scores
    verdict_score: float = float("nan")
    #: what the item is when it is not a lost one: a weakened item the drill-down alone asks about
    #: (``--drill-weakened``), e.g. ``"still passes; weakened 0.84 nats; asked by the drill-down only"``; else ""
    item_note: str = ""


@dataclass
class AttributionView:
    """Attribution of one regressed capability."""

    engine: str
    engines: list[str]
    n_train: int
    n_failing: int
    query_kinds: dict[str, int]
    agreement: dict[str, Any] | None
    profile: ScoreProfile
    clusters: list[ClusterView]
    explained_share: float
    ranked: list[dict[str, Any]]
    drilldown: list[DrilldownView]
    failing_items: list[dict[str, Any]]
    #: per kind of evidence (gradient, lexical, representation): its engine and how it agrees with the
    #: verdict (Spearman, top-k overlap); ``"fused"``: the weights of the references folded into the ranking
    evidence: dict[str, Any] | None = None
    #: the rows the summary blames, most harmful first (:func:`gradian.attribute.selection.select`,
    #: ``"blamed"``): what ``gradian verify`` removes by default and the export drops
    blamed: list[str] = field(default_factory=list)


@dataclass
class CapabilityView(CapabilityDelta):
    """One capability: its measured change (:class:`~gradian.evaluate.result.CapabilityDelta`), the Evaluate
    verdict, its qualifiers, and its attribution when regressed.
    """

    verdict: str
    diagnosed: bool
    reason: str
    sign_test_p: float
    n_kept: int
    n_lost: int
    n_gained: int
    n_both_fail: int
    base_bounds: dict[str, Any]
    qualifiers: list[Qualifier]
    attribution: AttributionView | None = None


@dataclass
class FindingView:
    """An audit finding, with the clusters it explains."""

    id: str
    name: str
    title: str
    severity: str
    reads: list[str]
    message: str
    fix: str
    evidence: dict[str, Any]
    n_rows: int
    row_ids: list[str]
    n_steps: int
    steps: list[int]
    fraction: float | None
    clusters: list[dict[str, Any]]


@dataclass
class AuditView:
    """The Audit lane's result: counts per severity, the findings (with their clusters), passed and skipped checks."""

    counts: dict[str, int]
    findings: list[FindingView]
    passed: list[str]
    skipped: list[dict[str, Any]]
    notes: list[str]


@dataclass
class TrainingLogView:
    """The loss curve and the log anomalies Audit flagged.

    Attributes:
        path: the log file the run was given.
        status: ``plotted`` (read, same content hash as at run time), ``changed`` (read, but its
            hash differs from the manifest's: plotted with a note), ``missing``, ``unreadable``,
            or ``not_read`` (the report was built without reading it).
        loss, eval_loss, learning_rate: ``[step, value]`` pairs.
        anomalies: ``{check, name, severity, steps, message}`` of Audit's log findings with steps.
    """

    path: str | None
    status: str
    note: str | None
    loss: list[list[float]]
    eval_loss: list[list[float]]
    learning_rate: list[list[float]]
    anomalies: list[dict[str, Any]]


@dataclass
class Report:
    """The whole report; ``to_dict()`` is the ``gradian.report/1`` JSON, ``from_dict`` reads it back."""

    run_id: str
    status: str
    headline: list[str]
    capabilities: list[CapabilityView]
    audit: AuditView | None
    training_log: TrainingLogView | None
    manifest: dict[str, Any]
    timing: dict[str, Any]
    stopped: str | None = None
    notes: list[str] = field(default_factory=list)
    gradian_version: str = ""
    verification: dict[str, Any] | None = None
    run_schema: str = RUN_SCHEMA
    schema: str = REPORT_SCHEMA

    def capability(self, name: str) -> CapabilityView:
        """The capability called ``name`` (KeyError if the report has none)."""
        return by_name(self.capabilities, name)

    def finding_fixes(self) -> dict[int, str]:
        """Each audit finding's fix, by the finding's index in ``audit.findings`` (what a cluster explanation's
        ``"finding"`` names).
        """
        return {i: f.fix for i, f in enumerate(self.audit.findings if self.audit else [])}

    def to_dict(self) -> dict[str, Any]:
        """The ``gradian.report/1`` JSON form (``schema`` first)."""
        d = asdict(self)
        return {"schema": d.pop("schema"), **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Report:
        """Read back :meth:`to_dict` (a null number becomes NaN); ValueError when ``d`` is not a report."""
        if d.get("schema") != REPORT_SCHEMA:
            raise ValueError(f"not a {REPORT_SCHEMA} report (schema={d.get('schema')!r})")
        return _load(cls, d)


_NESTED: dict[tuple[type, str], tuple[type, bool]] = {
    (Report, "capabilities"): (CapabilityView, True),
    (Report, "audit"): (AuditView, False),
    (Report, "training_log"): (TrainingLogView, False),
    (CapabilityView, "qualifiers"): (Qualifier, True),
    (CapabilityView, "attribution"): (AttributionView, False),
    (AttributionView, "profile"): (ScoreProfile, False),
    (AttributionView, "clusters"): (ClusterView, True),
    (AttributionView, "drilldown"): (DrilldownView, True),
    (AuditView, "findings"): (FindingView, True),
}


def _load(cls: type, d: dict[str, Any] | None):
    if d is None:
        return None
    kw = {}
    for f in fields(cls):
        if f.name not in d:
            continue
        v = d[f.name]
        if v is None and f.type == "float":
            v = float("nan")  # the JSON writes an undefined number as null
        nested = _NESTED.get((cls, f.name))
        if nested and v is not None:
            sub, many = nested
            v = [_load(sub, x) for x in v] if many else _load(sub, v)
        kw[f.name] = v
    return cls(**kw)


def support_marks(row: dict[str, Any]) -> str:
    """``"gradient, lexical"``: the kinds of evidence that put this row in their own top 10%."""
    sup = row.get("support") or {}
    return ", ".join(k for k in EVIDENCE_KINDS if (sup.get(k) or {}).get("supports")) or "—"


def training_setup_rows(manifest: dict[str, Any]) -> tuple[list[tuple[str, str, str]], list[str]]:
    """``([(field, value, where it came from)], [what is not reproduced])`` of ``manifest["training_setup"]``.

    Both lists are empty for a run written before the setup was recorded (or a damaged entry).
    """
    ts = manifest.get("training_setup")
    if not isinstance(ts, dict) or not isinstance(ts.get("values"), dict):
        return [], []
    rows = []
    for k, v in ts["values"].items():
        if isinstance(v, dict):
            val = v.get("value")
            rows.append((str(k), "none" if val is None else str(val), str(v.get("from") or "?")))
    notes = [str(n) for n in ts.get("notes") or [] if isinstance(n, str)]
    notes += [str(w) for w in ts.get("warnings") or [] if isinstance(w, str)]
    return rows, notes


def flatten(d: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """``[(dotted.key, leaf)]`` of a nested dict (lists kept as leaves), in key order."""
    if not isinstance(d, dict) or not d:
        return [(prefix, d)] if prefix else []
    out: list[tuple[str, Any]] = []
    for k, v in d.items():
        out += flatten(v, f"{prefix}.{k}" if prefix else str(k))
    return out


def verification_legend(v: dict[str, Any]) -> str:
    """What ``gradian verify`` retrained, naming only the retrains that ran (``v``: run.json's ``verification``)."""
    kinds: dict[str, int] = {}
    for r in (v.get("retrains") or {}).values():
        k = str(((r or {}).get("retrain") or {}).get("kind", "?"))
        kinds[k] = kinds.get(k, 0) + 1
    trainer = str((v.get("trainer") or {}).get("trainer", "?"))
    parts = ["without the blamed rows"]
    n_ctrl, n_seed, n_lds = kinds.get("control", 0), kinds.get("seed", 0), kinds.get("lds", 0)
    if n_ctrl:
        parts.append(f"without as many random rows ({n_ctrl} control{'s' if n_ctrl != 1 else ''})")
    if n_seed:
        parts.append(f"on the unchanged data with {n_seed} other seed{'s' if n_seed != 1 else ''}")
    if n_lds:
        parts.append(f"on {n_lds} random half-subsets (LDS)")
    text = f"Retrained with {trainer} " + ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]
    text += "; each compared with the tuned adapter on the same eval items (paired bootstrap)."
    missing = []
    if not n_seed:
        missing.append("no seed retrain ran (--seed-band 0): the noise of retraining itself is not measured")
    if not n_ctrl:
        missing.append("no control retrain ran (--controls 0)")
    if missing:
        text += " Not run: " + "; ".join(missing) + "."
    return text


def verify_word(cap: dict[str, Any]) -> str:
    """``verified`` / ``verified without a seed band`` / ``not verified`` for one capability's verify record."""
    if not cap.get("verified"):
        return "not verified"
    if cap.get("seed_retrains") == 0 or str(cap.get("line", "")).startswith("verified without a seed band"):
        return "verified without a seed band"
    return "verified"


def recovery_text(recovery: Any, ci: Any) -> str:
    """A recovery share and its CI as every verify table shows it: ``80% [50%, 100%]*``.

    The CI's ends are clipped to [0%, 100%] (what removing rows can bring back); ``*`` marks a CI the
    bootstrap drew outside that range (the verify line gives the raw range).
    """
    import math

    def pct(x: Any) -> str:
        return f"{x:.0%}" if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"

    lo, hi = (list(ci) + [float("nan")] * 2)[:2] if isinstance(ci, (list, tuple)) else (float("nan"),) * 2
    ok = all(isinstance(x, (int, float)) and math.isfinite(x) for x in (lo, hi))
    if not ok:
        return f"{pct(recovery)} [n/a]"
    clo, chi = min(max(lo, 0.0), 1.0), min(max(hi, 0.0), 1.0)
    return f"{pct(recovery)} [{pct(clo)}, {pct(chi)}]" + ("*" if (clo, chi) != (lo, hi) else "")
