"""The eval set: one row per question, grouped into capabilities.

File: JSONL, or anything :func:`gradian.data.formats.read_records` reads (JSON,
Parquet, a ``datasets`` ``save_to_disk`` folder). One row per item:

==============  ========================================================  =========
field           meaning                                                   required
==============  ========================================================  =========
``prompt``      the question: a string, or a list of chat messages        one of
``messages``    chat messages (``{"role", "content"}``) to continue; the   these two
                conversation must not end with an assistant turn
``answer``      the correct answer (a non-empty string)                   yes
``aliases``     other accepted answers (a list of strings)                no
``capability``  the capability tag the item counts towards                yes
``metric``      ``exact_match``, ``contains`` or ``loglik``               no (``exact_match``)
``id``          a unique id (stringified); default: the 0-based row        no
==============  ========================================================  =========

The file may instead be lm-evaluation-harness ``--log_samples`` output: a
``samples_<task>_<date>.jsonl`` file, or the folder lm-eval wrote (every
``samples_*.jsonl`` in it, one capability each); see :mod:`gradian.evaluate.lm_eval`.
It is recognised by its name or by its lines' fields (``doc_id``, ``target``,
``arguments``, ``resps``, ``filtered_resps`` and no ``prompt``/``messages``), so a
Gradian eval file is read as before.

Every item of one capability must use the same metric (a capability's score
is the mean item score, which only means something for one metric). Errors are
one line naming ``file:line`` (JSONL) or ``file[row]`` and the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradian.data.formats import Example, _check_messages, read_records
from gradian.errors import GradianUserError
from gradian.util import attrs

METRICS = ("exact_match", "contains", "loglik")
DEFAULT_METRIC = "exact_match"
#: Metrics that generate text (and so can build a contrastive query).
GENERATIVE_METRICS = ("exact_match", "contains")


@dataclass
class EvalItem:
    """One eval question.

    Attributes:
        id: unique id (the row's ``id`` field, else its 0-based row number).
        row: 0-based row in the file.
        capability: capability tag.
        metric: ``"exact_match"``, ``"contains"`` or ``"loglik"``.
        prompt: the question as given: a string, or a list of chat messages.
        answer: the correct answer.
        aliases: other accepted answers.
        where: ``file:line`` for messages about this item.
        raw: the string prompt is already rendered (an lm-eval sample's prompt): it is
            tokenised as-is, never wrapped in the chat template.
        stop: strings that end a generated answer (an lm-eval sample's ``until``): the text is cut before the first.
        ends: a ``loglik`` score covers the end of the answer too (EOS, or the chat template's end of turn), as a
            training row supervises it. False for an lm-eval sample: its score is lm-eval's own
            ``log p(continuation | context)`` (:func:`gradian.evaluate.likelihood.score_continuations`).
    """

    id: str
    row: int
    capability: str
    metric: str
    prompt: str | list[dict[str, str]]
    answer: str
    aliases: list[str] = field(default_factory=list)
    where: str = ""
    raw: bool = False
    stop: list[str] = field(default_factory=list)
    ends: bool = True

    @property
    def accepted(self) -> list[str]:
        """The answer followed by its aliases."""
        return [self.answer, *self.aliases]

    @property
    def is_chat(self) -> bool:
        return isinstance(self.prompt, list)

    def to_dict(self) -> dict[str, Any]:
        return {**attrs(self, "id", "row", "capability", "metric", "prompt", "answer"), "aliases": list(self.aliases)}


def model_prompt(prompt: str | list[dict[str, str]], tokenizer, use_chat_template: bool) -> str | list[dict[str, str]]:
    """The prompt in the form the model is run on.

    Message lists stay message lists (they always go through the chat template).
    A string prompt becomes ``[{"role": "user", "content": prompt}]`` when
    ``use_chat_template`` and the tokenizer has a chat template, else it stays
    a plain string (tokenised as-is, like a plain prompt/completion training row).
    """
    if isinstance(prompt, list):
        return prompt
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        return [{"role": "user", "content": prompt}]
    return prompt


def as_example(item_id: str, prompt: str | list[dict[str, str]], completion: str) -> Example:
    """An :class:`~gradian.data.formats.Example` pairing a (model-form) prompt with a completion.

    Tokenised by :func:`gradian.data.tokenize.tokenize_example` exactly like a
    training row: a message-list prompt renders through the chat template with
    ``completion`` as the assistant turn (the template writes the end-of-turn
    token); a string prompt gets ``prompt + completion + EOS``.
    """
    fmt = "prompt_completion"
    return Example(id=item_id, row=-1, format=fmt, prompt=prompt, completion=completion, raw={})


def _where(p: Path, i: int) -> str:
    return f"{p}:{i + 1}" if p.suffix.lower() == ".jsonl" else f"{p}[{i}]"


def parse_item(rec: dict[str, Any], row: int, where: str) -> EvalItem:
    """Validate and normalise one raw record (``where`` names it in errors)."""
    has_prompt = rec.get("prompt") is not None
    has_msgs = rec.get("messages") is not None
    if has_prompt and has_msgs:
        raise GradianUserError(
            "row has both 'prompt' and 'messages'", where=where, fix="give the question in exactly one of them"
        )
    if not has_prompt and not has_msgs:
        raise GradianUserError(
            "missing field 'prompt' (or 'messages')",
            where=where,
            fix='add "prompt": "<question>" or "messages": [{"role": "user", "content": ...}]',
        )
    if has_msgs:
        prompt: str | list[dict[str, str]] = _check_messages(rec["messages"], where, "messages")
    elif isinstance(rec["prompt"], list):
        prompt = _check_messages(rec["prompt"], where, "prompt")
    elif isinstance(rec["prompt"], str):
        prompt = rec["prompt"]
        if not prompt.strip():
            raise GradianUserError("field 'prompt' is empty", where=where, fix="write the question in 'prompt'")
    else:
        raise GradianUserError(
            f"field 'prompt' is a {type(rec['prompt']).__name__}, not a string or a message list",
            where=where,
            fix="make 'prompt' a string",
        )
    if isinstance(prompt, list) and prompt[-1]["role"] == "assistant":
        key = "messages" if has_msgs else "prompt"
        raise GradianUserError(
            f"{key!r} ends with an assistant turn",
            where=where,
            fix="end the conversation with the user's question and put the expected reply in 'answer'",
        )

    answer = rec.get("answer")
    if answer is None:
        raise GradianUserError("missing field 'answer'", where=where, fix='add "answer": "<correct answer>"')
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(answer, str):
        raise GradianUserError(
            f"field 'answer' is a {type(answer).__name__}, not a string", where=where, fix="make 'answer' a string"
        )
    if not answer.strip():
        raise GradianUserError("field 'answer' is empty", where=where, fix="give the correct answer in 'answer'")

    aliases = rec.get("aliases")
    if aliases is None:
        aliases = []
    if not isinstance(aliases, list) or not all(isinstance(a, (str, int, float)) for a in aliases):
        raise GradianUserError(
            "field 'aliases' must be a list of strings", where=where, fix='use "aliases": ["alt 1", "alt 2"]'
        )
    aliases = [str(a) for a in aliases]
    if any(not a.strip() for a in aliases):
        raise GradianUserError("field 'aliases' holds an empty string", where=where, fix="remove the empty alias")

    cap = rec.get("capability")
    if cap is None:
        raise GradianUserError(
            "missing field 'capability'", where=where, fix='add "capability": "<tag>", e.g. "capitals"'
        )
    if not isinstance(cap, (str, int)) or not str(cap).strip():
        raise GradianUserError(
            "field 'capability' must be a non-empty string", where=where, fix='use "capability": "<tag>"'
        )

    metric = rec.get("metric", DEFAULT_METRIC)
    if metric is None:
        metric = DEFAULT_METRIC
    if metric not in METRICS:
        raise GradianUserError(
            f"unknown metric {metric!r} in field 'metric'", where=where, fix=f"use one of {', '.join(METRICS)}"
        )
    item_id = str(rec["id"]) if rec.get("id") is not None else str(row)
    return EvalItem(
        id=item_id,
        row=row,
        capability=str(cap).strip(),
        metric=metric,
        prompt=prompt,
        answer=answer,
        aliases=aliases,
        where=where,
    )


def check_items(items: list[EvalItem], source: str = "eval set") -> None:
    """Set-level rules: not empty, unique ids, one metric per capability."""
    if not items:
        raise GradianUserError("eval set is empty", where=source, fix="give at least one item")
    seen: dict[str, EvalItem] = {}
    metric_of: dict[str, EvalItem] = {}
    for it in items:
        if it.id in seen:
            raise GradianUserError(
                f"duplicate id {it.id!r} (also {seen[it.id].where or 'row ' + str(seen[it.id].row)})",
                where=it.where or source,
                fix="make 'id' unique, or drop the field to use row numbers",
            )
        seen[it.id] = it
        first = metric_of.setdefault(it.capability, it)
        if first.metric != it.metric:
            raise GradianUserError(
                f"field 'metric' is {it.metric!r} but capability {it.capability!r} already uses "
                f"{first.metric!r} ({first.where or 'row ' + str(first.row)})",
                where=it.where or source,
                fix="use one metric per capability, or give the items different capability tags",
            )


def load_eval_set(path: str | Path) -> list[EvalItem]:
    """Read and validate an eval set file (see the module docstring for the format).

    ``path`` may also be lm-eval ``--log_samples`` output (a samples file or its folder).

    Raises:
        GradianUserError: one line naming the file and row for a missing field,
            an unknown metric, an empty set, a duplicate id, or mixed metrics.
    """
    p = Path(path)
    from gradian.evaluate.lm_eval import read_lm_eval, samples_files

    lm_files = samples_files(p)
    if lm_files:
        items = []
        for row, (rec, where) in enumerate(read_lm_eval(lm_files)):
            raw, ends, stop = bool(rec.pop("_raw")), bool(rec.pop("_ends", True)), list(rec.pop("_stop", []))
            it = parse_item(rec, row, where)
            it.raw, it.ends, it.stop = raw and isinstance(it.prompt, str), ends, stop
            items.append(it)
        check_items(items, str(p))
        return items
    records = read_records(p)
    if not records:
        raise GradianUserError("eval set is empty", where=str(p), fix="give a file with at least one item")
    items = [parse_item(r, i, _where(p, i)) for i, r in enumerate(records)]
    check_items(items, str(p))
    return items


def items_from_records(records: list[dict[str, Any]], source: str = "eval set") -> list[EvalItem]:
    """Build items from in-memory dicts (same rules as :func:`load_eval_set`)."""
    items = [parse_item(r, i, f"{source}[{i}]") for i, r in enumerate(records)]
    check_items(items, source)
    return items
