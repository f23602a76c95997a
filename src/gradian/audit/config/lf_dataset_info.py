"""LLaMA-Factory ``dataset_info.json``: the column (and sharegpt tag) names of the dataset a config trains on.

LLaMA-Factory finds a config's ``dataset: name[,name...]`` in ``<dataset_dir>/dataset_info.json`` (``dataset_dir``
defaults to ``data``); each entry names its ``file_name``, its ``formatting`` (``alpaca``, the default, or
``sharegpt``), whether it is a preference set (``ranking``), its ``columns`` (``prompt``, ``query``,
``response``, ``history``, ``messages``, ``system``, ``chosen``, ``rejected``, ``kto_tag`` ...) and, for
sharegpt, its ``tags`` (``role_tag``, ``content_tag``, ``user_tag``, ``assistant_tag`` ...) — LLaMA-Factory
data/README.md. :func:`dataset_entry` finds the entry whose ``file_name`` is the ``--data`` file;
:func:`apply_columns` renames the row fields to LLaMA-Factory's default names, which the row readers know.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gradian.audit.config.model import TrainConfig

#: alpaca columns -> the field names of LLaMA-Factory's default alpaca rows
_ALPACA = {"prompt": "instruction", "query": "input", "response": "output", "system": "system", "history": "history"}
#: sharegpt columns -> default sharegpt field names
_SHAREGPT = {"messages": "conversations", "system": "system", "tools": "tools"}
#: columns of either formatting
_COMMON = {"chosen": "chosen", "rejected": "rejected", "kto_tag": "kto_tag"}
#: sharegpt tags -> LLaMA-Factory's default tag values
_TAG_DEFAULTS = {
    "role_tag": "from",
    "content_tag": "value",
    "user_tag": "human",
    "assistant_tag": "gpt",
    "observation_tag": "observation",
    "function_tag": "function_call",
    "system_tag": "system",
}


def dataset_entry(cfg: TrainConfig | None, data_path: str | None) -> tuple[dict[str, Any], str] | None:
    """The ``dataset_info.json`` entry of the config's dataset stored in ``data_path``, and where it was read.

    Looks for ``<dataset_dir>/dataset_info.json`` next to the config file (and for ``dataset_info.json`` in the
    data file's folder); an entry matches when it is one of the config's ``dataset`` names and its
    ``file_name`` is the data file's name. None when there is no such file or entry.
    """
    if cfg is None or cfg.trainer != "llamafactory" or not cfg.datasets or not data_path:
        return None
    data = Path(data_path)
    dirs: list[Path] = []
    for entry in cfg.datasets:
        ddir = Path(str(entry.get("dataset_dir") or "data"))
        for base in [Path(p).parent for p in cfg.paths] + [Path.cwd()]:
            dirs.append(ddir if ddir.is_absolute() else base / ddir)
    dirs.append(data.parent)
    seen: set[Path] = set()
    for d in dirs:
        info = d / "dataset_info.json"
        if info in seen or not info.is_file():
            continue
        seen.add(info)
        try:
            table = json.loads(info.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(table, dict):
            continue
        for entry in cfg.datasets:
            e = table.get(entry["name"])
            if isinstance(e, dict) and isinstance(e.get("file_name"), str) and Path(e["file_name"]).name == data.name:
                return e, f"{info}: {entry['name']}"
    return None


def apply_columns(records: list[Any], entry: dict[str, Any]) -> list[Any]:
    """``records`` with the entry's column names (and sharegpt tags) renamed to LLaMA-Factory's defaults."""
    sharegpt = str(entry.get("formatting") or "alpaca").lower() == "sharegpt"
    cols = entry.get("columns") if isinstance(entry.get("columns"), dict) else {}
    names = {**(_SHAREGPT if sharegpt else _ALPACA), **_COMMON}
    rename = {str(v): names[k] for k, v in cols.items() if k in names and isinstance(v, str) and v != names[k]}
    tags = entry.get("tags") if sharegpt and isinstance(entry.get("tags"), dict) else {}
    tagmap = {k: str(tags.get(k, d)) for k, d in _TAG_DEFAULTS.items()}
    retag = tagmap != _TAG_DEFAULTS
    values = {tagmap[k]: _TAG_DEFAULTS[k] for k in _TAG_DEFAULTS if k not in ("role_tag", "content_tag")}

    def message(m: Any) -> Any:
        if not isinstance(m, dict):
            return m
        out = {k: v for k, v in m.items() if k not in (tagmap["role_tag"], tagmap["content_tag"])}
        if tagmap["role_tag"] in m:
            role = m[tagmap["role_tag"]]
            out["from"] = values.get(role, role) if isinstance(role, str) else role
        if tagmap["content_tag"] in m:
            out["value"] = m[tagmap["content_tag"]]
        return out

    out = []
    for r in records:
        if not isinstance(r, dict):
            out.append(r)
            continue
        row = {rename.get(k, k): v for k, v in r.items()}
        if retag:
            for k in ("conversations", "chosen", "rejected"):
                v = row.get(k)
                if isinstance(v, list):
                    row[k] = [message(m) for m in v]
                elif isinstance(v, dict):
                    row[k] = message(v)
        out.append(row)
    return out
