"""The training trajectory: discovery, learning-rate weights, refusals, weight swapping, Adam state."""

from __future__ import annotations

import json
import math
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
from gradian.train import train_lora
from gradian_testlib import cli_args, small_train_spec

SPEC = small_train_spec(num_train_epochs=3, lr_scheduler_type="linear", warmup_ratio=0.0)


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


def test_learning_rate_weights_stay_finite_and_refuse_impossible_rates():
    # rates near the float limit: their sum overflows, the weights must not
    huge = [{"step": 5, "learning_rate": 1.7e308}, {"step": 15, "learning_rate": 1.7e308}]
    w, _ = learning_rate_weights([10, 20], huge)
    assert w == pytest.approx([0.5, 0.5])
    w, _ = learning_rate_weights(
        [10, 20], [{"step": 5, "learning_rate": 1.7e308}, {"step": 15, "learning_rate": 1e-300}]
    )
    assert w == pytest.approx([1.0, 0.0]) and all(x >= 0 for x in w)
    for bad in (math.inf, math.nan, -1e-4, True, "1e-4"):
        with pytest.raises(GradianUserError, match="log_history\\[1\\].learning_rate"):
            learning_rate_weights([10, 20], [{"step": 5, "learning_rate": 1.0}, {"step": 15, "learning_rate": bad}])
    with pytest.raises(GradianUserError, match="log_history\\[0\\].step"):
        learning_rate_weights([10, 20], [{"step": math.inf, "learning_rate": 1.0}])


def _edit_state(path: Path, fn) -> None:
    state = json.loads(path.read_text())
    fn(state)
    path.write_text(json.dumps(state, allow_nan=True))


def _set_first(key: str, value, where: str = "learning_rate"):
    """Set ``key`` of the first log entry that logs ``where`` (steps 1..3 of the tiny run)."""

    def fn(st):
        next(e for e in st["log_history"] if where in e)[key] = value

    return fn


# (file to break, how, what the one line must name); "final" is the adapter's own trainer_state.json
STATE_CASES = {
    "lr-inf": ("final", _set_first("learning_rate", math.inf), "learning_rate = inf: not a finite learning rate"),
    "lr-nan": ("checkpoint-3", _set_first("learning_rate", math.nan), "learning_rate = nan: not a finite"),
    "lr-negative": (
        "final",
        _set_first("learning_rate", -1e-4),
        "learning_rate = -0.0001: a learning rate must be >= 0",
    ),
    "lr-string": ("checkpoint-6", _set_first("learning_rate", "fast"), "learning_rate = 'fast': not a number"),
    "lr-bool": ("checkpoint-6", _set_first("learning_rate", True), "learning_rate = True: not a number"),
    "lr-huge-int": ("final", _set_first("learning_rate", 10**400), "too large for a learning rate"),
    "step-inf": ("final", _set_first("step", math.inf), "step = inf: not a finite step"),
    "step-negative": ("checkpoint-3", _set_first("step", -1), "step = -1: a step must be >= 0"),
    "step-fraction": ("checkpoint-3", _set_first("step", 2.5), "step = 2.5: not a whole number"),
    "epoch-nan": ("final", _set_first("epoch", math.nan), "epoch = nan: not a finite epoch"),
    "global-step": ("final", lambda st: st.update(global_step=-3), "global_step = -3"),
    "history-dict": ("checkpoint-3", lambda st: st.update(log_history={"a": 1}), "log_history is a JSON dict"),
    "entry-list": ("checkpoint-6", lambda st: st["log_history"].insert(0, [1]), "log_history[0] is a JSON list"),
}


@pytest.mark.parametrize("case", sorted(STATE_CASES))
def test_every_trainer_state_number_is_checked(run, tmp_path, case):
    """A number the checkpoint weights are computed from that is not finite or not possible is one line naming
    the file and the key, never a NaN (or negative) weight; every checkpoint's file is checked, not only the longest.
    """
    ad = tmp_path / "adapter"
    shutil.copytree(run, ad)
    folder, fn, needle = STATE_CASES[case]
    p = (ad if folder == "final" else ad / folder) / "trainer_state.json"
    _edit_state(p, fn)
    with pytest.raises(GradianUserError) as e:
        resolve_trajectory(ad)
    line = e.value.one_line()
    assert line.startswith(f"{p}: ") and needle in line and "(fix: " in line and "\n" not in line, line
    if folder != "final":  # with equal weights a checkpoint's log is not used, so not read
        assert len(resolve_trajectory(ad, weighting="equal").checkpoints) == 3


@pytest.mark.parametrize(
    "text,needle",
    [
        ("[1, 2]", "top level is a JSON list, not an object"),
        ("[" * 100_000 + "]" * 100_000, "nested"),
        ('{"log_history": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested"),
        ("{", "malformed JSON"),
    ],
    ids=["list", "deep", "deep-history", "malformed"],
)
@pytest.mark.parametrize("folder", ["checkpoint-3", "final"])
def test_unreadable_trainer_state_is_one_line(run, tmp_path, text, needle, folder):
    ad = tmp_path / "adapter"
    shutil.copytree(run, ad)
    p = (ad if folder == "final" else ad / folder) / "trainer_state.json"
    p.write_text(text)
    with pytest.raises(GradianUserError, match=needle) as e:
        resolve_trajectory(ad)
    assert str(p) in e.value.one_line()


def test_sound_trainer_states_still_weigh_by_lr(run, tmp_path):
    """The checks refuse nothing a Trainer writes: zero learning rates (warmup start) and a missing log are fine."""
    ad = tmp_path / "adapter"
    shutil.copytree(run, ad)
    _edit_state(ad / "trainer_state.json", _set_first("learning_rate", 0.0))
    traj = resolve_trajectory(ad)
    assert traj.weight_rule.startswith("lr") and all(math.isfinite(w) and w >= 0 for w in traj.weights)
    for p in ad.rglob("trainer_state.json"):
        p.unlink()
    assert resolve_trajectory(ad).weight_rule.startswith("equal")


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
    from gradian.finetune import load_finetune
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
    from gradian.finetune import load_finetune
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


def _first_state(sd):
    return sd["state"][sd["param_groups"][0]["params"][0]]


# optimizer.pt edits, and what the one line must name (the key and why)
ADAM_CASES = {
    "moment-float": (lambda sd: _first_state(sd).update(exp_avg=1.0), "state[0].exp_avg is 1.0, not a tensor"),
    "moment-int": (
        lambda sd: _first_state(sd).update(exp_avg=_first_state(sd)["exp_avg"].long()),
        "state[0].exp_avg is a torch.int64 strided tensor",
    ),
    "moment-nan": (lambda sd: _first_state(sd)["exp_avg"].fill_(math.nan), "state[0].exp_avg holds NaN or inf"),
    "second-moment-negative": (
        lambda sd: _first_state(sd)["exp_avg_sq"].fill_(-1.0),
        "state[0].exp_avg_sq holds negative values",
    ),
    "state-missing": (lambda sd: sd["state"].pop(0), "state[0] has no Adam moments"),
    "param-string": (
        lambda sd: sd["param_groups"][0]["params"].__setitem__(0, "a"),
        "param_groups[0].params[0] = 'a': not a number",
    ),
    "param-twice": (
        lambda sd: sd["param_groups"][0]["params"].__setitem__(1, 0),
        "param_groups[0].params[1] = 0: the parameter is in two groups",
    ),
    "betas-string": (lambda sd: sd["param_groups"][0].update(betas=("x", "y")), "betas[0] = 'x': not a number"),
    "betas-one": (lambda sd: sd["param_groups"][0].update(betas=(1, 1)), "betas[0] = 1: a beta must be < 1"),
    "betas-negative": (lambda sd: sd["param_groups"][0].update(betas=(0.9, -0.1)), "betas[1] = -0.1"),
    "betas-single": (lambda sd: sd["param_groups"][0].update(betas=0.9), "betas = 0.9: not a pair"),
    "betas-tensor-nan": (
        lambda sd: sd["param_groups"][0].update(betas=(torch.tensor(math.nan), 0.999)),
        "betas[0] = nan: not a finite beta",
    ),
    "eps-nan": (lambda sd: sd["param_groups"][0].update(eps=math.nan), "eps = nan: not a finite eps"),
    "eps-zero": (lambda sd: sd["param_groups"][0].update(eps=0.0), "eps = 0.0: an eps must be > 0"),
    "step-negative": (lambda sd: _first_state(sd).update(step=torch.tensor(-1.0)), "state[0].step = -1.0"),
    "step-inf": (lambda sd: _first_state(sd).update(step=math.inf), "state[0].step = inf: not a finite step"),
    "step-string": (lambda sd: _first_state(sd).update(step="3"), "state[0].step = '3': not a number"),
}


@pytest.mark.parametrize("case", sorted(ADAM_CASES))
def test_every_adam_state_value_is_checked(run, saved_finetune, tmp_path, case):
    """optimizer.pt values that are not tensors/numbers, not finite or not possible are one line naming
    optimizer.pt and the key, before any gradient is preconditioned (not "check the base and adapter weights").
    """
    from gradian.finetune import load_finetune
    from gradian.gradients.adam import read_adam_state
    from gradian.models.load import ModelSpec

    ft = load_finetune(ModelSpec(str(saved_finetune["base"])), run)
    sd = torch.load(run / "checkpoint-3" / "optimizer.pt", weights_only=True)
    edit, needle = ADAM_CASES[case]
    edit(sd)
    p = tmp_path / "optimizer.pt"
    torch.save(sd, p)
    with pytest.raises(GradianUserError) as e:
        read_adam_state(p, ft.model)
    line = e.value.one_line()
    assert line.startswith(f"{p}: ") and needle in line and "(fix: " in line, line


def test_adam_update_that_overflows_blames_optimizer_pt():
    """A finite but extreme state (a tiny eps over a zero second moment) whose update leaves the float range names
    optimizer.pt; a non-finite gradient passes through for the index's own check (which blames the weights).
    """
    from gradian.gradients.adam import AdamState

    st = AdamState(
        torch.full((2, 3), 1e300, dtype=torch.float64),
        torch.zeros(2, 3, dtype=torch.float64),
        0.0,
        0.9,
        0.999,
        1e-300,
        source="out/checkpoint-3/optimizer.pt: state[0] (a.lora_A)",
    )
    g = torch.full((1, 2, 3), 1e-3, dtype=torch.float64)
    with pytest.raises(GradianUserError, match="out/checkpoint-3/optimizer.pt: state\\[0\\].*not finite"):
        st.update(g)
    sound = AdamState(torch.zeros(2, 3), torch.zeros(2, 3), 0.0, 0.9, 0.999, 1e-8)
    u = sound.update(g)
    assert torch.isfinite(u).all() and u.shape == g.shape
    assert not torch.isfinite(sound.update(torch.full((1, 2, 3), math.nan))).any()


class _Evil:
    def __reduce__(self):
        return (print, ("unpickled!",))


def test_optimizer_pickle_is_never_executed(run, saved_finetune, tmp_path, capsys):
    from gradian.finetune import load_finetune
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

    from gradian.attribute.evidence import row_norms, trajectory_scores
    from gradian.attribute.queries import make_query, query_gradients
    from gradian.data.formats import load_examples
    from gradian.data.tokenize import TokenizeSpec
    from gradian.engines import DataInfSpec, GradDotSpec, fit_engine, score_index
    from gradian.finetune import load_finetune, tokenize_training_set, training_index
    from gradian.index.store import GradSpec
    from gradian.models.load import ModelSpec

    base, data = str(saved_finetune["base"]), saved_finetune["data"]
    grad = GradSpec(tokenize=TokenizeSpec(max_length=64), unit_grads="exact")  # the separate builds' units
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
        joint=False,  # the same passes as the independent builds below (the joint build: tests/index/test_plan.py)
    )
    assert len(ev.indexes) == 3 and len({i["row"]["id"] for i in ev.indexes}) == 3
    want: dict = {}
    for ck in traj.checkpoints:
        alone = load_finetune(ModelSpec(base), ck.path)  # a fresh model with this checkpoint's adapter
        for unit in ("row", "sentence"):
            g = GradSpec(tokenize=grad.tokenize, unit=unit, unit_grads="exact")
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
    # a sentence run reads its drill-down off the unit scores: no checkpoint's preconditioned queries are kept
    # (m × Σ d_l float64 per engine and checkpoint); a whole-row run keeps them for its drill-down
    assert ev.preconditioned == []
    ev_row = trajectory_scores(
        ft, traj, data, exs, items, grad, {"capitals": qs}, engines, unit="row", index_root=tmp_path / "a"
    )
    assert len(ev_row.preconditioned) == len(traj.checkpoints)
    for es in engines:  # the final checkpoint's, as the independent build above preconditioned them (R)
        kept = ev_row.preconditioned[-1][es.name]["capitals"]
        assert set(kept) == set(R[es.name])
        for k, v in R[es.name].items():
            np.testing.assert_allclose(kept[k].numpy(), v.numpy(), rtol=1e-6, atol=1e-9, err_msg=f"{es.name}.{k}")
    # the final adapter's weights are back in place
    fresh = load_finetune(ModelSpec(base), run)
    a, b = lora_state(ft.model), lora_state(fresh.model)
    assert all(torch.equal(a[k], b[k]) for k in a)


def _cli(args):
    from typer.testing import CliRunner

    from gradian.cli import app
    from gradian_testlib import without_setup

    res = CliRunner().invoke(app, [str(a) for a in args])
    lines = without_setup([ln for ln in res.output.strip().splitlines() if ln.strip()])
    return res.exit_code, lines, res.output


def test_adam_preconditioning_is_the_same_in_one_pass_and_in_separate_builds(run, saved_finetune, tmp_path):
    """``optimizer="adam"``: the joint row + sentence build and the separate builds read each checkpoint's
    optimizer.pt alike (one index id per unit, equal scores), and the preconditioning changes the scores."""
    import numpy as np

    from gradian.attribute.evidence import trajectory_scores
    from gradian.attribute.queries import make_query
    from gradian.data.formats import load_examples
    from gradian.data.tokenize import TokenizeSpec
    from gradian.engines import GradDotSpec
    from gradian.finetune import load_finetune, tokenize_training_set
    from gradian.index.store import GradSpec
    from gradian.models.load import ModelSpec

    data = saved_finetune["data"]
    ft = load_finetune(ModelSpec(str(saved_finetune["base"])), run)
    exs = load_examples(data)
    qs = [make_query("q1", "capitals", "Q: What is the capital of France?\nA:", "Paris", " Tokyo")]
    got = {}
    for optimizer, joint in (("adam", False), ("adam", True), ("none", False)):
        grad = GradSpec(tokenize=TokenizeSpec(max_length=64), optimizer=optimizer, unit_grads="exact")
        items = tokenize_training_set(exs, ft.tokenizer, grad, data)
        got[optimizer, joint] = trajectory_scores(
            ft,
            resolve_trajectory(run),
            data,
            exs,
            items,
            grad,
            {"capitals": qs},
            [GradDotSpec()],
            unit="sentence",
            index_root=tmp_path / f"{optimizer}-{joint}",
            joint=joint,
        )
    one, sep, plain = got["adam", True], got["adam", False], got["none", False]
    assert len(one.indexes) == 3 and "joint" in one.indexes[0] and "joint" not in sep.indexes[0]
    for a, b in zip(one.indexes, sep.indexes):
        assert (a["row"]["id"], a["sentence"]["id"]) == (b["row"]["id"], b["sentence"]["id"])
    for kind in ("raw", "unit_raw"):
        a, b = getattr(one.scores["capitals"]["graddot"], kind), getattr(sep.scores["capitals"]["graddot"], kind)
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * np.abs(b).max(), err_msg=kind)
        c = getattr(plain.scores["capitals"]["graddot"], kind)
        assert not np.allclose(b, c, rtol=1e-2), kind  # Adam's update direction is not the raw gradient


@pytest.mark.parametrize(
    "case", ["truncated-optimizer", "foreign-checkpoint", "not-an-adapter", "inf-learning-rate", "betas-one"]
)
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
    elif case == "inf-learning-rate":  # issue 21: was every score NaN, exit 0
        _edit_state(adapter / "trainer_state.json", _set_first("learning_rate", math.inf))
        needle = "learning_rate = inf: not a finite learning rate"
    elif case == "betas-one":  # issue 21: was "per-example gradients are not finite ... check the base and adapter"
        p = adapter / "checkpoint-3" / "optimizer.pt"
        sd = torch.load(p, weights_only=True)
        sd["param_groups"][0]["betas"] = (1.0, 1.0)
        torch.save(sd, p)
        extra = ["--optimizer", "adam"]
        needle = "checkpoint-3/optimizer.pt: param_groups[0].betas[0] = 1.0: a beta must be < 1"
    else:
        (tmp_path / "empty").mkdir()
        extra = ["--checkpoints", tmp_path / "empty"]
        needle = "adapter_config.json"
    code, lines, out = _cli(
        [
            *cli_args(
                "index",
                base=saved_finetune["base"],
                adapter=adapter,
                data=saved_finetune["data"],
                max_length=64,
                out=tmp_path / "idx",
            ),
            *extra,
        ]
    )
    assert code == 2, out
    assert len(lines) == 1 and needle in lines[0] and "fix:" in lines[0] and "Traceback" not in out


@pytest.mark.parametrize("where", ["raw", "cosine", "reference"])
def test_a_non_finite_score_never_becomes_a_verdict(where):
    """The one guard before a verdict: a NaN/inf score (whatever produced it) is a one-line error, not a ranking."""
    import numpy as np

    from gradian.attribute.evidence import CapabilityEvidence, EngineScores
    from gradian.attribute.pipeline import AttributeSpec, verdict
    from gradian.attribute.queries import Query

    raw, cos = np.full((2, 5), -0.5), np.full((2, 5), -0.1)
    refs = {"bm25": np.zeros((2, 5))}
    {"raw": raw, "cosine": cos, "reference": refs["bm25"]}[where][1, 3] = np.nan
    ev = CapabilityEvidence({"datainf": EngineScores("datainf", raw, cos)}, refs)
    q = Query("q1", "capitals", "Capital of Peru?", "Lima", "Caracas", "contrastive")
    with pytest.raises(GradianUserError) as e:
        verdict(ev, None, [], [], [q, q], AttributeSpec(), None)  # refused before anything else is read
    line = e.value.one_line()
    assert "capitals" in line and "1 of 5 training rows are not finite" in line and "trainer_state.json" in line


def _torchtune_run(run: Path, root: Path, epochs_planned: int = 3, steps: list[int] | None = None) -> Path:
    """``run``'s three checkpoints laid out as torchtune 0.6.1 leaves them: ``epoch_{0,1,2}/``,
    ``torchtune_config.yaml`` and ``logs/log_<time>.txt`` (a ``Step N | loss:.. lr:..`` line a step)."""
    out = root / "tt"
    for n, p in enumerate(discover_checkpoints(run)):
        shutil.copytree(p, out / f"epoch_{n}", ignore=shutil.ignore_patterns("trainer_state.json", "optimizer.pt"))
    (out / "torchtune_config.yaml").write_text(f"epochs: {epochs_planned}\nlog_every_n_steps: 1\n")
    (out / "logs").mkdir()
    lines = [
        f"Step {s} | loss:{2.0 / s} lr:{0.001 * (10 - s)} tokens_per_second_per_gpu:100.0"
        for s in steps or range(1, 10)
    ]
    (out / "logs" / "log_1796637691.txt").write_text("\n".join(lines) + "\n")
    return out


def test_a_torchtune_run_s_epochs_are_its_trajectory(run, tmp_path):
    """torchtune's ``epoch_N/`` folders are the checkpoints; each ends at step (N + 1) · T / E, T the steps its log
    holds and E the epochs, and is weighted by the mean ``lr`` logged over its own steps."""
    out = _torchtune_run(run, tmp_path)
    assert [p.name for p in discover_checkpoints(out / "epoch_2")] == ["epoch_0", "epoch_1"]
    assert [p.name for p in discover_checkpoints(out / "epoch_1")] == ["epoch_0"]
    traj = resolve_trajectory(out / "epoch_2")
    assert [(c.path.name, c.step, c.final) for c in traj.checkpoints] == [
        ("epoch_0", 3, False),
        ("epoch_1", 6, False),
        ("epoch_2", 9, True),
    ]
    eta = [sum(0.001 * (10 - s) for s in range(a, a + 3)) / 3 for a in (1, 4, 7)]
    assert traj.weights == pytest.approx([e / sum(eta) for e in eta], rel=1e-12)
    assert "torchtune epochs of 3 steps (log_1796637691.txt: 9 steps over 3 epochs)" in traj.weight_rule


@pytest.mark.parametrize(
    "planned, steps, why",
    [
        (4, None, "torchtune_config.yaml plans 4 epochs, 3 are saved"),  # an unfinished (or crashed) run
        (3, list(range(2, 10, 2)), "does not log every step of 3 whole epochs"),  # log_every_n_steps 2
        (3, list(range(1, 9)), "does not log every step of 3 whole epochs"),  # 8 steps do not split into 3
    ],
)
def test_a_torchtune_run_whose_epochs_cannot_be_placed_is_weighted_equally(run, tmp_path, planned, steps, why):
    out = _torchtune_run(run, tmp_path, planned, steps)
    traj = resolve_trajectory(out / "epoch_2")
    assert [c.step for c in traj.checkpoints] == [None, None, None]
    assert traj.weights == pytest.approx([1 / 3] * 3) and why in traj.weight_rule
    assert traj.weight_rule.startswith("equal (torchtune epochs: ")


def test_a_run_folder_without_a_final_adapter_names_its_last_checkpoint(run, tmp_path):
    out = _torchtune_run(run, tmp_path)
    with pytest.raises(GradianUserError, match=r"its checkpoints are epoch_0\.\.epoch_2") as err:
        resolve_trajectory(out)
    assert err.value.fix == f"pass its last checkpoint, --adapter {out / 'epoch_2'}"


@pytest.fixture(scope="module")
def dora_run(saved_finetune, tmp_path_factory):
    """A tiny DoRA adapter (``gradian train``'s use_dora) trained for 3 epochs, with its checkpoints."""
    out = tmp_path_factory.mktemp("traj-dora") / "adapter"
    train_lora(str(saved_finetune["base"]), saved_finetune["data"], out, SPEC.replace(use_dora=True))
    return out


def test_a_dora_checkpoint_swapped_in_is_that_checkpoint_loaded_alone(dora_run, saved_finetune):
    """Every checkpoint of a DoRA run holds its magnitudes; swapping a checkpoint into the loaded final adapter gives
    the model that checkpoint is on its own (the same per-example gradients, magnitude blocks included), with PEFT's
    DoRA cache on (``dora_caching``: the same gradients, the cache cleared by the swap and its restore), and its
    optimizer.pt's moments of the magnitudes are read as their (out, 1) blocks."""
    from gradian import per_example_grads
    from gradian.data.formats import load_examples
    from gradian.data.tokenize import TokenizeSpec, collate, tokenize_example
    from gradian.finetune import load_finetune
    from gradian.gradients.adam import read_adam_state
    from gradian.gradients.lora import lora_blocks
    from gradian.models.load import ModelSpec, dora_caching

    base = ModelSpec(str(saved_finetune["base"]))
    ft = load_finetune(base, dora_run)
    assert ft.adapter_config["use_dora"] is True
    ck = resolve_trajectory(dora_run).checkpoints[0]
    alone = load_finetune(base, ck.path)
    exs = load_examples(saved_finetune["data"])[:4]
    batch = collate(
        [tokenize_example(e, ft.tokenizer, TokenizeSpec(max_length=64)) for e in exs], ft.tokenizer.pad_token_id
    )
    final = per_example_grads(ft.model, batch)
    with dora_caching(ft.model):  # PEFT's DoRA cache (BA, norms) filled by the final adapter, cleared by the swaps
        cached = per_example_grads(ft.model, batch)
        assert any(getattr(m, "_dora_cache", None) for m in ft.model.modules())  # the cache is in use
        with checkpoint_weights(ft.model, ck):
            swapped = per_example_grads(ft.model, batch)
        back = per_example_grads(ft.model, batch)
    assert not any(getattr(m, "_dora_cache", None) for m in ft.model.modules())  # cleared on leaving
    for n in final:
        torch.testing.assert_close(cached[n], final[n], rtol=1e-6, atol=1e-9)
        torch.testing.assert_close(back[n], final[n], rtol=1e-6, atol=1e-9)
    want = per_example_grads(alone.model, batch)
    mags = [b.name for b in lora_blocks(ft.model) if b.kind == "M"]
    assert mags and set(swapped) == set(want)
    for n in swapped:
        torch.testing.assert_close(swapped[n], want[n], rtol=1e-5, atol=1e-7)
    assert any(not torch.allclose(final[n], want[n]) for n in mags)  # training moved the magnitudes' gradients
    st = read_adam_state(ck.path / "optimizer.pt", ft.model)
    assert all(st[n].exp_avg.shape == swapped[n].shape[1:] and st[n].step == 3 for n in mags)
