"""Every supported file type and row format reads into Examples; bad input is one clear error."""

from __future__ import annotations

import json

import pytest

from gradian.data.formats import load_examples
from gradian.errors import GradianUserError
from gradian_testlib import ROWS, write_jsonl


def test_formats_detected_and_normalised(tmp_path):
    exs = load_examples(write_jsonl(tmp_path / "d.jsonl", ROWS))
    by = {e.id: e for e in exs}
    assert [e.format for e in exs] == ["prompt_completion", "messages", "alpaca", "text"]
    assert by["pc"].prompt == "Q: What is the capital of France?\nA:" and by["pc"].completion == " Paris"
    assert by["chat"].is_chat and by["chat"].prompt[0]["role"] == "user"
    assert by["chat"].completion_text.startswith("The capital of Japan")
    assert by["alp"].prompt == "Name the symbol of iron." and by["alp"].completion == "Fe"
    assert by["txt"].prompt == "" and by["txt"].completion.startswith("Water")


def test_alpaca_input_joined():
    from gradian.data.formats import to_example

    ex = to_example({"instruction": "Translate", "input": "Hallo", "output": "Hello"}, 0, "x")
    assert ex.prompt == "Translate\n\nHallo"


def test_ids_default_to_row_numbers(tmp_path):
    rows = [{"text": "a"}, {"text": "b"}]
    assert [e.id for e in load_examples(write_jsonl(tmp_path / "d.jsonl", rows))] == ["0", "1"]


@pytest.mark.parametrize("suffix", ["json", "parquet", "hf"])
def test_other_file_types(tmp_path, suffix):
    if suffix == "json":
        p = tmp_path / "d.json"
        p.write_text(json.dumps(ROWS[:1] + ROWS[3:]))
    elif suffix == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        p = tmp_path / "d.parquet"
        pq.write_table(pa.Table.from_pylist([ROWS[0], {"id": "x", "prompt": "p", "completion": "c"}]), p)
    else:
        from datasets import Dataset

        p = tmp_path / "hf"
        Dataset.from_list([ROWS[1], {"id": "m2", "messages": ROWS[1]["messages"]}]).save_to_disk(str(p))
    exs = load_examples(p)
    assert len(exs) == 2 and all(e.id for e in exs)


def test_sharegpt_conversations_accepted():
    from gradian.data.formats import to_example

    ex = to_example({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}, 0, "x")
    assert ex.prompt == [{"role": "user", "content": "hi"}] and ex.completion_text == "yo"


@pytest.mark.parametrize(
    "content,needle",
    [
        ('{"prompt": "a", "completion": "b"}\n{"prompt": "a", "completion": \n', "d.jsonl:2: malformed JSON"),
        ('{"prompt": "a"}\n', "d.jsonl:1: missing field 'completion'"),
        ('{"question": "a", "answer": "b"}\n', "d.jsonl:1: unknown row format"),
        ("", "d.jsonl: dataset is empty"),
        ("[1, 2]\n", "d.jsonl:1: line is a JSON list"),
        ('{"messages": [{"role": "user", "content": "x"}]}\n', "has no assistant turn"),
        ('{"id": 1, "text": "a"}\n{"id": 1, "text": "b"}\n', "duplicate id '1'"),
    ],
)
def test_bad_input_is_one_line_with_where_and_fix(tmp_path, content, needle):
    p = tmp_path / "d.jsonl"
    p.write_text(content)
    with pytest.raises(GradianUserError) as ei:
        load_examples(p)
    msg = str(ei.value)
    assert needle in msg and "\n" not in msg and "(fix: " in msg and str(tmp_path) in msg


def test_unknown_extension(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("a,b\n")
    with pytest.raises(GradianUserError, match="unknown data file type"):
        load_examples(p)
