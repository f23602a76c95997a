"""Content identities for the manifest: model, adapter, dataset, library versions, and a trajectory's checkpoint.

An identity is a sha256 over file *contents*, so the same inputs give the same
id on any machine and at any path. File hashes are memoised in the cache by
(path, size, mtime) so a 500 MB checkpoint is read once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradian.paths import cache_dir
from gradian.util import atomic_write_json, sha256_file, sha256_json

_MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
_WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.gguf", "*.pt")


def _memo_path() -> Path:
    return cache_dir() / "file-hashes.json"


def file_hash(path: str | Path) -> str:
    """The sha256 of a file's contents, memoised in the cache by (resolved path, size, mtime).

    An unchanged file is hashed once per machine; a failure to write the memo is ignored (the hash
    is still returned).
    """
    p = Path(path).resolve()
    st = p.stat()
    key = f"{p}|{st.st_size}|{st.st_mtime_ns}"
    memo_file = _memo_path()
    try:
        memo = json.loads(memo_file.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        memo = {}
    if key in memo:
        return memo[key]
    h = sha256_file(p)
    memo[key] = h
    try:
        atomic_write_json(memo_file, memo)
    except OSError:
        pass
    return h


def folder_identity(folder: str | Path, names: tuple[str, ...] = (), globs: tuple[str, ...] = ()) -> dict[str, str]:
    """``{relative file name: sha256}`` over the named files and globs that exist."""
    f = Path(folder)
    files: set[Path] = {f / n for n in names if (f / n).is_file()}
    for g in globs:
        files.update(p for p in f.glob(g) if p.is_file())
    return {str(p.relative_to(f)): file_hash(p) for p in sorted(files)}


def resolve_model_folder(name_or_path: str) -> Path | None:
    """A local folder for a model: the path itself, or the HF cache snapshot of an id (no network)."""
    p = Path(name_or_path)
    if p.is_dir():
        return p
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name_or_path, local_files_only=True))
    except Exception:
        return None


def model_identity(name_or_path: str) -> dict[str, Any]:
    """The base model's identity: its name and a sha256 over its config, tokenizer and weight files.

    Returns:
        ``{"name", "sha256"}`` (the name is the folder's name for a local path, else the HF id), or
        ``{"name", "files": None}`` when no local folder or cached snapshot is found.
    """
    folder = resolve_model_folder(name_or_path)
    if folder is None:
        return {"name": name_or_path, "files": None}
    files = folder_identity(folder, _MODEL_FILES, _WEIGHT_GLOBS)
    return {
        "name": Path(name_or_path).name if Path(name_or_path).is_dir() else name_or_path,
        "sha256": sha256_json(files),
    }


#: adapter_config.json fields that PEFT treats as sets but writes as lists in an arbitrary order: PEFT keeps
#: ``target_modules`` as a Python set, so two saves of the same adapter (another process, another string-hash
#: seed) list it in another order. Sorted before hashing, so the same adapter always has the same identity.
_SET_VALUED_ADAPTER_FIELDS = ("target_modules", "modules_to_save", "exclude_modules", "layers_to_transform")
_ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")


def _adapter_config_hash(path: Path) -> str:
    """sha256 of ``adapter_config.json`` read as JSON with its set-valued lists sorted (the raw bytes' sha256 when the
    file is not a JSON object, which the adapter's loader then reports).
    """
    import json

    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return file_hash(path)
    if not isinstance(cfg, dict):
        return file_hash(path)
    for k in _SET_VALUED_ADAPTER_FIELDS:
        v = cfg.get(k)
        if isinstance(v, list) and (all(isinstance(x, str) for x in v) or all(type(x) is int for x in v)):
            cfg[k] = sorted(v)
    return sha256_json(cfg)


def adapter_identity(adapter_dir: str | Path) -> dict[str, Any]:
    """``{"sha256"}`` over the adapter's ``adapter_config.json`` (as JSON, its set-valued lists sorted) and its
    weight file(s), so the same adapter saved twice has one identity.
    """
    f = Path(adapter_dir)
    files = folder_identity(f, (), _ADAPTER_WEIGHTS)
    if (f / "adapter_config.json").is_file():
        files["adapter_config.json"] = _adapter_config_hash(f / "adapter_config.json")
    return {"sha256": sha256_json(dict(sorted(files.items())))}


def legacy_adapter_sha(adapter_dir: str | Path) -> str:
    """The adapter identity that runs written before the config was read as JSON recorded (the raw bytes' sha256);
    for :func:`gradian.attribute.changes.changed_inputs`, so those runs are not reported as changed.
    """
    files = folder_identity(adapter_dir, ("adapter_config.json",), _ADAPTER_WEIGHTS)
    return sha256_json(files)


def adapter_unchanged(adapter_dir: str | Path, recorded: str) -> bool:
    """Whether ``adapter_dir`` is the adapter whose identity a run recorded (today's identity, or the legacy one)."""
    return adapter_identity(adapter_dir)["sha256"] == recorded or legacy_adapter_sha(adapter_dir) == recorded


def dataset_identity(path: str | Path) -> dict[str, Any]:
    """``{"name", "sha256"}`` of a dataset file, or of a saved HF dataset folder (its ``.arrow``/``.json`` files).

    An lm-eval ``--log_samples`` output (a folder, or one samples file): a sha256 over its samples files *and* the
    ``results_<date>.json`` beside them (:func:`gradian.evaluate.lm_eval.lm_eval_files`), so a changed sample or a
    changed task config gives another run identity. Any other file or folder: as before.
    """
    p = Path(path)
    if p.exists():
        from gradian.evaluate.lm_eval import lm_eval_files

        lm = lm_eval_files(p)
        if lm:
            root = p if p.is_dir() else p.parent
            return {"name": p.name, "sha256": sha256_json({str(f.relative_to(root)): file_hash(f) for f in lm})}
    if p.is_dir():
        files = folder_identity(p, (), ("*.arrow", "*.json", "*/*.arrow", "*/*.json"))
        return {"name": p.name, "sha256": sha256_json(files)}
    return {"name": p.name, "sha256": file_hash(p)}


def library_versions() -> dict[str, str]:
    """The versions of gradian, torch (without its ``+cu…`` local tag), transformers, peft and numpy."""
    import numpy
    import peft
    import torch
    import transformers

    from gradian.version import __version__

    return {
        "gradian": __version__,
        "torch": torch.__version__.split("+")[0],
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "numpy": numpy.__version__,
    }


@dataclass(frozen=True)
class Checkpoint:
    """One point of the trajectory.

    Attributes:
        path: a PEFT adapter folder.
        step: its optimizer step (``checkpoint-<step>``, or the final adapter's
            ``trainer_state.json`` ``global_step``); None when unknown.
        final: whether this is the adapter being debugged.
        weight: ``w_t`` (normalised; :mod:`gradian.attribute.trajectory` sets it).
        sha256: the adapter weights' content identity.
        also: other folders holding the same adapter weights (the last ``checkpoint-*`` of a run
            is usually the final adapter); their ``optimizer.pt`` counts as this point's.
    """

    path: Path
    step: int | None
    final: bool
    weight: float
    sha256: str
    also: tuple[Path, ...] = ()

    @property
    def optimizer(self) -> Path | None:
        """The ``optimizer.pt`` saved with these weights, if any."""
        for folder in (self.path, *self.also):
            p = folder / "optimizer.pt"
            if p.is_file():
                return p
        return None

    @property
    def label(self) -> str:
        return "final" if self.final else f"step {self.step}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "step": self.step,
            "final": self.final,
            "weight": self.weight,
            "adapter_sha256": self.sha256,
            "optimizer": str(self.optimizer) if self.optimizer else None,
        }
