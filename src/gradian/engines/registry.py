"""The engine registry: the one list of gradient engines, read by the specs, the pipeline and the CLI.

Every module in :mod:`gradian.engines` is imported once, on first use, and each registers its
engine class with :func:`register`. So adding an engine is one new file,
``src/gradian/engines/<name>.py``, holding

* its typed spec, a frozen ``@dataclass`` subclass of :class:`~gradian.engines.base.EngineSpec`
  whose ``__post_init__`` checks its own fields with :mod:`gradian.validate`;
* its engine, a subclass of :class:`~gradian.engines.base.Engine` decorated with ``@register``,
  declaring ``name``, ``spec_class``, ``needs`` (``"index"`` or ``"model"``) and ``summary``,
  and implementing ``fit`` and ``precondition``.

Nothing else changes: ``--engine``/``--second-engine`` choices and help, ``AttributeSpec``
validation, the pipeline's model pass (for ``needs="model"``) and the manifest (``to_dict``)
all read from here.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Any

from gradian.engines.base import NEEDS, Engine, EngineSpec, ModelPass
from gradian.errors import GradianUserError

_ENGINES: dict[str, type[Engine]] = {}
_discovered = False
#: modules of gradian.engines that hold no engine of their own
_NOT_ENGINES = {"base", "registry"}


def register(cls: type[Engine]) -> type[Engine]:
    """Class decorator: add an engine to the registry (checks what it declares)."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.isidentifier() or name == "none":
        raise TypeError(f"{cls.__name__}.name must be an identifier other than 'none', got {name!r}")
    if name in _ENGINES and _ENGINES[name] is not cls:
        raise TypeError(f"engine {name!r} is registered twice ({_ENGINES[name].__name__}, {cls.__name__})")
    spec = getattr(cls, "spec_class", None)
    if not (isinstance(spec, type) and issubclass(spec, EngineSpec)) or spec is EngineSpec:
        raise TypeError(f"{cls.__name__}.spec_class must be its own EngineSpec subclass")
    if spec.name and spec.name != name:
        raise TypeError(f"{spec.__name__} already belongs to engine {spec.name!r}")
    if cls.needs not in NEEDS:
        raise TypeError(f"{cls.__name__}.needs must be one of {NEEDS}, got {cls.needs!r}")
    spec.name = name
    _ENGINES[name] = cls
    return cls


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    # this file's folder is the engines package: list its modules without importing the package (which
    # imports this registry)
    here = str(Path(__file__).resolve().parent)
    for info in sorted(pkgutil.iter_modules([here]), key=lambda m: m.name):
        if not info.name.startswith("_") and info.name not in _NOT_ENGINES:
            importlib.import_module(f"gradian.engines.{info.name}")
    _discovered = True


def engines() -> dict[str, type[Engine]]:
    """Every registered engine, by name (sorted)."""
    _discover()
    return dict(sorted(_ENGINES.items()))


def engine_names() -> tuple[str, ...]:
    """The registered engines' names, sorted: the values ``--engine`` and ``--second-engine`` accept."""
    return tuple(engines())


def engine_class(name: Any, flag: str = "--engine") -> type[Engine]:
    """The engine registered as ``name``; a one-line user error naming ``flag`` otherwise."""
    reg = engines()
    if not isinstance(name, str) or name not in reg:
        from gradian.validate import _show

        raise GradianUserError(f"unknown engine {_show(name)}", where=flag, fix=f"use one of {', '.join(reg)}")
    return reg[name]


def engine_spec(name: Any, flag: str = "--engine", **options: Any) -> EngineSpec:
    """The named engine's spec with ``options`` (its own defaults for the rest), validated.

    An option the engine's spec does not have is a one-line user error naming ``flag``.
    """
    from dataclasses import fields

    cls = engine_class(name, flag)
    known = {f.name for f in fields(cls.spec_class)}
    for k in options:
        if k not in known:
            raise GradianUserError(
                f"engine {name} has no option {k!r}",
                where=flag,
                fix=f"its options are: {', '.join(sorted(known)) or 'none'}",
            )
    return cls.spec_class(**options)


def make_engine(spec: EngineSpec) -> Engine:
    """A fresh (unfitted) engine for ``spec``."""
    reg = engines()
    cls = reg.get(spec.name) if isinstance(spec, EngineSpec) else None
    if cls is None or not isinstance(spec, cls.spec_class):
        raise GradianUserError(
            f"no engine takes a {type(spec).__name__}", where="--engine", fix=f"use one of {', '.join(reg)}"
        )
    return cls(spec)


def needs_model(specs) -> bool:
    """Whether any of these engine specs needs a model pass to fit."""
    reg = engines()
    return any(reg[s.name].needs == "model" for s in specs)


def fit_engine(spec: EngineSpec, index, model_pass: ModelPass | None = None) -> Engine:
    """:func:`make_engine` then ``fit``, handing the model pass only to engines that declare they need it."""
    eng = make_engine(spec)
    if eng.needs == "model" and model_pass is None:
        raise ValueError(f"engine {spec.name} needs a model pass over the training rows (ModelPass)")
    eng.fit(index, model_pass if eng.needs == "model" else None)
    return eng


def help_text() -> str:
    """``"datainf (…) | ekfac (…) | graddot (…)"`` for the CLI."""
    return " | ".join(f"{n} ({c.summary})" if c.summary else n for n, c in engines().items())
