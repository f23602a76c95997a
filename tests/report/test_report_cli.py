"""``gradian report RUN_DIR``: re-renders a finished run without loading a model or recomputing anything."""

from __future__ import annotations

import json
import shutil

import pytest
from report_world import real_run
from typer.testing import CliRunner

from gradian.cli import app
from gradian.report import Report, report_json
from gradian_testlib import assert_one_line_error

runner = CliRunner()


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    """A copy of the real run folder, with every way of loading a model or recomputing made to fail."""
    real = real_run()
    d = tmp_path / "run"
    d.mkdir()
    shutil.copy(real["run_dir"] / "run.json", d / "run.json")

    def boom(*a, **k):
        raise AssertionError("gradian report must not load a model or recompute")

    import gradian.attribute.run
    import gradian.evaluate
    import gradian.finetune
    import gradian.models.load

    monkeypatch.setattr(gradian.models.load, "load_base", boom)
    monkeypatch.setattr(gradian.models.load, "load_adapter", boom)
    monkeypatch.setattr(gradian.finetune, "load_finetune", boom)
    monkeypatch.setattr(gradian.finetune, "training_index", boom)
    monkeypatch.setattr(gradian.attribute.run, "attribute_run", boom)
    monkeypatch.setattr(gradian.evaluate, "evaluate", boom)
    return d


def test_default_writes_html_and_prints_the_summary(run_dir):
    res = runner.invoke(app, ["report", str(run_dir)])
    assert res.exit_code == 0, res.output
    html = (run_dir / "report.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and "<svg" in html and "Manifest" in html
    out = res.output
    assert "capitals regressed" in out and "Top harmful clusters: capitals" in out and "manifest" in out
    assert out.index("capitals regressed") < out.index("Top harmful clusters") < out.index("manifest")
    assert "report.html" in out


def test_json_round_trips_and_equals_the_api(run_dir):
    res = runner.invoke(app, ["report", str(run_dir), "--format", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert (
        data["schema"] == "gradian.report/1"
        and data["run_id"] == json.loads((run_dir / "run.json").read_text())["manifest"]["run_id"]
    )
    back = Report.from_dict(data)
    assert report_json(back) == res.stdout
    # --out writes the same, atomically, and nothing else is created
    out = run_dir / "r.json"
    res = runner.invoke(app, ["report", str(run_dir), "--format", "json", "--out", str(out)])
    assert res.exit_code == 0 and out.read_text() == report_json(back)
    assert sorted(p.name for p in run_dir.iterdir()) == ["r.json", "run.json"]


@pytest.mark.parametrize("fmt,marker", [("md", "## Summary"), ("text", "Gradian report"), ("html", "<!DOCTYPE html>")])
def test_formats_to_file(run_dir, fmt, marker):
    out = run_dir / f"report.{fmt}"
    res = runner.invoke(app, ["report", str(run_dir), "--format", fmt, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert out.read_text().startswith(marker) or marker in out.read_text()[:200]


def test_markdown_to_stdout(run_dir):
    res = runner.invoke(app, ["report", str(run_dir), "--format", "md", "--out", "-"])
    assert res.exit_code == 0 and res.stdout.startswith("# Gradian report")
    assert sorted(p.name for p in run_dir.iterdir()) == ["run.json"]  # nothing written


def test_markdown_writes_report_md_like_html(run_dir):
    """`--format md` writes RUN_DIR/report.md (as html writes report.html); stdout names the file."""
    res = runner.invoke(app, ["report", str(run_dir), "--format", "md"])
    assert res.exit_code == 0, res.output
    assert (run_dir / "report.md").read_text().startswith("# Gradian report")
    assert "report.md" in res.stdout and "# Gradian report" not in res.stdout


@pytest.mark.parametrize(
    "args,msg",
    [
        (["report", "{tmp}/nope"], "run folder not found"),
        (["report", "{tmp}/empty"], "no run.json here"),
        (["report", "{tmp}/bad"], "malformed JSON"),
        (["report", "{tmp}/other"], "not a gradian.run/1 file"),
        (["report", "{run}", "--format", "pdf"], "unknown format 'pdf'"),
        (
            ["report", "{run}", "--format", "md", "--out", "{tmp}/no/such/dir/r.md"],
            "the folder of --out does not exist",
        ),
    ],
)
def test_user_errors_are_one_line_exit_2(run_dir, tmp_path, args, msg):
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "run.json").write_text("{ not json")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "run.json").write_text(json.dumps({"schema": "gradian.evaluate/1"}))
    res = runner.invoke(app, [a.format(tmp=tmp_path, run=run_dir) for a in args])
    assert_one_line_error(res, msg, text=res.stderr if hasattr(res, "stderr") else res.output)
