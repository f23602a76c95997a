"""Bounded reading of the files a user hands Gradian.

Every reader of user input (datasets, eval sets, configs, trainer logs, adapter configs, a run's
``run.json``, an index manifest) goes through here, so a hostile or careless input is a one-line
:class:`~gradian.errors.GradianUserError`, never a hang, an exhausted memory or a traceback:

* **regular files only**: a FIFO, a character device (``/dev/zero``, ``/dev/stdin``), a socket, or
  a symlink to one is refused before it is opened, so no read can be endless;
* **a size cap** on any file read whole or line by line (default 4096 MiB), and **a line cap** on
  JSONL lines (default 256 MiB). Raise them with ``GRADIAN_MAX_INPUT_MB`` / ``GRADIAN_MAX_LINE_MB``
  or the CLI's global ``gradian --max-input-mb N`` option;
* **a nesting limit** for JSON and YAML values (:data:`MAX_DEPTH` levels, env ``GRADIAN_MAX_DEPTH``),
  and for YAML a limit on the value count after anchors and aliases are expanded
  (:data:`MAX_YAML_NODES`), so an alias bomb cannot blow up a later walk over the result;
* every exception a parser raises on bad bytes (``json``, ``yaml``) becomes a user error naming
  the file (and line) and the fix.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Iterator

from gradian.errors import GradianUserError, first_line

MiB = 1 << 20
DEFAULT_MAX_INPUT_MB = 4096
DEFAULT_MAX_LINE_MB = 256
#: Nesting levels a JSON/YAML value may have (a chat row is 4 deep, a run.json about 10).
MAX_DEPTH = 100
#: Values a YAML document may hold once its aliases are expanded.
MAX_YAML_NODES = 1_000_000

ENV_MAX_INPUT = "GRADIAN_MAX_INPUT_MB"
ENV_MAX_LINE = "GRADIAN_MAX_LINE_MB"
ENV_MAX_DEPTH = "GRADIAN_MAX_DEPTH"


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        v = int(raw)
    except ValueError:
        raise GradianUserError(
            f"{name}={raw!r} is not a whole number", where=name, fix=f"set {name} to a positive integer, e.g. {default}"
        ) from None
    if v < 1:
        raise GradianUserError(
            f"{name}={raw!r} must be at least 1", where=name, fix=f"set {name} to a positive integer, e.g. {default}"
        )
    return v


def max_input_bytes() -> int:
    """The largest file Gradian reads (``GRADIAN_MAX_INPUT_MB``, default 4096 MiB)."""
    return _env_int(ENV_MAX_INPUT, DEFAULT_MAX_INPUT_MB) * MiB


def max_line_bytes() -> int:
    """The longest JSONL line Gradian reads (``GRADIAN_MAX_LINE_MB``, default 256 MiB)."""
    return _env_int(ENV_MAX_LINE, DEFAULT_MAX_LINE_MB) * MiB


def max_depth() -> int:
    """The deepest nesting a JSON/YAML value may have (``GRADIAN_MAX_DEPTH``, default :data:`MAX_DEPTH`)."""
    return _env_int(ENV_MAX_DEPTH, MAX_DEPTH)


_RAISE_FIX = f"set {ENV_MAX_INPUT} (or pass `gradian --max-input-mb N ...`) if the file really is this large"


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a regular file"


def _unreadable(what: str, path: str | Path, e: OSError) -> GradianUserError:
    """The error for a file the OS refused to open or read (its ``strerror``, else the exception's name)."""
    return GradianUserError(
        f"cannot read the {what} ({e.strerror or type(e).__name__})",
        where=str(path),
        fix="check the path and its permissions",
    )


def check_regular_file(path: str | Path, what: str = "file") -> os.stat_result:
    """``os.stat`` of ``path`` (symlinks followed), refusing anything that is not a regular file.

    A stream (FIFO, ``/dev/zero``, ``/dev/stdin``, a socket) could be read forever; it is refused
    before it is opened.
    """
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise GradianUserError(f"{what} not found", where=str(p), fix="check the path") from None
    except OSError as e:
        raise _unreadable(what, p, e) from None
    if not stat.S_ISREG(st.st_mode):
        raise GradianUserError(
            f"the {what} is {_kind(st.st_mode)}, not a regular file; Gradian reads only regular files "
            "(a stream could be read forever)",
            where=str(p),
            fix="write the data to a regular file first and pass that",
        )
    return st


def check_size(path: str | Path, size: int, what: str = "file") -> None:
    """Refuse a ``size``-byte file above :func:`max_input_bytes`.

    Raises:
        GradianUserError: naming ``path``, its size in MiB and the limit, with how to raise the limit.
    """
    limit = max_input_bytes()
    if size > limit:
        raise GradianUserError(
            f"the {what} is {size / MiB:,.0f} MiB, above the {limit // MiB:,} MiB input limit",
            where=str(path),
            fix=_RAISE_FIX,
        )


def read_bytes(path: str | Path, what: str = "file") -> bytes:
    """The bytes of a regular file no larger than the input limit (read with a cap, so a file that
    grows while it is read cannot exceed it).
    """
    st = check_regular_file(path, what)
    check_size(path, st.st_size, what)
    limit = max_input_bytes()
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise _unreadable(what, path, e) from None
    if len(data) > limit:
        check_size(path, len(data), what)
    return data


def decode_utf8(data: bytes, where: str, what: str = "file") -> str:
    """``data`` decoded as UTF-8 (a leading BOM dropped).

    Raises:
        GradianUserError: at ``where``, naming the reason and byte offset of the first bad byte.
    """
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise GradianUserError(
            f"the {what} is not UTF-8 text ({e.reason} at byte {e.start})",
            where=where,
            fix="re-encode the file as UTF-8",
        ) from None


def read_text(path: str | Path, what: str = "file") -> str:
    """A regular UTF-8 text file no larger than the input limit (a leading BOM is dropped)."""
    return decode_utf8(read_bytes(path, what), str(path), what)


def iter_lines(path: str | Path, what: str = "file") -> Iterator[tuple[int, str]]:
    """``(1-based line number, line)`` of a regular UTF-8 file, each line at most the line limit."""
    st = check_regular_file(path, what)
    check_size(path, st.st_size, what)
    cap = max_line_bytes()
    total_cap = max_input_bytes()
    total = 0
    with open(path, "rb") as f:
        lineno = 0
        while True:
            raw = f.readline(cap + 1)
            if not raw:
                return
            lineno += 1
            total += len(raw)
            if total > total_cap:
                check_size(path, total, what)
            if len(raw) > cap:
                raise GradianUserError(
                    f"line {lineno} is longer than the {cap // MiB:,} MiB line limit",
                    where=f"{path}:{lineno}",
                    fix=f"split the row, or set {ENV_MAX_LINE} if it really is this long",
                )
            try:
                text = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise GradianUserError(
                    f"not UTF-8 ({e.reason} at byte {e.start} of the line)",
                    where=f"{path}:{lineno}",
                    fix="re-encode the file as UTF-8",
                ) from None
            yield lineno, text


# ---------------------------------------------------------------------- structure limits
def nesting_problem(obj: Any, limit: int | None = None) -> str | None:
    """Why ``obj`` (parsed JSON/YAML) is too deep, or None. Iterative: never recurses itself."""
    limit = max_depth() if limit is None else limit
    stack: list[tuple[Any, int]] = [(obj, 1)]
    seen: set[int] = set()
    while stack:
        x, d = stack.pop()
        if isinstance(x, (dict, list, tuple)):
            if d > limit:
                return f"values are nested more than {limit} levels deep"
            if id(x) in seen:
                continue
            seen.add(id(x))
            children = x.values() if isinstance(x, dict) else x
            stack.extend((c, d + 1) for c in children if isinstance(c, (dict, list, tuple)))
            if isinstance(x, dict):
                stack.extend((k, d + 1) for k in x if isinstance(k, tuple))
    return None


def _depth_error(problem: str, where: str) -> GradianUserError:
    return GradianUserError(
        problem, where=where, fix=f"flatten the structure (set {ENV_MAX_DEPTH} to allow deeper nesting)"
    )


def parse_json(text: str, where: str, *, line: int | None = None, fix: str = "fix the JSON syntax") -> Any:
    """``json.loads`` whose every failure (syntax, nesting, an integer too long to convert) is a user error.

    Args:
        where: the file, for messages; ``line``: the line number when ``text`` is one JSONL line.
    """
    try:
        obj = json.loads(text)
    except RecursionError:
        raise _depth_error("values are nested too deeply to parse", f"{where}:{line}" if line else where) from None
    except json.JSONDecodeError as e:
        ln = line if line is not None else e.lineno
        at = f"column {e.colno}" if line is not None else f"line {e.lineno} column {e.colno}"
        raise GradianUserError(f"malformed JSON at {at}: {e.msg}", where=f"{where}:{ln}", fix=fix) from None
    except ValueError as e:  # e.g. an integer literal beyond Python's int/str conversion limit
        msg = first_line(e, 120)
        raise GradianUserError(
            f"unreadable JSON value ({msg})", where=f"{where}:{line}" if line else where, fix=fix
        ) from None
    # a value nests at most as deep as the text has opening brackets: most rows need no walk
    problem = nesting_problem(obj) if text.count("[") + text.count("{") > max_depth() else None
    if problem:
        raise _depth_error(problem, f"{where}:{line}" if line else where)
    return obj


def load_json_file(path: str | Path, what: str = "file", fix: str = "fix the JSON syntax") -> Any:
    """A regular JSON file, bounded in size and nesting."""
    return parse_json(read_text(path, what), str(path), fix=fix)


def _bounded_yaml_loader():
    import yaml

    class BoundedSafeLoader(yaml.SafeLoader):
        """PyYAML's safe loader with a nesting limit while composing (before Python recursion runs out)."""

        _depth = 0
        gradian_where = "YAML"

        def compose_node(self, parent, index):  # noqa: D401  (PyYAML hook)
            self._depth += 1
            try:
                if self._depth > max_depth():
                    mark = self.peek_event().start_mark if self.check_event() else None
                    line = f":{mark.line + 1}" if mark is not None else ""
                    raise _depth_error(
                        f"values are nested more than {max_depth()} levels deep", f"{self.gradian_where}{line}"
                    )
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

    return BoundedSafeLoader


def _yaml_graph_problem(node) -> str | None:
    """Too many values once aliases are expanded, or too deep through aliases; linear in the node graph."""
    import yaml

    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_: set[int] = set()
    stack = [(node, False)]
    limit_n, limit_d = MAX_YAML_NODES, max_depth()
    while stack:
        n, done = stack.pop()
        if id(n) in size:
            continue
        if isinstance(n, yaml.SequenceNode):
            kids = list(n.value)
        elif isinstance(n, yaml.MappingNode):
            kids = [x for kv in n.value for x in kv]
        else:
            kids = []
        if not done:
            if id(n) in open_:
                continue  # pushed twice (a shared alias); the first visit sizes it
            if any(id(k) in open_ or k is n for k in kids):
                return "the YAML holds a recursive structure (an alias inside its own anchor)"
            open_.add(id(n))
            stack.append((n, True))
            stack.extend((k, False) for k in kids if id(k) not in size)
            continue
        open_.discard(id(n))
        size[id(n)] = 1 + sum(size.get(id(k), 1) for k in kids)
        depth[id(n)] = 1 + max((depth.get(id(k), 1) for k in kids), default=0)
        if size[id(n)] > limit_n:
            return f"the YAML expands to more than {limit_n:,} values (anchors and aliases)"
        if depth[id(n)] > limit_d:
            return f"values are nested more than {limit_d} levels deep (through aliases)"
    return None


def parse_yaml(text: str, where: str, fix: str = "fix the YAML syntax (indentation, colons, quotes)") -> Any:
    """``yaml.safe_load`` of one document, bounded in nesting and expanded size.

    Every exception PyYAML raises on the text (syntax errors, but also e.g. ``ValueError`` for an
    impossible date such as ``2024-13-45``) is a user error naming the line when known.
    """
    import yaml

    loader = None
    try:
        loader = _bounded_yaml_loader()(text)
        loader.gradian_where = where
        node = loader.get_single_node()
        if node is None:
            return None
        problem = _yaml_graph_problem(node)
        if problem:
            raise GradianUserError(problem, where=where, fix="write the values out without anchors and aliases")
        return loader.construct_document(node)
    except GradianUserError:
        raise
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        if mark is None and isinstance(e, yaml.reader.ReaderError):
            return_line = text.count("\n", 0, e.position) + 1
            raise GradianUserError(
                f"malformed YAML: {e.reason} (character #x{e.character:04x})", where=f"{where}:{return_line}", fix=fix
            ) from None
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or (str(e).splitlines()[0] if str(e) else type(e).__name__)
        raise GradianUserError(f"malformed YAML: {problem}", where=f"{where}{line}", fix=fix) from None
    except RecursionError:
        raise _depth_error("values are nested too deeply to parse", where) from None
    except Exception as e:  # PyYAML's constructors raise plain ValueError/TypeError/OverflowError on bad values
        msg = first_line(e, 120)
        raise GradianUserError(f"unreadable YAML value ({type(e).__name__}: {msg})", where=where, fix=fix) from None
    finally:
        if loader is not None:
            loader.dispose()


def load_yaml_file(
    path: str | Path, what: str = "file", fix: str = "fix the YAML syntax (indentation, colons, quotes)"
) -> Any:
    """A regular YAML file, bounded in size, nesting and alias expansion (:func:`parse_yaml` of :func:`read_text`)."""
    return parse_yaml(read_text(path, what), str(path), fix=fix)


# ---------------------------------------------------------------------- numbers read from files
def file_number(
    value: Any,
    where: str,
    key: str,
    what: str,
    *,
    lo: float | None = None,
    lo_open: bool = False,
    hi: float | None = None,
    hi_open: bool = False,
    whole: bool = False,
    fix: str,
) -> float:
    """A number read from a user's file, checked before anything computes with it.

    ``value`` must be a real number (not a boolean, not a string), finite, within the bounds
    (``lo``/``hi``; ``*_open`` excludes the bound) and, with ``whole``, a whole number. Returns it as a
    float (an ``int`` when ``whole``).

    Raises:
        GradianUserError: ``"<where>: <key> = <value>: not a <what>"`` with the reason and ``fix``, e.g.
            ``out/checkpoint-20/trainer_state.json: log_history[3].learning_rate = inf: not a finite
            learning rate (fix: ...)``.
    """
    a_what = f"{'an' if what[:1] in 'aeiou' else 'a'} {what}"

    def bad(why: str) -> GradianUserError:
        return GradianUserError(f"{key} = {short_repr(value, 40)}: {why}", where=where, fix=fix)

    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad("not a number")
    if isinstance(value, int):
        try:
            if whole and abs(value) > 2**63:  # beyond any count a trainer writes
                raise OverflowError
            x: float = int(value) if whole else float(value)
        except OverflowError:  # an integer beyond float range
            raise bad(f"too large for {a_what}") from None
    else:
        if value != value or value in (float("inf"), float("-inf")):
            raise bad(f"not a finite {what}")
        if whole:
            if abs(value) > 2**63:
                raise bad(f"too large for {a_what}")
            if value != int(value):
                raise bad(f"not a whole number, so not {a_what}")
            x = int(value)
        else:
            x = float(value)
    if lo is not None and (x <= lo if lo_open else x < lo):
        raise bad(f"{a_what} must be {'>' if lo_open else '>='} {lo:g}")
    if hi is not None and (x >= hi if hi_open else x > hi):
        raise bad(f"{a_what} must be {'<' if hi_open else '<='} {hi:g}")
    return x


def short_repr(v: Any, limit: int = 80) -> str:
    """``repr(v)`` cut to ``limit`` characters, for error messages about user values."""
    try:
        if isinstance(v, (dict, list, tuple)):
            s = f"a {type(v).__name__} of {len(v)} item(s)"
        else:
            s = repr(v)
    except Exception:  # a value whose repr fails is still named by its type
        s = f"a {type(v).__name__}"
    return s if len(s) <= limit else s[: limit - 1] + "…"
