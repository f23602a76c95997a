"""An HF Trainer's ``training_args.bin``, read without unpickling it.

``transformers.Trainer`` (and every trainer built on it: TRL's ``SFTTrainer``, ``DPOTrainer`` ...) keeps a run's
settings only in ``training_args.bin``: ``torch.save(self.args, ...)`` of its ``TrainingArguments`` (TRL: its
``SFTConfig``), written into the output folder by ``save_model`` and into every ``checkpoint-N/``. It is a pickle,
and Gradian never unpickles a user's file: loading one runs whatever callables it names.

This module reads it *statically*. The pickle's opcodes are parsed by the standard library's
:func:`pickletools.genops` (a parser: it decodes each opcode and its argument and executes nothing), and a small
stack machine interprets them over plain values only:

* strings, numbers, booleans, None, bytes, lists, tuples, dicts and sets are built as themselves;
* ``GLOBAL`` / ``STACK_GLOBAL`` give a :class:`_Global` that only holds the two names: **no module is imported**;
* ``REDUCE``, ``NEWOBJ`` and ``NEWOBJ_EX`` give an :class:`_Object` that records the callable's name and its
  arguments: **nothing is called**; ``BUILD`` stores its state on that record, ``SETITEMS`` / ``APPENDS`` their items;
* any other opcode (``INST``, ``OBJ``, the extension registry, persistent ids) is refused.

A dataclass such as ``SFTConfig`` pickles (protocol 2) as ``NEWOBJ`` of its class followed by ``BUILD`` with its
``__dict__``; an enum field as ``REDUCE(SchedulerType, ("linear",))``. :func:`read_training_args` turns the record
back into the mapping ``TrainingArguments.to_dict()`` gives (an enum is its value, a nested dataclass its fields, a
secret ``*_token`` field hidden as ``<FIELD_NAME>``), which the TRL / HF config readers read like the JSON of
``training_args.to_json_string()``.

The file is a ``torch.save`` zip archive (``<name>/data.pkl``) or, from an old ``torch.save``, a bare pickle;
either is bounded in size and in opcodes.
"""

from __future__ import annotations

import io
import pickletools
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradian.errors import GradianUserError
from gradian.safeio import check_regular_file, read_bytes

#: The file's name, as HF Trainer writes it (``transformers.trainer.TRAINING_ARGS_NAME``).
TRAINING_ARGS_NAME = "training_args.bin"

#: The pickle may be at most this many bytes (a TrainingArguments pickle is about 6 kB).
MAX_PICKLE_BYTES = 4 << 20
#: The file may be at most this many bytes (the archive around the pickle adds a few kB).
MAX_FILE_BYTES = 16 << 20
#: At most this many opcodes are interpreted (about 600 in a TrainingArguments pickle).
MAX_OPCODES = 200_000
#: Nesting levels a value may have when it is turned into plain data.
MAX_DEPTH = 50
#: Values the plain data may hold in all (shared values counted where they are used).
MAX_VALUES = 1_000_000

#: ``*_token`` fields that are settings, not secrets (TRL's ``eos_token`` / ``pad_token``): kept as they are.
_TOKENIZER_TOKENS = frozenset({"eos_token", "pad_token", "bos_token", "unk_token"})

_FIX = "pass the trainer's config instead, e.g. the JSON of training_args.to_json_string(), with --config"


@dataclass(frozen=True)
class _Global:
    """A ``module.name`` a pickle refers to. Never imported."""

    module: str
    name: str

    def __str__(self) -> str:
        return f"{self.module}.{self.name}"


@dataclass(eq=False)
class _Object:
    """What ``REDUCE`` / ``NEWOBJ`` would have built: the callable's name, its arguments, and what ``BUILD``,
    ``SETITEMS`` and ``APPENDS`` then gave it. Nothing is called.
    """

    made_by: Any
    args: tuple
    state: Any = None
    items: dict = field(default_factory=dict)
    appended: list = field(default_factory=list)


class _Mark:
    """The stack's ``MARK``."""


_MARK = _Mark()

#: Opcodes whose argument, as :func:`pickletools.genops` decodes it, is the value (protocol 0's ``INT`` 01 / 00 are
#: True / False, decoded so).
_LITERALS = frozenset(
    {
        "INT",
        "BININT",
        "BININT1",
        "BININT2",
        "LONG",
        "LONG1",
        "LONG4",
        "FLOAT",
        "BINFLOAT",
        "UNICODE",
        "BINUNICODE",
        "SHORT_BINUNICODE",
        "BINUNICODE8",
        "STRING",
        "BINSTRING",
        "SHORT_BINSTRING",
        "BINBYTES",
        "SHORT_BINBYTES",
        "BINBYTES8",
        "BYTEARRAY8",
    }
)
#: Containers older protocols pickle as ``REDUCE(builtins.set, ([...],))``: read as their items.
_CONTAINERS = frozenset({"builtins.set", "builtins.frozenset", "__builtin__.set", "__builtin__.frozenset"})
#: What protocols 0 and 1 call to make an instance of a class (``copyreg._reconstructor(cls, object, None)``).
_RECONSTRUCTOR = frozenset({"copyreg._reconstructor", "copy_reg._reconstructor"})


def _unsupported(what: str, where: str) -> GradianUserError:
    return GradianUserError(f"cannot be read without unpickling it ({what})", where=where, fix=_FIX)


def _pickle_bytes(path: Path) -> bytes:
    """The pickle inside ``path``: the ``data.pkl`` of a ``torch.save`` zip archive, or the file itself."""
    size = check_regular_file(path, "training arguments").st_size
    if size > MAX_FILE_BYTES:  # before reading it: a TrainingArguments archive is about 6 kB
        raise _unsupported(
            f"{size >> 20} MiB, over the {MAX_FILE_BYTES >> 20} MiB of any training arguments", str(path)
        )
    raw = read_bytes(path, "training arguments")
    if raw[:4] != b"PK\x03\x04":  # a bare pickle (an old torch.save), or not one: the opcodes will say
        return raw
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as z:
            names = [i for i in z.infolist() if i.filename == "data.pkl" or i.filename.endswith("/data.pkl")]
            if len(names) != 1:
                raise _unsupported(f"{len(names)} data.pkl in the archive", str(path))
            if names[0].file_size > MAX_PICKLE_BYTES:
                raise _unsupported(f"its pickle is over {MAX_PICKLE_BYTES >> 20} MiB", str(path))
            return z.read(names[0])
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError) as e:
        raise _unsupported(f"a damaged archive: {e}", str(path)) from None


def _pop_mark(stack: list) -> list:
    for i in range(len(stack) - 1, -1, -1):
        if stack[i] is _MARK:
            items = stack[i + 1 :]
            del stack[i:]
            return items
    raise ValueError("no MARK on the stack")


def _interpret(data: bytes, where: str) -> Any:
    """Run the pickle's opcodes over plain values (see the module docstring); the value ``STOP`` returns."""
    stack: list = []
    memo: dict[int, Any] = {}
    n = 0
    for op, arg, _ in pickletools.genops(data):
        n += 1
        if n > MAX_OPCODES:
            raise _unsupported(f"over {MAX_OPCODES} opcodes", where)
        name = op.name
        if name in ("PROTO", "FRAME"):
            continue
        if name == "STOP":
            return stack.pop()
        if name == "MARK":
            stack.append(_MARK)
        elif name == "POP":
            stack.pop()
        elif name == "POP_MARK":
            _pop_mark(stack)
        elif name == "DUP":
            stack.append(stack[-1])
        elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[arg] = stack[-1]
        elif name == "MEMOIZE":
            memo[len(memo)] = stack[-1]
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            stack.append(memo[arg])
        elif name == "NONE":
            stack.append(None)
        elif name in ("NEWTRUE", "NEWFALSE"):
            stack.append(name == "NEWTRUE")
        elif name in _LITERALS:
            stack.append(arg)
        elif name == "EMPTY_DICT":
            stack.append({})
        elif name == "EMPTY_LIST":
            stack.append([])
        elif name == "EMPTY_TUPLE":
            stack.append(())
        elif name == "EMPTY_SET":
            stack.append(set())
        elif name == "DICT":
            items = _pop_mark(stack)
            stack.append(dict(zip(items[::2], items[1::2])))
        elif name == "LIST":
            stack.append(_pop_mark(stack))
        elif name == "TUPLE":
            stack.append(tuple(_pop_mark(stack)))
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            k = int(name[-1])
            items = tuple(stack[-k:])
            del stack[-k:]
            stack.append(items)
        elif name == "FROZENSET":
            stack.append(frozenset(_pop_mark(stack)))
        elif name in ("SETITEM", "SETITEMS"):
            items = [stack.pop(), stack.pop()][::-1] if name == "SETITEM" else _pop_mark(stack)
            target = stack[-1]
            pairs = zip(items[::2], items[1::2])
            (target.items if isinstance(target, _Object) else target).update(pairs)
        elif name in ("APPEND", "APPENDS"):
            items = [stack.pop()] if name == "APPEND" else _pop_mark(stack)
            target = stack[-1]
            (target.appended if isinstance(target, _Object) else target).extend(items)
        elif name == "ADDITEMS":
            items = _pop_mark(stack)
            stack[-1].update(items)
        elif name == "GLOBAL":
            module, _, attr = arg.partition(" ")
            stack.append(_Global(module, attr))
        elif name == "STACK_GLOBAL":
            attr, module = stack.pop(), stack.pop()
            stack.append(_Global(str(module), str(attr)))
        elif name == "REDUCE":
            args = stack.pop()
            stack.append(_Object(stack.pop(), tuple(args) if isinstance(args, (tuple, list)) else (args,)))
        elif name == "NEWOBJ":
            args = stack.pop()
            stack.append(_Object(stack.pop(), tuple(args)))
        elif name == "NEWOBJ_EX":
            _kwargs, args = stack.pop(), stack.pop()
            stack.append(_Object(stack.pop(), tuple(args)))
        elif name == "BUILD":
            state = stack.pop()
            target = stack[-1]
            if not isinstance(target, _Object):
                raise _unsupported("a BUILD on a plain value", where)
            target.state = state
        else:  # INST, OBJ, EXT1/2/4, PERSID, BINPERSID, NEXT_BUFFER, READONLY_BUFFER
            raise _unsupported(f"opcode {name}", where)
    raise _unsupported("no STOP opcode", where)


def _plain(v: Any, depth: int = 0, budget: list[int] | None = None) -> Any:
    """A value of the interpreted pickle as plain data, the way ``TrainingArguments.to_dict()`` shows it.

    ``budget`` (one count shared by the whole walk) bounds the values made: a value the memo shares is copied where
    it is used, so a few opcodes could otherwise ask for 2**50 copies.
    """
    budget = [MAX_VALUES] if budget is None else budget
    budget[0] -= 1
    if budget[0] < 0:
        raise ValueError(f"over {MAX_VALUES} values")
    if depth > MAX_DEPTH:
        raise ValueError(f"nested over {MAX_DEPTH} levels")
    if isinstance(v, _Object):
        state = v.state
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], dict):  # (__dict__, slots)
            state = state[0]
        if isinstance(state, dict):  # a dataclass, or an object with a __dict__: its fields
            return {str(k): _plain(x, depth + 1, budget) for k, x in state.items()}
        if v.items:
            return {str(k): _plain(x, depth + 1, budget) for k, x in v.items.items()}
        if v.appended:
            return [_plain(x, depth + 1, budget) for x in v.appended]
        if len(v.args) == 1 and isinstance(v.args[0], (str, int, float, bool)):
            return v.args[0]  # an enum member (SchedulerType("linear")): its value
        if str(v.made_by) in _CONTAINERS and len(v.args) == 1 and isinstance(v.args[0], (list, tuple)):
            return [_plain(x, depth + 1, budget) for x in v.args[0]]  # set([...]) before protocol 4
        return str(v.made_by)
    if isinstance(v, dict):
        return {
            str(k) if not isinstance(k, (str, int, float, bool)) else k: _plain(x, depth + 1, budget)
            for k, x in v.items()
        }
    if isinstance(v, (list, tuple, set, frozenset)):
        return [_plain(x, depth + 1, budget) for x in v]
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8", "replace")
    if isinstance(v, _Global):
        return str(v)
    return v


def read_training_args(path: str | Path) -> tuple[dict[str, Any], str]:
    """``(settings, class)`` of a ``training_args.bin``, read without unpickling it (see the module docstring).

    ``settings`` is what ``TrainingArguments.to_dict()`` would give for the saved object: field name → plain value
    (an enum's value, a nested dataclass's fields; a secret such as ``hub_token`` shown as ``<HUB_TOKEN>``, as
    ``to_dict`` hides it; private ``_``-fields left out). ``class`` is the saved object's class, e.g.
    ``trl.trainer.sft_config.SFTConfig``.

    Raises:
        GradianUserError: the file is not a ``torch.save`` archive or a pickle, is damaged or too large, uses an
            opcode this reader does not interpret, or does not hold an object with fields.
    """
    path = Path(path)
    data = _pickle_bytes(path)
    if len(data) > MAX_PICKLE_BYTES:
        raise _unsupported(f"its pickle is over {MAX_PICKLE_BYTES >> 20} MiB", str(path))
    try:
        top = _interpret(data, str(path))
        settings = _plain(top)
    except GradianUserError:
        raise
    except (ValueError, IndexError, KeyError, TypeError, AttributeError) as e:  # a malformed opcode stream
        raise _unsupported(f"a malformed pickle: {type(e).__name__}: {e}", str(path)) from None
    if not isinstance(top, _Object) or not isinstance(settings, dict) or not settings:
        raise GradianUserError("does not hold training arguments (an object with fields)", where=str(path), fix=_FIX)
    made_by = top.made_by
    if str(made_by) in _RECONSTRUCTOR and top.args:  # protocols 0 and 1: the class is the first argument
        made_by = top.args[0]
    shown = {
        k: (f"<{k.upper()}>" if k.endswith("_token") and k not in _TOKENIZER_TOKENS else v)
        for k, v in settings.items()
        if not k.startswith("_")  # private state (``_n_gpu``, ``_setup_devices``), not a setting
    }
    return shown, str(made_by)
