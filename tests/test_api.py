"""The Python API (`gradian.attributor`).

The script of docs/api.md runs on a tiny world and prints per-item scores that are the run's own; `Run`
round-trips run.json; the specs check themselves; the CLI's defaults are the specs'.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gradian.errors import GradianUserError

ROOT = Path(__file__).resolve().parents[1]
MARK = "<!-- gradian-api-example"


def _python_block(text: str, after: str | None = None) -> str:
    """The first fenced python block of ``text`` (after the line holding ``after``, when given)."""
    if after is not None:
        assert after in text, f"no {after!r} marker"
        text = text[text.index(after) :]
    m = re.search(r"```python\n(.*?)```", text, flags=re.S)
    assert m, "no python block"
    return m.group(1)


def _code_lines(src: str) -> list[str]:
    """The statements' lines without comments or indentation (to compare two copies of one script)."""
    out = []
    for line in src.splitlines():
        code = re.sub(r"\s+#.*$", "", line).strip()
        if code and not code.startswith("#"):
            out.append(code)
    return out


@pytest.fixture(scope="module")
def api_world(tmp_path_factory, world_cache):
    """A tiny world (poisoned, seed 0) with its adapter trained.

    What `gradian world --kind tiny` + `gradian train` give a user.
    """
    from gradian.train import train_lora
    from gradian.worlds import WorldSpec, build_world, default_train_spec

    root = tmp_path_factory.mktemp("api-world")
    w = build_world(WorldSpec.default("tiny", "poisoned", seed=0), root / "world", cache=world_cache)
    adapter = train_lora(str(w.base), w.train, root / "adapter", default_train_spec("tiny"), eval_data=w.valid)
    return {"base": w.base, "adapter": adapter, "data": w.train, "eval": w.eval, "root": root}


@pytest.fixture(scope="module")
def script_run(api_world):
    """The docs/api.md script, extracted and run as a user runs it: ``(stdout, run dir)``."""
    src = _python_block((ROOT / "docs" / "api.md").read_text(), after=MARK)
    script = api_world["root"] / "api_example.py"
    script.write_text(src)
    out = api_world["root"] / "run"
    import gradian

    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        GRADIAN_CACHE=str(api_world["root"] / "cache"),
        PYTHONPATH=os.pathsep.join([str(Path(gradian.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
    )
    args = [str(api_world[k]) for k in ("base", "adapter", "data", "eval")] + [str(out)]
    res = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout, out


def test_the_docs_script_prints_per_item_scores_that_are_the_runs_own(script_run):
    stdout, out = script_run
    run = json.loads((out / "run.json").read_text())
    assert (out / "report.html").exists()
    assert "capitals:" in stdout and "regressed" in stdout
    assert re.search(r"rows that teach the Canada answer: \[\('t\d+', [0-9.e+-]+\)", stdout), stdout
    assert re.search(r"rows behind 'Shanghai': \[\('t\d+', -[0-9.e+-]+\)", stdout), stdout
    printed = {}
    for m in re.finditer(r"^item (\S+): (.*)$", stdout, flags=re.M):
        printed[m.group(1)] = [(rid, float(x)) for rid, x in re.findall(r"(\S+) (-?[0-9.]+e[+-]\d+)", m.group(2))]
    caps = run["attribution"]["capabilities"]
    items = [q["item_id"] for cap in caps for q in cap["queries"]]
    assert items and sorted(printed) == sorted(items), stdout
    # the script's scores() are the matrix the pipeline ranked by: with unit="row", statistic="raw" the run's
    # per-item top rows are the rows of the same (m, n) influence matrix
    for cap in caps:
        for item_id, top in cap["per_item_top"].items():
            got = printed[item_id]
            assert [r for r, _ in got] == [t["id"] for t in top[:3]]
            np.testing.assert_allclose([s for _, s in got], [t["score"] for t in top[:3]], rtol=1e-6)
            assert all(s < 0 for _, s in got)  # most harmful first: degraded the item (gradian.sign)
    assert f"run {run['manifest']['run_id']}: {len(caps)} capability(ies) attributed" in stdout
    assert stdout.rstrip().splitlines()[-1] == f"# Gradian report: run {run['manifest']['run_id']}"


def test_the_readme_python_section_is_the_core_of_the_docs_script():
    readme = _python_block((ROOT / "README.md").read_text(), after="## Python\n")
    script = _code_lines(_python_block((ROOT / "docs" / "api.md").read_text(), after=MARK))
    missing = [line for line in _code_lines(readme) if line not in script]
    assert not missing, f"README lines not in the docs/api.md script: {missing}"
    assert "docs/api.md" in (ROOT / "README.md").read_text().split("## Python\n")[1].split("\n## ")[0]


def test_run_round_trips_a_real_run_json(script_run):
    from gradian.attribute.run import Attribution, CapabilityRun, Manifest, Run
    from gradian.evaluate import EvalResult, FailingItem

    _, out = script_run
    text = (out / "run.json").read_text()
    d = json.loads(text)
    run = Run.from_dict(d)
    assert run.to_dict() == d
    assert list(run.to_dict()) == list(d) and list(run.to_dict()["attribution"]) == list(d["attribution"])  # key order
    assert isinstance(run.evaluation, EvalResult) and run.evaluation.regressed
    assert isinstance(run.attribution, Attribution) and isinstance(run.manifest, Manifest)
    cap = run.attribution.capability("capitals")
    assert isinstance(cap, CapabilityRun) and all(isinstance(f, FailingItem) for f in cap.failing_items)
    assert len(cap.scores) == len(run.attribution.train_ids) == cap.n_train
    assert run.audit is not None and run.audit.counts["checks"] > 0
    assert run.manifest.specs["attribute"]["unit"] == "row" and run.run_id == d["manifest"]["run_id"]
    assert Run.load(out).to_dict() == d
    # keys this version does not type survive, at every level
    d2 = json.loads(text)
    d2["future"] = {"x": 1}
    d2["attribution"]["capabilities"][0]["future"] = [1, 2]
    d2["manifest"]["future"] = "y"
    del d2["attribution"]["capabilities"][0]["row_sentences"]
    assert Run.from_dict(d2).to_dict() == d2
    with pytest.raises(GradianUserError, match="gradian.run/1"):
        Run.from_dict({"schema": "something/else"})


def test_from_run_reopens_the_run_reuses_its_index_and_scores_like_the_pipeline(script_run, tmp_path):
    from gradian.attributor import Attributor
    from gradian.report import render, report_for_run

    _, out = script_run
    broken = json.loads((out / "run.json").read_text())
    del broken["manifest"]["identity"]["specs"]["model"]
    (tmp_path / "run.json").write_text(json.dumps(broken))
    with pytest.raises(GradianUserError, match=r"manifest\.identity\.specs\.model: missing"):
        Attributor.from_run(tmp_path)
    att = Attributor.from_run(out)
    run = att.run
    m = run.manifest
    assert att.spec.to_dict() == m.specs["attribute"] and att.grad.to_dict() == m.specs["grad"]
    assert att.model_spec.to_dict() == m.specs["model"] and att.specs.eval.to_dict() == m.specs["eval"]
    assert att.checkpoints == "final"
    assert att.report("md") == render(report_for_run(out), "md")
    idx = att.index()
    assert att.index_reused is True and idx.id == run.attribution.index["id"]
    s = att.scores(run.evaluation)  # every failing item, as the pipeline queried them
    cap = run.attribution.capability("capitals")
    assert s.query_ids == [q["item_id"] for q in cap.queries] and s.row_ids == run.attribution.train_ids
    assert s.shape == (len(cap.queries), cap.n_train)
    np.testing.assert_allclose(s.matrix.mean(axis=0), cap.scores, rtol=1e-9, atol=0)
    np.testing.assert_allclose(s.predicted_loss_delta_if_removed(), s.matrix / cap.n_train)
    assert s.to_dict()["sign_convention"].startswith("positive score")
    g = att.scores(cap.failing_items[:2], engine="graddot")  # another engine from the registry, its defaults
    assert g.engine == {"name": "graddot"} and g.shape == (2, cap.n_train)


def test_query_from_text():
    from gradian.attributor import Query

    q = Query.from_text("Q: capital of X?\nA:", " Paris", said=" Rome")
    assert (q.kind, q.correct, q.said) == ("contrastive", " Paris", " Rome") and q.item_id.startswith("q-")
    assert Query.from_text("Q: capital of X?\nA:", " Paris", said=" Rome").item_id == q.item_id  # content id
    p = Query.from_text([{"role": "user", "content": "hi"}], "hello", id="greet", capability="chat")
    assert (p.kind, p.said, p.item_id, p.capability) == ("cross_entropy", None, "greet", "chat")
    for kw, field in (
        (dict(prompt=""), "Query.prompt"),
        (dict(prompt=[{"role": "user"}]), "Query.prompt"),
        (dict(correct=" "), "Query.correct"),
        (dict(said=""), "Query.said"),
        (dict(said=" Paris"), "Query.said"),
        (dict(id=""), "Query.id"),
        (dict(capability=3), "Query.capability"),
    ):
        args = {"prompt": "Q?", "correct": " Paris", **kw}
        with pytest.raises(GradianUserError) as e:
            Query.from_text(args.pop("prompt"), args.pop("correct"), **args)
        assert e.value.one_line().startswith(field) and "\n" not in str(e.value)


def test_attributor_refuses_bad_inputs_before_loading_a_model(tmp_path):
    from gradian.attribute import AttributeSpec
    from gradian.attributor import Attributor, Query

    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "a", "completion": "b"}\n')
    (tmp_path / "adapter").mkdir(exist_ok=True)
    with pytest.raises(GradianUserError, match="adapter not found"):
        Attributor("base", tmp_path / "missing", data)
    with pytest.raises(GradianUserError, match=r"--top-k \(AttributeSpec.top_k\)"):
        Attributor("base", tmp_path / "adapter", data, spec=AttributeSpec(top_k=0))
    with pytest.raises(GradianUserError, match=r"--batch-size"):
        Attributor("base", tmp_path / "adapter", data, batch_size=0)
    att = Attributor("base", tmp_path / "adapter", data)
    with pytest.raises(GradianUserError, match="no run to report"):
        att.report("md")
    with pytest.raises(GradianUserError, match="unknown report format"):
        att.report("pdf")
    with pytest.raises(GradianUserError, match="no queries"):
        att.scores([])
    q = Query.from_text("Q?", " a")
    with pytest.raises(GradianUserError, match="appears twice"):
        att.scores([q, q])
    with pytest.raises(GradianUserError, match="cannot score a str"):
        att.scores(["what?"])
    assert att._ft is None  # nothing above loaded the model
    assert len(att.row_ids) == 1  # the data is read without a model


def test_specs_validate_themselves_with_the_clis_one_line_errors():
    from gradian.attribute import AttributeSpec, ClusterSpec
    from gradian.attribute.run import RunSpecs
    from gradian.engines.lexical import BM25Spec
    from gradian.engines.repsim import RepSimSpec
    from gradian.evaluate import NormalizeSpec
    from gradian.models.load import ModelSpec

    bad = [
        (lambda: AttributeSpec(top_k=0), "--top-k (AttributeSpec.top_k)"),
        (lambda: AttributeSpec(unit="word"), "--unit (AttributeSpec.unit)"),
        (lambda: AttributeSpec(bm25={"k1": 1.0}), "AttributeSpec.bm25"),
        (lambda: AttributeSpec(references="bm25"), "--references (AttributeSpec.references)"),
        (lambda: ClusterSpec(tail_share=0), "ClusterSpec.tail_share"),
        (lambda: ClusterSpec(max_rows=1), "ClusterSpec.max_rows"),
        (lambda: ClusterSpec(min_cosine=2.0), "ClusterSpec.min_cosine"),
        (lambda: BM25Spec(mode="both"), "BM25Spec.mode"),
        (lambda: BM25Spec(b=1.5), "BM25Spec.b"),
        (lambda: RepSimSpec(mode="x"), "RepSimSpec.mode"),
        (lambda: NormalizeSpec(casefold="yes"), "NormalizeSpec.casefold"),
        (lambda: RunSpecs(model=ModelSpec("b"), seed=-1), "--seed (RunSpecs.seed)"),
        (lambda: RunSpecs(model=ModelSpec("b"), shard_size=0), "build_index.shard_size"),
        (lambda: RunSpecs(model=ModelSpec("b"), rows_per_forward=0), "--rows-per-forward"),
        (lambda: RunSpecs(model="b"), "RunSpecs.model"),
    ]
    for make, where in bad:
        with pytest.raises(GradianUserError) as e:
            make()
        line = e.value.one_line()
        assert line.startswith(where) and "(fix: " in line and "\n" not in line, line
    assert AttributeSpec(references=["bm25"], fuse=["bm25"]).references == ("bm25",)


def test_specs_round_trip_through_their_dicts():
    from gradian.attribute import AttributeSpec, ClusterSpec
    from gradian.data.tokenize import TokenizeSpec
    from gradian.engines.ekfac import EkfacSpec
    from gradian.gradients.projection import ProjectionSpec
    from gradian.index.store import GradSpec

    for spec in (
        AttributeSpec(),
        AttributeSpec(
            engine=EkfacSpec(damping_scale=0.5),
            second_engine=None,
            unit="row",
            clusters=ClusterSpec(max_rows=7),
            references=(),
            fuse=(),
        ),
    ):
        assert AttributeSpec.from_dict(spec.to_dict()) == spec
    g = GradSpec(tokenize=TokenizeSpec(max_length=64), modules=("q_proj",), projection=ProjectionSpec(dim=8, seed=3))
    assert GradSpec.from_dict(g.to_dict()) == g and GradSpec.from_dict(GradSpec().to_dict()) == GradSpec()
    with pytest.raises(GradianUserError, match="unknown engine"):
        AttributeSpec.from_dict({"engine": {"name": "nope"}})


def _params(command: str) -> dict[str, object]:
    import click
    import typer

    from gradian.cli import app

    group = typer.main.get_command(app)  # the CLI imports a command's module when the command is looked up
    return {p.name: p.default for p in group.get_command(click.Context(group), command).params}


def _index_option_defaults(g) -> dict:
    """The gradient options' defaults, read from a ``GradSpec`` (``gradian attribute`` and ``gradian index``)."""
    return {
        "max_length": g.tokenize.max_length,
        "loss_on": g.tokenize.loss_on,
        "modules": g.modules,
        "project_dim": g.projection.dim,
        "storage_dtype": g.storage_dtype,
        "optimizer": g.optimizer,
    }


def _model_option_defaults(m) -> dict:
    """The model options' defaults, read from a ``ModelSpec`` (every command that loads the model)."""
    return {"dtype": m.dtype, "device": m.device, "trust_remote_code": m.trust_remote_code}


def test_the_attribute_commands_defaults_are_the_specs():
    """Every `gradian attribute` option that sets a spec field defaults to that field's default (stated once)."""
    import inspect

    from gradian.attribute import AttributeSpec
    from gradian.attribute.run import RunInputs, RunSpecs
    from gradian.attributor import Attributor
    from gradian.commands.attribute import checkpoint_selection
    from gradian.evaluate import EvalSpec
    from gradian.index.store import GradSpec
    from gradian.models.load import ModelSpec

    a, g, e, m = AttributeSpec(), GradSpec(), EvalSpec(), ModelSpec("base")
    r = RunSpecs(model=m)
    spec_fields = {
        "engine": a.engine.name,
        "second_engine": a.second_engine.name,
        "query": a.query,
        "top_k": a.top_k,
        "weighting": a.weighting,
        "visits": a.visits,
        "statistic": a.statistic,
        "unit": a.unit,
        "references": ",".join(a.references),
        "fuse": ",".join(a.fuse),
        "row_weight": a.row_weight,
        "fuse_gate": a.fuse_gate,
        "weakened": a.weakened_nats,
        "drill_weakened": "none" if a.drill_weakened_nats is None else f"{a.drill_weakened_nats:g}",
        "damping_scale": None,  # None: the engine spec's own default
        "engine_option": None,
        **_index_option_defaults(g),
        "max_units_per_row": g.max_units_per_row,
        "unit_grads": g.unit_grads,
        "batch_size": r.batch_size,
        "shard_size": r.shard_size,
        "rows_per_forward": r.rows_per_forward,
        "seed": r.seed,
        "max_new_tokens": e.max_new_tokens,
        **_model_option_defaults(m),
    }
    inputs = {
        "base",
        "adapter",
        "data",
        "eval_path",
        "config",
        "logs",
        "run_folder",  # Attributor(run_folder=True): --run-folder/--no-run-folder (checked below)
        "reference_adapter",
        "out",
        "index_dir",
        "index_dir_old",  # --index-dir, the hidden old name of --index
        "checkpoints",
        "max_index_gb",  # the run plan's budget (IndexBudget, checked below)
        "plan_only",
        "one_pass",  # attribute_run(one_pass=True): --one-pass/--separate
        "save_evidence",  # attribute_run(save_evidence=False): --save-evidence
        "base_quant",  # 'auto': ModelSpec.quantize from the training setup (None when it is not QLoRA; checked below)
    }
    params = _params("attribute")
    assert set(params) == set(spec_fields) | inputs, "a new option: add it to the spec fields or the inputs here"
    wrong = {k: (params[k], v) for k, v in spec_fields.items() if params[k] != v}
    assert not wrong, f"CLI default != spec default: {wrong}"
    from gradian.index.plan import IndexBudget

    assert params["max_index_gb"] is None and IndexBudget().max_bytes is None and params["plan_only"] is False
    assert params["one_pass"] is True and params["save_evidence"] is False
    assert params["base_quant"] == "auto" and m.quantize is None
    assert params["run_folder"] is inspect.signature(Attributor.__init__).parameters["run_folder"].default is True
    # the options that feed two specs agree in both
    assert e.batch_size == r.batch_size and e.seed == r.seed and g.projection.seed == r.seed
    assert checkpoint_selection(params["checkpoints"]) == RunInputs.__dataclass_fields__["checkpoints"].default
    assert "0.1" in _attribute_help() and a.engine.damping_scale == 0.1  # the help states the engine's default


def _attribute_help() -> str:
    from typer.testing import CliRunner

    from gradian.cli import app

    return " ".join(CliRunner().invoke(app, ["attribute", "--help"], env={"COLUMNS": "400"}).output.split())


def test_the_attributors_defaults_are_the_specs():
    import inspect

    from gradian.attribute.run import RunInputs, RunSpecs
    from gradian.attributor import Attributor
    from gradian.models.load import ModelSpec

    sig = inspect.signature(Attributor.__init__).parameters
    r = RunSpecs(model=ModelSpec("base"))
    assert (sig["seed"].default, sig["batch_size"].default, sig["shard_size"].default) == (
        r.seed,
        r.batch_size,
        r.shard_size,
    )
    assert sig["rows_per_forward"].default == r.rows_per_forward
    assert sig["checkpoints"].default == RunInputs.__dataclass_fields__["checkpoints"].default


def test_the_index_and_evaluate_commands_defaults_are_the_specs():
    """`gradian index` and `gradian evaluate` take the same options; their defaults are the specs' too."""
    import inspect

    from gradian.attribute import AttributeSpec
    from gradian.attribute.run import attribute_run
    from gradian.evaluate import EvalSpec
    from gradian.finetune import training_index
    from gradian.index.joint import build_jointly
    from gradian.index.store import GradSpec
    from gradian.models.load import ModelSpec

    build = inspect.signature(training_index).parameters
    g, e, m = GradSpec(), EvalSpec(), ModelSpec("base")
    model = _model_option_defaults(m)
    index = {
        **_index_option_defaults(g),
        # one concept, one default: `index --unit` builds what `attribute --unit` (AttributeSpec.unit) reads
        "unit": AttributeSpec().unit,
        "max_units_per_row": g.max_units_per_row,
        "unit_grads": g.unit_grads,
        "seed": g.projection.seed,
        "batch_size": build["batch_size"].default,
        "shard_size": build["shard_size"].default,
        "rows_per_forward": inspect.signature(build_jointly).parameters["per_forward"].default,
        # the one-pass row + sentence build: the default of `attribute` too
        "one_pass": inspect.signature(attribute_run).parameters["one_pass"].default,
        **model,
    }
    evaluate = {
        "max_new_tokens": e.max_new_tokens,
        "batch_size": e.batch_size,
        "seed": e.seed,
        "resamples": e.resamples,
        "chat_template": e.use_chat_template,
        **model,
    }
    for command, fields, inputs in (
        (
            "index",
            index,
            {
                "base",
                "adapter",
                "data",
                "config",
                "run_folder",
                "out",
                "checkpoints",
                "max_index_gb",
                "plan_only",
                "base_quant",  # 'auto', as attribute's
            },
        ),
        (
            "evaluate",
            evaluate,
            # config / run_folder / base_quant: the base a QLoRA run trained on, as attribute's Evaluate lane has it
            {"base", "adapter", "eval_path", "reference_adapter", "out", "config", "run_folder", "base_quant"},
        ),
    ):
        params = _params(command)
        assert set(params) == set(fields) | inputs, command
        wrong = {k: (params[k], v) for k, v in fields.items() if params[k] != v}
        assert not wrong, f"gradian {command}: CLI default != spec default: {wrong}"


# ---------------------------------------------------------------------- issue 21: arguments checked like the CLI's


def _scores():
    from gradian.attributor import Scores

    m = np.array([[-3.0, -1.0, 2.0, -2.0, 5.0]])
    return Scores(m, m, ["q"], list("abcde"), {"name": "x"}, [])


def test_top_k_lists_take_a_k_of_at_least_one():
    """k is checked as --top-k is: a whole number >= 1, not a bool (k=-1 listed every row before)."""
    s = _scores()
    assert s.most_harmful(k=2) == [("a", -3.0), ("d", -2.0)] and s.most_helpful(k=1) == [("e", 5.0)]
    assert s.most_harmful(k=10**9) == [("a", -3.0), ("d", -2.0), ("b", -1.0)]
    for method in ("most_harmful", "most_helpful"):
        for bad in (-1, 0, True, False, 2.0, "3", None):
            with pytest.raises(GradianUserError, match=rf"Scores\.{method}\.k: k must be") as e:
                getattr(s, method)(k=bad)
            assert "\n" not in str(e.value)


def test_an_unknown_query_id_is_a_user_error_and_still_a_key_error():
    from gradian.attributor import UnknownQueryError

    s = _scores()
    for bad in ("nope", 3, None):
        with pytest.raises(UnknownQueryError, match=r"Scores.row\(query_id\): no query has the id") as e:
            s.row(bad)  # type: ignore[arg-type]
        assert isinstance(e.value, KeyError) and "use one of 'q'" in str(e.value)
    with pytest.raises(GradianUserError, match="no query has the id 'x'"):
        s.most_harmful("x")


def test_checkpoints_share_the_clis_rule(tmp_path):
    """`Attributor(checkpoints=...)` and `--checkpoints` go through one parser; a bare string that is not
    auto/final (it was iterated letter by letter: 'b: adapter folder not found') is refused when built."""
    from gradian.attribute.trajectory import checkpoint_selection
    from gradian.attributor import Attributor
    from gradian.commands.attribute import checkpoint_selection as cli

    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "a", "completion": "b"}\n')
    ck = tmp_path / "checkpoint-3"
    ck.mkdir()
    (tmp_path / "adapter").mkdir()
    for value, want in (("auto", "auto"), ("final", "final"), ([str(ck)], [ck]), ((ck,), [ck]), (None, "final")):
        assert Attributor("base", tmp_path / "adapter", data, checkpoints=value).checkpoints == want
    assert cli(None) == cli([]) == cli(["auto"]) == "auto" and cli([str(ck)]) == [ck]
    for bad, msg in (
        ("banana", "checkpoints must be 'auto', 'final' or a list"),
        (str(ck), "checkpoints must be 'auto', 'final' or a list"),
        (["auto", str(ck)], "cannot be mixed"),
        ([str(tmp_path / "missing")], "checkpoint folder not found"),
        ([3], "a checkpoint must be a folder path"),
        ([""], "a checkpoint must be a folder path"),
        (7, "got a int"),
        ({"a": 1}, "got a dict"),
    ):
        with pytest.raises(GradianUserError, match=msg) as e:
            Attributor("base", tmp_path / "adapter", data, checkpoints=bad)
        assert e.value.one_line().startswith("Attributor(checkpoints=...)")
        if isinstance(bad, list) and all(isinstance(v, str) for v in bad):
            with pytest.raises(GradianUserError, match=msg) as e:
                cli(bad)
            assert e.value.one_line().startswith("--checkpoints")
    assert checkpoint_selection("final") == "final"


def test_attributor_checks_every_argument_when_built(tmp_path):
    """What the CLI checks before loading anything, the constructor checks: nothing waits for .scores()."""
    from gradian.attribute import AttributeSpec
    from gradian.attributor import Attributor
    from gradian.index.store import GradSpec

    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "a", "completion": "b"}\n')
    (tmp_path / "adapter").mkdir()
    ok = ("base", tmp_path / "adapter", data)
    for kw, where in (
        (dict(spec="fast"), "Attributor.spec"),
        (dict(grad={"unit": "row"}), "Attributor.grad"),
        (dict(eval_spec=3), "Attributor.eval_spec"),
        (dict(seed=-1), "--seed"),
        (dict(seed=1.5), "--seed"),
        (dict(shard_size=0), "build_index.shard_size"),
        (dict(reference_adapter=tmp_path / "nope"), "Attributor.reference_adapter"),
        (dict(reference_adapter=5), "Attributor.reference_adapter"),
        (dict(configs="train.yaml"), "Attributor.configs"),
        (dict(configs=[tmp_path / "nope.yaml"]), "Attributor.configs"),
        (dict(logs=tmp_path / "trainer_state.json"), "Attributor.logs"),
        (dict(index_dir=3), "Attributor.index_dir"),
    ):
        with pytest.raises(GradianUserError) as e:
            Attributor(*ok, **kw)
        assert e.value.one_line().startswith(where), (kw, e.value.one_line())
    for args, where in (((3, *ok[1:]), "Attributor.base"), ((ok[0], None, data), "Attributor.adapter")):
        with pytest.raises(GradianUserError) as e:
            Attributor(*args)
        assert e.value.one_line().startswith(where)
    # the specs check their own fields (engine names, unit, statistic, weighting, the unit budget) when built
    for make, flag in (
        (lambda: AttributeSpec(engine="nope"), "--engine"),
        (lambda: AttributeSpec(unit="word"), "--unit"),
        (lambda: AttributeSpec(statistic="mean"), "--statistic"),
        (lambda: AttributeSpec(weighting="loss"), "--weighting"),
        (lambda: GradSpec(max_units_per_row=0), "--max-units-per-row"),
        (lambda: GradSpec(unit_grads="approx"), "--unit-grads"),
    ):
        with pytest.raises(GradianUserError) as e:
            make()
        assert e.value.one_line().startswith(flag)
    att = Attributor(*ok)
    with pytest.raises(GradianUserError, match=r"Attributor.scores\(engine\): engine must be"):
        att._engine(3)
    with pytest.raises(GradianUserError, match="unknown engine"):
        att._engine("nope")
    assert att._ft is None


def test_a_query_whose_answer_is_truncated_away_is_refused(tok):
    """A prompt longer than max_length left no answer token: every score was 0 with no warning. Now it is one
    error naming the query, its prompt's length and max_length (an eval item's query too: same code)."""
    from gradian.attribute.queries import Query, make_query, query_rows
    from gradian.data.tokenize import TokenizeSpec

    spec = TokenizeSpec(max_length=64)
    fine = Query.from_text("Q: capital of X?\nA:", " Paris", said=" Rome", id="fine")
    assert [r[:2] for r in query_rows(tok, [fine], spec)] == [(0, 1.0), (0, -1.0)]
    long = Query.from_text("Q: " + " ".join(["word"] * 50_000) + "\nA:", " Paris", id="long")
    item = make_query("e7", "geo", "Q: " + "capital " * 500 + "?\nA:", "Paris", said="Rome")
    for q in (long, item):
        with pytest.raises(GradianUserError) as e:
            query_rows(tok, [fine, q], spec)
        line = e.value.one_line()
        assert line.startswith(f"query {q.item_id} (Query.prompt): query {q.item_id!r}: the correct answer is")
        assert "tokens and max_length is 64" in line and "--max-length" in line and "\n" not in line


def test_attributor_reads_the_trainer_s_folder_as_gradian_index_does(saved_finetune, tmp_path, monkeypatch):
    """An adapter folder holding the trainer's training_config.yaml: Attributor.index() tokenises with it, as
    `gradian index` does, so it reuses that index (one id); run_folder=False keeps Gradian's defaults."""
    import shutil

    from typer.testing import CliRunner

    from gradian.attributor import Attributor
    from gradian.cli import app
    from gradian.trainconfig import TrainSpec, write_train_config

    monkeypatch.setenv("GRADIAN_CACHE", str(tmp_path / "cache"))
    adapter = tmp_path / "adapter"
    shutil.copytree(saved_finetune["adapter"], adapter)
    write_train_config(TrainSpec(max_length=40), adapter / "training_config.yaml", base=str(saved_finetune["base"]))
    base, data = saved_finetune["base"], saved_finetune["data"]
    res = CliRunner().invoke(
        app,
        ["index", "--base", str(base), "--adapter", str(adapter), "--data", str(data)]
        + ["--checkpoints", "final", "--unit", "row", "--out", str(tmp_path / "idx")],
    )
    assert res.exit_code == 0, res.output
    (manifest,) = (tmp_path / "idx").rglob("manifest.json")
    cli_id = manifest.parent.name  # an index folder is named by its content id
    att = Attributor(base, adapter, data, index_dir=tmp_path / "idx")
    assert att.configs == (adapter / "training_config.yaml",)
    idx = att.index()
    assert att.index_reused and idx.id == cli_id and att.grad.tokenize.max_length == 40
    assert att.setup.sources["max_length"] == "training_config.yaml: max_length"
    plain = Attributor(base, adapter, data, index_dir=tmp_path / "idx", run_folder=False)
    assert plain.configs == () and plain.setup.max_length == 1024
