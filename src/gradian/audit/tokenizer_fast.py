"""Load a local tokenizer folder without importing torch, where that gives what ``AutoTokenizer`` gives.

``transformers.AutoTokenizer`` imports ``transformers.configuration_utils``, which imports torch (about 2-4 s
of a fresh ``gradian diagnose --tokenizer``). The tokenizer classes themselves do not: the fast backend
(``transformers.tokenization_utils_tokenizers.TokenizersBackend``, which ``PreTrainedTokenizerFast`` is in
transformers 5) and the per-model modules such as ``transformers.models.gpt2.tokenization_gpt2`` import only
``tokenizers`` and jinja2. So for the folders where ``AutoTokenizer.from_pretrained`` (transformers 5.x) is
known to pick one of those classes, we call that class's ``from_pretrained`` ourselves; it is the same object
(same class, same ``tokenizer.json``, same special tokens and chat template). Everything else goes through
``AutoTokenizer`` (:func:`fast_tokenizer_class` says why).

The rule, read from ``AutoTokenizer.from_pretrained`` in transformers 5.24: with ``tokenizer_config.json``
naming the class and no ``auto_map`` (no remote code),

* a generic class (``TokenizersBackend`` / ``PreTrainedTokenizerFast``) loads ``TokenizersBackend`` unless the
  model type is one transformers overrides (``MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS`` with a model-specific
  registered class) or a Mistral-format model (``MistralCommonBackend``);
* a model-specific class loads that class when the model type registers no class or the same one (otherwise
  transformers may switch to the registered or the generic class);
* a hub id in ``config.json``'s ``_name_or_path`` matching ``MODEL_IDS_TO_TOKENIZERS_BACKEND`` forces the generic
  class.

:data:`MODEL_TYPES` records, for the model types served, what transformers registers for them;
``tests/audit/test_tokenizer_fast.py`` checks that table (and :data:`BACKEND_ID_ORGS`) against the installed
transformers, and compares the loaded tokenizers with ``AutoTokenizer``'s.
"""

from __future__ import annotations

import json
from importlib import import_module
from pathlib import Path
from typing import Any

#: Generic tokenizer classes: ``AutoTokenizer`` loads ``TokenizersBackend`` for them.
GENERIC = ("TokenizersBackend", "PreTrainedTokenizerFast")

#: Model-specific classes served, and the torch-free module that defines each.
SPECIFIC = {
    "GPT2Tokenizer": "transformers.models.gpt2.tokenization_gpt2",
    "Qwen2Tokenizer": "transformers.models.qwen2.tokenization_qwen2",
}

#: model_type -> (the tokenizer class transformers 5.24 registers for it or None, whether the model type is in
#: ``MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS``). Only these model types (and a folder without a model type) are
#: served; checked against the installed transformers by the tests.
MODEL_TYPES: dict[str, tuple[str | None, bool]] = {
    "llama": (None, False),
    "mistral": ("TokenizersBackend", False),
    "mixtral": ("TokenizersBackend", False),
    "qwen2": ("Qwen2Tokenizer", True),
    "qwen2_moe": ("Qwen2Tokenizer", False),
    "qwen3": ("Qwen2Tokenizer", False),
    "qwen3_moe": ("Qwen2Tokenizer", False),
    "gemma": ("GemmaTokenizer", False),
    "gemma2": ("GemmaTokenizer", False),
    "gemma3": ("GemmaTokenizer", False),
    "gemma3_text": ("GemmaTokenizer", False),
    "gpt2": ("GPT2Tokenizer", False),
    "phi": ("GPT2Tokenizer", False),
    "phi3": ("TokenizersBackend", True),
    "olmo2": ("TokenizersBackend", False),
    "granite": ("TokenizersBackend", False),
    "smollm3": (None, False),
    "starcoder2": ("GPT2Tokenizer", False),
}

#: The organisations of the hub ids in transformers' ``MODEL_IDS_TO_TOKENIZERS_BACKEND`` (a config whose
#: ``_name_or_path`` starts with one of them goes through ``AutoTokenizer``).
BACKEND_ID_ORGS = ("deepseek-ai/", "allenai/", "google/", "naver-clova-ix/", "salesforce/", "stepfun-ai/")


def json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in the file ``path``; None when it is missing, unreadable or not an object."""
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def _transformers_major() -> int | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return int(version("transformers").split(".")[0])
    except (PackageNotFoundError, ValueError):
        return None


def fast_tokenizer_class(folder: str | Path) -> tuple[str | None, str]:
    """The tokenizer class to load torch-free for ``folder``, or None, and why (one phrase).

    ``folder`` is a local directory; see the module docstring for the rule.
    """
    p = Path(folder)
    if _transformers_major() != 5:
        return None, "transformers is not 5.x"
    if not p.is_dir() or not (p / "tokenizer.json").is_file():
        return None, "no tokenizer.json (a slow-only or GGUF tokenizer)"
    tc = json_object(p / "tokenizer_config.json")
    if tc is None:
        return None, "no readable tokenizer_config.json"
    if "auto_map" in tc:
        return None, "tokenizer_config.json has an auto_map (custom code)"
    cls = tc.get("tokenizer_class")
    if not isinstance(cls, str):
        return None, "tokenizer_config.json names no tokenizer_class"
    cfg: dict[str, Any] = {}
    if (p / "config.json").exists():
        got = json_object(p / "config.json")
        if got is None:
            return None, "config.json is not a readable JSON object"
        cfg = got
    if "auto_map" in cfg:
        return None, "config.json has an auto_map (custom code)"
    name = cfg.get("_name_or_path")
    if isinstance(name, str) and name.lower().startswith(BACKEND_ID_ORGS):
        return None, f"config.json's _name_or_path {name!r} may be one transformers special-cases"
    mt = cfg.get("model_type")
    if mt in (None, ""):
        registered, overridden = None, False
    elif isinstance(mt, str) and mt in MODEL_TYPES:
        registered, overridden = MODEL_TYPES[mt]
    else:
        return None, f"model_type {mt!r} is not one the torch-free loader knows"
    if cls in GENERIC:
        if overridden and registered not in GENERIC:
            return None, f"transformers replaces {cls} by {registered} for model_type {mt!r}"
        return "TokenizersBackend", f"{cls} in tokenizer_config.json"
    base = cls.removesuffix("Fast")
    if base in SPECIFIC:
        if registered not in (None, base):
            return None, f"model_type {mt!r} registers {registered}, not {base}"
        return base, f"{cls} in tokenizer_config.json"
    return None, f"tokenizer_class {cls!r} is not one the torch-free loader knows"


def load_fast(folder: str | Path, kwargs: dict[str, Any]) -> Any | None:
    """The tokenizer of ``folder`` loaded without ``AutoTokenizer`` (so without torch), or None when not served.

    ``kwargs`` are ``from_pretrained``'s (``local_files_only``, ``trust_remote_code``). Errors propagate as from
    ``AutoTokenizer.from_pretrained``.
    """
    cls_name, _ = fast_tokenizer_class(folder)
    if cls_name is None:
        return None
    if cls_name == "TokenizersBackend":
        from transformers.tokenization_utils_tokenizers import TokenizersBackend as cls
    else:
        cls = getattr(import_module(SPECIFIC[cls_name]), cls_name)
    return cls.from_pretrained(str(folder), _from_auto=True, **kwargs)
