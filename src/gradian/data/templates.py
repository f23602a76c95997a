"""Chat template files a run leaves: a ``.jinja`` file's text, and the template saved in an output folder.

Read by the training setup (:mod:`gradian.data.setup`), which renders the rows with it, and by Audit's template
checks (:mod:`gradian.audit.context`), which judge it.
"""

from __future__ import annotations

from pathlib import Path

from gradian.errors import GradianUserError
from gradian.safeio import load_json_file


def read_template(path: Path) -> str:
    """A ``.jinja`` chat template file's text (UTF-8, at most 1 MB)."""
    try:
        if path.stat().st_size > 1 << 20:
            raise GradianUserError("chat template file is over 1 MB", where=str(path), fix="pass the template file")
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise GradianUserError(
            f"cannot read the chat template ({type(e).__name__})", where=str(path), fix="pass a UTF-8 .jinja file"
        ) from None


def saved_template(folder: Path) -> tuple[str, str] | None:
    """The chat template a run saved in ``folder``: ``chat_template.jinja`` (transformers >= 4.54 writes
    it there), else ``tokenizer_config.json``'s ``chat_template`` string; None if neither.
    """
    f = folder / "chat_template.jinja"
    if f.is_file():
        return read_template(f), str(f)
    f = folder / "tokenizer_config.json"
    if f.is_file():
        try:
            obj = load_json_file(f, "tokenizer config")
        except GradianUserError:
            return None
        tpl = obj.get("chat_template") if isinstance(obj, dict) else None
        if isinstance(tpl, str) and tpl:
            return tpl, f"{f}: chat_template"
    return None
