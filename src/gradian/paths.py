"""Where Gradian keeps its cache (materialised models, gradient indexes, worlds), and how a trainer lays out its
output folder (its checkpoint folders).

``$GRADIAN_CACHE`` if set, else ``$XDG_CACHE_HOME/gradian``, else ``~/.cache/gradian``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path


def cache_dir() -> Path:
    """The cache folder, created if missing.

    Returns:
        ``$GRADIAN_CACHE`` if set, else ``$XDG_CACHE_HOME/gradian``, else ``~/.cache/gradian``.

    Raises:
        OSError: the folder cannot be created (e.g. a read-only location).
    """
    env = os.environ.get("GRADIAN_CACHE")
    if env:
        p = Path(env)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        p = Path(base) / "gradian"
    p.mkdir(parents=True, exist_ok=True)
    return p


# --------------------------------------------------------------------------- a trainer's output folder

#: A checkpoint folder in a trainer's output folder, each holding a PEFT adapter: HF Trainer's (and TRL's,
#: axolotl's, LLaMA-Factory's) ``checkpoint-<global step>``, torchtune 0.6.1's ``epoch_<epoch index from 0>``
#: (``FullModelHFCheckpointer.save_checkpoint``: ``adapter_model.safetensors`` and ``adapter_config.json`` in PEFT's
#: format).
_CHECKPOINT_FOLDER = re.compile(r"checkpoint-(\d+)|epoch_(\d+)")


def checkpoint_number(folder: str | Path) -> tuple[str, int] | None:
    """``("step", N)`` for ``checkpoint-N``, ``("epoch", N)`` for torchtune's ``epoch_N``, else None (by name)."""
    m = _CHECKPOINT_FOLDER.fullmatch(Path(folder).name)
    if m is None:
        return None
    return ("step", int(m.group(1))) if m.group(1) is not None else ("epoch", int(m.group(2)))


def checkpoint_folders(parent: str | Path) -> list[Path]:
    """The checkpoint folders in ``parent`` that hold an adapter (``adapter_config.json``), in training order."""
    p = Path(parent)
    found = [
        c
        for c in (p.iterdir() if p.is_dir() else ())
        if checkpoint_number(c) is not None and c.is_dir() and (c / "adapter_config.json").is_file()
    ]
    return sorted(found, key=checkpoint_number)  # type: ignore[arg-type]
