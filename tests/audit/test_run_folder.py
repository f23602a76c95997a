"""What a trainer leaves beside its adapter, found and read (``gradian.audit.config.runfolder``).

The fixtures are written in each trainer's own layout, from its source at the version the readers follow (the
wheels, ``pip download --no-deps``, unpacked and read; nothing vendored):

* torchtune 0.6.1 ``training/metric_logging.py`` ``save_config``: ``{output_dir}/torchtune_config.yaml``; the
  checkpointer saves the adapter in ``{output_dir}/epoch_{N}/``.
* LLaMA-Factory 0.9.5 ``webui/common.py`` ``save_cmd``: ``safe_dump`` of the cleaned web-UI arguments to
  ``{output_dir}/training_args.yaml`` (``extras/constants.py`` ``TRAINING_ARGS``).
* axolotl 0.19.0 ``train.py`` ``setup_model_card``: the raw config in the model card, in a "See axolotl config"
  ``<details>`` block after "axolotl version: `X`".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gradian.audit.config import load_config, read_config
from gradian.audit.config.runfolder import axolotl_card, find_run_folder
from gradian.errors import GradianUserError

sys.path.insert(0, str(Path(__file__).parent))
from published_configs import TORCHTUNE_QWEN  # noqa: E402

AXOLOTL_YAML = """base_model: HuggingFaceTB/SmolLM2-135M-Instruct
datasets:
  - path: train.jsonl
    type: chat_template
sequence_len: 192
adapter: lora
lora_r: 16
lora_alpha: 32
lora_target_linear: true
micro_batch_size: 2
num_epochs: 3
learning_rate: 0.0002
output_dir: ./out
"""

LLAMAFACTORY_ARGS = """bf16: true
cutoff_len: 96
dataset: capitals
dataset_dir: data
do_train: true
finetuning_type: lora
gradient_accumulation_steps: 8
learning_rate: 5.0e-05
lora_alpha: 16
lora_dropout: 0
lora_rank: 8
lora_target: all
lr_scheduler_type: cosine
model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct
num_train_epochs: 3.0
output_dir: saves/Qwen2.5-0.5B-Instruct/lora/train_2026-12-07
packing: false
per_device_train_batch_size: 2
stage: sft
template: qwen
"""

# torchtune's published Qwen2.5 LoRA recipe (published_configs.TORCHTUNE_QWEN) with a max_seq_len set
TORCHTUNE_CONFIG = TORCHTUNE_QWEN.replace("max_seq_len: null", "max_seq_len: 80")


def axolotl_model_card(yaml_text: str, version: str = "0.19.0") -> str:
    """A model card as axolotl 0.19.0 leaves it: transformers' card with axolotl's badge and config block."""
    block = (
        f"\n<details><summary>See axolotl config</summary>\n\naxolotl version: `{version}`\n```yaml\n{yaml_text}\n```"
        "\n\n</details><br>\n"
    )
    return (
        "---\nlibrary_name: peft\nbase_model: HuggingFaceTB/SmolLM2-135M-Instruct\ntags:\n- axolotl\n"
        "- generated_from_trainer\n---\n\n<!-- This model card has been generated automatically according to the "
        'information the Trainer had access to. -->\n\n[<img src="https://example/axolotl-badge-web.png"/>]'
        f"(https://github.com/axolotl-ai-cloud/axolotl){block}\n# out\n\n### Framework versions\n\n- PEFT 0.17.1\n"
    )


def _adapter(folder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16}))
    return folder


def test_gradian_train_folder_gives_its_config_and_its_log(tmp_path):
    from gradian.trainconfig import TrainSpec, write_train_config

    out = _adapter(tmp_path / "adapter")
    write_train_config(TrainSpec(max_length=256), out / "training_config.yaml", base="base")
    (out / "trainer_state.json").write_text(json.dumps({"log_history": []}))
    found = find_run_folder(out)
    assert found.configs == (out / "training_config.yaml",) and found.logs == out and found.notes == ()
    (line,) = found.lines()
    assert f"{out / 'training_config.yaml'} (training config)" in line
    assert f"{out / 'trainer_state.json'} (trainer log)" in line
    assert load_config(list(found.configs)).max_length == 256


def test_hf_output_folder_log_is_its_last_checkpoint_s_and_a_bin_that_does_not_read_is_not_used(tmp_path):
    out = _adapter(tmp_path / "out")
    for step in (10, 20):
        (out / f"checkpoint-{step}").mkdir()
        (out / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"log_history": []}))
    (out / "training_args.bin").write_bytes(b"\x80\x04 not a pickle anyone may open")
    found = find_run_folder(out)
    assert found.configs == () and found.logs == out
    read, note, setup = found.lines()
    want = out / "checkpoint-20" / "trainer_state.json"  # the last checkpoint's: HF writes none at the top
    assert read == f"run folder: read {want} (trainer log); --config / --logs read others"
    assert note.startswith(f"run folder: {out / 'training_args.bin'} is not used: cannot be read without unpickling")
    assert "--config" in note
    assert "Gradian's defaults" in setup and "--config" in setup
    assert find_run_folder(out, logs=False).lines() == [note, setup]


def test_torchtune_config_is_found_above_its_epoch_folder(tmp_path):
    out = tmp_path / "lora_single_device"
    adapter = _adapter(out / "epoch_0")
    (out / "torchtune_config.yaml").write_text(TORCHTUNE_CONFIG)
    found = find_run_folder(adapter)
    assert found.configs == (out / "torchtune_config.yaml",)
    cfg = load_config(list(found.configs))
    assert cfg.trainer == "torchtune" and cfg.max_length == 80


def test_a_folder_of_another_name_does_not_search_its_parent(tmp_path):
    (tmp_path / "torchtune_config.yaml").write_text(TORCHTUNE_CONFIG)
    assert find_run_folder(_adapter(tmp_path / "my_adapter")).configs == ()


def test_the_adapter_s_own_folder_wins_and_two_runs_are_not_mixed(tmp_path):
    from gradian.trainconfig import TrainSpec, write_train_config

    out = tmp_path / "run"
    adapter = _adapter(out / "checkpoint-30")
    (out / "torchtune_config.yaml").write_text(TORCHTUNE_CONFIG)
    write_train_config(TrainSpec(max_length=128), adapter / "training_config.yaml", base="base")
    assert find_run_folder(adapter).configs == (adapter / "training_config.yaml",)


def test_llamafactory_web_ui_arguments(tmp_path):
    out = _adapter(tmp_path / "train_2026-12-07")
    (out / "training_args.yaml").write_text(LLAMAFACTORY_ARGS)
    found = find_run_folder(out)
    assert found.configs == (out / "training_args.yaml",)
    cfg = load_config(list(found.configs))
    assert (cfg.trainer, cfg.max_length, cfg.lora_r) == ("llamafactory", 96, 8)


def test_axolotl_model_card_is_read_as_its_config(tmp_path):
    out = _adapter(tmp_path / "out")
    (out / "README.md").write_text(axolotl_model_card(AXOLOTL_YAML))
    found = find_run_folder(out)
    assert found.configs == (out / "README.md",)
    assert axolotl_card(out / "README.md") == (AXOLOTL_YAML, "0.19.0")
    cfg = read_config(out / "README.md")
    assert cfg.formats == ["axolotl"] and cfg.max_length == 192 and cfg.lora_r == 16
    assert cfg.versions["axolotl"] == "0.19.0"
    assert cfg.sources["max_length"] == "README.md: sequence_len"  # the file name, as for every config


def test_a_model_card_without_axolotl_s_block_is_not_a_config(tmp_path):
    out = _adapter(tmp_path / "out")
    (out / "README.md").write_text("---\nlibrary_name: peft\n---\n\n### Framework versions\n\n- PEFT 0.17.1\n")
    assert find_run_folder(out).configs == ()
    with pytest.raises(GradianUserError, match="holds no axolotl config block"):
        read_config(out / "README.md")


def test_a_file_found_that_does_not_read_is_not_used_and_says_why(tmp_path):
    """A malformed axolotl block, or a config of no known format: found, not used, one note each naming the file
    and what is wrong (an explicit --config with the same file is refused instead)."""
    out = _adapter(tmp_path / "out")
    (out / "README.md").write_text(axolotl_model_card("base_model: [x\nsequence_len: 1"))
    (out / "training_args.yaml").write_text("some_tool_setting: 1\n")
    found = find_run_folder(out)
    assert found.configs == ()
    card, args = sorted(found.notes)
    assert card.startswith(f"run folder: {out / 'README.md'} is not used: malformed YAML") and "--config" in card
    assert args.startswith(f"run folder: {out / 'training_args.yaml'} is not used: unknown config format")
    with pytest.raises(GradianUserError, match="README.md"):
        read_config(out / "README.md")


def test_nothing_beside_an_adapter_is_nothing_to_say(tmp_path):
    found = find_run_folder(_adapter(tmp_path / "a"))
    assert found.configs == () and found.logs is None and found.lines() == []
    assert find_run_folder(tmp_path / "missing").lines() == []


def test_diagnose_reads_the_trainer_s_config_in_a_run_folder_given_as_config(tmp_path):
    """`gradian diagnose --config OUT`: the adapter's adapter_config.json and the trainer's config beside it, named
    in a note on stderr (stdout stays the report, here JSON)."""
    from typer.testing import CliRunner

    from gradian.cli import app

    out = _adapter(tmp_path / "train_2026-12-07")
    (out / "training_args.yaml").write_text(LLAMAFACTORY_ARGS)
    res = CliRunner().invoke(app, ["diagnose", "--config", str(out), "--format", "json"])
    assert res.exit_code in (0, 1), res.output
    assert f"is a run folder: also read {out / 'training_args.yaml'}" in res.stderr
    report = json.loads(res.stdout)
    assert report["config"]["formats"] == ["peft", "llamafactory"]
    assert report["config"]["values"]["max_length"]["from"] == "training_args.yaml: cutoff_len"


#: A torchtune 0.6.1 DiskLogger file as its LoRA recipe writes it (``log_dict`` of loss, lr, tokens_per_second_per_gpu
#: and, with clip_grad_norm set, grad_norm, a tensor written as its repr).
TORCHTUNE_LOG = "".join(
    f"Step {s} | loss:{loss} lr:{lr} tokens_per_second_per_gpu:1834.2 grad_norm:tensor({gn}, device='cuda:0') \n"
    for s, loss, lr, gn in [(1, 2.31, 3e-05, 0.91), (2, 2.05, 6e-05, 0.88), (3, 1.72, 9e-05, 0.75)]
)


def test_torchtune_disk_log_is_the_run_s_log(tmp_path):
    """torchtune writes no trainer_state.json: its DiskLogger's newest logs/log_<time>.txt, above the epoch_N
    adapter, is read as the log (loss, lr as learning_rate, grad_norm out of its tensor repr)."""
    from gradian.audit.logs import load_logs

    out = tmp_path / "lora_single_device"
    adapter = _adapter(out / "epoch_0")
    (out / "torchtune_config.yaml").write_text(TORCHTUNE_CONFIG)
    (out / "logs").mkdir()
    (out / "logs" / "log_1700000000.txt").write_text("Step 1 | loss:9.9 lr:1e-05 \n")  # an older run's
    (out / "logs" / "log_1700000500.txt").write_text(TORCHTUNE_LOG)
    found = find_run_folder(adapter)
    assert found.logs == out and found.configs == (out / "torchtune_config.yaml",)
    assert f"{out / 'logs' / 'log_1700000500.txt'} (trainer log)" in found.lines()[0]
    log = load_logs(found.logs)
    assert log.kind == "torchtune" and [e["step"] for e in log.train] == [1, 2, 3]
    assert log.train[1] == {"step": 2, "loss": 2.05, "learning_rate": 6e-05, "grad_norm": 0.88}
    assert any("torchtune's log" in n for n in log.notes)


def test_a_torchtune_log_line_that_is_not_one_is_one_line_naming_it(tmp_path):
    from gradian.audit.logs import load_logs

    f = tmp_path / "log_1.txt"
    f.write_text(TORCHTUNE_LOG + "Epoch 1 done\n")
    with pytest.raises(GradianUserError, match=r"log_1.txt:4: not a torchtune DiskLogger line"):
        load_logs(f)


def test_trl_s_model_card_names_the_trainer_and_version_and_only_sft_gives_a_setup(tmp_path):
    """TRL's card (trl/templates/lm_model_card.md): 'trained using [TRL]', 'trained with <trainer>', '- TRL: X'.
    Only an SFT card gives the setup TRL's defaults (data.setup.card_config); a PEFT card or a DPO card gives none."""
    from gradian.audit.config.runfolder import trainer_card
    from gradian.data.setup import card_config

    def card(trainer):
        return (
            "# Model Card for out\n\nIt has been trained using [TRL](https://github.com/huggingface/trl).\n\n"
            f"## Training procedure\n\nThis model was trained with {trainer}.\n\n### Framework versions\n\n"
            "- PEFT 0.17.1\n- TRL: 1.16.0\n- Transformers: 5.24.0\n"
        )

    out = _adapter(tmp_path / "out")
    (out / "README.md").write_text(card("SFT"))
    (out / "training_args.bin").write_bytes(b"\x80\x04 never opened")
    found = find_run_folder(out)
    assert found.configs == () and found.card is not None
    assert (found.card.trainer, found.card.kind, found.card.version) == ("trl", "SFT", "1.16.0")
    cfg = card_config(found.card)
    assert cfg.trainer == "trl" and cfg.max_length == 1024 and cfg.versions["trl"] == "1.16.0"
    assert cfg.source("trainer").startswith("README.md says TRL 1.16.0's SFT trainer")
    (out / "README.md").write_text(card("DPO"))
    assert trainer_card(out).kind == "DPO" and card_config(trainer_card(out)) is None
    assert "Gradian's defaults" in find_run_folder(out).setup_note
    (out / "README.md").write_text("---\nlibrary_name: peft\n---\n### Framework versions\n\n- PEFT 0.17.1\n")
    assert trainer_card(out) is None


def test_llamafactory_s_model_card_gives_its_defaults(tmp_path):
    """A LLaMA-Factory CLI run saves no config of its own; its HF Trainer card carries the tags llama-factory and the
    finetuning type (0.9.5 train/trainer_utils.py create_modelcard_and_push). The setup then takes LLaMA-Factory's
    defaults: cutoff_len 2048 and every assistant turn's response (train_on_prompt and mask_history false)."""
    from gradian.data.setup import card_config, resolve_setup

    out = _adapter(tmp_path / "saves" / "lora" / "sft")
    (out / "README.md").write_text(
        "---\nlibrary_name: peft\nlicense: other\nbase_model: Qwen/Qwen2.5-0.5B-Instruct\ntags:\n- llama-factory\n"
        "- lora\n- generated_from_trainer\nmodel-index:\n- name: sft\n  results: []\n---\n\n# sft\n\nThis model is a "
        "fine-tuned version of [Qwen/Qwen2.5-0.5B-Instruct](https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct) on the "
        "capitals dataset.\n"
    )
    (out / "training_args.bin").write_bytes(b"\x80\x04 never opened")
    found = find_run_folder(out)
    assert found.card is not None and found.card.trainer == "llamafactory"
    assert "LLaMA-Factory's defaults (cutoff_len 2048, every assistant turn)" in found.setup_note
    setup = resolve_setup(card_config(found.card), "messages", chat=True)
    assert (setup.trainer, setup.max_length, setup.loss_on) == ("llamafactory", 2048, "assistant")
    assert setup.sources["trainer"].startswith("README.md says LLaMA-Factory")
    # LLaMA-Factory renders rows with its config's template:, which the folder does not record: said, not assumed
    assert "chat_template" in setup.unreproduced and any("does not record" in n for n in setup.notes)


def test_a_card_without_a_pickle_beside_it_is_said_too(tmp_path):
    """An adapter folder copied with its TRL card and without training_args.bin: the card still sets the setup, so
    the line still says so."""
    out = _adapter(tmp_path / "out")
    (out / "README.md").write_text(
        "It has been trained using [TRL](https://github.com/huggingface/trl).\n\nThis model was trained with SFT.\n"
    )
    (note,) = find_run_folder(out).lines()
    assert note.startswith("run folder: no training config that reads here; README.md says TRL (version not given)'s")
    assert "so the setup is TRL's defaults" in note


def test_diagnose_on_a_trl_folder_says_the_pickle_and_assumes_nothing(tmp_path):
    """`gradian diagnose --config OUT` on a TRL folder whose training_args.bin does not read: said on stderr; the
    card's defaults are the gradients' business, never Audit's (no config value comes from them)."""
    from typer.testing import CliRunner

    from gradian.cli import app

    out = _adapter(tmp_path / "out")
    (out / "README.md").write_text(
        "It has been trained using [TRL](https://github.com/huggingface/trl).\n\nThis model was trained with SFT.\n"
    )
    (out / "training_args.bin").write_bytes(b"\x80\x04 never opened")
    res = CliRunner().invoke(app, ["diagnose", "--config", str(out), "--format", "json"])
    assert res.exit_code in (0, 1), res.output
    assert f"{out / 'training_args.bin'} is not used: cannot be read without unpickling" in " ".join(res.stderr.split())
    assert "so the setup is" not in res.stderr
    report = json.loads(res.stdout)
    assert report["config"]["formats"] == ["peft"] and "max_length" not in report["config"]["values"]
