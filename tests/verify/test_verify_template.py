"""Issue 22: ``gradian verify``'s retrains (``gradian train``) render and mask the rows with the run's own training
setup when it carries a chat template, so the retrains see the tokens the gradients saw.

The run is a real TRL ``SFTTrainer`` run (tests/audit/trl_run.py) whose saved template adds a default system turn,
which the base tokenizer's ChatML does not, then ``gradian attribute`` on its output folder.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "audit"))
from trl_run import DEFAULT_SYSTEM, TEMPLATE, build_trl_run  # noqa: E402

from gradian.cli import app  # noqa: E402


@pytest.fixture(scope="module")
def attributed(tmp_path_factory, tok):
    """``(TRL run paths, run folder, cache)`` after ``gradian attribute --adapter OUT --config sft_config.json``."""
    root = tmp_path_factory.mktemp("trl-verify")
    run = build_trl_run(root / "trl", tok)
    out, cache = root / "run", root / "cache"
    args = ["attribute", "--base", str(run["base"]), "--adapter", str(run["out"]), "--data", str(run["data"])]
    args += ["--eval", str(run["eval"]), "--config", str(run["config"]), "--out", str(out), "--project-dim", "0"]
    res = CliRunner().invoke(app, args, env={"GRADIAN_CACHE": str(cache)})
    assert res.exit_code == 0, res.output
    return run, out, cache


def test_retrain_renders_the_rows_with_the_run_s_template(attributed, tmp_path, monkeypatch):
    import gradian.train as train
    from gradian.attribute.run import load_run
    from gradian.data.formats import load_examples
    from gradian.data.tokenize import tokenize_example
    from gradian.index.store import GradSpec
    from gradian.verify.retrain import trainer_for, with_run_tokenize

    run, out, cache = attributed
    monkeypatch.setenv("GRADIAN_CACHE", str(cache))
    rj = load_run(out, inputs=True)
    tokenize = GradSpec.from_dict(rj["manifest"]["identity"]["specs"]["grad"]).tokenize
    assert tokenize.chat_template == TEMPLATE != run["tok"].chat_template
    plain = trainer_for(rj, run["config"], None)  # gradian train mapped from the TRL config
    trainer = with_run_tokenize(plain, tokenize)
    assert trainer.tokenize == tokenize and plain.tokenize is None
    assert trainer.identity() != plain.identity() and trainer.describe()["tokenize"]["chat_template"] == TEMPLATE

    seen = []
    real = train._tokenise_file
    monkeypatch.setattr(train, "_tokenise_file", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    adapter = tmp_path / "retrain"
    trainer.train(Path(run["data"]), adapter, 0)  # a real gradian train run (8 rows, 2 epochs, tiny model)
    items, _, tspec = seen[0]
    assert tspec.chat_template == TEMPLATE and tspec.max_length == 128 and tspec.loss_on == "assistant"
    # the run's template writes its default system turn; the base tokenizer's ChatML does not
    assert all(it.text.startswith(f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n") for it in items)
    base_text = run["tok"].apply_chat_template(load_examples(run["data"])[0].prompt, tokenize=False)
    assert DEFAULT_SYSTEM not in base_text
    # the retrain's rows are the gradients' rows, token for token and label for label
    for ex, it in zip(load_examples(run["data"]), items):
        ref = tokenize_example(ex, run["tok"], tokenize)
        assert (it.input_ids, it.labels) == (ref.input_ids, ref.labels)
    assert (adapter / "chat_template.jinja").read_text() == TEMPLATE
    assert json.loads((adapter / "gradian_train.json").read_text())["tokenize"]["chat_template"] == TEMPLATE


def test_prepare_verify_gives_the_trainer_the_run_s_tokenisation(attributed, monkeypatch):
    """prepare_verify hands the run's tokenisation (from the manifest) to the trainer it sets up. This tiny TRL run
    regresses nothing, so prepare_verify stops later for want of a verdict; the trainer is caught as it is made."""
    import gradian.verify.retrain as retrain
    import gradian.verify.run as vr

    run, out, cache = attributed
    monkeypatch.setenv("GRADIAN_CACHE", str(cache))
    monkeypatch.setattr(vr, "plan", lambda run, spec, seed: [])  # the verdict check (tested in test_verify.py)
    made = []
    real = retrain.with_run_tokenize
    monkeypatch.setattr(retrain, "with_run_tokenize", lambda t, tz: made.append(real(t, tz)) or made[-1])
    with pytest.raises(TypeError):  # run.json's attribution is null: no capability to verify
        vr.prepare_verify(out, config=run["config"], say=lambda s: None)
    (trainer,) = made
    assert trainer.describe()["trainer"] == "gradian train"
    assert trainer.tokenize.chat_template == TEMPLATE and trainer.tokenize.max_length == 128


def test_a_run_without_its_own_rendering_keeps_gradian_train_s(tmp_path):
    from gradian.data.tokenize import TokenizeSpec
    from gradian.trainconfig import TrainSpec
    from gradian.verify.retrain import CommandTrainer, GradianTrainer, with_run_tokenize

    t = GradianTrainer("base", TrainSpec(), "cfg")
    assert with_run_tokenize(t, TokenizeSpec()) is t and "tokenize" not in t.identity()
    assert with_run_tokenize(t, TokenizeSpec(train_roles=("assistant",))).tokenize.train_roles == ("assistant",)
    c = CommandTrainer("x {data} {out}", "base")
    assert with_run_tokenize(c, TokenizeSpec(chat_template="{{ x }}")) is c
