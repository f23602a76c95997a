"""`gradian diagnose`: exit codes (0 clean, 1 findings at/above --fail-on, 2 user error), formats, the check
list, and docs/checks.md kept equal to the generated text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradian.audit.render import checks_markdown
from gradian.cli import app
from gradian_testlib import assert_one_line_error

DOCS = Path(__file__).resolve().parents[2] / "docs" / "checks.md"


def run(*args):
    return CliRunner().invoke(app, ["diagnose", *[str(a) for a in args]])


def _clean_args(world):
    return [
        "--data",
        world.data,
        "--eval",
        world.eval,
        "--config",
        world.config,
        "--logs",
        world.logs,
        "--tokenizer",
        world.tok_dir,
    ]


def test_clean_exits_0(world):
    res = run(*_clean_args(world))
    assert res.exit_code == 0, res.output
    assert "0 errors, 0 warnings" in res.output
    res = run(*_clean_args(world), "--fail-on", "warning")
    assert res.exit_code == 0, res.output


def test_findings_exit_1_unless_fail_on_says_otherwise(world):
    bad = world.config_with(learning_rate=5e-3, num_train_epochs=12)  # C02 + C03 errors
    res = run("--data", world.data, "--config", bad)
    assert res.exit_code == 1, res.output
    assert "ERRORS" in res.output and "C02" in res.output and "C03" in res.output and "fix:" in res.output
    assert run("--data", world.data, "--config", bad, "--fail-on", "never").exit_code == 0
    warn_only = world.config_with(learning_rate=2e-5)  # C01 warning
    assert run("--config", warn_only).exit_code == 0
    assert run("--config", warn_only, "--fail-on", "warning").exit_code == 1


def test_json_and_md_to_file(world, tmp_path):
    out = tmp_path / "audit.json"
    bad = world.config_with(learning_rate=5e-3)
    res = run("--data", world.data, "--config", bad, "--format", "json", "--out", out)
    assert res.exit_code == 1
    d = json.loads(out.read_text())
    assert d["schema"] == "gradian.audit/1" and d["counts"]["error"] >= 1
    assert d["findings"][0]["id"] == "C02" and d["config"]["values"]["learning_rate"]["value"] == 5e-3
    res = run("--config", world.config, "--format", "md")
    assert res.exit_code == 0 and res.output.startswith("# gradian diagnose")
    res = run("--config", world.config, "--format", "json")
    assert json.loads(res.output)["counts"]["checks"] >= 41


def test_list(world):
    res = run("--list")
    assert res.exit_code == 0 and "D04" in res.output and "L11" in res.output
    checks = json.loads(run("--list", "--format", "json").output)
    assert len(checks) >= 41 and len({c["id"] for c in checks}) == len(checks)
    assert all(c["fix"] and c["rule"] and c["title"] and c["severity"] in ("error", "warning", "info") for c in checks)
    assert run("--list", "--format", "md").output == checks_markdown()


def test_docs_checks_md_is_generated():
    """docs/checks.md must be exactly `gradian diagnose --list --format md` (regenerate with that command)."""
    assert DOCS.read_text(encoding="utf-8") == checks_markdown()


@pytest.mark.parametrize(
    "args,needle",
    [
        ([], "nothing to diagnose"),
        (["--config", "{missing}"], "config not found"),
        (["--config", "{bad_yaml}"], "malformed YAML"),
        (["--config", "{unknown}"], "unknown config format"),
        (["--logs", "{no_history}"], "no log_history"),
        (["--logs", "{bad_jsonl}"], "malformed JSON"),
        (["--data", "{bad_data}"], "malformed JSON"),
        (["--tokenizer", "{missing}"], "tokenizer folder not found"),
        (["--config", "{good}", "--versions", "trl"], "not NAME=VERSION"),
        (["--config", "{good}", "--format", "html"], "unknown format"),
        (["--config", "{good}", "--fail-on", "sometimes"], "unknown level"),
        (["--config", "{good}", "--check", "Z99"], "unknown check id"),
    ],
)
def test_user_errors_one_line_exit_2(world, tmp_path, args, needle):
    files = {
        "missing": tmp_path / "nope.yaml",
        "bad_yaml": tmp_path / "bad.yaml",
        "unknown": tmp_path / "u.yaml",
        "no_history": tmp_path / "trainer_state.json",
        "bad_jsonl": tmp_path / "logs.jsonl",
        "bad_data": tmp_path / "train.jsonl",
        "good": world.config,
    }
    files["bad_yaml"].write_text("learning_rate: 1e-4\n lora_r: [8\n")
    files["unknown"].write_text("hello: world\n")
    files["no_history"].write_text('{"global_step": 10}')
    files["bad_jsonl"].write_text('{"loss": 1}\n{oops}\n')
    files["bad_data"].write_text('{"prompt": "a", "completion": "b"}\n{"prompt": \n')
    res = run(*[a.format(**files) for a in args])
    assert_one_line_error(res, needle, fix=None, starts="error:")


def test_docs_diagnose_md_schema_is_current():
    """The JSON schema printed in docs/diagnose.md is gradian.audit.JSON_SCHEMA."""
    from gradian.audit import JSON_SCHEMA

    text = (DOCS.parent / "diagnose.md").read_text(encoding="utf-8")
    block = text.split("a test keeps this copy equal to it):\n\n```json\n", 1)[1].split("\n```", 1)[0]
    assert json.loads(block) == JSON_SCHEMA
