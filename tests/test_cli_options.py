"""Issue 26, the CLI: help panels, one default per concept, --references none, the LoRA-modules conflict,
progress in a log, the trajectory line, the doctor's hint."""

from __future__ import annotations

import io
import re

import pytest
from typer.testing import CliRunner

from gradian.cli import app

runner = CliRunner()

PANELS = ("Inputs", "Training setup", "Verdict", "Engines", "Output, index and storage", "Devices")


def _help(command: str) -> str:
    res = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    return res.output


@pytest.mark.parametrize("command", ["attribute", "index", "evaluate", "verify", "train"])
def test_options_are_grouped_in_panels(command):
    """Every option but --help sits under one of the six headings."""
    out = _help(command)
    heads = re.findall(r"╭─ (.+?) ─", out)
    assert set(heads) - {"Options", "Arguments"} <= set(PANELS) and len(set(heads) & set(PANELS)) >= 3, heads
    options_box = out.split("╭─ Options ")[1].split("╰")[0]
    assert re.findall(r"--[a-z-]+", options_box) == ["--help"], options_box


def test_one_default_per_concept_unit_device():
    """index --unit = attribute --unit (AttributeSpec.unit); --device auto everywhere a model is loaded."""
    from gradian.attribute import AttributeSpec
    from gradian.models.load import ModelSpec

    assert AttributeSpec().unit == "sentence" and ModelSpec("b").device == "auto"
    for command in ("attribute", "index", "evaluate"):
        flat = " ".join(_help(command).split())
        assert re.search(r"--device <str> auto \(default: cuda if available, else mps, else cpu\)", flat), command
        assert "[default: auto]" in flat.split("--device", 1)[1][:300], command
    for command in ("attribute", "index"):
        flat = " ".join(_help(command).split())
        assert "[default: sentence]" in flat.split("--unit <str>", 1)[1][:400], command  # the option, not a mention


def test_index_unit_sentence_builds_what_a_default_attribute_reads(saved_finetune, tmp_path, monkeypatch):
    """The default `gradian index` builds the row and the sentence-unit index; `--unit row` only the row one."""
    import json

    monkeypatch.setenv("GRADIAN_CACHE", str(tmp_path / "cache"))
    sf = saved_finetune
    args = ["index", "--base", str(sf["base"]), "--adapter", str(sf["adapter"]), "--data", str(sf["data"])]
    args += ["--max-length", "48", "--checkpoints", "final"]
    res = runner.invoke(app, [*args, "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    units = sorted(json.loads(m.read_text())["grad_spec"]["unit"] for m in (tmp_path / "a").rglob("manifest.json"))
    assert units == ["row", "sentence"], res.output
    res = runner.invoke(app, [*args, "--out", str(tmp_path / "b"), "--unit", "row"])
    assert res.exit_code == 0, res.output
    units = [json.loads(m.read_text())["grad_spec"]["unit"] for m in (tmp_path / "b").rglob("manifest.json")]
    assert units == ["row"]


def _attribute_specs(saved_finetune, tmp_path, monkeypatch, *extra):
    """The AttributeSpec `gradian attribute` builds from the flags (the run itself is stubbed out)."""
    import gradian.attribute.run

    got = {}

    def fake(inputs, specs, out, **kw):
        got["spec"] = specs.attribute
        return None  # what a rank other than 0 returns: the command stops there

    monkeypatch.setattr(gradian.attribute.run, "attribute_run", fake)
    monkeypatch.setenv("GRADIAN_CACHE", str(tmp_path / "cache"))
    sf = saved_finetune
    eval_path = tmp_path / "eval.jsonl"
    eval_path.write_text('{"id": "e1", "prompt": "p", "answer": "a", "capability": "c"}\n')
    args = ["attribute", "--base", str(sf["base"]), "--adapter", str(sf["adapter"]), "--data", str(sf["data"])]
    res = runner.invoke(app, [*args, "--eval", str(eval_path), "--out", str(tmp_path / "run"), *extra])
    return res, got.get("spec")


def test_references_none_implies_no_fusion(saved_finetune, tmp_path, monkeypatch):
    res, spec = _attribute_specs(saved_finetune, tmp_path, monkeypatch, "--references", "none")
    assert res.exit_code == 0, res.output
    assert spec.references == () and spec.fuse == ()
    res, spec = _attribute_specs(saved_finetune, tmp_path, monkeypatch, "--references", "repsim")
    assert res.exit_code == 0 and spec.references == ("repsim",) and spec.fuse == ("repsim",)
    res, spec = _attribute_specs(saved_finetune, tmp_path, monkeypatch, "--references", "bm25")
    assert res.exit_code == 0 and spec.references == ("bm25",) and spec.fuse == ("bm25",)
    res, spec = _attribute_specs(saved_finetune, tmp_path, monkeypatch)
    assert res.exit_code == 0 and spec.references == ("bm25", "repsim") and spec.fuse == ("bm25", "repsim")
    # an explicit --fuse of a reference that does not run is still the user's mistake, named
    res, _ = _attribute_specs(saved_finetune, tmp_path, monkeypatch, "--references", "none", "--fuse", "bm25")
    assert res.exit_code == 2 and "'bm25' is fused but not run" in res.output


def test_the_same_lora_modules_in_another_order_are_no_conflict():
    from gradian.audit.config.model import TrainConfig

    cfg = TrainConfig()
    cfg.set("lora_target_modules", ["q_proj", "k_proj", "v_proj"], "training_config.yaml: lora_target_modules")
    cfg.set("lora_target_modules", ["v_proj", "q_proj", "k_proj"], "adapter_config.json: target_modules")
    assert cfg.conflicts == []
    cfg.set("lora_target_modules", ["q_proj", "v_proj"], "other.json: target_modules")  # a real difference
    assert len(cfg.conflicts) == 1 and "lora_target_modules" in cfg.conflicts[0]
    cfg.set("max_length", 256, "a.yaml")
    cfg.set("max_length", 512, "b.yaml")
    assert len(cfg.conflicts) == 2  # other fields keep their exact comparison


def _line_console():
    from gradian.commands._common import SafeConsole

    buf = io.StringIO()
    return SafeConsole(file=buf, width=200, force_terminal=False), buf


def test_progress_in_a_log_is_lines_with_rate_and_eta(monkeypatch):
    """A console that is not a terminal gets a line per start, per interval and per end, not a redrawn bar."""
    from gradian.commands._common import LineProgress, rich_progress

    con, buf = _line_console()
    monkeypatch.setenv("GRADIAN_PROGRESS_EVERY", "0")
    p = rich_progress(con, info=True)
    assert isinstance(p, LineProgress)
    with p:
        t = p.add_task("[bold]per-row gradients (final)[/]", total=4, info="")
        p.advance(t, 1)
        p.update(t, completed=3, info="loss 2.5")
        p.advance(t, 1)
        p.advance(t, 1)  # past the total: no second "done" line
    lines = buf.getvalue().splitlines()
    assert lines[0] == "per-row gradients (final): 0/4 (0%) started", lines
    assert re.fullmatch(
        r"per-row gradients \(final\): 1/4 \(25%\) · [0-9.e+]+/s · elapsed 0:00( · ETA 0:\d\d)?", lines[1]
    )
    assert lines[2].startswith("per-row gradients (final): 3/4 (75%)") and lines[2].endswith("· loss 2.5")
    assert lines[3].startswith("per-row gradients (final): 4/4 (100%) · done in 0:00") and len(lines) == 4


def test_progress_lines_are_throttled():
    from gradian.commands._common import LineProgress

    con, buf = _line_console()
    p = LineProgress(con, every=3600)
    t = p.add_task("training", total=1000)
    for _ in range(1000):
        p.advance(t, 1)
    assert len(buf.getvalue().splitlines()) == 2  # the start and the end only


def test_a_terminal_still_gets_the_rich_bar():
    from rich.progress import Progress

    from gradian.commands._common import SafeConsole, rich_progress

    assert isinstance(rich_progress(SafeConsole(file=io.StringIO(), force_terminal=True)), Progress)


def test_the_trajectory_line_keeps_its_checkpoint_list():
    """The checkpoint list is text, not rich markup: `[step 11 ×0.28, ...]` is printed as it is."""
    from gradian.commands import _common
    from gradian.commands.attribute import print_attribution

    run = {
        "attribution": {
            "index": {"id": "abc", "n": 3, "blocks": 2, "dims": 10, "reused": False},
            "trajectory": {
                "checkpoints": [
                    {"final": False, "step": 11, "weight": 0.28},
                    {"final": True, "step": 20, "weight": 0.72},
                ],
                "weight_rule": "lr [mean]",
            },
            "capabilities": [],
        }
    }
    with _common.console.capture() as cap:
        print_attribution(run)
    assert "trajectory: 2 checkpoint(s) [step 11 ×0.28, final ×0.72]; weights: lr [mean]" in " ".join(cap.get().split())


def test_doctor_names_no_missing_train_option():
    """The doctor's reason for TRL named `gradian train --trainer trl`, an option that does not exist."""
    from gradian.doctor import OPTIONAL_WHY

    flat = " ".join(_help("train").split())
    for why in OPTIONAL_WHY.values():
        for opt in re.findall(r"gradian train (--[a-z-]+)", why):
            assert opt in flat, opt
    assert "--trainer" not in OPTIONAL_WHY["trl"]
