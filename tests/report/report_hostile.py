"""Hostile strings, and a real run with them in every text field the report shows (for the safety and browser tests)."""

from __future__ import annotations

import copy

LONG = "A" * 20000
PARTS = [
    '<script>alert("x")</script>',
    "<img src=x onerror=alert(1)>",
    '"><svg onload=alert(1)><style>body{display:none}</style>',
    "' onmouseover='alert(1)' x='",
    "[click me](javascript:alert(1))",
    "![pixel](http://evil.example/p.png)",
    "<http://evil.example/auto>",
    "see http://evil.example/bare and www.evil.example and mail@evil.example",
    "\x1b[31mRED\x1b[0m\x07\x00\x08\x7f\x9b",
    "\u202eevil\u202c\u2066x\u2069",
    "| table | break |",
    "# heading",
    "`code` **bold** _em_ ~~del~~ $x^2$",
    "[link=http://evil.example]rich link[/link] [bold red]rich markup[/]",
    "&amp; &lt;entity&gt; {{ template }} {% raw %}",
]
HOSTILE = " ".join(PARTS) + "\n---\n* list\n1. item\r\n" + LONG
HOSTILE_ID = '<b id="x">row"1</b>\x1b[2J'
HOSTILE_CAP = 'caps[link=http://evil.example]x[/link][bold]<script>alert(1)</script>"\x1b[1m'


def _replace_strings(obj, old: str, new: str):
    """Replace every string value (and key) exactly equal to ``old``."""
    if isinstance(obj, str):
        return new if obj == old else obj
    if isinstance(obj, dict):
        return {(new if k == old else k): _replace_strings(v, old, new) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_replace_strings(v, old, new) for v in obj]
    return obj


def hostile_run(run: dict) -> dict:
    """A copy of a real run with hostile strings in every text field the report shows."""
    run = copy.deepcopy(run)
    cap = run["attribution"]["capabilities"][0]
    run = _replace_strings(run, cap["ranked"][0]["id"], HOSTILE_ID)  # a training row id, everywhere it occurs
    run = _replace_strings(run, cap["capability"], HOSTILE_CAP)  # a capability name, everywhere
    cap = run["attribution"]["capabilities"][0]
    for r in cap["ranked"]:
        r["prompt"] = HOSTILE
        r["completion"] = HOSTILE
    for c in cap["clusters"]:
        for e in c["exemplars"]:
            e["prompt"] = e["completion"] = HOSTILE
        c["common"]["distinctive_words"] = [{"word": p, "share_in_cluster": 1.0, "share_elsewhere": 0.0} for p in PARTS]
        c["common"]["formats"] = {HOSTILE[:200]: c["size"]}
    # drill-down: one row whose stored completion and sentence spans agree (text_source "row"), the rest not
    d0 = cap["drilldown"][0]
    s1, s2 = PARTS[0] + " " + PARTS[4] + ".", PARTS[8] + PARTS[9] + " " + PARTS[2] + "."
    text = s1 + " " + s2
    d0["sentences"] = [
        {"char_start": 0, "char_end": len(s1), "text": s1, "score": -2.0, "share": -1.0, "n_tokens": 5},
        {"char_start": len(s1) + 1, "char_end": len(text), "text": s2, "score": 1.0, "share": 0.5, "n_tokens": 5},
    ]
    d0["top_sentence"] = d0["sentences"][0]
    next(r for r in cap["ranked"] if r["id"] == d0["id"])["completion"] = text
    for d in cap["drilldown"][1:]:
        for s in d["sentences"]:
            s["text"] = HOSTILE
        d["item_id"] = HOSTILE_ID
    for f in cap["failing_items"]:
        f["prompt"] = [{"role": "user", "content": HOSTILE}]
        f["answer"] = f["tuned_answer"] = f["reference_answer"] = HOSTILE
    for it in run["evaluation"]["items"]:
        it["prompt"] = it["model_prompt"] = HOSTILE
        it["answer"] = HOSTILE
        it["tuned"]["output"] = it["tuned"]["answer"] = HOSTILE
    run["evaluation"]["notes"] = [HOSTILE]
    for f in run["audit"]["findings"]:
        f["message"] = f["fix"] = f["title"] = HOSTILE
        f["evidence"] = {HOSTILE[:80]: HOSTILE, "value": HOSTILE}
    run["audit"]["notes"] = [HOSTILE]
    run["manifest"]["notes"] = [HOSTILE]
    run["manifest"]["paths"]["data"] = "/tmp/" + HOSTILE[:300]
    run["manifest"]["identity"]["dataset"]["name"] = HOSTILE[:300]
    run["manifest"]["sign_convention"] = HOSTILE[:400]
    return run
