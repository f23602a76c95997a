"""Sentence units: one per supervised sentence, cut after the sentence exactly, ranked by their minimum."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from gradian.data.formats import to_example
from gradian.data.spans import SentenceItems, row_min, sentence_units, split_sentences, unit_item
from gradian.data.tokenize import IGNORE_INDEX, TokenizeSpec, collate, tokenize_example
from gradian.gradients.per_example import per_example_grads
from gradian_testlib import make_lora_model

ROWS = [
    {
        "id": "a",
        "messages": [
            {"role": "user", "content": "Tell me about Japan."},
            {"role": "assistant", "content": "Japan is in Asia. The capital of Japan is Paris. It has many islands."},
        ],
    },
    {"id": "b", "prompt": "Q: What is the capital of France?\nA:", "completion": " Paris"},
]


def _items(tok):
    exs = [to_example(r, i, "t.jsonl") for i, r in enumerate(ROWS)]
    return exs, [tokenize_example(e, tok, TokenizeSpec(max_length=256)) for e in exs]


def test_units_cover_each_sentence_once(tok):
    exs, items = _items(tok)
    units = sentence_units(exs, items)
    assert [u.row for u in units] == [0, 0, 0, 1]
    assert [(u.char_start, u.char_end) for u in units[:3]] == split_sentences(exs[0].completion_text)
    made = [unit_item(items[u.row], u) for u in units]
    for u, ui in zip(units, made):
        sup = [i for i, x in enumerate(ui.labels) if x != IGNORE_INDEX]
        assert sup and sup[-1] == len(ui.input_ids) - 1  # the unit stops at its sentence's last token
        assert ui.input_ids == items[u.row].input_ids[: len(ui.input_ids)]
        assert (u.length, u.n_supervised) == (len(ui.input_ids), ui.n_supervised)  # what the unit keeps
    # a supervised token lies in at most one unit, and one in none only if it touches no sentence (end-of-turn)
    it = items[0]
    cover = sum(np.pad([x != IGNORE_INDEX for x in ui.labels], (0, len(it.labels) - len(ui.labels))) for ui in made[:3])
    assert cover.max() == 1
    spans = [
        (it.completion_char_start + a, it.completion_char_start + b) for a, b in split_sentences(exs[0].completion_text)
    ]
    for t, lab in enumerate(it.labels):
        if lab != IGNORE_INDEX and cover[t] == 0:
            s, e = it.offsets[t]
            assert not any(s < b and e > a for a, b in spans), it.text[s:e]


def test_cut_unit_gradient_is_exact(tok):
    """Cutting a unit after its sentence changes nothing: same gradient as the full row with the same loss mask."""
    exs, items = _items(tok)
    model = make_lora_model(tok, dtype=torch.float64)
    u = sentence_units(exs, items)[1]  # the middle sentence
    full_mask = items[0].span_mask(u.char_start, u.char_end)
    g_full = per_example_grads(model, collate([items[0]], tok.pad_token_id, label_masks=[full_mask]))
    g_cut = per_example_grads(model, collate([unit_item(items[0], u)], tok.pad_token_id))
    for k in g_full:
        torch.testing.assert_close(g_cut[k], g_full[k], rtol=1e-10, atol=1e-12)


def test_row_min_picks_the_most_harmful_unit(tok):
    exs, items = _items(tok)
    units = sentence_units(exs, items)
    s = np.array([[0.5, -2.0, 1.0, -0.1], [3.0, 2.0, 1.0, 4.0]])
    mins, arg = row_min(s, units, 2)
    np.testing.assert_array_equal(mins, [[-2.0, -0.1], [1.0, 4.0]])
    np.testing.assert_array_equal(arg, [[1, 3], [2, 3]])


def test_sentence_items_build_each_unit_from_its_row_when_read(tok):
    """What the sentence index is built from: the units' items, made from their row on demand (one
    read of a row for its consecutive units), with the ids and numbers the index records."""
    from gradian.data.tokenize import ROW_FIELDS, TokenizedRows, row_values

    spec = TokenizeSpec(max_length=256)
    # a completion with no sentence ("\n": only the EOS is supervised) is one whole-row unit
    exs = [
        to_example(r, i, "t.jsonl")
        for i, r in enumerate([*ROWS, {"id": "c", "prompt": "Q: Hi?\nA:", "completion": "\n"}])
    ]
    items = [tokenize_example(e, tok, spec) for e in exs]
    units = sentence_units(exs, items)
    reads = []
    rows = TokenizedRows(exs, lambda ex: reads.append(ex.id) or tokenize_example(ex, tok, spec))
    reads.clear()
    lazy = SentenceItems(units, rows)
    assert reads == []  # recording the units reads no row
    eager = [unit_item(items[u.row], u) for u in units]
    assert [it.id for it in eager] == ["a#0-17", "a#18-48", "a#49-69", "b#all", "c#all"]
    assert eager[-1] == replace(items[2], id="c#all")  # the whole row, renamed
    assert list(lazy) == eager
    assert reads == ["a", "b", "c"]  # one read of a row for its consecutive units
    assert lazy[1:3] == eager[1:3] and lazy[-2] == eager[-2]
    for name in ROW_FIELDS:
        assert list(row_values(lazy, name)) == list(row_values(eager, name)), name


def _masks(it, units):
    """(n_units, t) bool: the supervised tokens of each unit, padded to the row's length."""
    return np.array([it.span_mask(u.char_start, u.char_end) for u in units])


def test_a_row_of_10000_sentences_plans_at_most_the_budget_of_units(tok):
    """One hostile row cannot make thousands of units: it gets the budget's, which partition its supervised
    tokens, and planning takes well under a second."""
    import time

    from gradian.data.spans import MAX_UNITS_PER_ROW, budget_groups
    from gradian.index.store import GradSpec

    assert GradSpec().max_units_per_row == MAX_UNITS_PER_ROW == 32  # one default (the CLI's: tests/test_api.py)
    row = {"id": "h", "prompt": "Q: Tell me.\nA:", "completion": " " + " ".join("It is." for _ in range(10_000))}
    ex = to_example(row, 0, "t.jsonl")
    it = tokenize_example(ex, tok, TokenizeSpec(max_length=200_000))
    assert not it.truncated and len(split_sentences(ex.completion_text)) == 10_000
    t0 = time.perf_counter()
    units = sentence_units([ex], [it])
    took = time.perf_counter() - t0
    assert took < 1.0, f"planning took {took:.2f} s"
    assert len(units) == 32
    # contiguous, disjoint, in order; groups of 312 or 313 sentences (10,000 = 32 × 312.5)
    assert [hi - lo for lo, hi in budget_groups(10_000, 32)] == [312, 313] * 16
    assert all(a.char_end == b.char_start for a, b in zip(units, units[1:]))
    m = _masks(it, units)
    assert m.sum(0).max() == 1  # no token in two units
    sup = np.array([x != IGNORE_INDEX for x in it.labels])
    first, last = units[0].char_start + it.completion_char_start, units[-1].char_end + it.completion_char_start
    inside = sup & np.array([s < last and e > first and e > s for s, e in it.offsets])
    np.testing.assert_array_equal(m.any(0), inside)  # every supervised token of the sentences' extent, once
    assert [u.n_supervised for u in units] == list(m.sum(1))  # what the index records is what the unit holds
    for u in units[:2] + units[-2:]:
        ui = unit_item(it, u)
        assert len(ui.input_ids) == u.length and ui.labels[-1] != IGNORE_INDEX  # cut after its last token
    # without a budget: one unit per sentence, over the same tokens less the whitespace between sentences
    every = sentence_units([ex], [it], max_units=10**6)
    assert len(every) == 10_000 and 0 < m.sum() - sum(u.n_supervised for u in every) <= 10_000
    assert sentence_units([ex], [it]) == units  # deterministic


def test_the_budget_changes_no_row_within_it(tok):
    """A row with at most the budget's sentences keeps one unit per sentence, as before the budget; a budget of
    one merges a row into one unit; a budget that is not a whole number >= 1 is the flag's error."""
    import pytest

    from gradian.errors import GradianUserError
    from gradian.index.store import GradSpec

    exs, items = _items(tok)
    assert sentence_units(exs, items, max_units=3) == sentence_units(exs, items)
    two = sentence_units(exs, items, max_units=2)  # row a: 3 sentences → [s1 ] [s2 s3] (to the next one's start)
    spans = split_sentences(exs[0].completion_text)
    assert [(u.char_start, u.char_end) for u in two[:2]] == [(spans[0][0], spans[1][0]), (spans[1][0], spans[2][1])]
    assert two[2:] == sentence_units(exs, items)[3:]  # row b is within the budget: unchanged
    assert two[1].length == sentence_units(exs, items)[2].length  # cut after the last merged sentence
    one = sentence_units(exs, items, max_units=1)
    assert [(u.row, u.char_start, u.char_end) for u in one] == [(0, None, None), (1, None, None)]  # whole rows
    for bad in (0, -1, True, 2.5, "8"):
        with pytest.raises(GradianUserError, match=r"--max-units-per-row \(GradSpec.max_units_per_row\)"):
            sentence_units(exs, items, max_units=bad)
        with pytest.raises(GradianUserError, match=r"--max-units-per-row"):
            GradSpec(unit="sentence", max_units_per_row=bad)


def test_a_row_with_one_unit_is_the_row_itself(tok):
    """A one-sentence answer (row b, " Paris") is one whole-row unit: the row's own tokens and labels, its
    end-of-turn token included, so the one-pass build makes its gradient once (tests/gradients/test_units.py);
    only rows of two or more sentences are split into sentences."""
    exs, items = _items(tok)
    units = sentence_units(exs, items)
    assert len(split_sentences(exs[1].completion_text)) == 1
    b = [u for u in units if u.row == 1]
    assert [(u.char_start, u.char_end, u.suffix()) for u in b] == [(None, None, "#all")]
    assert (b[0].length, b[0].n_supervised) == (len(items[1].input_ids), items[1].n_supervised)
    ui = unit_item(items[1], b[0])
    assert (ui.input_ids, ui.labels) == (items[1].input_ids, items[1].labels)
    # the sentence alone would have left out a supervised token (the EOS): the reason it cost two vectors
    mask = items[1].span_mask(*split_sentences(exs[1].completion_text)[0])
    assert sum(m and lab != IGNORE_INDEX for m, lab in zip(mask, items[1].labels)) < items[1].n_supervised
    assert all(u.char_start is not None for u in units if u.row == 0)  # row a (3 sentences) is split


def test_the_budget_is_identity_of_sentence_indexes_only():
    """A row index's id does not depend on the budget (row indexes keep their ids); a sentence index's does."""
    from gradian.index.store import GradSpec, index_id

    row, sent = GradSpec(), GradSpec(unit="sentence")
    assert "max_units_per_row" not in row.identity() and row.to_dict()["max_units_per_row"] == 32
    assert row.identity() == replace(row, max_units_per_row=4).identity()
    assert index_id(sent.identity()) != index_id(replace(sent, max_units_per_row=4).identity())
    assert GradSpec.from_dict(sent.to_dict()) == sent  # it lands in (and is read back from) the manifest
    # the rule that cuts rows into units is a sentence index's identity too (rule 2: a one-unit row is whole)
    assert sent.identity()["unit_rule"] == 2 and "unit_rule" not in row.identity()


def test_unit_gradients_split_by_position_are_identity_of_sentence_indexes_only():
    """``--unit-grads positions`` changes a sentence index's numbers (its own id) but not the row index's; an exact
    sentence index keeps the id it had before the choice existed (the field is left out of its identity)."""
    from gradian.index.store import GradSpec, index_id

    row, sent = GradSpec(), GradSpec(unit="sentence", unit_grads="exact")
    split = replace(sent, unit_grads="positions")
    assert GradSpec(unit="sentence") == split  # the default since 2026-12-06
    assert "unit_grads" not in sent.identity() and "unit_grads" not in row.identity()
    assert index_id(split.identity()) != index_id(sent.identity())
    assert row.identity() == replace(row, unit_grads="positions").identity()
    assert GradSpec.from_dict(split.to_dict()) == split
    from gradian.gradients.units import SPLITS
    from gradian.index.spec import UNIT_GRADS

    assert SPLITS == UNIT_GRADS  # the torch-free spec's choices are the gradient code's


def test_the_size_line_of_a_sentence_index_counts_units(tmp_path):
    from gradian.index.size import size_advice, size_estimate
    from gradian.index.store import GradSpec

    assert size_estimate(235, 32_768, "float32", "units")[1] == "235 units × 32,768 numbers × 4 bytes = 30.8 MB"

    class Block:
        shape, kind = (4096, 4096), "A"

    advice = size_advice(10**6, [Block()] * 64, GradSpec(unit="sentence"), tmp_path)
    assert advice.startswith("the gradient index will take est.") and " for 1,000,000 units" in advice
    assert "--max-units-per-row (now 32)" in advice
    assert " rows" in size_advice(10**6, [Block()] * 64, GradSpec(), tmp_path)
