"""Hostile and careless inputs (issue 12): every one is a one-line error with exit code 2 (or, for Audit, a
finding), never a traceback, a hang, or a silently wrong result."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradian.cli import app
from gradian.errors import GradianUserError
from gradian_testlib import cli_args, ft_inputs

runner = CliRunner()


def _cli(args):
    from gradian_testlib import without_data_check

    res = runner.invoke(app, [str(a) for a in args])
    lines = without_data_check([ln for ln in res.output.strip().splitlines() if ln.strip()])
    return res.exit_code, lines, res


def _one_error_line(code, lines, res, needle):
    assert code == 2, res.output
    assert "Traceback" not in res.output and res.exception is None or isinstance(res.exception, SystemExit)
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0] and "(fix: " in errors[0], res.output
    return errors[0]


# ---------------------------------------------------------------------- the specs
def _specs():
    from gradian.attribute.pipeline import AttributeSpec
    from gradian.data.tokenize import TokenizeSpec
    from gradian.engines import DataInfSpec, engine_spec
    from gradian.engines.ekfac import EkfacSpec
    from gradian.evaluate import EvalSpec
    from gradian.gradients.projection import ProjectionSpec
    from gradian.index.build import check_build_args, check_unit_grads
    from gradian.index.store import GradSpec
    from gradian.models.load import ModelSpec
    from gradian.trainconfig import TrainSpec

    return [
        (lambda: TokenizeSpec(max_length=0), "--max-length (TokenizeSpec.max_length)"),
        (lambda: TokenizeSpec(max_length=10**12), "--max-length"),
        (lambda: TokenizeSpec(max_length=True), "--max-length"),
        (lambda: TokenizeSpec(loss_on="prompt"), "--loss-on"),
        (lambda: ProjectionSpec(dim=-1), "--project-dim"),
        (lambda: ProjectionSpec(seed=-1), "--seed"),
        (lambda: ProjectionSpec(seed=2**70), "--seed"),
        (lambda: GradSpec(storage_dtype="float8"), "--storage-dtype"),
        (lambda: GradSpec(modules="q_proj"), "--modules"),
        (lambda: GradSpec(unit="token"), "--unit"),
        (lambda: engine_spec("kronfluence"), "--engine"),
        (lambda: engine_spec("graddot", damping_scale=0.1), "--engine"),
        (lambda: DataInfSpec(damping_scale=0.0), "--damping-scale"),
        (lambda: DataInfSpec(damping_scale=math.nan), "--damping-scale"),
        (lambda: EkfacSpec(damping_scale=-1.0), "--damping-scale"),
        (lambda: EkfacSpec(fisher="sampled"), "fisher"),
        (lambda: EkfacSpec(seed=-1), "seed"),
        (lambda: AttributeSpec(engine="kronfluence"), "--engine"),
        (lambda: AttributeSpec(top_k=0), "--top-k"),
        (lambda: AttributeSpec(top_k=-2), "--top-k"),
        (lambda: AttributeSpec(second_engine="exact"), "--second-engine"),
        (lambda: AttributeSpec(query="mse"), "--query"),
        (lambda: EvalSpec(batch_size=0), "--batch-size"),
        (lambda: EvalSpec(seed=-1), "--seed"),
        (lambda: EvalSpec(resamples=10**9), "--resamples"),
        (lambda: EvalSpec(max_new_tokens=-5), "--max-new-tokens"),
        (lambda: ModelSpec("m", device="tpu"), "--device"),
        (lambda: ModelSpec("m", dtype="int8"), "--dtype"),
        (lambda: ModelSpec(""), "--base"),
        (lambda: TrainSpec(learning_rate=math.inf), "learning_rate"),
        (lambda: TrainSpec(r=0), "r"),
        (lambda: TrainSpec(max_length=1), "max_length"),
        (lambda: TrainSpec(num_train_epochs=math.nan), "num_train_epochs"),
        (lambda: check_build_args(-3), "--batch-size"),
        (lambda: check_build_args(8, 0), "shard_size"),
        (lambda: check_build_args(8, 256, 0), "--rows-per-forward"),
        (lambda: GradSpec(unit_grads="approx"), "--unit-grads"),
        (lambda: check_unit_grads(GradSpec(unit="sentence", unit_grads="positions"), one_pass=False), "--separate"),
    ]


@pytest.mark.parametrize("k", range(38))
def test_specs_refuse_bad_values_with_one_line(k):
    make, needle = _specs()[k]
    with pytest.raises(GradianUserError) as ei:
        make()
    msg = ei.value.one_line()
    assert needle in msg and "(fix: " in msg and "\n" not in msg


def test_spec_defaults_are_valid():
    from gradian.attribute.pipeline import AttributeSpec
    from gradian.engines.registry import engines
    from gradian.evaluate import EvalSpec
    from gradian.index.store import GradSpec
    from gradian.models.load import ModelSpec
    from gradian.trainconfig import TrainSpec

    GradSpec(), AttributeSpec(), EvalSpec(), ModelSpec("m"), TrainSpec()
    for cls in engines().values():
        cls.spec_class()  # every registered engine's defaults are valid
    assert len(_specs()) == 38  # the parametrize above covers every one


def test_train_errors_name_the_flag_or_the_file_key(tmp_path):
    from gradian.trainconfig import spec_from_config

    with pytest.raises(GradianUserError, match=r"^--lr \(TrainSpec.learning_rate\): learning_rate must be > 0"):
        spec_from_config(None, learning_rate=-1.0)
    p = tmp_path / "c.yaml"
    p.write_text("learning_rate: 2.0e-4\nnum_train_epochs: .inf\n")
    with pytest.raises(GradianUserError, match=r"c.yaml: num_train_epochs: num_train_epochs must be a finite"):
        spec_from_config(p)


# ---------------------------------------------------------------------- CLI flags (refused before any model loads)
def _index(sf, *extra):
    return [
        *cli_args(
            "index",
            **ft_inputs(sf),
            max_length=64,
            out=sf["root"] / "idx-hostile",
        ),
        *extra,
    ]


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--batch-size", "-3"], "--batch-size"),
        (["--batch-size", "0"], "--batch-size"),
        (["--rows-per-forward", "0"], "--rows-per-forward"),
        (["--device", "tpu"], "--device"),
        (["--project-dim", "-4"], "--project-dim"),
        (["--seed", "-1"], "--seed"),
        (["--modules", " , "], "--modules"),
        (["--unit-grads", "approx"], "--unit-grads"),
        (["--unit", "sentence", "--unit-grads", "positions", "--separate"], "--separate"),
    ],
)
def test_index_flags(saved_finetune, extra, needle):
    _one_error_line(*_cli(_index(saved_finetune, *extra)), needle)
    assert not (saved_finetune["root"] / "idx-hostile" / "manifest.json").exists()


def test_modules_that_select_nothing(saved_finetune):
    line = _one_error_line(*_cli(_index(saved_finetune, "--modules", "zzz_nothing")), "matches none")
    assert "q_proj" in line  # the fix names the layers there are


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--top-k", "0"], "--top-k"),
        (["--top-k", "-2"], "--top-k"),
        (["--damping-scale", "nan"], "--damping-scale"),
        (["--engine", "exact"], "--engine"),
        (["--engine", "graddot", "--damping-scale", "0.1"], "--damping-scale"),
        (["--engine", "datainf", "--engine-option", "nope=1"], "--engine-option"),
        (["--engine", "ekfac", "--engine-option", "fisher=sampled"], "fisher"),
        (["--engine", "ekfac", "--engine-option", "nope=1"], "--engine-option"),
        (["--second-engine", "kronfluence"], "--second-engine"),
        (["--row-weight", "-0.5"], "--row-weight"),
        (["--row-weight", "nan"], "--row-weight"),
        (["--rows-per-forward", "-1"], "--rows-per-forward"),
        (["--unit-grads", "approx"], "--unit-grads"),
        (["--unit-grads", "positions", "--separate"], "--separate"),
    ],
)
def test_attribute_flags(tmp_path, extra, needle):
    args = [
        *cli_args(
            "attribute",
            base=tmp_path / "b",
            adapter=tmp_path / "a",
            data=tmp_path / "d.jsonl",
            eval=tmp_path / "e.jsonl",
            out=tmp_path / "run",
        ),
        *extra,
    ]
    _one_error_line(*_cli(args), needle)


# ---------------------------------------------------------------------- adapters
def _adapter_variant(sf, tmp_path, **changes) -> Path:
    d = tmp_path / "adapter"
    shutil.copytree(sf["adapter"], d)
    cfg = json.loads((d / "adapter_config.json").read_text())
    cfg.update(changes)
    (d / "adapter_config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize(
    "changes,needle",
    [
        ({"target_modules": ["nonexistent_proj"]}, "target_modules names 'nonexistent_proj'"),
        ({"target_modules": ["q_proj", "nonexistent_proj"]}, "which the base model does not have"),
        ({"target_modules": ["q_proj"]}, "PEFT would silently drop them"),
        ({"r": 0}, "a LoRA rank must be a positive whole number"),
        ({"r": 8}, "adapter_config.json says r = 8"),
    ],
)
def test_adapter_config_that_peft_would_reject_or_half_load(saved_finetune, tmp_path, changes, needle):
    args = _index(saved_finetune)
    args[args.index("--adapter") + 1] = _adapter_variant(saved_finetune, tmp_path, **changes)
    _one_error_line(*_cli(args), needle)


# ---------------------------------------------------------------------- bounded reading
def test_streams_are_refused(tmp_path):
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)  # never opened: a read would block forever
    _one_error_line(*_cli(["diagnose", "--data", fifo]), "FIFO")
    zero = tmp_path / "zero.jsonl"
    zero.symlink_to("/dev/zero")
    _one_error_line(*_cli(["diagnose", "--data", zero]), "character device")
    cfg = tmp_path / "sft.yaml"
    cfg.symlink_to("/dev/zero")
    _one_error_line(*_cli(["diagnose", "--config", cfg]), "character device")


def test_size_and_line_limits(tmp_path, monkeypatch):
    big = tmp_path / "big.jsonl"
    row = json.dumps({"prompt": "p", "completion": "x" * 1000}) + "\n"
    big.write_text(row * 2200)  # about 2.2 MiB
    _one_error_line(*_cli(["--max-input-mb", "1", "diagnose", "--data", big]), "input limit")
    monkeypatch.setenv("GRADIAN_MAX_LINE_MB", "1")
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt": "p", "completion": "x" * (2 << 20)}) + "\n")
    _one_error_line(*_cli(["diagnose", "--data", long]), "line limit")


@pytest.mark.parametrize(
    "name,text,needle",
    [
        ("deep.json", "[" * 100000 + "]" * 100000, "nested"),
        ("deep.jsonl", '{"prompt": ' + "[" * 150 + "]" * 150 + ', "completion": "x"}\n', "nested more than 100"),
        ("int.jsonl", '{"prompt": "a", "completion": "b", "id": ' + "9" * 5000 + "}\n", "unreadable JSON value"),
        ("roles.jsonl", '{"messages": [{"role": ["user"], "content": "x"}]}\n', "not a string"),
    ],
)
def test_hostile_data_files(tmp_path, name, text, needle):
    p = tmp_path / name
    p.write_text(text)
    _one_error_line(*_cli(["diagnose", "--data", p]), needle)


@pytest.mark.parametrize(
    "text,needle",
    [
        ("learning_rate: " + "[" * 100000 + "]" * 100000 + "\n", "nested more than 100"),
        ("a: &a [*a]\n", "recursive"),
        (
            "".join(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10 if i else ["x"] * 10) + "]\n" for i in range(8)),
            "expands to more than",
        ),
        ("seed: 2024-13-45\n", "unreadable YAML value"),
        ("1: 2\nlearning_rate: 2e-4\n", "is not a string"),
    ],
)
def test_hostile_yaml_configs(tmp_path, text, needle):
    p = tmp_path / "sft.yaml"
    p.write_text(text)
    _one_error_line(*_cli(["diagnose", "--config", p]), needle)


def test_infinite_epochs_are_a_finding_not_a_traceback(tmp_path):
    p = tmp_path / "sft.yaml"
    p.write_text("learning_rate: 2.0e-4\nnum_train_epochs: .inf\nper_device_train_batch_size: 8\nuse_peft: true\n")
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}", "completion": f"a{i}"}) + "\n" for i in range(40)))
    code, lines, res = _cli(["diagnose", "--config", p, "--data", data, "--format", "json"])
    assert code == 1 and res.exception is None or isinstance(res.exception, SystemExit)
    out = json.loads(res.stdout)
    (c19,) = [f for f in out["findings"] if f["id"] == "C19"]
    assert "num_epochs=inf" in c19["message"]
    assert "C03" not in out["passed"] and "C04" not in out["passed"]


@pytest.mark.parametrize(
    "content,needle",
    [
        ('{"schema": "gradian.run/1", "evaluation": {"capabilities": 3}}', "evaluation.capabilities"),
        ("[1, 2, 3]", "not a gradian.run/1 file"),
        ('{"schema": "gradian.run/1", "evaluation": {"capabilities": [{"name": "c"}]}}', "metric is not a string"),
        (
            '{"schema": "gradian.run/1", "attribution": {"capabilities": [{"capability": "c", "scores": ["x"]}]}}',
            "scores is not a list of numbers",
        ),
    ],
)
def test_report_of_a_wrong_shape_run(tmp_path, content, needle):
    (tmp_path / "run.json").write_text(content)
    _one_error_line(*_cli(["report", tmp_path, "--format", "md"]), needle)


# ---------------------------------------------------------------------- tables at 80 columns
def test_tables_stay_readable_when_piped():
    from rich.console import Console

    from gradian.tables import FitTable

    t = FitTable(title="Evaluate: tuned vs base")
    for col in ("capability", "metric", "n", "base", "tuned", "Δ", "95% CI", "verdict", "lost/gained", "base bounds"):
        t.add_column(col)
    t.add_row(
        "capitals",
        "exact_match",
        "45",
        "0.867",
        "0.378",
        "-0.489",
        "[-0.633, -0.300]",
        "regressed",
        "22/0",
        "base fails 3/45, thin margin 2/22",
    )
    piped = Console(width=80, force_terminal=False, color_system=None, record=True)
    piped.print(t)
    text = piped.export_text()
    assert "…" not in text and all(len(line) <= 80 for line in text.splitlines())
    assert "capitals" in text and "verdict regressed" in text and "95% CI [-0.633, -0.300]" in text
    wide = Console(width=200, force_terminal=False, color_system=None, record=True)
    wide.print(t)
    assert "┃ capability" in wide.export_text()  # the grid, when it fits


def test_cli_reports_a_rebuilt_shard_by_name(saved_finetune, tmp_path):
    """An index poisoned by an older build (NaNs under a valid sha256) is reported and rebuilt, not reused."""
    import torch
    from safetensors.torch import save

    from gradian.index.store import GradientIndex
    from gradian.util import atomic_write_json, sha256_bytes

    out = tmp_path / "idx"
    args = cli_args(
        "index",
        **ft_inputs(saved_finetune),
        max_length=64,
        unit="row",  # one index (the default, sentence, builds the sentence-unit index too)
        out=out,
    )
    assert _cli(args)[0] == 0
    (folder,) = [p for p in out.iterdir() if p.is_dir()]  # --out is the parent: one index per checkpoint, by id
    idx = GradientIndex(folder)
    s = idx.manifest["shards"][0]
    data = save({b["name"]: torch.full((s["n"], b["dim"]), float("nan")) for b in idx.blocks})
    (folder / s["file"]).write_bytes(data)
    m = json.loads((folder / "manifest.json").read_text())
    m["shards"][0]["sha256"] = sha256_bytes(data)
    atomic_write_json(folder / "manifest.json", m)
    code, lines, res = _cli(args)
    assert code == 0, res.output
    warns = [ln for ln in lines if ln.startswith("warning:")]
    assert len(warns) == 1 and "shard-00000.safetensors is corrupt" in warns[0] and "non-finite" in warns[0]
    assert any(" built:" in ln for ln in lines) and GradientIndex(folder).verify() == []
