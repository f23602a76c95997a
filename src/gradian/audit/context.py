"""What the checks read: the inputs, and what is derived from them once (lazily).

:class:`AuditContext` holds the training rows, the eval rows, the merged
:class:`~gradian.audit.config.TrainConfig`, the :class:`~gradian.audit.logs.TrainLog`,
the tokenizer and the library versions, and caches what several checks share:
normalised texts, word n-gram hashes and MinHash signatures, and the token
view of every row.

The token view is :func:`gradian.data.tokenize.tokenize_example` run once per
row with ``max_length`` unbounded, under the loss mode and EOS rule of the
training run (from the config and versions); truncation at the run's
``max_length`` is then a slice of that (``keep_start``), which is exactly what
``tokenize_example`` at that ``max_length`` returns. So token-level findings
agree with the sequences and masks the attribution lane trains on.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from functools import cached_property
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from gradian.audit import text as T
from gradian.audit.config import TrainConfig
from gradian.audit.logs import TrainLog
from gradian.data.formats import Example
from gradian.data.preference import PreferenceExample
from gradian.data.templates import read_template, saved_template
from gradian.data.tokenize import IGNORE_INDEX, TokenizedExample, TokenizeSpec, tokenize_example, uses_rule
from gradian.defaults import MAX_LENGTH
from gradian.errors import GradianUserError, first_line
from gradian.libversions import before
from gradian.safeio import load_json_file

UNBOUNDED = 10**9


@dataclass
class TokenInfo:
    """Facts about the tokenizer and, when the folder has them, the model's config."""

    name: str
    eos_token: str | None
    eos_id: int | None
    bos_token: str | None
    bos_id: int | None
    pad_token: str | None
    pad_id: int | None
    adds_bos: bool
    model_max_length: int | None
    max_position_embeddings: int | None
    vocab_size: int | None
    n_tokens: int
    torch_dtype: str | None
    generation_eos_ids: list[int]
    special_strings: list[str]
    chat_template: str | None


def load_tokenizer_folder(path: str | Path):
    """A tokenizer from a local folder (no network, no remote code). GGUF folders work too.

    Where :func:`gradian.audit.tokenizer_lite.lite_reason` serves the folder, a
    :class:`~gradian.audit.tokenizer_lite.LiteTokenizer` (no transformers import until a call it does not serve);
    else where :func:`gradian.audit.tokenizer_fast.fast_tokenizer_class` serves it, the class ``AutoTokenizer``
    would pick, loaded directly (no torch import); otherwise ``AutoTokenizer``.
    """
    from gradian.audit.tokenizer_fast import load_fast

    p = Path(path)
    if not p.exists():
        raise GradianUserError("tokenizer folder not found", where=str(p), fix="pass a local model or tokenizer folder")
    if p.is_dir() and not (p / "tokenizer_config.json").exists() and not (p / "tokenizer.json").exists():
        from gradian.audit.logs import checkpoints

        saved = [c for c in checkpoints(p) if (c / "tokenizer_config.json").exists()]
        if saved:  # an output folder whose tokenizer is only in its checkpoints: the last one's
            p = saved[-1]
    kw: dict[str, Any] = {"local_files_only": True, "trust_remote_code": False}
    if p.is_dir() and not (p / "tokenizer_config.json").exists() and not (p / "tokenizer.json").exists():
        ggufs = sorted(p.glob("*.gguf"))
        if ggufs:
            kw["gguf_file"] = ggufs[0].name
    if "gguf_file" not in kw:
        from gradian.audit.tokenizer_lite import load_lite

        try:  # tokenizers + jinja2 only, where that is what AutoTokenizer loads (tokenizer_lite)
            lite = load_lite(p, kw)
        except Exception:  # an unreadable folder: the transformers path below reports it as before
            lite = None
        if lite is not None:
            return lite
    try:
        if "gguf_file" not in kw:
            tok = load_fast(p, kw)
            if tok is not None:
                return tok
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(p), **kw)
    except Exception as e:  # transformers raises OSError/ValueError/KeyError for a bad folder
        msg = first_line(e)
        raise GradianUserError(
            f"cannot load a tokenizer ({msg})",
            where=str(p),
            fix="pass a folder holding tokenizer.json / tokenizer_config.json (e.g. the base model's folder)",
        ) from None


def token_info(tok, folder: str | Path | None) -> TokenInfo:
    """The :class:`TokenInfo` of a tokenizer, with hints from its folder's config.json / generation_config.json."""
    cfg: dict[str, Any] = {}
    gen: dict[str, Any] = {}
    if folder is not None and Path(folder).is_dir():
        for name, target in (("config.json", cfg), ("generation_config.json", gen)):
            f = Path(folder) / name
            if f.exists():
                try:  # bounded, regular files only; an unreadable model config only costs these hints
                    obj = load_json_file(f, "model config")
                except GradianUserError:
                    continue
                if isinstance(obj, dict):
                    target.update(obj)
    if folder is not None and Path(folder).is_dir() and not cfg:
        cfg.update(_gguf_config(Path(folder)))
    mml = getattr(tok, "model_max_length", None)
    if not isinstance(mml, int) or mml > 10**8:
        mml = None
    ids = tok("a", add_special_tokens=True)["input_ids"]
    adds_bos = bool(ids) and tok.bos_token_id is not None and ids[0] == tok.bos_token_id
    ge = gen.get("eos_token_id", cfg.get("eos_token_id"))
    gen_eos = [x for x in (ge if isinstance(ge, list) else [ge]) if isinstance(x, int) and not isinstance(x, bool)]

    def count(v: Any) -> int | None:  # a model config field that must be a positive whole number
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None

    def text(v: Any) -> str | None:
        return v if isinstance(v, str) else None

    specials = sorted(
        {s for s in getattr(tok, "all_special_tokens", []) if s}
        | {t.content for t in getattr(tok, "added_tokens_decoder", {}).values() if getattr(t, "special", False)}
    )
    return TokenInfo(
        name=str(folder) if folder is not None else getattr(tok, "name_or_path", "") or "(in-memory tokenizer)",
        eos_token=tok.eos_token,
        eos_id=tok.eos_token_id,
        bos_token=tok.bos_token,
        bos_id=tok.bos_token_id,
        pad_token=tok.pad_token,
        pad_id=tok.pad_token_id,
        adds_bos=adds_bos,
        model_max_length=mml,
        max_position_embeddings=count(cfg.get("max_position_embeddings")) or count(cfg.get("n_positions")),
        vocab_size=count(cfg.get("vocab_size")),
        n_tokens=len(tok),
        torch_dtype=text(cfg.get("torch_dtype")) or text(cfg.get("dtype")),
        generation_eos_ids=gen_eos,
        special_strings=specials,
        chat_template=tok.chat_template if isinstance(getattr(tok, "chat_template", None), str) else None,
    )


def _gguf_config(folder: Path) -> dict[str, Any]:
    """``max_position_embeddings`` / ``vocab_size`` from a GGUF file's metadata (a GGUF folder has no config.json)."""
    ggufs = sorted(folder.glob("*.gguf"))
    if not ggufs:
        return {}
    try:
        from transformers.integrations.gguf import read_gguf_metadata

        md, _ = read_gguf_metadata(str(ggufs[0]))
    except Exception:  # an older/newer transformers without this reader, or an unreadable file
        return {}
    arch = md.get("general.architecture")
    out: dict[str, Any] = {}
    ctx_len = md.get(f"{arch}.context_length")
    if isinstance(ctx_len, int):
        out["max_position_embeddings"] = ctx_len
    return out


@dataclass
class TokenRow:
    """A row as the trainer tokenises it (untruncated) plus what the checks need.

    Attributes:
        tx: the :class:`TokenizedExample` at unbounded ``max_length`` (or None if rendering failed).
        error: the one-line rendering error (e.g. the chat template rejected the roles).
        first_sup: index of the first supervised token (``len`` if none).
        last_sup: index of the last supervised token (-1 if none).
    """

    tx: TokenizedExample | None
    error: str | None
    first_sup: int
    last_sup: int
    prompt_ids_len: int | None = None


def _row(tx: TokenizedExample | None, error: str | None, prompt_ids_len: int | None) -> TokenRow:
    if tx is None:
        return TokenRow(None, error, 0, -1, None)
    labels = tx.labels
    n = len(labels)
    # the first and the last supervised token, scanning from each end (the prompt's length, then usually one step)
    first = next((i for i, lab in enumerate(labels) if lab != IGNORE_INDEX), n)
    last = next((n - 1 - i for i, lab in enumerate(reversed(labels)) if lab != IGNORE_INDEX), -1) if first < n else -1
    return TokenRow(tx, None, first, last, prompt_ids_len)


#: What the batch tokenisation must reproduce of :func:`tokenize_example`'s result (:meth:`AuditContext._tokenize`).
_TOKENIZED = operator.attrgetter(
    "input_ids", "labels", "offsets", "text", "completion_char_start", "full_length", "prompt_length"
)


def _row_offsets(lengths: list[int]) -> np.ndarray:
    """``offsets (n+1,) int64`` of n rows laid end to end, from each row's length: row i is
    ``flat[offsets[i]:offsets[i+1]]``.
    """
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def _split_rows(flat: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    """Per row, its part of ``flat`` (views), the rows laid end to end at ``offsets`` (:func:`_row_offsets`)."""
    return np.split(flat, offsets[1:-1]) if len(offsets) > 1 else []


def _plain_backend(tok):
    """The fast tokenizer's Rust backend when calling it directly is equivalent (no truncation/padding set)."""
    be = getattr(tok, "backend_tokenizer", None) if getattr(tok, "is_fast", False) else None
    if be is None or getattr(be, "truncation", None) is not None or getattr(be, "padding", None) is not None:
        return None
    if getattr(tok, "split_special_tokens", False):
        return None
    return be


def batch_tokenize(examples: list[Example], tok, spec: TokenizeSpec):
    """``tokenize_example`` for many rows with two batched tokenizer calls per kind (plain / chat).

    Reproduces :func:`gradian.data.tokenize.tokenize_example` step by step (same chat rendering
    helper, EOS rule, common-prefix mask, first label masked); only the tokenizer calls are
    batched. Returns ``(TokenizedExample | None, error | None, len(tok(prompt)) | None)`` per row.
    ``AuditContext`` checks a sample of rows against ``tokenize_example`` itself.
    """
    from gradian.data.tokenize import build_tokenized, render_example

    n = len(examples)
    out: list[Any] = [None] * n
    rendered: list[Any] = [None] * n
    for i, ex in enumerate(examples):
        try:
            rendered[i] = render_example(ex, tok, spec)
        except GradianUserError as e:
            out[i] = (None, e.what, None)
    texts = [r.text if r is not None else None for r in rendered]
    prompts = [r.prompt_text if r is not None else None for r in rendered]
    special = [r.add_special_tokens if r is not None else True for r in rendered]
    backend = _plain_backend(tok)
    for flag in (True, False):
        sel = [i for i in range(n) if texts[i] is not None and special[i] == flag]
        if not sel:
            continue
        psel = [i for i in sel if prompts[i] is not None]
        if backend is not None:  # the Rust tokenizer directly: same ids/offsets, no per-row Python conversion
            # the prompts' ids only: the encoder without offset tracking (tokenizers >= 0.20; the same ids)
            enc_ids = getattr(backend, "encode_batch_fast", backend.encode_batch)
            penc = enc_ids([prompts[i] for i in psel], add_special_tokens=flag) if psel else []
            p_ids = {i: e.ids for i, e in zip(psel, penc)}
            del penc
            encs = backend.encode_batch([texts[i] for i in sel], add_special_tokens=flag)
            for k, i in enumerate(sel):
                # one row's Python ids/offsets at a time, its Rust encoding freed once read (peak memory)
                e, encs[k] = encs[k], None
                pl_ids = p_ids.pop(i, None)
                tx = build_tokenized(examples[i].id, rendered[i], e.ids, e.offsets, pl_ids, spec)
                out[i] = (tx, None, len(pl_ids) if pl_ids is not None else None)
            continue
        enc = tok([texts[i] for i in sel], add_special_tokens=flag, return_offsets_mapping=True)
        all_ids = enc["input_ids"]
        all_offsets = enc["offset_mapping"]
        penc = tok([prompts[i] for i in psel], add_special_tokens=flag)["input_ids"] if psel else []
        p_ids = dict(zip(psel, penc))
        for k, i in enumerate(sel):
            pl_ids = p_ids.get(i)
            tx = build_tokenized(
                examples[i].id, rendered[i], list(all_ids[k]), [tuple(o) for o in all_offsets[k]], pl_ids, spec
            )
            out[i] = (tx, None, len(pl_ids) if pl_ids is not None else None)
    return out


class AuditContext:
    """Inputs plus shared derived data; see the module docstring."""

    def __init__(
        self,
        examples: list[Example] | None,
        eval_examples: list[Example] | None,
        config: TrainConfig | None,
        logs: TrainLog | None,
        tokenizer: Any,
        tokenizer_folder: str | None,
        versions: dict[str, str],
        version_sources: dict[str, str],
        data_path: str | None = None,
        eval_path: str | None = None,
        preference: list[PreferenceExample] | None = None,
    ):
        self.examples = examples
        #: the training rows when they are preference rows (then ``examples`` is None)
        self.preference = preference
        self.eval_examples = eval_examples
        self.config = config
        self.logs = logs
        self.tokenizer = tokenizer
        self.tokenizer_folder = tokenizer_folder
        self.versions = versions
        self.version_sources = version_sources
        self.data_path = data_path
        self.eval_path = eval_path
        self.notes: list[str] = []
        #: results several checks share, computed by the first that needs them (e.g. near-duplicate pairs)
        self.memo: dict[str, Any] = {}
        self._token_rows: list[TokenRow] | None = None
        self._token_thread = None
        self._token_error: BaseException | None = None

    # ------------------------------------------------------------------ presence
    def has(self, inp: str) -> bool:
        return {
            "data": self.examples is not None,
            "eval": self.eval_examples is not None,
            "config": self.config is not None,
            "logs": self.logs is not None,
            "tokenizer": self.tokenizer is not None,
        }[inp]

    @property
    def n(self) -> int:
        return len(self.examples or [])

    # ------------------------------------------------------------------ text views
    @cached_property
    def prompt_texts(self) -> list[str]:
        """``Example.prompt_text`` of every training row (built once: for chat rows it joins the messages)."""
        return [e.prompt_text for e in self.examples or []]

    @cached_property
    def completion_texts(self) -> list[str]:
        """``Example.completion_text`` of every training row."""
        return [e.completion_text for e in self.examples or []]

    @cached_property
    def norm_prompt(self) -> list[str]:
        return [T.normalise(p) for p in self.prompt_texts]

    @cached_property
    def norm_completion(self) -> list[str]:
        return [T.normalise(c) for c in self.completion_texts]

    @cached_property
    def norm_row(self) -> list[str]:
        return [p + "\x1f" + c for p, c in zip(self.norm_prompt, self.norm_completion)]

    @cached_property
    def norm_prompt_without_system(self) -> list[str]:
        """Each training row's normalised prompt without its system turns (the prompt itself when it has none)."""
        from gradian.data.preference import without_system

        return [T.normalise(without_system(e.prompt)) for e in self.examples or []]

    @cached_property
    def eval_norm_prompt_without_system(self) -> list[str]:
        """The same for each eval row."""
        from gradian.data.preference import without_system

        return [T.normalise(without_system(e.prompt)) for e in self.eval_examples or []]

    @cached_property
    def eval_norm_prompt(self) -> list[str]:
        return [T.normalise(e.prompt_text) for e in self.eval_examples or []]

    @cached_property
    def eval_norm_completion(self) -> list[str]:
        return [T.normalise(e.completion_text) for e in self.eval_examples or []]

    @cached_property
    def prompt_words(self) -> list[list[str]]:
        return [T.find_words(p) for p in self.norm_prompt]

    @cached_property
    def completion_words(self) -> list[list[str]]:
        return [T.find_words(c) for c in self.norm_completion]

    @cached_property
    def row_words(self) -> list[list[str]]:
        return [p + c for p, c in zip(self.prompt_words, self.completion_words)]

    @cached_property
    def eval_row_words(self) -> list[list[str]]:
        return [T.find_words(p + " " + c) for p, c in zip(self.eval_norm_prompt, self.eval_norm_completion)]

    @cached_property
    def _row_word_table(self) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
        pw, cw = self.prompt_words, self.completion_words
        flat = list(chain.from_iterable(chain.from_iterable(zip(pw, cw))))
        offsets = _row_offsets([len(p) + len(c) for p, c in zip(pw, cw)])
        hashes, ids, vocab = T.word_table(flat)
        return hashes, ids, vocab, offsets

    @cached_property
    def row_word_flat(self) -> tuple[np.ndarray, np.ndarray]:
        """The word hashes of every training row end to end, ``(hashes (W,) uint64, offsets (n+1,) int64)``: row i's
        words (:attr:`row_words`) are ``hashes[offsets[i]:offsets[i+1]]``.
        """
        hashes, _, _, offsets = self._row_word_table
        return hashes, offsets

    @cached_property
    def row_word_ids(self) -> tuple[np.ndarray, list[str]]:
        """``(ids (W,) int64, vocab)``: the words of :attr:`row_word_flat` as indices into the distinct words."""
        _, ids, vocab, _ = self._row_word_table
        return ids, vocab

    @cached_property
    def row_word_hashes(self) -> list[np.ndarray]:
        """Per training row, its words' hashes (views into :attr:`row_word_flat`)."""
        return _split_rows(*self.row_word_flat)

    @cached_property
    def eval_row_word_flat(self) -> tuple[np.ndarray, np.ndarray]:
        """:attr:`row_word_flat` for the eval rows (:attr:`eval_row_words`)."""
        ws = self.eval_row_words
        return T.word_hashes(list(chain.from_iterable(ws))), _row_offsets([len(w) for w in ws])

    @cached_property
    def eval_row_word_hashes(self) -> list[np.ndarray]:
        return _split_rows(*self.eval_row_word_flat)

    @cached_property
    def row_segment_lengths(self) -> list[list[int]]:
        """Per training row, the word count of each segment (sentence or line; :func:`text.segments`), in the
        order of :attr:`row_words`.
        """
        n = len(self.prompt_texts)
        counts = T.segment_word_counts_many(
            self.prompt_texts + self.completion_texts, [len(w) for w in self.prompt_words + self.completion_words]
        )
        return [p + c for p, c in zip(counts[:n], counts[n:])]

    @cached_property
    def eval_segment_lengths(self) -> list[list[int]]:
        ev = self.eval_examples or []
        n = len(ev)
        counts = T.segment_word_counts_many(
            [e.prompt_text for e in ev] + [e.completion_text for e in ev],
            [len(T.find_words(x)) for x in self.eval_norm_prompt + self.eval_norm_completion],
        )
        return [p + c for p, c in zip(counts[:n], counts[n:])]

    @cached_property
    def shingles5(self) -> list[np.ndarray]:
        return T.ngrams_rows(self.row_word_hashes, 5)

    @cached_property
    def eval_shingles5(self) -> list[np.ndarray]:
        return T.ngrams_rows(self.eval_row_word_hashes, 5)

    @cached_property
    def minhasher(self) -> T.MinHasher:
        return T.MinHasher(k=64)

    @cached_property
    def signatures(self) -> np.ndarray:
        return self.minhasher.signatures(self.shingles5)

    @cached_property
    def eval_signatures(self) -> np.ndarray:
        return self.minhasher.signatures(self.eval_shingles5)

    # ------------------------------------------------------------------ run semantics
    @property
    def trainer(self) -> str | None:
        return self.config.trainer if self.config else None

    def max_length(self) -> tuple[int | None, str]:
        """The run's max length and where it came from; (None, why) when the trainer does not truncate."""
        c = self.config
        if c is None:
            return (
                MAX_LENGTH,
                f"assumed: no config given, TRL SFTConfig's default max_length={MAX_LENGTH}",
            )
        if c.max_length is not None and c.max_length <= 0:
            return None, f"max_length={c.max_length} ({c.source('max_length')}) is impossible (see C19)"
        if c.max_length:
            return int(c.max_length), c.source("max_length") or "config"
        if c.truncation == "none":
            return None, f"no truncation ({c.source('truncation')})"
        if c.trainer == "hf":
            return None, "HF Trainer does not truncate; the max length is whatever your preprocessing used"
        if c.trainer is None:
            return (
                MAX_LENGTH,
                f"assumed: the config names no trainer, TRL's default max_length={MAX_LENGTH}",
            )
        return None, "max length unknown"

    def loss_on_prompt(self) -> tuple[bool, str]:
        """Whether the loss covers the prompt, and why (the config field or default)."""
        c = self.config
        if c is None:
            return False, "assumed completion-only loss (no config given)"
        if c.stage_kind == "pretraining":
            return True, f"continued pretraining ({c.source('stage')}): every token is a target"
        if c.train_on_inputs is not None:
            return bool(c.train_on_inputs), c.source("train_on_inputs") or ""
        if c.completion_only_loss is not None:
            return (not c.completion_only_loss), c.source("completion_only_loss") or ""
        if c.trains_every_message_turn and self.examples:
            n_msgs = sum(1 for e in self.examples if e.format == "messages")
            if n_msgs * 2 > len(self.examples):
                return True, (
                    "TRL trains every token of 'messages' rows unless assistant_only_loss "
                    f"({c.source('assistant_only_loss')})"
                )
        return False, "default: completion-only loss for prompt/completion rows"

    def pipeline_appends_eos(self) -> tuple[bool, str]:
        """Whether the trainer appends EOS to plain (non-chat) rows."""
        b = before(self.versions, "trl", "0.16")
        if self.trainer in ("trl", None) and b:
            return False, f"TRL {self.versions['trl']} < 0.16 does not append EOS to plain text"
        return True, "the trainer appends EOS to plain rows (TRL >= 0.16, axolotl, LLaMA-Factory, torchtune)"

    # ------------------------------------------------------------------ tokenizer views
    @cached_property
    def tok_info(self) -> TokenInfo:
        return token_info(self.tokenizer, self.tokenizer_folder)

    @cached_property
    def training_template(self) -> tuple[str | None, str]:
        """The chat template the run trained with, and where it was read (one phrase).

        In order: the template the run saved next to its adapter (``chat_template.jinja``, or
        ``tokenizer_config.json``'s ``chat_template``, in a ``--config`` folder: TRL saves the
        tokenizer after applying ``chat_template_path``); the config's ``chat_template_path`` when
        it is a ``.jinja``/``.j2`` file (TRL 1.16 reads such a file into the tokenizer as is); a
        literal Jinja ``chat_template`` in the config; else the tokenizer's own template.
        """
        c = self.config
        for folder in [Path(x) for x in (c.paths if c is not None else [])]:
            if not folder.is_dir():
                folder = folder.parent
            if not (folder / "adapter_config.json").is_file():  # only a run's output / adapter folder
                continue
            tpl = saved_template(folder)
            if tpl is not None:
                return tpl
        if c is not None and c.chat_template_path and c.chat_template_path.endswith((".jinja", ".j2")):
            for cand in [Path(c.chat_template_path)] + [Path(x).parent / c.chat_template_path for x in c.paths]:
                if cand.is_file():
                    return read_template(cand), f"{c.source('chat_template_path')} ({cand})"
        if c is not None and c.chat_template and "{%" in c.chat_template:
            return c.chat_template, str(c.source("chat_template"))
        ti = self.tok_info
        return ti.chat_template, f"the tokenizer's template ({ti.name})"

    @cached_property
    def token_spec(self) -> TokenizeSpec:
        """How the token checks tokenise: unbounded, the config's prompt masking and EOS rule; for a trainer whose
        own rule builds the rows (torchtune, LLaMA-Factory, axolotl alpaca: :attr:`TokenizeSpec.chat_rule`), that
        rule and its mask, so a length counts what the trainer trained on (a ``qwen`` run's default system prompt).
        """
        on_prompt, _ = self.loss_on_prompt()
        add_eos, _ = self.pipeline_appends_eos()
        spec = TokenizeSpec(max_length=UNBOUNDED, loss_on="all" if on_prompt else "completion", add_eos=add_eos)
        rule, loss_on = self._trainer_rule()
        if rule is not None:
            from dataclasses import replace

            spec = replace(spec, chat_rule=rule, loss_on=loss_on)
        return spec

    def _trainer_rule(self) -> tuple[str | None, str]:
        """``(chat_rule, loss_on)`` of the run's setup (:func:`gradian.data.setup.resolve_setup`), or ``(None, "")``."""
        if self.config is None or not self.examples:
            return None, ""
        from gradian.data.setup import examples_format, resolve_setup

        fmt, chat = examples_format(self.examples)
        try:
            setup = resolve_setup(self.config, fmt, chat=chat)
        except (ValueError, GradianUserError):
            return None, ""
        return setup.chat_rule, setup.loss_on

    def prefetch_token_rows(self) -> None:
        """Start computing :attr:`token_rows` in a background thread.

        The tokenizer's Rust encoder releases the GIL, so the data checks that read no tokens run
        meanwhile. Nothing else may use the tokenizer until :attr:`token_rows` has been read.
        """
        import threading

        if self._token_rows is not None or self._token_thread is not None:
            return

        def work() -> None:
            try:
                self._token_rows = self._tokenize(self.examples or [])
            except BaseException as e:  # re-raised in the caller's thread
                self._token_error = e

        self._token_thread = threading.Thread(target=work, name="gradian-audit-tokens", daemon=True)
        self._token_thread.start()

    def finish_prefetch(self) -> None:
        """Wait for a prefetch started by :meth:`prefetch_token_rows` (re-raising its error)."""
        if self._token_thread is not None:
            self.token_rows  # noqa: B018  (joins the thread)

    @property
    def token_rows(self) -> list[TokenRow]:
        """One :class:`TokenRow` per training row (``tokenize_example`` at unbounded max length)."""
        if self._token_thread is not None:
            self._token_thread.join()
            self._token_thread = None
            if self._token_error is not None:
                err, self._token_error = self._token_error, None
                raise err
        if self._token_rows is None:
            self._token_rows = self._tokenize(self.examples or [])
        return self._token_rows

    def _tokenize(self, examples: list[Example]) -> list[TokenRow]:
        """Batch path checked against ``tokenize_example`` on a sample; any disagreement -> per-row path."""
        spec = self.token_spec
        fast = batch_tokenize(examples, self.tokenizer, spec)
        n = len(examples)
        sample = sorted(set(range(min(16, n))) | set(range(0, n, max(1, n // 16))))
        for i in sample:
            ex = examples[i]
            try:
                ref = tokenize_example(ex, self.tokenizer, spec)
            except GradianUserError as e:
                if fast[i][1] != e.what:
                    break
                continue
            got = fast[i][0]
            if got is None or _TOKENIZED(got) != _TOKENIZED(ref):
                break
        else:
            return [_row(tx, err, plen) for tx, err, plen in fast]
        self.notes.append(
            "the batch tokenisation disagreed with tokenize_example on a sampled row; every row was "
            "tokenised one by one instead"
        )
        out = []
        for ex in examples:
            try:
                out.append(_row(tokenize_example(ex, self.tokenizer, spec), None, None))
            except GradianUserError as e:
                out.append(_row(None, e.what, None))
        return out

    @cached_property
    def prompt_token_lengths(self) -> list[int | None]:
        """Length of ``tok(prompt)`` alone as the trainer encodes it (None for text rows / failed renders).

        ``TokenizedExample.prompt_length`` is the common prefix of ``tok(prompt)`` and
        ``tok(prompt + completion)``; when it is shorter than this, the boundary tokens merged.
        """
        if all(tr.prompt_ids_len is not None or tr.tx is None or tr.tx.prompt_length == 0 for tr in self.token_rows):
            return [tr.prompt_ids_len for tr in self.token_rows]
        tok = self.tokenizer
        texts: list[str] = []
        idx: list[int] = []
        special: list[bool] = []
        for i, (ex, tr) in enumerate(zip(self.examples or [], self.token_rows)):
            if tr.tx is None or ex.format == "text" or not ex.prompt_text and not ex.is_chat:
                continue
            if uses_rule(ex, self.token_spec):  # pieces encoded on their own: the boundary is a piece boundary
                continue
            if ex.is_chat:
                msgs = ex.prompt if isinstance(ex.prompt, list) else [{"role": "user", "content": ex.prompt}]
                try:
                    texts.append(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))
                except Exception:
                    continue
                special.append(False)
            else:
                texts.append(ex.prompt)
                special.append(True)
            idx.append(i)
        out: list[int | None] = [None] * self.n
        for flag in (True, False):
            sel = [k for k in range(len(texts)) if special[k] == flag]
            if not sel:
                continue
            enc = tok([texts[k] for k in sel], add_special_tokens=flag)["input_ids"]
            for k, ids in zip(sel, enc):
                out[idx[k]] = len(ids)
        return out
