"""Issue 22: ``gradian verify`` says, before the first retrain, that it retrains with a setup Audit flagged
(the tiny report world: learning rate 1e-2 on LoRA and too many epochs, both error-level), and records it."""

from __future__ import annotations

import json
import shutil
import sys
import traceback
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "report"))
from report_world import real_run  # noqa: E402

from gradian.cli import app  # noqa: E402
from gradian_testlib import copy_adapter_command  # noqa: E402


@pytest.fixture()
def run_dir(tmp_path, monkeypatch):
    real = real_run()
    monkeypatch.setenv("GRADIAN_CACHE", str(real["root"] / "cache"))
    dst = tmp_path / "run"
    shutil.copytree(real["run_dir"], dst, ignore=shutil.ignore_patterns("index"))
    return dst, real["run"]


def test_verify_names_the_flagged_setup_before_retraining(run_dir):
    dst, run = run_dir
    cmd = copy_adapter_command(run)
    res = CliRunner().invoke(app, ["verify", str(dst), "--controls", "0", "--seed-band", "0", "--train-command", cmd])
    out = res.output + (
        "".join(traceback.format_exception(*res.exc_info)) if res.exc_info and res.exception is not None else ""
    )
    assert res.exit_code == 0, out
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    i_warn = next(i for i, ln in enumerate(lines) if "retraining with the setup Audit flagged" in ln)
    i_fix = next(i for i, ln in enumerate(lines) if "fix:" in ln and "rows removed" in ln)
    assert i_warn < i_fix, out  # before the first retrain
    assert "C02: Learning rate far too high" in lines[i_warn] and "C03" in lines[i_warn]
    rec = json.loads((dst / "run.json").read_text())["verification"]
    assert {"C02", "C03"} <= {f["id"] for f in rec["audit_setup"]["findings"]}
    assert rec["audit_setup"]["config"] is None and rec["audit_setup"]["line"].startswith("warning:")


def test_no_flag_without_an_error_level_setup_finding(run_dir):
    from gradian.verify.run import flagged_setup

    _, run = run_dir
    assert flagged_setup(run) is not None
    quiet = json.loads(json.dumps(run))
    for f in quiet["audit"]["findings"]:
        if f["severity"] == "error":
            f["severity"] = "warning"
    assert flagged_setup(quiet) is None
    other = flagged_setup(run, config="my_fixed.yaml")
    assert "these retrains use my_fixed.yaml, which Audit did not check" in other["line"]
