"""A clean, realistic run raises no errors and no warnings; results are ordered, complete and JSON-valid."""

from __future__ import annotations

import json

from audit_world import as_messages, make_rows

from gradian.audit import JSON_SCHEMA, all_checks, diagnose
from gradian.audit.model import SEVERITY_RANK
from gradian.audit.registry import REGISTRY
from gradian.data.formats import load_examples
from gradian_testlib import assert_json_schema


def test_clean_run_has_no_errors_or_warnings(clean_result):
    c = clean_result.counts
    assert (c["error"], c["warning"]) == (0, 0), [f.message for f in clean_result.findings]
    assert c["checks"] == len(all_checks()) >= 41
    # every check is accounted for exactly once
    accounted = [f.id for f in clean_result.findings] + clean_result.passed + [s.id for s in clean_result.skipped]
    assert set(accounted) == set(REGISTRY)
    assert len(clean_result.passed) + len({s.id for s in clean_result.skipped}) + len(
        {f.id for f in clean_result.findings}
    ) == len(REGISTRY)
    # with every input given, skips are only "not applicable", never a missing input
    assert all(s.reason.startswith("not applicable") for s in clean_result.skipped)


def test_clean_conversational_run(world):
    """TRL's conversational prompt/completion rows with the model's chat template: also clean."""
    rows = [
        {
            "id": r["id"],
            "prompt": [
                {"role": "system", "content": "You are a careful writer."},
                {"role": "user", "content": r["prompt"].strip()},
            ],
            "completion": [{"role": "assistant", "content": r["completion"]}],
        }
        for r in world.rows
    ]
    res = diagnose(
        data=world.data_with(rows), eval=world.eval, configs=[world.config], logs=world.logs, tokenizer=world.tok_dir
    )
    assert (res.counts["error"], res.counts["warning"]) == (0, 0), [f.message for f in res.findings]
    assert "T01" in res.passed and "D06" in res.passed and "D04" in res.passed


def test_missing_inputs_are_skipped_with_reason(world):
    res = diagnose(configs=[world.config])
    skipped = {s.id: s.reason for s in res.skipped}
    assert skipped["D04"] == "needs --data and --tokenizer"
    assert skipped["L01"] == "needs --logs"
    assert skipped["D14"] == "needs --data and --eval"
    assert len(res.skipped) + len(res.passed) + len({f.id for f in res.findings}) == len(REGISTRY)


def test_json_matches_schema(world, clean_result):
    d = clean_result.to_dict()
    assert_json_schema(json.loads(json.dumps(d)), JSON_SCHEMA)
    # a result with findings of every kind (rows, eval rows, steps, NaN evidence) validates too
    ev = [dict(r) for r in world.eval_rows[:20]] + [dict(world.rows[0], id="leak")]

    def nan(st):
        [e for e in st["log_history"] if "loss" in e][3]["loss"] = float("nan")

    res = diagnose(
        data=world.data,
        eval=world.data_with(ev, "eval.jsonl"),
        configs=[world.config_with(learning_rate=2e-5, max_length=64)],
        logs=world.state_with(nan),
        tokenizer=world.tok_dir,
    )
    d = json.loads(json.dumps(res.to_dict(), allow_nan=False))
    assert_json_schema(d, JSON_SCHEMA)
    assert {f["id"] for f in d["findings"]} >= {"D04", "D14", "C01", "L01"}


def test_findings_are_ordered_fix_first(world):
    def nan(st):
        [e for e in st["log_history"] if "loss" in e][3]["loss"] = float("nan")

    res = diagnose(
        data=world.data,
        configs=[world.config_with(learning_rate=2e-5, max_length=64, num_train_epochs=6)],
        logs=world.state_with(nan),
        tokenizer=world.tok_dir,
    )
    keys = [(SEVERITY_RANK[f.severity], REGISTRY[f.id].rank) for f in res.findings]
    assert keys == sorted(keys)
    ids = [f.id for f in res.findings]
    # the truncation error (what the model trains on) comes before the config error and the log symptom
    assert ids.index("D04") < ids.index("C03") < ids.index("L01")


def test_row_ids_are_example_ids(world):
    """Row-level findings carry load_examples' ids, so the report can join them to attribution clusters."""
    rows = make_rows(50, seed=3)
    for r in rows:
        del r["id"]  # ids fall back to row numbers
    rows[7]["completion"] = " "
    path = world.data_with(rows)
    res = diagnose(data=path)
    ex_ids = {e.id for e in load_examples(path)}
    f = res.by_id("D03")[0]
    assert f.row_ids == ["7"] and set(f.row_ids) <= ex_ids
    assert f.fraction == round(1 / 50, 4)


def test_api_accepts_objects(world):
    """diagnose() takes load_examples output, a TrainConfig, a TrainLog and a tokenizer object too."""
    from gradian.audit import load_config, load_logs

    res = diagnose(
        data=load_examples(world.data),
        eval=load_examples(world.eval),
        configs=load_config([world.config]),
        logs=load_logs(world.logs),
        tokenizer=world.tok,
        versions={"trl": "0.21.0"},
    )
    assert (res.counts["error"], res.counts["warning"]) == (0, 0), [f.message for f in res.findings]
    assert res.versions["trl"] == {"version": "0.21.0", "from": "--versions"}


AXOLOTL_CLEAN = """\
base_model: HuggingFaceTB/SmolLM2-135M-Instruct
adapter: lora
lora_r: 16
lora_alpha: 32
lora_dropout: 0.05
lora_target_linear: true
sequence_len: 512
sample_packing: false
train_on_inputs: false
micro_batch_size: 4
gradient_accumulation_steps: 4
num_epochs: 2
learning_rate: 2e-4
lr_scheduler: cosine
warmup_ratio: 0.05
val_set_size: 0.05
evals_per_epoch: 2
bf16: true
chat_template: chatml
datasets:
  - path: train.jsonl
    type: chat_template
    field_messages: messages
"""

LF_CLEAN = """\
model_name_or_path: HuggingFaceTB/SmolLM2-135M-Instruct
stage: sft
do_train: true
finetuning_type: lora
lora_rank: 16
lora_target: all
dataset: my_alpaca
template: qwen
cutoff_len: 512
per_device_train_batch_size: 4
gradient_accumulation_steps: 4
learning_rate: 2.0e-4
num_train_epochs: 2.0
lr_scheduler_type: cosine
warmup_ratio: 0.05
bf16: true
val_size: 0.05
eval_strategy: steps
eval_steps: 10
"""


def test_clean_axolotl_and_llamafactory_runs(world):
    """No false alarms on sensible axolotl (chat_template rows) and LLaMA-Factory (alpaca rows) setups."""
    msgs = as_messages(world.rows)
    ax = world.write_text("axolotl.yaml", AXOLOTL_CLEAN)
    res = diagnose(data=world.data_with(msgs), eval=world.eval, configs=[ax], logs=world.logs, tokenizer=world.tok_dir)
    assert (res.counts["error"], res.counts["warning"]) == (0, 0), [f.message for f in res.findings]
    assert {"D02", "T03", "C15", "C08"} <= set(res.passed)
    alpaca = [
        {"id": r["id"], "instruction": r["prompt"].strip(), "input": "", "output": r["completion"]} for r in world.rows
    ]
    lf = world.write_text("lf.yaml", LF_CLEAN)
    res = diagnose(
        data=world.data_with(alpaca), eval=world.eval, configs=[lf], logs=world.logs, tokenizer=world.tok_dir
    )
    assert (res.counts["error"], res.counts["warning"]) == (0, 0), [f.message for f in res.findings]
