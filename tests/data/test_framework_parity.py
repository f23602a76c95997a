"""axolotl / LLaMA-Factory / torchtune: Gradian's tokenisation under the setup resolved from each framework's config,
row by row against the framework's own rule (tests/data/framework_parity.py, written from the frameworks' source at
axolotl 0.19.0, LLaMA-Factory 0.9.5, torchtune 0.6.1; the frameworks themselves run in test_frameworks_real.py).

Where Gradian reproduces the rule (axolotl's content + EOS mask through ``TokenizeSpec.train_roles``, LLaMA-Factory's
three mask settings) every row is equal. Where it does not, no row is, and the setup must say so
(``unreproduced`` with a note naming the framework's rule): the gradients are never a silent approximation.
"""

from __future__ import annotations

import pytest
from framework_parity import (
    LLAMA3_TOKENS,
    axolotl_rows,
    llamafactory_rows,
    rows,
    torchtune_llama3_rows,
    torchtune_rows,
)

from gradian.audit.config import load_config
from gradian.data.formats import to_example
from gradian.data.setup import resolve_setup
from gradian.data.tokenize import IGNORE_INDEX, tokenize_example
from gradian.errors import GradianUserError

AX = (
    "base_model: x\nsequence_len: 2048\nadapter: lora\nexcess_length_strategy: truncate\n"
    "datasets:\n  - path: d.jsonl\n    type: chat_template\n"
)
LF = "stage: sft\nfinetuning_type: lora\ncutoff_len: {n}\ntemplate: qwen\n"
TT = "tokenizer:\n  _component_: {comp}\n{msl}dataset:\n  _component_: torchtune.datasets.chat_dataset\n{extra}"
QWEN2, QWEN25, LLAMA3 = (
    "torchtune.models.qwen2.qwen2_tokenizer",
    "torchtune.models.qwen2_5.qwen2_5_tokenizer",
    "torchtune.models.llama3.llama3_tokenizer",
)


def tt(comp=QWEN2, n=2048, extra=""):
    """A torchtune recipe's tokenizer and dataset sections (``n`` None: no ``max_seq_len``)."""
    return TT.format(comp=comp, msl="" if n is None else f"  max_seq_len: {n}\n", extra=extra)


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
        4,
        None,
        None,
    ),
    ("torchtune qwen2 train_on_input false (default)", torchtune_rows, {"max_seq_len": 2048}, tt(), 4, None, None),
    (
        "torchtune qwen2 train_on_input true",
        torchtune_rows,
        {"train_on_input": True, "max_seq_len": 2048},
        tt(extra="  train_on_input: true\n"),
        4,
        None,
        None,
    ),
    ("torchtune qwen2 max_seq_len 80", torchtune_rows, {"max_seq_len": 80}, tt(n=80), 4, None, None),
    ("torchtune qwen2 max_seq_len unset (EOS trained)", torchtune_rows, {}, tt(n=None), 4, None, None),
    ("torchtune qwen2_5 max_seq_len 80", torchtune_rows, {"max_seq_len": 80}, tt(QWEN25, 80), 4, None, None),
    (
        "torchtune llama3 train_on_input false (default)",
        torchtune_llama3_rows,
        {"max_seq_len": 2048},
        tt(LLAMA3),
        4,
        None,
        None,
    ),
    (
        "torchtune llama3 train_on_input true",
        torchtune_llama3_rows,
        {"train_on_input": True, "max_seq_len": 2048},
        tt(LLAMA3, extra="  train_on_input: true\n"),
        4,
        None,
        None,
    ),
    ("torchtune llama3 max_seq_len 80", torchtune_llama3_rows, {"max_seq_len": 80}, tt(LLAMA3, 80), 4, None, None),
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


@pytest.fixture(scope="module")
def tok_llama3(tok):
    """The test tokenizer with the Llama-3 special tokens torchtune's Llama3Tokenizer writes (a copy)."""
    import copy

    t = copy.deepcopy(tok)
    t.add_special_tokens({"additional_special_tokens": LLAMA3_TOKENS})
    return t


@pytest.mark.parametrize("setting", SETTINGS, ids=[s[0] for s in SETTINGS])
def test_rows_match_the_framework_or_the_setup_says_why(setting, tok, tok_llama3, tmp_path):
    name, rule, kw, cfg_text, want, unrep, phrase = setting
    if rule is torchtune_llama3_rows:
        tok = tok_llama3
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
    if kw.get("max_seq_len") == 80:  # the cut lands inside the rows, so the truncation rule is what is tested
        assert all(len(ids) == 80 for ids, _ in ref.values())
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


def test_torchtune_rule_from_the_tokenizer_component(tok, tmp_path):
    """The recipe's tokenizer family names the rule; a family Gradian does not implement stays not reproduced, and
    settings the rule does not take are stated."""
    p = tmp_path / "tt.yaml"
    p.write_text(tt())
    s = resolve_setup(load_config(p), "messages")
    assert s.chat_rule == "torchtune_qwen2" and s.eos_truncate and not s.unreproduced, (s.unreproduced, s.notes)
    assert "Qwen2Tokenizer.tokenize_messages" in s.sources["chat_rule"] and "chat_rule" in s.to_dict()["values"]
    p.write_text(tt(n=None))
    s = resolve_setup(load_config(p), "messages")
    assert s.chat_rule == "torchtune_qwen2" and not s.eos_truncate
    p.write_text(tt("torchtune.models.mistral.mistral_tokenizer"))
    s = resolve_setup(load_config(p), "messages")
    assert s.chat_rule is None and "loss_mask" in s.unreproduced and "truncation" in s.unreproduced
    assert any("mistral_tokenizer" in n and "header" in n for n in s.notes), s.notes
    p.write_text(tt(extra="  new_system_prompt: Be terse.\n"))
    s = resolve_setup(load_config(p), "messages")
    assert s.chat_rule == "torchtune_qwen2" and "loss_mask" in s.unreproduced
    assert any("new_system_prompt" in n for n in s.notes)
    # plain rows are not chat rows: no rule (and a TRL config never gets one)
    p.write_text(tt())
    assert resolve_setup(load_config(p), "prompt_completion").chat_rule is None


def test_torchtune_rule_differs_from_the_chat_template_and_is_in_the_index_id(tok):
    """The rule changes the tokens (so the parity above is not the template's), and enters the index identity only
    when set."""
    from gradian.data.tokenize import TokenizeSpec
    from gradian.index.store import GradSpec, index_id

    rs = rows(2)
    plain = gradian_rows(rs, tok, TokenizeSpec(loss_on="assistant"))
    ruled = gradian_rows(rs, tok, TokenizeSpec(loss_on="assistant", chat_rule="torchtune_qwen2"))
    assert all(plain[k] != ruled[k] for k in plain)
    assert "chat_rule" not in GradSpec(tokenize=TokenizeSpec()).to_dict()["tokenize"]
    a = GradSpec(tokenize=TokenizeSpec(chat_rule="torchtune_qwen2"))
    b = GradSpec(tokenize=TokenizeSpec(chat_rule="torchtune_qwen2", eos_truncate=True))
    assert len({index_id({"g": x.identity()}) for x in (GradSpec(), a, b)}) == 3
    assert GradSpec.from_dict(a.to_dict()) == a
    with pytest.raises(GradianUserError, match="chat_rule"):
        TokenizeSpec(chat_rule="torchtune_gemma")
    # a tokenizer without the family's special tokens is one line, naming the token
    with pytest.raises(GradianUserError, match="begin_of_text"):
        gradian_rows(rs, tok, TokenizeSpec(chat_rule="torchtune_llama3"))
