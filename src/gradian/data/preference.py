"""Preference rows (DPO/ORPO/KTO data): a row kind of their own, read by their fields.

Audit (``gradian diagnose --data``) reads these; attribution does not (it scores SFT losses), so
:func:`gradian.data.formats.to_example` refuses them with :class:`PreferenceRowsError`.

Recognised shapes (``kind``: fields; the documented format each follows):

- ``trl``: ``prompt`` (optional) + ``chosen`` + ``rejected``, strings or message lists; without ``prompt``
  the prompt is the shared leading turns (TRL docs, "Dataset formats": preference, explicit and implicit
  prompt; ``trl.data_utils.extract_prompt``). alignment-handbook's ``*_prefs`` splits are this form.
- ``trl_kto``: ``prompt`` + ``completion`` + ``label`` (bool) (TRL docs: unpaired preference, KTO).
- ``axolotl_intel``: ``question`` + ``chosen`` + ``rejected`` (+ ``system``) (axolotl docs, RLHF:
  ``chatml.intel``).
- ``axolotl_argilla``: ``instruction`` + ``chosen_response`` + ``rejected_response`` (+ ``system``)
  (axolotl docs, RLHF: ``chatml.argilla``).
- ``axolotl_icr``: ``input`` + ``chosen`` + ``rejected`` (+ ``system``) (axolotl docs, RLHF: ``chatml.icr``).
- ``axolotl_chat``: ``messages`` (or ``conversation``) + ``chosen`` + ``rejected``, each response a message
  dict, a message list or a string (axolotl docs, RLHF: ``chat_template.default``, whose ``field_messages``
  names the conversation field).
- ``llamafactory_sharegpt``: ``conversations`` (``from``/``value``) + ``chosen`` + ``rejected`` (one message
  object each) (LLaMA-Factory data/README.md: preference dataset, sharegpt format).
- ``llamafactory_alpaca``: ``instruction`` (+ ``input``) + ``chosen`` + ``rejected`` (LLaMA-Factory
  data/README.md: preference dataset, alpaca format).
- ``llamafactory_kto``: ``messages``/``conversations`` + ``kto_tag`` (bool) (LLaMA-Factory data/README.md: KTO), or
  ``label`` as LLaMA-Factory's own data/kto_en_demo.json names the column.

A ``trl`` row whose ``prompt`` is a string while ``chosen``/``rejected`` are whole conversations (the prompt turn
included: HuggingFaceH4/ultrafeedback_binarized, which also carries a ``messages`` column; axolotl
``chat_template.argilla``) takes the shared leading turns as the prompt, as TRL's ``maybe_extract_prompt`` does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradian.errors import GradianUserError

Messages = list[dict[str, str]]

#: What attribution supports, said once (``gradian attribute`` / ``gradian index`` refuse preference rows with it).
REFUSAL = (
    "preference rows ({kind}: {fields}): gradian attribute and gradian index score SFT rows only "
    "(prompt/completion, messages, alpaca, text); preference losses (DPO, KTO, ORPO) are not supported yet"
)


class PreferenceRowsError(GradianUserError):
    """A preference row was given where SFT rows are needed (attribution)."""


@dataclass
class PreferenceExample:
    """One preference row, normalised.

    Attributes:
        id: the row's ``id`` field (stringified), else its 0-based row number.
        row: 0-based row number.
        kind: the shape it was read as (module table).
        prompt: a string or a message list (``[{"role", "content"}]``); ``""`` when there is none.
        chosen: the preferred response (string or message list); for KTO, the completion.
        rejected: the dispreferred response; None for KTO rows.
        label: KTO's desirable (True) / undesirable (False); None for pairs.
        where: ``file:LINE`` (JSONL) or ``file[i]``.
    """

    id: str
    row: int
    kind: str
    prompt: str | Messages
    chosen: str | Messages
    rejected: str | Messages | None
    label: bool | None = None
    where: str = ""
    raw: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def is_kto(self) -> bool:
        return self.label is not None

    @property
    def prompt_without_system(self) -> str:
        """The prompt's text without its system turn: a message list's non-system contents; a string prompt less
        the row's ``system`` field that :func:`to_preference` put in front of it (axolotl's ``chatml.intel`` and
        ``chatml.icr``).
        """
        if isinstance(self.prompt, list):
            return without_system(self.prompt)
        system = self.raw.get("system")
        if isinstance(system, str) and system and self.prompt.startswith(system + "\n\n"):
            return self.prompt[len(system) + 2 :]
        return self.prompt

    @property
    def prompt_text(self) -> str:
        return _text(self.prompt, "\n")

    @property
    def chosen_text(self) -> str:
        return _text(self.chosen, "")

    @property
    def rejected_text(self) -> str:
        return _text(self.rejected, "") if self.rejected is not None else ""


def without_system(prompt: Any) -> str:
    """A prompt's text without its system turns: a message list's other messages' contents (joined by newlines);
    a string as it is.
    """
    if isinstance(prompt, list):
        return "\n".join(str(m.get("content", "")) for m in prompt if isinstance(m, dict) and m.get("role") != "system")
    return "" if prompt is None else str(prompt)


def _text(x: Any, sep: str) -> str:
    if isinstance(x, list):
        return sep.join(str(m.get("content", "")) for m in x)
    return "" if x is None else str(x)


def preference_kind(rec: dict[str, Any]) -> str | None:
    """The preference shape of a raw row by its fields (module table), or None for any other row."""
    if "chosen_response" in rec and "rejected_response" in rec:
        return "axolotl_argilla"
    if _kto_tag(rec) is not None and ("messages" in rec or "conversations" in rec):
        return "llamafactory_kto"
    if isinstance(rec.get("label"), bool) and "prompt" in rec and "completion" in rec:
        return "trl_kto"
    if "chosen" not in rec or "rejected" not in rec:
        return None
    if "prompt" in rec:  # before messages: HuggingFaceH4/ultrafeedback_binarized rows also carry a 'messages' copy
        return "trl"
    if "conversations" in rec:
        return "llamafactory_sharegpt"
    if "messages" in rec or "conversation" in rec:
        return "axolotl_chat"
    if "question" in rec:
        return "axolotl_intel"
    if "instruction" in rec:
        return "llamafactory_alpaca"
    if "prompt" not in rec and "input" in rec:
        return "axolotl_icr"
    return "trl"


def _kto_tag(rec: dict[str, Any]) -> bool | None:
    """LLaMA-Factory's KTO tag: the ``kto_tag`` column, or ``label`` as its own demo data names it
    (data/kto_en_demo.json with ``"columns": {"messages": "messages", "kto_tag": "label"}`` in dataset_info.json).
    """
    for key in ("kto_tag", "label"):
        if isinstance(rec.get(key), bool):
            return rec[key]
    return None


def _conversational(x: Any) -> bool:
    """TRL ``is_conversational``: a list of role/content dicts."""
    return isinstance(x, list) and bool(x) and isinstance(x[0], dict) and "role" in x[0]


def refusal(rec: dict[str, Any], kind: str, where: str) -> PreferenceRowsError:
    """The one-line refusal for attribution (see :data:`REFUSAL`)."""
    return PreferenceRowsError(
        REFUSAL.format(kind=kind, fields=", ".join(sorted(rec))),
        where=where,
        fix="audit it with `gradian diagnose --data FILE`; attribute the SFT dataset the adapter was trained on",
    )


_ROLES = {"human": "user", "gpt": "assistant", "observation": "tool", "function_call": "assistant"}


def _message(m: Any, where: str, name: str) -> dict[str, str]:
    if not isinstance(m, dict):
        raise GradianUserError(f"{name} is not a message object", where=where, fix='use {"role": ..., "content": ...}')
    role = m.get("role", m.get("from"))
    content = m.get("content", m.get("value"))
    if not isinstance(role, str) or content is None:
        raise GradianUserError(
            f"{name} needs a role and a content (role/content or from/value)",
            where=where,
            fix='use {"role": "assistant", "content": "..."}',
        )
    return {"role": _ROLES.get(role, role), "content": content if isinstance(content, str) else str(content)}


def _messages(x: Any, where: str, name: str) -> Messages:
    if not isinstance(x, list):
        raise GradianUserError(f"field {name!r} must be a list of messages", where=where, fix="use a message list")
    return [_message(m, where, f"{name}[{j}]") for j, m in enumerate(x)]


def _response(x: Any, where: str, name: str) -> str | Messages:
    """A response field: a string, one message object, or a message list."""
    if x is None:
        raise GradianUserError(f"missing field {name!r} (preference row)", where=where, fix=f"add a {name!r} response")
    if isinstance(x, str):
        return x
    if isinstance(x, dict):
        return [_message(x, where, name)]
    if isinstance(x, list):
        return _messages(x, where, name)
    raise GradianUserError(
        f"field {name!r} is a {type(x).__name__}", where=where, fix="use a string or a message (list)"
    )


def _with_system(rec: dict[str, Any], prompt: str) -> str:
    system = rec.get("system")
    return f"{system}\n\n{prompt}" if isinstance(system, str) and system else prompt


def _split_implicit(chosen: Any, rejected: Any) -> tuple[Any, Any, Any]:
    """TRL ``extract_prompt`` (trl 1.16.0 data_utils.py): the prompt is the common prefix of turns (strings:
    characters) up to the first difference, a space before it going with the responses.
    """
    if not (isinstance(chosen, list) and isinstance(rejected, list)) and not (
        isinstance(chosen, str) and isinstance(rejected, str)
    ):
        return "", chosen, rejected
    idx = 0
    for idx in range(min(len(chosen), len(rejected))):
        if chosen[idx] != rejected[idx]:
            if idx > 0 and chosen[idx - 1] == " ":
                idx -= 1
            break
    return chosen[:idx], chosen[idx:], rejected[idx:]


def to_preference(rec: dict[str, Any], row: int, where: str) -> PreferenceExample:
    """Normalise one raw preference row (``preference_kind(rec)`` must not be None)."""
    kind = preference_kind(rec)
    if kind is None:
        raise GradianUserError(
            f"not a preference row (fields: {', '.join(sorted(rec)) or 'none'})",
            where=where,
            fix="give every row of a preference file prompt/chosen/rejected (or prompt/completion/label for KTO)",
        )
    ex_id = str(rec["id"]) if rec.get("id") is not None else str(row)
    label: bool | None = None
    rejected: Any
    if kind == "trl_kto":
        prompt, chosen, rejected, label = rec["prompt"], rec["completion"], None, rec["label"]
        if isinstance(prompt, list) or isinstance(chosen, list):
            prompt, chosen = _messages(prompt, where, "prompt"), _messages(chosen, where, "completion")
    elif kind == "llamafactory_kto":
        key = "messages" if "messages" in rec else "conversations"
        msgs = _messages(rec[key], where, key)
        last = max((i for i, m in enumerate(msgs) if m["role"] == "assistant"), default=None)
        if last is None:
            raise GradianUserError(f"{key!r} has no assistant turn", where=where, fix="end with the response")
        prompt, chosen, rejected, label = msgs[:last], msgs[last:], None, _kto_tag(rec)
    elif kind == "axolotl_argilla":
        prompt = _with_system(rec, str(rec.get("instruction") or ""))
        chosen = _response(rec.get("chosen_response"), where, "chosen_response")
        rejected = _response(rec.get("rejected_response"), where, "rejected_response")
    else:
        chosen = _response(rec.get("chosen"), where, "chosen")
        rejected = _response(rec.get("rejected"), where, "rejected")
        if kind in ("llamafactory_sharegpt", "axolotl_chat"):
            key = next(k for k in ("conversations", "messages", "conversation") if k in rec)
            prompt = _messages(rec[key], where, key)
        elif kind == "axolotl_intel":
            prompt = _with_system(rec, str(rec.get("question") or ""))
        elif kind == "axolotl_icr":
            prompt = _with_system(rec, str(rec.get("input") or ""))
        elif kind == "llamafactory_alpaca":
            inp = rec.get("input") or ""
            prompt = f"{rec['instruction']}\n\n{inp}" if inp else str(rec["instruction"] or "")
        elif rec.get("prompt") is not None and _conversational(rec["prompt"]) == _conversational(rec.get("chosen")):
            p = rec["prompt"]
            prompt = _messages(p, where, "prompt") if isinstance(p, list) else _with_system(rec, str(p))
        else:
            # no prompt, or a string prompt next to whole conversations (HuggingFaceH4/ultrafeedback_binarized,
            # axolotl chat_template.argilla): TRL maybe_extract_prompt takes the shared leading turns
            if isinstance(chosen, list) and isinstance(rejected, list):
                chosen = _messages(chosen, where, "chosen")
                rejected = _messages(rejected, where, "rejected")
            prompt, chosen, rejected = _split_implicit(chosen, rejected)
    if not isinstance(chosen, (str, list)):
        raise GradianUserError("the response must be a string or a message list", where=where, fix="fix the row")
    return PreferenceExample(ex_id, row, kind, prompt, chosen, rejected, label, where, rec)


def preference_rows(records: list[dict[str, Any]], path: str | Path) -> list[PreferenceExample] | None:
    """The rows as :class:`PreferenceExample` when the first row is a preference row, else None.

    Every row must then be a preference row of the same family (pairs, or KTO); ids must be unique.
    """
    if not records or not isinstance(records[0], dict) or preference_kind(records[0]) is None:
        return None
    p = Path(path)
    jsonl = p.suffix.lower() == ".jsonl"
    out = [to_preference(r, i, f"{p}:{i + 1}" if jsonl else f"{p}[{i}]") for i, r in enumerate(records)]
    seen: dict[str, int] = {}
    for ex in out:
        if ex.is_kto != out[0].is_kto:
            raise GradianUserError(
                "the file mixes paired (chosen/rejected) and unpaired (KTO label) preference rows",
                where=ex.where,
                fix="keep DPO pairs and KTO rows in separate files",
            )
        if ex.id in seen:
            raise GradianUserError(
                f"duplicate id {ex.id!r} (also row {seen[ex.id] + 1})", where=ex.where, fix="make 'id' unique"
            )
        seen[ex.id] = ex.row
    return out
