"""The terminal report (rich): the summary first, details on request, the manifest last.

Data strings are never parsed as rich markup: they are placed in
:class:`rich.text.Text` objects after :func:`gradian.report.safe.clean`, which
removes control characters (so no terminal escape sequence from a training row
reaches the terminal). :func:`render_text` renders the same to plain text
(``gradian report --format text``).
"""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gradian.report.safe import clean, one_line
from gradian.report.svg import fmt_num, fmt_pct, fmt_score, fmt_verdict
from gradian.report.views import SUMMARY_CLUSTERS, VERDICT_SCORE_LABEL, Report, training_setup_rows
from gradian.sign import VERDICT_SCORE_UNIT
from gradian.tables import FitTable

_LEVEL = {"ok": ("✓", "green"), "caution": ("!", "yellow"), "warning": ("⚠", "bold red")}
_VERDICT = {"regressed": "bold red", "improved": "green", "within_noise": "dim"}
_SEV = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def _t(*parts: Any) -> Text:
    """A Text from (string, style) pairs or plain strings; strings are cleaned, never parsed as markup."""
    t = Text()
    for p in parts:
        if isinstance(p, tuple):
            t.append(clean(p[0]), style=p[1])
        else:
            t.append(clean(p))
    return t


def _hang(console: Console, prefix: Text, body: Text) -> None:
    """``prefix`` then ``body``, wrapped lines indented under the body (a hanging indent)."""
    grid = Table.grid(padding=(0, 0))
    grid.add_column(no_wrap=True)
    grid.add_column(ratio=1, overflow="fold")
    grid.add_row(prefix, body)
    console.print(grid)


def excerpt_text(x: dict[str, Any] | None) -> Text:
    """A listed row's completion (builders.excerpt): its harmful sentence whole, in bold red, with context."""
    x = x or {}
    if x.get("sentence") is None:
        return _t(one_line(x.get("before", ""), 400) + ("…" if x.get("cut_after") else ""))
    return _t(
        ("…" if x.get("cut_before") else "", "dim"),
        (one_line(x.get("before", ""), 200), "dim"),
        (one_line(x.get("sentence", ""), 400), "bold red"),
        (one_line(x.get("after", ""), 200), "dim"),
        ("…" if x.get("cut_after") else "", "dim"),
    )


def render_terminal(report: Report, console: Console, details: bool = False) -> None:
    """Print the report: summary (always), details (when ``details``), and the manifest line(s)."""
    r = report
    console.print(_t(("Gradian report", "bold"), f"  run {r.run_id}"))
    for i, h in enumerate(r.headline, start=1):
        _hang(console, _t((f"{i:>2}. ", "bold")), _t(h))
    console.print()
    for c in r.capabilities:
        console.print(
            _t(
                (c.name, "bold"),
                " ",
                (c.verdict.replace("_", " "), _VERDICT.get(c.verdict, "")),
                f"  {fmt_score(c.reference_score, c.unit)} → {fmt_score(c.tuned_score, c.unit)}  Δ {c.delta:+.3f} "
                f"[{c.ci_low:+.3f}, {c.ci_high:+.3f}]  {c.n_lost} lost of {c.n}",
            )
        )
        for q in c.qualifiers:
            mark, style = _LEVEL.get(q.level, ("-", ""))
            _hang(console, _t("   ", (mark, style), " "), _t(q.text))
    fixes = r.finding_fixes()
    for c in r.capabilities:
        a = c.attribution
        if a is None:
            continue
        console.print()
        if a.ranked:
            console.print(
                _t(("Most harmful rows: ", "bold"), (c.name, "bold"), (f"  (score: {VERDICT_SCORE_UNIT})", "dim"))
            )
            for x in a.ranked[:5]:
                _hang(
                    console,
                    _t(
                        f"  {x.get('rank'):>2}. ",
                        (one_line(x.get("id"), 40), "cyan"),
                        " ",
                        (fmt_verdict(x.get("verdict_score")), "bold"),
                        " ",
                    ),
                    excerpt_text(x.get("excerpt")),
                )
            if a.blamed:
                console.print(
                    _t(
                        f"   blamed: {len(a.blamed)} row{'s' if len(a.blamed) != 1 else ''} "
                        f"({fmt_pct(a.profile.tail_mass)} of the harmful score), what gradian verify removes"
                    )
                )
        console.print(_t(("Top harmful clusters: ", "bold"), (c.name, "bold")))
        if not a.clusters:
            console.print(_t("   no training row has a negative score: the data does not explain it"))
        for cl in a.clusters[:SUMMARY_CLUSTERS]:
            console.print(
                _t(
                    ("   #" + str(cl.label), "bold"),
                    f" {cl.size} row{'s' if cl.size != 1 else ''} from rank {cl.best_rank}, "
                    f"{fmt_pct(cl.harmful_share)} of the harmful score",
                )
            )
            for e in cl.explanations:
                fx = fixes.get(e.get("finding"))
                _hang(
                    console,
                    _t("      · "),
                    _t(
                        (e["text"], "yellow" if e["source"] == "audit" else ""),
                        (f"  fix: {one_line(fx, 160)}" if fx else "", "green"),
                    ),
                )
            if not cl.explanations:
                words = ", ".join(w["word"] for w in (cl.common.get("distinctive_words") or [])[:6])
                _hang(
                    console,
                    _t("      · "),
                    _t(
                        "no audit finding explains these rows: their content is the likely cause",
                        f" (shared words: {words})" if words else "",
                    ),
                )
            if cl.exemplars:
                e = cl.exemplars[0]
                _hang(
                    console,
                    _t("      e.g. "),
                    _t(
                        (one_line(e.get("id"), 60), "cyan"),
                        f" {fmt_verdict(e.get('verdict_score'))}: ",
                        (one_line(e.get("completion"), 100), "dim"),
                    ),
                )
        more = len(a.clusters) - SUMMARY_CLUSTERS
        if more > 0:
            console.print(_t(f"   ({more} more cluster{'s' if more != 1 else ''}: see the details)"))
    if details:
        _details(r, console)
    console.print()
    m = r.manifest
    ident = m.get("identity") or {}
    ds = (ident.get("dataset") or {}) if isinstance(ident.get("dataset"), dict) else {}
    vers = ident.get("versions") or {}
    console.print(
        _t(
            ("manifest", "bold"),
            f": run {r.run_id}, index {ident.get('index_id')}, data ",
            f"{ds.get('name', '?')}@{str(ds.get('sha256', ''))[:12]}, ",
            ", ".join(f"{k} {v}" for k, v in vers.items()) if isinstance(vers, dict) else "",
        )
    )
    setup_rows, setup_notes = training_setup_rows(m)
    if setup_rows:
        shown = [
            f"{k} {v} ({one_line(src, 120)})" for k, v, src in setup_rows if k in ("max_length", "loss_on", "trainer")
        ]
        console.print(_t(("training setup", "bold"), ": ", one_line(", ".join(shown), 600)))
        for n in setup_notes:
            console.print(_t(("  not reproduced / warning: ", "yellow"), one_line(n, 300)))
    if m.get("sign_convention"):
        console.print(_t(("sign: ", "dim"), (m["sign_convention"], "dim")))


def _details(r: Report, console: Console) -> None:
    for c in r.capabilities:
        a = c.attribution
        if a is None:
            continue
        console.print()
        p = a.profile
        console.print(_t((f"{c.name}: details", "bold")))
        console.print(
            _t(
                f"   {p.n_negative} of {p.n} rows degraded it; the harmful tail ({p.tail_n} rows) holds "
                f"{fmt_pct(p.tail_mass)} of the harmful score; scores ({VERDICT_SCORE_UNIT}) min {fmt_verdict(p.min)}, "
                f"median {fmt_verdict(p.median)}, max {fmt_verdict(p.max)}"
            )
        )
        if a.ranked:
            t = FitTable(title=_t(f"most harmful training rows for {c.name}"), show_lines=False, heading_columns=2)
            cols = ("rank", "row", VERDICT_SCORE_LABEL, "raw influence", "Δloss if removed", "tokens", "cluster")
            for col in (*cols, "audit", "completion (harmful sentence in bold)"):
                t.add_column(col, overflow="fold")
            for x in a.ranked[:10]:
                t.add_row(
                    str(x.get("rank")),
                    _t(one_line(x.get("id"), 40)),
                    fmt_verdict(x.get("verdict_score")),
                    fmt_num(x.get("score")),
                    fmt_num(x.get("predicted_loss_delta_if_removed")),
                    f"{x.get('tokens')}{' (trunc.)' if x.get('truncated') else ''}",
                    f"#{x['cluster']}" if x.get("cluster") is not None else "",
                    _t(", ".join(x.get("flags") or [])),
                    excerpt_text(x.get("excerpt")),
                )
            console.print(t)
        for d in a.drilldown[:5]:
            s0 = d.sentences[0] if d.sentences else {}
            console.print(
                _t(
                    "   row ",
                    (one_line(d.id, 40), "cyan"),
                    f" {fmt_verdict(d.verdict_score)}: most harmful sentence ",
                    (f"“{one_line(s0.get('text'), 120)}”", "bold red"),
                    f" (score {fmt_verdict(s0.get('verdict_score'))}; raw {fmt_num(s0.get('score'))}) of "
                    f"{len(d.sentences)}",
                )
            )
        for f in a.failing_items[:10]:
            console.print(
                _t(
                    "   item ",
                    (one_line(f.get("id"), 40), "cyan"),
                    ": expected ",
                    (one_line(f.get("answer"), 40), "green"),
                    ", said ",
                    (one_line(f.get("tuned_answer"), 40), "red"),
                    f", base margin {fmt_num(f.get('margin'))} nats" if f.get("margin") is not None else "",
                    f" (still passes; weakened {fmt_num(f.get('shift_nats'))} nats)"
                    if f.get("kind") == "weakened"
                    else "",
                )
            )
    if r.audit is not None:
        console.print()
        k = r.audit.counts
        console.print(
            _t(
                ("Audit", "bold"),
                f": {k.get('error', 0)} errors, {k.get('warning', 0)} warnings, {k.get('info', 0)} info",
            )
        )
        for f in r.audit.findings:
            _hang(
                console,
                _t("   ", (f"{f.id:<4}", _SEV.get(f.severity, "")), " "),
                _t((f.name, "bold"), ": ", one_line(f.message, 220)),
            )
            _hang(console, _t("        "), _t(("fix: ", "green"), (one_line(f.fix, 200), "green")))
    lg = r.training_log
    if lg is not None:
        console.print()
        if lg.loss:
            console.print(
                _t(
                    ("Training log", "bold"),
                    f": loss {fmt_num(lg.loss[0][1])} (step {lg.loss[0][0]}) → "
                    f"{fmt_num(lg.loss[-1][1])} (step {lg.loss[-1][0]})",
                )
            )
        else:
            console.print(_t(("Training log", "bold"), f": {lg.note or lg.status}"))
        for an in lg.anomalies:
            console.print(
                _t(
                    "   ",
                    (an["check"], _SEV.get(an["severity"], "")),
                    f" {an['name']} at steps ",
                    ", ".join(str(s) for s in an["steps"][:12]),
                    ": ",
                    one_line(an["message"], 200),
                )
            )
    for n in r.notes:
        console.print(_t(("note: ", "dim"), (one_line(n, 300), "dim")))


def render_text(report: Report, width: int = 110, details: bool = True) -> str:
    """The terminal report as plain text (no colour, no escape sequences)."""
    buf = io.StringIO()
    console = Console(
        file=buf,
        width=width,
        force_terminal=False,
        color_system=None,
        no_color=True,
        highlight=False,
        emoji=False,
        soft_wrap=False,
    )
    render_terminal(report, console, details=details)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"
