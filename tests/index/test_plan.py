"""The run plan: sizes, the budget, the projection it chooses or refuses; the joint row + sentence build."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from typer.testing import CliRunner

from gradian.errors import GradianUserError
from gradian.gradients import lora_blocks
from gradian.gradients.projection import ProjectionSpec
from gradian.index.plan import RECORD_BYTES, IndexBudget, plan_indexes
from gradian.index.size import index_numbers
from gradian.index.store import GradSpec
from gradian_testlib import make_lora_model

COUNTS = [("step 1", "row", 12), ("step 1", "sentence", 30), ("final", "row", 12), ("final", "sentence", 30)]


@pytest.fixture(scope="module")
def blocks(tok):
    return lora_blocks(make_lora_model(tok, "llama", r=4))


def _bytes(blocks, dim: int) -> int:
    numbers = index_numbers(blocks, ProjectionSpec(dim=dim))
    return sum(n * (numbers * 4 + RECORD_BYTES) for _, _, n in COUNTS)


def test_plan_sizes_every_index_and_keeps_exact_when_it_fits(blocks, tmp_path):
    plan, dim = plan_indexes(blocks, GradSpec(), COUNTS, tmp_path, IndexBudget(max_bytes=10**9))
    assert dim == 0 and plan.projection["chosen_by"] == "default"
    assert [(p.checkpoint, p.unit, p.n) for p in plan.indexes] == COUNTS
    numbers = index_numbers(blocks, ProjectionSpec())
    assert all(p.numbers == numbers and p.width == 4 for p in plan.indexes)
    assert plan.total_bytes == plan.new_bytes == _bytes(blocks, 0)
    assert "exact" in "\n".join(plan.lines())


def test_plan_chooses_the_largest_power_of_two_that_fits(blocks, tmp_path):
    budget = _bytes(blocks, 0) // 3  # exact does not fit
    plan, dim = plan_indexes(blocks, GradSpec(), COUNTS, tmp_path, IndexBudget(max_bytes=budget))
    assert dim > 0 and dim & (dim - 1) == 0 and plan.projection["chosen_by"] == "plan"
    assert _bytes(blocks, dim) <= budget < _bytes(blocks, 2 * dim)
    assert plan.new_bytes == _bytes(blocks, dim) and plan.exact_bytes == _bytes(blocks, 0)
    assert f"--project-dim {dim} chosen by the plan" in plan.projection["why"]


def test_reused_indexes_cost_nothing_new(blocks, tmp_path):
    budget = _bytes(blocks, 0) // 3
    plan, dim = plan_indexes(
        blocks, GradSpec(), COUNTS, tmp_path, IndexBudget(max_bytes=budget), reused=lambda i, u, d: i != 2
    )
    assert dim == 0 and plan.new_bytes == plan.indexes[2].bytes < budget  # three exact indexes exist already


@pytest.mark.parametrize("dim", [0, 4096])
def test_explicit_projection_that_cannot_fit_is_refused(blocks, tmp_path, dim):
    spec = GradSpec(projection=ProjectionSpec(dim=dim))
    with pytest.raises(GradianUserError) as e:
        plan_indexes(blocks, spec, COUNTS, tmp_path, IndexBudget(max_bytes=1000, projection_explicit=True))
    assert f"--project-dim {dim}" in e.value.where and "nothing was computed" in str(e.value)


def test_no_projection_fits(blocks, tmp_path):
    with pytest.raises(GradianUserError, match="even --project-dim 16"):
        plan_indexes(blocks, GradSpec(), COUNTS, tmp_path, IndexBudget(max_bytes=10))


def _index_args(fx, out):
    return [
        "index", "--base", str(fx["base"]), "--adapter", str(fx["adapter"]), "--data", str(fx["data"]),
        "--checkpoints", "final", "--out", str(out),
    ]  # fmt: skip


def test_cli_refuses_explicit_exact_over_budget_with_one_line(saved_finetune, tmp_path, monkeypatch):
    from gradian.cli import app

    monkeypatch.setenv("GRADIAN_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "idx"
    res = CliRunner().invoke(app, [*_index_args(saved_finetune, out), "--project-dim", "0", "--max-index-gb", "1e-6"])
    assert res.exit_code == 2, res.output
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "--project-dim 0" in errors[0] and "Traceback" not in res.output
    assert not list(out.rglob("*.safetensors")) and not list(out.rglob("manifest.json"))


def test_cli_default_chooses_a_projection_and_records_it(saved_finetune, tmp_path, monkeypatch):
    from gradian.cli import app

    monkeypatch.setenv("GRADIAN_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "idx"
    plan = CliRunner().invoke(app, [*_index_args(saved_finetune, out), "--plan-only"])
    assert plan.exit_code == 0 and "projection: exact" in plan.output and not out.exists(), plan.output
    res = CliRunner().invoke(app, [*_index_args(saved_finetune, out), "--max-index-gb", "0.0002"])
    assert res.exit_code == 0, res.output
    assert "chosen by the plan" in res.output
    mans = list(out.rglob("manifest.json"))  # the default unit (sentence) builds the row and the sentence index
    assert len(mans) == 2, mans
    dims = {json.loads(m.read_text())["grad_spec"]["projection"]["dim"] for m in mans}
    assert len(dims) == 1, dims  # one budget, one choice for both
    (dim,) = dims
    assert dim > 0 and f"--project-dim {dim} chosen by the plan" in res.output.replace("\n", " ")


def test_joint_build_equals_the_two_separate_builds(tok, tmp_path):
    """Same index ids, same shards to float tolerance (rows derived from their units vs their own pass)."""
    from gradian.data.formats import to_example
    from gradian.data.spans import SentenceItems, sentence_units
    from gradian.data.tokenize import TokenizeSpec, tokenize_example
    from gradian.index.build import build_index
    from gradian.index.joint import build_jointly
    from gradian_testlib import ROWS

    model = make_lora_model(tok, "gpt2", dtype=torch.float64)
    rows = [*ROWS, {"id": "m", "prompt": "Facts.", "completion": " Paris is in France. Tokyo is big. Fe"}] * 3
    exs = [to_example({**r, "id": f"{r['id']}-{i}"}, i, "t") for i, r in enumerate(rows)]
    items = [tokenize_example(e, tok, TokenizeSpec(max_length=64)) for e in exs]
    units = sentence_units(exs, items)
    # exact units: the separate sentence build computes each unit's own gradient
    spec = GradSpec(projection=ProjectionSpec(dim=8, seed=1), storage_dtype="float64", unit_grads="exact")
    ids = {u: {"test": "joint", "unit": u} for u in ("row", "sentence")}
    kw = dict(pad_token_id=tok.pad_token_id, batch_size=2, shard_size=4)
    build_jointly(model, items, units, ids["row"], ids["sentence"], spec, row_root=tmp_path / "jr",
                  sentence_root=tmp_path / "js", **kw)  # fmt: skip

    def separately(row_root, sentence_root):
        """The row and the sentence index, each by its own build_index (a finished one is opened)."""
        return {
            "row": build_index(model, items, ids["row"], spec, root=row_root, **kw),
            "sentence": build_index(
                model,
                SentenceItems(units, items),
                ids["sentence"],
                replace(spec, unit="sentence"),
                root=sentence_root,
                **kw,
            ),
        }

    got = separately(tmp_path / "jr", tmp_path / "js")
    ref = separately(tmp_path / "r", tmp_path / "s")
    for u in ("row", "sentence"):
        a, b = got[u], ref[u]
        assert a.id == b.id and a.complete and a.n == b.n == (len(items) if u == "row" else len(units))
        assert a.ids == b.ids
        assert not a.manifest.get("repairs")
        for k in range(len(a.manifest["shards"])):
            A, B = a.load_shard(k), b.load_shard(k)
            for name in B:
                assert float((A[name] - B[name]).abs().max()) <= 1e-10 * float(B[name].abs().max()), (u, k, name)
        la = [x for s in a.manifest["shards"] for x in s["examples"]["loss"]]
        lb = [x for s in b.manifest["shards"] for x in s["examples"]["loss"]]
        assert max(abs(x - y) for x, y in zip(la, lb)) <= 1e-10


def test_one_pass_trajectory_scores_equal_the_separate_builds(saved_finetune, tmp_path):
    """``trajectory_scores(joint=True)`` (``--one-pass``) scores like the separate builds, with the same index ids."""
    import numpy as np

    from gradian.attribute.evidence import trajectory_scores
    from gradian.attribute.queries import make_query
    from gradian.attribute.trajectory import resolve_trajectory
    from gradian.data.formats import load_examples
    from gradian.data.tokenize import TokenizeSpec
    from gradian.engines import DataInfSpec, GradDotSpec
    from gradian.finetune import load_finetune, tokenize_training_set
    from gradian.models.load import ModelSpec

    data = saved_finetune["data"]
    grad = GradSpec(tokenize=TokenizeSpec(max_length=64), unit_grads="exact")  # as the separate builds
    ft = load_finetune(ModelSpec(str(saved_finetune["base"])), saved_finetune["adapter"])
    exs = load_examples(data)
    items = tokenize_training_set(exs, ft.tokenizer, grad, data)
    qs = [make_query("q1", "capitals", "Q: What is the capital of France?\nA:", "Paris", " Tokyo")]
    got = {}
    for joint in (False, True):
        got[joint] = trajectory_scores(
            ft,
            resolve_trajectory(saved_finetune["adapter"]),
            data,
            exs,
            items,
            grad,
            {"capitals": qs},
            [DataInfSpec(), GradDotSpec()],
            unit="sentence",
            index_root=tmp_path / str(joint),
            joint=joint,
        )
    assert "joint" in got[True].indexes[0] and "joint" not in got[False].indexes[0]
    for u in ("row", "sentence"):
        assert got[True].indexes[0][u]["id"] == got[False].indexes[0][u]["id"]
    for e in ("datainf", "graddot"):
        for kind in ("raw", "cosine", "unit_raw", "unit_cosine"):
            a, b = getattr(got[True].scores["capitals"][e], kind), getattr(got[False].scores["capitals"][e], kind)
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * np.abs(b).max(), err_msg=f"{e}.{kind}")


def test_the_warm_up_times_the_rows_per_forward_the_build_runs(tok):
    """With b rows a forward the warm-up runs at least b rows, b at a time; its work tokens (Σ row tokens × the
    row's backward vectors) do not depend on how the rows were batched, so a faster batched pass is a higher rate."""
    from gradian.index.plan import warmup
    from gradian_testlib import sentence_rows

    model = make_lora_model(tok, "llama")
    items, units = sentence_rows(tok)
    spec = GradSpec(projection=ProjectionSpec(dim=8, seed=1))
    one = warmup(model, items, spec, tok.pad_token_id, units, rows=3)
    three = warmup(model, items, spec, tok.pad_token_id, units, rows=2, per_forward=3)
    assert one["examples"] == three["examples"] == 3
    assert one["work_tokens"] == three["work_tokens"] > 0 and three["seconds"] > 0
    rows = warmup(model, items, spec, tok.pad_token_id, None, rows=2, per_forward=3)  # the row path: unaffected
    assert rows["examples"] == 2


def test_units_split_by_position_score_rows_alike_and_plan_one_backward_a_row(saved_finetune, tmp_path):
    """``--unit-grads positions`` through the run: the row index (same id) scores as the exact build does, the
    sentence index has an id of its own, and the plan counts one backward per row."""
    import numpy as np

    from gradian.attribute.evidence import trajectory_scores
    from gradian.attribute.queries import make_query
    from gradian.attribute.trajectory import resolve_trajectory
    from gradian.data.formats import load_examples
    from gradian.data.tokenize import TokenizeSpec, row_values
    from gradian.engines import DataInfSpec
    from gradian.finetune import load_finetune, tokenize_training_set
    from gradian.index.plan import run_plan
    from gradian.models.load import ModelSpec

    data = saved_finetune["data"]
    exact = GradSpec(tokenize=TokenizeSpec(max_length=64), unit_grads="exact")
    split = replace(exact, unit_grads="positions")
    ft = load_finetune(ModelSpec(str(saved_finetune["base"])), saved_finetune["adapter"])
    exs = load_examples(data)
    items = tokenize_training_set(exs, ft.tokenizer, exact, data)
    qs = [make_query("q1", "capitals", "Q: What is the capital of France?\nA:", "Paris", " Tokyo")]
    trajectory = resolve_trajectory(saved_finetune["adapter"])
    got, plans = {}, {}
    for g in (exact, split):
        root = tmp_path / g.unit_grads
        plans[g.unit_grads] = run_plan(ft, data, exs, items, g, trajectory.checkpoints, ("row", "sentence"),
                                       parent=root, joint=True)[0]  # fmt: skip
        got[g.unit_grads] = trajectory_scores(ft, trajectory, data, exs, items, g, {"capitals": qs}, [DataInfSpec()],
                                              unit="sentence", index_root=root, joint=True)  # fmt: skip
    e, p = got["exact"], got["positions"]
    assert e.indexes[0]["row"]["id"] == p.indexes[0]["row"]["id"]
    assert e.indexes[0]["sentence"]["id"] != p.indexes[0]["sentence"]["id"]
    a, b = e.scores["capitals"]["datainf"], p.scores["capitals"]["datainf"]
    np.testing.assert_allclose(b.raw, a.raw, rtol=1e-4, atol=1e-6 * np.abs(a.raw).max())
    # every row here is one sentence, so each unit is its row: the split gives the exact unit scores (the rows of
    # several sentences, where it does not, are tests/index/test_joint.py's and tests/gradients/test_units.py's)
    assert a.unit_raw.shape[1] == len(items)
    np.testing.assert_allclose(b.unit_raw, a.unit_raw, rtol=1e-4, atol=1e-6 * np.abs(a.unit_raw).max())
    n_ck = len(trajectory.checkpoints)
    work = n_ck * sum(row_values(items, "length"))  # one backward a row (here, one unit a row: exact's too)
    assert plans["positions"].work_tokens == work == plans["exact"].work_tokens
    assert "split into the sentence units" in "\n".join(plans["positions"].lines())
