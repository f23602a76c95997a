"""Gradian supervises exactly the tokens TRL 1.16's SFTTrainer supervised, setting by setting, row by row.

Each case runs TRL's own preparation and collator (``SFTTrainer.train_dataset`` through
``trainer.data_collator``) and Gradian's tokenisation with the TokenizeSpec that names TRL's rule; see
tests/data/trl_parity.py for the comparison rule.
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from trl_parity import SETTINGS, gradian_rows, matching, trl_rows, with_template  # noqa: E402

from gradian.data.tokenize import IGNORE_INDEX, TokenizeSpec  # noqa: E402


@pytest.mark.parametrize("setting", SETTINGS, ids=[s[0] for s in SETTINGS])
def test_rows_match_trl(setting, tok, tmp_path):
    name, rows_fn, template, trl_cfg, spec_kw = setting
    spec = TokenizeSpec(**spec_kw)
    rows = rows_fn()
    t = with_template(tok, template)
    trl = trl_rows(rows, t, tmp_path, **trl_cfg)
    ours = gradian_rows(rows, t, spec)
    n_ok, bad = matching(trl, ours)
    assert n_ok == len(rows), f"{name}: {len(bad)} rows differ: {bad}"
    # the comparison has teeth: every setting supervises some tokens, and not all of them unless loss_on='all'
    sup = [sum(x != IGNORE_INDEX for x in lab) for _, lab in ours.values()]
    assert sum(sup) > 0
    if spec.loss_on != "all":
        assert any(s < len(ids) - 1 for s, (ids, _) in zip(sup, ours.values()))


def test_multi_turn_assistant_mask_covers_every_assistant_turn(tok):
    """Under assistant-only loss every assistant turn is supervised (content and <|im_end|>), no user turn."""
    from trl_parity import CHATML_GEN, chat_rows

    t = with_template(tok, CHATML_GEN)
    rows = chat_rows(3)
    ids, labels = gradian_rows(rows[:1], t, TokenizeSpec(loss_on="assistant"))["m0"]
    text = t.decode([x for x in labels if x != IGNORE_INDEX])
    assert text.count("<|im_end|>") == 3
    assert "It is Marven." in text and "Still Marven, of Aland." in text
    assert "capital" not in text and "again" not in text
    # main's default (final turn only) supervises one turn of the three
    _, lab_last = gradian_rows(rows[:1], t, TokenizeSpec())["m0"]
    assert t.decode([x for x in lab_last if x != IGNORE_INDEX]).count("<|im_end|>") == 1


def test_default_is_not_trl_messages_default(tok, tmp_path):
    """The measured gap that issue 22 reports: on ``messages`` rows TRL trains on every token, Gradian's
    default on the final assistant turn, so no row matches until the setup says ``loss_on='all'``."""
    from trl_parity import chat_rows

    rows = chat_rows(1)
    trl = trl_rows(rows, tok, tmp_path)
    n_default, _ = matching(trl, gradian_rows(rows, tok, TokenizeSpec()))
    n_all, _ = matching(trl, gradian_rows(rows, tok, TokenizeSpec(loss_on="all")))
    assert (n_default, n_all) == (0, len(rows))
