"""Joining attribution clusters with audit findings: which mechanical problem explains a cluster.

A harmful cluster is a set of training row ids (``cluster["row_ids"]``); a
row-level audit finding is another (``finding["row_ids"]``, e.g. every row
longer than ``max_length`` for D04). For a cluster C and a finding F with
rows R (both sets of ``Example.id``), with n the number of training rows:

* ``overlap = |C ∩ R|``
* ``cluster_share = overlap / |C|``     (how much of the cluster the finding covers)
* ``finding_share = overlap / |R|``     (how much of the finding sits in the cluster)
* ``dataset_share = |R| / n``           (how common the finding is overall)

and ``lift = cluster_share / dataset_share``. A finding that covers most of the
dataset says nothing about one cluster, so every kind needs ``lift ≥ 1.5``.
An explanation is reported when one of these holds (first match wins):

* ``holds_all``: ``|R| ≥ 2`` and ``finding_share = 1``: "this cluster holds every
  row that lacks EOS (check D06)";
* ``majority``: ``cluster_share ≥ 0.5``: "74% of this cluster's rows are
  truncated (check D04)";
* ``enriched``: ``overlap ≥ 2``, ``cluster_share ≥ 0.2`` and ``cluster_share ≥ 2 ·
  dataset_share``: "3 of this cluster's 12 rows are near-duplicates (check D12),
  against 4% of the whole dataset".

Rows the run never trained (C04: a ``max_steps`` that stopped inside the first epoch, named where the trainer's
sampler is reproduced) are said first whenever a cluster holds any (``untrained``), however common they are in the
dataset: "3 of its 12 rows were never trained (...) (check C04): their blame says what they would have done, not
what they did".

When the Audit lane did not run a row-level check (no config or logs were given
to ``gradian attribute``, or the check was skipped), the cluster's own
``common`` statistics from the Attribute lane (truncated share, missing-EOS
share, measured with the index's tokenisation) stand in, marked
``source="cluster"`` and without a check id. A check that ran and passed
suppresses the stand-in: Audit's verdict on those rows wins.
"""

from __future__ import annotations

from typing import Any, Iterable

#: Row predicates per row-level check: (plural, singular), e.g. "are truncated" / "is truncated".
ROW_PHRASES: dict[str, tuple[str, str]] = {
    "D01": ("use a different row schema than the rest", "uses a different row schema than the rest"),
    "D02": ("lack the trainer's text/messages field", "lacks the trainer's text/messages field"),
    "D03": ("have an empty target", "has an empty target"),
    "D04": ("are truncated", "is truncated"),
    "D05": ("have a prompt that fills the whole window", "has a prompt that fills the whole window"),
    "D06": ("lack EOS / end-of-turn", "lacks EOS / end-of-turn"),
    "D07": ("start with BOS twice", "starts with BOS twice"),
    "D08": ("hold special/template tokens inside their content", "holds special/template tokens inside its content"),
    "D09": ("have chat roles out of order", "has chat roles out of order"),
    "D10": ("lack the response template", "lacks the response template"),
    "D11": ("are exact duplicates", "is an exact duplicate"),
    "D12": ("are near-duplicates", "is a near-duplicate"),
    "D13": ("share a prompt with a different target", "shares a prompt with a different target"),
    "D14": ("appear verbatim in the eval set", "appears verbatim in the eval set"),
    "D15": ("nearly copy eval rows", "nearly copies an eval row"),
    "D16": ("already hold their target in the prompt", "already holds its target in the prompt"),
    "D17": ("have outlier target lengths", "has an outlier target length"),
    "D18": ("are in an unexpected language", "is in an unexpected language"),
    "D19": ("have merging prompt/target boundary tokens", "has merging prompt/target boundary tokens"),
    "D20": ("hold refusal boilerplate, HTML or mojibake", "holds refusal boilerplate, HTML or mojibake"),
    "C08": ("are trained with the loss on the prompt", "is trained with the loss on the prompt"),
    "C04": ("were never trained (the run stopped before it reached them)", "was never trained (the run stopped "
            "before it reached it)"),
}  # fmt: skip

#: Checks whose rows the run never trained: any of them in a cluster is said, however common they are (their
#: scores say what they would have done, not what they did), before any explanation.
UNTRAINED_CHECKS = ("C04",)

#: The cluster ``common`` fields that stand in for a check when Audit did not run it.
COMMON_STANDINS = (("truncated_share", "D04", "truncated"), ("missing_eos_share", "D06", "no_eos"))

MAJORITY = 0.5
MIN_LIFT = 1.5
ENRICHED_MIN_SHARE = 0.2
ENRICHED_RATIO = 2.0


def phrase(finding: dict[str, Any], plural: bool = True) -> str:
    """How a sentence about rows names an audit finding: "are truncated" (plural) or "is truncated".

    Checks without a phrase of their own fall back to "are flagged by “<title>”".
    """
    p = ROW_PHRASES.get(finding.get("id", ""))
    if p:
        return p[0] if plural else p[1]
    title = str(finding.get("title") or finding.get("name") or "this check").rstrip(".")
    return f"are flagged by “{title}”" if plural else f"is flagged by “{title}”"


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def explain_cluster(
    cluster: dict[str, Any],
    findings: Iterable[dict[str, Any]],
    n_train: int,
    checks_ran: set[str] | None,
) -> list[dict[str, Any]]:
    """Explanations of one cluster (see module docstring), strongest first.

    Args:
        cluster: an Attribute cluster dict (``row_ids``, ``size``, ``common``).
        findings: audit finding dicts (``id``, ``name``, ``severity``, ``row_ids``, ``fraction``).
        n_train: training rows in the run.
        checks_ran: ids of checks Audit ran (findings + passed), or None when Audit did not run.

    Returns:
        dicts ``{source, check, finding, name, severity, kind, overlap, size, finding_rows,
        cluster_share, finding_share, dataset_share, text}``; ``finding`` is the index of the
        finding in ``findings`` (None for a stand-in).
    """
    rows = set(cluster.get("row_ids") or [])
    size = len(rows)
    out: list[dict[str, Any]] = []
    if not size:
        return out
    seen_checks: set[str] = set()
    for fi, f in enumerate(findings):
        r = set(f.get("row_ids") or [])
        if not r:
            continue
        ov = len(rows & r)
        if not ov:
            continue
        cs, fs = ov / size, ov / len(r)
        ds = f.get("fraction")
        ds = float(ds) if isinstance(ds, (int, float)) else (len(r) / n_train if n_train else 0.0)
        cid = f.get("id", "")
        kind = None
        if cid in UNTRAINED_CHECKS:
            kind = "untrained"
            lead = "its only row" if size == 1 else f"{ov} of its {size} rows"
            whose = (
                "its blame says what it would have done, not what it"
                if ov == 1
                else "their blame says what they would have done, not what they"
            )
            text = f"{lead} {phrase(f, plural=ov > 1)} (check {cid}): {whose} did"
        elif ds > 0 and cs / ds < MIN_LIFT:
            continue  # as common in the whole dataset as in the cluster: not an explanation of it
        elif len(r) >= 2 and fs >= 1.0:
            kind = "holds_all"
            text = f"this cluster holds every row that {phrase(f, plural=False)} ({len(r)} rows; check {cid})"
            if cs < 1.0:
                text += f"; they are {_pct(cs)} of its {size} rows"
        elif cs >= MAJORITY:
            kind = "majority"
            if size == 1:
                text = f"its only row {phrase(f, plural=False)} (check {cid})"
            else:
                text = f"{_pct(cs)} of this cluster's rows ({ov}/{size}) {phrase(f)} (check {cid})"
        elif ov >= 2 and cs >= ENRICHED_MIN_SHARE and cs >= ENRICHED_RATIO * ds:
            kind = "enriched"
            text = (
                f"{ov} of this cluster's {size} rows {phrase(f)} (check {cid}), against {_pct(ds)} of the whole dataset"
            )
        if kind is None:
            continue
        seen_checks.add(cid)
        out.append(
            {
                "source": "audit",
                "check": cid,
                "finding": fi,
                "name": f.get("name"),
                "severity": f.get("severity"),
                "kind": kind,
                "overlap": ov,
                "size": size,
                "finding_rows": len(r),
                "cluster_share": cs,
                "finding_share": fs,
                "dataset_share": ds,
                "text": text,
            }
        )
    common = cluster.get("common") or {}
    for key, cid, name in COMMON_STANDINS:
        share = common.get(key)
        if not isinstance(share, (int, float)) or share < MAJORITY:
            continue
        if cid in seen_checks or (checks_ran is not None and cid in checks_ran):
            continue  # Audit ran the check: its verdict on these rows wins
        what = "are truncated" if key == "truncated_share" else "lack EOS / end-of-turn"
        why = "Audit did not run" if checks_ran is None else f"Audit skipped check {cid}"
        lead = (
            f"its only row {'is truncated' if key == 'truncated_share' else 'lacks EOS / end-of-turn'}"
            if size == 1
            else f"{_pct(share)} of this cluster's rows {what}"
        )
        out.append(
            {
                "source": "cluster",
                "check": None,
                "finding": None,
                "name": name,
                "severity": None,
                "kind": "majority",
                "overlap": round(share * size),
                "size": size,
                "finding_rows": None,
                "cluster_share": float(share),
                "finding_share": None,
                "dataset_share": None,
                "text": f"{lead} (measured by Attribute's tokenisation; {why}, so no check confirms it)",
            }
        )
    rank = {"untrained": -1, "holds_all": 0, "majority": 1, "enriched": 2}
    sev = {"error": 0, "warning": 1, "info": 2, None: 3}
    out.sort(key=lambda e: (rank[e["kind"]], -e["cluster_share"], sev.get(e["severity"], 3)))
    return out


def row_flags(findings: Iterable[dict[str, Any]]) -> dict[str, list[str]]:
    """``{row_id: [check ids that flagged it]}`` over row-level findings (in finding order)."""
    flags: dict[str, list[str]] = {}
    for f in findings:
        for r in f.get("row_ids") or []:
            lst = flags.setdefault(r, [])
            if f.get("id") not in lst:
                lst.append(f.get("id"))
    return flags


#: Config checks whose error means the training setup itself can explain a regression: learning rate
#: (C01, C02), epochs (C03), the loss mask (C08, C09). D04 (truncation) counts when it hits blamed rows.
SETUP_CHECKS = ("C01", "C02", "C03", "C08", "C09")


def setup_errors(findings: Iterable[dict[str, Any]], blamed_rows: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """The error-level audit findings that make a regression possibly mechanical (a setup problem, not the data).

    A finding counts when its severity is ``error`` and its id is in :data:`SETUP_CHECKS`, or it is D04 (rows
    truncated at max_length) and at least one of its rows is among ``blamed_rows`` (the rows the verdict ranks or
    clusters; None: any D04 error counts).

    Returns:
        ``[{"id", "title", "severity", "rows"}]`` in finding order; ``rows`` is the overlap with the blamed
        rows for D04, else None.
    """
    blamed = None if blamed_rows is None else set(blamed_rows)
    out: list[dict[str, Any]] = []
    for f in findings:
        if f.get("severity") != "error":
            continue
        cid = str(f.get("id") or "")
        rows = None
        if cid == "D04":
            hit = set(f.get("row_ids") or [])
            if blamed is not None:
                hit &= blamed
            if not hit:
                continue
            rows = len(hit)
        elif cid not in SETUP_CHECKS:
            continue
        title = str(f.get("title") or f.get("name") or cid).rstrip(".")
        out.append({"id": cid, "title": title, "severity": "error", "rows": rows})
    return out


def setup_error_names(errors: list[dict[str, Any]]) -> str:
    """``"C02: Learning rate far too high; D04: Rows longer than max_length, 5 of the blamed rows"``."""
    return "; ".join(
        f"{e['id']}: {e['title']}" + (f", {e['rows']} of the blamed rows" if e.get("rows") else "") for e in errors
    )
