"""``--base`` resolution fails fast and names the mistake (issue 22): no network retry for an uncached
HF id, and an adapter folder passed as the base is named as one, with its base and the fix."""

from __future__ import annotations

import json
import time

import pytest

from gradian.errors import GradianUserError
from gradian.models.load import ModelSpec, load_base, load_tokenizer, resolve_base


def _no_hub(monkeypatch):
    """Fail the test if anything reaches transformers' loaders (they would try the network)."""
    import transformers

    def boom(*a, **k):
        raise AssertionError("from_pretrained was called")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", boom)


def test_uncached_hf_id_fails_at_once_without_network(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    _no_hub(monkeypatch)
    import huggingface_hub
    import requests

    def no_net(*a, **k):
        raise AssertionError("network was used")

    monkeypatch.setattr(requests.Session, "request", no_net)
    t0 = time.perf_counter()
    for fn in (load_base, load_tokenizer):
        with pytest.raises(GradianUserError, match="not in the local cache") as e:
            fn(ModelSpec(base="SomeOrg/not-cached-model"))
        assert "--base SomeOrg/not-cached-model" in str(e.value) and "\n" not in str(e.value)
    assert time.perf_counter() - t0 < 5
    assert huggingface_hub.try_to_load_from_cache("SomeOrg/not-cached-model", "config.json") is None


def test_cached_hf_id_loads_local_files_only(monkeypatch, tmp_path):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, name, **k: str(tmp_path / name))
    base, kw = resolve_base(ModelSpec(base="SomeOrg/cached-model"))
    assert base == "SomeOrg/cached-model" and kw == {"local_files_only": True}


def test_missing_local_path_is_not_looked_up_as_an_id(monkeypatch, tmp_path):
    _no_hub(monkeypatch)
    with pytest.raises(GradianUserError, match="base model folder not found"):
        resolve_base(ModelSpec(base=str(tmp_path / "nope")))


@pytest.mark.parametrize("named", [True, False])
def test_adapter_folder_as_base_is_named_with_its_base(monkeypatch, tmp_path, named):
    _no_hub(monkeypatch)
    ad = tmp_path / "out"
    ad.mkdir()
    cfg = {"peft_type": "LORA", "r": 4, "target_modules": ["q_proj"]}
    if named:
        cfg["base_model_name_or_path"] = "HuggingFaceTB/SmolLM2-135M"
    (ad / "adapter_config.json").write_text(json.dumps(cfg))
    for fn in (load_base, load_tokenizer):
        with pytest.raises(GradianUserError, match="LoRA adapter folder") as e:
            fn(ModelSpec(base=str(ad)))
        msg = str(e.value)
        if named:
            assert "'HuggingFaceTB/SmolLM2-135M'" in msg
            assert f"--base HuggingFaceTB/SmolLM2-135M --adapter {ad}" in msg
        else:
            assert f"--adapter {ad}" in msg


def test_real_base_folder_still_loads(saved_finetune):
    model, tok = load_base(ModelSpec(base=str(saved_finetune["base"])))
    assert tok.pad_token is not None and model.config.vocab_size >= len(tok)


def test_cli_adapter_as_base_exit_2(saved_finetune, tmp_path):
    from typer.testing import CliRunner

    from gradian.cli import app

    ev = tmp_path / "eval.jsonl"
    ev.write_text(json.dumps({"prompt": "q", "answer": "a", "capability": "c"}) + "\n")
    ad = saved_finetune["adapter"]
    r = CliRunner().invoke(app, ["evaluate", "--base", str(ad), "--adapter", str(ad), "--eval", str(ev)])
    assert r.exit_code == 2, r.output
    assert "LoRA adapter folder" in r.output and "Traceback" not in r.output
