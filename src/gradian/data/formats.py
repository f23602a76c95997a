"""Training/eval rows in the formats practitioners train on.

Supported files: JSONL (``.jsonl``), JSON (a list of objects, or an object with
a ``"data"`` list), Parquet (``.parquet``), and an HF ``datasets``
``save_to_disk`` folder. Supported row shapes (detected per row):

===================  ================================================  =========================
format               fields                                            supervised part
===================  ================================================  =========================
``prompt_completion`` ``prompt`` + ``completion`` (strings, or lists      the completion
                      of chat messages: TRL's conversational form)
``messages``          ``messages`` (or ``conversations``): a list of     the final assistant turn
                      ``{"role", "content"}``
``alpaca``            ``instruction`` + ``output`` (+ optional           the output
                      ``input``)
``text``              ``text``                                          every token
===================  ================================================  =========================

Preference rows (``chosen``/``rejected``, KTO ``label``) are a row kind of their own
(:mod:`gradian.data.preference`); :func:`to_example` refuses them.

Example ids are stable: the row's ``id`` field when present (stringified),
else its 0-based row number.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradian.data.preference import preference_kind, refusal
from gradian.errors import GradianUserError, first_line
from gradian.safeio import (
    check_regular_file,
    check_size,
    iter_lines,
    load_json_file,
    nesting_problem,
    parse_json,
    short_repr,
)

FORMATS = ("prompt_completion", "messages", "alpaca", "text")
CHAT_ROLES = ("system", "user", "assistant", "tool")


@dataclass
class Example:
    """One training (or eval) row, normalised.

    ``prompt`` and ``completion`` are either strings or lists of chat messages
    (``[{"role": ..., "content": ...}]``). For the ``text`` format ``prompt`` is
    empty and ``completion`` holds the text.
    """

    id: str
    row: int
    format: str
    prompt: str | list[dict[str, str]]
    completion: str | list[dict[str, str]]
    raw: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def is_chat(self) -> bool:
        return isinstance(self.prompt, list) or isinstance(self.completion, list)

    @property
    def completion_text(self) -> str:
        """The supervised text as a plain string (a chat completion's content)."""
        if isinstance(self.completion, list):
            return "".join(str(m.get("content", "")) for m in self.completion)
        return self.completion

    @property
    def prompt_text(self) -> str:
        if isinstance(self.prompt, list):
            return "\n".join(str(m.get("content", "")) for m in self.prompt)
        return self.prompt


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Read raw records (dicts) from a JSONL/JSON/Parquet file or a save_to_disk folder.

    Reads are bounded (:mod:`gradian.safeio`): only regular files (a FIFO or ``/dev/zero`` is
    refused), a size and a line limit, a nesting limit. Raises :class:`GradianUserError` naming
    the file and line for malformed input.
    """
    p = Path(path)
    if not p.exists():
        raise GradianUserError("file not found", where=str(p), fix="check the path")
    if p.is_dir():
        return _read_hf_folder(p)
    suffix = p.suffix.lower()
    if suffix not in (".jsonl", ".json", ".parquet"):
        raise GradianUserError(
            f"unknown data file type {suffix or '(no extension)'!r}",
            where=str(p),
            fix="use .jsonl, .json, .parquet or a datasets save_to_disk folder",
        )
    st = check_regular_file(p, "data file")
    check_size(p, st.st_size, "data file")
    if suffix == ".jsonl":
        return _read_jsonl(p)
    if suffix == ".json":
        return _read_json(p)
    return _read_parquet(p)


def _read_jsonl(p: Path) -> list[dict[str, Any]]:
    records = []
    for i, line in iter_lines(p, "data file"):
        if not line.strip():
            continue
        obj = parse_json(line, str(p), line=i, fix="make every line one complete JSON object")
        if not isinstance(obj, dict):
            raise GradianUserError(
                f"line is a JSON {type(obj).__name__}, not an object",
                where=f"{p}:{i}",
                fix='make every line one JSON object such as {"prompt": ..., "completion": ...}',
            )
        records.append(obj)
    return records


def _read_json(p: Path) -> list[dict[str, Any]]:
    obj = load_json_file(p, "data file", fix="fix the JSON, or use JSONL with one object per line")
    if isinstance(obj, dict) and isinstance(obj.get("data"), list):
        obj = obj["data"]
    if not isinstance(obj, list):
        raise GradianUserError(
            "top level is not a list of rows", where=str(p), fix='use [{...}, {...}] or {"data": [...]}'
        )
    for i, r in enumerate(obj):
        if not isinstance(r, dict):
            raise GradianUserError(
                f"row is a JSON {type(r).__name__}, not an object", where=f"{p}[{i}]", fix="make every row an object"
            )
    return obj


def _read_parquet(p: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(p).to_pylist()
    except Exception as e:  # pyarrow raises several types for a bad file
        raise GradianUserError(
            f"not a readable Parquet file ({type(e).__name__})", where=str(p), fix="re-export the file"
        ) from None
    _check_rows_nesting(rows, p)
    return rows


def _read_hf_folder(p: Path) -> list[dict[str, Any]]:
    if not (p / "dataset_info.json").is_file() and not (p / "dataset_dict.json").is_file():
        raise GradianUserError(
            "folder is not a datasets save_to_disk folder (no dataset_info.json)",
            where=str(p),
            fix="pass a .jsonl/.json/.parquet file or a folder written by Dataset.save_to_disk",
        )
    from datasets import DatasetDict, load_from_disk

    try:
        ds = load_from_disk(str(p))
        if isinstance(ds, DatasetDict):
            split = "train" if "train" in ds else next(iter(ds))
            ds = ds[split]
        rows = ds.to_list()
    except Exception as e:  # datasets/pyarrow raise many types for a damaged folder
        msg = first_line(e)
        raise GradianUserError(
            f"cannot read the save_to_disk folder ({type(e).__name__}: {msg})",
            where=str(p),
            fix="re-save the dataset with Dataset.save_to_disk, or export it to JSONL",
        ) from None
    _check_rows_nesting(rows, p)
    return rows


def _check_rows_nesting(rows: list[Any], p: Path) -> None:
    for i, r in enumerate(rows):
        problem = nesting_problem(r)
        if problem:
            raise GradianUserError(problem, where=f"{p}[{i}]", fix="flatten the row's fields")


_SHAREGPT_ROLES = {"human": "user", "gpt": "assistant"}


def _check_messages(msgs: Any, where: str, fieldname: str) -> list[dict[str, str]]:
    if not isinstance(msgs, list) or not msgs:
        raise GradianUserError(
            f"field {fieldname!r} must be a non-empty list of messages",
            where=where,
            fix='use [{"role": "user", "content": ...}, {"role": "assistant", "content": ...}]',
        )
    out = []
    for j, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise GradianUserError(f"{fieldname}[{j}] is not an object", where=where, fix="each message is a dict")
        # ShareGPT-style {"from", "value"} is accepted too.
        role = m["role"] if "role" in m else m.get("from")  # m.get("role", m.get("from"))
        content = m["content"] if "content" in m else m.get("value")
        if role is None:
            raise GradianUserError(f"{fieldname}[{j}] has no 'role'", where=where, fix="give every message a role")
        if not isinstance(role, str):
            raise GradianUserError(
                f"{fieldname}[{j}]'s role is {short_repr(role)}, not a string",
                where=where,
                fix='use a role name such as "user" or "assistant"',
            )
        role = _SHAREGPT_ROLES.get(role, role)
        if content is None:
            raise GradianUserError(
                f"{fieldname}[{j}] has no 'content'", where=where, fix="give every message a content string"
            )
        out.append({"role": str(role), "content": str(content) if not isinstance(content, str) else content})
    return out


def detect_format(rec: dict[str, Any]) -> str | None:
    """The row format by the fields present, or None."""
    if "messages" in rec or "conversations" in rec:
        return "messages"
    if "prompt" in rec or "completion" in rec:
        return "prompt_completion"
    if "instruction" in rec or "output" in rec:
        return "alpaca"
    if "text" in rec:
        return "text"
    return None


def to_example(rec: dict[str, Any], row: int, where: str) -> Example:
    """Normalise one raw record into an :class:`Example` (``where`` is used in errors).

    Preference rows (:mod:`gradian.data.preference`: chosen/rejected, KTO labels) are not SFT rows: they raise
    :class:`gradian.data.preference.PreferenceRowsError` (Audit reads them with that module instead).
    """
    kind = preference_kind(rec)
    if kind is not None:
        raise refusal(rec, kind, where)
    fmt = detect_format(rec)
    ex_id = str(rec["id"]) if rec.get("id") is not None else str(row)
    if fmt is None:
        raise GradianUserError(
            f"unknown row format (fields: {', '.join(sorted(rec)) or 'none'})",
            where=where,
            fix="use prompt/completion, messages, instruction/output (alpaca) or text",
        )

    def need(name: str, fix: str) -> Any:
        if rec.get(name) is None:
            raise GradianUserError(f"missing field {name!r} ({fmt} row)", where=where, fix=fix)
        return rec[name]

    if fmt == "messages":
        key = "messages" if "messages" in rec else "conversations"
        msgs = _check_messages(rec[key], where, key)
        last = max((i for i, m in enumerate(msgs) if m["role"] == "assistant"), default=None)
        if last is None:
            raise GradianUserError(
                f"{key!r} has no assistant turn", where=where, fix="end each conversation with an assistant message"
            )
        return Example(ex_id, row, fmt, msgs[:last], msgs[last : last + 1], rec)
    if fmt == "prompt_completion":
        prompt = need("prompt", "add a 'prompt' string next to 'completion'")
        completion = need("completion", "add a 'completion' string next to 'prompt'")
        if isinstance(prompt, list) or isinstance(completion, list):
            prompt = _check_messages(prompt, where, "prompt")
            completion = _check_messages(completion, where, "completion")
        elif not isinstance(prompt, str) or not isinstance(completion, str):
            raise GradianUserError(
                "'prompt' and 'completion' must both be strings or both be message lists",
                where=where,
                fix="make both fields strings",
            )
        return Example(ex_id, row, fmt, prompt, completion, rec)
    if fmt == "alpaca":
        instr = need("instruction", "add an 'instruction' string")
        out = need("output", "add an 'output' string")
        inp = rec.get("input") or ""
        prompt = f"{instr}\n\n{inp}" if inp else str(instr)
        return Example(ex_id, row, fmt, prompt, str(out), rec)
    text = need("text", "add a 'text' string")
    if not isinstance(text, str):
        raise GradianUserError("'text' must be a string", where=where, fix="make 'text' a string")
    return Example(ex_id, row, fmt, "", text, rec)


def load_examples(path: str | Path, *, allow_empty: bool = False) -> list[Example]:
    """Read and normalise a dataset file. Ids must be unique; the file must not be empty.

    Returns:
        list of :class:`Example`, in file order.
    """
    return examples_from_records(read_records(path), path, allow_empty=allow_empty)


def examples_from_records(
    records: list[dict[str, Any]], path: str | Path, *, allow_empty: bool = False
) -> list[Example]:
    """:func:`load_examples` on records already read from ``path`` (:func:`read_records`)."""
    p = Path(path)
    if not records and not allow_empty:
        raise GradianUserError("dataset is empty", where=str(p), fix="give a file with at least one row")
    ps, jsonl = str(p), p.suffix.lower() == ".jsonl"  # _where(p, i), without a Path property per row
    examples = [to_example(r, i, f"{ps}:{i + 1}" if jsonl else f"{ps}[{i}]") for i, r in enumerate(records)]
    seen: dict[str, int] = {}
    for ex in examples:
        if ex.id in seen:
            raise GradianUserError(
                f"duplicate id {ex.id!r} (also row {seen[ex.id] + 1})",
                where=_where(p, ex.row),
                fix="make 'id' unique or drop the field to use row numbers",
            )
        seen[ex.id] = ex.row
    return examples


def _where(p: Path, i: int) -> str:
    """File location of 0-based row i: ``file:LINE`` for JSONL (1-based), ``file[i]`` otherwise."""
    return f"{p}:{i + 1}" if p.suffix.lower() == ".jsonl" else f"{p}[{i}]"
