"""Where Gradian keeps its cache (materialised models, gradient indexes, worlds).

``$GRADIAN_CACHE`` if set, else ``$XDG_CACHE_HOME/gradian``, else ``~/.cache/gradian``.
"""

from __future__ import annotations

import os
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
