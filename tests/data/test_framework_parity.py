"""axolotl / LLaMA-Factory / torchtune: Gradian's tokenisation under the setup resolved from each framework's config,
row by row against the framework's own rule (tests/data/framework_parity.py, written from the frameworks' source at
axolotl 0.19.0, LLaMA-Factory 0.9.5, torchtune 0.6.1; none installs here).

Where Gradian reproduces the rule (axolotl's content + EOS mask through ``TokenizeSpec.train_roles``, LLaMA-Factory's
three mask settings) every row is equal. Where it does not, no row is, and the setup must say so
(``unreproduced`` with a note naming the framework's rule): the gradients are never a silent approximation.
"""

from __future__ import annotations

import pytest
from framework_parity import axolotl_rows, llamafactory_rows, rows, torchtune_rows

from gradian.audit.config import load_config
from gradian.data.formats import to_example
from gradian.data.setup import resolve_setup
from gradian.data.tokenize import IGNORE_INDEX, tokenize_example

AX = (
    "base_model: x\nsequence_len: 2048\nadapter: lora\nexcess_length_strategy: truncate\n"
    "datasets:\n  - path: d.jsonl\n    type: chat_template\n"
)
LF = "stage: sft\nfinetuning_type: lora\ncutoff_len: {n}\ntemplate: qwen\n"
TT = (
    "tokenizer:\n  _component_: torchtune.models.qwen2.qwen2_tokenizer\n  max_seq_len: {n}\n"
    "dataset:\n  _component_: torchtune.datasets.chat_dataset\n{extra}"
)

#: (setting, framework rule, its keyword arguments, the framework's config, rows equal, the unreproduced entry and
#: a phrase of its note that must be stated when rows differ)
SETTINGS = [
    ("axolotl roles_to_train [assistant], train_on_eos turn (defaults)", axolotl_rows, {}, AX, 4, None, None),
    (
        "axolotl train_on_inputs true",
        axolotl_rows,
        {"train_on_inputs": True},
        AX + "train_on_inputs: true\n",
        4,
        None,
        None,
    ),
    (
        "axolotl train_on_eos none",
        axolotl_rows,
        {"train_on_eos": "none"},
        AX + "    train_on_eos: none\n",
        4,
        None,
        None,
    ),
    (
        "axolotl roles_to_train [assistant, user]",
        axolotl_rows,
        {"roles_to_train": ("assistant", "user")},
        AX + "    roles_to_train: [assistant, user]\n",
        4,
        None,
        None,
    ),
    (
        "LLaMA-Factory train_on_prompt false, mask_history false (defaults)",
        llamafactory_rows,
        {},
        LF.format(n=2048),
        4,
        None,
        None,
    ),
    (
        "LLaMA-Factory mask_history true",
        llamafactory_rows,
        {"mask_history": True},
        LF.format(n=2048) + "mask_history: true\n",
        4,
        None,
        None,
    ),
    (
        "LLaMA-Factory train_on_prompt true",
        llamafactory_rows,
        {"train_on_prompt": True},
        LF.format(n=2048) + "train_on_prompt: true\n",
        4,
        None,
        None,
    ),
    (
        "LLaMA-Factory cutoff_len 80 (rows cut inside a turn)",
        llamafactory_rows,
        {"cutoff_len": 80},
        LF.format(n=80),
        0,
        "truncation",
        "shortens a long row",
    ),
    (
        "torchtune train_on_input false (default)",
        torchtune_rows,
        {},
        TT.format(n=2048, extra=""),
        0,
        "loss_mask",
        "header",
    ),
    (
        "torchtune train_on_input true",
        torchtune_rows,
        {"train_on_input": True},
        TT.format(n=2048, extra="  train_on_input: true\n"),
        0,
        "loss_mask",
        "header",
    ),
    (
        "torchtune max_seq_len 80",
        torchtune_rows,
        {"max_seq_len": 80},
        TT.format(n=80, extra=""),
        0,
        "truncation",
        "EOS over its last token",
    ),
    (
        "axolotl train_on_eos last",
        axolotl_rows,
        {"train_on_eos": "last"},
        AX + "    train_on_eos: last\n",
        4,
        None,
        None,
    ),
    (
        "axolotl train_on_eos all",
        axolotl_rows,
        {"train_on_eos": "all"},
        AX + "    train_on_eos: all\n",
        4,
        None,
        None,
    ),
]


def gradian_rows(rs, tok, spec) -> dict:
    """``{id: (input_ids, labels)}`` from Gradian's tokenisation."""
    out = {}
    for i, r in enumerate(rs):
        it = tokenize_example(to_example(r, i, f"row {i}"), tok, spec)
        out[r["id"]] = (it.input_ids.tolist(), it.labels.tolist())
    return out


def equal_rows(ref: dict, ours: dict) -> int:
    """Rows whose input_ids are equal and whose targets agree after the first position (the causal shift drops
    the first label; Gradian writes -100 there)."""
    return sum(ids == ref[k][0] and lab[1:] == ref[k][1][1:] for k, (ids, lab) in ours.items())


@pytest.mark.parametrize("setting", SETTINGS, ids=[s[0] for s in SETTINGS])
def test_rows_match_the_framework_or_the_setup_says_why(setting, tok, tmp_path):
    name, rule, kw, cfg_text, want, unrep, phrase = setting
    p = tmp_path / "config.yaml"
    p.write_text(cfg_text)
    setup = resolve_setup(load_config(p), "messages")
    rs = rows(2)
    ref = rule(rs, tok, **kw)
    # the fixture has teeth: the framework supervises some tokens, and masks some unless the setting trains on the
    # whole prompt (a row cut short of its first answer may have no target at all, as in the framework)
    assert any(x != IGNORE_INDEX for _, lab in ref.values() for x in lab)
    trains_all = kw.get("train_on_prompt") or kw.get("train_on_input")
    assert trains_all or any(x == IGNORE_INDEX for _, lab in ref.values() for x in lab[1:])
    n = equal_rows(ref, gradian_rows(rs, tok, setup.tokenize_spec()))
    assert n == want, f"{name}: {n}/{len(rs)} rows equal"
    if n < len(rs):
        assert unrep in setup.unreproduced, setup.unreproduced
        assert any(phrase in note for note in setup.notes), setup.notes


def test_axolotl_settings_give_different_masks(tok, tmp_path):
    """The axolotl settings are not all one mask: each changes the labels, and Gradian follows each."""
    rs = rows(2)
    masks = set()
    for extra in ("", "train_on_inputs: true\n", "    train_on_eos: none\n", "    train_on_eos: last\n"):
        p = tmp_path / "ax.yaml"
        p.write_text(AX + extra)
        setup = resolve_setup(load_config(p), "messages")
        assert setup.train_roles is not None and "train_roles" in setup.to_dict()["values"]
        ours = gradian_rows(rs, tok, setup.tokenize_spec())
        masks.add(tuple(x != IGNORE_INDEX for x in ours["r0"][1][1:]))
    assert len(masks) == 4


def test_llamafactory_rules_read_from_the_config(tok, tmp_path):
    """The three LLaMA-Factory settings give three different masks, and Gradian follows each."""
    rs = rows(2)
    masks = set()
    for extra in ("", "mask_history: true\n", "train_on_prompt: true\n"):
        p = tmp_path / "lf.yaml"
        p.write_text(LF.format(n=2048) + extra)
        ours = gradian_rows(rs, tok, resolve_setup(load_config(p), "messages").tokenize_spec())
        masks.add(tuple(x != IGNORE_INDEX for x in ours["r0"][1][1:]))
    assert len(masks) == 3


def test_train_roles_in_the_index_identity_only_when_set():
    import json

    from gradian.data.tokenize import TokenizeSpec
    from gradian.errors import GradianUserError
    from gradian.index.store import GradSpec, index_id

    ax = GradSpec(tokenize=TokenizeSpec(loss_on="assistant", train_roles=("assistant",)))
    plain = GradSpec(tokenize=TokenizeSpec(loss_on="assistant"))
    assert "train_roles" not in plain.to_dict()["tokenize"] and "train_on_eos" not in plain.to_dict()["tokenize"]
    assert index_id({"g": ax.identity()}) != index_id({"g": plain.identity()})
    back = GradSpec.from_dict(json.loads(json.dumps(ax.to_dict())))
    assert back == ax and back.tokenize.train_roles == ("assistant",)
    with pytest.raises(GradianUserError, match="train_roles"):
        TokenizeSpec(train_roles=("",))
    with pytest.raises(GradianUserError, match="train_on_eos"):
        TokenizeSpec(train_on_eos="sometimes")
