"""The Markdown report (for a pull request or an issue): same order as the HTML page, no plots.

Every string from the run goes through :func:`gradian.report.safe.md_text`
(control characters removed, HTML characters turned into entities, Markdown
syntax characters backslash-escaped, one line), so training text cannot add a
link, an image, HTML, a heading or a table cell. Long texts are shortened.
The capability deltas are drawn as a text bar so the CI is visible without the
HTML page.
"""

from __future__ import annotations

import json
import math
from typing import Any

from gradian.report.safe import md_text
from gradian.report.svg import fmt_num, fmt_pct, fmt_score, fmt_verdict
from gradian.report.views import (
    HARMFUL_ROW_COLUMNS,
    SUMMARY_CLUSTERS,
    VERIFY_COLUMNS,
    Report,
    flatten,
    recovery_text,
    support_marks,
    training_setup_rows,
    verification_legend,
)
from gradian.sign import VERDICT_SCORE_DOC, VERDICT_SCORE_UNIT

_MARK = {"ok": "✓", "caution": "!", "warning": "⚠"}


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(c if c else " " for c in cells) + " |"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return [_row(head), "|" + "|".join("---" for _ in head) + "|"] + [_row(r) for r in rows] + [""]


def ci_bar(lo: float, hi: float, delta: float, lo_axis: float, hi_axis: float, width: int = 31) -> str:
    """A text CI: ``├──●──┤`` placed on a ``width``-character axis, ``┊`` at zero."""
    if not all(math.isfinite(v) for v in (lo, hi, delta)) or hi_axis <= lo_axis:
        return ""

    def pos(v: float) -> int:
        return max(0, min(width - 1, int(round((v - lo_axis) / (hi_axis - lo_axis) * (width - 1)))))

    cells = [" "] * width
    z = pos(0.0)
    cells[z] = "┊"
    a, b = pos(lo), pos(hi)
    for i in range(a, b + 1):
        cells[i] = "─"
    cells[a], cells[b] = "├", "┤"
    cells[pos(delta)] = "●"
    return "`" + "".join(cells) + "`"


def render_markdown(report: Report) -> str:
    """The report as Markdown: summary, per-capability verdicts and attribution, audit, manifest."""
    r = report
    out: list[str] = [f"# Gradian report: run {md_text(r.run_id)}", ""]
    out += ["## Summary", ""]
    out += [f"{i}. {md_text(h, 1500)}" for i, h in enumerate(r.headline, start=1)] + [""]
    if r.stopped:
        out += [f"**Stopped after Evaluate:** {md_text(r.stopped, 500)}", ""]
    out += ["### Verdict per capability, and how sure", ""]
    vals = [v for c in r.capabilities for v in (c.ci_low, c.ci_high, 0.0) if math.isfinite(v)]
    lo_axis, hi_axis = (min(vals), max(vals)) if vals else (-1.0, 1.0)
    pad = 0.05 * ((hi_axis - lo_axis) or 1.0)
    rows = []
    for c in r.capabilities:
        rows.append(
            [
                f"**{md_text(c.name, 80)}**",
                md_text(c.verdict.replace("_", " ")),
                f"{fmt_score(c.reference_score, c.unit)} → {fmt_score(c.tuned_score, c.unit)}",
                f"{c.delta:+.3f} [{c.ci_low:+.3f}, {c.ci_high:+.3f}]",
                ci_bar(c.ci_low, c.ci_high, c.delta, lo_axis - pad, hi_axis + pad) if c.unit == "accuracy" else "",
                f"{c.n_lost} lost / {c.n}",
            ]
        )
    out += _table(
        [
            "capability",
            "verdict",
            "reference → tuned",
            f"Δ [{r.capabilities[0].confidence * 100:g}% CI]" if r.capabilities else "Δ",
            "CI (┊ = 0)",
            "items",
        ],
        rows,
    )
    for c in r.capabilities:
        out.append(f"**{md_text(c.name, 80)}**")
        out.append("")
        out += [f"- {_MARK.get(q.level, '-')} {md_text(q.text, 1000)}" for q in c.qualifiers]
        out.append("")
    fixes = r.finding_fixes()
    for c in r.capabilities:
        a = c.attribution
        if a is None:
            continue
        if a.ranked:
            out += [f"### Top of the ranking: {md_text(c.name, 80)}", ""]
            for x in a.ranked[:5]:
                cl_txt = f", cluster \\#{x['cluster']}" if x.get("cluster") is not None else ""
                out.append(
                    f"{x.get('rank')}. {md_text(x.get('id'), 60)}: **{fmt_verdict(x.get('verdict_score'))}**{cl_txt}: "
                    + excerpt_markdown(x.get("excerpt"))
                )
            out += ["", f"Scores: {md_text(VERDICT_SCORE_DOC, 400)}.", ""]
        out += [f"### Top harmful clusters: {md_text(c.name, 80)}", ""]
        if not a.clusters:
            out += [
                f"No training row has a negative score for {md_text(c.name, 80)}: the data does not explain it.",
                "",
            ]
        for cl in a.clusters[:SUMMARY_CLUSTERS]:
            out.append(
                f"- **Cluster \\#{cl.label}**: {cl.size} row{'s' if cl.size != 1 else ''} from rank {cl.best_rank}, "
                f"{fmt_pct(cl.harmful_share)} of the harmful score"
            )
            if cl.explanations:
                for e in cl.explanations:
                    fx = fixes.get(e.get("finding"))
                    out.append(f"  - {md_text(e['text'], 400)}" + (f" (fix: {md_text(fx, 300)})" if fx else ""))
            else:
                words = ", ".join(w["word"] for w in (cl.common.get("distinctive_words") or [])[:6])
                out.append(
                    "  - no audit finding explains these rows: their content is the likely cause"
                    + (f" (words they share: {md_text(words, 300)})" if words else "")
                )
            if cl.exemplars:
                e = cl.exemplars[0]
                out.append(f"  - e.g. {md_text(e.get('id'), 60)}: {md_text(e.get('completion'), 160)}")
        more = len(a.clusters) - SUMMARY_CLUSTERS
        if more > 0:
            out.append(f"- {more} more cluster{'s' if more != 1 else ''} in the details")
        out.append("")

    out += verification_markdown(r)
    out += ["## Details", ""]
    for c in r.capabilities:
        a = c.attribution
        if a is None:
            continue
        p = a.profile
        out += [
            f"### {md_text(c.name, 80)}: what the data did",
            "",
            f"{a.n_failing} failing item(s) scored over {a.n_train} training rows with {md_text(a.engine, 40)}"
            + (f" (agreement checked against {md_text(a.engines[1], 40)})" if len(a.engines) > 1 else "")
            + ". "
            f"{p.n_negative} of {p.n} rows degraded the capability; the harmful tail ({p.tail_n} rows) holds "
            f"{fmt_pct(p.tail_mass)} of the harmful score (scores, {VERDICT_SCORE_UNIT}: min {fmt_verdict(p.min)}, "
            f"median {fmt_verdict(p.median)}, max {fmt_verdict(p.max)}).",
            "",
        ]
        if a.clusters:
            rows = []
            for cl in a.clusters:
                words = ", ".join(w["word"] for w in (cl.common.get("distinctive_words") or [])[:6])
                mech = []
                for key, label in (("truncated", "truncated"), ("missing_eos", "missing EOS")):
                    m = cl.mechanics.get(key) or {}
                    src = m.get("source")
                    mech.append(
                        f"{fmt_pct(m.get('share'))} {label}" + (f" ({src})" if src and src != "attribute" else " \\*")
                    )
                ex = "; ".join(e["text"] for e in cl.explanations) or "none"
                rows.append(
                    [
                        f"\\#{cl.label}",
                        str(cl.size),
                        fmt_pct(cl.harmful_share),
                        ", ".join(mech),
                        md_text(words, 120),
                        md_text(ex, 300),
                    ]
                )
            out += _table(
                ["cluster", "rows", "harmful share", "mechanics", "distinctive words", "audit explains"], rows
            )
        if a.ranked:
            rows = [
                [
                    str(x.get("rank")),
                    f"{md_text(x.get('id'), 60)}",
                    f"**{fmt_verdict(x.get('verdict_score'))}**",
                    fmt_num(x.get("score")),
                    fmt_num(x.get("predicted_loss_delta_if_removed")),
                    f"{x.get('tokens')}{' (truncated)' if x.get('truncated') else ''}",
                    f"\\#{x['cluster']}" if x.get("cluster") is not None else "",
                    md_text(", ".join(x.get("flags") or [])),
                    support_marks(x),
                    excerpt_markdown(x.get("excerpt")),
                ]
                for x in a.ranked
            ]
            out += ["#### Most harmful training rows", ""]
            out += _table(
                list(HARMFUL_ROW_COLUMNS),
                rows,
            )
        if a.drilldown:
            out += ["#### Which sentence did it", ""]
            for d in a.drilldown:
                parts = []
                for seg in d.segments:
                    t = md_text(seg["text"], 400)
                    if not t:
                        continue
                    parts.append(f"**{t}**" if seg["sentence"] == 0 else t)
                s0 = d.sentences[0] if d.sentences else {}
                item_note = f" ({md_text(d.item_note, 120)})" if d.item_note else ""
                out.append(
                    f"- {md_text(d.id, 60)} (score {fmt_verdict(d.verdict_score)}, against item "
                    f"{md_text(d.item_id, 60)}{item_note}): most harmful sentence, score "
                    f"{fmt_verdict(s0.get('verdict_score'))} "
                    f"(raw {fmt_num(s0.get('score'))}), in bold: " + " ".join(parts)
                )
            out.append("")
        if a.failing_items:
            rows = []
            for f in a.failing_items:
                pr = f.get("prompt")
                if isinstance(pr, list):
                    pr = " / ".join(str(m.get("content", "")) for m in pr if isinstance(m, dict))
                rows.append(
                    [
                        f"{md_text(f.get('id'), 60)}",
                        md_text(pr, 120),
                        md_text(f.get("answer"), 80),
                        md_text(f.get("tuned_answer") if f.get("tuned_answer") is not None else "(loglik)", 80),
                        f"still passes; weakened {fmt_num(f.get('shift_nats'))}"
                        if f.get("kind") == "weakened"
                        else (fmt_num(f.get("margin")) if f.get("margin") is not None else "n/a")
                        + (" (thin)" if f.get("thin_margin") else ""),
                    ]
                )
            out += ["#### Failing items (the queries)", ""]
            out += _table(["item", "prompt", "correct answer", "tuned model said", "base margin (nats)"], rows)
    if r.audit is None:
        out += [
            "### Audit",
            "",
            "The Audit lane did not run (no --config or --logs were given); run `gradian diagnose`.",
            "",
        ]
    else:
        k = r.audit.counts
        out += [
            "### Audit findings",
            "",
            f"{k.get('error', 0)} errors, {k.get('warning', 0)} warnings, {k.get('info', 0)} info; "
            f"{len(r.audit.passed)} checks passed, {len(r.audit.skipped)} skipped.",
            "",
        ]
        rows = []
        for f in r.audit.findings:
            aff = "; ".join(
                x for x in (f"{f.n_rows} rows" if f.n_rows else "", f"{f.n_steps} steps" if f.n_steps else "") if x
            )
            cl = ", ".join(f"{x['capability']} #{x['label']}" for x in f.clusters if x.get("explains"))
            rows.append(
                [
                    md_text(f.severity),
                    f"**{md_text(f.id)}** {md_text(f.name)}",
                    md_text(f.message, 300),
                    md_text(aff),
                    md_text(cl),
                    md_text(f.fix, 200),
                ]
            )
        if rows:
            out += _table(["severity", "check", "what was measured", "affects", "explains", "fix"], rows)
    lg = r.training_log
    if lg is not None:
        out += ["### Training log", ""]
        if lg.loss:
            first, last = lg.loss[0], lg.loss[-1]
            out.append(
                f"Train loss {fmt_num(first[1])} at step {first[0]} → {fmt_num(last[1])} at step {last[0]} "
                f"({len(lg.loss)} logged points; the curve is in the HTML report)."
            )
        if lg.note:
            out.append(f"Note: {md_text(lg.note, 500)}.")
        for an in lg.anomalies:
            steps = ", ".join(str(s) for s in an["steps"][:20]) + (" …" if len(an["steps"]) > 20 else "")
            out.append(
                f"- **{md_text(an['check'])}** {md_text(an['name'])} at step(s) {steps}: {md_text(an['message'], 300)}"
            )
        out.append("")
    for n in r.notes:
        out += [f"Note: {md_text(n, 500)}", ""]
    m = r.manifest
    out += [
        "## Manifest",
        "",
        f"Rendered from run {md_text(r.run_id)} ({md_text(r.run_schema)}); nothing was recomputed.",
        "",
    ]
    rows = []
    for k, v in flatten(m.get("identity") or {})[:300]:
        val = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
        rows.append([md_text(k, 120), md_text(val, 300)])
    out += _table(["identity field", "value"], rows)
    setup_rows, setup_notes = training_setup_rows(m)
    if setup_rows:
        out += ["Training setup (how the trainer tokenised the rows; the gradients use it):", ""]
        out += _table(
            ["field", "value", "from"], [[md_text(a, 60), md_text(b, 200), md_text(c, 300)] for a, b, c in setup_rows]
        )
        out += [f"- {md_text(n, 500)}" for n in setup_notes] + ([""] if setup_notes else [])
    out += [f"Sign convention: {md_text(m.get('sign_convention', ''), 500)}", ""]
    tm = ", ".join(f"{k} {v:.1f} s" for k, v in r.timing.items() if isinstance(v, (int, float)))
    if tm:
        out += [f"Timing: {md_text(tm)}", ""]
    return "\n".join(out).rstrip() + "\n"


def excerpt_markdown(x: dict[str, Any] | None) -> str:
    """A listed row's completion (builders.excerpt): its harmful sentence in bold, whole, with context."""
    x = x or {}
    if x.get("sentence") is None:
        return md_text(x.get("before", ""), 400) + ("…" if x.get("cut_after") else "")
    parts = [
        "…" if x.get("cut_before") else "",
        md_text(x.get("before", ""), 200),
        f"**{md_text(x.get('sentence', ''), 400)}**",
        md_text(x.get("after", ""), 200),
        "…" if x.get("cut_after") else "",
    ]
    return " ".join(p for p in parts if p).replace("… ", "…").replace(" …", "…")


def verification_markdown(r: Report) -> list[str]:
    """The ``gradian verify`` panel: per capability, each retrain against the tuned adapter."""
    v = r.verification
    if not v:
        return []
    out = [
        "## Verification",
        "",
        f"`gradian verify`: {md_text(verification_legend(v), 600)}",
        "",
    ]
    for name, cap in (v.get("capabilities") or {}).items():
        out += [f"**{md_text(name, 80)}**: {md_text(cap.get('line'), 400)}.", ""]
        rows = []
        for rname, x in (cap.get("retrains") or {}).items():
            ci = x.get("recovery_ci") or [float("nan"), float("nan")]
            rows.append(
                [
                    md_text(rname, 30),
                    str(x.get("removed")),
                    fmt_num(x.get("score")),
                    f"{fmt_num(x.get('delta'))} [{fmt_num(x.get('ci_low'))}, {fmt_num(x.get('ci_high'))}]",
                    recovery_text(x.get("recovery"), ci),
                    fmt_num(x.get("predicted_query_loss_change")),
                    fmt_num(x.get("measured_query_loss_change")),
                ]
            )
        out += _table(
            list(VERIFY_COLUMNS),
            rows,
        )
        if cap.get("lds"):
            out += [
                f"LDS over {cap['lds']['subsets']} random half-subsets: Spearman {fmt_num(cap['lds']['spearman'])}.",
                "",
            ]
    return out
