"""Loss masks match TRL's SFTTrainer (completion-only) for every format; spans map to tokens."""

from __future__ import annotations

import pytest

from gradian.data.formats import to_example
from gradian.data.tokenize import IGNORE_INDEX, TokenizeSpec, collate, tokenize_example
from gradian_testlib import ROWS


def _trl_row(ex):
    """The same row as TRL would be given it (alpaca has no TRL form: it is its prompt/completion)."""
    if ex.format == "text":
        return {"text": ex.completion}
    if ex.format == "messages":
        return {"prompt": ex.prompt, "completion": ex.completion}
    return {"prompt": ex.prompt, "completion": ex.completion}


def _trl_targets(row, tok, tmp_path, max_length=64):
    """Token ids TRL trains on for one row: input_ids where its labels are not -100, after the causal shift."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from gradian.models.tiny import tiny_model

    args = SFTConfig(
        output_dir=str(tmp_path / "trl"),
        max_length=max_length,
        completion_only_loss=True,
        report_to=[],
        dataset_num_proc=None,
        use_cpu=True,
    )
    tr = SFTTrainer(model=tiny_model(tok), args=args, train_dataset=Dataset.from_list([row]), processing_class=tok)
    feat = tr.train_dataset[0]
    batch = tr.data_collator([feat])
    ids = batch["input_ids"][0].tolist()
    labels = batch["labels"][0].tolist()
    return ids, [t for t in labels[1:] if t != IGNORE_INDEX]


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_supervised_tokens_match_trl(row, tok, tmp_path):
    ex = to_example(row, 0, "t")
    it = tokenize_example(ex, tok, TokenizeSpec(max_length=64))
    trl_ids, trl_targets = _trl_targets(_trl_row(ex), tok, tmp_path)
    assert it.input_ids == trl_ids
    ours = [t for t in it.labels[1:] if t != IGNORE_INDEX]
    assert ours == trl_targets and len(ours) > 0


def test_completion_mask_and_eos(tok):
    ex = to_example(ROWS[0], 0, "t")
    it = tokenize_example(ex, tok, TokenizeSpec())
    sup = [t for t in it.labels if t != IGNORE_INDEX]
    assert sup[-1] == tok.eos_token_id  # EOS appended to plain completions, and trained on
    assert tok.decode(sup).startswith(" Paris")
    assert it.prompt_length == len(it.input_ids) - len(sup)


def test_chat_end_of_turn_is_supervised(tok):
    it = tokenize_example(to_example(ROWS[1], 0, "t"), tok, TokenizeSpec())
    sup = [t for t in it.labels if t != IGNORE_INDEX]
    assert tok.convert_tokens_to_ids("<|im_end|>") in sup
    assert "The capital of Japan" in tok.decode(sup)


def test_loss_on_all_supervises_prompt(tok):
    ex = to_example(ROWS[0], 0, "t")
    it = tokenize_example(ex, tok, TokenizeSpec(loss_on="all"))
    assert it.labels[0] == IGNORE_INDEX and it.labels[1:] == it.input_ids[1:]


def test_truncation_recorded(tok):
    ex = to_example({"prompt": "Q:", "completion": " word" * 80}, 0, "t")
    it = tokenize_example(ex, tok, TokenizeSpec(max_length=16))
    assert it.truncated and it.full_length > 16 and len(it.input_ids) == 16
    assert it.input_ids[-1] != tok.eos_token_id  # keep_start truncation cut the EOS off


def test_drop_long_rows_are_not_trained(tok):
    """axolotl's default drops a row longer than max_length: Gradian keeps its start with no supervised token (zero
    gradient); a row that fits is unchanged, and the spec's dict (so an index id) has no drop_long unless it is set."""
    long = to_example({"prompt": "Q:", "completion": " word" * 80}, 0, "t")
    short = to_example({"prompt": "Q:", "completion": " word"}, 1, "t")
    drop, keep = TokenizeSpec(max_length=16, drop_long=True), TokenizeSpec(max_length=16)
    dropped = tokenize_example(long, tok, drop)
    assert dropped.truncated and len(dropped.input_ids) == 16 and dropped.n_supervised == 0
    assert tokenize_example(long, tok, keep).n_supervised > 0
    a, b = tokenize_example(short, tok, drop), tokenize_example(short, tok, keep)
    assert (a.input_ids.tolist(), a.labels.tolist()) == (b.input_ids.tolist(), b.labels.tolist()) and a.n_supervised
    assert "drop_long" not in keep.to_dict() and drop.to_dict()["drop_long"] is True


def test_span_mask_selects_sentence_tokens(tok):
    text = "Iron is a metal. The capital of France is Paris. Water boils at 100 degrees."
    ex = to_example(
        {"messages": [{"role": "user", "content": "Tell me"}, {"role": "assistant", "content": text}]}, 0, "t"
    )
    it = tokenize_example(ex, tok, TokenizeSpec())
    a = text.index("The capital")
    b = a + len("The capital of France is Paris.")
    mask = it.span_mask(a, b)
    picked = tok.decode([t for t, m in zip(it.input_ids, mask) if m])
    assert "capital of France is Paris" in picked
    assert "Iron" not in picked and "Water" not in picked


def test_collate_left_and_right(tok):
    items = [tokenize_example(to_example(r, i, "t"), tok, TokenizeSpec()) for i, r in enumerate(ROWS)]
    for side in ("left", "right"):
        b = collate(items, tok.pad_token_id, side)
        for i, it in enumerate(items):
            m = b["attention_mask"][i].bool()
            assert b["input_ids"][i][m].tolist() == it.input_ids
            assert b["labels"][i][m].tolist() == it.labels
            assert b["position_ids"][i][m].tolist() == list(range(len(it.input_ids)))
            assert (b["labels"][i][~m] == IGNORE_INDEX).all()


def test_token_arrays_read_like_lists_and_stay_compact():
    """TokenIds / TokenOffsets (issue 14: tokenised rows are held whole during a build) behave as the
    tokenizer's lists do, and hold 4 bytes a number."""
    import pickle

    from gradian.data.tokenize import TokenIds, TokenOffsets

    ids = TokenIds([5, 300, 70000, -100])
    assert ids == [5, 300, 70000, -100] and [5, 300, 70000, -100] == ids and ids != [5, 300]
    assert ids[1] == 300 and ids[-1] == -100 and ids[1:3] == [300, 70000] and isinstance(ids[1:3], TokenIds)
    assert ids[::2] == [5, 70000] and list(ids) == [5, 300, 70000, -100] and ids.tolist() == [5, 300, 70000, -100]
    assert pickle.loads(pickle.dumps(ids)) == ids and ids._a.itemsize == 4
    off = TokenOffsets([(0, 3), (3, 7), (7, 7)])
    assert off == [(0, 3), (3, 7), (7, 7)] and off == [[0, 3], [3, 7], [7, 7]] and off != [(0, 3)]
    assert off[1] == (3, 7) and off[-1] == (7, 7) and off[:2] == [(0, 3), (3, 7)] and off[5:9] == []
    s, e = off[0]
    assert (s, e) == (0, 3) and isinstance(s, int) and pickle.loads(pickle.dumps(off)) == off
    assert off._flat.itemsize == 4 and len(off._flat) == 2 * len(off)


def test_collate_reads_token_arrays_and_lists_alike(tok):
    """A row whose ids are TokenIds and the same row with plain lists collate to the same tensors."""
    from dataclasses import replace

    import torch

    it = tokenize_example(to_example(ROWS[1], 0, "t"), tok, TokenizeSpec())
    plain = replace(it, input_ids=list(it.input_ids), labels=list(it.labels))
    a, b = collate([it], tok.pad_token_id), collate([plain], tok.pad_token_id)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_lazily_tokenised_rows_read_like_the_list(tok):
    """TokenizedRows keeps ids, lengths, supervised counts and truncation per row and tokenises a row
    again when it is read: the same rows as tokenising them all, and the same per-row numbers."""
    from gradian.data.tokenize import ROW_FIELDS, TokenizedRows, row_values

    examples = [to_example(r, i, f"rows:{i}") for i, r in enumerate(ROWS)]
    spec = TokenizeSpec(max_length=24)  # some rows truncated (full lengths 19 to 56)
    eager = [tokenize_example(ex, tok, spec) for ex in examples]
    lazy = TokenizedRows(examples, lambda ex: tokenize_example(ex, tok, spec))
    assert len(lazy) == len(eager) and lazy.ids == [it.id for it in eager]
    assert any(it.truncated for it in eager) and not all(it.truncated for it in eager)
    for k, it in enumerate(eager):
        assert lazy[k] == it
    assert lazy[1:3] == eager[1:3]
    for name in ROW_FIELDS:
        assert list(row_values(lazy, name)) == list(row_values(eager, name)), name
    assert list(row_values(eager, "length")) == [len(it.input_ids) for it in eager]
    with pytest.raises(ValueError):
        row_values(eager, "text")


def test_a_long_query_is_cut_not_dropped(tok):
    """drop_long is the trainer's treatment of training rows; a query under the same spec keeps its supervised
    tokens when its answer survives the cut (only the EOS past max_length goes)."""
    from gradian.attribute.queries import Query, query_rows

    q = Query.from_text("Q: What is the capital of Aland?\nA:", " Marven.")
    (_, _, full), *_ = query_rows(tok, [q], TokenizeSpec(max_length=512))
    n = len(full.input_ids) - 1  # cut only the EOS off
    (_, _, cut), *_ = query_rows(tok, [q], TokenizeSpec(max_length=n, drop_long=True))
    assert cut.truncated and cut.n_supervised == full.n_supervised - 1 > 0
