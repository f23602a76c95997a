"""The engine registry: the CLI and the specs read it, a new engine is one file, each engine has its own
spec; and `gradian attribute --engine ekfac` end to end on the tiny world."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
from typer.testing import CliRunner

from gradian.engines import registry
from gradian.engines.base import Engine, EngineSpec, ModelPass
from gradian.errors import GradianUserError
from gradian_testlib import cli_args, ft_inputs


def _cli(args, **env):
    from gradian.cli import app

    return CliRunner().invoke(app, [str(a) for a in args], env=env or None)


def test_the_cli_lists_exactly_the_registered_engines():
    names = registry.engine_names()
    assert names == ("datainf", "ekfac", "graddot")
    res = _cli(["attribute", "--help"], COLUMNS="400")
    assert res.exit_code == 0
    flat = " ".join(res.output.replace("│", " ").split())
    assert f"Primary engine: {registry.help_text()}" in flat


def test_a_bad_engine_name_is_one_line_and_exit_2(tmp_path):
    for flag in ("--engine", "--second-engine"):
        res = _cli(
            [
                *cli_args(
                    "attribute",
                    base=tmp_path / "b",
                    adapter=tmp_path / "a",
                    data=tmp_path / "d.jsonl",
                    eval=tmp_path / "e.jsonl",
                ),
                flag,
                "kronfluence",
            ]
        )
        assert res.exit_code == 2, res.output
        lines = [x for x in res.output.splitlines() if x.strip()]
        assert len(lines) == 1 and flag in lines[0] and "datainf, ekfac, graddot" in lines[0], res.output


def test_each_engine_has_its_own_spec_in_the_manifest():
    from gradian.attribute.pipeline import AttributeSpec
    from gradian.engines import DataInfSpec, GradDotSpec, engine_spec
    from gradian.engines.ekfac import EkfacSpec

    spec = AttributeSpec(engine=EkfacSpec(damping_scale=0.5), second_engine="datainf")
    d = spec.to_dict()
    assert d["engine"] == {"name": "ekfac", "damping_scale": 0.5, "fisher": "empirical", "seed": 0}
    # the second engine has its own damping, not the primary's (it used to inherit it)
    assert d["second_engine"] == {"name": "datainf", "damping_scale": 0.1}
    assert [e.name for e in spec.engines] == ["ekfac", "datainf"]
    assert (
        AttributeSpec().to_dict()["engine"] == DataInfSpec().to_dict()
        and AttributeSpec().second_engine == GradDotSpec()
    )
    assert AttributeSpec(engine="graddot", second_engine=None).engines == [GradDotSpec()]
    with pytest.raises(GradianUserError, match="no option"):
        engine_spec("graddot", damping_scale=0.1)


def test_registration_checks_what_an_engine_declares(monkeypatch):
    monkeypatch.setattr(registry, "_ENGINES", dict(registry.engines()))

    @dataclass(frozen=True)
    class S(EngineSpec):
        pass

    def engine(**kw):
        attrs = {
            "name": "x",
            "spec_class": S,
            "needs": "index",
            "fit": lambda *a: None,
            "precondition": lambda *a: None,
        }
        return type("E", (Engine,), {**attrs, **kw})

    for bad, why in (
        (dict(name="no name"), "identifier"),
        (dict(name="none"), "identifier"),
        (dict(spec_class=EngineSpec), "own EngineSpec"),
        (dict(needs="gpu"), "needs"),
        (dict(name="datainf"), "registered twice"),
    ):
        with pytest.raises(TypeError, match=why):
            registry.register(engine(**bad))


def test_a_new_engine_is_one_file(monkeypatch, tmp_path, tok):
    """What a newcomer writes: a spec and an engine with @register. It is then a valid --engine, gets a
    model pass when it declares needs="model", runs in the pipeline beside another engine, and lands in
    the manifest. Here: r = scale · g_q, so its raw scores are scale × gradient-dot's."""
    monkeypatch.setattr(registry, "_ENGINES", dict(registry.engines()))
    from gradian.attribute.pipeline import AttributeSpec, attribute_capability
    from gradian.attribute.queries import make_query
    from gradian.commands.attribute import engine_spec_from_options
    from gradian.data.formats import to_example
    from gradian.data.tokenize import TokenizeSpec, tokenize_example
    from gradian.index.build import build_index
    from gradian.index.store import GradSpec
    from gradian_testlib import capital_rows, make_lora_model

    seen: list[ModelPass | None] = []

    @dataclass(frozen=True)
    class ScaledSpec(EngineSpec):
        scale: float = 2.0

    @registry.register
    class Scaled(Engine):
        name = "scaled"
        spec_class = ScaledSpec
        needs = "model"
        summary = "test engine"

        def fit(self, index, model_pass=None):
            seen.append(model_pass)
            self.fitted = True

        def precondition(self, index, queries):
            return {k: self.spec.scale * v.double() for k, v in queries.items()}

    assert "scaled" in registry.engine_names() and "scaled (test engine)" in registry.help_text()
    spec = engine_spec_from_options("scaled", None, ["scale=3"])
    assert spec == ScaledSpec(3.0) and spec.to_dict() == {"name": "scaled", "scale": 3.0}

    ts = TokenizeSpec(max_length=64)
    model = make_lora_model(tok, "llama", r=4, hidden=32, mlp=False)
    exs = [to_example(x, i, "t") for i, x in enumerate(capital_rows(16))]
    items = [tokenize_example(e, tok, ts) for e in exs]
    idx = build_index(
        model, items, {"t": "new-engine"}, GradSpec(tokenize=ts), pad_token_id=tok.pad_token_id, root=tmp_path
    )
    q = make_query("q", "capitals", "Q: What is the capital of France?\nA:", "Paris", " The capital of France is Lyon.")
    att = AttributeSpec(engine=spec, second_engine="graddot", statistic="raw", references=(), fuse=(), drilldown_rows=0)
    assert att.to_dict()["engine"] == {"name": "scaled", "scale": 3.0}
    res = attribute_capability(model, tok, idx, exs, items, [q], ts, att)
    assert len(seen) == 1 and seen[0] is not None and [it.id for it in seen[0].items] == idx.ids
    assert res.engine == "scaled" and res.agreement["engines"] == ["scaled", "graddot"]
    np.testing.assert_allclose(res.scores, 3.0 * np.asarray(res.second_scores), rtol=1e-10)


# ------------------------------------------------------------------ end to end on the tiny world


def test_attribute_with_ekfac_end_to_end_on_the_tiny_world(demo, monkeypatch, tmp_path):
    """`gradian attribute --engine ekfac` (and `--second-engine ekfac`) on the tiny planted world the demo
    built: EK-FAC's factors are fitted once on a model pass, stored beside the index and reused by the
    second run; EK-FAC ranks the planted culprits of the lost items above chance."""
    from gradian.worlds.scorecard import score_ranking

    root, res, _ = demo
    assert res.exit_code == 0, res.output
    first = json.loads((root / "out" / "poisoned" / "run.json").read_text())
    p = first["manifest"]["paths"]
    truth = json.loads((root / "out" / "poisoned" / "ground_truth.json").read_text())
    monkeypatch.setenv("GRADIAN_CACHE", str(root / "cache"))
    base = cli_args(
        "attribute",
        **ft_inputs(p),
        eval=p["eval"],
        max_length=256,
        checkpoints="final",
        references="none",
        fuse="none",
    )
    runs = {}
    for label, flags in (
        ("primary", ["--engine", "ekfac", "--second-engine", "datainf"]),
        ("second", ["--engine", "datainf", "--second-engine", "ekfac", "--damping-scale", "0.2"]),
    ):
        r = _cli([*base, *flags, "--out", tmp_path / label])
        assert r.exit_code == 0, r.output
        runs[label] = json.loads((tmp_path / label / "run.json").read_text())
    a, b = runs["primary"], runs["second"]
    assert a["manifest"]["identity"]["specs"]["attribute"]["engine"]["name"] == "ekfac"
    assert b["manifest"]["identity"]["specs"]["attribute"]["second_engine"] == {
        "name": "ekfac",
        "damping_scale": 0.1,
        "fisher": "empirical",
        "seed": 0,
    }  # not the primary's 0.2
    fa = a["attribution"]["trajectory"]["checkpoints"][-1]["engines"]["ekfac"]["factors"]
    fb = b["attribution"]["trajectory"]["checkpoints"][-1]["engines"]["ekfac"]["factors"]
    assert fa["reused"] is False and fb["reused"] is True and fa["file"] == fb["file"]
    cap = a["attribution"]["capabilities"][0]
    assert cap["engine"] == "ekfac" and cap["agreement"]["engines"] == ["ekfac", "datainf"]
    queried = {q["item_id"] for q in cap["queries"]}
    lost = [c for c in truth["culprits"] if c.get("eval_id") in queried]
    ids = a["attribution"]["train_ids"]
    keep = [j for j, i in enumerate(ids) if i not in {c["id"] for c in truth["culprits"]} - {c["id"] for c in lost}]
    auc = score_ranking([cap["rank_scores"][j] for j in keep], [ids[j] for j in keep], lost)["auc"]
    print(
        f"tiny world, final adapter, sentence units: EK-FAC AUC (culprits of lost items) {auc:.3f}, "
        f"agreement with DataInf ρ = {cap['agreement']['spearman']:.2f}"
    )
    assert auc > 0.5
    # the second run's ekfac ranking is the first run's (same factors, same damping)
    np.testing.assert_allclose(b["attribution"]["capabilities"][0]["second_scores"], cap["rank_scores"], rtol=1e-9)
