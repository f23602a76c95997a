"""Audit's assumed max length is ``gradian.defaults.MAX_LENGTH`` (one default per concept), its provenance unchanged."""

from __future__ import annotations

from gradian import defaults
from gradian.audit import context
from gradian.audit.config import TrainConfig
from gradian.audit.context import AuditContext


def _ctx(cfg):
    return AuditContext(None, None, cfg, None, None, None, {}, {})


def test_no_config_assumes_the_shared_default_with_its_provenance():
    assert not hasattr(context, "ASSUMED_MAX_LENGTH")  # no second copy of the value
    assert defaults.MAX_LENGTH == 1024
    assert _ctx(None).max_length() == (1024, "assumed: no config given, TRL SFTConfig's default max_length=1024")


def test_a_config_naming_no_trainer_assumes_it_too(monkeypatch):
    got = _ctx(TrainConfig()).max_length()
    assert got == (1024, "assumed: the config names no trainer, TRL's default max_length=1024")
    monkeypatch.setattr(context, "MAX_LENGTH", 2048)  # read at call time from the one imported default
    assert _ctx(None).max_length()[0] == 2048


def test_token_checks_tokenise_with_the_trainer_s_own_rule(tok, tmp_path):
    """A LLaMA-Factory ``template: qwen`` run: Audit's token rows are built by LLaMA-Factory's rule, as the gradients
    are, so a row without a system turn counts the default system prompt qwen writes on it; the prompt/target
    boundary check skips those rows (the rule encodes the pieces on their own: no boundary merge to find)."""
    from gradian.audit.config import load_config
    from gradian.data.formats import to_example
    from gradian.data.tokenize import TokenizeSpec, tokenize_example

    cfg = tmp_path / "lf.yaml"
    cfg.write_text("stage: sft\nfinetuning_type: lora\ncutoff_len: 512\ntemplate: qwen\n")
    msgs = [{"role": "user", "content": "What is the capital of Aland?"}, {"role": "assistant", "content": "Marven."}]
    exs = [to_example({"id": "r0", "messages": msgs}, 0, "t")]
    ctx = AuditContext(exs, None, load_config(cfg), None, tok, None, {}, {})
    assert ctx.token_spec.chat_rule == "llamafactory_qwen"
    row = ctx.token_rows[0].tx
    assert "You are Qwen, created by Alibaba Cloud." in row.text
    plain = tokenize_example(exs[0], tok, TokenizeSpec(max_length=10**6))
    assert len(row.input_ids) > len(plain.input_ids) + 10  # the default system prompt's tokens are counted
    assert ctx.prompt_token_lengths == [None]
    plain_ctx = AuditContext(exs, None, None, None, tok, None, {}, {})  # no config: the chat template, as before
    assert plain_ctx.token_spec.chat_rule is None and plain_ctx.token_rows[0].tx.text == plain.text
