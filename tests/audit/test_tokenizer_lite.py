"""The transformers-free tokenizer (gradian.audit.tokenizer_lite) answers as AutoTokenizer does, or is not used.

Every folder here is built in-test from a byte-level BPE tokenizer trained on the test corpus, saved as
transformers saves it, then edited the way published folders differ (HF-style ``added_tokens_decoder`` and
``special_tokens_map.json``, a template in ``tokenizer_config.json`` instead of ``chat_template.jinja``, a BOS
post-processor ...).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gradian.audit import context as C
from gradian.audit import diagnose
from gradian.audit import tokenizer_fast as F
from gradian.audit import tokenizer_lite as L
from gradian.data.formats import to_example
from gradian.data.tokenize import TokenizeSpec, assistant_spans, render_example, tokenize_example
from gradian_testlib import CHATML_GEN

pytest.importorskip("transformers")
if F._transformers_major() != 5:  # pragma: no cover
    pytest.skip("the transformers-free loader serves transformers 5.x folders only", allow_module_level=True)

GEN_TEMPLATE = CHATML_GEN  # ChatML with a {% generation %} block (assistant masks), as TRL's training templates have
#: namespace, loop controls, tojson (no HTML escaping), the special-token variables, raise_exception
FEATURE_TEMPLATE = """{{ bos_token }}{% set ns = namespace(n=0) %}
{% for m in messages %}
    {% if m['role'] == 'tool' %}{% continue %}{% endif %}
    {% set ns.n = ns.n + 1 %}
<|im_start|>{{ m['role'] }} {{ m | tojson }}
{{ m['content'] | trim }}{{ eos_token }}
    {% if ns.n > 5 %}{% break %}{% endif %}
{% endfor %}
{% if messages[0]['role'] == 'bad' %}{{ raise_exception('roles must be user/assistant') }}{% endif %}
{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
TEXTS = [
    "The capital of France is Paris.",
    "  leading spaces, tabs\tand\nnew lines  ",
    "<|im_start|>user\nhi<|im_end|>\n<pad><|endoftext|>",
    "émigré naïve café — ünïcödé 東京 <b>&amp;</b>",
    "",
]
MSGS = [
    {"role": "system", "content": "Be brief — café."},
    {"role": "user", "content": 'What is the capital of <Japan> & "why" (東京)?'},
    {"role": "assistant", "content": "Tokyo."},
    {"role": "tool", "content": "skipped"},
    {"role": "user", "content": "  And France?  "},
    {"role": "assistant", "content": "Paris."},
]
KW = {"local_files_only": True, "trust_remote_code": False}


@pytest.fixture(scope="module")
def toks():
    from gradian.models.tiny import train_tokenizer
    from gradian_testlib import CORPUS

    return {"plain": train_tokenizer(CORPUS, vocab_size=400), "bos": train_tokenizer(CORPUS, vocab_size=400, bos=True)}


def _folder(root: Path, name: str, tok, template=GEN_TEMPLATE, where="jinja", model_type="llama", hf=False, **extra):
    d = root / name
    tok = tok.__class__(tokenizer_object=tok.backend_tokenizer, **tok.special_tokens_map)
    tok.chat_template = template
    tok.save_pretrained(str(d))
    tc = json.loads((d / "tokenizer_config.json").read_text())
    if where == "config":  # the older layout: the template inside tokenizer_config.json
        (d / "chat_template.jinja").unlink()
        tc["chat_template"] = template
    elif where == "both":  # chat_template.jinja beats the config's
        tc["chat_template"] = "{{ 'the config template' }}"
    if hf:  # as many hub folders: added_tokens_decoder mirrored from tokenizer.json, a special_tokens_map.json
        added = json.loads((d / "tokenizer.json").read_text())["added_tokens"]
        tc["added_tokens_decoder"] = {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in added}
        tc.update(clean_up_tokenization_spaces=False, model_max_length=2048, padding_side="left", add_bos_token=True)
        (d / "special_tokens_map.json").write_text(json.dumps(tok.special_tokens_map))
    tc.update(extra)
    (d / "tokenizer_config.json").write_text(json.dumps(tc))
    if model_type is not None:
        (d / "config.json").write_text(json.dumps({"model_type": model_type, "max_position_embeddings": 512}))
    return d


SERVED = [  # (name, tokenizer, folder options)
    ("as_saved", "plain", {"model_type": None}),
    ("llama", "plain", {}),
    ("bos_post_processor", "bos", {}),
    ("hub_style", "plain", {"hf": True}),
    ("template_in_config", "plain", {"where": "config"}),
    ("jinja_beats_config", "plain", {"where": "both"}),
    ("feature_template", "bos", {"template": FEATURE_TEMPLATE}),
    ("ptf_class_mistral", "plain", {"model_type": "mistral", "tokenizer_class": "PreTrainedTokenizerFast"}),
    ("extra_specials", "plain", {"extra_special_tokens": ["<|im_start|>"]}),
]


def _both(d: Path):
    from transformers import AutoTokenizer

    lite = C.load_tokenizer_folder(d)
    assert isinstance(lite, L.LiteTokenizer), L.lite_reason(d)[1]
    return lite, AutoTokenizer.from_pretrained(str(d), **KW)


@pytest.mark.parametrize("name,which,opts", SERVED, ids=[s[0] for s in SERVED])
def test_lite_equals_autotokenizer(tmp_path, toks, name, which, opts):
    """The same Rust tokenizer state, vocabulary, special tokens, ids, offsets and chat rendering."""
    lite, ref = _both(_folder(tmp_path, name, toks[which], **opts))
    assert lite.backend_tokenizer.to_str() == ref.backend_tokenizer.to_str()  # the whole tokenizers pipeline
    assert len(lite) == len(ref) and lite.vocab_size == ref.vocab_size and lite.get_vocab() == ref.get_vocab()
    assert {i: repr(t) for i, t in lite.added_tokens_decoder.items()} == {
        i: repr(t) for i, t in ref.added_tokens_decoder.items()
    }
    assert lite.get_added_vocab() == ref.get_added_vocab()
    assert lite.all_special_tokens == ref.all_special_tokens and lite.special_tokens_map == ref.special_tokens_map
    for k in L.SPECIAL:
        assert (getattr(lite, k), getattr(lite, k + "_id")) == (getattr(ref, k), getattr(ref, k + "_id")), k
    assert (lite.model_max_length, lite.chat_template, lite.is_fast) == (ref.model_max_length, ref.chat_template, True)
    for special in (True, False):
        for t in TEXTS:
            a = lite(t, add_special_tokens=special, return_offsets_mapping=True)
            b = ref(t, add_special_tokens=special, return_offsets_mapping=True)
            assert (a["input_ids"], a["offset_mapping"], a["attention_mask"]) == (
                b["input_ids"],
                b["offset_mapping"],
                b["attention_mask"],
            ), (t, special)
        assert (
            lite(TEXTS, add_special_tokens=special)["input_ids"] == ref(TEXTS, add_special_tokens=special)["input_ids"]
        )
    ids = ref("Paris <pad> café")["input_ids"] + [len(ref) + 5]
    assert lite.convert_ids_to_tokens(ids[:-1]) == ref.convert_ids_to_tokens(ids[:-1])
    assert lite.convert_ids_to_tokens(ids[:-1], skip_special_tokens=True) == ref.convert_ids_to_tokens(
        ids[:-1], skip_special_tokens=True
    )
    assert lite.convert_ids_to_tokens(ids[0]) == ref.convert_ids_to_tokens(ids[0])
    for t in ("<|im_end|>", "<pad>", "not-a-token-xyz", ["<|im_start|>", "zzzq"]):
        assert lite.convert_tokens_to_ids(t) == ref.convert_tokens_to_ids(t), t
    for msgs in (MSGS[:3], MSGS, MSGS[1:2]):
        for gen in (False, True):
            a = lite.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
            assert a == ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
            b = lite.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen, chat_template=GEN_TEMPLATE)
            assert b == ref.apply_chat_template(
                msgs, tokenize=False, add_generation_prompt=gen, chat_template=GEN_TEMPLATE
            )
    assert C.token_info(lite, None) == C.token_info(ref, None)


def test_generation_spans_equal_transformers(tmp_path, toks):
    """``{% generation %}`` spans (TRL's assistant_masks) and the assistant-only labels built from them."""
    from transformers.utils.chat_template_utils import render_jinja_template

    lite, ref = _both(_folder(tmp_path, "gen", toks["plain"]))
    for msgs in (MSGS[:3], MSGS, MSGS[1:3]):
        want = render_jinja_template(
            conversations=[msgs],
            chat_template=GEN_TEMPLATE,
            return_assistant_tokens_mask=True,
            **ref.special_tokens_map,
        )
        assert lite.render_generation_spans(msgs, None) == want
        assert want[1][0]  # the assistant turns are marked
        text = ref.apply_chat_template(msgs, tokenize=False)
        assert assistant_spans(lite, msgs, text, "row") == assistant_spans(ref, msgs, text, "row")
        a = ref.apply_chat_template(msgs, return_dict=True, return_assistant_tokens_mask=True)
        spec = TokenizeSpec(max_length=4096, loss_on="assistant")
        ex = to_example({"id": "r", "messages": msgs}, 0, "rows")
        x, y = tokenize_example(ex, lite, spec), tokenize_example(ex, ref, spec)
        assert (x.input_ids, x.labels, x.offsets, x.text) == (y.input_ids, y.labels, y.offsets, y.text)
        sup = [int(lab != -100) for lab in x.labels]
        assert sup[1:] == a["assistant_masks"][1:]  # the first token is never a target


def test_template_errors_and_sandbox_match(tmp_path, toks):
    """raise_exception, an undefined-variable use and a sandbox escape fail with the same error text."""
    escape = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    ns = "{% set ns = namespace(_x=1) %}{{ ns }}"
    lite, ref = _both(_folder(tmp_path, "err", toks["bos"], template=FEATURE_TEMPLATE))
    for msgs, tpl in (([{"role": "bad", "content": "x"}], None), (MSGS[:2], escape), (MSGS[:2], ns)):
        errs = []
        for tok in (lite, ref):
            with pytest.raises(Exception) as e:
                tok.apply_chat_template(msgs, tokenize=False, chat_template=tpl)
            errs.append((type(e.value).__name__, str(e.value)))
        assert errs[0] == errs[1], errs


def test_other_calls_are_delegated_and_equal(tmp_path, toks):
    """Non-string messages, tokenize=True, decode: transformers' own tokenizer answers (loaded on first use)."""
    lite, ref = _both(_folder(tmp_path, "deleg", toks["plain"]))
    assert lite._full is None
    rich = [{"role": "user", "content": "hi", "meta": None}, {"role": "assistant", "content": "yo"}]
    assert lite.apply_chat_template(rich, tokenize=False) == ref.apply_chat_template(rich, tokenize=False)
    assert lite._full is not None  # delegated
    think = [{"role": "assistant", "content": "a", "reasoning_content": "b"}]
    assert lite.apply_chat_template(think, tokenize=False) == ref.apply_chat_template(think, tokenize=False)
    assert lite.apply_chat_template(MSGS[:3]) == ref.apply_chat_template(MSGS[:3])
    ids = ref("Paris is big.")["input_ids"]
    assert lite.decode(ids) == ref.decode(ids) and lite.padding_side == ref.padding_side
    assert lite("Paris", return_tensors=None, padding=False)["input_ids"] == ref("Paris")["input_ids"]


NOT_SERVED = [  # (name, folder options, what lite_reason says)
    ("unknown_key", {"add_prefix_space": True}, "sets 'add_prefix_space'"),
    ("split_special", {"split_special_tokens": True}, "split_special_tokens"),
    ("special_not_added", {"unk_token": "Paris"}, "is not a special added token"),
    ("dict_special", {"eos_token": {"content": "<|im_end|>", "__type": "AddedToken"}}, "not a plain string"),
    ("gpt2_class", {"tokenizer_class": "GPT2Tokenizer"}, "not a generic fast tokenizer"),
    ("custom_code", {"auto_map": {"AutoTokenizer": ["x.Tok", None]}}, "not a generic fast tokenizer"),
]


@pytest.mark.parametrize("name,opts,why", NOT_SERVED, ids=[n[0] for n in NOT_SERVED])
def test_folders_not_served_load_through_transformers(tmp_path, toks, name, opts, why):
    d = _folder(tmp_path, name, toks["plain"], **opts)
    spec, reason = L.lite_reason(d)
    assert spec is None and why in reason, reason
    if name != "custom_code":
        assert not isinstance(C.load_tokenizer_folder(d), L.LiteTokenizer)


def test_tokenizer_json_edits_not_served(tmp_path, toks):
    """A tokenizer.json with truncation, or without a post-processor (transformers builds one), is not served."""
    for name, edit, why in (
        (
            "trunc",
            {"truncation": {"max_length": 8, "strategy": "LongestFirst", "stride": 0, "direction": "Right"}},
            "truncation",
        ),
        ("no_post", {"post_processor": None}, "no post-processor"),
    ):
        d = _folder(tmp_path, name, toks["plain"])
        tj = json.loads((d / "tokenizer.json").read_text())
        tj.update(edit)
        (d / "tokenizer.json").write_text(json.dumps(tj))
        spec, reason = L.lite_reason(d)
        assert spec is None and why in reason, reason
    d = _folder(tmp_path, "no_added_decoder", toks["plain"])
    (d / "special_tokens_map.json").write_text("{}")
    assert "special_tokens_map.json" in L.lite_reason(d)[1]


def _reports(world, monkeypatch, **over):
    args = dict(data=world.data, eval=world.eval, configs=[world.config], logs=world.logs, versions=["trl=0.21.0"])
    args.update(over)
    assert L.lite_reason(world.tok_dir)[0] is not None, L.lite_reason(world.tok_dir)[1]
    lite = diagnose(tokenizer=str(world.tok_dir), **args).to_dict()
    import gradian.audit.tokenizer_lite as mod

    monkeypatch.setattr(mod, "load_lite", lambda folder, kwargs: None)
    fast = diagnose(tokenizer=str(world.tok_dir), **args).to_dict()
    monkeypatch.setattr(F, "load_fast", lambda folder, kwargs: None)
    auto = diagnose(tokenizer=str(world.tok_dir), **args).to_dict()
    return lite, fast, auto


def test_same_report_as_autotokenizer(world, monkeypatch):
    """The whole diagnose report is the same through the lite, the torch-free and the AutoTokenizer loaders."""
    lite, fast, auto = _reports(world, monkeypatch)
    assert lite == fast == auto
    assert lite["inputs"]["tokenizer"]["eos_token"] == "<|im_end|>" and lite["inputs"]["token_view"]


def test_same_report_with_assistant_only_loss_and_a_generation_template(world, tmp_path, monkeypatch):
    """Chat rows trained on assistant turns through a {% generation %} training template (C09 and the masks)."""
    rows = [
        {
            "id": r["id"],
            "messages": [
                {"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": r["prompt"].strip()},
                {"role": "assistant", "content": r["completion"]},
            ],
        }
        for r in world.rows_copy()
        if isinstance(r.get("prompt"), str)
    ]
    assert len(rows) > 20
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tpl = tmp_path / "tpl.jinja"
    tpl.write_text(GEN_TEMPLATE)
    cfg = tmp_path / "sft.yaml"
    cfg.write_text(f"assistant_only_loss: true\nchat_template_path: {tpl}\nlearning_rate: 2.0e-4\nuse_peft: true\n")
    lite, fast, auto = _reports(world, monkeypatch, data=data, configs=[cfg])
    assert lite == fast == auto
    assert "C09" not in [k["id"] for k in lite["skipped"]]  # the template check ran, on the generation template


def test_diagnose_imports_no_transformers(world):
    """A fresh process loads the folder, reads its facts, renders and tokenises rows without importing transformers."""
    code = (
        "import sys\n"
        "from gradian.audit.context import load_tokenizer_folder, token_info\n"
        f"tok = load_tokenizer_folder({str(world.tok_dir)!r})\n"
        "token_info(tok, None)\n"
        "s = tok.apply_chat_template([{'role': 'user', 'content': 'hi'}], tokenize=False, add_generation_prompt=True)\n"
        "tok([s, 'x'], add_special_tokens=False, return_offsets_mapping=True)\n"
        "print(type(tok).__name__, 'transformers' in sys.modules, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["LiteTokenizer", "False", "False"]


def test_batch_token_view_equals_tokenize_example_with_autotokenizer(world, monkeypatch):
    """Every row of the audit's batch token view through the lite tokenizer (prompts encoded without offsets) equals
    ``tokenize_example`` through AutoTokenizer, for plain and chat rows, completion-only and all-token loss."""
    from transformers import AutoTokenizer

    lite = C.load_tokenizer_folder(world.tok_dir)
    ref = AutoTokenizer.from_pretrained(str(world.tok_dir), **KW)
    be = lite.backend_tokenizer
    assert [e.ids for e in be.encode_batch_fast(TEXTS)] == [e.ids for e in be.encode_batch(TEXTS)]
    plain = [to_example(r, i, "rows") for i, r in enumerate(world.rows_copy())]
    chat = [
        to_example(
            {
                "id": r["id"],
                "prompt": [{"role": "user", "content": r["prompt"]}],
                "completion": [{"role": "assistant", "content": r["completion"]}],
            },
            i,
            "c",
        )
        for i, r in enumerate(world.rows_copy())
    ]
    for examples in (plain, chat):
        for loss_on in ("completion", "all"):
            spec = TokenizeSpec(max_length=C.UNBOUNDED, loss_on=loss_on)
            got = C.batch_tokenize(examples, lite, spec)
            for ex, (tx, err, plen) in zip(examples, got):
                want = tokenize_example(ex, ref, spec)
                assert err is None and (tx.input_ids, tx.labels, tx.offsets, tx.text, tx.prompt_length) == (
                    want.input_ids,
                    want.labels,
                    want.offsets,
                    want.text,
                    want.prompt_length,
                ), ex.id
                r = render_example(ex, ref, spec)
                want_plen = (
                    None
                    if r.prompt_text is None
                    else len(ref(r.prompt_text, add_special_tokens=r.add_special_tokens)["input_ids"])
                )
                assert plen == want_plen, ex.id
