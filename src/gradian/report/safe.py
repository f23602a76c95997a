r"""Making untrusted text safe to show: training rows, eval prompts, answers, audit evidence.

Every string that reaches a renderer came from somewhere the user does not fully
control (scraped training data, model generations). The report model keeps the
strings exactly as the run recorded them (the JSON form is data); each renderer
shows them only through this module:

* :func:`clean` removes what can hide or rewrite text on a screen: C0/C1 control
  characters except ``\n`` and ``\t`` (so no terminal escape sequences, no NUL,
  no backspace tricks), Unicode bidirectional overrides and isolates (the
  "Trojan Source" characters), and turns the Unicode line/paragraph separators
  into ``\n``.
* :func:`visible` is the same set shown instead of removed, for a debugger's terminal: each
  character :func:`clean` would remove or turn into ``\n`` (``\r`` alone, U+2028/U+2029, NEL
  included) becomes its ``\u`` escape (``\u`` and four hex digits), so ``\x1b[2J`` prints as the six
  characters ``\u001b`` then ``[2J``. The ``\u`` form (not ``\x1b``) is chosen because it means
  the same character in JSON and in Python, so an escaped id can be pasted into a ``jq`` or
  Python filter over run.json, and a JSON document printed to a terminal stays valid JSON.
  The CLI's consoles and streams apply it to everything they print
  (:mod:`gradian.commands._common`).
* :func:`clean_tree` applies :func:`clean` to every string (and key) of a JSON-like value.
* :func:`shorten` cuts a string to at most ``limit`` characters with an ellipsis
  (very long lines stay readable in terminals and Markdown tables).
* :func:`md_text` escapes a string for Markdown (GitHub-flavoured): ``&``, ``<`` and
  ``>`` become entities, so no HTML survives; the ASCII punctuation that can start
  syntax gets a backslash (CommonMark makes any backslash-escaped ASCII
  punctuation literal), so no link, image, autolink, emphasis, code span, math,
  table cell break, heading or list marker can come from data; newlines become ``⏎``.
* HTML escaping is :func:`markupsafe.escape` (``& < > " '``), used through
  :class:`markupsafe.Markup` templates in :mod:`gradian.report.html`, which escape
  every argument that is not itself ``Markup``.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

# bidi embeddings/overrides/isolates and marks: they reorder how text is displayed
_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_C0C1 = "\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f"  # every C0/C1 control but \t \n \r
_SEPARATORS = "\r\u2028\u2029\x85"
_CONTROL = re.compile("[" + _C0C1 + _BIDI + "]")
_LINESEP = re.compile("[" + _SEPARATORS + "]")
#: what :func:`visible` escapes: exactly what :func:`clean` removes or turns into a newline
_UNSAFE = re.compile("[" + _C0C1 + _BIDI + _SEPARATORS + "]")
#: the same without ``\r`` (:func:`visible` with ``keep_cr``)
_UNSAFE_NO_CR = re.compile("[" + _C0C1 + _BIDI + _SEPARATORS[1:] + "]")


def clean(s: Any) -> str:
    r"""``str(s)`` without control characters (``\n`` and ``\t`` kept) or bidi controls.

    ``\r\n`` and ``\r`` become ``\n``; U+2028/U+2029 become ``\n``.
    """
    if s is None:
        return ""
    s = str(s)
    s = s.replace("\r\n", "\n")
    s = _LINESEP.sub("\n", s)
    return _CONTROL.sub("", s)


def _u_escape(m: re.Match) -> str:
    return f"\\u{ord(m.group(0)):04x}"


def visible(s: Any, keep_cr: bool = False) -> str:
    r"""``str(s)`` with every character :func:`clean` would remove or replace shown as its ``\u`` escape
    (``\u`` and four hex digits).

    ``\r\n`` becomes ``\n`` first; ``\n`` and ``\t`` are kept. ``keep_cr`` keeps a lone ``\r`` too (for
    a stream that carries other programs' progress bars, which redraw with ``\r``); :func:`clean` is
    the definition of what is unsafe, this only shows it.
    """
    if s is None:
        return ""
    s = str(s)
    if "\r\n" in s:
        s = s.replace("\r\n", "\n")
    return (_UNSAFE_NO_CR if keep_cr else _UNSAFE).sub(_u_escape, s)


def has_unsafe(s: str) -> bool:
    r"""True when ``s`` holds a character :func:`visible` would escape (a lone ``\r`` included)."""
    return bool(_UNSAFE.search(s.replace("\r\n", "\n")))


def clean_tree(obj: Any) -> Any:
    """:func:`clean` every string (and dict key) in a JSON-like value; other leaves unchanged."""
    if isinstance(obj, str):
        return clean(obj)
    if isinstance(obj, dict):
        return {clean(k): clean_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean_tree(v) for v in obj]
    return obj


def shorten(s: Any, limit: int) -> str:
    """At most ``limit`` characters (the last one an ellipsis when cut)."""
    s = clean(s)
    if len(s) <= limit:
        return s
    return s[: max(0, limit - 1)] + "…"


def one_line(s: Any, limit: int | None = None) -> str:
    """Cleaned, newlines and tabs shown as ``⏎`` and a space, optionally shortened."""
    s = clean(s).replace("\n", " ⏎ ").replace("\t", " ")
    return shorten(s, limit) if limit else s


_MD_ESC = re.compile(r"[\\`*_\[\]()#+!|~@$<>&]|:(?=/)|(?<=www)\.", re.IGNORECASE)
_MD_ENT = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def _md_sub(m: re.Match) -> str:
    c = m.group(0)
    return _MD_ENT.get(c, "\\" + c)


def md_text(s: Any, limit: int | None = None) -> str:
    r"""Markdown-inert text (see module docstring); one line; optionally shortened first.

    Escaped everywhere: ``\ ` * _ [ ] ( ) # + ! | ~ @ $`` (backslash), ``& < >``
    (entities), the ``:`` of ``scheme:/`` and the ``.`` of ``www.`` (autolinks); at the start of the string also a
    leading ``- = .`` or the ``.``/``)`` after leading digits (list markers,
    setext and thematic breaks).
    """
    s = one_line(s, limit).strip(" ")
    s = _MD_ESC.sub(_md_sub, s)
    m = re.match(r"^(\d+)([.)])", s)
    if m:
        s = m.group(1) + "\\" + s[len(m.group(1)) :]
    elif s[:1] in ("-", "=", "."):
        s = "\\" + s
    return s


def is_printable_text(s: str) -> bool:
    """True when ``s`` holds no character :func:`clean` would remove (used by tests)."""
    return not _CONTROL.search(s) and not any(unicodedata.category(c) == "Cc" and c not in "\n\t" for c in s)
