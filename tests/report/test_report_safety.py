"""Safety: hostile strings in every place data reaches the report, through the WHOLE report
(build_report → HTML, Markdown, text): nothing executable, no markup from data, no control characters."""

from __future__ import annotations

import io
import json
from html.parser import HTMLParser
from pathlib import Path

import pytest
from report_hostile import HOSTILE, HOSTILE_CAP, hostile_run
from report_world import real_run
from rich.console import Console

from gradian.report import build_report, read_training_log, render_html, render_markdown, render_terminal, render_text
from gradian.report.safe import clean, md_text


@pytest.fixture(scope="module")
def hostile_report():
    real = real_run()
    run = hostile_run(real["run"])
    return build_report(run, read_training_log(real["run"]))


def _no_control(s: str) -> None:
    bad = sorted(
        {
            hex(ord(c))
            for c in s
            if (ord(c) < 32 and c not in "\n\t")
            or 0x7F <= ord(c) <= 0x9F
            or c in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f"
        }
    )
    assert not bad, bad


ALLOWED_TAGS = {
    "html",
    "head",
    "meta",
    "title",
    "style",
    "body",
    "main",
    "header",
    "footer",
    "section",
    "h1",
    "h2",
    "h3",
    "h4",
    "p",
    "code",
    "pre",
    "ol",
    "ul",
    "li",
    "div",
    "b",
    "span",
    "table",
    "thead",
    "tbody",
    "tr",
    "th",
    "td",
    "details",
    "summary",
    "mark",
    "svg",
    "line",
    "text",
    "circle",
    "rect",
    "path",
    "polyline",
}
ALLOWED_ATTRS = {
    "charset",
    "http-equiv",
    "content",
    "name",
    "lang",
    "class",
    "style",
    "title",
    "id",
    "xmlns",
    "role",
    "aria-label",
    "viewbox",
    "width",
    "height",
    "x",
    "y",
    "x1",
    "y1",
    "x2",
    "y2",
    "cx",
    "cy",
    "r",
    "d",
    "points",
    "fill",
    "stroke",
    "stroke-width",
    "stroke-dasharray",
    "opacity",
    "fill-opacity",
    "text-anchor",
    "font-size",
    "font-weight",
    "transform",
}


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list]] = []
        self.text: list[str] = []
        self.in_style = False
        self.style_text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, attrs))
        self.in_style = tag == "style"

    def handle_endtag(self, tag):
        if tag == "style":
            self.in_style = False

    def handle_data(self, data):
        (self.style_text if self.in_style else self.text).append(data)


def test_html_has_no_markup_from_data(hostile_report):
    html = render_html(hostile_report)
    _no_control(html)
    assert "<script" not in html.lower() and "javascript:" not in html.lower().replace("javascript:alert(1))", "")
    p = _Collect()
    p.feed(html)
    tags = {t for t, _ in p.tags}
    assert tags <= ALLOWED_TAGS, tags - ALLOWED_TAGS
    assert sum(1 for t, _ in p.tags if t == "style") == 1  # ours only
    assert not any(t in ("img", "script", "iframe", "object", "a", "link", "base", "form", "input") for t in tags)
    for t, attrs in p.tags:
        for k, v in attrs:
            assert k in ALLOWED_ATTRS, (t, k, v)
            assert not k.startswith("on"), (t, k)
        if t == "b":
            assert not attrs  # the hostile <b id="x"> did not become an element
    assert "body{display:none}" not in "".join(p.style_text)
    # the hostile text is shown, as text
    text = "".join(p.text)
    assert '<script>alert("x")</script>' in text and "<img src=x onerror=alert(1)>" in text
    assert '<b id="x">row"1</b>' in text and "[bold]<script>alert(1)</script>" in text
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html or "&lt;script&gt;alert(&quot;x&quot;)" in html
    # the drill-down row whose spans agree with its text is highlighted sentence by sentence
    assert 'class="top"' in html
    # CSP forbids scripts and fetches
    csp = [
        dict(a)["content"] for t, a in p.tags if t == "meta" and dict(a).get("http-equiv") == "Content-Security-Policy"
    ]
    assert csp and "default-src 'none'" in csp[0] and "script-src" not in csp[0]


def _md_tokens(md: str):
    from markdown_it import MarkdownIt

    parser = MarkdownIt("commonmark").enable("table").enable("strikethrough")
    out = []

    def walk(tokens):
        for t in tokens:
            out.append(t)
            if t.children:
                walk(t.children)

    walk(parser.parse(md))
    return out, parser


def test_markdown_has_no_links_images_or_html_from_data(hostile_report):
    md = render_markdown(hostile_report)
    _no_control(md)
    tokens, parser = _md_tokens(md)
    kinds = {t.type for t in tokens}
    for bad in ("link_open", "image", "html_inline", "html_block", "s_open"):
        assert bad not in kinds, bad
    # our own emphasis only: every strong_open wraps report text, never a data string
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert not any(h.strip() == "heading" for h in headings)
    # no bare autolink survives for a GFM renderer: the scheme colon and the www dot are escaped
    assert "http://evil" not in md and "www.evil" not in md and "mail@evil" not in md
    # tables keep their shape: every row has the header's number of unescaped pipes
    lines = md.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|---"):
            want = _pipes(lines[i - 1])
            j = i + 1
            while j < len(lines) and lines[j].startswith("| "):
                assert _pipes(lines[j]) == want, lines[j][:200]
                j += 1
    # long lines are shortened
    assert max(len(x) for x in lines) < 4000
    html = parser.render(md)
    assert "<script" not in html and "&lt;script&gt;" in html


def _pipes(line: str) -> int:
    n, esc = 0, False
    for ch in line:
        if esc:
            esc = False
        elif ch == "\\":
            esc = True
        elif ch == "|":
            n += 1
    return n


def test_text_and_terminal_drop_control_sequences(hostile_report):
    txt = render_text(hostile_report)
    _no_control(txt)
    assert '<script>alert("x")</script>' in txt  # plain text: shown as is
    assert "caps[link=http://evil.example]x[/link][bold]<script>" in txt  # never parsed as rich markup
    assert max(len(x) for x in txt.splitlines()) <= 110
    # a colour terminal: our own styles only, no escape sequence from the data
    buf = io.StringIO()
    render_terminal(
        hostile_report, Console(file=buf, force_terminal=True, color_system="truecolor", width=120), details=True
    )
    out = buf.getvalue()
    for seq in ("\x1b[31mRED", "\x1b[2J", "\x07", "\x00", "\x08", "\x9b", "\u202e", "\x1b[1m\n"):
        assert seq not in out, repr(seq)
    assert "\x1b]8;" not in out  # no OSC 8 hyperlink from [link=...]


def test_json_keeps_the_data_verbatim(hostile_report):
    """The JSON form is data: the strings are kept exactly (JSON escapes them), to be escaped by whoever shows them."""
    from gradian.report import report_json

    text = report_json(hostile_report)
    data = json.loads(text)
    cap = data["capabilities"][0]
    assert cap["name"] == HOSTILE_CAP
    assert HOSTILE in [r["completion"] for r in cap["attribution"]["ranked"]]
    _no_control(text)  # JSON escapes control characters as \\uXXXX


def test_helpers():
    assert clean("a\x1b[31mb\x00c\r\nd\u2028e\u202ef\tg") == "a[31mbc\nd\nef\tg"
    assert md_text("[x](y) ![i](u) <b> a|b *c* `d` http://e.f www.g.h") == (
        "\\[x\\]\\(y\\) \\!\\[i\\]\\(u\\) &lt;b&gt; a\\|b \\*c\\* \\`d\\` http\\://e.f www\\.g.h"
    )
    assert md_text("1. x") == "1\\. x" and md_text("- x") == "\\- x" and md_text("# x") == "\\# x"
    assert md_text("a\nb", 100) == "a ⏎ b" and len(md_text("x" * 50, 10)) == 10


def test_visible_shows_what_clean_removes():
    from gradian.report.safe import has_unsafe, visible

    s = "a\x1b[2J\x9b\u202eb\r\nc\rd\u2028\x00e\tf"
    assert visible(s) == "a\\u001b[2J\\u009b\\u202eb\nc\\u000dd\\u2028\\u0000e\tf"
    assert visible(s, keep_cr=True) == "a\\u001b[2J\\u009b\\u202eb\nc\rd\\u2028\\u0000e\tf"
    assert not has_unsafe(visible(s)) and has_unsafe(s) and visible(visible(s)) == visible(s)
    assert json.loads('"' + visible("\x1b\u202e\x9b") + '"') == "\x1b\u202e\x9b"  # the escape means the same in JSON


# ---------------------------------------------------------------------- the CLI on a hostile world
# ids, capability names and row text holding a screen clear, an OSC 8 link, a C1 CSI, bidi overrides, rich markup
H = "\x1b[2J\x1b]8;;http://evil.example\x1b\\link\x1b]8;;\x1b\\\x9b31m\u202eevil\u2066x\u2069[bold]B[/]"
H_SHOWN = "\\u001b[2J\\u001b]8;;http://evil.example\\u001b\\link"  # how the CLI shows it (visible)
_RAW = __import__("re").compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


@pytest.fixture(scope="module")
def hostile_cli(tmp_path_factory):
    """The report world's base and adapter with hostile training ids and text, eval ids and capability names."""
    w = real_run()["world"]
    root = tmp_path_factory.mktemp("hostile-cli")
    rows = [json.loads(ln) for ln in Path(w["data"]).read_text().splitlines()]
    for i, r in enumerate(rows):
        r["id"] += H
        if r["id"].startswith("sym-") and i % 2:
            r["messages"][0]["content"] += " " + H
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ev = [json.loads(ln) for ln in Path(w["eval"]).read_text().splitlines()]
    for r in ev:
        r["id"] += H
        r["capability"] += "<script>x</script>" + H
    (root / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ev))
    return {**w, "data": root / "train.jsonl", "eval": root / "eval.jsonl", "root": root}


def _run_cli(args, monkeypatch):
    from typer.testing import CliRunner

    from gradian.cli import app

    monkeypatch.setenv("NO_COLOR", "1")
    res = CliRunner().invoke(app, [str(a) for a in args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    for name, text in (("stdout", res.stdout), ("stderr", res.stderr)):
        bad = [ln for ln in text.splitlines() if _RAW.search(ln)]
        assert not bad, f"{len(bad)} {name} line(s) with a raw control/bidi character, e.g. {bad[0]!r}"
    return res


def test_cli_evaluate_attribute_report_show_data_escaped(hostile_cli, tmp_path, monkeypatch):
    w = hostile_cli
    monkeypatch.setenv("GRADIAN_CACHE", str(tmp_path / "cache"))
    common = ["--base", w["base"], "--adapter", w["adapter"]]
    ev = _run_cli(["evaluate", *common, "--eval", w["eval"], "--max-new-tokens", "12"], monkeypatch)
    assert ev.exit_code == 0, ev.output
    assert f"capitals<script>x</script>{H_SHOWN}" in ev.stdout and "[bold]B[/]" in ev.stdout  # no markup from data

    run = tmp_path / "run"
    args = ["attribute", *common, "--data", w["data"], "--eval", w["eval"], "--out", run, "--max-length", "40"]
    at = _run_cli([*args, "--config", w["config"], "--logs", w["logs"], "--project-dim", "0"], monkeypatch)
    assert at.exit_code == 0, at.output
    assert "most harmful training rows for" in at.stdout and "checkpoint(s) [step 30 ×" in at.stdout, at.stdout
    ids = [ln for ln in at.stdout.splitlines() if ("long-" in ln or "short-" in ln or "profile-" in ln)]
    assert ids and any(H_SHOWN[:20] in ln for ln in ids), at.stdout  # a training row id, escaped and visible

    for extra in ([], ["--format", "text"], ["--format", "json"], ["--format", "md"]):
        rep = _run_cli(["report", run, *extra], monkeypatch)
        assert rep.exit_code == 0 and rep.stdout.strip(), rep.output
    data = json.loads(_run_cli(["report", run, "--format", "json"], monkeypatch).stdout)
    assert any(c["name"].startswith("capitals<script>x</script>\x1b[2J") for c in data["capabilities"])  # verbatim


def test_cli_diagnose_and_index_show_data_escaped(hostile_cli, tmp_path, monkeypatch):
    w = hostile_cli
    monkeypatch.setenv("GRADIAN_CACHE", str(tmp_path / "cache"))
    for fmt in ("text", "json", "md"):
        dg = _run_cli(
            ["diagnose", "--data", w["data"], "--config", w["config"], "--logs", w["logs"], "--format", fmt, "-v"],
            monkeypatch,
        )
        assert dg.exit_code in (0, 1), dg.output
        if fmt == "json":
            json.loads(dg.stdout)  # still valid JSON after escaping
        elif fmt == "text":
            assert "\\u001b[2J" in dg.stdout, dg.stdout  # the hostile ids in the findings, escaped
    ix = _run_cli(
        ["index", "--base", w["base"], "--adapter", w["adapter"], "--data", w["data"], "--max-length", "40"]
        + ["--project-dim", "0", "--out", tmp_path / "idx"],
        monkeypatch,
    )
    assert ix.exit_code == 0, ix.output
    # a user error naming a hostile row: one line, escaped
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "r" + H, "prompt": "p"}) + "\n")
    er = _run_cli(["diagnose", "--data", bad], monkeypatch)
    assert er.exit_code in (0, 1, 2), er.output
