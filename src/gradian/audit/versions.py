"""Library versions for checks whose answer depends on them (mostly TRL).

Given by ``--versions trl=0.19.0,transformers=4.46.0`` (repeatable), or read
from the adapter folder's model card ("Framework versions") and
``adapter_config.json``'s ``peft_version``. A flag beats a file.
"""

from __future__ import annotations

from typing import Iterable

from packaging.version import InvalidVersion, Version

from gradian.errors import GradianUserError

KNOWN = ("trl", "transformers", "peft", "torch", "axolotl", "llamafactory", "torchtune", "datasets", "tokenizers")


def parse_versions(items: Iterable[str] | str | dict | None) -> dict[str, str]:
    """``["trl=0.19.0", "transformers=4.46"]`` or ``"trl=0.19,peft=0.13"`` -> ``{"trl": "0.19.0", ...}``."""
    if items is None:
        return {}
    if isinstance(items, dict):
        pairs = list(items.items())
    else:
        if isinstance(items, str):
            items = [items]
        pairs = []
        for item in items:
            for part in str(item).split(","):
                part = part.strip()
                if not part:
                    continue
                if "=" not in part:
                    raise GradianUserError(
                        f"version {part!r} is not NAME=VERSION", where="--versions", fix="e.g. --versions trl=0.19.0"
                    )
                k, v = part.split("=", 1)
                pairs.append((k.strip().lower().lstrip("="), v.strip().lstrip("=")))
    out = {}
    for k, v in pairs:
        try:
            Version(str(v))
        except InvalidVersion:
            raise GradianUserError(
                f"{k}={v!r} is not a version number", where="--versions", fix="e.g. --versions trl=0.19.0"
            ) from None
        out[str(k)] = str(v)
    return out
