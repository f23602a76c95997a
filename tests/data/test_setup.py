"""The resolved training setup: each field from the config (with its source), flags over config, what is not
reproduced. Trainer rules are cited from their docs / code:

* TRL 1.16.0 ``trl/trainer/sft_trainer.py`` ``_prepare_dataset`` (read in the venv).
* axolotl docs, "Dataset Formats > Conversation > chat_template": ``roles_to_train`` (default ``["assistant"]``),
  ``train_on_eos`` (default ``"turn"``); "Config reference": ``train_on_inputs`` (default false),
  ``sequence_len``, ``excess_length_strategy`` (default ``drop``).
* LLaMA-Factory ``src/llamafactory/hparams/data_args.py``: ``train_on_prompt`` (false), ``mask_history`` (false:
  every turn's response is trained; true: the last turn only), ``cutoff_len`` (2048); checked in the llamafactory
  0.9.5 wheel (``pip download --no-deps``), ``llamafactory/data/processor/supervised.py``: each turn's
  ``target_ids`` are labels unless ``mask_history and turn_idx != 0`` (turns reversed: the last first), the
  source is masked unless ``train_on_prompt``; each pair is cut by ``infer_seqlen`` (not keep-start).
* torchtune docs, "Instruct / Chat datasets": ``train_on_input`` (false: only assistant messages are trained),
  ``tokenizer.max_seq_len``; checked in the torchtune 0.6.1 wheel: ``torchtune/data/_messages.py`` masks a
  message when ``role != "assistant" and not train_on_input``; ``torchtune/data/_utils.py:truncate`` keeps the
  start and writes EOS over the last token.
"""

from __future__ import annotations

import pytest

from gradian.audit.config import load_config
from gradian.data.setup import resolve_setup
from gradian.data.tokenize import TokenizeSpec


def _cfg(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return load_config(p)


def test_no_config_is_todays_default():
    s = resolve_setup(None, "messages")
    assert s.tokenize_spec() == TokenizeSpec()
    assert s.sources["max_length"].startswith("Gradian default")


def test_trl_messages_every_token_and_max_length_from_config(tmp_path):
    cfg = _cfg(tmp_path, "sft.yaml", "model_name_or_path: x\nmax_length: 128\nlearning_rate: 2.0e-4\n")
    s = resolve_setup(cfg, "messages")
    assert (s.trainer, s.max_length, s.loss_on) == ("trl", 128, "all")
    assert s.sources["max_length"] == "sft.yaml: max_length"
    assert s.sources["loss_on"].startswith("TRL 1.16 rule")
    assert s.tokenize_spec() == TokenizeSpec(max_length=128, loss_on="all")
    assert s.unreproduced == ()


def test_trl_prompt_completion_and_assistant_only(tmp_path):
    cfg = _cfg(tmp_path, "sft.yaml", "max_length: 512\npacking: false\n")
    assert resolve_setup(cfg, "prompt_completion").loss_on == "completion"
    cfg = _cfg(tmp_path, "sft2.yaml", "max_length: 512\ncompletion_only_loss: false\n")
    s = resolve_setup(cfg, "prompt_completion")
    assert (s.loss_on, s.sources["loss_on"]) == ("all", "sft2.yaml: completion_only_loss")
    cfg = _cfg(tmp_path, "sft3.yaml", "max_length: 512\nassistant_only_loss: true\n")
    s = resolve_setup(cfg, "messages")
    assert (s.loss_on, s.sources["loss_on"]) == ("assistant", "sft3.yaml: assistant_only_loss")


def test_trl_default_max_length_and_no_truncation(tmp_path):
    s = resolve_setup(_cfg(tmp_path, "a.yaml", "packing: false\nmax_length: null\n"), "prompt_completion")
    assert (s.max_length, s.truncation) == (None, "none")
    assert s.tokenize_spec().max_length == 10**9
    s = resolve_setup(_cfg(tmp_path, "b.yaml", "packing: false\ncompletion_only_loss: true\n"), "prompt_completion")
    assert (s.max_length, s.sources["max_length"]) == (1024, "default (TRL SFTConfig)")


def test_flag_overrides_config_with_one_warning(tmp_path):
    cfg = _cfg(tmp_path, "sft.yaml", "max_length: 128\npacking: false\n")
    s = resolve_setup(cfg, "prompt_completion", flags={"max_length": 512})
    assert s.max_length == 512 and s.sources["max_length"] == "flag --max-length"
    assert len(s.warnings) == 1 and "--max-length 512" in s.warnings[0] and "sft.yaml: max_length" in s.warnings[0]
    # a flag that agrees with the config, or that sets what the config left at a default, warns nothing
    assert resolve_setup(cfg, "prompt_completion", flags={"max_length": 128}).warnings == ()
    assert resolve_setup(cfg, "prompt_completion", flags={"loss_on": "all"}).warnings == ()


def test_packing_is_stated_not_approximated(tmp_path):
    """TRL's default packing (bfd) keeps rows apart (tests/data/test_trl_packing.py): stated, reproduced; packing
    that cuts rows, or a TRL before 0.20 (its packed completion masks were dropped), is listed as not reproduced."""
    s = resolve_setup(_cfg(tmp_path, "sft.yaml", "max_length: 256\npacking: true\n"), "prompt_completion")
    assert s.unreproduced == () and s.packing and s.notes == ()
    assert s.sources["packing"].startswith("packing bfd (sft.yaml: packing") and "default (TRL" in s.sources["packing"]
    s = resolve_setup(
        _cfg(tmp_path, "sft.yaml", "max_length: 256\npacking: true\npacking_strategy: wrapped\n"), "prompt_completion"
    )
    assert s.to_dict()["unreproduced"] == ["packing"]
    assert any("packing (sft.yaml: packing, wrapped)" in n for n in s.notes)
    old = _cfg(tmp_path, "sft.yaml", "max_length: 256\npacking: true\n")
    old.versions["trl"] = "0.19.1"
    assert resolve_setup(old, "prompt_completion").unreproduced == ("packing",)


def test_gradian_train_config(tmp_path):
    from gradian.trainconfig import TrainSpec, write_train_config

    p = tmp_path / "training_config.yaml"
    write_train_config(TrainSpec(max_length=256), p, base="base")
    s = resolve_setup(load_config(p), "messages")
    assert (s.trainer, s.max_length, s.loss_on) == ("gradian", 256, "completion")


def test_axolotl_rules(tmp_path):
    text = (
        "base_model: x\nsequence_len: 300\nadapter: lora\nexcess_length_strategy: truncate\n"
        "datasets:\n  - path: d.jsonl\n    type: chat_template\n"
    )
    s = resolve_setup(_cfg(tmp_path, "ax.yaml", text), "messages")
    assert (s.trainer, s.max_length, s.loss_on) == ("axolotl", 300, "assistant")
    assert s.sources["max_length"] == "ax.yaml: sequence_len"
    text2 = text + "    roles_to_train: [assistant, user]\n    train_on_eos: all\ntrain_on_inputs: false\n"
    s2 = resolve_setup(_cfg(tmp_path, "ax2.yaml", text2), "messages")
    # axolotl's own mask (tests/data/test_framework_parity.py): the content of the listed roles, EOS per train_on_eos
    assert (s2.train_roles, s2.train_on_eos) == (("assistant", "user"), "all") and "loss_mask" not in s2.unreproduced
    assert s2.tokenize_spec().train_roles == ("assistant", "user")
    assert (s.train_roles, s.train_on_eos) == (("assistant",), "turn")  # axolotl's defaults
    flagged = resolve_setup(_cfg(tmp_path, "ax2b.yaml", text2), "messages", flags={"loss_on": "all"})
    assert flagged.train_roles is None and flagged.tokenize_spec().loss_on == "all"  # a --loss-on flag wins
    s3 = resolve_setup(_cfg(tmp_path, "ax3.yaml", "base_model: x\ntrain_on_inputs: true\n"), "prompt_completion")
    assert (s3.loss_on, s3.sources["loss_on"]) == ("all", "ax3.yaml: train_on_inputs")
    # axolotl's default drops a row longer than sequence_len: reproduced as a row with no supervised token
    assert (s3.truncation, "truncation" in s3.unreproduced, s3.tokenize_spec().drop_long) == ("drop", False, True)
    cut = resolve_setup(_cfg(tmp_path, "ax4.yaml", "base_model: x\nexcess_length_strategy: truncate\n"), "messages")
    assert (cut.unreproduced, cut.tokenize_spec().drop_long) == ((), False)  # truncate_long_seq keeps the start


def test_llamafactory_mask_history(tmp_path):
    base = "stage: sft\nfinetuning_type: lora\ncutoff_len: 512\ntemplate: qwen\n"
    s = resolve_setup(_cfg(tmp_path, "lf.yaml", base), "messages")
    assert (s.trainer, s.max_length, s.loss_on) == ("llamafactory", 512, "assistant")
    # LLaMA-Factory 0.9.5's own qwen template, its supervised mask and cutoff_len truncation: reproduced
    # (tests/data/test_frameworks_real.py runs LLaMA-Factory itself)
    assert (s.chat_rule, s.chat_template, s.unreproduced) == ("llamafactory_qwen", None, ())
    assert s.tokenize_spec().chat_rule == "llamafactory_qwen"
    named = resolve_setup(_cfg(tmp_path, "lf4.yaml", base.replace("qwen", "llama2")), "messages")
    assert named.chat_rule is None and "chat_template" in named.unreproduced  # a template Gradian does not render
    assert any("its own registered template 'llama2'" in n for n in named.notes)
    sys_ = resolve_setup(_cfg(tmp_path, "lf7.yaml", base + "default_system: Be brief.\n"), "messages")
    assert (sys_.default_system, sys_.tokenize_spec().default_system, sys_.unreproduced) == ("Be brief.",) * 2 + ((),)
    assert sys_.to_dict()["values"]["default_system"] == {"value": "Be brief.", "from": "lf7.yaml: default_system"}
    assert "default_system" not in s.tokenize_spec().to_dict()  # unset: the spec's dict (so index ids) unchanged
    unnamed = resolve_setup(_cfg(tmp_path, "lf6.yaml", base.replace("template: qwen\n", "")), "messages")
    assert unnamed.chat_rule is None and "chat_template" not in unnamed.unreproduced  # it parses the tokenizer's
    plain = resolve_setup(_cfg(tmp_path, "lf5.yaml", base), "prompt_completion")
    assert plain.chat_rule is None  # LLaMA-Factory has no prompt/completion rows: Gradian's rule, as before
    s2 = resolve_setup(_cfg(tmp_path, "lf2.yaml", base + "mask_history: true\n"), "messages")
    assert s2.loss_on == "completion" and "lf2.yaml: mask_history" in s2.sources["loss_on"]
    s3 = resolve_setup(_cfg(tmp_path, "lf3.yaml", base + "train_on_prompt: true\n"), "messages")
    assert s3.loss_on == "all"


def test_torchtune_rules(tmp_path):
    text = (
        "model:\n  _component_: torchtune.models.llama3_2.lora_llama3_2_1b\n"
        "tokenizer:\n  _component_: torchtune.models.llama3.llama3_tokenizer\n  max_seq_len: 400\n"
        "dataset:\n  _component_: torchtune.datasets.chat_dataset\n"
    )
    s = resolve_setup(_cfg(tmp_path, "tt.yaml", text), "messages")
    assert (s.trainer, s.max_length, s.loss_on) == ("torchtune", 400, "assistant")
    # chat rows: torchtune 0.6.1's Llama3Tokenizer.tokenize_messages, its truncate() (EOS over the last token)
    # included, is reproduced (tests/data/test_framework_parity.py)
    assert (s.chat_rule, s.eos_truncate, s.unreproduced) == ("torchtune_llama3", True, ())
    text2 = text.replace("chat_dataset", "alpaca_dataset")
    s2 = resolve_setup(_cfg(tmp_path, "tt2.yaml", text2), "alpaca")
    assert s2.loss_on == "all"  # alpaca_dataset trains on the prompt unless train_on_input: false
    # alpaca_dataset's rows are messages for the tokenizer's rule (AlpacaToMessages), its truncate() included
    assert s2.chat_rule == "torchtune_llama3" and s2.unreproduced == ()
    # other instruct rows (instruct_dataset): no rule, so torchtune's truncate() is stated as not reproduced
    s3 = resolve_setup(_cfg(tmp_path, "tt3.yaml", text.replace("chat_dataset", "instruct_dataset")), "alpaca")
    assert s3.chat_rule is None and {"truncation", "loss_mask"} <= set(s3.unreproduced)
    assert any("instruct rows" in n for n in s3.notes)
    assert any("EOS over its last token" in n for n in s3.notes)


def test_bad_flag_value_names_the_flag(tmp_path):
    from gradian.errors import GradianUserError

    with pytest.raises(GradianUserError, match="loss_on"):
        resolve_setup(None, "messages", flags={"loss_on": "everything"})


def test_index_config_sets_the_tokenisation_and_a_contradicting_flag_warns(saved_finetune, tmp_path, monkeypatch):
    """`gradian index --config sft.yaml`: the index's grad spec has the config's max_length and TRL's loss rule for
    the rows; --max-length on the command line wins, with one warning line naming flag and config."""
    import json

    from typer.testing import CliRunner

    from gradian.cli import app

    monkeypatch.setenv("GRADIAN_CACHE", str(tmp_path / "cache"))
    cfg = tmp_path / "sft.yaml"
    cfg.write_text("model_name_or_path: base\nmax_length: 48\npacking: false\n")
    args = ["index", "--base", str(saved_finetune["base"]), "--adapter", str(saved_finetune["adapter"])]
    args += ["--data", str(saved_finetune["data"]), "--config", str(cfg), "--checkpoints", "final"]

    def grad_spec(out):
        # the default --unit sentence builds the row index and the sentence-unit index, with one tokenisation
        specs = [json.loads(m.read_text())["grad_spec"]["tokenize"] for m in out.rglob("manifest.json")]
        assert len(specs) == 2 and specs[0] == specs[1], specs
        return specs[0]

    res = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    assert "training setup: max_length 48 (sft.yaml: max_length)" in res.output
    from gradian_testlib import without_data_check

    assert not any("warning" in ln for ln in without_data_check(res.output.splitlines()))
    assert grad_spec(tmp_path / "a")["max_length"] == 48
    res = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "b"), "--max-length", "64"])
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.output.splitlines() if "--max-length 64 overrides sft.yaml: max_length" in ln]
    assert len(lines) == 1, res.output
    assert grad_spec(tmp_path / "b")["max_length"] == 64


def test_index_reads_the_config_the_trainer_left_beside_the_adapter(saved_finetune, tmp_path, monkeypatch):
    """Without --config, `gradian index` reads the adapter folder's training_config.yaml (as `gradian train` leaves
    it), says so in one line, and tokenises with it; --no-run-folder keeps Gradian's defaults; --config wins."""
    import json
    import shutil

    from typer.testing import CliRunner

    from gradian.cli import app
    from gradian.trainconfig import TrainSpec, write_train_config

    monkeypatch.setenv("GRADIAN_CACHE", str(tmp_path / "cache"))
    adapter = tmp_path / "adapter"
    shutil.copytree(saved_finetune["adapter"], adapter)
    write_train_config(TrainSpec(max_length=40), adapter / "training_config.yaml", base=str(saved_finetune["base"]))
    args = ["index", "--base", str(saved_finetune["base"]), "--adapter", str(adapter)]
    args += ["--data", str(saved_finetune["data"]), "--checkpoints", "final", "--unit", "row"]

    def max_length(out):
        (m,) = out.rglob("manifest.json")
        return json.loads(m.read_text())["grad_spec"]["tokenize"]["max_length"]

    res = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    assert f"run folder: read {adapter / 'training_config.yaml'}" in res.output
    assert "training setup: max_length 40 (training_config.yaml: max_length)" in res.output
    assert max_length(tmp_path / "a") == 40
    res = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "b"), "--no-run-folder"])
    assert res.exit_code == 0, res.output
    assert "run folder" not in res.output and max_length(tmp_path / "b") == TokenizeSpec().max_length
    cfg = tmp_path / "sft.yaml"
    cfg.write_text("model_name_or_path: base\nmax_length: 48\n")
    res = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "c"), "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    assert "run folder" not in res.output and max_length(tmp_path / "c") == 48


def test_rows_the_trainer_held_out_are_stated_as_not_reproduced(tmp_path):
    """axolotl's val_set_size and LLaMA-Factory's val_size hold rows of the training data out (their own split,
    after their own loading): the setup says every row is scored anyway; none held out, nothing said."""
    ax = "base_model: x\nsequence_len: 300\nadapter: lora\ndatasets:\n  - path: d.jsonl\n    type: chat_template\n"
    s = resolve_setup(_cfg(tmp_path, "ax.yaml", ax + "val_set_size: 0.05\n"), "messages")
    assert "rows" in s.unreproduced
    (note,) = [n for n in s.notes if n.startswith("held-out rows")]
    assert "ax.yaml: val_set_size" in note and "0.05 of the rows" in note and "axolotl" in note
    assert "rows" not in resolve_setup(_cfg(tmp_path, "ax0.yaml", ax), "messages").unreproduced
    lf = "stage: sft\nfinetuning_type: lora\ncutoff_len: 256\ntemplate: qwen\n"
    s = resolve_setup(_cfg(tmp_path, "lf.yaml", lf + "val_size: 200\n"), "messages")
    assert any("llamafactory held out 200 rows" in n for n in s.notes)
    assert "rows" not in resolve_setup(_cfg(tmp_path, "lf0.yaml", lf), "messages").unreproduced


@pytest.mark.parametrize(
    "name, text, scheme, frm",
    [
        # TRL's ModelConfig (a `trl sft --config` file): nf4 without nested quantisation unless it says so
        ("trl.yaml", "model_name_or_path: m\ndataset_name: d\nuse_peft: true\nload_in_4bit: true\n", "nf4", None),
        (
            "trl.yaml",
            "model_name_or_path: m\ndataset_name: d\nuse_peft: true\nload_in_4bit: true\nuse_bnb_nested_quant: true\n"
            "bnb_4bit_quant_type: fp4\ndtype: bfloat16\n",
            "fp4-dq",
            "bfloat16",
        ),
        # axolotl 0.19.0 loaders/model.py: nf4 + double quantisation, in its torch_dtype (bf16 here)
        ("ax.yaml", "base_model: m\nadapter: qlora\nload_in_4bit: true\nbf16: true\n", "nf4-dq", "bfloat16"),
        (
            "ax.yaml",
            "base_model: m\nadapter: qlora\nload_in_4bit: true\n"
            "bnb_config_kwargs:\n  bnb_4bit_use_double_quant: false\n",
            "nf4",
            None,
        ),
        # LLaMA-Factory 0.9.5 QuantizationArguments: nf4, double_quantization true, in its compute dtype
        (
            "lf.yaml",
            "model_name_or_path: m\nstage: sft\nfinetuning_type: lora\nquantization_bit: 4\nfp16: true\n",
            "nf4-dq",
            "float16",
        ),
    ],
)
def test_a_qlora_config_names_its_base_s_4bit_scheme(tmp_path, name, text, scheme, frm):
    s = resolve_setup(_cfg(tmp_path, name, text), "prompt_completion")
    assert (s.base_quant, s.base_quant_from) == (scheme, frm) and "base_quant" not in s.unreproduced
    assert s.to_dict()["values"]["base_quant"]["value"] == scheme


@pytest.mark.parametrize(
    "name, text, why",
    [
        ("tt.yaml", "model:\n  _component_: torchtune.models.qwen2.qlora_qwen2_0_5b\n", "torchao's NF4"),
        ("lf.yaml", "model_name_or_path: m\nstage: sft\nfinetuning_type: lora\nquantization_bit: 8\n", "8-bit"),
        (
            "lf.yaml",
            "model_name_or_path: m\nstage: sft\nfinetuning_type: lora\nquantization_bit: 4\nquantization_method: hqq\n",
            "hqq",
        ),
    ],
)
def test_a_quantised_base_gradian_cannot_reproduce_is_listed(tmp_path, name, text, why):
    s = resolve_setup(_cfg(tmp_path, name, text), "prompt_completion")
    assert s.base_quant is None and "base_quant" in s.unreproduced and any(why in n for n in s.notes)
    assert resolve_setup(_cfg(tmp_path, "plain.yaml", "max_length: 64\n"), "prompt_completion").base_quant is None


def test_an_adapter_card_s_bitsandbytes_block_names_its_4bit_base(tmp_path):
    """PEFT's model card block (``The following `bitsandbytes` quantization config was used during training:``) names
    a QLoRA base when no config does; a card without it, or with an 8-bit config, names none."""
    from gradian.data.setup import setup_from_files

    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "a", "completion": "b"}\n')
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    block = (
        "## Training procedure\n\n\nThe following `bitsandbytes` quantization config was used during training:\n"
        "- quant_method: bitsandbytes\n- load_in_8bit: {eight}\n- load_in_4bit: {four}\n- llm_int8_threshold: 6.0\n"
        "- bnb_4bit_quant_type: nf4\n- bnb_4bit_use_double_quant: True\n- bnb_4bit_compute_dtype: bfloat16\n\n"
        "### Framework versions\n\n- PEFT 0.6.2\n"
    )
    (adapter / "README.md").write_text("---\nlibrary_name: peft\n---\n" + block.format(eight=False, four=True))
    s = setup_from_files([], data, adapter=adapter)
    assert (s.base_quant, s.base_quant_from) == ("nf4-dq", None) and "PEFT's bitsandbytes block" in s.sources[
        "base_quant"
    ]
    (adapter / "README.md").write_text(block.format(eight=True, four=False))
    assert setup_from_files([], data, adapter=adapter).base_quant is None
    (adapter / "README.md").write_text("---\nlibrary_name: peft\n---\n# An adapter\n")
    assert setup_from_files([], data, adapter=adapter).base_quant is None
