"""gradian verify on the planted tiny world: retrain without the blamed rows, re-evaluate, compare."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest

from gradian_testlib import cli_result, gradian_cache


@pytest.fixture()
def run_dir(demo, tmp_path, cache):
    """A private copy of the demo's poisoned run (verify writes into run.json)."""
    src = demo[0] / "out" / "poisoned"
    dst = tmp_path / "run"
    shutil.copytree(src, dst)
    return dst


@pytest.fixture(scope="session")
def verified(demo, tmp_path_factory):
    """One verify of the demo's run (fix, one control, one seed), then a second, resumed one."""
    root = demo[0]
    dst = tmp_path_factory.mktemp("verify") / "run"
    shutil.copytree(root / "out" / "poisoned", dst)
    with gradian_cache(root / "cache"):
        t = time.perf_counter()
        first = cli_result(["verify", dst, "--controls", "2", "--seed-band", "1"])
        t1 = time.perf_counter() - t
        t = time.perf_counter()
        second = cli_result(["verify", dst, "--controls", "2", "--seed-band", "1"])
        t2 = time.perf_counter() - t
    return dst, first, t1, second, t2


def test_fix_recovers_more_than_the_controls(verified):
    dst, (code, lines, out), *_ = verified
    assert code == 0, out
    rec = json.loads((dst / "run.json").read_text())["verification"]
    cap = rec["capabilities"]["capitals"]
    fix = cap["retrains"]["fix"]
    controls = [v for v in cap["retrains"].values() if v["kind"] == "control"]
    assert len(controls) == 2 and fix["removed"] == controls[0]["removed"] > 0
    # the planted world: dropping the blamed rows brings capitals back, dropping random rows does not as much
    assert fix["delta"] > 0 and fix["ci_low"] > 0
    assert all(fix["delta"] > c["delta"] for c in controls)
    assert fix["recovery"] > max(c["recovery"] for c in controls)
    # removing harmful rows lowers the query loss, as predicted (sign), and more than random removals
    assert fix["measured_query_loss_change"] < 0 and fix["predicted_query_loss_change"] < 0
    assert fix["measured_query_loss_change"] < min(c["measured_query_loss_change"] for c in controls)
    seed = cap["retrains"]["seed-1"]
    assert seed["removed"] == 0 and seed["predicted_query_loss_change"] == 0
    assert cap["line"].startswith("verified" if cap["verified"] else "not verified") and "blamed rows" in cap["line"]
    assert any(ln.startswith("verified") or ln.startswith("not verified") for ln in lines)
    assert rec["trainer"]["trainer"] == "gradian train"


def test_resumed_verify_reuses_every_retrain(verified):
    dst, first, t1, (code, lines, out), t2 = verified
    assert code == 0, out
    rec = json.loads((dst / "run.json").read_text())["verification"]
    assert all(r["reused"] for r in rec["retrains"].values())
    assert sum(":" in ln and "cached" in ln for ln in lines) == 4
    assert t2 < t1 / 2


def test_report_shows_the_verification(verified):
    from gradian.report import render, report_for_run

    dst = verified[0]
    rep = report_for_run(dst)
    md = render(rep, "md")
    html = render(rep, "html")
    assert "## Verification" in md and "blamed rows" in md
    assert "Verification" in html and "recovery" in html
    assert any("verified" in h for h in rep.headline)


STAND_IN = """
import sys, subprocess
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
# an "external trainer": here gradian train itself, driven as a foreign command would be
cmd = [sys.executable, "-m", "gradian.cli", "train", "--base", args["--base"], "--data", args["--data"]]
cmd += ["--out", args["--out"], "--config", args["--config"], "--seed", args["--seed"], "--overwrite"]
sys.exit(subprocess.call(cmd))
"""


def test_train_command_stand_in(run_dir, tmp_path):
    script = tmp_path / "my_trainer.py"
    script.write_text(STAND_IN)
    cfg = json.loads((run_dir / "run.json").read_text())["manifest"]["paths"]["adapter"]
    cmd = (
        f"{sys.executable} {script} --base {{base}} --data {{data}} --out {{out}} --seed {{seed}} "
        f"--config {Path(cfg) / 'training_config.yaml'}"
    )
    code, lines, out = cli_result(["verify", run_dir, "--controls", "0", "--seed-band", "0", "--train-command", cmd])
    assert code == 0, out
    rec = json.loads((run_dir / "run.json").read_text())["verification"]
    assert rec["trainer"] == {"trainer": "command", "template": cmd}
    assert list(rec["capabilities"]["capitals"]["retrains"]) == ["fix"]
    assert rec["capabilities"]["capitals"]["retrains"]["fix"]["delta"] > 0


def test_no_run_json_exits_2(tmp_path, cache):
    code, lines, out = cli_result(["verify", tmp_path])
    assert code == 2 and len(lines) == 1 and "run.json" in lines[0] and "fix:" in lines[0]


def test_unmappable_config_exits_2(run_dir, tmp_path):
    bad = tmp_path / "train.yaml"
    bad.write_text("model_name_or_path: x\nuse_peft: false\nlearning_rate: 1.0e-5\n")
    before = (run_dir / "run.json").read_text()
    code, lines, out = cli_result(["verify", run_dir, "--config", bad])
    assert code == 2 and len(lines) == 1 and "fix:" in lines[0], out
    assert (run_dir / "run.json").read_text() == before


def test_failing_train_command_exits_2_and_writes_nothing(run_dir, cache):
    before = (run_dir / "run.json").read_text()
    n_cached = len(list((cache / "verify").glob("*/adapter"))) if (cache / "verify").exists() else 0
    code, lines, out = cli_result(
        ["verify", run_dir, "--train-command", f"{sys.executable} -c 'import sys; sys.exit(3)'"]
    )
    assert code == 2 and len(lines) >= 1, out
    err = [ln for ln in lines if ln.startswith("error:")]
    assert len(err) == 1 and "exit code 3" in err[0] and "fix:" in err[0]
    assert (run_dir / "run.json").read_text() == before  # no half-written result
    assert not (run_dir / ".verify").exists()
    assert len(list((cache / "verify").glob("*/adapter"))) == n_cached
    assert not list((cache / "verify").glob("*/.adapter.*"))


def test_spec_errors_exit_2(run_dir):
    code, lines, _ = cli_result(["verify", run_dir, "--remove", "0"])
    assert code == 2 and "--remove" in lines[-1]
    code, lines, _ = cli_result(["verify", run_dir, "--remove", "3", "--remove-cluster", "1"])
    assert code == 2 and "cannot be combined" in lines[-1]
