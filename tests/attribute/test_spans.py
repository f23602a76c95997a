"""Sentence units: one per supervised sentence, cut after the sentence exactly, ranked by their minimum."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from gradian.attribute.spans import SentenceItems, row_min, sentence_units, split_sentences, unit_item
from gradian.data.formats import to_example
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
    assert [it.id for it in eager] == ["a#0-17", "a#18-48", "a#49-69", "b#1-6", "c#all"]
    assert eager[-1] == replace(items[2], id="c#all")  # the whole row, renamed
    assert list(lazy) == eager
    assert reads == ["a", "b", "c"]  # one read of a row for its consecutive units
    assert lazy[1:3] == eager[1:3] and lazy[-2] == eager[-2]
    for name in ROW_FIELDS:
        assert list(row_values(lazy, name)) == list(row_values(eager, name)), name
