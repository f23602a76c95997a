"""A tokenizer folder read with ``tokenizers`` and jinja2 alone, where that is provably what ``AutoTokenizer`` loads.

``import transformers`` costs 0.4-0.8 s of a fresh ``gradian diagnose --tokenizer`` (its lazy-module table and
``transformers.utils``), even without torch. For the folders :func:`lite_reason` accepts, :class:`LiteTokenizer`
holds the same Rust tokenizer ``TokenizersBackend.from_pretrained`` (transformers 5.24) builds and answers the calls
Audit makes itself; any other attribute or call loads the transformers tokenizer (:func:`gradian.audit.tokenizer_fast
.load_fast`) on first use and delegates to it, so nothing it does not implement can differ.

What ``TokenizersBackend.from_pretrained`` does with such a folder (read from transformers 5.24's
``tokenization_utils_base._from_pretrained`` and ``tokenization_utils_tokenizers.TokenizersBackend.__init__``):
``Tokenizer.from_file("tokenizer.json")``; no truncation or padding (only served when ``tokenizer.json`` has
none); ``add_bos_token`` / ``add_eos_token`` from the config are dropped when a ``tokenizer.json`` exists; the
post-processor is rebuilt only when ``tokenizer.json`` has none (then not served); the named special tokens are
added to the backend unless already there (only served when every one is already an added *special* token of
``tokenizer.json``, so adding it again changes nothing); the Mistral regex patch applies above 100,000 tokens (not
served); ``chat_template.jinja`` beats the config's ``chat_template``. :func:`lite_reason` accepts only the
``tokenizer_config.json`` keys whose effect is listed here (:data:`CONFIG_KEYS`).

Chat templates are rendered as ``apply_chat_template(tokenize=False)`` renders them: transformers' sandboxed
environment (``ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`` with the ``generation`` tag and
``loopcontrols``; ``tojson`` without HTML escaping, ``raise_exception``, ``strftime_now``, the restricted ``dict`` and
``namespace``), the special-tokens map as template variables, ``tools`` and ``documents`` None. Only conversations
of plain string messages are rendered here (:func:`_plain_messages`); anything else goes to transformers.

``tests/audit/test_tokenizer_lite.py`` compares every served call with ``AutoTokenizer``'s on tokenizers trained
in-test (ids, offsets, rendered templates, ``{% generation %}`` spans, the full ``diagnose`` report).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

#: transformers' named special-token attributes, in its order (``SPECIAL_TOKENS_ATTRIBUTES``)
SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
#: ``tokenizer_config.json`` keys whose effect on a ``TokenizersBackend`` is reproduced (or is none on what Audit
#: reads: the padding/truncation sides and input names; ``add_bos_token``/``add_eos_token`` are dropped by transformers
#: when ``tokenizer.json`` exists; ``clean_up_tokenization_spaces`` only changes ``decode``, which is delegated)
CONFIG_KEYS = frozenset(
    {
        *SPECIAL,
        "backend",
        "tokenizer_class",
        "model_max_length",
        "chat_template",
        "added_tokens_decoder",
        "extra_special_tokens",
        "additional_special_tokens",
        "clean_up_tokenization_spaces",
        "padding_side",
        "truncation_side",
        "model_input_names",
        "add_bos_token",
        "add_eos_token",
        "split_special_tokens",
    }
)
#: transformers' ``VERY_LARGE_INTEGER``: the model_max_length of a config that names none
VERY_LARGE_INTEGER = int(1e30)
#: message keys transformers 5.24 copies reasoning under (``_alias_reasoning_fields``): such messages are delegated
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_ADDED_KEYS = ("content", "single_word", "lstrip", "rstrip", "normalized", "special")


def lite_reason(folder: str | Path) -> tuple[dict[str, Any] | None, str]:
    """What :class:`LiteTokenizer` needs to load ``folder`` (None when it does not serve it), and why (one phrase)."""
    from gradian.audit.tokenizer_fast import fast_tokenizer_class, json_object

    p = Path(folder)
    cls, why = fast_tokenizer_class(p)
    if cls != "TokenizersBackend":
        return None, f"not a generic fast tokenizer ({why})"
    try:
        import jinja2
    except ImportError:
        return None, "jinja2 is not installed"
    if tuple(int(x) for x in jinja2.__version__.split(".")[:3] if x.isdigit()) < (3, 1, 6):
        return None, "jinja2 < 3.1.6 (transformers refuses it)"
    if (p / "additional_chat_templates").exists() or (p / "chat_template.json").exists():
        return None, "several chat templates"
    tc = json_object(p / "tokenizer_config.json")
    other = sorted(set(tc) - CONFIG_KEYS)
    if other:
        return None, f"tokenizer_config.json sets {other[0]!r}"
    if tc.get("split_special_tokens", False) is not False:
        return None, "split_special_tokens is set"
    if "added_tokens_decoder" not in tc and any(
        (p / f).exists() for f in ("special_tokens_map.json", "added_tokens.json")
    ):
        return None, "special_tokens_map.json / added_tokens.json without added_tokens_decoder"
    tj = json_object(p / "tokenizer.json")
    if not isinstance(tj, dict) or tj.get("truncation") is not None or tj.get("padding") is not None:
        return None, "tokenizer.json sets truncation or padding (or is unreadable)"
    if tj.get("post_processor") is None:
        return None, "tokenizer.json has no post-processor (transformers builds one)"
    added = {}
    for t in tj.get("added_tokens") or []:
        if not isinstance(t, dict) or not isinstance(t.get("id"), int):
            return None, "tokenizer.json's added_tokens are not id/content objects"
        added[t["id"]] = {k: t.get(k) for k in _ADDED_KEYS}
    by_content = {t["content"]: t for t in added.values()}
    atd = tc.get("added_tokens_decoder", {})
    if not isinstance(atd, dict) or any(
        not isinstance(v, dict) or not k.isdigit() or added.get(int(k)) != {x: v.get(x) for x in _ADDED_KEYS}
        for k, v in atd.items()
    ):
        return None, "tokenizer_config.json's added_tokens_decoder differs from tokenizer.json's added tokens"
    specials: dict[str, str] = {}
    for key in SPECIAL:
        v = tc.get(key)
        if v is None:
            continue
        if not isinstance(v, str):
            return None, f"{key} is not a plain string"
        specials[key] = v
    extra = tc.get("extra_special_tokens", tc.get("additional_special_tokens")) or []
    if not isinstance(extra, list) or not all(isinstance(x, str) for x in extra):
        return None, "extra special tokens are not a list of strings"
    for s in [*specials.values(), *extra]:
        t = by_content.get(s)
        if t is None or not t["special"]:
            return None, f"special token {s!r} is not a special added token of tokenizer.json (transformers adds it)"
    mml = tc.get("model_max_length", VERY_LARGE_INTEGER)
    if isinstance(mml, bool) or not isinstance(mml, int):
        return None, "model_max_length is not a whole number"
    template = tc.get("chat_template")
    if (p / "chat_template.jinja").is_file():
        try:
            template = (p / "chat_template.jinja").read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None, "chat_template.jinja is unreadable"
    if template is not None and not isinstance(template, str):
        return None, "chat_template is not one string"
    return {"specials": specials, "extra": list(extra), "model_max_length": mml, "chat_template": template}, "served"


# ---------------------------------------------------------------------------------------------- chat templates
@lru_cache(maxsize=16)
def compile_template(template: str):
    """``template`` compiled in the environment transformers 5.24 compiles chat templates in (module docstring)."""
    import jinja2
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        """``{% generation %}...{% endgeneration %}``: renders its body; while tracking, records its character span."""

        tags = {"generation"}

        def __init__(self, environment):
            super().__init__(environment)
            self._spans: ContextVar[Any] = ContextVar("gradian_generation_spans", default=None)
            environment.extend(track_generation=self.track)

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_mark"), [], [], body).set_lineno(lineno)

        def _mark(self, caller):
            out = caller()
            state = self._spans.get()
            if state is not None:
                blocks, spans = state
                start = sum(len(b) for b in blocks)
                spans.append((start, start + len(out)))
            return out

        @contextmanager
        def track(self, blocks: list[str], spans: list[tuple[int, int]]):
            token = self._spans.set((blocks, spans))
            try:
                yield
            finally:
                self._spans.reset(token)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    class Dict:
        """``dict(...)`` and ``dict.fromkeys(...)`` only."""

        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}. "
                "Please rename the attribute."
            )

    class Namespace(jinja2.utils.Namespace):
        """jinja2's namespace refusing underscore-prefixed names."""

        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                _check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            _check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = Dict()
    env.globals["namespace"] = Namespace
    return env.from_string(template)


def _plain_messages(conversation: Any) -> list[dict[str, str]] | None:
    """Fresh copies of the messages when every one is a dict of exact ``str`` keys and values (no reasoning fields),
    which transformers' normalisation (``_normalize_chat_messages``, ``_plain_template_data``,
    ``_alias_reasoning_fields``) passes through unchanged; else None.
    """
    if not isinstance(conversation, list) or not conversation:
        return None
    out = []
    for m in conversation:
        if type(m) is not dict or any(type(k) is not str or type(v) is not str for k, v in m.items()):
            return None
        if any(f in m for f in REASONING_FIELDS):
            return None
        out.append(dict(m))
    return out


class LiteTokenizer:
    """A ``TokenizersBackend`` look-alike over ``tokenizers.Tokenizer`` (see the module docstring).

    Served here: ``__call__`` (text or list of texts; ``add_special_tokens``, ``return_offsets_mapping``),
    ``apply_chat_template(tokenize=False)``, :meth:`render_generation_spans`, ``__len__``, the special tokens and
    their ids, ``special_tokens_map``, ``all_special_tokens``, ``added_tokens_decoder``, ``get_added_vocab``,
    ``get_vocab``, ``convert_tokens_to_ids``, ``convert_ids_to_tokens``, ``backend_tokenizer``, ``chat_template``,
    ``model_max_length``. Everything else: the transformers tokenizer, loaded on first use.
    """

    is_fast = True
    split_special_tokens = False

    def __init__(self, folder: str | Path, spec: dict[str, Any], load_kwargs: dict[str, Any]):
        from tokenizers import Tokenizer

        self._folder = str(folder)
        self._load_kwargs = dict(load_kwargs)
        self._full = None
        self._tok = Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))
        self._specials: dict[str, str] = dict(spec["specials"])
        self._extra: list[str] = list(spec["extra"])
        self.name_or_path = self._folder
        self.model_max_length: int = spec["model_max_length"]
        self.chat_template: str | None = spec["chat_template"]

    # ---------------------------------------------------------------- delegation
    def transformers_tokenizer(self):
        """The tokenizer ``AutoTokenizer`` loads for this folder (transformers imported now, once)."""
        if self._full is None:
            from gradian.audit.tokenizer_fast import load_fast

            full = load_fast(self._folder, self._load_kwargs)
            if full is None:  # pragma: no cover - lite_reason accepted the folder through the same rule
                from transformers import AutoTokenizer

                full = AutoTokenizer.from_pretrained(self._folder, **self._load_kwargs)
            full.chat_template = self.chat_template  # a caller may have set another one here
            self._full = full
        return self._full

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.transformers_tokenizer(), name)

    # ---------------------------------------------------------------- vocabulary
    @property
    def backend_tokenizer(self):
        """The Rust tokenizer (``tokenizers.Tokenizer``)."""
        return self._tok

    def __len__(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def vocab_size(self) -> int:
        """Base vocabulary size, without the added tokens."""
        return self._tok.get_vocab_size(with_added_tokens=False)

    def get_vocab(self) -> dict[str, int]:
        """Token -> id, added tokens included."""
        return self._tok.get_vocab(with_added_tokens=True)

    @property
    def added_tokens_decoder(self) -> dict:
        """Id -> ``tokenizers.AddedToken``."""
        return self._tok.get_added_tokens_decoder()

    def get_added_vocab(self) -> dict[str, int]:
        """Added token -> id, in id order."""
        return {t.content: i for i, t in sorted(self.added_tokens_decoder.items(), key=lambda x: x[0])}

    def convert_tokens_to_ids(self, tokens):
        """A token's id (the unk id, or None, for an unknown token); a list for a list."""
        if isinstance(tokens, str):
            return self._token_id(tokens)
        return [self._token_id(t) for t in tokens]

    def _token_id(self, token: str) -> int | None:
        i = self._tok.token_to_id(token)
        return self.unk_token_id if i is None else i

    def convert_ids_to_tokens(self, ids, skip_special_tokens: bool = False):
        """An id's token string; a list for a list (special tokens left out with ``skip_special_tokens``)."""
        if isinstance(ids, int):
            return self._tok.id_to_token(ids)
        skip = set(self.convert_tokens_to_ids(self.all_special_tokens)) if skip_special_tokens else set()
        return [self._tok.id_to_token(int(i)) for i in ids if int(i) not in skip]

    # ---------------------------------------------------------------- special tokens
    @property
    def special_tokens_map(self) -> dict[str, str]:
        """The named special tokens that are set, in transformers' order."""
        return {k: self._specials[k] for k in SPECIAL if k in self._specials}

    @property
    def all_special_tokens(self) -> list[str]:
        """Named then extra special tokens, each once."""
        return list(dict.fromkeys([*self.special_tokens_map.values(), *self._extra]))

    def _special(self, key: str) -> str | None:
        return self._specials.get(key)

    def _special_id(self, key: str) -> int | None:
        s = self._specials.get(key)
        return None if s is None else self.convert_tokens_to_ids(s)

    bos_token = property(lambda self: self._special("bos_token"))
    eos_token = property(lambda self: self._special("eos_token"))
    unk_token = property(lambda self: self._special("unk_token"))
    sep_token = property(lambda self: self._special("sep_token"))
    pad_token = property(lambda self: self._special("pad_token"))
    cls_token = property(lambda self: self._special("cls_token"))
    mask_token = property(lambda self: self._special("mask_token"))
    bos_token_id = property(lambda self: self._special_id("bos_token"))
    eos_token_id = property(lambda self: self._special_id("eos_token"))
    unk_token_id = property(lambda self: self._special_id("unk_token"))
    sep_token_id = property(lambda self: self._special_id("sep_token"))
    pad_token_id = property(lambda self: self._special_id("pad_token"))
    cls_token_id = property(lambda self: self._special_id("cls_token"))
    mask_token_id = property(lambda self: self._special_id("mask_token"))

    # ---------------------------------------------------------------- encoding
    def __call__(self, text, add_special_tokens: bool = True, return_offsets_mapping: bool = False, **kwargs):
        """``tok(text)`` / ``tok([texts])`` as a dict of ``input_ids``, ``attention_mask`` (and ``offset_mapping``)."""
        single = isinstance(text, str)
        if kwargs or not (single or (isinstance(text, list) and text and all(isinstance(t, str) for t in text))):
            return self.transformers_tokenizer()(
                text, add_special_tokens=add_special_tokens, return_offsets_mapping=return_offsets_mapping, **kwargs
            )
        encs = self._tok.encode_batch([text] if single else text, add_special_tokens=add_special_tokens)
        out: dict[str, Any] = {"input_ids": [e.ids for e in encs], "attention_mask": [e.attention_mask for e in encs]}
        if return_offsets_mapping:
            out["offset_mapping"] = [e.offsets for e in encs]
        return {k: v[0] for k, v in out.items()} if single else out

    # ---------------------------------------------------------------- chat
    def _template(self, chat_template: str | None) -> str | None:
        t = chat_template if chat_template is not None else self.chat_template
        return t if isinstance(t, str) else None

    def apply_chat_template(
        self, conversation, tokenize: bool = True, add_generation_prompt: bool = False, chat_template=None, **kwargs
    ):
        """``apply_chat_template(..., tokenize=False)`` on plain string messages; other uses are delegated."""
        msgs = _plain_messages(conversation)
        template = self._template(chat_template)
        if tokenize or kwargs or msgs is None or template is None:
            full = self.transformers_tokenizer()
            full.chat_template = self.chat_template
            return full.apply_chat_template(
                conversation,
                tokenize=tokenize,
                add_generation_prompt=add_generation_prompt,
                chat_template=chat_template,
                **kwargs,
            )
        return compile_template(template).render(
            messages=msgs,
            tools=None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **self.special_tokens_map,
        )

    def render_generation_spans(self, messages, template: str | None):
        """``messages`` rendered in full with the character spans of its ``{% generation %}`` blocks, as transformers'
        ``render_jinja_template(return_assistant_tokens_mask=True)`` returns them (``([text], [spans])``).
        """
        msgs = _plain_messages(messages)
        template = self._template(template)
        if msgs is None or template is None:
            from transformers.utils.chat_template_utils import render_jinja_template

            return render_jinja_template(
                conversations=[messages],
                chat_template=template if template is not None else self.chat_template,
                return_assistant_tokens_mask=True,
                **self.special_tokens_map,
            )
        compiled = compile_template(template)
        blocks: list[str] = []
        spans: list[tuple[int, int]] = []
        with compiled.environment.track_generation(blocks, spans):
            for b in compiled.generate(
                messages=msgs, tools=None, documents=None, add_generation_prompt=False, **self.special_tokens_map
            ):
                blocks.append(b)
        return ["".join(blocks)], [spans]


def load_lite(folder: str | Path, load_kwargs: dict[str, Any]) -> LiteTokenizer | None:
    """:class:`LiteTokenizer` for ``folder``, or None when :func:`lite_reason` does not serve it."""
    spec, _ = lite_reason(folder)
    return None if spec is None else LiteTokenizer(folder, spec, load_kwargs)
