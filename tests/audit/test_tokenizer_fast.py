"""The torch-free tokenizer loader (gradian.audit.tokenizer_fast) gives what AutoTokenizer gives, or falls back."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import import_module
from pathlib import Path

import pytest

from gradian.audit import context as C
from gradian.audit import diagnose
from gradian.audit import tokenizer_fast as F
from gradian.data.tokenize import TokenizeSpec, tokenize_example
from gradian_testlib import CHATML_GEN

GEN_TEMPLATE = CHATML_GEN  # ChatML with a {% generation %} block (assistant masks), as TRL's training templates have
TEXTS = [
    "The capital of France is Paris.",
    "  leading spaces, tabs\tand\nnew lines  ",
    "<|im_start|>user\nhi<|im_end|>\n<pad><|endoftext|>",
    "émigré naïve café — ünïcödé 東京",
    "",
]
MSGS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is the capital of Japan?"},
    {"role": "assistant", "content": "Tokyo."},
]


def _folder(tmp_path: Path, name: str, tok, cls: str | None, model_type: str | None, **extra) -> Path:
    d = tmp_path / name
    tok.save_pretrained(str(d))
    tc = json.loads((d / "tokenizer_config.json").read_text())
    if cls is not None:
        tc["tokenizer_class"] = cls
    tc.update(extra)
    (d / "tokenizer_config.json").write_text(json.dumps(tc))
    if model_type is not None:
        (d / "config.json").write_text(json.dumps({"model_type": model_type, "max_position_embeddings": 512}))
    return d


@pytest.fixture(scope="module")
def toks():
    from gradian.models.tiny import train_tokenizer
    from gradian_testlib import CORPUS

    plain = train_tokenizer(CORPUS, vocab_size=400)
    plain.chat_template = GEN_TEMPLATE
    bos = train_tokenizer(CORPUS, vocab_size=400, bos=True)
    return {"plain": plain, "bos": bos}


def test_table_matches_installed_transformers():
    """MODEL_TYPES / BACKEND_ID_ORGS / SPECIFIC are what the installed transformers' AutoTokenizer reads."""
    ta = pytest.importorskip("transformers.models.auto.tokenization_auto")
    if F._transformers_major() != 5:
        pytest.skip("the torch-free loader serves transformers 5.x only")
    for mt, (registered, overridden) in F.MODEL_TYPES.items():
        assert ta.TOKENIZER_MAPPING_NAMES.get(mt) == registered, mt
        assert (mt in ta.MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS) == overridden, mt
        assert registered != "MistralCommonBackend", mt
    for pat in ta.MODEL_IDS_TO_TOKENIZERS_BACKEND:
        assert pat.lower().startswith(F.BACKEND_ID_ORGS), pat
    for cls, mod in F.SPECIFIC.items():
        assert getattr(import_module(mod), cls) is ta.tokenizer_class_from_name(cls)
    for cls in F.GENERIC:
        assert ta.tokenizer_class_from_name(cls).__name__ == "TokenizersBackend"


SERVED = [  # (name, which tokenizer, tokenizer_class written, config.json model_type)
    ("as_saved", "plain", None, None),
    ("llama_cfg", "plain", None, "llama"),
    ("ptf_llama3_style", "plain", "PreTrainedTokenizerFast", "llama"),
    ("bos_llama", "bos", None, "llama"),
    ("gpt2_class_llama", "plain", "GPT2Tokenizer", "llama"),  # SmolLM2's shape
    ("qwen2_class", "plain", "Qwen2Tokenizer", "qwen2"),
    ("qwen3_fast_suffix", "plain", "Qwen2TokenizerFast", "qwen3"),
    ("generic_mistral", "plain", "TokenizersBackend", "mistral"),
]


@pytest.mark.parametrize("name,which,cls,mt", SERVED, ids=[s[0] for s in SERVED])
def test_fast_path_equals_autotokenizer(tmp_path, toks, name, which, cls, mt):
    """Same class, ids, offsets, special tokens, chat rendering (with assistant masks), TokenInfo, tokenize_example."""
    from transformers import AutoTokenizer

    from gradian.data.formats import to_example
    from gradian_testlib import ROWS

    d = _folder(tmp_path, name, toks[which], cls, mt)
    chosen, why = F.fast_tokenizer_class(d)
    assert chosen is not None, why
    kw = {"local_files_only": True, "trust_remote_code": False}
    fast = F.load_fast(d, kw)
    ref = AutoTokenizer.from_pretrained(str(d), **kw)
    assert type(fast) is type(ref)
    assert len(fast) == len(ref) and fast.get_vocab() == ref.get_vocab()
    for t in TEXTS:
        for special in (True, False):
            a = fast(t, add_special_tokens=special, return_offsets_mapping=True)
            b = ref(t, add_special_tokens=special, return_offsets_mapping=True)
            assert (a["input_ids"], a["offset_mapping"]) == (b["input_ids"], b["offset_mapping"]), (t, special)
    assert fast.all_special_tokens == ref.all_special_tokens
    assert (fast.eos_token_id, fast.bos_token_id, fast.pad_token_id) == (
        ref.eos_token_id,
        ref.bos_token_id,
        ref.pad_token_id,
    )
    assert fast.chat_template == ref.chat_template
    for gen in (False, True):
        assert fast.apply_chat_template(MSGS, tokenize=False, add_generation_prompt=gen) == ref.apply_chat_template(
            MSGS, tokenize=False, add_generation_prompt=gen
        )
    if "{% generation %}" in (ref.chat_template or ""):
        a = fast.apply_chat_template(MSGS, return_dict=True, return_assistant_tokens_mask=True)
        b = ref.apply_chat_template(MSGS, return_dict=True, return_assistant_tokens_mask=True)
        assert a["input_ids"] == b["input_ids"] and a["assistant_masks"] == b["assistant_masks"]
        assert 1 in b["assistant_masks"]
    assert C.token_info(fast, d) == C.token_info(ref, d)
    spec = TokenizeSpec(max_length=64)
    for r in ROWS:
        ex = to_example(dict(r), 0, "rows")
        x, y = tokenize_example(ex, fast, spec), tokenize_example(ex, ref, spec)
        assert (x.input_ids, x.labels, x.offsets) == (y.input_ids, y.labels, y.offsets), r["id"]


FALLBACK = [  # (name, tokenizer_class, model_type, extra tokenizer_config keys, remove tokenizer.json, why contains)
    ("llama_class", "LlamaTokenizer", "llama", {}, False, "not one the torch-free loader knows"),
    ("qwen2_overridden", "PreTrainedTokenizerFast", "qwen2", {}, False, "replaces"),
    ("gpt2_on_qwen2", "GPT2Tokenizer", "qwen2", {}, False, "registers Qwen2Tokenizer"),
    ("unknown_type", None, "brand_new_arch", {}, False, "model_type 'brand_new_arch'"),
    ("auto_map", None, "llama", {"auto_map": {"AutoTokenizer": ["x.Tok", None]}}, False, "auto_map"),
    ("slow_only", None, "llama", {}, True, "no tokenizer.json"),
]


@pytest.mark.parametrize("name,cls,mt,extra,drop,why", FALLBACK, ids=[f[0] for f in FALLBACK])
def test_fallback_cases(tmp_path, toks, name, cls, mt, extra, drop, why):
    """Folders the fast path does not serve say why and are loaded by AutoTokenizer (when it can load them)."""
    d = _folder(tmp_path, name, toks["plain"], cls, mt, **extra)
    if drop:
        (d / "tokenizer.json").unlink()
    chosen, reason = F.fast_tokenizer_class(d)
    assert chosen is None and why in reason, reason
    assert F.load_fast(d, {"local_files_only": True}) is None
    if name in ("qwen2_overridden", "gpt2_on_qwen2"):  # AutoTokenizer loads these; so does load_tokenizer_folder
        from transformers import AutoTokenizer

        tok = C.load_tokenizer_folder(d)
        ref = AutoTokenizer.from_pretrained(str(d), local_files_only=True)
        assert type(tok) is type(ref) and tok("Paris is big.")["input_ids"] == ref("Paris is big.")["input_ids"]


def test_same_report_as_autotokenizer(world, monkeypatch):
    """The audit report (findings, counts, token facts) is the same through either loader."""
    args = dict(data=world.data, eval=world.eval, configs=[world.config], logs=world.logs, versions=["trl=0.21.0"])
    assert F.fast_tokenizer_class(world.tok_dir)[0] == "TokenizersBackend"
    import gradian.audit.tokenizer_lite as lite

    monkeypatch.setattr(lite, "load_lite", lambda folder, kwargs: None)  # this loader, not the transformers-free one
    fast = diagnose(tokenizer=str(world.tok_dir), **args).to_dict()
    monkeypatch.setattr(F, "load_fast", lambda folder, kwargs: None)
    ref = diagnose(tokenizer=str(world.tok_dir), **args).to_dict()
    assert fast == ref
    assert fast["inputs"]["tokenizer"]["eos_token"] == "<|im_end|>"


def test_loading_does_not_import_torch(world):
    """A fresh process loads the tokenizer and renders a chat row without importing torch (nor AutoTokenizer)."""
    code = (
        "import sys\n"
        "from gradian.audit.context import token_info\n"
        "from gradian.audit.tokenizer_fast import load_fast\n"
        f"tok = load_fast({str(world.tok_dir)!r}, {{'local_files_only': True}})\n"
        "token_info(tok, None)\n"
        "tok.apply_chat_template([{'role': 'user', 'content': 'hi'}], tokenize=False, add_generation_prompt=True)\n"
        "print(type(tok).__name__, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["TokenizersBackend", "False"]
