"""The Audit lane on a real TRL 1.16 SFTTrainer output folder, read as TRL leaves it (issue 22).

The folder is built in-test by ``trl_run.build_trl_run`` (a real ``SFTTrainer.train()``, 2 epochs,
``save_strategy="epoch"``): ``OUT/`` holds the adapter, ``chat_template.jinja`` and the tokenizer;
``trainer_state.json`` exists only in ``OUT/checkpoint-2`` and ``OUT/checkpoint-4``.
"""

from __future__ import annotations

import json
import shutil

import pytest

from gradian.audit import diagnose
from gradian.audit.context import load_tokenizer_folder
from gradian.audit.logs import load_logs
from gradian.data.tokenize import TokenizeSpec
from gradian.errors import GradianUserError

pytest.importorskip("trl")


@pytest.fixture(scope="module")
def run(tmp_path_factory, tok):
    from trl_run import build_trl_run

    return build_trl_run(tmp_path_factory.mktemp("trl-run"), tok)


def _ids(res, what="findings"):
    return [f.id for f in getattr(res, what)] if what == "findings" else list(getattr(res, what))


def test_trl_layout_has_no_top_level_trainer_state(run):
    out = run["out"]
    assert (out / "adapter_model.safetensors").is_file() and (out / "chat_template.jinja").is_file()
    assert not (out / "trainer_state.json").exists()
    assert (out / "checkpoint-4" / "trainer_state.json").is_file()


def test_logs_output_folder_reads_last_checkpoint(run):
    log = load_logs(run["out"])
    assert log.path.endswith("checkpoint-4/trainer_state.json")
    assert log.global_step == 4 and len(log.train) == 4
    assert len(log.notes) == 1 and "last checkpoint" in log.notes[0]


def test_logs_missing_top_level_state_uses_last_checkpoint_and_says_so(run):
    res = diagnose(logs=run["out"] / "trainer_state.json", select=["L11"])
    assert res.inputs["logs"]["global_step"] == 4
    [note] = [n for n in res.notes if "does not exist" in n]
    assert "checkpoint-4" in note


def test_logs_folder_without_any_state_fails_in_one_line(tmp_path):
    (tmp_path / "checkpoint-3").mkdir()
    with pytest.raises(GradianUserError, match="no checkpoint-N/trainer_state.json"):
        load_logs(tmp_path)
    with pytest.raises(GradianUserError, match="log file not found"):
        load_logs(tmp_path / "trainer_state.json")


def test_l11_completed_run_is_not_told_to_resume(run, tmp_path):
    res = diagnose(logs=run["out"] / "checkpoint-4", select=["L11"])
    assert "L11" not in _ids(res) and "L11" in res.passed
    # the same run cut at step 2 of 4 is incomplete
    state = json.loads((run["out"] / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and state["max_steps"] == 4
    res2 = diagnose(logs=run["out"] / "checkpoint-2", select=["L11"])
    assert [f.severity for f in res2.findings if f.id == "L11"] == ["warning"]


def test_l11_epoch_reached_counts_as_complete(run, tmp_path):
    state = json.loads((run["out"] / "checkpoint-4" / "trainer_state.json").read_text())
    state.pop("max_steps")
    p = tmp_path / "trainer_state.json"
    p.write_text(json.dumps(state))
    assert load_logs(p).completed
    state["epoch"] = 1.0
    p.write_text(json.dumps(state))
    assert not load_logs(p).completed


@pytest.mark.parametrize("tokenizer", ["base", "out"])
def test_jinja_chat_template_path_gives_no_false_c09_c15(run, tokenizer):
    res = diagnose(
        data=run["data"],
        configs=[run["config"], run["out"]],
        tokenizer=run[tokenizer],
        select=["C09", "C15"],
    )
    assert res.findings == [], [f.message for f in res.findings]
    assert {"C09", "C15"} <= set(res.passed)


def test_c09_judges_the_trained_template(run, tmp_path):
    """A saved template whose generation block stops before <|im_end|> is flagged (TRL warns on it too)."""
    from trl.chat_template_utils import is_chat_template_stop_token_trained

    out = tmp_path / "out"
    shutil.copytree(run["out"], out, ignore=shutil.ignore_patterns("checkpoint-*"))
    bad = (
        (out / "chat_template.jinja")
        .read_text()
        .replace(
            "{% generation %}{{ message['content'] + '<|im_end|>\\n' }}{% endgeneration %}",
            "{% generation %}{{ message['content'] }}{% endgeneration %}{{ '<|im_end|>\\n' }}",
        )
    )
    assert "{% endgeneration %}{{ '<|im_end|>" in bad
    (out / "chat_template.jinja").write_text(bad)
    tk = load_tokenizer_folder(run["base"])
    assert not is_chat_template_stop_token_trained(tk, chat_template=bad)
    res = diagnose(data=run["data"], configs=[run["config"], out], tokenizer=run["base"], select=["C09"])
    [f] = res.findings
    assert f.id == "C09" and "ends before the end-of-turn token" in f.message and str(out) in f.message


def test_c15_cloned_template_still_flagged(run, tmp_path):
    cfg = json.loads(run["config"].read_text())
    cfg["chat_template_path"] = "Qwen/Qwen3-0.6B"
    p = tmp_path / "sft_config.json"
    p.write_text(json.dumps(cfg))
    res = diagnose(configs=[p, run["out"]], select=["C15"])
    assert [f.severity for f in res.findings] == ["error"]


def test_tokenizer_output_folder_is_the_saved_tokenizer(run, tmp_path):
    tk = load_tokenizer_folder(run["out"])
    assert tk.chat_template == (run["out"] / "chat_template.jinja").read_text()
    # an output folder whose tokenizer is only in its checkpoints: the last checkpoint's
    only = tmp_path / "only-ckpt"
    shutil.copytree(run["out"] / "checkpoint-4", only / "checkpoint-4")
    assert load_tokenizer_folder(only).chat_template == tk.chat_template


def test_diagnose_eval_takes_the_attribute_eval_file(run):
    res = diagnose(data=run["data"], eval=run["eval"], select=["D14", "D15", "D21"])
    assert res.inputs["eval"]["n_rows"] == 1
    assert not [s for s in res.skipped if s.reason.startswith("needs")]
    assert "D14" in _ids(res)  # the eval question is a training prompt verbatim


def test_diagnose_eval_errors_are_evaluate_s(run, tmp_path):
    p = tmp_path / "eval.jsonl"
    p.write_text(json.dumps({"prompt": "q", "answer": "a"}) + "\n")  # no capability
    with pytest.raises(GradianUserError) as e:
        diagnose(data=run["data"], eval=p)
    assert "capability" in str(e.value) and "completion" not in str(e.value)


def test_diagnose_eval_still_takes_training_format_rows(run):
    res = diagnose(data=run["data"], eval=run["data"], select=["D14"])
    assert res.inputs["eval"]["n_rows"] == 8 and "D14" in _ids(res)


def test_attribute_audit_gets_the_eval_set(run):
    from gradian.attribute.run import RunInputs, run_audit

    inputs = RunInputs(base=str(run["base"]), adapter=run["out"], data=run["data"], eval=run["eval"])
    audit = run_audit(inputs, str(run["base"]))
    skipped = {s["id"]: s["reason"] for s in audit["skipped"]}
    for cid in ("D14", "D15", "D21"):
        assert not skipped.get(cid, "").startswith("needs"), skipped.get(cid)
    assert "D14" in {f["id"] for f in audit["findings"]}


def test_attribute_takes_its_setup_from_the_trl_run(run, tmp_path, monkeypatch):
    """`gradian attribute --adapter OUT --config sft_config.json`, no setup flags, on the real TRL output folder:
    the gradients' tokenisation is the trainer's (max_length 128 from the config, every assistant turn under
    assistant_only_loss), each field names its source in run.json, and the Audit and trajectory read the folder
    as TRL left it (checkpoint-2, checkpoint-4)."""
    from typer.testing import CliRunner

    from gradian.cli import app

    out = tmp_path / "run"
    args = ["attribute", "--base", str(run["base"]), "--adapter", str(run["out"]), "--data", str(run["data"])]
    args += ["--eval", str(run["eval"]), "--config", str(run["config"]), "--out", str(out), "--project-dim", "0"]
    import gradian.data.formats as formats

    reads = []
    load = formats.load_examples
    monkeypatch.setattr(formats, "load_examples", lambda path, *a, **k: reads.append(str(path)) or load(path, *a, **k))
    res = CliRunner().invoke(app, args, env={"GRADIAN_CACHE": str(tmp_path / "cache")})
    assert res.exit_code == 0, res.output
    assert "training setup: max_length 128 (sft_config.json: max_length)" in " ".join(res.output.split())
    # --data is read once for the setup's row format and the run (the Audit lane reads it on its own)
    assert reads.count(str(run["data"])) == 1, reads
    manifest = json.loads((out / "run.json").read_text())["manifest"]
    values = manifest["training_setup"]["values"]
    assert values["max_length"] == {"value": 128, "from": "sft_config.json: max_length"}
    assert values["loss_on"]["value"] == "assistant" and "assistant_only_loss" in values["loss_on"]["from"]
    assert values["trainer"]["value"] == "trl"
    tokenize = manifest["identity"]["specs"]["grad"]["tokenize"]
    assert tokenize["max_length"] == 128 and tokenize["loss_on"] == "assistant"
    # the run's own template (saved by TRL beside the adapter) renders the rows: it is in the gradients' spec, named
    # with its source, and no longer listed as not reproduced
    from trl_run import TEMPLATE

    assert tokenize["chat_template"] == TEMPLATE != run["tok"].chat_template
    assert values["chat_template"]["value"] == TEMPLATE
    assert values["chat_template"]["from"].endswith("chat_template.jinja")
    assert "chat_template" not in manifest["training_setup"]["unreproduced"]
    assert "chat template (" in " ".join(res.output.split())


def _refuse_unpickling(monkeypatch):
    """Make every way to unpickle fail the test."""
    import pickle

    import torch

    def refuse(*a, **k):
        raise AssertionError("a pickle was loaded")

    for mod, name in ((pickle, "load"), (pickle, "loads"), (pickle, "Unpickler"), (torch, "load")):
        monkeypatch.setattr(mod, name, refuse)


def test_without_config_a_trl_folder_is_read_from_its_training_args_never_unpickled(run, tmp_path, monkeypatch):
    """`gradian index --adapter OUT` without --config on the real TRL folder: TRL keeps the run's settings only in
    training_args.bin (its SFTConfig, pickled). It is read without unpickling (every unpickler replaced by a
    failure): the gradients take the run's max_length 128 and assistant-only loss from it, named as their source,
    and the template TRL saved; every row's input_ids and labels then equal TRL's own preparation and collator (TRL's
    defaults, which the model card gave before, match none)."""
    import dataclasses
    import sys
    from pathlib import Path

    from typer.testing import CliRunner

    from gradian.cli import app

    sys.path.insert(0, str(Path(__file__).parents[1] / "data"))
    from trl_parity import gradian_rows, matching, trl_rows, with_template
    from trl_run import TEMPLATE

    bin_ = run["out"] / "training_args.bin"
    assert bin_.is_file()
    _refuse_unpickling(monkeypatch)
    args = ["index", "--base", str(run["base"]), "--adapter", str(run["out"]), "--data", str(run["data"])]
    args += ["--checkpoints", "final", "--unit", "row", "--out", str(tmp_path / "idx")]
    res = CliRunner().invoke(app, args, env={"GRADIAN_CACHE": str(tmp_path / "cache")})
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert f"run folder: read {bin_} (training arguments, read without unpickling)" in text
    assert "max_length 128 (training_args.bin: max_length)" in text
    assert "loss_on assistant (training_args.bin: assistant_only_loss)" in text
    (manifest,) = (tmp_path / "idx").rglob("manifest.json")
    spec = TokenizeSpec(**json.loads(manifest.read_text())["grad_spec"]["tokenize"])
    assert (spec.max_length, spec.loss_on, spec.chat_template) == (128, "assistant", TEMPLATE)
    monkeypatch.undo()  # TRL's own preparation below may load what it likes
    rows = [json.loads(line) for line in run["data"].read_text().splitlines()]
    trl = trl_rows(
        [{"id": r["id"], "messages": r["messages"]} for r in rows],
        with_template(run["tok"], TEMPLATE),
        tmp_path,
        assistant_only_loss=True,
        max_length=128,
    )
    assert matching(trl, gradian_rows(rows, run["tok"], spec)) == (len(rows), [])
    # what the folder gave before its training_args.bin was read: TRL's defaults from the card (every token)
    card_defaults = dataclasses.replace(spec, loss_on="all", max_length=1024)
    assert matching(trl, gradian_rows(rows, run["tok"], card_defaults))[0] == 0


def test_diagnose_reads_the_trl_run_s_own_settings_from_its_training_args(run, monkeypatch):
    """Audit on the folder alone: the settings are the run's own (learning rate 1e-3, 2 epochs, batch 4), its trainer
    TRL with TRL's version from the card, and it is an SFT run although SFTConfig 1.16 saves a loss_type field."""
    from gradian.audit.config import load_config

    _refuse_unpickling(monkeypatch)
    cfg = load_config([str(run["out"] / "training_args.bin")])
    assert (cfg.trainer, cfg.learning_rate, cfg.num_epochs, cfg.micro_batch_size) == ("trl", 1e-3, 2, 4)
    assert (cfg.max_length, cfg.assistant_only_loss, cfg.stage_kind) == (128, True, "sft")
    assert cfg.versions["trl"] == "1.16.0" and cfg.version_sources["trl"].endswith("README.md")
    res = diagnose(data=run["data"], configs=[run["out"], run["out"] / "training_args.bin"], logs=run["out"])
    ids = _ids(res)
    assert "C02" in ids and "C20" not in ids  # lr 1e-3 is high for LoRA SFT; no preference rule is applied
    assert not any("dpo" in s.reason for s in res.skipped), res.skipped


@pytest.fixture(scope="module")
def default_run(tmp_path_factory, tok):
    """A real TRL run at TRL's own defaults (no assistant_only_loss, no max_length): every token of a messages row."""
    from trl_run import build_trl_run

    return build_trl_run(tmp_path_factory.mktemp("trl-default-run"), tok, assistant_only_loss=None, max_length=None)


def test_without_config_a_trl_sft_run_is_read_with_trl_s_defaults(default_run, tmp_path):
    """An adapter folder copied without its training_args.bin keeps TRL's model card, which says the trainer (SFT)
    and TRL's version. Without --config the setup is then TRL 1.16's SFTConfig defaults, named from the card: on a
    run that kept them, every row's input_ids and labels equal TRL's own preparation and collator (Gradian's default
    mask, the final assistant turn, matches none of them); with the training_args.bin the setup is the same."""
    import dataclasses
    import shutil
    import sys
    from pathlib import Path

    from typer.testing import CliRunner

    from gradian.cli import app

    sys.path.insert(0, str(Path(__file__).parents[1] / "data"))
    from trl_parity import gradian_rows, matching, trl_rows, with_template
    from trl_run import TEMPLATE

    run = dict(default_run)
    with_bin = run["out"]
    run["out"] = tmp_path / "copied"
    shutil.copytree(with_bin, run["out"], ignore=shutil.ignore_patterns("training_args.bin", "checkpoint-*"))
    args = ["index", "--base", str(run["base"]), "--adapter", str(run["out"]), "--data", str(run["data"])]
    args += ["--checkpoints", "final", "--unit", "row", "--out", str(tmp_path / "idx")]
    res = CliRunner().invoke(app, args, env={"GRADIAN_CACHE": str(tmp_path / "cache")})
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "so the setup is TRL's defaults (a messages row: every token)" in text
    assert "loss_on all (TRL 1.16 rule: a 'messages' row has no completion mask" in text
    (manifest,) = (tmp_path / "idx").rglob("manifest.json")
    spec = TokenizeSpec(**json.loads(manifest.read_text())["grad_spec"]["tokenize"])
    assert (spec.loss_on, spec.max_length, spec.chat_template) == ("all", 1024, TEMPLATE)
    rows = [json.loads(line) for line in run["data"].read_text().splitlines()]
    trl = trl_rows(
        [{"id": r["id"], "messages": r["messages"]} for r in rows], with_template(run["tok"], TEMPLATE), tmp_path
    )
    assert matching(trl, gradian_rows(rows, run["tok"], spec)) == (len(rows), [])
    n_default, _ = matching(trl, gradian_rows(rows, run["tok"], dataclasses.replace(spec, loss_on="completion")))
    assert n_default == 0
    # the API reads the folder alike: the same setup, so the same tokens
    from gradian.attributor import Attributor

    with pytest.warns(Warning, match="README.md says TRL 1.16.0's SFT trainer"):
        att = Attributor(run["base"], run["out"], run["data"], index_dir=tmp_path / "idx")
    assert att.setup.tokenize_spec() == spec and att.setup.sources["trainer"].startswith("README.md says TRL 1.16.0")
    # the run's own training_args.bin says the same (TRL's defaults were its settings)
    att = Attributor(run["base"], with_bin, run["data"], index_dir=tmp_path / "idx2")
    assert att.setup.tokenize_spec() == spec and att.setup.sources["max_length"] == "training_args.bin: max_length"


def test_attribute_supervises_trl_s_own_tokens_for_the_run(run, tmp_path):
    """The supervised tokens of the gradients equal TRL's own for this run, row by row: TRL 1.16's SFTTrainer
    preparation and collator with the run's template and config (tests/data/trl_parity.py) next to Gradian's
    tokenisation under the setup `gradian attribute` resolves from the run folder, on the *base* tokenizer (whose
    template is another). Without the run's template not one row matches."""
    import dataclasses
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "data"))
    from trl_parity import gradian_rows, matching, trl_rows, with_template
    from trl_run import TEMPLATE

    from gradian.audit.config import load_config
    from gradian.data.formats import load_examples
    from gradian.data.setup import adapter_template, examples_format, resolve_setup

    examples = load_examples(run["data"])
    fmt, chat = examples_format(examples)
    config = load_config([str(run["config"])])
    setup = resolve_setup(config, fmt, chat=chat, saved_template=adapter_template(run["out"]))
    spec = setup.tokenize_spec()
    assert spec.chat_template == TEMPLATE and spec.loss_on == "assistant" and spec.max_length == 128
    rows = [json.loads(line) for line in run["data"].read_text().splitlines()]
    cfg = json.loads(run["config"].read_text())
    trl = trl_rows(
        [{"id": r["id"], "messages": r["messages"]} for r in rows],
        with_template(run["tok"], TEMPLATE),
        tmp_path,
        assistant_only_loss=cfg["assistant_only_loss"],
        max_length=cfg["max_length"],
    )
    base = run["tok"]
    assert base.chat_template != TEMPLATE
    n_ok, bad = matching(trl, gradian_rows(rows, base, spec))
    assert (n_ok, bad) == (len(rows), [])
    n_without, _ = matching(trl, gradian_rows(rows, base, dataclasses.replace(spec, chat_template=None)))
    assert n_without == 0


def test_training_args_read_statically_equal_trl_s_own_to_dict(run, monkeypatch):
    """The static read of the training_args.bin TRL saved gives what TRL's own ``args.to_dict()`` gives, field by
    field (the hub token hidden alike), with no unpickler called."""
    from gradian.audit.config.training_args import read_training_args

    _refuse_unpickling(monkeypatch)
    settings, cls = read_training_args(run["out"] / "training_args.bin")
    assert cls == "trl.trainer.sft_config.SFTConfig"
    want = json.loads(run["args_dict"].read_text())
    tokens = ("eos_token", "pad_token")  # settings, which to_dict hides with the secrets: kept as they are
    assert {k: settings[k] for k in want if k not in tokens} == {k: v for k, v in want.items() if k not in tokens}
    assert settings["hub_token"] == "<HUB_TOKEN>" and settings["eos_token"] is None
    assert len(want) > 100


def test_a_pickled_dpo_config_is_a_dpo_run_and_an_sft_config_is_not(tmp_path):
    """Every field is saved, so the fields cannot say the trainer (SFTConfig 1.16 has a loss_type); the class does."""
    import torch
    from trl import DPOConfig, SFTConfig

    from gradian.audit.config import load_config

    for cls, kind in ((DPOConfig, "preference"), (SFTConfig, "sft")):
        path = tmp_path / cls.__name__ / "training_args.bin"
        path.parent.mkdir()
        torch.save(cls(output_dir=str(tmp_path / "o"), report_to=[], use_cpu=True), path)
        cfg = load_config([str(path)])
        assert cfg.stage_kind == kind, (cls, cfg.stage)
    assert "it saved a DPOConfig" in load_config([str(tmp_path / "DPOConfig" / "training_args.bin")]).source("stage")
