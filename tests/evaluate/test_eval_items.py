"""Eval-set reader: the documented format, and one-line errors naming file:row and field."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gradian.cli import app
from gradian.errors import GradianUserError
from gradian.evaluate import load_eval_set
from gradian_testlib import assert_one_line_error


def _write(tmp_path, rows, name="eval.jsonl"):
    p = tmp_path / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return p


def test_reads_prompt_messages_aliases_and_defaults(tmp_path):
    p = _write(
        tmp_path,
        [
            {"prompt": "Capital of France?", "answer": "Paris", "aliases": ["paris, france"], "capability": "geo"},
            {
                "id": 7,
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Symbol of iron?"},
                ],
                "answer": "Fe",
                "capability": "chem",
                "metric": "contains",
            },
            {"prompt": "2+2?", "answer": 4, "capability": "math", "metric": "loglik"},
        ],
    )
    items = load_eval_set(p)
    assert [i.id for i in items] == ["0", "7", "2"]
    assert items[0].metric == "exact_match" and items[0].accepted == ["Paris", "paris, france"]
    assert items[1].is_chat and items[1].prompt[-1] == {"role": "user", "content": "Symbol of iron?"}
    assert items[1].metric == "contains"
    assert items[2].answer == "4" and items[2].metric == "loglik"
    assert items[0].where == f"{p}:1"


def test_reads_json_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"prompt": "q", "answer": "a", "capability": "c", "metric": "exact_match"}]
    pj = tmp_path / "e.json"
    pj.write_text(json.dumps(rows))
    pp = tmp_path / "e.parquet"
    pq.write_table(pa.Table.from_pylist(rows), pp)
    assert load_eval_set(pj)[0].answer == "a"
    assert load_eval_set(pp)[0].capability == "c"


BAD = [
    ([{"answer": "Paris", "capability": "geo"}], ":1: missing field 'prompt' (or 'messages')"),
    ([{"prompt": "q", "capability": "geo"}], ":1: missing field 'answer'"),
    ([{"prompt": "q", "answer": "a"}], ":1: missing field 'capability'"),
    (
        [
            {"prompt": "q", "answer": "a", "capability": "c"},
            {"prompt": "q", "answer": "a", "capability": "c", "metric": "bleu"},
        ],
        ":2: unknown metric 'bleu' in field 'metric'",
    ),
    ([{"prompt": "q", "answer": " ", "capability": "c"}], ":1: field 'answer' is empty"),
    ([{"prompt": "q", "answer": "a", "capability": "c", "aliases": "b"}], ":1: field 'aliases' must be a list"),
    (
        [
            {
                "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                "answer": "a",
                "capability": "c",
            }
        ],
        ":1: 'messages' ends with an assistant turn",
    ),
    (
        [
            {"prompt": "q", "answer": "a", "capability": "c", "metric": "exact_match"},
            {"prompt": "q", "answer": "a", "capability": "c", "metric": "loglik"},
        ],
        ":2: field 'metric' is 'loglik' but capability 'c' already uses 'exact_match'",
    ),
    ([{"id": "x", "prompt": "q", "answer": "a", "capability": "c"}] * 2, ":2: duplicate id 'x'"),
    (['{"prompt": "q", "answer": '], ":1: malformed JSON"),
    ([], ": eval set is empty"),
]


@pytest.mark.parametrize("rows,needle", BAD, ids=[b[1].split(": ")[1][:24] for b in BAD])
def test_bad_rows_raise_one_line_user_error(tmp_path, rows, needle):
    p = _write(tmp_path, rows) if rows else tmp_path / "eval.jsonl"
    if not rows:
        p.write_text("")
    with pytest.raises(GradianUserError) as ei:
        load_eval_set(p)
    msg = ei.value.one_line()
    assert msg.startswith(str(p)) and needle in msg, msg
    assert "fix:" in msg and "\n" not in msg


@pytest.mark.parametrize("rows,needle", BAD[:4] + BAD[-1:], ids=["no-prompt", "no-answer", "no-cap", "metric", "empty"])
def test_cli_bad_eval_file_exits_2_with_one_line(tmp_path, rows, needle):
    p = _write(tmp_path, rows) if rows else tmp_path / "eval.jsonl"
    if not rows:
        p.write_text("")
    # The eval set is checked before any model is loaded, so the paths need not exist.
    res = CliRunner().invoke(
        app, ["evaluate", "--base", str(tmp_path / "nobase"), "--adapter", str(tmp_path / "noad"), "--eval", str(p)]
    )
    assert_one_line_error(res, needle)


def test_cli_rejects_too_few_resamples(tmp_path):
    p = _write(tmp_path, [{"prompt": "q", "answer": "a", "capability": "c"}])
    res = CliRunner().invoke(app, ["evaluate", "--base", "b", "--adapter", "a", "--eval", str(p), "--resamples", "100"])
    assert res.exit_code == 2
    assert "--resamples: resamples must be at least 1000" in res.output


def test_cli_missing_adapter_exits_2(tmp_path):
    p = _write(tmp_path, [{"prompt": "q", "answer": "a", "capability": "c"}])
    res = CliRunner().invoke(app, ["evaluate", "--base", "b", "--adapter", str(tmp_path / "nope"), "--eval", str(p)])
    assert res.exit_code == 2 and "adapter folder not found" in res.output


def test_evaluate_renders_with_the_template_saved_beside_the_adapter(saved_finetune, tmp_path, monkeypatch):
    """`gradian evaluate` prompts the models with the chat template the run saved beside its adapter (as
    `gradian attribute`'s Evaluate lane does), and says so; an adapter folder without one keeps the tokenizer's."""
    import shutil

    import gradian.evaluate as ev_module
    from gradian.cli import app

    adapter = tmp_path / "adapter"
    shutil.copytree(saved_finetune["adapter"], adapter)
    template = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}<|assistant|>"
    (adapter / "chat_template.jinja").write_text(template)
    ev = tmp_path / "eval.jsonl"
    item = {"id": "e0", "prompt": "The capital of France is", "answer": "Paris", "capability": "capitals"}
    ev.write_text(json.dumps({**item, "metric": "contains"}) + "\n")
    seen = []
    real = ev_module.evaluate

    def spy(model, tok, *a, **k):
        seen.append(tok.chat_template)
        return real(model, tok, *a, **k)

    monkeypatch.setattr(ev_module, "evaluate", spy)
    base = ["evaluate", "--base", str(saved_finetune["base"]), "--eval", str(ev), "--max-new-tokens", "2"]
    res = CliRunner().invoke(app, [*base, "--adapter", str(adapter)])
    assert res.exit_code == 0, res.output
    assert seen == [template] and f"chat template: the run's ({adapter / 'chat_template.jinja'})" in res.output
    res = CliRunner().invoke(app, [*base, "--adapter", str(saved_finetune["adapter"])])
    assert res.exit_code == 0, res.output
    assert seen[1] != template and "chat template" not in res.output
