r"""Tokenisation that reproduces the loss mask the user trained with.

Rules (the same as TRL's ``SFTTrainer`` with ``completion_only_loss``):

* **Plain prompt/completion** (and alpaca, rendered as prompt ``instruction\n\ninput``
  and completion ``output``): the tokenizer's EOS string is appended to the
  completion unless it already ends with it; ``ids = tok(prompt + completion)``;
  the supervised tokens start where ``tok(prompt)`` and ``ids`` stop agreeing
  (TRL's common-prefix rule).
* **Chat** (``messages``, or prompt/completion given as message lists): the run's
  training template (:attr:`TokenizeSpec.chat_template`), else the tokenizer's chat
  template, renders ``prompt`` with ``add_generation_prompt=True`` and
  ``prompt + completion`` in full; supervised tokens start at the common prefix.
  The template decides end-of-turn / EOS, exactly as at training time.
  For ``messages`` rows, the prompt is every turn before the final assistant
  turn, and the completion is that turn.
* **text**: EOS appended as TRL does; every token is supervised.
* ``loss_on="all"`` supervises prompt and completion (TRL's
  ``completion_only_loss=False``, and TRL's default for ``messages`` rows: a
  conversational language-modelling row has no completion mask, so every token
  of the whole conversation is a target).
* ``loss_on="assistant"`` supervises every assistant turn of a chat row (TRL's
  ``assistant_only_loss``; axolotl ``roles_to_train: [assistant]``; LLaMA-Factory
  ``mask_history: false``; torchtune ``train_on_input: false``). When the chat template
  has ``{% generation %}`` markers, the supervised tokens are the template's own
  assistant mask (``apply_chat_template(return_assistant_tokens_mask=True)``, what TRL
  reads); without markers, assistant turn *i* covers the tokens from where
  ``render(turns[:i], add_generation_prompt=True)`` stops agreeing with the full
  conversation to the end of ``render(turns[:i+1])`` (the template's end-of-turn
  included). ``loss_on="completion"`` on a ``messages`` row is the final assistant
  turn only (LLaMA-Factory ``mask_history: true``; Gradian's default).
* :attr:`TokenizeSpec.chat_rule` (a trainer that does not render a chat template, with a rule Gradian
  implements): the rows are built piece by piece as that trainer builds them, with its mask and its truncation:
  torchtune's model tokenizers (:mod:`gradian.data.torchtune_rules`), LLaMA-Factory's registered templates, chat and
  alpaca rows (:mod:`gradian.data.llamafactory_rules`), axolotl's ``type: alpaca`` prompt
  (:mod:`gradian.data.axolotl_rules`).
* Truncation keeps the start (TRL's default ``keep_start``), at ``max_length``;
  each example records whether it was truncated and its untruncated length.

Labels follow the HF convention: ``labels[t] = input_ids[t]`` on supervised
tokens, ``-100`` elsewhere; the model shifts them internally.

Each example keeps its rendered text and the token→character offsets, so a
character span of the completion text can become a token mask
(:meth:`TokenizedExample.span_mask`).
"""

from __future__ import annotations

import re
from abc import abstractmethod
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, Any, Literal, Sequence

from gradian.data.formats import Example
from gradian.defaults import MAX_LENGTH
from gradian.errors import GradianUserError

if TYPE_CHECKING:  # pragma: no cover
    import torch

IGNORE_INDEX = -100
#: the values of :attr:`TokenizeSpec.loss_on`
LOSS_ON = ("completion", "all", "assistant")


@dataclass(frozen=True)
class TokenizeSpec:
    """How training rows become tokens and a loss mask. Serialised into the manifest.

    Attributes:
        max_length: truncate rendered sequences to this many tokens (keep the start).
        loss_on: ``"completion"`` (completion-only loss, the default; the final assistant turn of a
            ``messages`` row), ``"all"`` (every token) or ``"assistant"`` (every assistant turn of a chat row;
            plain rows: the completion).
        add_eos: append the EOS string to plain (non-chat) completions and text, as TRL does.
        chat_template: the Jinja chat template the run trained with, which renders chat rows in place of the
            tokenizer's own (``apply_chat_template(chat_template=...)``); None: the tokenizer's template. Part of
            the index's content identity when set (left out of :meth:`to_dict` when None, so the ids of indexes
            built without one do not move).
        train_roles: axolotl's chat mask (``prompt_strategies/chat_template.py`` at 0.19.0): a chat row's supervised
            tokens are the *content* tokens of each message whose role is listed (``"*"``: every role), plus the EOS
            token found within 3 tokens after a message's content, per ``train_on_eos`` (``"turn"``: after a
            trained message; ``"all"``: after every message; ``"last"``: the last one only; ``"none"``). None:
            ``loss_on`` decides. Plain rows always follow ``loss_on``. Left out of :meth:`to_dict` when None.
        train_on_eos: see ``train_roles``.
        chat_rule: a trainer's own rendering in place of a chat template (:func:`chat_rules`: torchtune's
            ``"torchtune_qwen2"`` / ``"torchtune_llama3"``, LLaMA-Factory's ``"llamafactory_<template>"`` for chat and
            alpaca rows, axolotl's ``"axolotl_alpaca"`` for alpaca rows): the rows are built piece by piece as that
            trainer builds them, with its mask per ``loss_on`` (LLaMA-Factory's ``cutoff_len`` truncation included).
            None: the chat template. Left out of :meth:`to_dict` when None (with ``eos_truncate``).
        eos_truncate: with ``chat_rule``: the trainer truncates at ``max_length`` by torchtune's ``truncate`` (EOS
            written over the last kept token, its label masked; it runs on every row, so a row that fits has its
            final EOS masked). False: the recipe sets no ``max_seq_len``.
        drop_long: the trainer drops a row longer than ``max_length`` instead of cutting it (axolotl's
            ``excess_length_strategy: drop``, its default): such a row keeps its first ``max_length`` tokens with no
            supervised token, so its gradient is zero, as it was never trained on. Left out of :meth:`to_dict` when
            False.
        default_system: with a LLaMA-Factory ``chat_rule``: the config's ``default_system``, which replaces the
            template's own on a row with no system turn. None: the template's. Left out of :meth:`to_dict` when
            None.
    """

    max_length: int = MAX_LENGTH
    loss_on: Literal["completion", "all", "assistant"] = "completion"
    add_eos: bool = True
    chat_template: str | None = None
    train_roles: tuple[str, ...] | None = None
    train_on_eos: Literal["turn", "all", "none", "last"] = "turn"
    chat_rule: str | None = None
    eos_truncate: bool = False
    drop_long: bool = False
    default_system: str | None = None

    def __post_init__(self) -> None:
        from gradian.validate import LENGTH_MAX, check_bool, check_choice, check_int

        check_int(
            self.max_length,
            "TokenizeSpec",
            "max_length",
            flag="--max-length",
            lo=2,
            hi=LENGTH_MAX,
            fix="use the max_length the run trained with, e.g. --max-length 1024",
        )
        check_choice(
            self.loss_on,
            LOSS_ON,
            "TokenizeSpec",
            "loss_on",
            flag="--loss-on",
            fix="use 'completion', 'all' or 'assistant'",
        )
        check_bool(self.add_eos, "TokenizeSpec", "add_eos")
        check_choice(self.train_on_eos, ("turn", "all", "none", "last"), "TokenizeSpec", "train_on_eos")
        if self.chat_rule is not None:
            check_choice(self.chat_rule, chat_rules(), "TokenizeSpec", "chat_rule")
        check_bool(self.eos_truncate, "TokenizeSpec", "eos_truncate")
        check_bool(self.drop_long, "TokenizeSpec", "drop_long")
        if self.default_system is not None and not isinstance(self.default_system, str):
            raise GradianUserError(
                f"default_system must be a string, not {type(self.default_system).__name__}",
                where="TokenizeSpec.default_system",
                fix="give the system text, or None for the template's own",
            )
        if self.train_roles is not None:
            if isinstance(self.train_roles, list):
                object.__setattr__(self, "train_roles", tuple(self.train_roles))  # from a JSON manifest
            roles = self.train_roles
            if not isinstance(roles, tuple) or not roles or not all(isinstance(r, str) and r for r in roles):
                raise GradianUserError(
                    "train_roles must be a list of role names",
                    where="TokenizeSpec.train_roles",
                    fix="e.g. ['assistant'], or None for the loss_on rule",
                )
        if self.chat_template is not None and (not isinstance(self.chat_template, str) or not self.chat_template):
            raise GradianUserError(
                f"chat_template must be a non-empty Jinja template string, not {type(self.chat_template).__name__}",
                where="TokenizeSpec.chat_template",
                fix="pass the template's text (e.g. the run's chat_template.jinja), or None for the tokenizer's own",
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON view for the manifest. ``chat_template`` and ``train_roles`` (with ``train_on_eos``) appear only when
        set: a spec without them gives the dict (and so the index ids) it gave before the fields existed.
        """
        d = asdict(self)
        if d["chat_template"] is None:
            del d["chat_template"]
        if d["train_roles"] is None:
            del d["train_roles"], d["train_on_eos"]
        else:
            d["train_roles"] = list(d["train_roles"])
        if d["chat_rule"] is None:
            del d["chat_rule"], d["eos_truncate"]
        if not d["drop_long"]:
            del d["drop_long"]
        if d["default_system"] is None:
            del d["default_system"]
        return d

    def for_tokenizer(self, tokenizer) -> TokenizeSpec:
        """This spec with ``chat_template`` dropped when it is the tokenizer's own template (the same rendering:
        the index of a run whose saved template equals the base tokenizer's keeps the id it has without one).
        """
        if self.chat_template is not None and self.chat_template == getattr(tokenizer, "chat_template", None):
            from dataclasses import replace

            return replace(self, chat_template=None)
        return self


class TokenIds(Sequence[int]):
    """(t,) token ids (or labels) of a tokenised text in one int32 array.

    Reads like the list a tokenizer returns (indexing, slicing, iteration, ``len``, ``==`` with a list),
    in 4 bytes a token instead of about 36 for a list of Python ints: ``gradian attribute`` holds a tokenised
    training set whole (issue 14: memory that barely grows with the rows). ``tolist()`` gives
    the plain list (for JSON).
    """

    __slots__ = ("_a",)

    def __init__(self, values: Iterable[int] = ()) -> None:
        self._a = array("i", values)

    @classmethod
    def _wrap(cls, a: array) -> TokenIds:
        out = cls.__new__(cls)
        out._a = a
        return out

    def __len__(self) -> int:
        return len(self._a)

    def __getitem__(self, k):  # type: ignore[override]
        if isinstance(k, slice):
            return self._wrap(self._a[k])
        return self._a[k]

    def __iter__(self) -> Iterator[int]:
        return iter(self._a)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenIds):
            return self._a == other._a
        if isinstance(other, (list, tuple)):
            return len(other) == len(self._a) and self._a.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def tolist(self) -> list[int]:
        """The ids as a plain list of ints."""
        return self._a.tolist()

    def __repr__(self) -> str:
        return f"TokenIds({self._a.tolist()!r})"

    def __reduce__(self):
        return (TokenIds._wrap, (self._a,))


class TokenOffsets(Sequence[tuple[int, int]]):
    """(t,) ``(char_start, char_end)`` pairs of a tokenised text, stored flat in one int32 array.

    Reads like the list of tuples a tokenizer returns (indexing, slicing, iteration, ``len``, ``==``
    with a list of pairs), in 8 bytes a token instead of about 100 for a list of tuples: a tokenised
    training set is held whole by ``gradian attribute`` (issue 14: memory that barely grows with the rows).
    """

    __slots__ = ("_flat",)

    def __init__(self, pairs: Iterable[Sequence[int]] = ()) -> None:
        self._flat = array("i", chain.from_iterable(pairs))

    @classmethod
    def _from_flat(cls, flat: array) -> TokenOffsets:
        out = cls.__new__(cls)
        out._flat = flat
        return out

    def __len__(self) -> int:
        return len(self._flat) // 2

    def __getitem__(self, k):  # type: ignore[override]
        if isinstance(k, slice):
            a, b, step = k.indices(len(self))
            if step == 1:
                return self._from_flat(self._flat[2 * a : 2 * max(a, b)])
            return TokenOffsets(self[i] for i in range(a, b, step))
        n = len(self)
        if k < 0:
            k += n
        if not 0 <= k < n:
            raise IndexError("token offset index out of range")
        return (self._flat[2 * k], self._flat[2 * k + 1])

    def __iter__(self) -> Iterator[tuple[int, int]]:
        it = iter(self._flat)
        return zip(it, it)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenOffsets):
            return self._flat == other._flat
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and all(tuple(o) == p for o, p in zip(other, self))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TokenOffsets({list(self)!r})"

    def __reduce__(self):
        return (TokenOffsets._from_flat, (self._flat,))


@dataclass
class TokenizedExample:
    """One example as the trainer saw it.

    Attributes:
        input_ids: (t,) token ids after truncation (:class:`TokenIds`: an int32 array that reads like a list).
        labels: (t,) ``input_ids`` on supervised tokens, ``-100`` elsewhere.
        offsets: (t,) ``(char_start, char_end)`` of each token in ``text`` (:class:`TokenOffsets`).
        text: the rendered string that was tokenised.
        completion_char_start: where the completion's text starts in ``text``.
        full_length: token count before truncation.
        truncated: whether ``full_length > max_length``.
    """

    id: str
    input_ids: TokenIds
    labels: TokenIds
    offsets: TokenOffsets
    text: str
    completion_char_start: int
    full_length: int
    truncated: bool
    prompt_length: int
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def n_supervised(self) -> int:
        return sum(1 for x in self.labels if x != IGNORE_INDEX)

    def span_mask(self, char_start: int, char_end: int) -> list[bool]:
        """Token mask of the supervised tokens overlapping a character span of the completion text.

        Args:
            char_start, char_end: span in the *completion text* (``Example.completion_text``),
                half-open.

        Returns:
            (t,) booleans; True where a supervised token overlaps the span.
        """
        a = self.completion_char_start + char_start
        b = self.completion_char_start + char_end
        return [
            (lab != IGNORE_INDEX) and (s < b) and (e > a) and e > s for (s, e), lab in zip(self.offsets, self.labels)
        ]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def render_chat(
    tokenizer, messages: list[dict[str, str]], add_generation_prompt: bool, where: str, template: str | None = None
) -> str:
    """Render ``messages`` to text with ``template``, else the tokenizer's own chat template (not tokenised).

    Args:
        tokenizer: an HF tokenizer (with a ``chat_template`` unless ``template`` is given).
        messages: ``[{"role", "content"}, ...]``.
        add_generation_prompt: end with the template's assistant header (for rendering a prompt alone).
        where: the row or file named in errors.
        template: the run's training template (:attr:`TokenizeSpec.chat_template`), or None.

    Raises:
        GradianUserError: the tokenizer has no chat template, or the template rejects the conversation.
    """
    if template is not None:
        try:
            return tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt, chat_template=template
            )
        except Exception as e:  # jinja TemplateError
            raise GradianUserError(
                f"the run's chat template rejected the conversation: {e}",
                where=where,
                fix="fix the roles, or the training template (--config / the adapter folder's chat_template.jinja)",
            ) from None
    if not getattr(tokenizer, "chat_template", None):
        raise GradianUserError(
            "chat rows need a tokenizer with a chat template, and this tokenizer has none",
            where=where,
            fix="use a tokenizer with a chat_template, or give prompt/completion strings",
        )
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    except Exception as e:  # jinja TemplateError, e.g. "roles must alternate"
        raise GradianUserError(
            f"chat template rejected the conversation: {e}", where=where, fix="fix the roles or the template"
        ) from None


def with_chat_template(tokenizer, template: str | None):
    """``tokenizer`` rendering chat with ``template`` (a shallow copy: the encoder is shared, the caller's tokenizer
    is left as it was); ``tokenizer`` itself when ``template`` is None or already its own.

    For the lanes that render through the tokenizer rather than a :class:`TokenizeSpec` (Evaluate's generation and
    likelihood prompts, verify's eval): with the run's training template they see the prompts the run trained on.
    """
    import copy

    if template is None or getattr(tokenizer, "chat_template", None) == template:
        return tokenizer
    out = copy.copy(tokenizer)
    out.chat_template = template
    return out


def _encode(tokenizer, text: str, add_special_tokens: bool) -> tuple[list[int], list[tuple[int, int]]]:
    enc = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


@dataclass(frozen=True)
class Rendered:
    """One example rendered to the string the trainer tokenises.

    Attributes:
        text: the full rendered string (prompt + completion, chat template applied).
        prompt_text: the rendered prompt whose tokens are masked, or None when every
            token is supervised (``text`` rows, an empty prompt).
        completion_char_start: where the completion's text starts in ``text``.
        add_special_tokens: False for chat rows (the template writes BOS/specials itself).
        supervised_spans: ``loss_on="assistant"`` on a chat row: the half-open character spans of
            ``text`` that are supervised (one per assistant turn); a token overlapping a span is
            supervised. None: the prompt rule above decides.
        content_spans: :attr:`TokenizeSpec.train_roles` on a chat row: the ``(start, end, trained)`` character span
            of each message's content in ``text``, in order (axolotl's rule; ``eos_id``: the tokenizer's EOS id).
        tokens: :attr:`TokenizeSpec.chat_rule` on a chat row: ``(ids, labels, offsets, full_length)`` the trainer's
            own rule built piece by piece, truncation included (the rule module's ``render_tokens``);
            they replace the ids of ``text``.
    """

    text: str
    prompt_text: str | None
    completion_char_start: int
    add_special_tokens: bool
    supervised_spans: tuple[tuple[int, int], ...] | None = None
    content_spans: tuple[tuple[int, int, bool], ...] | None = None
    eos_id: int | None = None
    tokens: tuple[list[int], list[int], list[tuple[int, int]], int] | None = None


_GENERATION_RE = re.compile(r"\{%-?\s*generation\s*-?%\}")


def has_generation_markers(template: str | None) -> bool:
    """True when a chat template marks the assistant's tokens with ``{% generation %}`` (what TRL's
    ``assistant_only_loss`` reads through ``return_assistant_tokens_mask``).
    """
    return bool(template) and _GENERATION_RE.search(template) is not None


def assistant_spans(
    tokenizer, messages: list[dict[str, str]], text: str, where: str, template: str | None = None
) -> tuple[tuple[int, int], ...]:
    """Character spans of ``text`` (``messages`` rendered in full, with ``template`` or the tokenizer's own) that
    are assistant turns.

    With ``{% generation %}`` markers in the template: the spans the template marks (transformers'
    ``render_jinja_template(return_assistant_tokens_mask=True)``, the spans ``apply_chat_template`` turns into
    ``assistant_masks`` for TRL). Without: assistant turn *i* spans from the end of
    ``render(messages[:i], add_generation_prompt=True)`` (or where it stops agreeing with ``text``) to the end
    of ``render(messages[:i+1])`` — the turn's content and the template's end-of-turn.
    """
    if template is None:
        template = getattr(tokenizer, "chat_template", None)
    if has_generation_markers(template):
        lite = getattr(tokenizer, "render_generation_spans", None)  # gradian.audit.tokenizer_lite, transformers-free
        try:
            if lite is not None:

                def render_jinja_template(conversations, chat_template, return_assistant_tokens_mask, **_):
                    return lite(conversations[0], chat_template)

            else:
                from transformers.utils.chat_template_utils import render_jinja_template
        except ImportError:  # transformers < 4.51
            raise GradianUserError(
                "reading the template's {% generation %} spans needs transformers >= 4.51",
                where=where,
                fix="upgrade transformers, or remove the {% generation %} markers to use turn-by-turn rendering",
            ) from None
        try:
            rendered, indices = render_jinja_template(
                conversations=[messages],
                chat_template=template,
                return_assistant_tokens_mask=True,
                **tokenizer.special_tokens_map,
            )
        except Exception as e:  # jinja TemplateError
            raise GradianUserError(
                f"chat template rejected the conversation: {e}", where=where, fix="fix the roles or the template"
            ) from None
        if rendered[0] != text:
            raise GradianUserError(
                "the chat template renders the conversation differently with its generation spans",
                where=where,
                fix="check the template's {% generation %} blocks",
            )
        return tuple((int(a), int(b)) for a, b in indices[0])
    spans = []
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        head = render_chat(tokenizer, messages[:i], True, where, template) if i else ""
        end = len(render_chat(tokenizer, messages[: i + 1], False, where, template))
        start = len(head) if text.startswith(head) else _common_prefix(head, text)
        if end > start:
            spans.append((start, end))
    return tuple(spans)


def content_spans(messages: list[dict[str, str]], text: str, roles: Sequence[str]) -> tuple[tuple[int, int, bool], ...]:
    """``(start, end, trained)`` of each message's content in ``text`` (the rendered conversation), in order.

    A message is trained when its role is in ``roles`` (``"*"``: every role). A content the template does not
    write verbatim is skipped (axolotl's ``find_turn`` does not find it either).
    """
    out = []
    pos = 0
    for m in messages:
        c = m.get("content")
        if not isinstance(c, str) or not c:
            continue
        a = text.find(c, pos)
        if a < 0:
            continue
        pos = a + len(c)
        out.append((a, pos, "*" in roles or m.get("role") in roles))
    return tuple(out)


def _content_labels(ids: Sequence[int], offsets: Sequence[tuple[int, int]], r: Rendered, rule: str) -> list[int]:
    """The labels axolotl 0.19.0 writes (``ChatTemplateStrategy._tokenize_single_prompt``).

    The content tokens of each trained message, and the first EOS within 3 tokens after each message's content per
    ``rule`` (``train_on_eos``).
    """
    out = [IGNORE_INDEX] * len(ids)
    last_eos = -1
    for a, b, trained in r.content_spans or ():
        toks = [t for t, (s, e) in enumerate(offsets) if s < b and e > a]
        if not toks:
            continue
        if trained:
            for t in toks:
                out[t] = ids[t]
        end = toks[-1] + 1
        eos = next((t for t in range(end, min(len(ids), end + 4)) if ids[t] == r.eos_id), -1)
        if eos != -1:
            last_eos = eos
            if rule == "all" or (rule == "turn" and trained):
                out[eos] = ids[eos]
    if rule == "last" and last_eos != -1:
        out[last_eos] = ids[last_eos]
    return out


def chat_rules() -> tuple[str, ...]:
    """The trainers' own rules :attr:`TokenizeSpec.chat_rule` takes (torchtune's, LLaMA-Factory's, axolotl's)."""
    from gradian.data import axolotl_rules, llamafactory_rules, torchtune_rules

    return torchtune_rules.RULES + llamafactory_rules.RULES + axolotl_rules.RULES


def _rule_rendered(row: list[dict[str, Any]] | dict[str, Any], tokenizer, spec: TokenizeSpec, where: str) -> Rendered:
    """A row built by the trainer's own rule (:attr:`TokenizeSpec.chat_rule`), its truncation included: torchtune's
    when ``spec.eos_truncate``, LLaMA-Factory's (``infer_seqlen`` per pair) always. ``row``: the messages, or an
    alpaca row's fields for axolotl's rule.
    """
    if spec.chat_rule.startswith("llamafactory_"):
        from gradian.data.llamafactory_rules import render_tokens

        max_length = spec.max_length
    elif spec.chat_rule.startswith("axolotl_"):
        from gradian.data.axolotl_rules import render_tokens

        max_length = None
    else:
        from gradian.data.torchtune_rules import render_tokens

        max_length = spec.max_length if spec.eos_truncate else None
    extra = {"default_system": spec.default_system} if spec.default_system is not None else {}
    text, start, ids, labels, offsets, full = render_tokens(
        row, tokenizer, spec.chat_rule, loss_on=spec.loss_on, max_length=max_length, where=where, **extra
    )
    return Rendered(text, None, start, False, tokens=(ids, labels, offsets, full))


def uses_rule(ex: Example, spec: TokenizeSpec) -> bool:
    """Whether ``ex`` is built by the trainer's own rule (:attr:`TokenizeSpec.chat_rule`) rather than a chat template
    or the plain rule: chat rows under torchtune's and LLaMA-Factory's rules, alpaca rows under all three.
    """
    rule = spec.chat_rule or ""
    if not rule:
        return False
    if ex.format == "alpaca":
        return True
    return ex.is_chat and not rule.startswith("axolotl_")  # axolotl's rule is for its instruction rows only


def _rule_row(ex: Example, spec: TokenizeSpec) -> list[dict[str, Any]] | dict[str, Any]:
    """What the trainer's rule reads of ``ex``: its messages (an alpaca row as LLaMA-Factory's converter or
    torchtune's ``AlpacaToMessages`` makes them), or the alpaca row's fields for axolotl's.
    """
    rule = spec.chat_rule or ""
    if ex.format == "alpaca":
        if rule.startswith("axolotl_"):
            return ex.raw
        if rule.startswith("llamafactory_"):
            from gradian.data.llamafactory_rules import alpaca_messages

            return alpaca_messages(ex.raw)
        from gradian.data.pieces import alpaca_prompt

        prompt = alpaca_prompt(str(ex.raw.get("instruction", "")), ex.raw.get("input") or None)
        return [{"role": "user", "content": prompt}, {"role": "assistant", "content": str(ex.raw.get("output", ""))}]
    prompt, completion = _chat_messages(ex)
    return prompt + completion


def _chat_messages(ex: Example) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A chat row's prompt and completion as message lists (a string side as one user / assistant message)."""
    prompt = ex.prompt if isinstance(ex.prompt, list) else [{"role": "user", "content": ex.prompt}]
    completion = ex.completion if isinstance(ex.completion, list) else [{"role": "assistant", "content": ex.completion}]
    return prompt, completion


def render_example(ex: Example, tokenizer, spec: TokenizeSpec, where: str | None = None) -> Rendered:
    """The string a trainer would tokenise for ``ex`` (see module docstring for the rules)."""
    where = where or f"example {ex.id}"
    if uses_rule(ex, spec):
        return _rule_rendered(_rule_row(ex, spec), tokenizer, spec, where)
    if ex.is_chat:
        prompt_msgs, compl_msgs = _chat_messages(ex)
        tpl = spec.chat_template
        prompt_text = render_chat(tokenizer, prompt_msgs, True, where, tpl)
        text = render_chat(tokenizer, prompt_msgs + compl_msgs, False, where, tpl)
        content = ex.completion_text
        found = text.rfind(content) if content else -1
        start = found if found >= 0 else len(prompt_text)
        if spec.train_roles is not None:
            cs = content_spans(prompt_msgs + compl_msgs, text, spec.train_roles)
            return Rendered(text, prompt_text or None, start, False, None, cs, tokenizer.eos_token_id)
        spans = (
            assistant_spans(tokenizer, prompt_msgs + compl_msgs, text, where, tpl)
            if spec.loss_on == "assistant"
            else None
        )
        return Rendered(text, prompt_text or None, start, False, spans)
    completion = ex.completion
    eos = tokenizer.eos_token
    if spec.add_eos and eos and not completion.endswith(eos):
        completion = completion + eos
    masked_prompt = None if (ex.format == "text" or not ex.prompt) else ex.prompt
    return Rendered(ex.prompt + completion, masked_prompt, len(ex.prompt), True)


def _span_labels(ids: Sequence[int], offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[int]:
    """``ids`` where a token overlaps one of ``spans`` (half-open character spans, in order), -100 elsewhere.

    The rule of transformers' ``assistant_masks``: token ``[s, e)`` is supervised when ``e > a`` and ``s < b``
    for the next span ``[a, b)`` not yet behind it.
    """
    out = [IGNORE_INDEX] * len(ids)
    k = 0
    for t, (s, e) in enumerate(offsets):
        while k < len(spans) and s >= spans[k][1]:
            k += 1
        if k == len(spans):
            break
        if e > spans[k][0]:
            out[t] = ids[t]
    return out


def build_tokenized(
    ex_id: str,
    r: Rendered,
    ids: list[int],
    offsets: list[tuple[int, int]],
    prompt_ids: list[int] | None,
    spec: TokenizeSpec,
) -> TokenizedExample:
    """Loss mask and truncation from the token ids of ``r.text`` (and of ``r.prompt_text``).

    The supervised tokens start where the prompt's and the full text's ids stop
    agreeing (TRL's common-prefix rule); ``loss_on="all"`` supervises everything;
    ``r.supervised_spans`` (``loss_on="assistant"``) supervises the tokens overlapping them;
    the first token is never a target; truncation keeps the start. ``r.tokens`` (a trainer's own rule,
    :attr:`TokenizeSpec.chat_rule`) replaces ``ids`` / ``offsets`` and the mask, its truncation already applied
    when ``spec.eos_truncate``.
    """
    if r.tokens is not None:
        ids, labels, offsets, full = r.tokens
        ids, labels = list(ids), list(labels)
        prompt_len = next((t for t, x in enumerate(labels) if x != IGNORE_INDEX), len(labels))
        if labels:
            labels[0] = IGNORE_INDEX
        n = spec.max_length
        if spec.drop_long and full > n:
            labels = [IGNORE_INDEX] * len(labels)
        return TokenizedExample(
            id=ex_id,
            input_ids=TokenIds(ids[:n]),
            labels=TokenIds(labels[:n]),
            offsets=TokenOffsets(offsets[:n]),
            text=r.text,
            completion_char_start=r.completion_char_start,
            full_length=full,
            truncated=full > n,
            prompt_length=prompt_len,
        )
    if prompt_ids is None:
        prompt_len = 0
    elif list(ids[: len(prompt_ids)]) == list(prompt_ids):  # the usual case, one list comparison
        prompt_len = len(prompt_ids)
    else:
        prompt_len = _common_prefix(prompt_ids, ids)
    if r.content_spans is not None:
        labels = _content_labels(ids, offsets, r, spec.train_on_eos)
    elif spec.loss_on == "all":
        labels = list(ids)
    elif r.supervised_spans is not None:
        labels = _span_labels(ids, offsets, r.supervised_spans)
    else:
        labels = [IGNORE_INDEX] * prompt_len + list(ids[prompt_len:])
    if labels:
        # The first token has no context, so it is never a target (the causal
        # shift drops it). Masking it explicitly keeps a left-padded batch from
        # asking the pad position before it to predict it.
        labels[0] = IGNORE_INDEX
    full = len(ids)
    truncated = full > spec.max_length
    if truncated and spec.drop_long:  # the trainer never trained on it
        labels = [IGNORE_INDEX] * len(labels)
    if truncated:
        ids, labels, offsets = ids[: spec.max_length], labels[: spec.max_length], offsets[: spec.max_length]
    return TokenizedExample(
        id=ex_id,
        input_ids=TokenIds(ids),
        labels=TokenIds(labels),
        offsets=offsets if isinstance(offsets, TokenOffsets) else TokenOffsets(offsets),
        text=r.text,
        completion_char_start=r.completion_char_start,
        full_length=full,
        truncated=truncated,
        prompt_length=prompt_len,
    )


def tokenize_example(ex: Example, tokenizer, spec: TokenizeSpec, where: str | None = None) -> TokenizedExample:
    """Tokenise one example as TRL's SFTTrainer would (see module docstring)."""
    r = render_example(ex, tokenizer, spec, where)
    if r.tokens is not None:  # a trainer's own rule: the ids are built already
        return build_tokenized(ex.id, r, [], [], None, spec)
    ids, offsets = _encode(tokenizer, r.text, r.add_special_tokens)
    p_ids = None if r.prompt_text is None else _encode(tokenizer, r.prompt_text, r.add_special_tokens)[0]
    return build_tokenized(ex.id, r, ids, offsets, p_ids, spec)


def tokenize_examples(examples: Sequence[Example], tokenizer, spec: TokenizeSpec) -> list[TokenizedExample]:
    """:func:`tokenize_example` over ``examples``, in order."""
    return [tokenize_example(ex, tokenizer, spec) for ex in examples]


#: what a :class:`LazyItems` keeps of each item (and :func:`row_values` reads without building it)
ROW_FIELDS = ("id", "length", "n_supervised", "full_length", "truncated")


class LazyItems(Sequence[TokenizedExample]):
    """Tokenised items built when one is read; what stays in memory is :data:`ROW_FIELDS` per item.

    A subclass records each item's fields once (:meth:`_record`) and builds the item on demand
    (:meth:`_load`). A consumer that goes through the items once per shard, like the index build,
    so holds one shard's tokens at a time instead of the whole set's (about 2.4 kB a row of 94
    tokens). :func:`row_values` reads the recorded fields without building an item.

    Attributes:
        ids: (n,) item ids; length, n_supervised, full_length: (n,) int32; truncated: (n,) int8.
    """

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.length = array("i")
        self.n_supervised = array("i")
        self.full_length = array("i")
        self.truncated = array("b")

    def _record(self, item_id: str, length: int, n_supervised: int, full_length: int, truncated: bool) -> None:
        self.ids.append(item_id)
        self.length.append(length)
        self.n_supervised.append(n_supervised)
        self.full_length.append(int(full_length))
        self.truncated.append(bool(truncated))

    def _record_item(self, it: TokenizedExample) -> None:
        self._record(it.id, len(it.input_ids), it.n_supervised, it.full_length, it.truncated)

    @abstractmethod
    def _load(self, k: int) -> TokenizedExample:
        """Item ``k``, built now (``0 <= k < len(self)``)."""

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, k):  # type: ignore[override]
        if isinstance(k, slice):
            return [self._load(i) for i in range(*k.indices(len(self)))]
        if k < 0:
            k += len(self)
        if not 0 <= k < len(self):
            raise IndexError(k)
        return self._load(k)


class TokenizedRows(LazyItems):
    """A training set's tokenised rows, tokenised again when a row is read (:class:`LazyItems`).

    Construction tokenises every row once, so a row that cannot be tokenised fails here, with its
    ``where``, before any model pass. Reading ``rows[k]`` tokenises row k again (tokenisation is
    deterministic: the same ids, labels and offsets).

    Args:
        examples: the rows, in index order (held by reference: their text stays in memory).
        tokenize: ``example -> TokenizedExample`` (e.g. :func:`tokenize_example` with the spec and
            a ``where`` naming the file and row).
    """

    def __init__(self, examples: Sequence[Example], tokenize: Callable[[Example], TokenizedExample]) -> None:
        super().__init__()
        self._examples = examples
        self._tokenize = tokenize
        for ex in examples:
            self._record_item(tokenize(ex))

    def _load(self, k: int) -> TokenizedExample:
        return self._tokenize(self._examples[k])


def row_values(items: Sequence[TokenizedExample], name: str) -> Sequence[Any]:
    """One per-row value of ``items`` (a field of :data:`ROW_FIELDS`: the id, or a number), without
    building the items of a :class:`LazyItems`; read off the items of a plain list.
    """
    if name not in ROW_FIELDS:
        raise ValueError(f"{name!r} is not one of {ROW_FIELDS}")
    if isinstance(items, LazyItems):
        return items.ids if name == "id" else getattr(items, name)
    if name == "id":
        return [getattr(it, "id", None) for it in items]
    if name == "length":
        return [len(it.input_ids) for it in items]
    return [int(getattr(it, name)) for it in items]


def collate(
    items: Sequence[TokenizedExample],
    pad_token_id: int,
    padding_side: Literal["right", "left"] = "right",
    label_masks: Sequence[Sequence[bool]] | None = None,
) -> dict[str, torch.Tensor]:
    """Pad a batch.

    Args:
        items: tokenised examples.
        pad_token_id: id written into padding (never supervised: labels there are -100,
            so a pad id equal to EOS does not mask real EOS tokens).
        padding_side: ``"right"`` or ``"left"``.
        label_masks: optional per-example token masks (e.g. one sentence's tokens);
            labels outside the mask become -100.

    Returns:
        ``input_ids``, ``attention_mask``, ``labels``, ``position_ids``: each (b, T) long.
        ``position_ids`` count real tokens only, so left padding does not shift positions.
    """
    import torch  # here, not at module level: tokenising (gradian diagnose) needs no torch

    if not items:
        raise ValueError("empty batch")
    T = max(len(it.input_ids) for it in items)
    b = len(items)
    input_ids = torch.full((b, T), pad_token_id, dtype=torch.long)
    attn = torch.zeros((b, T), dtype=torch.long)
    labels = torch.full((b, T), IGNORE_INDEX, dtype=torch.long)
    for i, it in enumerate(items):
        n = len(it.input_ids)
        lab = list(it.labels)
        if label_masks is not None:
            lab = [x if m else IGNORE_INDEX for x, m in zip(lab, label_masks[i])]
        sl = slice(T - n, T) if padding_side == "left" else slice(0, n)
        input_ids[i, sl] = torch.tensor(list(it.input_ids), dtype=torch.long)
        attn[i, sl] = 1
        labels[i, sl] = torch.tensor(lab, dtype=torch.long)
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": input_ids, "attention_mask": attn, "labels": labels, "position_ids": position_ids}
