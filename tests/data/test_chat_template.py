"""The run's training chat template renders chat rows (issue 22): TokenizeSpec.chat_template, its place in the index
identity, and where the training setup finds it (the template saved beside the adapter, the config)."""

from __future__ import annotations

import json

import pytest

from gradian.data.formats import to_example
from gradian.data.setup import adapter_template, resolve_setup
from gradian.data.tokenize import IGNORE_INDEX, TokenizeSpec, tokenize_example, with_chat_template
from gradian.errors import GradianUserError
from gradian.index.store import GradSpec, index_id

#: a template that renders differently from the fixture tokenizer's ChatML (role headers in brackets)
OTHER = (
    "{% for m in messages %}{{ '[' + m['role'] + '] ' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '[assistant] ' }}{% endif %}"
)
ROW = {
    "id": "m0",
    "messages": [
        {"role": "user", "content": "What is the capital of Aland?"},
        {"role": "assistant", "content": "It is Marven."},
    ],
}


def _tok(tok, spec):
    return tokenize_example(to_example(ROW, 0, "row 0"), tok, spec)


def test_spec_template_renders_the_rows(tok):
    plain = _tok(tok, TokenizeSpec())
    other = _tok(tok, TokenizeSpec(chat_template=OTHER))
    assert other.text.startswith("[user] What is the capital of Aland?<|im_end|>\n[assistant] It is Marven.")
    assert plain.text.startswith("<|im_start|>user\n") and other.input_ids != plain.input_ids
    # the completion is still the only supervised part: the final assistant turn and its end-of-turn
    sup = tok.decode([x for x in other.labels if x != IGNORE_INDEX])
    assert sup.strip() == "It is Marven.<|im_end|>"
    # the same as a tokenizer that carries the template itself
    carried = _tok(with_chat_template(tok, OTHER), TokenizeSpec())
    assert (carried.input_ids, carried.labels) == (other.input_ids, other.labels)
    assert tok.chat_template != OTHER  # with_chat_template leaves the caller's tokenizer as it was


def test_spec_template_assistant_turns(tok):
    row = {**ROW, "messages": ROW["messages"] + [{"role": "user", "content": "Again?"}, ROW["messages"][1]]}
    it = tokenize_example(to_example(row, 0, "row 0"), tok, TokenizeSpec(loss_on="assistant", chat_template=OTHER))
    sup = tok.decode([x for x in it.labels if x != IGNORE_INDEX])
    assert sup.count("It is Marven.") == 2 and "Again" not in sup and "capital" not in sup


def test_template_that_rejects_a_row_is_one_line(tok):
    bad = "{{ raise_exception('only system turns') }}"
    with pytest.raises(GradianUserError, match="run's chat template rejected"):
        _tok(tok, TokenizeSpec(chat_template=bad))
    with pytest.raises(GradianUserError, match="non-empty Jinja template"):
        TokenizeSpec(chat_template="")


def test_two_templates_give_two_index_ids(tok):
    ids = {
        name: index_id({"grad_spec": GradSpec(tokenize=TokenizeSpec(chat_template=t)).identity()})
        for name, t in (("none", None), ("other", OTHER), ("own", tok.chat_template))
    }
    assert len(set(ids.values())) == 3
    # no template: the spec's dict (and so every index id) is what it was before the field existed
    assert GradSpec().to_dict()["tokenize"] == {"max_length": 1024, "loss_on": "completion", "add_eos": True}
    # the tokenizer's own template is no override: dropped, so the id is the one without a template
    own = TokenizeSpec(chat_template=tok.chat_template).for_tokenizer(tok)
    assert own == TokenizeSpec() and index_id({"grad_spec": GradSpec(tokenize=own).identity()}) == ids["none"]
    assert TokenizeSpec(chat_template=OTHER).for_tokenizer(tok).chat_template == OTHER
    # the manifest's spec reads back with its template
    d = GradSpec(tokenize=TokenizeSpec(chat_template=OTHER)).to_dict()
    assert GradSpec.from_dict(json.loads(json.dumps(d))).tokenize.chat_template == OTHER


def test_two_templates_build_two_indexes(saved_finetune, tmp_path):
    """Two templates, two indexes: a cached index built with another template is never reused."""
    from gradian.finetune import load_finetune, training_index
    from gradian.models.load import ModelSpec

    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({**ROW, "id": f"m{i}"}) + "\n" for i in range(3)))
    ft = load_finetune(ModelSpec(str(saved_finetune["base"])), saved_finetune["adapter"])
    built = {}
    for name, t in (("own", None), ("other", OTHER)):
        spec = GradSpec(tokenize=TokenizeSpec(chat_template=t))
        idx, _, items, reused = training_index(ft, data, spec, parent=tmp_path / "idx")
        built[name] = (idx.id, reused, items[0].text)
    assert built["own"][0] != built["other"][0]
    assert not built["other"][1]  # built, not the other template's index reused
    assert built["other"][2].startswith("[user]") and built["own"][2].startswith("<|im_start|>")
    _, _, _, again = training_index(
        ft, data, GradSpec(tokenize=TokenizeSpec(chat_template=OTHER)), parent=tmp_path / "idx"
    )
    assert again  # the same template: the same index, reused


def test_setup_reads_the_template_saved_beside_the_adapter(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    assert adapter_template(out) is None
    (out / "tokenizer_config.json").write_text(json.dumps({"chat_template": OTHER}))
    assert adapter_template(out) == (OTHER, f"{out / 'tokenizer_config.json'}: chat_template")
    (out / "chat_template.jinja").write_text(OTHER + " ")
    assert adapter_template(out)[0] == OTHER + " "  # chat_template.jinja first (transformers >= 4.54)
    # a run folder holding only checkpoints: the last checkpoint's
    only = tmp_path / "only"
    for step, t in ((2, "{{ 'two' }}"), (10, "{{ 'ten' }}")):
        (only / f"checkpoint-{step}").mkdir(parents=True)
        (only / f"checkpoint-{step}" / "chat_template.jinja").write_text(t)
    assert adapter_template(only)[0] == "{{ 'ten' }}"
    # no --config: Gradian's defaults, and the saved template
    s = resolve_setup(None, "messages", saved_template=adapter_template(out))
    assert s.tokenize_spec().chat_template == OTHER + " " and s.sources["chat_template"].endswith("chat_template.jinja")
    assert resolve_setup(None, "messages").tokenize_spec() == TokenizeSpec()


def _cfg(tmp_path, body: dict, name="sft.json"):
    from gradian.audit.config import load_config

    p = tmp_path / name
    p.write_text(json.dumps(body))
    return load_config([str(p)])


def test_setup_template_from_the_config(tmp_path):
    (tmp_path / "train.jinja").write_text(OTHER)
    c = _cfg(tmp_path, {"chat_template_path": "train.jinja", "max_length": 64})
    s = resolve_setup(c, "messages")
    assert s.tokenize_spec().chat_template == OTHER and "chat_template" not in s.unreproduced
    assert "chat_template_path" in s.sources["chat_template"]
    # the template saved beside the adapter beats the config's (it is what the trainer's tokenizer held)
    s2 = resolve_setup(c, "messages", saved_template=("{{ 'saved' }}", "OUT/chat_template.jinja"))
    assert (
        s2.tokenize_spec().chat_template == "{{ 'saved' }}" and s2.sources["chat_template"] == "OUT/chat_template.jinja"
    )


def test_setup_template_name_is_not_reproduced(tmp_path):
    c = _cfg(tmp_path, {"chat_template_path": "Qwen/Qwen3-0.6B", "max_length": 64})
    s = resolve_setup(c, "messages")
    assert s.chat_template == "Qwen/Qwen3-0.6B" and "chat_template" in s.unreproduced
    assert s.tokenize_spec().chat_template is None
    assert any(n.startswith("chat_template:") and "Qwen/Qwen3-0.6B" in n for n in s.notes)
