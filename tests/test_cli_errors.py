"""User mistakes on the command line: one line naming the file/row/field and the fix, exit code 2."""

from __future__ import annotations

import shutil

import pytest
from typer.testing import CliRunner

from gradian.cli import app
from gradian_testlib import assert_one_line_error, cli_args

runner = CliRunner()


def _run(args):
    res = runner.invoke(app, args)
    return res.exit_code, res.output, res


def _index_args(sf, data=None, adapter=None):
    return cli_args(
        "index",
        base=sf["base"],
        adapter=adapter or sf["adapter"],
        data=data or sf["data"],
        out=sf["root"] / "idx-cli",
        max_length=64,
    )


@pytest.mark.parametrize(
    "content,needle",
    [
        ('{"prompt": "a", "completion": "b"}\n{"prompt": "a", "completion": \n', "bad.jsonl:2: malformed JSON"),
        ('{"prompt": "a"}\n', "bad.jsonl:1: missing field 'completion'"),
        ('{"question": "a", "answer": "b"}\n', "bad.jsonl:1: unknown row format"),
        ("", "bad.jsonl: dataset is empty"),
    ],
    ids=["malformed", "missing-field", "unknown-format", "empty"],
)
def test_bad_data_exits_2_with_one_line(saved_finetune, tmp_path, content, needle):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    _, _, res = _run(_index_args(saved_finetune, data=bad))
    assert_one_line_error(res, needle)


def test_adapter_not_fitting_base_exits_2(saved_finetune, tmp_path):
    from peft import LoraConfig, get_peft_model

    from gradian.models.tiny import tiny_model

    tok_path = saved_finetune["base"]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_path)
    pm = get_peft_model(tiny_model(tok, "llama", hidden=32), LoraConfig(r=2, target_modules=["q_proj"]))
    pm.save_pretrained(tmp_path / "wrong")
    code, out, _ = _run(_index_args(saved_finetune, adapter=tmp_path / "wrong"))
    assert code == 2 and "needs" in out and "fix:" in out and len(out.strip().splitlines()) == 1


def test_unknown_config_value_exits_2(saved_finetune):
    code, out, _ = _run(_index_args(saved_finetune) + ["--loss-on", "everything"])
    assert code == 2 and "--loss-on" in out


def test_missing_base_exits_2(saved_finetune, tmp_path):
    args = _index_args(saved_finetune)
    args[2] = str(tmp_path / "no-such-model")
    code, out, _ = _run(args)
    assert code == 2 and "base model folder not found" in out  # named at once, no hub lookup


def test_no_half_written_index_on_error(saved_finetune, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n')
    out_dir = saved_finetune["root"] / "idx-cli"
    shutil.rmtree(out_dir, ignore_errors=True)
    _run(_index_args(saved_finetune, data=bad))
    assert not out_dir.exists()


def test_help_lists_only_registered_commands():
    code, out, _ = _run(["--help"])
    assert code == 0 and "index" in out
