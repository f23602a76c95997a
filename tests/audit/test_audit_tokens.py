"""The token view the checks read equals gradian.data.tokenize.tokenize_example, row for row."""

from __future__ import annotations

import pytest
from audit_world import as_messages

from gradian.audit import context as C
from gradian.audit import diagnose
from gradian.data.formats import to_example
from gradian.data.tokenize import TokenizeSpec, tokenize_example

ROWS = [
    {"prompt": "What is the capital of France?\n", "completion": "Paris."},
    {"prompt": "Say hi ", "completion": "hello"},  # boundary merge
    {"prompt": "x", "completion": "y<|im_end|>"},  # EOS already there
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Capital of Japan?"},
            {"role": "assistant", "content": "Tokyo."},
        ]
    },
    {
        "prompt": [{"role": "user", "content": "Water boils at?"}],
        "completion": [{"role": "assistant", "content": "100 C."}],
    },
    {"instruction": "Name a metal.", "input": "symbol Fe", "output": "Iron"},
    {"text": "The capital of Italy is Rome."},
    {"prompt": "<|endoftext|>Hello world", "completion": " again"},
    {"prompt": "", "completion": "only a completion"},
]


def _fields(tx):
    return (
        tx.input_ids,
        tx.labels,
        [tuple(o) for o in tx.offsets],
        tx.text,
        tx.completion_char_start,
        tx.full_length,
        tx.truncated,
        tx.prompt_length,
    )


@pytest.mark.parametrize(
    "spec", [TokenizeSpec(max_length=10**9), TokenizeSpec(max_length=8), TokenizeSpec(loss_on="all", add_eos=False)]
)
@pytest.mark.parametrize("which", ["tok", "tok_bos"])
def test_batch_tokenize_equals_tokenize_example(world, spec, which):
    tok = getattr(world, which)
    exs = [to_example(r, i, f"row {i}") for i, r in enumerate(ROWS)]
    fast = C.batch_tokenize(exs, tok, spec)
    for ex, (tx, err, plen) in zip(exs, fast):
        ref = tokenize_example(ex, tok, spec)
        assert err is None and _fields(tx) == _fields(ref), ex.id
        if ex.format != "text" and ex.prompt_text:
            assert plen is not None and plen >= ref.prompt_length


def test_render_errors_match(world):
    t = world.tok_copy(chat_template=None)
    exs = [to_example(ROWS[3], 0, "r")]
    ((tx, err, _),) = C.batch_tokenize(exs, t, TokenizeSpec())
    assert tx is None and "no" in err and "chat template" in err


def test_disagreement_falls_back_to_tokenize_example(world, monkeypatch):
    """If the batch path ever disagrees with tokenize_example on the sampled rows, every row is redone."""
    real = C.batch_tokenize

    def broken(examples, tok, spec):
        out = real(examples, tok, spec)
        tx, err, plen = out[0]
        tx.input_ids = tx.input_ids[:-1]
        return out

    monkeypatch.setattr(C, "batch_tokenize", broken)
    res = diagnose(data=world.data, tokenizer=world.tok, configs=[world.config], select=["D04", "D06"])
    assert any("disagreed with tokenize_example" in n for n in res.notes)
    assert "D06" in res.passed and "D04" in res.passed


def test_trl_messages_rows_are_trained_on_every_token(world):
    """TRL without assistant_only_loss trains every token of 'messages' rows; the token view follows it."""
    rows = as_messages(world.rows[:50])
    res = diagnose(
        data=world.data_with(rows),
        configs=[world.config_with(completion_only_loss=None)],
        tokenizer=world.tok,
        select=["D04", "C08"],
    )
    assert res.inputs["token_view"]["loss_on"] == "all"
    assert res.by_id("C08") and res.by_id("C08")[0].row_ids == [r["id"] for r in rows]
