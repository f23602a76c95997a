"""The HTML report in a real browser: headless Chromium renders a real run's report (with a hostile
row in it), takes a PNG screenshot, and dumps the DOM; the DOM holds the summary, the plots and the
escaped text, and no element came from the data.

Chromium is Debian's ``chromium`` package (``.ci/run`` installs it; locally:
``apt-get install -y chromium``). Where it is absent the test is skipped, saying so.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from report_hostile import hostile_run
from report_world import real_run

from gradian.report import build_report, read_training_log, render_html


def chromium() -> str | None:
    for cand in (
        "/usr/bin/chromium",
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
        shutil.which("google-chrome"),
    ):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
]


def run_chromium(exe: str, args: list[str], profile: Path, timeout: int = 90) -> subprocess.CompletedProcess:
    return subprocess.run(
        [exe, *FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        timeout=timeout,
        env={**os.environ, "HOME": str(profile)},
    )


def screenshot(exe: str, html: Path, png: Path, width: int = 1280, height: int = 2000, hide_css: str = "") -> Path:
    """PNG of ``html`` in headless Chromium; ``hide_css`` (e.g. ``"#summary{display:none}"``) is added
    to a temporary copy of the page to start the view at a later section."""
    src = html
    if hide_css:
        src = png.with_suffix(".view.html")
        src.write_text(html.read_text(encoding="utf-8").replace("</style>", hide_css + "</style>", 1), encoding="utf-8")
    profile = png.with_suffix(".profile")
    res = run_chromium(exe, [f"--screenshot={png}", f"--window-size={width},{height}", src.as_uri()], profile)
    shutil.rmtree(profile, ignore_errors=True)
    if src != html:
        src.unlink()
    if not png.exists():
        raise RuntimeError(res.stderr.decode(errors="replace")[-2000:])
    return png


def png_info(path: Path) -> tuple[int, int, int]:
    """(width, height, distinct byte values in the decompressed image data) of a PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, w, h = 8, b"", 0, 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            w, h = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    return w, h, len(set(zlib.decompress(idat)))


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    exe = chromium()
    if exe is None:
        pytest.skip(
            "headless Chromium not found (/usr/bin/chromium or on PATH): install Debian's chromium "
            "(apt-get install -y chromium) to run the browser test; CI's .ci/run installs it"
        )
    real = real_run()
    root = tmp_path_factory.mktemp("browser")
    report = build_report(hostile_run(real["run"]), read_training_log(real["run"]))
    html = root / "report.html"
    html.write_text(render_html(report), encoding="utf-8")
    return exe, root, html


def test_screenshot_is_a_real_rendering(page):
    exe, root, html = page
    png = screenshot(exe, html, root / "shot.png", 1280, 2000)
    w, h, distinct = png_info(png)
    assert (w, h) == (1280, 2000)
    assert png.stat().st_size > 30_000 and distinct > 50  # text, plots and colours, not a blank page


def test_dom_holds_summary_plots_and_escaped_text(page):
    exe, root, html = page
    res = run_chromium(exe, ["--dump-dom", html.as_uri()], root / "profile-dom")
    dom = res.stdout.decode("utf-8", errors="replace")
    assert "<h2>Summary</h2>" in dom and "Verdict per capability, and how sure" in dom
    assert 'class="headline"' in dom and "regressed" in dom and "Top harmful clusters" in dom
    assert any(
        t in dom for t in ("its only row is truncated (check D04)", "rows are truncated", "are truncated (check D04)")
    )
    assert "Manifest" in dom
    # the plots: CI, score profile, clusters, loss curve
    for cls in ("plot ci", "plot profile", "plot clusters", "plot loss"):
        assert f'class="{cls}"' in dom, cls
    assert dom.count("<svg") >= 4
    # the per-sentence view
    assert '<mark class="top"' in dom
    # escaped text: the hostile strings are text nodes, serialised escaped; nothing became an element
    assert '&lt;script&gt;alert("x")&lt;/script&gt;' in dom
    assert "&lt;img src=x onerror=alert(1)&gt;" in dom
    assert (
        "<script" not in dom.lower()
        and "<img" not in dom.lower()
        and "onerror=" not in dom.replace("&lt;img src=x onerror=alert(1)&gt;", "")
    )
    assert "<iframe" not in dom and "<a " not in dom


if __name__ == "__main__":
    # The docs screenshots: PYTHONPATH=tests python tests/report/test_report_browser.py RUN_DIR OUT_DIR [NAME]
    # without NAME: report-summary.png and report-details.png; with NAME (tiny, quick, worked):
    # NAME-report-verdict.png (the page from the summary) and NAME-report-drilldown.png (from the rows table on).
    import sys

    from gradian.report import render_html, report_for_run

    run_dir, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    exe = chromium()
    if exe is None:
        sys.exit("chromium not found")
    page_html = render_html(report_for_run(run_dir))
    html = out / "report.tmp.html"
    html.write_text(page_html, encoding="utf-8")
    if len(sys.argv) > 3:
        name = sys.argv[3]
        a = screenshot(exe, html, out / f"{name}-report-verdict.png", 1280, 1500, "header{display:none}")
        start = page_html.index('<section id="details">') + len('<section id="details">')
        rows = page_html.index("<h4>Most harmful training rows", start)
        html.write_text(page_html[:start] + page_html[rows:], encoding="utf-8")
        b = screenshot(exe, html, out / f"{name}-report-drilldown.png", 1280, 2100, "header,#summary{display:none}")
    else:
        a = screenshot(exe, html, out / "report-summary.png", 1100, 1450)
        b = screenshot(exe, html, out / "report-details.png", 1100, 1450, "header,#summary{display:none}")
    html.unlink()
    for p in (a, b):
        print(p, png_info(p)[:2], p.stat().st_size, "bytes")
