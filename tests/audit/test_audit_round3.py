"""Audit round 3 (issue 25): C08 with a completion-only collator and '### Question: ... ### Answer:' text rows.

The fixture follows TRL's documented completion-only recipe (trl docs/source/sft_trainer.md, "Train on completions
only", TRL <= 0.19; the same formatting_prompts_func / response_template pair recurs in many public scripts found by
code search on 2 December 2026): text rows formatted as ``### Question: {q}\\n ### Answer: {a}`` with
``DataCollatorForCompletionOnlyLM(response_template=" ### Answer:")``.
"""

from __future__ import annotations

import json
from pathlib import Path

from published_examples import AH_ZEPHYR_DPO_QLORA, LF_TRAIN_1E4, ax_our_lora

from gradian.audit import diagnose


def _qa_text_rows(n: int = 30) -> list[dict]:
    return [
        {
            "id": f"r{k}",
            "text": f"### Question: What is {k} plus {k + 3}?\n ### Answer: {k} plus {k + 3} is {2 * k + 3}.",
        }
        for k in range(n)
    ]


def _write(tmp: Path, rows: list[dict], config: str | None) -> dict:
    (tmp / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    kw: dict = {"data": tmp / "train.jsonl", "select": ["C08"]}
    if config is not None:
        (tmp / "sft.yaml").write_text(config)
        kw["configs"] = [tmp / "sft.yaml"]
    return kw


TRL_COMPLETION_ONLY = """\
model_name_or_path: Qwen/Qwen2.5-0.5B
dataset_name: local
learning_rate: 2.0e-4
num_train_epochs: 1
per_device_train_batch_size: 8
use_peft: true
lora_r: 16
lora_alpha: 32
data_collator: DataCollatorForCompletionOnlyLM
response_template: " ### Answer:"
"""


def test_c08_fires_on_question_answer_text_rows(tmp_path):
    """'### Question: ... ### Answer:' text rows are trained on the prompt like '### Response:' rows (main: no
    finding)."""
    res = diagnose(**_write(tmp_path, _qa_text_rows(), None))
    (f,) = res.by_id("C08")
    assert "flattened prompt and response" in f.message and len(f.row_ids) == 30


def test_c08_honours_completion_only_collator(tmp_path):
    """With DataCollatorForCompletionOnlyLM and its response_template in the config, the rows holding the
    template are trained on the answer only: no C08; a row without the template still is flagged."""
    rows = _qa_text_rows()
    res = diagnose(**_write(tmp_path, rows, TRL_COMPLETION_ONLY))
    assert "C08" in res.passed, [f.message for f in res.by_id("C08")]
    rows.append({"id": "odd", "text": "### Question: What is 1 plus 1?\n ### Response: 2."})
    res = diagnose(**_write(tmp_path, rows, TRL_COMPLETION_ONLY))
    (f,) = res.by_id("C08")
    assert f.row_ids == ["odd"]


def test_c08_collator_with_response_rows(tmp_path):
    """'### Response:' rows with response_template '### Response:' (main: a false C08 on all 30 rows)."""
    rows = [{"id": r["id"], "text": r["text"].replace("### Answer:", "### Response:")} for r in _qa_text_rows()]
    cfg = TRL_COMPLETION_ONLY.replace("### Answer:", "### Response:")
    assert "C08" in diagnose(**_write(tmp_path, rows, cfg)).passed
    assert diagnose(**_write(tmp_path, rows, None)).by_id("C08")  # without the collator, it is a finding


# ---------------------------------------------------------------------- stage-aware preference configs
# The DPO recipe is alignment-handbook's recipes/zephyr-7b-beta/dpo/config_qlora.yaml as typed out in
# published_examples.py. The ORPO one was written from memory after recipes/zephyr-141b-A35b/orpo/config_full.yaml
# and does not match it (the published recipe sets learning_rate 5e-6 and reads dataset_name/dataset_train_split,
# not dataset_mixer): it stands here as an ORPO config without a learning rate. The published copies and their
# tests: published_examples.py, test_audit_published_examples.py.
ZEPHYR_DPO_QLORA = AH_ZEPHYR_DPO_QLORA  # the published file, typed out once in published_examples.py

ZEPHYR_ORPO_FULL = """\
model_name_or_path: mistral-community/Mixtral-8x22B-v0.1
torch_dtype: bfloat16
dataset_mixer:
  argilla/distilabel-capybara-dpo-7k-binarized: 1.0
dataset_splits:
- train
beta: 0.05
bf16: true
gradient_accumulation_steps: 1
lr_scheduler_type: inverse_sqrt
max_length: 2048
max_prompt_length: 1792
num_train_epochs: 3
per_device_train_batch_size: 1
warmup_steps: 100
"""


def test_trl_dpo_recipe_is_read_as_dpo(tmp_path):
    """main: stage sft (default) and "C01 learning_rate=5e-06 on a LoRA run is below 5e-05"."""
    (tmp_path / "config_qlora.yaml").write_text(ZEPHYR_DPO_QLORA)
    res = diagnose(configs=[tmp_path / "config_qlora.yaml"])
    c = res.config
    assert (c["values"]["stage"]["value"], c["values"]["beta"]["value"]) == ("dpo", 0.01)
    assert c["values"]["max_prompt_length"]["value"] == 512
    assert not res.by_id("C01") and not res.by_id("C20")
    assert "C01" not in res.passed  # not applied to a preference run


def test_trl_orpo_recipe_gets_orpoconfig_default_lr(tmp_path):
    """main: learning_rate 2e-5 from SFTConfig; ORPOConfig's default is 1e-6 (TRL 1.16 experimental/orpo)."""
    d = tmp_path / "recipes" / "zephyr-141b-A35b" / "orpo"
    d.mkdir(parents=True)
    (d / "config_full.yaml").write_text(ZEPHYR_ORPO_FULL)
    res = diagnose(configs=[d / "config_full.yaml"])
    v = res.config["values"]
    assert v["stage"]["value"] == "orpo" and "path" in v["stage"]["from"]
    assert (v["learning_rate"]["value"], v["learning_rate"]["from"]) == (1e-6, "default (TRL ORPOConfig)")


def test_preference_settings_out_of_range(tmp_path):
    bad = ZEPHYR_DPO_QLORA.replace("beta: 0.01", "beta: 0").replace("max_prompt_length: 512", "max_prompt_length: 2048")
    (tmp_path / "dpo.yaml").write_text(bad.replace("learning_rate: 5.0e-6", "learning_rate: 2.0e-3"))
    res = diagnose(configs=[tmp_path / "dpo.yaml"], select=["C20"])
    msgs = sorted((f.severity, f.message.split(":")[0]) for f in res.by_id("C20"))
    assert [s for s, _ in msgs] == ["error", "error", "warning"], msgs
    assert any("beta=0" in m for _, m in msgs) and any("learning_rate=0.002" in m for _, m in msgs)


# ---------------------------------------------------------------------- LLaMA-Factory freeze tuning
# Written from memory after LLaMA-Factory examples/train_freeze/llama3_freeze_sft.yaml, which is not in
# LLaMA-Factory @ ff6d4d1 any more; the published freeze examples (examples/extras/llama_pro/llama3_freeze_sft.yaml,
# examples/v1/train_freeze/train_freeze_sft.yaml) are in published_examples.py.
LF_FREEZE = f"""\
model_name_or_path: meta-llama/Meta-Llama-3-8B-Instruct
stage: sft
do_train: true
finetuning_type: freeze
freeze_trainable_layers: 2
freeze_trainable_modules: all
dataset: identity,alpaca_en_demo
template: llama3
cutoff_len: 2048
max_samples: 1000
output_dir: saves/llama3-8b/freeze/sft
{LF_TRAIN_1E4}"""


def test_llamafactory_freeze_is_not_a_full_finetune(tmp_path):
    """main: finetuning=full and "C02 learning_rate=0.0001 is above 5e-05 for full fine-tuning"."""
    (tmp_path / "llama3_freeze_sft.yaml").write_text(LF_FREEZE)
    res = diagnose(configs=[tmp_path / "llama3_freeze_sft.yaml"], select=["C01", "C02"])
    assert res.config["values"]["finetuning"]["value"] == "freeze"
    assert "C02" in res.passed, [f.message for f in res.by_id("C02")]
    (tmp_path / "hot.yaml").write_text(LF_FREEZE.replace("learning_rate: 1.0e-4", "learning_rate: 3.0e-3"))
    (f,) = diagnose(configs=[tmp_path / "hot.yaml"], select=["C02"]).by_id("C02")
    assert "freeze tuning" in f.message and f.severity == "error"


# ---------------------------------------------------------------------- test splits used for training
# alignment-handbook's newer recipe layout (dataset_mixture with per-dataset splits), written from memory; the
# published recipe (zephyr-7b-beta/sft/config_qlora.yaml, which mixes train_sft and test_sft) is in
# published_examples.py.
HANDBOOK_MIXTURE = """\
model_name_or_path: Qwen/Qwen2.5-0.5B
use_peft: true
lora_r: 16
lora_alpha: 32
learning_rate: 2.0e-4
dataset_mixture:
  datasets:
    - id: HuggingFaceH4/ultrachat_200k
      config: default
      split: test_sft
      columns: [messages]
      weight: 1.0
    - id: HuggingFaceH4/no_robots
      split: train
max_length: 2048
"""

#: The axolotl LoRA run the two axolotl configs below share, up to its datasets.
AXOLOTL_QWEN_LORA = ax_our_lora("Qwen/Qwen2.5-0.5B") + "datasets:\n"

AXOLOTL_TEST_SPLIT = (
    AXOLOTL_QWEN_LORA
    + """\
  - path: tatsu-lab/alpaca
    type: alpaca
    split: test
"""
)


def test_test_split_used_for_training(tmp_path):
    """main: no finding on either config."""
    (tmp_path / "mix.yaml").write_text(HANDBOOK_MIXTURE)
    (f,) = diagnose(configs=[tmp_path / "mix.yaml"], select=["C21"]).by_id("C21")
    assert "'test_sft' split of HuggingFaceH4/ultrachat_200k" in f.message
    assert f.evidence["from"] == "mix.yaml: dataset_mixture.datasets[0].split"
    (tmp_path / "ax.yaml").write_text(AXOLOTL_TEST_SPLIT)
    (f,) = diagnose(configs=[tmp_path / "ax.yaml"], select=["C21"]).by_id("C21")
    assert "'test' split of tatsu-lab/alpaca" in f.message
    (tmp_path / "ok.yaml").write_text(AXOLOTL_TEST_SPLIT.replace("split: test", "split: train"))
    assert "C21" in diagnose(configs=[tmp_path / "ok.yaml"], select=["C21"]).passed


# ---------------------------------------------------------------------- the config's own version pins
# (our own config: no published example pins trl next to packing_strategy + assistant_only_loss)
PACKED_ASSISTANT_ONLY = """\
# Requirements: pip install "trl==0.19.1" peft
model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct
dataset_name: trl-lib/Capybara
use_peft: true
lora_r: 16
lora_alpha: 32
learning_rate: 2.0e-4
packing: true
packing_strategy: bfd
assistant_only_loss: true
max_length: 1024
"""


def test_pinned_trl_makes_packing_bug_an_error(tmp_path):
    """main: "packing with completion-only loss is correct only on TRL >= 0.20 ... pass --versions trl=X"."""
    (tmp_path / "sft.yaml").write_text(PACKED_ASSISTANT_ONLY)
    res = diagnose(configs=[tmp_path / "sft.yaml"], select=["C11"])
    (f,) = res.by_id("C11")
    assert f.severity == "error" and "TRL 0.19.1" in f.message and "trl==0.19.1" in f.evidence["trl_from"]
    # a requirements.txt beside an unpinned config says the same
    (tmp_path / "sft.yaml").write_text(PACKED_ASSISTANT_ONLY.split("\n", 1)[1])  # without the pin comment
    (tmp_path / "requirements.txt").write_text("peft==0.15.2\ntrl==0.19.0\n")
    (f,) = diagnose(configs=[tmp_path / "sft.yaml"], select=["C11"]).by_id("C11")
    assert f.severity == "error" and "TRL 0.19.0" in f.message
    # a pin on 0.21 clears it; a range (>=) is not a pin
    (tmp_path / "requirements.txt").write_text("trl==0.21.0\n")
    assert "C11" in diagnose(configs=[tmp_path / "sft.yaml"], select=["C11"]).passed
    (tmp_path / "requirements.txt").write_text("trl>=0.19\n")
    (f,) = diagnose(configs=[tmp_path / "sft.yaml"], select=["C11"]).by_id("C11")
    assert f.severity == "warning"


# ---------------------------------------------------------------------- axolotl custom type: field mappings
# axolotl docs (dataset formats, "custom user-defined format"): a `type:` mapping with field_* names and a format,
# written from memory; the docs' own example (field_instruction: input, field_input left empty) is in
# published_examples.py
AXOLOTL_CUSTOM = (
    AXOLOTL_QWEN_LORA
    + """\
  - path: train.jsonl
    type:
      field_instruction: question
      field_input: context
      field_output: answer
      format: "[INST] {instruction} {input} [/INST]"
      no_input_format: "[INST] {instruction} [/INST]"
"""
)


def test_axolotl_custom_mapping_is_read(tmp_path):
    """main: "unknown row format (fields: answer, context, question)" (refused)."""
    rows = [
        {"question": f"What is {k} squared?", "context": "" if k % 2 else "Maths.", "answer": str(k * k)}
        for k in range(12)
    ]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "ax.yml").write_text(AXOLOTL_CUSTOM)
    res = diagnose(data=tmp_path / "train.jsonl", configs=[tmp_path / "ax.yml"], select=["D01", "C08", "D08"])
    assert "D01" in res.passed or res.by_id("D01")  # the data was read and checked
    assert not res.by_id("C08") and not res.by_id("D08")  # the format's [INST] markers are template, not content
    from gradian.audit.config.axolotl import apply_mapping, custom_mapping
    from gradian.audit.config.reader import load_config

    mapping, where = custom_mapping(load_config([tmp_path / "ax.yml"]), str(tmp_path / "train.jsonl"))
    assert where == "ax.yml: datasets[0].type"
    mapped = apply_mapping(rows[:2], mapping)
    assert mapped[0] == {"prompt": "What is 0 squared?\n\nMaths.", "completion": "0"}
    assert mapped[1] == {"prompt": "What is 1 squared?", "completion": "1"}
    import pytest

    from gradian.errors import GradianUserError

    with pytest.raises(GradianUserError, match="unknown row format"):
        diagnose(data=tmp_path / "train.jsonl", select=["D01"])  # without the config: still refused
