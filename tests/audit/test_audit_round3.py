"""Audit round 3 (issue 25): C08 with a completion-only collator and '### Question: ... ### Answer:' text rows.

The fixture follows TRL's documented completion-only recipe (trl docs, sft_trainer "Train on completions only",
TRL <= 0.19): text rows formatted as ``### Question: {q}\\n ### Answer: {a}`` with
``DataCollatorForCompletionOnlyLM(response_template=" ### Answer:")``.
"""

from __future__ import annotations

import json
from pathlib import Path

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
