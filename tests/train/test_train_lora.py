"""gradian train: what it writes loads back, the loss mask is Gradian's, runs are deterministic,
configs parse strictly, and the CLI reports user errors in one line."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gradian.errors import GradianUserError
from gradian.train import read_trainer_state, train_lora
from gradian.trainconfig import CONFIG_NAME, load_train_config, spec_from_config
from gradian_testlib import cli_args, small_train_spec

SMALL = small_train_spec(num_train_epochs=2)


@pytest.fixture(scope="module")
def run(saved_finetune, tmp_path_factory):
    out = tmp_path_factory.mktemp("train") / "adapter"
    data = saved_finetune["data"]
    train_lora(str(saved_finetune["base"]), data, out, SMALL, eval_data=data)
    return out


def test_writes_adapter_config_and_state(run, saved_finetune):
    from gradian.models.load import ModelSpec, load_adapter, load_base

    for name in (
        "adapter_config.json",
        "adapter_model.safetensors",
        CONFIG_NAME,
        "trainer_state.json",
        "gradian_train.json",
    ):
        assert (run / name).exists(), name
    assert not any(p.name.startswith(".") for p in run.parent.iterdir())  # no temp folder left behind
    cfg = json.loads((run / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 4 and cfg["lora_alpha"] == 8
    assert sorted(cfg["target_modules"]) == sorted(SMALL.target_modules)

    # the adapter loads with Gradian's checked loader, and it learned something (B moved off zero)
    model, _ = load_base(ModelSpec(base=str(saved_finetune["base"])))
    pm, acfg, notes = load_adapter(model, run, str(saved_finetune["base"]))
    w = load_file(str(run / "adapter_model.safetensors"))
    assert any(k.endswith("lora_B.weight") and t.abs().sum() > 0 for k, t in w.items())

    # trainer_state.json: a log entry every step with the fields the audit lane reads, eval_loss per epoch
    state = read_trainer_state(run)
    logs = state["log_history"]
    train_logs = [e for e in logs if "loss" in e]
    assert len(train_logs) == state["global_step"] >= 2
    for e in train_logs:
        assert {"loss", "grad_norm", "learning_rate", "epoch", "step"} <= set(e)
        assert torch.isfinite(torch.tensor(e["loss"]))
    assert [e["epoch"] for e in logs if "eval_loss" in e] == [1.0, 2.0]
    assert "train_runtime" in logs[-1] and "train_loss" in logs[-1]

    # the config written reads back into the same spec, and the audit lane reads it as gradian's own file with
    # TRL semantics, knowing that a 'messages' row is trained on its final assistant turn only
    assert spec_from_config(run / CONFIG_NAME) == SMALL
    from gradian.audit.config import read_config

    tc = read_config(run / CONFIG_NAME)
    assert tc.formats == ["gradian"] and tc.trainer == "trl" and tc.is_lora
    assert tc.messages_loss == "final_assistant_turn" and tc.learning_rate == SMALL.learning_rate


def test_trainer_sees_gradians_mask(saved_finetune):
    """The rows the Trainer batches are tokenize_example's (same ids, labels), and its loss is their token mean."""
    from gradian.data.formats import load_examples
    from gradian.data.tokenize import TokenizeSpec, collate, tokenize_example
    from gradian.gradients import per_example_loss
    from gradian.models.load import ModelSpec, load_base
    from gradian.train import _Rows, _tokenise_file

    model, tok = load_base(ModelSpec(base=str(saved_finetune["base"])))
    items, dropped, tspec = _tokenise_file(saved_finetune["data"], tok, SMALL)
    assert tspec == TokenizeSpec(max_length=64, loss_on="completion", add_eos=True)
    exs = load_examples(saved_finetune["data"])
    assert dropped == [] and [i.id for i in items] == [e.id for e in exs]
    ds = _Rows(items)
    for i, ex in enumerate(exs):
        ref = tokenize_example(ex, tok, tspec)
        assert ds[i]["item"].labels == ref.labels and ds[i]["input_ids"] == ref.input_ids
    batch = collate([ds[i]["item"] for i in range(4)], tok.pad_token_id, "right")
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
    n = (batch["labels"][:, 1:] != -100).sum(1).float()
    token_mean = (per_example_loss(out.logits, batch["labels"]) * n).sum() / n.sum()
    assert torch.allclose(out.loss, token_mean, atol=1e-5)


def test_same_seed_same_adapter(saved_finetune, tmp_path):
    spec = SMALL.replace(num_train_epochs=1, lora_dropout=0.1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        a = train_lora(str(saved_finetune["base"]), saved_finetune["data"], tmp_path / "a", spec)
    # transformers' deprecation of is_gradient_checkpointing (asked by PEFT and the Trainer) is not the user's to fix
    assert not [w for w in seen if "is_gradient_checkpointing" in str(w.message)]
    b = train_lora(str(saved_finetune["base"]), saved_finetune["data"], tmp_path / "b", spec)
    c = train_lora(str(saved_finetune["base"]), saved_finetune["data"], tmp_path / "c", spec.replace(seed=1))
    wa, wb, wc = (load_file(str(p / "adapter_model.safetensors")) for p in (a, b, c))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert any(not torch.equal(wa[k], wc[k]) for k in wa)


def test_refuses_to_overwrite_and_cleans_up(saved_finetune, tmp_path):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(GradianUserError, match="not empty"):
        train_lora(str(saved_finetune["base"]), saved_finetune["data"], out, SMALL)
    assert (out / "keep.txt").read_text() == "mine"
    with pytest.raises(GradianUserError, match="target module"):
        train_lora(
            str(saved_finetune["base"]),
            saved_finetune["data"],
            tmp_path / "x",
            SMALL.replace(target_modules=("c_attn",)),
        )
    assert not (tmp_path / "x").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_config_parsing_is_strict(tmp_path: Path):
    p = tmp_path / "c.yaml"
    p.write_text(
        "learning_rate: 2e-4\nnum_train_epochs: 2\nmax_seq_length: 128\nuse_peft: true\nlora_r: 8\n"
        "lora_alpha: 16\nlora_target_modules: [q_proj, v_proj]\nreport_to: none\n"
    )
    s = spec_from_config(p)
    assert (s.learning_rate, s.num_train_epochs, s.max_length, s.r, s.lora_alpha) == (2e-4, 2.0, 128, 8, 16)
    assert s.target_modules == ("q_proj", "v_proj")
    # a peft section with PEFT names works too, and flags override the file
    p.write_text("learning_rate: 1e-4\npeft:\n  r: 4\n  lora_alpha: 8\n  target_modules: all-linear\n")
    s = spec_from_config(p, learning_rate=3e-4)
    assert s.learning_rate == 3e-4 and s.r == 4 and len(s.target_modules) == 7
    for text, match in [
        ("learning_rte: 1e-4\n", "unknown training setting 'learning_rte'"),
        ("learning_rate: fast\n", "learning_rate must be a float"),
        ("packing: true\n", "packing is not supported"),
        ("use_peft: false\n", "only trains LoRA"),
        ("r: 2.5\n", "r must be a int"),
        ("- a\n- b\n", "not a mapping"),
        ("a: [\n", "malformed YAML"),
    ]:
        p.write_text(text)
        with pytest.raises(GradianUserError, match=match):
            spec_from_config(p)
    with pytest.raises(GradianUserError, match="not found"):
        load_train_config(tmp_path / "missing.yaml")


def _small_cli_train(saved_finetune, out, **over) -> list[str]:
    """``gradian train`` of one epoch, r 2 on q and v, 48 tokens, batch 4 (``over``: more flags)."""
    flags = dict(epochs=1, r=2, targets="q_proj,v_proj", max_length=48, batch_size=4, **over)
    return cli_args("train", base=saved_finetune["base"], data=saved_finetune["data"], out=out, **flags)


def test_cli_train_and_one_line_errors(saved_finetune, tmp_path):
    from typer.testing import CliRunner

    from gradian.cli import app

    out = tmp_path / "cli-adapter"
    args = _small_cli_train(saved_finetune, out, alpha=4, lr="1e-3")
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "adapter:" in res.output
    spec = spec_from_config(out / CONFIG_NAME)
    assert (spec.r, spec.lora_alpha, spec.target_modules, spec.max_length) == (2, 4, ("q_proj", "v_proj"), 48)
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 2 and "--overwrite" in again.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    res = CliRunner().invoke(
        app, ["train", "--base", str(saved_finetune["base"]), "--data", str(bad), "--out", str(tmp_path / "y")]
    )
    assert res.exit_code == 2
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "bad.jsonl:1" in errors[0] and "no assistant turn" in errors[0]


def test_checkpoint_per_epoch(run):
    """save_strategy=epoch (the default) leaves the HF layout: out/checkpoint-<step>/ with the adapter at that
    step, optimizer.pt (readable with weights_only=True) and trainer_state.json; no pickled Trainer extras."""
    from gradian.train import CHECKPOINT_FILES

    cks = sorted(run.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert len(cks) == SMALL.num_train_epochs
    steps = [int(p.name.split("-")[1]) for p in cks]
    assert steps[-1] == read_trainer_state(run)["global_step"]
    for ck in cks:
        assert sorted(p.name for p in ck.iterdir()) == sorted(CHECKPOINT_FILES)
        opt = torch.load(ck / "optimizer.pt", map_location="cpu", weights_only=True)
        assert {"state", "param_groups"} <= set(opt)
    # the last checkpoint is the final adapter
    last, final = (
        load_file(str(cks[-1] / "adapter_model.safetensors")),
        load_file(str(run / "adapter_model.safetensors")),
    )
    assert last.keys() == final.keys() and all(torch.equal(last[k], final[k]) for k in final)
    first = load_file(str(cks[0] / "adapter_model.safetensors"))
    assert any(not torch.equal(first[k], final[k]) for k in final)


def test_cli_train_dora_writes_a_dora_adapter_and_its_config(saved_finetune, tmp_path):
    """``gradian train --dora``: PEFT's use_dora in adapter_config.json, a magnitude per adapted layer in the weights,
    ``use_dora: true`` in the training config (read back the same); a spec without it keeps its old dict (ids)."""
    import json

    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from gradian.cli import app
    from gradian.trainconfig import TrainSpec

    out = tmp_path / "dora"
    res = CliRunner().invoke(app, [*_small_cli_train(saved_finetune, out), "--dora"])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "adapter_config.json").read_text())["use_dora"] is True
    mags = [k for k in load_file(str(out / "adapter_model.safetensors")) if "lora_magnitude_vector" in k]
    assert len(mags) == 2 * 2  # 2 layers x (q, v)
    assert load_train_config(out / CONFIG_NAME)["use_dora"] is True and spec_from_config(out / CONFIG_NAME).use_dora
    assert "use_dora" not in TrainSpec().to_dict() and TrainSpec(use_dora=True).to_dict()["use_dora"] is True


def test_checkpoints_every_few_steps_and_the_rows_each_one_read(saved_finetune, tmp_path):
    """``save_strategy: steps`` with ``save_steps: 2`` keeps ``checkpoint-2``, ``-4`` ... beside the final adapter;
    the config it writes reads back the same; and, rows in the Trainer's seeded order (``group_by_length: false``),
    ``gradian attribute``'s trajectory counts the rows each interval read, a checkpoint whose interval is not an
    epoch included (every row read: each keeps its checkpoint weights). A save_steps beside another strategy (a TRL
    config's) is not used."""
    from gradian.attribute.trajectory import resolve_trajectory
    from gradian.attribute.visits import with_visits
    from gradian.audit.config import load_config
    from gradian.trainconfig import TrainSpec

    n = sum(1 for line in saved_finetune["data"].read_text().splitlines() if line.strip())
    spec = small_train_spec(num_train_epochs=2, save_strategy="steps", save_steps=2, group_by_length=False)
    out = tmp_path / "adapter"
    train_lora(str(saved_finetune["base"]), saved_finetune["data"], out, spec)
    total = read_trainer_state(out)["global_step"]
    steps = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    per_epoch = -(-n // 4)
    assert per_epoch % 2 == 1 and steps == list(range(2, total + 1, 2))  # checkpoint-2 ends inside the first epoch
    assert spec_from_config(out / CONFIG_NAME) == spec and "save_steps" not in TrainSpec().to_dict()
    traj = with_visits(resolve_trajectory(out, "auto"), load_config([str(out / CONFIG_NAME)]), n)
    assert [c.step for c in traj.checkpoints] == steps + ([total] if total not in steps else [])
    assert traj.visits is not None, traj.visits_rule
    assert traj.visits.counts.sum(axis=0).tolist() == [2] * n  # each row once an epoch
    assert traj.visits.counts[0].sum() == 8 and (traj.visits.counts == 0).any()  # checkpoint-2: two steps of 4 rows
    assert traj.visits.uniform and traj.row_weights() is None  # every row read: the checkpoint weights, as before
    cfg = tmp_path / "trl.yaml"
    cfg.write_text("learning_rate: 0.001\nsave_steps: 500\n")
    assert spec_from_config(cfg).save_steps == 0
    with pytest.raises(GradianUserError, match="save_steps"):
        TrainSpec(save_strategy="steps")
