"""Renderers: terminal (rich), Markdown and JSON for results, and the check list (text, md, json).

``docs/checks.md`` is :func:`checks_markdown` verbatim (a test keeps them equal).
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.markup import escape

from gradian.audit.model import SEVERITIES, AuditResult, Finding
from gradian.audit.registry import RANK_NAMES as _RANK_NAMES
from gradian.audit.registry import STAGE_KINDS, CheckSpec, all_checks, stage_words
from gradian.tables import FitTable

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def _ids_preview(xs: list, k: int = 8) -> str:
    if not xs:
        return ""
    head = ", ".join(str(x) for x in xs[:k])
    return head + (f", ... (+{len(xs) - k})" if len(xs) > k else "")


def _evidence_line(f: Finding) -> str:
    ev = f.evidence
    parts = []
    if "value" in ev and "threshold" in ev:
        parts.append(f"measured {ev['value']} vs threshold {ev['threshold']}")
    for k, v in ev.items():
        if k in ("value", "threshold") or isinstance(v, (list, dict)):
            continue
        parts.append(f"{k}={v}")
    return "; ".join(parts)


def render_text(result: AuditResult, console: Console, verbose: bool = False) -> None:
    """Findings grouped by severity (already in fix-first order), then skipped checks and a summary line."""
    c = result.counts
    for sev in SEVERITIES:
        group = [f for f in result.findings if f.severity == sev]
        if not group:
            continue
        console.print(f"\n[{_STYLE[sev]}]{sev.upper()}S ({len(group)})[/]")
        for f in group:
            console.print(f"[{_STYLE[sev]}]{f.id}[/] [bold]{escape(f.name)}[/]: {escape(f.message)}", soft_wrap=False)
            ev = _evidence_line(f)
            if ev:
                console.print(f"    evidence: {escape(ev)}", style="dim")
            if f.row_ids:
                console.print(f"    rows ({len(f.row_ids)}): {escape(_ids_preview(f.row_ids))}", style="dim")
            if f.eval_row_ids:
                console.print(
                    f"    eval rows ({len(f.eval_row_ids)}): {escape(_ids_preview(f.eval_row_ids))}", style="dim"
                )
            if f.steps:
                console.print(f"    steps: {escape(_ids_preview(f.steps))}", style="dim")
            console.print(f"    fix: {escape(f.fix)}", style="green")
    if result.skipped:
        console.print(f"\n[dim]SKIPPED ({len(result.skipped)})[/]")
        if verbose:
            for s in result.skipped:
                console.print(f"  [dim]{s.id} {escape(s.name)}: {escape(s.reason)}[/]")
        else:
            by_reason: dict[str, list[str]] = {}
            for s in result.skipped:
                by_reason.setdefault(s.reason, []).append(s.id)
            for reason, ids in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
                console.print(f"  [dim]{escape(reason)}: {escape(', '.join(ids))}[/]")
    for n in result.notes:
        console.print(f"[dim]note: {escape(n)}[/]")
    console.print(
        f"\n[bold]{c['error']} errors, {c['warning']} warnings, {c['info']} info[/] "
        f"from {c['checks'] - c['skipped']} checks run ({c['passed']} passed, {c['skipped']} skipped)"
    )


def render_markdown(result: AuditResult) -> str:
    """The audit result as Markdown (the ``--format md`` report)."""
    c = result.counts
    out = [
        "# gradian diagnose",
        "",
        f"**{c['error']} errors, {c['warning']} warnings, {c['info']} info** from {c['checks'] - c['skipped']} "
        f"checks run ({c['passed']} passed, {c['skipped']} skipped).",
        "",
    ]
    for sev in SEVERITIES:
        group = [f for f in result.findings if f.severity == sev]
        if not group:
            continue
        out += [f"## {sev.capitalize()}s ({len(group)})", ""]
        for f in group:
            out.append(f"### {f.id} {f.name}: {f.title}")
            out.append("")
            out.append(_md_escape(f.message))
            out.append("")
            ev = _evidence_line(f)
            if ev:
                out.append(f"- evidence: {_md_escape(ev)}")
            if f.row_ids:
                out.append(f"- rows ({len(f.row_ids)}): {_md_escape(_ids_preview(f.row_ids, 20))}")
            if f.eval_row_ids:
                out.append(f"- eval rows ({len(f.eval_row_ids)}): {_md_escape(_ids_preview(f.eval_row_ids, 20))}")
            if f.steps:
                out.append(f"- steps: {_ids_preview(f.steps, 20)}")
            out.append(f"- fix: {_md_escape(f.fix)}")
            out.append("")
    if result.skipped:
        out += ["## Skipped", "", "| id | check | reason |", "|---|---|---|"]
        out += [f"| {s.id} | {s.name} | {_md_escape(s.reason)} |" for s in result.skipped]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def render_json(result: AuditResult) -> str:
    """The audit result as indented JSON (the ``--format json`` report)."""
    return json.dumps(result.to_dict(), indent=2, sort_keys=False, ensure_ascii=False) + "\n"


def _md_escape(s: str) -> str:
    """Table-safe Markdown text, without control or bidi characters (:func:`gradian.report.safe.clean`)."""
    from gradian.report.safe import clean

    return clean(s).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


# ---------------------------------------------------------------------- the check list
def checks_table(console: Console, checks: list[CheckSpec] | None = None) -> None:
    """Print the check list (all registered checks by default) as a table."""
    checks = checks or all_checks()
    t = FitTable(title=f"{len(checks)} checks", show_lines=False, heading_columns=2)
    for col in ("id", "name", "reads", "max severity"):
        t.add_column(col, no_wrap=True)
    t.add_column("title")
    for c in checks:
        t.add_row(c.id, c.name, "+".join(c.reads) or "-", c.severity, c.title)
    console.print(t)


def checks_json(checks: list[CheckSpec] | None = None) -> str:
    """The check list (all registered checks by default) as JSON."""
    checks = checks or all_checks()
    return json.dumps([_spec_dict(c) for c in checks], indent=2) + "\n"


def _spec_dict(c: CheckSpec) -> dict[str, Any]:
    return {
        "id": c.id,
        "name": c.name,
        "title": c.title,
        "group": c.group,
        "requires": list(c.requires),
        "reads": list(c.reads),
        "severity": c.severity,
        "rule": c.rule,
        "fix": c.fix,
        "source": c.source,
        "rank": c.rank,
        "stages": list(c.stages),
    }


def checks_markdown(checks: list[CheckSpec] | None = None) -> str:
    """The text of docs/checks.md, generated from the registry."""
    checks = checks or all_checks()
    out = [
        "# Audit checks",
        "",
        "<!-- GENERATED by `gradian diagnose --list --format md` from the check registry "
        "(src/gradian/audit). Do not edit by hand; tests/audit keeps this file equal to the generated text. -->",
        "",
        f"`gradian diagnose` runs {len(checks)} deterministic checks over the training data, the eval set, the "
        "training config, the tokenizer and the trainer logs. No GPU and no model weights are needed. A check "
        "whose input is not given is reported as skipped, with the reason.",
        "",
        "Ids are stable: **D** reads the data, **C** the config, **T** the tokenizer and chat template, "
        "**L** the logs. *Max severity* is the worst a check can report; most checks grade their severity by the "
        "measured value (see each rule). **H** marks a heuristic threshold that no single source backs. Findings "
        "are ordered by severity, then by the fix-first rank below, then by the share of rows affected.",
        "",
        "| rank | meaning |",
        "|---|---|",
    ]
    out += [f"| {r} | {m} |" for r, m in sorted(_RANK_NAMES.items())]
    out += ["", "| id | name | reads | max severity | title |", "|---|---|---|---|---|"]
    out += [
        f"| [{c.id}](#{c.id.lower()}-{c.name.replace('_', '-')}) | `{c.name}` | {', '.join(c.reads)} | "
        f"{c.severity} | {_md_escape(c.title)} |"
        for c in checks
    ]
    out.append("")
    for c in checks:
        out += [
            f"## {c.id} {c.name}",
            "",
            f"**{_md_escape(c.title)}**",
            "",
            f"- needs: {', '.join('--' + r for r in c.requires) or 'any of --data / --config'}",
            f"- reads: {', '.join(c.reads)}",
            f"- max severity: {c.severity}; fix-first rank {c.rank} ({_RANK_NAMES[c.rank]})",
            *(
                [f"- applies to: {stage_words(c.stages)} runs (skipped, with the reason, for other training stages)"]
                if c.stages != STAGE_KINDS
                else []
            ),
            f"- rule: {_md_escape(c.rule)}",
            f"- fix: {_md_escape(c.fix)}",
            f"- source: {_md_escape(c.source)}",
            "",
        ]
    return "\n".join(out).rstrip() + "\n"
