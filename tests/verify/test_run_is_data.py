"""A run folder is data, never code (issue 21): what ``gradian verify`` and ``Attributor.from_run`` read back.

* remote code in a shared run folder never runs unless the command line / API call asks for it;
* an input whose content changed since the run is a one-line error naming it (unless allowed);
* a tampered run.json is one line naming the field, never a traceback.
"""

from __future__ import annotations

import copy
import json
import shutil
import sys
import warnings
from pathlib import Path

import pytest

from gradian.errors import GradianUserError, GradianWarning
from gradian_testlib import cli_result, copy_adapter_command


@pytest.fixture()
def real(demo, cache):
    """The demo's poisoned run.json, as a dict (read only)."""
    return json.loads((demo[0] / "out" / "poisoned" / "run.json").read_text())


def _one_error(code, lines, out, *needles):
    assert code == 2 and "Traceback" not in out, out
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1 and "(fix: " in errors[0], out
    for n in needles:
        assert n in errors[0], out
    return errors[0]


def _write_run(folder: Path, run: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "run.json").write_text(json.dumps(run))
    return folder


def shlex_quote(s: str) -> str:
    import shlex

    return shlex.quote(s)


# ---------------------------------------------------------------------- 1. remote code never runs from a run folder


def _remote_code_run(real: dict, tmp: Path, marker: Path) -> Path:
    """A copy of the run whose base folder carries ``auto_map`` + ``evil.py`` (writes ``marker`` when imported)
    and whose run.json says ``trust_remote_code: true``, with the base's recorded hash made to match."""
    from gradian.index.identity import model_identity

    run = copy.deepcopy(real)
    base = tmp / "base"
    shutil.copytree(run["manifest"]["paths"]["base"], base)
    cfg = json.loads((base / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    (base / "config.json").write_text(json.dumps(cfg))
    (base / "evil.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('remote code ran')\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n\n\n"
        "class EvilConfig(LlamaConfig):\n    model_type = 'llama'\n\n\n"
        "class EvilModel(LlamaForCausalLM):\n    config_class = EvilConfig\n"
    )
    run["manifest"]["identity"]["specs"]["model"].update(trust_remote_code=True, base=str(base))
    run["manifest"]["paths"]["base"] = str(base)
    run["manifest"]["identity"]["base"]["sha256"] = model_identity(str(base))["sha256"]  # a careful tamperer
    return _write_run(tmp / "run", run)


def test_a_run_json_asking_for_remote_code_runs_none(real, tmp_path, monkeypatch):
    from gradian.attributor import Attributor

    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    marker = tmp_path / "marker"
    run_dir = _remote_code_run(real, tmp_path, marker)

    code, lines, out = cli_result(
        ["verify", run_dir, "--controls", "0", "--seed-band", "0", "--train-command", copy_adapter_command(real)]
    )
    assert code == 0, out
    assert "verify runs the base folder's code only if you pass it" in out
    assert not marker.exists(), "gradian verify ran the base folder's code because run.json asked"

    att = Attributor.from_run(run_dir)
    assert att.model_spec.trust_remote_code is False
    att.index()  # loads the model
    assert not marker.exists(), "Attributor.from_run(...).index() ran the base folder's code because run.json asked"

    # the same folder does run its code when the caller really asks: the test above can fail
    att = Attributor.from_run(run_dir, trust_remote_code=True)
    assert att.finetune.model is not None
    assert marker.read_text() == "remote code ran"


def test_from_run_and_verify_refuse_a_non_bool_trust_remote_code(real, tmp_path):
    from gradian.attributor import Attributor
    from gradian.verify import prepare_verify

    run_dir = _write_run(tmp_path / "run", real)
    with pytest.raises(GradianUserError, match="trust_remote_code"):
        Attributor.from_run(run_dir, trust_remote_code="yes")
    with pytest.raises(GradianUserError, match="trust_remote_code"):
        prepare_verify(run_dir, trust_remote_code=1, say=lambda s: None)


# ---------------------------------------------------------------------- 3. inputs that changed since the run


def _changed_data_run(real: dict, tmp: Path) -> tuple[Path, Path]:
    run = copy.deepcopy(real)
    data = tmp / "train.jsonl"
    rows = [json.loads(ln) for ln in Path(run["manifest"]["paths"]["data"]).read_text().splitlines() if ln.strip()]
    rows[3]["messages"][-1]["content"] += " CHANGED"  # the demo's rows are chat rows
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run["manifest"]["paths"]["data"] = str(data)
    return _write_run(tmp / "run", run), data


def test_verify_refuses_training_data_that_changed_since_the_run(real, tmp_path):
    run_dir, data = _changed_data_run(real, tmp_path)
    got = tmp_path / "received.jsonl"
    cmd = (
        f"{shlex_quote(sys.executable)} -c 'import shutil,sys; shutil.copy(sys.argv[3], sys.argv[4]); "
        f"shutil.copytree(sys.argv[1], sys.argv[2], dirs_exist_ok=True)' "
        f"{shlex_quote(real['manifest']['paths']['adapter'])} {{out}} {{data}} {shlex_quote(str(got))}"
    )
    args = ["verify", run_dir, "--controls", "0", "--seed-band", "0", "--train-command", cmd]
    _one_error(*cli_result(args), str(data), "training data changed since the run", "--allow-changed-inputs")
    assert not got.exists()  # nothing was retrained

    code, lines, out = cli_result([*args, "--allow-changed-inputs"])
    assert code == 0, out
    assert any("training data changed since the run" in ln for ln in lines)
    assert "CHANGED" in got.read_text()  # the trainer got the data as it is now, as asked


def test_from_run_refuses_inputs_that_changed_since_the_run(real, tmp_path):
    from gradian.attributor import Attributor

    run_dir, data = _changed_data_run(real, tmp_path)
    with pytest.raises(GradianUserError) as e:
        Attributor.from_run(run_dir)
    assert str(data) in str(e.value) and "allow_changed_inputs=True" in str(e.value)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        att = Attributor.from_run(run_dir, allow_changed_inputs=True)
    assert att.data == data and any(issubclass(x.category, GradianWarning) and str(data) in str(x.message) for x in w)

    # an adapter whose weights changed is named too
    run = copy.deepcopy(real)
    adapter = tmp_path / "adapter"
    shutil.copytree(run["manifest"]["paths"]["adapter"], adapter)
    (adapter / "adapter_config.json").write_text(
        (adapter / "adapter_config.json").read_text().replace('"r": 8', '"r": 9')
    )
    run["manifest"]["paths"]["adapter"] = str(adapter)
    with pytest.raises(GradianUserError, match="the run's adapter changed since the run"):
        Attributor.from_run(_write_run(tmp_path / "run2", run))


def test_an_unchanged_run_passes_the_input_check(real, tmp_path):
    from gradian.attribute.changes import changed_inputs

    assert changed_inputs(real, checkpoints=True) == []


# ---------------------------------------------------------------------- 5a. a tampered run.json is one line


def _cap(r):
    return r["attribution"]["capabilities"][0]


TAMPERED = {
    "bogus-spec-key": (
        lambda r: r["manifest"]["identity"]["specs"]["model"].update(bogus=1),
        "manifest.identity.specs.model.bogus: unknown field",
    ),
    "no-manifest": (lambda r: r.pop("manifest"), "manifest: missing"),
    "train-ids-short": (
        lambda r: r["attribution"].update(train_ids=r["attribution"]["train_ids"][:5]),
        "attribution.train_meta",
    ),
    "nan-rank-scores": (
        lambda r: _cap(r).update(rank_scores=[float("nan")] * len(_cap(r)["rank_scores"])),
        "attribution.capabilities[0].rank_scores[0]: is nan, expected a finite number",
    ),
    "cluster-row-outside": (
        lambda r: _cap(r)["clusters"][0].update(row_ids=["no-such-row"]),
        "attribution.capabilities[0].clusters[0].row_ids: 'no-such-row' is not a row",
    ),
    "data-path-int": (lambda r: r["manifest"]["paths"].update(data=5), "manifest.paths.data: is 5, expected a string"),
    "capability-string": (
        lambda r: r["attribution"].update(capabilities=["x"]),
        "attribution.capabilities[0]: is 'x', expected an object",
    ),
    "tokenize-string": (
        lambda r: r["manifest"]["identity"]["specs"]["grad"].update(tokenize="x"),
        "manifest.identity.specs.grad",
    ),
    "ranked-outside": (
        lambda r: _cap(r)["ranked"][0].update(id="t9999"),
        "attribution.capabilities[0].ranked[0].id: 't9999' is not a row",
    ),
    "query-extra-key": (
        lambda r: _cap(r)["queries"][0].update(evil=1),
        "attribution.capabilities[0].queries[0].evil: unknown field",
    ),
    "eval-spec-unknown": (
        lambda r: r["manifest"]["identity"]["specs"]["eval"].update(bogus=True),
        "manifest.identity.specs.eval.bogus: unknown field",
    ),
    "device-odd": (
        lambda r: r["manifest"]["identity"]["specs"]["model"].update(device="cuda; rm -rf /"),
        "manifest.identity.specs.model: unknown device",
    ),
    "gguf-path": (
        lambda r: r["manifest"]["identity"]["specs"]["model"].update(gguf_file="../../x.gguf"),
        "manifest.identity.specs.model.gguf_file",
    ),
    "inf-score": (
        lambda r: _cap(r)["scores"].__setitem__(0, float("inf")),
        "attribution.capabilities[0].scores[0]: is inf",
    ),
}


@pytest.mark.parametrize("name", list(TAMPERED))
def test_a_tampered_run_json_is_one_line_in_verify_report_and_from_run(real, tmp_path, name):
    from gradian.attributor import Attributor

    mutate, needle = TAMPERED[name]
    run = copy.deepcopy(real)
    mutate(run)
    run_dir = _write_run(tmp_path / "run", run)
    _one_error(*cli_result(["verify", run_dir, "--train-command", "false"]), needle, str(run_dir / "run.json"))
    with pytest.raises(GradianUserError) as e:
        Attributor.from_run(run_dir)
    assert needle in str(e.value) and "\n" not in str(e.value)
    if name not in ("no-manifest", "data-path-int", "device-odd", "gguf-path", "eval-spec-unknown"):
        # the report needs less than verify, but what it reads must be sound too
        _one_error(*cli_result(["report", run_dir, "--format", "md", "--out", tmp_path / "r.md"]), needle)


def test_the_demos_real_runs_pass_the_check_whole(demo, cache):
    """What the writer writes passes the strict check (else every tampering test above proves nothing)."""
    from gradian.attribute.run import Run, check_run, load_run
    from gradian.attributor import Attributor

    for name in ("poisoned", "null"):
        folder = demo[0] / "out" / name
        d = load_run(folder, inputs=True)
        check_run(d, inputs=True)
        assert Run.from_dict(d).to_dict() == d
        att = Attributor.from_run(folder)
        assert att.run.run_id == d["manifest"]["run_id"] and att.model_spec.trust_remote_code is False
    code, lines, out = cli_result(["verify", demo[0] / "out" / "null", "--train-command", "false"])
    _one_error(code, lines, out, "attributed nothing")


def test_verify_inputs_are_prepare_verify_s_keywords():
    """verify_run passes its VerifyInputs through to prepare_verify: the TypedDict names exactly prepare_verify's
    keyword parameters (less ``say``), so neither can gain or lose one alone."""
    import inspect

    from gradian.verify import VerifyInputs, prepare_verify

    kw = [p.name for p in inspect.signature(prepare_verify).parameters.values() if p.kind is p.KEYWORD_ONLY]
    assert [k for k in kw if k != "say"] == list(VerifyInputs.__annotations__)
