"""The training trajectory: discovery, learning-rate weights, refusals, weight swapping, Adam state."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from gradian.attribute.trajectory import (
    checkpoint_weights,
    discover_checkpoints,
    learning_rate_weights,
    lora_state,
    resolve_trajectory,
)
from gradian.errors import GradianUserError
from gradian.train import TrainSpec, train_lora

SPEC = TrainSpec(
    learning_rate=5e-3,
    num_train_epochs=3,
    per_device_train_batch_size=4,
    r=4,
    lora_alpha=8,
    max_length=64,
    logging_steps=1,
    seed=0,
    lr_scheduler_type="linear",
    warmup_ratio=0.0,
)


@pytest.fixture(scope="module")
def run(saved_finetune, tmp_path_factory):
    """A tiny adapter trained for 3 epochs: out/ plus out/checkpoint-{3,6,9}/."""
    out = tmp_path_factory.mktemp("traj") / "adapter"
    train_lora(str(saved_finetune["base"]), saved_finetune["data"], out, SPEC)
    return out


def test_discovery_children_and_siblings(run, tmp_path):
    cks = discover_checkpoints(run)
    assert [p.name for p in cks] == ["checkpoint-3", "checkpoint-6", "checkpoint-9"]
    # an adapter that is itself checkpoint-6: its siblings, but not the future checkpoint-9
    assert [p.name for p in discover_checkpoints(run / "checkpoint-6")] == ["checkpoint-3"]
    # a final adapter saved beside the checkpoints (output_dir/final + output_dir/checkpoint-*)
    side = tmp_path / "out"
    shutil.copytree(run, side / "final", ignore=shutil.ignore_patterns("checkpoint-*"))
    for p in cks:
        shutil.copytree(p, side / p.name)
    assert [p.name for p in discover_checkpoints(side / "final")] == ["checkpoint-3", "checkpoint-6", "checkpoint-9"]


def test_resolve_dedupes_the_final_checkpoint_and_weights_by_lr(run):
    traj = resolve_trajectory(run)
    # checkpoint-9 holds the final adapter's weights: counted once, as the final point, with its optimizer.pt
    assert [(c.step, c.final) for c in traj.checkpoints] == [(3, False), (6, False), (9, True)]
    assert traj.checkpoints[-1].optimizer == run / "checkpoint-9" / "optimizer.pt"
    assert traj.weight_rule.startswith("lr")
    assert abs(sum(traj.weights) - 1) < 1e-12
    # linear decay without warmup: mean lr over steps 1-3 > 4-6 > 7-9
    assert traj.weights[0] > traj.weights[1] > traj.weights[2] > 0
    state = json.loads((run / "trainer_state.json").read_text())
    lr = {e["step"]: e["learning_rate"] for e in state["log_history"] if "learning_rate" in e}
    eta = [sum(lr[s] for s in range(a, a + 3)) / 3 for a in (1, 4, 7)]
    assert traj.weights == pytest.approx([e / sum(eta) for e in eta], rel=1e-12)
    assert [c.final for c in resolve_trajectory(run, "final").checkpoints] == [True]
    sub = resolve_trajectory(run, [run / "checkpoint-3"])
    assert [c.step for c in sub.checkpoints] == [3, 9]


def test_learning_rate_weights_fallbacks():
    w, rule = learning_rate_weights([10, 20], [])
    assert w == [0.5, 0.5] and rule.startswith("equal")
    w, rule = learning_rate_weights([10, None], [{"step": 5, "learning_rate": 1.0}])
    assert w == [0.5, 0.5] and "unknown" in rule
    # no log inside (10, 20]: the last rate at or before 20 stands for it
    w, rule = learning_rate_weights([10, 20], [{"step": 5, "learning_rate": 3.0}, {"step": 10, "learning_rate": 1.0}])
    assert w == pytest.approx([2 / 3, 1 / 3])


def _clone(src: Path, dst: Path, **cfg_changes) -> Path:
    shutil.copytree(src, dst)
    p = dst / "adapter_config.json"
    cfg = json.loads(p.read_text())
    cfg.update(cfg_changes)
    p.write_text(json.dumps(cfg))
    return dst


def test_foreign_checkpoints_are_refused(run, tmp_path):
    with pytest.raises(GradianUserError, match="r=8"):
        resolve_trajectory(run, [_clone(run / "checkpoint-3", tmp_path / "r8", r=8)])
    with pytest.raises(GradianUserError, match="base"):
        resolve_trajectory(
            run, [_clone(run / "checkpoint-3", tmp_path / "other", base_model_name_or_path="/models/other-7b")]
        )
    with pytest.raises(GradianUserError, match="target"):
        resolve_trajectory(run, [_clone(run / "checkpoint-3", tmp_path / "tm", target_modules=["q_proj"])])
    with pytest.raises(GradianUserError, match="adapter_config.json"):
        resolve_trajectory(run, [tmp_path])


def test_checkpoint_weights_swap_and_restore(run, saved_finetune):
    from gradian.api import load_finetune
    from gradian.models.load import ModelSpec, read_adapter_weights

    ft = load_finetune(ModelSpec(str(saved_finetune["base"])), run)
    before = lora_state(ft.model)
    ck = resolve_trajectory(run).checkpoints[0]
    want = read_adapter_weights(ck.path)
    with checkpoint_weights(ft.model, ck):
        now = lora_state(ft.model)
        # PEFT names carry the adapter name; the file's do not
        for k, v in now.items():
            assert torch.equal(v, want[k.replace(".default", "")])
        assert any(not torch.equal(now[k], before[k]) for k in before)
    after = lora_state(ft.model)
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert all(p.requires_grad == (".lora_" in n) for n, p in ft.model.named_parameters())


def test_adam_state_is_read_safely_and_checked(run, saved_finetune, tmp_path):
    from gradian.api import load_finetune
    from gradian.gradients.adam import read_adam_state
    from gradian.gradients.lora import lora_blocks
    from gradian.models.load import ModelSpec

    ft = load_finetune(ModelSpec(str(saved_finetune["base"])), run)
    opt = run / "checkpoint-3" / "optimizer.pt"
    st = read_adam_state(opt, ft.model)
    blocks = lora_blocks(ft.model)
    assert list(st) == [b.name for b in blocks] and all(st[b.name].exp_avg.shape == b.shape for b in blocks)
    assert st[blocks[0].name].step == 3
    # Adam's update for g = 0 from zero moments is 0; for a large g it tends to sign(g)
    g = torch.randn(2, *blocks[0].shape, dtype=torch.float64)
    s0 = st[blocks[0].name]
    u = s0.update(g)
    assert u.shape == g.shape and torch.isfinite(u).all()
    bad = tmp_path / "trunc.pt"
    bad.write_bytes(opt.read_bytes()[:200])
    with pytest.raises(GradianUserError, match="trunc.pt"):
        read_adam_state(bad, ft.model)
    sd = torch.load(opt, weights_only=True)
    sd["state"][0]["exp_avg"] = torch.zeros(3, 3)
    torch.save(sd, tmp_path / "shape.pt")
    with pytest.raises(GradianUserError, match="shape"):
        read_adam_state(tmp_path / "shape.pt", ft.model)
    sd = torch.load(opt, weights_only=True)
    sd["param_groups"][0]["params"] = sd["param_groups"][0]["params"][:-1]
    torch.save(sd, tmp_path / "count.pt")
    with pytest.raises(GradianUserError, match="LoRA matrices"):
        read_adam_state(tmp_path / "count.pt", ft.model)


class _Evil:
    def __reduce__(self):
        return (print, ("unpickled!",))


def test_optimizer_pickle_is_never_executed(run, saved_finetune, tmp_path, capsys):
    from gradian.api import load_finetune
    from gradian.gradients.adam import read_adam_state
    from gradian.models.load import ModelSpec

    ft = load_finetune(ModelSpec(str(saved_finetune["base"])), run)
    p = tmp_path / "evil.pt"
    torch.save({"state": {0: _Evil()}, "param_groups": []}, p)
    with pytest.raises(GradianUserError, match="safely"):
        read_adam_state(p, ft.model)
    assert "unpickled!" not in capsys.readouterr().out


def test_trajectory_scores_equal_the_weighted_sum_of_independent_checkpoints(run, saved_finetune, tmp_path):
    """The trajectory path (one model, weights swapped in place) equals loading every checkpoint on its own."""
    import numpy as np

    from gradian.api import load_finetune, tokenize_training_set, training_index
    from gradian.attribute.evidence import row_norms, trajectory_scores
    from gradian.attribute.queries import make_query, query_gradients
    from gradian.data.formats import load_examples
    from gradian.data.tokenize import TokenizeSpec
    from gradian.engines import DataInfSpec, GradDotSpec, fit_engine, score_index
    from gradian.index.store import GradSpec
    from gradian.models.load import ModelSpec

    base, data = str(saved_finetune["base"]), saved_finetune["data"]
    grad = GradSpec(tokenize=TokenizeSpec(max_length=64))
    qs = [
        make_query("q1", "capitals", "Q: What is the capital of France?\nA:", "Paris", " Tokyo"),
        make_query(
            "q2",
            "capitals",
            [{"role": "user", "content": "What is the capital of Japan?"}],
            "Tokyo",
            "The capital of Japan is Paris.",
            "The capital of Japan is Tokyo.",
        ),
    ]
    engines = [DataInfSpec(), GradDotSpec()]
    ft = load_finetune(ModelSpec(base), run)
    exs = load_examples(data)
    items = tokenize_training_set(exs, ft.tokenizer, grad, data)
    traj = resolve_trajectory(run)
    ev = trajectory_scores(
        ft,
        traj,
        data,
        exs,
        items,
        grad,
        {"capitals": qs},
        engines,
        unit="sentence",
        index_root=tmp_path / "a",
        keep_per_checkpoint=True,
    )
    assert len(ev.indexes) == 3 and len({i["row"]["id"] for i in ev.indexes}) == 3
    want: dict = {}
    for ck in traj.checkpoints:
        alone = load_finetune(ModelSpec(base), ck.path)  # a fresh model with this checkpoint's adapter
        for unit in ("row", "sentence"):
            g = GradSpec(tokenize=grad.tokenize, unit=unit)
            idx, *_ = training_index(
                alone, data, g, root=tmp_path / "b" / f"{ck.step}-{unit}", examples=exs, items=items
            )
            if unit == "row":
                row_idx = idx
                Q = query_gradients(alone.model, alone.tokenizer, qs, idx, grad.tokenize)
                R = {}
                for es in engines:
                    R[es.name] = fit_engine(es, idx).precondition(idx, Q)
            raw = score_index(idx, [R[es.name] for es in engines])
            gn = row_norms(idx)
            for es, r in zip(engines, raw):
                r = r.numpy()
                qn = np.sqrt(sum((v * v).sum(1).numpy() for v in R[es.name].values()))
                key = "" if unit == "row" else "unit_"
                for kind, val in ((f"{key}raw", r), (f"{key}cosine", r / np.outer(qn, gn))):
                    want.setdefault((es.name, kind), 0.0)
                    want[(es.name, kind)] = want[(es.name, kind)] + ck.weight * val
        assert row_idx.id == next(i["row"]["id"] for i in ev.indexes if i["checkpoint"] == ck.label)
    for (name, kind), val in want.items():
        got = getattr(ev.scores["capitals"][name], kind)
        np.testing.assert_allclose(got, val, rtol=1e-9, atol=1e-12, err_msg=f"{name}.{kind}")
    # the final adapter's weights are back in place
    fresh = load_finetune(ModelSpec(base), run)
    a, b = lora_state(ft.model), lora_state(fresh.model)
    assert all(torch.equal(a[k], b[k]) for k in a)


def _cli(args):
    from typer.testing import CliRunner

    from gradian.cli import app

    res = CliRunner().invoke(app, [str(a) for a in args])
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    return res.exit_code, lines, res.output


@pytest.mark.parametrize("case", ["truncated-optimizer", "foreign-checkpoint", "not-an-adapter"])
def test_bad_trajectory_inputs_exit_2_with_one_line(run, saved_finetune, tmp_path, case):
    """gradian index over the trajectory: a corrupted optimizer.pt or a checkpoint of another run is a user error."""
    adapter = tmp_path / "adapter"
    shutil.copytree(run, adapter)
    extra = []
    if case == "truncated-optimizer":
        p = adapter / "checkpoint-3" / "optimizer.pt"
        p.write_bytes(p.read_bytes()[:100])
        extra = ["--optimizer", "adam"]
        needle = "checkpoint-3/optimizer.pt"
    elif case == "foreign-checkpoint":
        _clone(run / "checkpoint-3", tmp_path / "foreign", r=16)
        extra = ["--checkpoints", tmp_path / "foreign"]
        needle = "r=16"
    else:
        (tmp_path / "empty").mkdir()
        extra = ["--checkpoints", tmp_path / "empty"]
        needle = "adapter_config.json"
    code, lines, out = _cli(
        [
            "index",
            "--base",
            saved_finetune["base"],
            "--adapter",
            adapter,
            "--data",
            saved_finetune["data"],
            "--max-length",
            "64",
            "--out",
            tmp_path / "idx",
            *extra,
        ]
    )
    assert code == 2, out
    assert len(lines) == 1 and needle in lines[0] and "fix:" in lines[0] and "Traceback" not in out
