"""Building the report (:mod:`gradian.report.views`) from a run: one view that every renderer reads.

:func:`build_report` is a pure function of a ``gradian.run/1`` dict (what
``gradian attribute --out RUN_DIR`` wrote to ``RUN_DIR/run.json``) and,
optionally, the training log history (see :func:`gradian.report.io.read_training_log`).
It recomputes nothing: every number is copied from the run or is simple
arithmetic on it (shares, counts, a subsample of the sorted scores).

Order of the report, and of every renderer:

1. ``headline``: a few sentences: per capability the verdict; for each
   regressed one the confidence in the data verdict and what the most harmful
   cluster is (and whether Audit explains it);
2. per capability the verdict, then the confidence ``qualifiers`` (noise band,
   base bounds: base also fails, low base score, thin margins; engine agreement);
3. the top harmful clusters with the audit findings that explain them
   (:mod:`gradian.report.join`);
4. details: score profile, ranked rows with their audit flags, sentence
   drill-down, failing items, all audit findings, the training loss curve with
   the log anomalies Audit flagged;
5. the manifest the report came from.

The strings are kept exactly as the run recorded them (the JSON form is data);
renderers show them only through :mod:`gradian.report.safe`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gradian.report import join
from gradian.report.join import explain_cluster, row_flags
from gradian.report.views import (
    EVIDENCE_KINDS,
    AttributionView,
    AuditView,
    CapabilityView,
    ClusterView,
    DrilldownView,
    FindingView,
    Qualifier,
    Report,
    ScoreProfile,
    TrainingLogView,
)
from gradian.runfile import RUN_SCHEMA
from gradian.sign import (
    SENTENCE_CONTEXT_SHOWN,
    harmful_mass,
    harmful_rows,
    harmful_share,
    most_harmful_first,
    verdict_scores,
)
from gradian.version import __version__

#: At most this many row ids / steps per finding in the report (the run.json keeps all).
ID_CAP = 200
#: At most this many points in a score profile (all rows when fewer; the harmful tail always exact).
PROFILE_POINTS = 400


def _f(x: Any) -> float:
    """A JSON number (the audit writes NaN/inf as strings)."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def _qualifiers(cap: dict[str, Any], att: dict[str, Any] | None, failing: list[dict[str, Any]]) -> list[Qualifier]:
    out: list[Qualifier] = []
    pct = f"{cap['confidence'] * 100:g}%"
    ci = f"{pct} CI [{cap['ci_low']:+.3f}, {cap['ci_high']:+.3f}]"
    reason = str(cap.get("reason", ""))
    if reason.startswith("only "):
        out.append(Qualifier("few_items", "warning", f"{reason} (too few items to tell a change from noise)"))
    elif cap["verdict"] == "within_noise":
        out.append(
            Qualifier("noise_band", "caution", f"{ci} includes zero: within the noise band, so nothing is diagnosed")
        )
    elif cap["verdict"] == "regressed":
        out.append(Qualifier("noise_band", "ok", f"{ci} excludes zero: outside the noise band"))
    else:
        out.append(Qualifier("noise_band", "ok", f"{ci} excludes zero: an improvement, nothing to attribute"))
    bb = cap.get("base_bounds") or {}
    for q in bb.get("qualifiers") or []:
        ql = q.lower()
        if ql.startswith("the base also fails"):
            kind, level = "base_fails", "caution"
        elif ql.startswith("low base score"):
            kind, level = "low_base", "warning"
        elif "preference margin" in ql:
            share = bb.get("thin_margin_share")
            kind, level = "thin_margin", ("warning" if isinstance(share, (int, float)) and share >= 0.5 else "caution")
        elif ql.startswith("loglik"):
            kind, level = "loglik_query", "warning"
        else:
            kind, level = "base_bound", "caution"
        out.append(Qualifier(kind, level, q))
    if bb.get("margins_available") and bb.get("failing") and not bb.get("thin_margin"):
        med = bb.get("median_margin")
        med_s = f" (median {med:.2f} nats)" if isinstance(med, (int, float)) else ""
        out.append(
            Qualifier(
                "margins",
                "ok",
                f"no failing item has a thin base margin{med_s}: the base held these answers firmly, "
                "so the fine-tune took them",
            )
        )
    if att is not None:
        ag = att.get("agreement")
        if ag:
            conf = ag.get("confidence", "unknown")
            rho, ov = _f(ag.get("spearman")), _f(ag.get("topk_overlap"))
            e1, e2 = (ag.get("engines") or ["?", "?"])[:2]
            level = {"high": "ok", "medium": "caution"}.get(conf, "warning")
            text = (
                f"engine agreement {conf}: {e1} and {e2} rank the rows with Spearman {rho:.2f} "
                f"and share {ov:.0%} of their top {ag.get('k')}"
            )
            if level == "warning":
                text += "; the ranking depends on the engine, so treat it as a lead, not a verdict"
            out.append(Qualifier("engine_agreement", level, text))
        else:
            out.append(
                Qualifier(
                    "single_engine",
                    "caution",
                    f"one engine only ({att.get('engine')}): no agreement check, confidence unknown",
                )
            )
        ev = evidence_line(att)
        if ev:
            out.append(Qualifier("evidence", "ok", ev))
    return out


def evidence_line(att: dict[str, Any]) -> str | None:
    """One sentence on how each kind of evidence agrees with the verdict, from run.json's attribution."""
    ev = att.get("evidence") or {}
    k = (att.get("agreement") or {}).get("k", 20)
    parts = []
    for kind in EVIDENCE_KINDS:
        e = ev.get(kind)
        if isinstance(e, dict) and e.get("spearman_with_verdict") is not None:
            parts.append(
                f"{kind} ({e.get('engine')}) Spearman {_f(e['spearman_with_verdict']):.2f}, "
                f"top-{k} overlap {_f(e.get('topk_overlap_with_verdict')):.0%}"
            )
    if not parts:
        return None
    fused = (att.get("ranking") or {}).get("fuse_weights") or {}
    weights = ", ".join(f"{n} with weight {_f(w):.2f}" for n, w in fused.items())
    tail = f"; folded into the ranking: {weights}" if fused else ""
    return "how each kind of evidence agrees with the verdict: " + "; ".join(parts) + tail


def _profile(scores: list[float], tail: set[int]) -> ScoreProfile:
    """The score profile of ``scores`` (n,), ``tail`` the row indices the clusters hold (:class:`ScoreProfile`)."""
    n = len(scores)
    arr = np.asarray(scores, dtype=np.float64)
    order = most_harmful_first(arr).tolist()
    if n <= PROFILE_POINTS:
        keep = list(range(n))
    else:
        ranks_in_tail = [r for r, j in enumerate(order) if j in tail]
        step = (n - 1) / (PROFILE_POINTS - len(ranks_in_tail) - 1)
        spread = {int(round(i * step)) for i in range(PROFILE_POINTS - len(ranks_in_tail))}
        keep = sorted(spread | set(ranks_in_tail) | {0, n - 1})
    srt = [scores[j] for j in order]
    med = (srt[(n - 1) // 2] + srt[n // 2]) / 2 if n else float("nan")
    return ScoreProfile(
        n=n,
        n_negative=len(harmful_rows(arr)),
        n_positive=sum(1 for s in scores if s > 0),
        min=srt[0] if n else float("nan"),
        max=srt[-1] if n else float("nan"),
        median=med,
        total_negative=harmful_mass(arr),
        tail_n=len(tail),
        tail_mass=harmful_share(arr, sorted(tail)),
        points=[[r, srt[r], order[r] in tail] for r in keep],
    )


def excerpt(completion: Any, sentence: dict[str, Any] | None, width: int = 240) -> dict[str, Any]:
    """What a renderer shows of a listed row's completion: its harmful sentence whole, with context around it.

    Returns:
        ``{"before", "sentence", "after", "cut_before", "cut_after"}``: ``sentence`` is the blamed
        sentence's text (None for a row with one sentence or none blamed: then ``before`` is the
        completion cut at ``width`` characters); ``before`` / ``after`` the context on each side, at most
        :data:`gradian.sign.SENTENCE_CONTEXT_SHOWN` characters each, cut at a word where possible;
        ``cut_*``: whether text was left out there (a renderer shows "…"). The sentence is never cut
        below 300 characters, so a long row never loses it to "…".
    """
    text = "" if completion is None else str(completion)
    if not sentence or not isinstance(sentence.get("text"), str):
        cut = len(text) > width
        return {
            "before": text[: width - 1] if cut else text,
            "sentence": None,
            "after": "",
            "cut_before": False,
            "cut_after": cut,
        }
    before = str(sentence.get("context_before", ""))
    after = str(sentence.get("context_after", ""))
    a = sentence.get("char_start")
    if not before and isinstance(a, int) and 0 < a <= len(text):
        before = text[:a]  # an older run: the stored completion gives the context
    b = sentence.get("char_end")
    if not after and isinstance(b, int) and b < len(text):
        after = text[b:]
    n = SENTENCE_CONTEXT_SHOWN
    cut_before = len(before) > n or (isinstance(a, int) and a > len(before))
    before = before[-n:]
    if cut_before:  # start at a word: drop the partial one when a space is near
        sp = before.find(" ")
        before = before[sp + 1 :] if 0 <= sp < n // 2 else before
    cut_after = len(after) > n or (isinstance(b, int) and b + len(after) < len(text))
    after = after[:n]
    if cut_after:
        sp = after.rfind(" ")
        after = after[:sp] if sp > n // 2 else after
    return {
        "before": before,
        "sentence": sentence["text"],
        "after": after,
        "cut_before": cut_before,
        "cut_after": cut_after,
    }


def _drilldown(
    d: dict[str, Any], stored_text: str | None, row_verdict: float | None = None, notes: dict[str, str] | None = None
) -> DrilldownView:
    sents = [dict(x) for x in d.get("sentences") or []]
    top = min((_f(x.get("score")) for x in sents), default=float("nan"))
    for x in sents:  # an older run: the row's verdict score apportioned by the sentence scores (as Attribute does)
        if "verdict_score" not in x and row_verdict is not None:
            x["verdict_score"] = row_verdict * _f(x.get("score")) / top if top < 0 else 0.0
    spans = sorted(range(len(sents)), key=lambda i: sents[i]["char_start"])
    ok = stored_text is not None and all(
        sents[i]["char_end"] <= len(stored_text)
        and stored_text[sents[i]["char_start"] : sents[i]["char_end"]] == sents[i]["text"]
        for i in spans
    )
    if ok:
        text, source = stored_text, "row"
    else:  # place the sentences at their offsets, single spaces in between
        buf: list[str] = []
        pos = 0
        for i in spans:
            a = sents[i]["char_start"]
            if a > pos:
                buf.append(" ")
            buf.append(sents[i]["text"])
            pos = sents[i]["char_end"]
        text, source = "".join(buf), "sentences"
    segments: list[dict[str, Any]] = []
    if source == "row":
        pos = 0
        for i in spans:
            a, b = sents[i]["char_start"], sents[i]["char_end"]
            if a > pos:
                segments.append({"text": text[pos:a], "sentence": None})
            segments.append({"text": text[a:b], "sentence": i})
            pos = b
        if pos < len(text):
            segments.append({"text": text[pos:], "sentence": None})
    else:
        first = True
        for i in spans:
            if not first:
                segments.append({"text": " ", "sentence": None})
            segments.append({"text": sents[i]["text"], "sentence": i})
            first = False
    return DrilldownView(
        id=d["id"],
        item_id=d.get("item_id", ""),
        row_score_for_item=_f(d.get("row_score_for_item")),
        verdict_score=_f(d.get("verdict_score", row_verdict)),
        text=text,
        text_source=source,
        segments=segments,
        sentences=sents,
        item_note=(notes or {}).get(d.get("item_id", ""), ""),
    )


def _attribution(
    cap: dict[str, Any], train_ids: list[str], audit_findings: list[dict[str, Any]], checks_ran: set[str] | None
) -> AttributionView:
    # the profile shows what orders the verdict (older runs: the influence itself)
    rank_scores = [float(s) for s in (cap.get("rank_scores") or cap["scores"])]
    # every score the report shows is on the verdict's one scale (an older run: computed here, the same rule)
    vs = cap.get("verdict_scores")
    scores = [float(x) for x in vs] if vs and len(vs) == len(rank_scores) else verdict_scores(rank_scores).tolist()
    pos = {rid: j for j, rid in enumerate(train_ids)}
    n_train = int(cap.get("n_train") or len(scores))
    clusters = []
    tail: set[int] = set()
    for c in cap.get("clusters") or []:
        tail.update(pos[r] for r in c["row_ids"] if r in pos)
        clusters.append(
            ClusterView(
                label=int(c["label"]),
                size=int(c["size"]),
                harmful_share=float(c["harmful_share"]),
                score=float(c["score"]),
                row_ids=list(c["row_ids"]),
                exemplars=list(c.get("exemplars") or []),
                common=dict(c.get("common") or {}),
                explanations=explain_cluster(c, audit_findings, n_train, checks_ran),
                best_rank=int(c.get("best_rank") or 0),
                verdict_score=sum(scores[pos[r]] for r in c["row_ids"] if r in pos),
            )
        )
    by_check: dict[str, set[str]] = {}
    for f in audit_findings:
        by_check.setdefault(f.get("id", ""), set()).update(f.get("row_ids") or [])
    for cl in clusters:
        for key, cid, common_key in (
            ("truncated", "D04", "truncated_share"),
            ("missing_eos", "D06", "missing_eos_share"),
        ):
            if checks_ran is not None and cid in checks_ran:
                share = len(set(cl.row_ids) & by_check.get(cid, set())) / max(1, cl.size)
                cl.mechanics[key] = {"share": share, "source": cid}
            else:
                v = cl.common.get(common_key)
                cl.mechanics[key] = {"share": float(v) if isinstance(v, (int, float)) else None, "source": "attribute"}
    label_of = {r: c.label for c in clusters for r in c.row_ids}
    flags = row_flags(audit_findings)
    ranked = []
    for r in sorted(cap.get("ranked") or [], key=lambda r: int(r.get("rank") or 0)):
        j = pos.get(r["id"])
        v = _f(r["verdict_score"]) if "verdict_score" in r else (scores[j] if j is not None else float("nan"))
        if not v < 0:
            continue  # "most harmful" never lists a row whose verdict score is not harmful
        ranked.append(
            dict(
                r,
                verdict_score=v,
                cluster=label_of.get(r["id"]),
                flags=list(flags.get(r["id"], [])),
                excerpt=excerpt(r.get("completion"), r.get("sentence")),
            )
        )
    for cl in clusters:
        for e in cl.exemplars:
            if e.get("id") in pos:
                e["verdict_score"] = scores[pos[e["id"]]]
    rank_of = {int(j): i + 1 for i, j in enumerate(most_harmful_first(np.asarray(scores)))}
    for cl in clusters:  # an older run: the rank of the cluster's most harmful row, from the scores
        if not cl.best_rank:
            cl.best_rank = min((rank_of[pos[r]] for r in cl.row_ids if r in pos), default=0)
    # in ranking order: the cluster that holds the top row leads (gradian.attribute.clusters)
    clusters.sort(key=lambda c: (c.best_rank or 10**9, c.label))
    completion = {r["id"]: r.get("completion") for r in cap.get("ranked") or []}
    for c in cap.get("clusters") or []:
        for e in c.get("exemplars") or []:
            completion.setdefault(e["id"], e.get("completion"))
    kinds: dict[str, int] = {}
    for q in cap.get("queries") or []:
        k = q.get("kind", "?")
        kinds[k] = kinds.get(k, 0) + 1
    ag = cap.get("agreement")
    evidence = None
    if cap.get("evidence"):
        evidence = {
            kind: {k: e.get(k) for k in ("engine", "spearman_with_verdict", "topk_overlap_with_verdict")}
            for kind, e in cap["evidence"].items()
            if isinstance(e, dict)
        }
        evidence["fused"] = dict((cap.get("ranking") or {}).get("fuse_weights") or {})
    from gradian.attribute.selection import select_capability  # the rule verify and the export use

    blamed = select_capability(cap, train_ids, "blamed") if cap.get("clusters") else []
    from gradian.report.svg import fmt_num

    drill_notes = {  # the drill-down's weakened items (--drill-weakened): named as what they are
        f["id"]: f"still passes; weakened {fmt_num(f.get('shift_nats'))} nats; asked by the drill-down only"
        for f in cap.get("drill_items") or []
    }
    return AttributionView(
        engine=cap.get("engine", "?"),
        engines=list(ag["engines"]) if ag else [cap.get("engine", "?")],
        n_train=n_train,
        n_failing=len(cap.get("queries") or []),
        query_kinds=kinds,
        agreement=dict(ag) if ag else None,
        profile=_profile(scores, tail),
        clusters=clusters,
        explained_share=sum(c.harmful_share for c in clusters if c.explained),
        ranked=ranked,
        drilldown=[
            _drilldown(d, completion.get(d["id"]), scores[pos[d["id"]]] if d["id"] in pos else None, drill_notes)
            for d in cap.get("drilldown") or []
        ],
        failing_items=[
            {
                k: f.get(k)
                for k in (
                    "id",
                    "prompt",
                    "answer",
                    "correct_completion",
                    "tuned_answer",
                    "reference_answer",
                    "margin",
                    "thin_margin",
                    "query",
                    "kind",
                    "shift_nats",
                )
            }
            for f in cap.get("failing_items") or []
        ],
        evidence=evidence,
        blamed=blamed,
    )


def _audit(audit: dict[str, Any] | None, caps: list[CapabilityView]) -> AuditView | None:
    if not audit:
        return None
    views = []
    for fi, f in enumerate(audit.get("findings") or []):
        rows = list(f.get("row_ids") or [])
        steps = [int(s) for s in f.get("steps") or []]
        rs = set(rows)
        in_clusters = []
        for c in caps:
            if c.attribution is None:
                continue
            for cl in c.attribution.clusters:
                ov = len(rs & set(cl.row_ids))
                if ov:
                    in_clusters.append(
                        {
                            "capability": c.name,
                            "label": cl.label,
                            "overlap": ov,
                            "explains": any(e.get("finding") == fi for e in cl.explanations),
                        }
                    )
        views.append(
            FindingView(
                id=f.get("id", ""),
                name=f.get("name", ""),
                title=f.get("title", ""),
                severity=f.get("severity", "info"),
                reads=list(f.get("reads") or []),
                message=f.get("message", ""),
                fix=f.get("fix", ""),
                evidence=dict(f.get("evidence") or {}),
                n_rows=len(rows),
                row_ids=rows[:ID_CAP],
                n_steps=len(steps),
                steps=steps[:ID_CAP],
                fraction=f.get("fraction"),
                clusters=in_clusters,
            )
        )
    return AuditView(
        counts=dict(audit.get("counts") or {}),
        findings=views,
        passed=list(audit.get("passed") or []),
        skipped=[{k: s.get(k) for k in ("id", "name", "reason")} for s in audit.get("skipped") or []],
        notes=list(audit.get("notes") or []),
    )


def _training_log(run: dict[str, Any], log: dict[str, Any] | None) -> TrainingLogView | None:
    findings = (run.get("audit") or {}).get("findings") or []
    anomalies = [
        {
            "check": f.get("id"),
            "name": f.get("name"),
            "severity": f.get("severity"),
            "steps": [int(s) for s in f.get("steps") or []][:ID_CAP],
            "message": f.get("message", ""),
        }
        for f in findings
        if f.get("steps") and "logs" in (f.get("reads") or ["logs"])
    ]
    path = ((run.get("manifest") or {}).get("paths") or {}).get("logs")
    if log is None and not path and not anomalies:
        return None
    if log is None:
        return TrainingLogView(
            path=path,
            status="not_read",
            note="the log file was not read for this report",
            loss=[],
            eval_loss=[],
            learning_rate=[],
            anomalies=anomalies,
        )

    def series(rows: list[dict[str, Any]], key: str) -> list[list[float]]:
        return [[int(e["step"]), float(e[key])] for e in rows if key in e and "step" in e]

    return TrainingLogView(
        path=log.get("path", path),
        status=log.get("status", "plotted"),
        note=log.get("note"),
        loss=series(log.get("train") or [], "loss"),
        eval_loss=series(log.get("eval") or [], "eval_loss"),
        learning_rate=series(log.get("train") or [], "learning_rate"),
        anomalies=anomalies,
    )


def _cut(s: str, n: int) -> str:
    s = str(s)
    return s if len(s) <= n else s[: n - 1] + "…"


def _fmt_score(x: float, unit: str) -> str:
    return f"{x:.2f}" if unit == "accuracy" else f"{x:.3f} nats"


def _setup_qualifier(errors: list[dict[str, Any]]) -> Qualifier:
    """The confidence qualifier of a verdict whose run Audit flagged (:func:`gradian.report.join.setup_errors`)."""
    ids = ", ".join(e["id"] for e in errors)
    return Qualifier(
        "audit_setup",
        "warning",
        f"lowered by the audit: error-level setup finding{'s' if len(errors) != 1 else ''} {ids} can explain the "
        "regression without the data, so the ranking is a lead, not a cause",
    )


def _top_rows_sentence(name: str, a: AttributionView, n: int = 3) -> str:
    """The summary's lead: the rows at the top of the ranking, on the verdict scale, and what is blamed."""
    tops = []
    for r in a.ranked[:n]:
        sent = (r.get("excerpt") or {}).get("sentence")
        tops.append(
            f"{r.get('id')} ({_fmt_verdict(r.get('verdict_score'))}" + (f', "{_cut(sent, 90)}"' if sent else "") + ")"
        )
    share = a.profile.tail_mass
    k = len(a.blamed)
    return (
        f"The most harmful rows for {name}: "
        + "; ".join(tops)
        + f". The {k} blamed row{'s' if k != 1 else ''} (what gradian verify removes) hold {share:.0%} of the "
        "harmful score."
    )


def _fmt_verdict(x: Any) -> str:
    from gradian.report.svg import fmt_verdict

    return fmt_verdict(x)


def _headline(
    caps: list[CapabilityView],
    audit: AuditView | None,
    stopped: str | None,
    setup: dict[str, list[dict[str, Any]]] | None = None,
) -> list[str]:
    """The summary's sentences. ``setup``: per attributed capability, Audit's error-level setup findings."""
    setup = {k: v for k, v in (setup or {}).items() if v}
    out: list[str] = []
    order = sorted(caps, key=lambda c: {"regressed": 0, "improved": 2}.get(c.verdict, 1))
    for c in order:
        pct = f"{c.confidence * 100:g}%"
        ci = f"{pct} CI [{c.ci_low:+.2f}, {c.ci_high:+.2f}]"
        move = f"{_fmt_score(c.reference_score, c.unit)} → {_fmt_score(c.tuned_score, c.unit)}"
        if c.verdict == "regressed":
            out.append(f"{c.name} regressed: {move} (Δ {c.delta:+.2f}, {ci}); {c.n_lost} of {c.n} items lost.")
        elif c.verdict == "improved":
            out.append(f"{c.name} improved: {move} (Δ {c.delta:+.2f}, {ci}); nothing to attribute.")
        else:
            why = c.reason if c.reason.startswith("only ") else f"{ci} includes zero"
            out.append(f"{c.name}: Δ {c.delta:+.2f}, {why}: within noise, not diagnosed.")
    if stopped:
        out.append(f"Nothing was attributed: {stopped}.")
    for c in order:  # before any data verdict: the setup itself may have caused the regression
        if c.name in setup:
            errs = setup[c.name]
            out.append(
                f"The {c.name} regression may be mechanical: Audit found error-level setup problems "
                f"({join.setup_error_names(errs)}); fix and retrain before trusting the data verdict below."
            )
    for c in order:
        a = c.attribution
        if a is None:
            continue
        cautions = [q for q in c.qualifiers if q.level != "ok" and q.kind != "engine_agreement"]
        if a.agreement:
            ag = a.agreement
            conf = (
                f"{ag.get('confidence', 'unknown')} engine agreement (Spearman {_f(ag.get('spearman')):.2f}, "
                f"top-{ag.get('k')} overlap {_f(ag.get('topk_overlap')):.0%})"
            )
        else:
            conf = "unknown (one engine, no agreement check)"
        s = f"Confidence in the data verdict for {c.name}: {conf}"
        if cautions:
            s += "; but " + "; ".join(q.text for q in cautions)
        else:
            s += "".join(f"; {q.text}" for q in c.qualifiers if q.kind == "margins")
        out.append(s + ".")
        if not a.clusters:
            out.append(f"No training row degraded {c.name} (no negative scores): the data does not explain it.")
            continue
        out.append(_top_rows_sentence(c.name, a))
        top = a.clusters[0]
        desc = (
            f"Cluster #{top.label} for {c.name} ({top.size} row{'s' if top.size != 1 else ''} from rank "
            f"{top.best_rank}, {top.harmful_share:.0%} of the harmful score)"
        )
        audit_ex = [e for e in top.explanations if e["source"] == "audit"]
        if audit_ex:
            fix = ""
            if audit is not None:
                i = audit_ex[0].get("finding")
                fx = audit.findings[i].fix if isinstance(i, int) and 0 <= i < len(audit.findings) else ""
                fix = f" Fix that first: {_cut(fx, 300).rstrip('.')}." if fx else ""
            out.append(f"{desc} is a mechanical problem: {audit_ex[0]['text']}.{fix}")
        elif top.explanations:
            out.append(f"{desc}: {top.explanations[0]['text']}.")
        elif c.name in setup:  # no row-level explanation, but the setup may explain the whole regression
            words = ", ".join(w["word"] for w in (top.common.get("distinctive_words") or [])[:4])
            ids = ", ".join(e["id"] for e in setup[c.name])
            out.append(
                f"{desc} has no row-level explanation in the audit: its content is the likely cause only if the "
                f"setup findings ({ids}) did not cause the regression"
                + (f" (shared words: {words})." if words else ".")
            )
        else:
            words = ", ".join(w["word"] for w in (top.common.get("distinctive_words") or [])[:4])
            out.append(
                f"{desc} has no mechanical explanation in the audit: its content is the likely cause"
                + (f" (shared words: {words})." if words else ".")
            )
        if len(a.clusters) > 1:
            out.append(f"Audit explains clusters holding {a.explained_share:.0%} of the harmful score for {c.name}.")
    if audit is not None:
        k = audit.counts
        out.append(f"Audit: {k.get('error', 0)} errors, {k.get('warning', 0)} warnings, {k.get('info', 0)} info.")
    return out


def build_report(run: dict[str, Any], log: dict[str, Any] | None = None) -> Report:
    """The report of a finished run. Pure: reads only its arguments.

    Args:
        run: a ``gradian.run/1`` dict (:func:`gradian.runfile.load_run`).
        log: the training log as :func:`gradian.report.io.read_training_log` returns it
            (``{"path", "status", "note", "train": [...], "eval": [...]}``), or None.

    Returns:
        the :class:`Report`.
    """
    if run.get("schema") != RUN_SCHEMA:
        raise ValueError(f"not a {RUN_SCHEMA} run (schema={run.get('schema')!r})")
    ev = run.get("evaluation") or {}
    att = run.get("attribution") or None
    audit = run.get("audit") or None
    findings = [f for f in (audit or {}).get("findings") or []]
    checks_ran = ({f.get("id") for f in findings} | set(audit.get("passed") or [])) if audit else None
    att_by_cap = {c["capability"]: c for c in (att or {}).get("capabilities") or []}
    train_ids = list((att or {}).get("train_ids") or [])
    caps: list[CapabilityView] = []
    setup: dict[str, list[dict[str, Any]]] = {}
    for c in ev.get("capabilities") or []:
        a = att_by_cap.get(c["name"])
        av = _attribution(a, train_ids, findings, checks_ran) if a else None
        quals = _qualifiers(c, a, (a or {}).get("failing_items") or [])
        if a is not None:  # Audit's setup errors (D04 only when it truncates rows this verdict blames)
            blamed = {r.get("id") for r in a.get("ranked") or []}
            blamed |= {r for cl in a.get("clusters") or [] for r in cl.get("row_ids") or []}
            setup[c["name"]] = join.setup_errors(findings, blamed)
            if setup[c["name"]]:
                quals.append(_setup_qualifier(setup[c["name"]]))
        caps.append(
            CapabilityView(
                name=c["name"],
                metric=c["metric"],
                unit=c.get("unit", "accuracy"),
                n=int(c["n"]),
                reference_score=_f(c["reference_score"]),
                tuned_score=_f(c["tuned_score"]),
                delta=_f(c["delta"]),
                ci_low=_f(c["ci_low"]),
                ci_high=_f(c["ci_high"]),
                confidence=_f(c.get("confidence", 0.95)),
                verdict=c["verdict"],
                diagnosed=bool(c.get("diagnosed")),
                reason=c.get("reason", ""),
                sign_test_p=_f(c.get("sign_test_p")),
                n_kept=int(c.get("n_kept", 0)),
                n_lost=int(c.get("n_lost", 0)),
                n_gained=int(c.get("n_gained", 0)),
                n_both_fail=int(c.get("n_both_fail", 0)),
                base_bounds=dict(c.get("base_bounds") or {}),
                qualifiers=quals,
                attribution=av,
            )
        )
    audit_view = _audit(audit, caps)
    stopped = run.get("stopped")
    if stopped:
        status = "stopped"
    elif any(c.attribution for c in caps):
        status = "attributed"
    else:
        status = "not_attributed"
    notes = list((run.get("manifest") or {}).get("notes") or []) + list(ev.get("notes") or [])
    visits = (((run.get("attribution") or {}).get("trajectory")) or {}).get("visits") or {}
    if visits.get("never_trained"):
        n_rows = len((run.get("attribution") or {}).get("train_ids") or [])
        notes.append(
            f"{visits['never_trained']} of the {n_rows} training rows were never read by the run ({visits['rule']}): "
            "they score 0 and are not ranked"
        )
    verification = run.get("verification") or None
    headline = _headline(caps, audit_view, stopped, setup)
    if verification:  # what retraining without the blamed rows showed: right after the verdicts
        headline = headline + [f"{name}: {v['line']}." for name, v in (verification.get("capabilities") or {}).items()]
    return Report(
        run_id=str((run.get("manifest") or {}).get("run_id", "")),
        status=status,
        headline=headline,
        capabilities=caps,
        audit=audit_view,
        training_log=_training_log(run, log),
        manifest=dict(run.get("manifest") or {}),
        timing=dict(run.get("timing") or {}),
        stopped=stopped,
        notes=notes,
        gradian_version=__version__,
        verification=dict(verification) if verification else None,
    )
