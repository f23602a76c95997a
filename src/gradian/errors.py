"""User errors: typed, one line, with what, where and the fix.

A :class:`GradianUserError` is a mistake in what the user gave us (a malformed
JSONL line, a missing field, an adapter that does not fit its base, ...). The
CLI prints ``str(err)`` as one line and exits with code 2. Anything else that
escapes is a bug and keeps its traceback.
"""

from __future__ import annotations

EXIT_USER_ERROR = 2


class GradianUserError(Exception):
    """A user mistake.

    Args:
        what: what is wrong, e.g. ``"malformed JSON"``.
        where: the file, and the row or field, e.g. ``"train.jsonl:17"``.
        fix: the concrete fix, e.g. ``"make each line one JSON object"``.
    """

    def __init__(self, what: str, where: str | None = None, fix: str | None = None):
        self.what = what
        self.where = where
        self.fix = fix
        super().__init__(self.one_line())

    def one_line(self) -> str:
        parts = []
        if self.where:
            parts.append(f"{self.where}: ")
        parts.append(self.what)
        if self.fix:
            parts.append(f" (fix: {self.fix})")
        return "".join(parts).replace("\n", " ")


def first_line(e: BaseException, limit: int = 160) -> str:
    """The first line of ``str(e)``, cut to ``limit`` characters (the exception's type name when it says nothing):
    what a :class:`GradianUserError` quotes of a library's exception.
    """
    text = str(e)
    return text.splitlines()[0][:limit] if text else type(e).__name__


class GradianWarning(UserWarning):
    """Something Gradian repaired or worked around that the user should know about (e.g. a corrupt index
    shard that is being rebuilt). The CLI prints it as one ``warning:`` line; Python callers get a
    standard :mod:`warnings` warning.
    """
