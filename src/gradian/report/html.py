"""The self-contained HTML report: one file, inline CSS and inline SVG, no script, nothing fetched.

Every piece of run data is cleaned (:func:`gradian.report.safe.clean_tree`) and
then HTML-escaped: the page is built from :class:`markupsafe.Markup` templates
whose ``format`` escapes every argument that is not itself ``Markup``, so a
string from the data can never become markup. A Content-Security-Policy
(``default-src 'none'; style-src 'unsafe-inline'``) forbids scripts and any
fetch, as a second line of defence.

Layout: summary (headline, per-capability verdict and qualifiers, the CI plot,
the top harmful clusters with the audit findings that explain them), details
(per capability: score profile, cluster plot and table, most harmful rows,
sentence drill-down, failing items; audit findings; the training loss curve
with the log anomalies), and the manifest.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from markupsafe import Markup

from gradian.report import svg
from gradian.report.safe import clean, clean_tree, shorten
from gradian.report.views import (
    HARMFUL_ROW_COLUMNS,
    SUMMARY_CLUSTERS,
    VERDICT_SCORE_LABEL,
    VERIFY_COLUMNS,
    Report,
    recovery_text,
    support_marks,
    verification_legend,
    verify_word,
)
from gradian.sign import VERDICT_SCORE_DOC, VERDICT_SCORE_UNIT

M = Markup

CSS = """
:root{--ink:#212121;--mute:#616161;--line:#e0e0e0;--red:#c62828;--amber:#e65100;--green:#2e7d32;--blue:#1565c0;--bg:#fafafa}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
main{max-width:1120px;margin:0 auto;padding:24px 28px 60px}
h1{font-size:26px;margin:0 0 2px}
h2{font-size:21px;margin:36px 0 10px;border-bottom:2px solid var(--line);padding-bottom:4px}
h3{font-size:17px;margin:26px 0 8px}h4{font-size:15px;margin:16px 0 6px}
.sub{color:var(--mute);margin:0 0 12px}
code,pre,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:13px}
pre{background:#fff;border:1px solid var(--line);padding:10px;overflow:auto;white-space:pre-wrap;overflow-wrap:anywhere}
.headline{background:#fff;border:1px solid var(--line);border-left:5px solid var(--ink);
  padding:12px 18px 12px 32px;margin:10px 0 18px}
.headline li{margin:4px 0}
.card{background:#fff;border:1px solid var(--line);border-radius:6px;padding:12px 16px;margin:10px 0}
.badge{display:inline-block;border-radius:10px;padding:0 9px;font-size:12px;font-weight:600;color:#fff;
  vertical-align:1px}
.regressed{background:var(--red)}.improved{background:var(--green)}.within_noise{background:#757575}
.sev-error{background:var(--red)}.sev-warning{background:var(--amber)}.sev-info{background:#0277bd}
.q{list-style:none;padding-left:0;margin:6px 0}.q li{padding-left:24px;position:relative;margin:3px 0}
.q li:before{position:absolute;left:2px;font-weight:700}
.q .ok:before{content:"✓";color:var(--green)}.q .caution:before{content:"!";color:var(--amber)}
.q .warning:before{content:"⚠";color:var(--red)}
table{border-collapse:collapse;width:100%;background:#fff;margin:6px 0 12px;font-size:14px}
th,td{border:1px solid var(--line);padding:5px 8px;text-align:left;vertical-align:top}
th{background:#f5f5f5;font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.txt{white-space:pre-wrap;overflow-wrap:anywhere;word-break:break-word}
.expl{margin:4px 0 0;padding-left:20px}.expl li{margin:2px 0}
.check{font-weight:600}
.none{color:var(--mute);font-style:italic}
.plot{max-width:100%;height:auto;background:#fff;border:1px solid var(--line);border-radius:6px;margin:6px 0}
.sentences{background:#fff;border:1px solid var(--line);border-radius:6px;padding:10px 14px;line-height:1.9}
mark{border-radius:3px;padding:1px 2px;color:inherit}
mark.top{outline:2px solid var(--red);font-weight:600}
.legend{color:var(--mute);font-size:13px}
details summary{cursor:pointer;color:var(--blue)}
footer{color:var(--mute);font-size:13px;margin-top:40px}
"""

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"


def _join(parts: Iterable[Markup], sep: str = "") -> Markup:
    return M(sep).join(parts)


def _txt(s: Any, limit: int | None = None) -> Markup:
    s = clean(s)
    return M('<span class="txt">{}</span>').format(shorten(s, limit) if limit else s)


def _prompt_text(p: Any) -> str:
    if isinstance(p, list):
        return "\n".join(f"{m.get('role', '?')}: {m.get('content', '')}" for m in p if isinstance(m, dict))
    return "" if p is None else str(p)


def _table(head: list[str], rows: list[list[Markup]], num_cols: Iterable[int] = ()) -> Markup:
    nums = set(num_cols)
    h = _join(M("<th>{}</th>").format(x) for x in head)
    body = _join(
        M("<tr>{}</tr>").format(
            _join(M('<td class="num">{}</td>' if i in nums else "<td>{}</td>").format(c) for i, c in enumerate(r))
        )
        for r in rows
    )
    return M("<table><thead><tr>{}</tr></thead><tbody>{}</tbody></table>").format(h, body)


def _qualifiers(qs: list[Any]) -> Markup:
    return M('<ul class="q">{}</ul>').format(_join(M('<li class="{}">{}</li>').format(q.level, q.text) for q in qs))


def _explanations(cl: Any, fixes: dict[int, str]) -> Markup:
    if not cl.explanations:
        words = ", ".join(w["word"] for w in (cl.common.get("distinctive_words") or [])[:6])
        return M(
            '<p class="none">No audit finding explains these rows: their content is the likely cause{}.</p>'
        ).format(f" (words they share: {words})" if words else "")
    items = []
    for e in cl.explanations:
        fix = fixes.get(e.get("finding"), "")
        items.append(
            M("<li>{}{}</li>").format(e["text"], M(' <span class="legend">fix: {}</span>').format(fix) if fix else "")
        )
    return M('<ul class="expl">{}</ul>').format(_join(items))


def _exemplar(e: dict[str, Any]) -> Markup:
    return M(
        '<div class="card"><div class="legend">{} · score {} (raw influence {})</div><div><b>prompt</b> {}</div>'
        "<div><b>completion</b> {}</div></div>"
    ).format(
        e.get("id"),
        svg.fmt_verdict(e.get("verdict_score")),
        svg.fmt_num(e.get("score")),
        _txt(e.get("prompt"), 400),
        _txt(e.get("completion"), 600),
    )


def excerpt_html(x: dict[str, Any] | None) -> Markup:
    """A listed row's completion: its harmful sentence marked, whole, with context (builders.excerpt)."""
    x = x or {}
    if x.get("sentence") is None:
        return M("{}{}").format(x.get("before", ""), "…" if x.get("cut_after") else "")
    return M('{}{}<mark class="top">{}</mark>{}{}').format(
        "…" if x.get("cut_before") else "",
        x.get("before", ""),
        x.get("sentence", ""),
        x.get("after", ""),
        "…" if x.get("cut_after") else "",
    )


def top_rows_html(a: Any, n: int = 5) -> Markup:
    """The top of the ranking, for the summary: rank, row, verdict score, its harmful sentence."""
    if not a.ranked:
        return M("")
    items = [
        M('<li><code>{}</code> <b>{}</b>{} <span class="txt">{}</span></li>').format(
            r.get("id"),
            svg.fmt_verdict(r.get("verdict_score")),
            M(" · cluster #{}").format(r["cluster"]) if r.get("cluster") is not None else "",
            excerpt_html(r.get("excerpt")),
        )
        for r in a.ranked[:n]
    ]
    return M(
        '<div class="card"><b>Top of the ranking</b> <span class="legend">score = {}</span><ol>{}</ol></div>'
    ).format(VERDICT_SCORE_UNIT, _join(items))


def _cluster_summary(cap: Any, fixes: dict[int, str]) -> Markup:
    a = cap.attribution
    if not a.clusters:
        return M(
            '<p class="none">No training row has a negative score for {}: the data does not explain it.</p>'
        ).format(cap.name)
    out = [top_rows_html(a)]
    for cl in a.clusters[:SUMMARY_CLUSTERS]:
        ex = cl.exemplars[0] if cl.exemplars else None
        out.append(
            M('<div class="card"><b>Cluster #{}</b>: {} row{} from rank {}, {} of the harmful score{}{}</div>').format(
                cl.label,
                cl.size,
                "" if cl.size == 1 else "s",
                cl.best_rank,
                svg.fmt_pct(cl.harmful_share),
                _explanations(cl, fixes),
                M('<div class="legend">e.g. <code>{}</code>: {}</div>').format(
                    ex.get("id"), _txt(ex.get("completion"), 160)
                )
                if ex
                else "",
            )
        )
    more = len(a.clusters) - SUMMARY_CLUSTERS
    if more > 0:
        out.append(M('<p class="legend">{} more cluster{} in the details.</p>').format(more, "" if more == 1 else "s"))
    return _join(out)


def _mech(cl: Any, key: str) -> Markup:
    m = cl.mechanics.get(key) or {}
    src = m.get("source")
    note = f" ({src})" if src and src != "attribute" else (" *" if src == "attribute" else "")
    return M("{}{}").format(svg.fmt_pct(m.get("share")), note)


def _sentence_view(d: Any) -> Markup:
    sents = d.sentences
    worst = min((s["score"] for s in sents), default=0.0)
    best = max((s["score"] for s in sents), default=0.0)
    parts = []
    for seg in d.segments:
        i = seg["sentence"]
        if i is None:
            parts.append(M("{}").format(seg["text"]))
            continue
        s = sents[i]
        sc = s["score"]
        if sc < 0 and worst < 0:
            colour = f"rgba(198,40,40,{0.12 + 0.55 * sc / worst:.2f})"
        elif sc > 0 and best > 0:
            colour = f"rgba(21,101,192,{0.08 + 0.3 * sc / best:.2f})"
        else:
            colour = "transparent"
        parts.append(
            M('<mark class="{}" style="background:{}" title="{}">{}</mark>').format(
                "top" if i == 0 else "s",
                colour,
                f"score {svg.fmt_verdict(s.get('verdict_score'))} (raw sentence score {svg.fmt_num(sc)}; "
                f"share of the row's influence {svg.fmt_num(s.get('share'))}); {s.get('n_tokens')} tokens",
                seg["text"],
            )
        )
    note = "" if d.text_source == "row" else " (text rebuilt from the scored sentences)"
    rows = [
        [
            M("{}").format(k + 1),
            _txt(s["text"], 200),
            M("{}").format(svg.fmt_verdict(s.get("verdict_score"))),
            M("{}").format(svg.fmt_num(s["score"])),
            M("{}").format(svg.fmt_num(s.get("share"))),
            M("{}").format(s.get("n_tokens")),
        ]
        for k, s in enumerate(sents)
    ]
    return M(
        '<h4>row <code>{}</code> score {} <span class="legend">against failing item <code>{}</code>{}; the row&#39;s '
        "rank statistic for that item {}{}</span></h4>"
        '<div class="sentences txt">{}</div>'
        '<p class="legend">Red: the sentence degraded the capability (darker = more); the outlined one is the most '
        "harmful. "
        "Blue: it reinforced it. Unmarked text was not scored (no supervised token: beyond max_length, or between "
        "sentences).</p><details><summary>sentence scores</summary>{}</details>"
    ).format(
        d.id,
        svg.fmt_verdict(d.verdict_score),
        d.item_id,
        M(" ({})").format(d.item_note) if d.item_note else "",
        svg.fmt_num(d.row_score_for_item),
        note,
        _join(parts),
        _table(
            ["#", "sentence", VERDICT_SCORE_LABEL, "raw sentence score", "share of row influence", "tokens"],
            rows,
            (2, 3, 4, 5),
        ),
    )


def _capability_details(cap: Any, fixes: dict[int, str]) -> Markup:
    a = cap.attribution
    out = [M("<h3>{}: what the data did</h3>").format(cap.name)]
    q = ", ".join(f"{v} {k}" for k, v in sorted(a.query_kinds.items()))
    out.append(
        M("<p>{} failing item{} ({} quer{}), scored over {} training rows with <b>{}</b>{}.</p>").format(
            a.n_failing,
            "" if a.n_failing == 1 else "s",
            q,
            "y" if a.n_failing == 1 else "ies",
            a.n_train,
            a.engine,
            f" (agreement checked against {a.engines[1]})" if len(a.engines) > 1 else "",
        )
    )
    out.append(M("<h4>Score distribution</h4>{}").format(svg.profile_plot(a.profile, cap.name)))
    p = a.profile
    out.append(
        M(
            '<p class="legend">scores ({}): min {} · median {} · max {} · {} of {} rows degraded the capability; the '
            "harmful tail ({} rows) holds {} of the harmful score.</p>"
        ).format(
            VERDICT_SCORE_UNIT,
            svg.fmt_verdict(p.min),
            svg.fmt_verdict(p.median),
            svg.fmt_verdict(p.max),
            p.n_negative,
            p.n,
            p.tail_n,
            svg.fmt_pct(p.tail_mass),
        )
    )
    if a.clusters:
        out.append(M("<h4>Clusters of the harmful tail</h4>{}").format(svg.cluster_plot(a.clusters, cap.name)))
        rows = []
        for cl in a.clusters:
            cm = cl.common
            fm = ", ".join(f"{k} {v}" for k, v in (cm.get("formats") or {}).items())
            words = ", ".join(w["word"] for w in (cm.get("distinctive_words") or [])[:8])
            rows.append(
                [
                    M("#{}").format(cl.label),
                    M("{}").format(cl.size),
                    M("{}").format(svg.fmt_pct(cl.harmful_share)),
                    M("{}").format(fm),
                    M("{}").format(svg.fmt_num(cm.get("tokens_median"))),
                    _mech(cl, "truncated"),
                    _mech(cl, "missing_eos"),
                    _txt(words, 200),
                    _explanations(cl, fixes),
                ]
            )
        out.append(
            _table(
                [
                    "cluster",
                    "rows",
                    "harmful share",
                    "formats",
                    "median tokens",
                    "truncated",
                    "missing EOS",
                    "distinctive words",
                    "audit",
                ],
                rows,
                (1, 2, 4, 5, 6),
            )
        )
        out.append(
            M(
                '<p class="legend">truncated / missing EOS: the share of the cluster&#39;s rows that the Audit check '
                "named in brackets flagged; * = measured by Attribute&#39;s tokenisation because Audit did not run "
                "that check.</p>"
            )
        )
        for cl in a.clusters:
            out.append(
                M("<details><summary>cluster #{}: {} row{} ({})</summary>{}</details>").format(
                    cl.label,
                    cl.size,
                    "" if cl.size == 1 else "s",
                    shorten(", ".join(cl.row_ids), 300),
                    _join(_exemplar(e) for e in cl.exemplars),
                )
            )
    if a.ranked:
        rows = [
            [
                M("{}").format(r.get("rank")),
                M("<code>{}</code>").format(r.get("id")),
                M("<b>{}</b>").format(svg.fmt_verdict(r.get("verdict_score"))),
                M("{}").format(svg.fmt_num(r.get("score"))),
                M("{}").format(svg.fmt_num(r.get("predicted_loss_delta_if_removed"))),
                M("{}{}").format(r.get("tokens"), " (truncated)" if r.get("truncated") else ""),
                M("{}").format(f"#{r['cluster']}" if r.get("cluster") is not None else ""),
                M("{}").format(", ".join(r.get("flags") or [])),
                M("{}").format(support_marks(r)),
                M('<span class="txt">{}</span>').format(excerpt_html(r.get("excerpt"))),
            ]
            for r in a.ranked
        ]
        out.append(
            M("<h4>Most harmful training rows</h4>{}{}").format(
                _table(
                    list(HARMFUL_ROW_COLUMNS),
                    rows,
                    (0, 2, 3, 4, 5),
                ),
                M(
                    '<p class="legend">{}: {}. Raw influence: the primary engine&#39;s mean inner product over '
                    "the failing items; Δ query loss if removed = raw influence / n. The marked text is the "
                    "sentence the verdict blames.</p>"
                ).format(VERDICT_SCORE_LABEL, VERDICT_SCORE_DOC),
            )
        )
    if a.drilldown:
        out.append(M("<h4>Which sentence did it</h4>{}").format(_join(_sentence_view(d) for d in a.drilldown)))
    if a.failing_items:
        rows = [
            [
                M("<code>{}</code>").format(f.get("id")),
                _txt(_prompt_text(f.get("prompt")), 200),
                M("{}{}").format(
                    _txt(f.get("answer"), 120),
                    M('<div class="legend">the base says: {}</div>').format(_txt(f.get("correct_completion"), 160))
                    if f.get("correct_completion") not in (None, f.get("answer"))
                    else "",
                ),
                _txt(f.get("tuned_answer") if f.get("tuned_answer") is not None else "(loglik: no generation)", 120),
                M("still passes; weakened {}").format(svg.fmt_num(f.get("shift_nats")))
                if f.get("kind") == "weakened"
                else M("{}{}").format(
                    svg.fmt_num(f.get("margin")) if f.get("margin") is not None else "n/a",
                    " (thin)" if f.get("thin_margin") else "",
                ),
            ]
            for f in a.failing_items
        ]
        out.append(
            M("<h4>Failing items (the queries)</h4>{}").format(
                _table(["item", "prompt", "correct answer", "tuned model said", "base margin (nats)"], rows, (4,))
            )
        )
    return _join(out)


def _audit_section(r: Report) -> Markup:
    au = r.audit
    if au is None:
        return M(
            '<h3>Audit</h3><p class="none">The Audit lane did not run (no --config or --logs were given to '
            "<code>gradian attribute</code>); run <code>gradian diagnose</code> for the mechanical checks.</p>"
        )
    c = au.counts
    out = [
        M("<h3>Audit findings</h3><p>{} errors, {} warnings, {} info; {} checks passed, {} skipped.</p>").format(
            c.get("error", 0), c.get("warning", 0), c.get("info", 0), len(au.passed), len(au.skipped)
        )
    ]
    rows = []
    for f in au.findings:
        where = []
        if f.n_rows:
            where.append(f"{f.n_rows} rows")
        if f.n_steps:
            where.append(f"{f.n_steps} log steps")
        cl = ", ".join(
            f"{x['capability']} #{x['label']}" + (" (explains)" if x.get("explains") else "") for x in f.clusters
        )
        rows.append(
            [
                M('<span class="badge sev-{}">{}</span>').format(f.severity, f.severity),
                M('<span class="check">{}</span> {}').format(f.id, f.name),
                _txt(f.message, 600),
                M("{}").format("; ".join(where)),
                M("{}").format(cl),
                _txt(f.fix, 400),
            ]
        )
    if rows:
        out.append(_table(["severity", "check", "what was measured", "affects", "clusters", "fix"], rows))
    for n in au.notes:
        out.append(M('<p class="legend">note: {}</p>').format(n))
    return _join(out)


def _log_section(r: Report) -> Markup:
    lg = r.training_log
    if lg is None:
        return M("")
    out = [M("<h3>Training loss</h3>")]
    plot = svg.loss_plot(lg)
    if plot:
        out.append(plot)
    if lg.note:
        out.append(M('<p class="legend">{} (<code>{}</code>)</p>').format(lg.note, lg.path or ""))
    if lg.anomalies:
        out.append(
            M("<ul>{}</ul>").format(
                _join(
                    M(
                        '<li><span class="badge sev-{}">{}</span> <span class="check">{}</span> {} at step{} {}: '
                        "{}</li>"
                    ).format(
                        a["severity"],
                        a["severity"],
                        a["check"],
                        a["name"],
                        "" if len(a["steps"]) == 1 else "s",
                        shorten(", ".join(str(s) for s in a["steps"]), 120),
                        a["message"],
                    )
                    for a in lg.anomalies
                )
            )
        )
    elif plot:
        out.append(M('<p class="legend">Audit flagged no log anomaly with a step.</p>'))
    return _join(out)


def _manifest(r: Report) -> Markup:
    from gradian.report.views import flatten, training_setup_rows

    m = r.manifest
    rows, spec_rows = [], []
    for k, v in flatten(m.get("identity") or {})[:400]:
        val = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
        row = [M("<code>{}</code>").format(k), M('<span class="mono txt">{}</span>').format(shorten(val, 300))]
        (spec_rows if k.startswith("specs.") else rows).append(row)
    paths = m.get("paths") or {}
    prow = [
        [
            M("<code>{}</code>").format(k),
            M('<span class="mono txt">{}</span>').format(
                ", ".join(v) if isinstance(v, list) else ("" if v is None else v)
            ),
        ]
        for k, v in paths.items()
    ]
    timing = ", ".join(f"{k} {v:.1f} s" for k, v in r.timing.items() if isinstance(v, (int, float)))
    setup_rows, setup_notes = training_setup_rows(m)
    setup = (
        M("<h4>Training setup (how the trainer tokenised the rows; the gradients use it)</h4>{}{}").format(
            _table(
                ["field", "value", "from"],
                [[M("<code>{}</code>").format(a), b, shorten(c, 300)] for a, b, c in setup_rows],
            ),
            _join(M('<p class="legend">{}</p>').format(n) for n in setup_notes),
        )
        if setup_rows
        else M("")
    )
    return M(
        '<h2 id="manifest">Manifest</h2><p>This report was rendered from run <code>{}</code> ({}). '
        "Every number above comes from it; if a number differs between two runs, a changed field here is the "
        "explanation.</p>"
        "<h4>Identity (hashed into the run id)</h4>{}<details><summary>every spec ({} fields)</summary>{}</details>"
        "{}<h4>Paths</h4>{}<p><b>Sign convention:</b> {}</p>"
        "<p><b>Timing:</b> {}</p><details><summary>the manifest as JSON</summary><pre>{}</pre></details>"
    ).format(
        r.run_id,
        r.run_schema,
        _table(["field", "value"], rows),
        len(spec_rows),
        _table(["field", "value"], spec_rows),
        setup,
        _table(["input", "path"], prow),
        m.get("sign_convention", ""),
        timing or "n/a",
        json.dumps(m, indent=2, ensure_ascii=False, sort_keys=True),
    )


def _verification(r: Report) -> Markup:
    """The ``gradian verify`` panel (empty without a verification)."""
    v = r.verification
    if not v:
        return M("")
    parts = []
    for name, cap in (v.get("capabilities") or {}).items():
        rows = []
        for rname, x in (cap.get("retrains") or {}).items():
            ci = x.get("recovery_ci") or [float("nan"), float("nan")]
            rows.append(
                [
                    _txt(rname),
                    M("{}").format(x.get("removed")),
                    M("{}").format(svg.fmt_num(x.get("score"))),
                    M("{} [{}, {}]").format(
                        svg.fmt_num(x.get("delta")), svg.fmt_num(x.get("ci_low")), svg.fmt_num(x.get("ci_high"))
                    ),
                    M("{}").format(recovery_text(x.get("recovery"), ci)),
                    M("{}").format(svg.fmt_num(x.get("predicted_query_loss_change"))),
                    M("{}").format(svg.fmt_num(x.get("measured_query_loss_change"))),
                ]
            )
        badge = "improved" if cap.get("verified") else "within_noise"
        parts.append(
            M('<div class="card"><b>{}</b> <span class="badge {}">{}</span> {}</div>{}').format(
                name,
                badge,
                verify_word(cap),
                cap.get("line", ""),
                _table(
                    list(VERIFY_COLUMNS),
                    rows,
                    (1, 2, 3, 4, 5, 6),
                ),
            )
        )
    return M('<section id="verification"><h2>Verification</h2><p class="legend">{}</p>{}</section>').format(
        verification_legend(v), _join(parts)
    )


def render_html(report: Report) -> str:
    """The whole report as one self-contained HTML page (see module docstring)."""
    r = Report.from_dict(clean_tree(report.to_dict()))  # every string cleaned of control/bidi characters
    fixes = r.finding_fixes()
    caps_html = []
    for c in r.capabilities:
        caps_html.append(
            M(
                '<div class="card"><b>{}</b> <span class="badge {}">{}</span> '
                '<span class="mono">{} → {} (Δ {:+.3f}, {:g}% CI [{:+.3f}, {:+.3f}])</span> '
                '<span class="legend">{} items: {} kept, {} lost, {} gained, {} fail in both; metric {}</span>{}</div>'
            ).format(
                c.name,
                c.verdict,
                c.verdict.replace("_", " "),
                svg.fmt_score(c.reference_score, c.unit),
                svg.fmt_score(c.tuned_score, c.unit),
                c.delta,
                c.confidence * 100,
                c.ci_low,
                c.ci_high,
                c.n,
                c.n_kept,
                c.n_lost,
                c.n_gained,
                c.n_both_fail,
                c.metric,
                _qualifiers(c.qualifiers),
            )
        )
    units = []
    for c in r.capabilities:
        if c.unit not in units:
            units.append(c.unit)
    plots = _join(svg.ci_plot(r.capabilities, u) for u in units)
    attributed = [c for c in r.capabilities if c.attribution is not None]
    clusters = _join(
        M("<h3>Top harmful clusters: {}</h3>{}").format(c.name, _cluster_summary(c, fixes)) for c in attributed
    )
    details = _join(_capability_details(c, fixes) for c in attributed)
    notes = _join(M('<p class="legend">note: {}</p>').format(n) for n in r.notes)
    stopped = M('<p class="card"><b>Stopped after Evaluate:</b> {}</p>').format(r.stopped) if r.stopped else M("")
    body = M(
        '<header><h1>Gradian report</h1><p class="sub">run <code>{}</code> · {} · gradian {}</p></header>'
        '<section id="summary"><h2>Summary</h2><ol class="headline">{}</ol>{}'
        "<h3>Verdict per capability, and how sure</h3>{}{}{}</section>{}"
        '<section id="details"><h2>Details</h2>{}{}{}{}</section>'
        "<section>{}</section><footer>Rendered by <code>gradian report</code> from <code>run.json</code>; "
        "nothing was recomputed. Self-contained: no script, nothing fetched.</footer>"
    ).format(
        r.run_id,
        r.schema,
        r.gradian_version,
        _join(M("<li>{}</li>").format(h) for h in r.headline),
        stopped,
        _join(caps_html),
        plots,
        clusters,
        _verification(r),
        details,
        _audit_section(r),
        _log_section(r),
        notes,
        _manifest(r),
    )
    page = M(
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta http-equiv="Content-Security-Policy" content="{}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="referrer" content="no-referrer">'
        "<title>Gradian report · run {}</title><style>{}</style></head><body><main>{}</main></body></html>\n"
    ).format(M(CSP), r.run_id, M(CSS), body)
    return str(page)
