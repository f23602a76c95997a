"""Issue 26, the CLI: one default per concept across commands, --device auto everywhere, one meaning of --out.

The first test walks the whole typer app (every command's click params) and fails when an option that two commands
share has two defaults; ``ALLOWED`` lists, with the reason, the few same-named options that mean different things.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gradian.cli import app

runner = CliRunner()

#: Same-named options whose defaults may differ, because the flag means something else in each command.
#: Every entry must still differ (a stale entry fails ``test_the_allowlist_is_not_stale``).
ALLOWED: dict[str, str] = {
    # what each command writes: a run folder, an index folder, an adapter folder, a world folder, one file
    "--out": "each command's --out is the folder (or the one file) that command writes",
    # diagnose prints text|json|md; report renders html|md|json|text and writes report.html by default
    "--format": "diagnose and report offer different formats",
    # the demo's 512 is the published demo recipe (its scorecards in docs/benchmarks.md); attribute and index
    # keep exact storage (0) and let the run plan pick a projection only when exact does not fit the budget
    "--project-dim": "demo pins the worked example's recipe; attribute/index default to exact storage",
    # world's training knobs leave the world's own recipe (worlds.spec.default_train_spec) when not given;
    # train's fall back to TrainSpec (trl-like defaults for a user's data)
    "--epochs": "world: the world's own recipe; train: TrainSpec's default",
    "--alpha": "world: the world's own recipe; train: TrainSpec's default",
    "--targets": "world: the world's own recipe; train: TrainSpec's default",
}


def _commands() -> dict[str, object]:
    """Every command of the app, by name (each module imported, as when it runs)."""
    import typer

    group = typer.main.get_command(app)
    ctx = group.context_class(group)
    return {name: group.get_command(ctx, name) for name in group.list_commands(ctx)}


def _effective(command: str, param) -> object:
    """What the command uses when the flag is not given.

    ``gradian train``'s flags default to None so that a ``--config`` can set them: without one, the value is
    TrainSpec's (read through :func:`gradian.trainconfig.spec_from_config`, what the command calls).
    """
    if command == "train" and param.default is None:
        from gradian.trainconfig import TRAIN_FLAGS, spec_from_config

        field = {flag: name for name, flag in TRAIN_FLAGS.items()}.get(param.opts[0])
        if field is not None:
            value = getattr(spec_from_config(None), field)
            return list(value) if isinstance(value, tuple) else value
    return param.default


def shared_defaults() -> dict[str, dict[str, object]]:
    """``{flag: {command: effective default}}`` for every long flag that two or more commands take."""
    seen: dict[str, dict[str, object]] = {}
    for name, cmd in _commands().items():
        for p in cmd.params:
            if getattr(p, "param_type_name", "") != "option":
                continue
            for flag in p.opts:
                if flag.startswith("--"):
                    seen.setdefault(flag, {})[name] = _effective(name, p)
    return {flag: by for flag, by in seen.items() if len(by) > 1}


def test_the_walk_sees_every_shared_option():
    """The walk finds the options the issue names (so the checks below bite)."""
    shared = shared_defaults()
    assert {"attribute", "index", "train"} <= set(shared["--max-length"])
    assert {"attribute", "index", "evaluate", "train", "verify"} <= set(shared["--device"])
    assert shared["--max-length"]["train"] is not None  # train's None is resolved to what it uses


def test_one_default_per_shared_option():
    """A flag two commands take has one default there, unless ALLOWED says why not."""
    wrong = {
        flag: by
        for flag, by in shared_defaults().items()
        if flag not in ALLOWED and len({json.dumps(v, default=str) for v in by.values()}) > 1
    }
    assert not wrong, f"same flag, different defaults (pick one, in gradian.defaults, or explain in ALLOWED): {wrong}"


def test_the_allowlist_is_not_stale():
    shared = shared_defaults()
    for flag in ALLOWED:
        assert flag in shared, f"{flag} is no longer shared: drop it from ALLOWED"
        assert len({json.dumps(v, default=str) for v in shared[flag].values()}) > 1, f"{flag} agrees now: drop it"


def test_max_length_is_one_constant_and_trls():
    """train, index, attribute and evaluate truncate at the same length: gradian.defaults.MAX_LENGTH, TRL's own."""
    from gradian.data.tokenize import TokenizeSpec
    from gradian.defaults import MAX_LENGTH
    from gradian.evaluate import EvalSpec
    from gradian.trainconfig import TrainSpec

    assert TrainSpec().max_length == TokenizeSpec().max_length == EvalSpec().max_length == MAX_LENGTH == 1024
    trl = pytest.importorskip("trl")
    import dataclasses

    (field,) = [f for f in dataclasses.fields(trl.SFTConfig) if f.name == "max_length"]
    assert field.default == MAX_LENGTH


def test_the_worlds_pin_their_own_length_and_device():
    """A world's train.yaml keeps what its published results used, whatever gradian train's defaults are."""
    from gradian.worlds.spec import default_train_spec

    for kind in ("tiny", "smollm2"):
        spec = default_train_spec(kind)
        assert (spec.max_length, spec.device) == (256, "cpu")


# -- --device auto: one resolver


@pytest.mark.parametrize(("cuda", "mps", "want"), [(True, True, "cuda"), (False, True, "mps"), (False, False, "cpu")])
def test_auto_is_cuda_else_mps_else_cpu(monkeypatch, cuda, mps, want):
    import torch

    from gradian.models.load import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    assert resolve_device("auto") == want
    assert resolve_device("cpu") == "cpu"


def test_train_defaults_to_auto_and_records_the_device(saved_finetune, tmp_path):
    """`gradian train` without --device resolves auto (here: cpu) and records it; its config keeps `auto`."""
    import torch

    from gradian.trainconfig import TrainSpec, load_train_config

    assert TrainSpec().device == "auto"
    sf = saved_finetune
    out = tmp_path / "adapter"
    args = ["train", "--base", str(sf["base"]), "--data", str(sf["data"]), "--out", str(out)]
    res = runner.invoke(app, [*args, "--epochs", "1", "--max-length", "48", "--r", "2", "--alpha", "4"])
    assert res.exit_code == 0, res.output
    want = "cuda" if torch.cuda.is_available() else ("mps" if torch.backends.mps.is_available() else "cpu")
    assert json.loads((out / "gradian_train.json").read_text())["device"] == want
    assert load_train_config(out / "training_config.yaml")["device"] == "auto"
    assert f"on {want} (--device auto)" in " ".join(res.output.split())
    *_, folder, after = res.output.strip().splitlines()
    assert folder.startswith(f"adapter: {out} ")  # the folder it wrote, then the next command, which takes it
    assert after.startswith(f"next: gradian attribute --base {sf['base']} --adapter {out} --data {sf['data']} ")


def _attribute_args(sf, tmp_path) -> list[str]:
    eval_path = tmp_path / "eval.jsonl"
    eval_path.write_text('{"id": "e1", "prompt": "p", "answer": "a", "capability": "c"}\n')
    return [
        "attribute",
        "--base",
        str(sf["base"]),
        "--adapter",
        str(sf["adapter"]),
        "--data",
        str(sf["data"]),
        "--eval",
        str(eval_path),
        "--out",
        str(tmp_path / "run"),
    ]


def test_a_real_runs_manifest_records_the_resolved_device():
    """attribute_run (the CLI's, the API's and the demo's) records the device `auto` became beside the spec."""
    import sys
    from pathlib import Path

    from gradian.models.load import resolve_device

    sys.path.insert(0, str(Path(__file__).parent / "report"))
    from report_world import real_run  # the report tests' real tiny run, made with ModelSpec's default device

    run = json.loads((real_run()["run_dir"] / "run.json").read_text())
    assert run["manifest"]["identity"]["specs"]["model"]["device"] == "auto"  # what was asked (the run's identity)
    assert run["manifest"]["device"] == resolve_device("auto") != "auto"  # what it ran on


def test_evaluate_records_the_resolved_device(saved_finetune, tmp_path):
    """`gradian evaluate --out R` keeps the flag (meta.model.device: auto) and the device used (meta.device)."""
    from gradian.models.load import resolve_device

    sf = saved_finetune
    eval_path = tmp_path / "eval.jsonl"
    rows = [{"id": f"e{i}", "prompt": f"p{i}", "answer": "Paris", "capability": "c"} for i in range(10)]
    eval_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "result.json"
    args = ["evaluate", "--base", str(sf["base"]), "--adapter", str(sf["adapter"]), "--eval", str(eval_path)]
    res = runner.invoke(app, [*args, "--out", str(out), "--max-new-tokens", "2", "--resamples", "1000"])
    assert res.exit_code == 0, res.output
    meta = json.loads(out.read_text())["meta"]
    assert meta["model"]["device"] == "auto" and meta["device"] == resolve_device("auto")
    assert res.output.strip().splitlines()[-1] == f"wrote {out}"  # the last line names what it wrote


def test_verify_defaults_to_auto(monkeypatch, tmp_path):
    """verify's --device is auto too (not the device a run recorded, which another machine may not have)."""
    import gradian.verify

    got: dict = {}

    class Stop(Exception):
        pass

    def fake(run_dir, spec, **kw):
        got.update(kw)
        raise Stop

    monkeypatch.setattr(gradian.verify, "verify_run", fake)
    res = runner.invoke(app, ["verify", str(tmp_path)])
    assert isinstance(res.exception, Stop), res.output
    assert got["device"] == "auto"


# -- --out: the folder a command writes is the one the next command takes


def test_attribute_index_reads_what_index_out_wrote(saved_finetune, tmp_path, monkeypatch):
    """`gradian index --out X` then `gradian attribute --index X`: the plan reuses both indexes, builds nothing;
    the old name --index-dir still works; the two naming different folders is one error line."""
    monkeypatch.setenv("GRADIAN_CACHE", str(tmp_path / "cache"))
    sf = saved_finetune
    folder = tmp_path / "idx"
    flags = ["--max-length", "48", "--checkpoints", "final"]
    res = runner.invoke(
        app,
        ["index", "--base", str(sf["base"]), "--adapter", str(sf["adapter"]), "--data", str(sf["data"]), *flags]
        + ["--out", str(folder)],
    )
    assert res.exit_code == 0, res.output
    last = " ".join(res.output.strip().splitlines()[-1].split())
    assert last.startswith(f"index folder: {folder}") and f"--index {folder}" in last, res.output
    args = _attribute_args(sf, tmp_path) + flags + ["--plan-only"]
    for name in ("--index", "--index-dir"):
        res = runner.invoke(app, [*args, name, str(folder)])
        assert res.exit_code == 0, res.output
        flat = " ".join(res.output.split())
        assert f"plan: 2 gradient index(es) under {folder}" in flat, res.output
        assert flat.count("already built") == 2 and "(0 B new)" in flat, res.output
    res = runner.invoke(app, [*args, "--index", str(folder), "--index-dir", str(tmp_path / "other")])
    assert res.exit_code == 2 and "--index and --index-dir name different folders" in res.output
    assert "--index-dir" not in runner.invoke(app, ["attribute", "--help"], env={"COLUMNS": "200"}).output


#: What each folder-writing command's --out help must name: a file it writes there, and the flag that reads it.
OUT_HELP = {
    "world": ("train.jsonl", "--data"),
    "train": ("adapter_model.safetensors", "--adapter"),
    "index": ("gradient indexes", "--index"),
    "attribute": ("run.json", "verify"),
    "demo": ("scorecard.json", "report.html"),
}


@pytest.mark.parametrize("command", sorted(OUT_HELP))
def test_each_out_says_what_the_folder_holds(command):
    """Every folder-writing command's --out help says what the folder holds and which command takes it next."""
    (out,) = [p for p in _commands()[command].params if "--out" in getattr(p, "opts", ())]
    for word in OUT_HELP[command]:
        assert word in out.help, (command, word, out.help)
