"""Config and log readers: every supported format normalises into one TrainConfig / TrainLog, with sources;
malformed inputs raise one-line GradianUserErrors naming the file, the field and the fix."""

from __future__ import annotations

import json

import pytest
from published_examples import LF_TRAIN_1E4

from gradian.audit import load_config, load_logs
from gradian.audit.config import detect_config_format
from gradian.audit.versions import parse_versions
from gradian.errors import GradianUserError

AXOLOTL = """\
base_model: Qwen/Qwen2.5-7B
adapter: qlora
load_in_4bit: true
lora_r: 32
lora_alpha: 64
lora_dropout: 0.05
lora_target_linear: true
sequence_len: 2048
sample_packing: true
flash_attention: true
train_on_inputs: false
micro_batch_size: 2
gradient_accumulation_steps: 8
num_epochs: 3
learning_rate: 2e-4
lr_scheduler: cosine
warmup_ratio: 0.05
val_set_size: 0.05
chat_template: chatml
datasets:
  - path: data/train.jsonl
    type: chat_template
    field_messages: conversations
"""

LLAMAFACTORY = f"""\
model_name_or_path: meta-llama/Meta-Llama-3-8B-Instruct
stage: sft
do_train: true
finetuning_type: lora
lora_rank: 8
lora_target: all
dataset: identity,alpaca_en_demo
template: llama3
cutoff_len: 2048
{LF_TRAIN_1E4}val_size: 0.1
"""

TORCHTUNE = """\
model:
  _component_: torchtune.models.llama3_2.lora_llama3_2_1b
  lora_attn_modules: ['q_proj', 'v_proj', 'output_proj']
  apply_lora_to_mlp: true
  lora_rank: 64
  lora_alpha: 128
  lora_dropout: 0.0
tokenizer:
  _component_: torchtune.models.llama3.llama3_tokenizer
  path: /tmp/Llama-3.2-1B-Instruct/original/tokenizer.model
  max_seq_len: null
dataset:
  _component_: torchtune.datasets.alpaca_cleaned_dataset
  packed: false
  train_on_input: true
optimizer:
  _component_: torch.optim.AdamW
  lr: 3e-4
lr_scheduler:
  _component_: torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup
  num_warmup_steps: 100
epochs: 1
batch_size: 4
gradient_accumulation_steps: 8
dtype: bf16
"""


def test_axolotl(tmp_path):
    p = tmp_path / "qlora.yml"
    p.write_text(AXOLOTL)
    c = load_config(p)
    assert c.trainer == "axolotl" and c.finetuning == "qlora" and c.is_lora
    assert c.learning_rate == 2e-4 and c.source("learning_rate") == "qlora.yml: learning_rate"  # "2e-4" was a str
    assert (c.lora_r, c.lora_alpha, c.max_length, c.packing) == (32, 64, 2048, True)
    assert c.attn_implementation == "flash_attention_2" and c.train_on_inputs is False
    assert c.effective_batch() == 16 and c.chat_template == "chatml"
    assert c.datasets[0]["field_messages"] == "conversations"


def test_llamafactory_defaults_are_recorded(tmp_path):
    p = tmp_path / "llama3_lora_sft.yaml"
    p.write_text(LLAMAFACTORY)
    c = load_config(p)
    assert c.trainer == "llamafactory" and c.is_lora and c.lora_r == 8
    assert c.lora_alpha == 16 and c.source("lora_alpha").startswith("default (LLaMA-Factory")
    assert c.lora_target_modules == "all" and c.chat_template == "llama3" and c.max_length == 2048
    assert c.val_set_size == 0.1 and c.train_on_inputs is False and c.source("train_on_inputs").startswith("default")


def test_torchtune(tmp_path):
    p = tmp_path / "1B_lora.yaml"
    p.write_text(TORCHTUNE)
    c = load_config(p)
    assert c.trainer == "torchtune" and c.finetuning == "lora"
    assert c.learning_rate == 3e-4 and c.source("learning_rate") == "1B_lora.yaml: optimizer.lr"
    assert c.lora_target_modules == ["q_proj", "v_proj", "output_proj", "w1", "w2", "w3"]
    assert c.train_on_inputs is True and c.max_length is None and c.truncation == "none"
    assert c.warmup_steps == 100 and c.bf16 is True


def test_trl_yaml_and_peft_folder_merge(tmp_path):
    (tmp_path / "sft.yaml").write_text(
        "model_name_or_path: HuggingFaceTB/SmolLM2-135M\nlearning_rate: '1e-4'\nmax_seq_length: 2048\n"
        "packing: true\nper_device_train_batch_size: 4\nevaluation_strategy: steps\neval_steps: 50\n"
        "use_peft: true\nlora_r: 16\n"
    )
    ad = tmp_path / "adapter"
    ad.mkdir()
    (ad / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "r": 8,
                "lora_alpha": 16,
                "target_modules": ["q_proj", "v_proj"],
                "base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M",
                "peft_version": "0.15.2",
            }
        )
    )
    (ad / "README.md").write_text("### Framework versions\n\n- TRL: 0.19.1\n- Transformers: 4.53.0\n- PEFT 0.15.2\n")
    c = load_config([tmp_path / "sft.yaml", ad])
    assert c.formats == ["trl", "peft"] and c.trainer == "trl"
    assert c.max_length == 2048 and c.source("max_length") == "sft.yaml: max_seq_length"
    assert c.eval_strategy == "steps" and c.learning_rate == 1e-4
    assert c.lora_alpha == 16 and c.source("lora_alpha") == "adapter_config.json: lora_alpha"
    assert c.lora_r == 16 and any("lora_r" in x for x in c.conflicts)  # 16 (yaml) vs 8 (adapter) recorded
    assert c.versions["trl"] == "0.19.1" and c.versions["peft"] == "0.15.2"
    assert c.completion_only_loss is None and c.source("micro_batch_size") == "sft.yaml: per_device_train_batch_size"


def test_hf_training_args_defaults(tmp_path):
    p = tmp_path / "training_args.json"
    p.write_text(json.dumps({"output_dir": "o", "per_device_train_batch_size": 2, "num_train_epochs": 1.0}))
    c = load_config(p)
    assert c.trainer == "hf" and c.learning_rate == 5e-5 and c.is_default("learning_rate")


@pytest.mark.parametrize(
    "raw,fmt",
    [
        ({"peft_type": "LORA", "r": 8}, "peft"),
        ({"model": {"_component_": "x"}}, "torchtune"),
        ({"stage": "sft", "finetuning_type": "lora", "learning_rate": 1e-4}, "llamafactory"),
        ({"base_model": "m", "sequence_len": 512, "lora_r": 8}, "axolotl"),
        ({"max_length": 512, "lora_r": 8, "use_peft": True}, "trl"),
        ({"output_dir": "o", "learning_rate": 1e-4}, "hf"),
        ({"foo": 1}, None),
    ],
)
def test_detect_format(raw, fmt):
    assert detect_config_format(raw) == fmt


MALFORMED_CONFIGS = [
    ("bad.yaml", "learning_rate: 2e-4\n  lora_r: [16\n", "malformed YAML"),
    ("bad.json", '{"learning_rate": 2e-4,', "malformed JSON"),
    ("what.yaml", "foo: 1\nbar: 2\n", "unknown config format"),
    ("list.yaml", "- a\n- b\n", "not a mapping"),
    ("lr.yaml", "output_dir: o\nlearning_rate: fast\n", "learning_rate is 'fast', not a number"),
    ("training_args.bin", "\x80\x04pickle", "pickle"),
    ("cfg.toml", "a = 1", "unknown config file type"),
]
MALFORMED_LOGS = [
    ("trainer_state.json", '{"global_step": 3}', "no log_history"),
    ("trainer_state.json", '{"log_history": [', "malformed JSON"),
    ("logs.jsonl", '{"loss": 1.0}\n{"loss": 2.0\n', "malformed JSON"),
    ("logs.jsonl", '{"loss": "high"}\n', "loss is 'high', not a number"),
    ("logs.jsonl", '{"foo": 1}\n', "no loss or eval_loss"),
    ("logs.jsonl", "\n", "empty"),
    ("logs.csv", "step,loss\n", "unknown log file type"),
]


@pytest.mark.parametrize(
    "load,name,text,needle",
    [(load_config, *case) for case in MALFORMED_CONFIGS] + [(load_logs, *case) for case in MALFORMED_LOGS],
)
def test_malformed_configs_and_logs(tmp_path, load, name, text, needle):
    """A malformed config or log file is one line naming the file, with a fix."""
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(GradianUserError) as ei:
        load(p)
    msg = ei.value.one_line()
    assert needle in msg and str(p) in msg and "fix:" in msg and "\n" not in msg, msg


def test_folder_without_adapter_config(tmp_path):
    with pytest.raises(GradianUserError, match="no adapter_config.json"):
        load_config(tmp_path)


def test_trainer_state_and_jsonl_logs(tmp_path):
    st = {
        "global_step": 20,
        "max_steps": 40,
        "log_history": [
            {"step": 10, "loss": 2.0, "grad_norm": 1.0, "learning_rate": 1e-4, "epoch": 0.5},
            {"step": 10, "eval_loss": 2.1, "epoch": 0.5},
            {"step": 20, "loss": "NaN", "epoch": 1.0},
        ],
    }
    p = tmp_path / "trainer_state.json"
    p.write_text(json.dumps(st))
    log = load_logs(tmp_path)  # the folder works too
    assert len(log.train) == 2 and len(log.eval) == 1 and log.global_step == 20 and log.summary is None
    assert str(log.series("loss")[1].value) == "nan"
    j = tmp_path / "logs.jsonl"
    j.write_text(
        '{"train/loss": 1.5, "train/global_step": 3}\n\n{"eval/loss": 1.7, "train/global_step": 3}\n'
        '{"train_runtime": 10.0, "train_loss": 1.5}\n'
    )
    log = load_logs(j)
    assert log.train[0]["loss"] == 1.5 and log.train[0]["step"] == 3 and log.eval[0]["eval_loss"] == 1.7
    assert log.summary is not None and not log.steps_inferred


def test_versions():
    assert parse_versions(["trl=0.19.0,transformers=4.46.1", "peft=0.13"]) == {
        "trl": "0.19.0",
        "transformers": "4.46.1",
        "peft": "0.13",
    }
    for bad in (["trl"], ["trl=new"]):
        with pytest.raises(GradianUserError):
            parse_versions(bad)
