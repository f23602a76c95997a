"""The one reader every config format goes through: file loading, typed access, aliases, format dispatch, merging.

* :func:`read_mapping` loads a JSON/YAML file through :mod:`gradian.safeio` (pickles refused, top level must be
  a mapping with string keys); ``gradian train`` loads its config with it too.
* :data:`ALIASES` are the other spellings of a TRL / HF ``TrainingArguments`` setting (older TRL, axolotl,
  torchtune, PEFT's ``LoraConfig``); :func:`canonical_key` resolves one.
* :class:`Reader` gives typed access to one file's mapping (numbers coerced, errors naming the file and key).
* :class:`Format` describes one trainer's files; every module of this package that defines ``FORMAT`` is one
  (discovered by :func:`formats`), so a new trainer format is one file.
* :func:`read_config` detects a file's format and reads it; :func:`load_config` merges several files and fills
  the trainer's defaults.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from gradian.audit.config.model import META_FIELDS, TrainConfig
from gradian.errors import GradianUserError
from gradian.safeio import parse_json, parse_yaml, read_text, short_repr

#: The first line of every training_config.yaml that ``gradian train`` writes.
GRADIAN_TRAIN_HEADER = "# gradian train:"
#: Key :func:`read_config` adds to a mapping written by ``gradian train`` (a NUL byte: no YAML key collides).
BY_GRADIAN_TRAIN = "\x00written by gradian train"
#: Key :func:`read_config` adds to the settings of a ``training_args.bin``: the class it saved
#: (``trl.trainer.sft_config.SFTConfig``), which says the trainer where the fields cannot (every field is saved).
SAVED_CLASS = "\x00saved class"

#: Other tools' names for a TRL / HF TrainingArguments setting: ``{alias: TRL name}``.
ALIASES = {
    "max_seq_length": "max_length",  # TRL < 0.16
    "lr": "learning_rate",
    "epochs": "num_train_epochs",  # torchtune
    "num_epochs": "num_train_epochs",  # axolotl
    "micro_batch_size": "per_device_train_batch_size",  # axolotl
    "peft_use_rslora": "use_rslora",  # axolotl
    "r": "lora_r",  # PEFT LoraConfig (TRL's ModelConfig prefixes its LoRA fields)
    "target_modules": "lora_target_modules",  # PEFT LoraConfig
}


def canonical_key(key: str) -> str:
    """The TRL name of setting ``key`` (``key`` itself when it is not an alias)."""
    return ALIASES.get(key, key)


def spellings(key: str) -> tuple[str, ...]:
    """``key`` (a TRL name) followed by its aliases, in :data:`ALIASES` order."""
    return (key, *(a for a, k in ALIASES.items() if k == key))


# ---------------------------------------------------------------------- file loading
def is_pickle_name(path: Path) -> bool:
    """Whether a file's name says it is a pickle (``training_args.bin``, ``*.pt``, ``*.pkl``, ``*.pickle``)."""
    return path.name.endswith(".bin") or path.suffix in (".pt", ".pkl", ".pickle")


def read_mapping(
    path: Path, what: str = "config", *, any_suffix: bool = False, empty_ok: bool = False
) -> tuple[dict[str, Any], str]:
    """Load a JSON/YAML settings file: ``(mapping, text)``.

    Args:
        path: the file (a ``.json`` file is parsed as JSON, anything else as YAML).
        what: what the file is, for error messages.
        any_suffix: accept any file name (YAML unless ``.json``); otherwise only ``.json``/``.yaml``/``.yml``.
        empty_ok: an empty file is an empty mapping (otherwise it is refused: no settings).

    Raises:
        GradianUserError: a pickle, an unknown suffix, a parse error, a top level that is not a mapping of
            string keys.

    """
    if is_pickle_name(path):
        raise GradianUserError(
            "this is a pickle (e.g. training_args.bin); Gradian never unpickles user files",
            where=str(path),
            fix="export the arguments as JSON with training_args.to_json_string() and pass that file",
        )
    suffix = path.suffix.lower()
    if not any_suffix and suffix not in (".json", ".yaml", ".yml"):
        raise GradianUserError(
            f"unknown config file type {suffix or '(no extension)'!r}",
            where=str(path),
            fix="pass a .json or .yaml config, or a PEFT adapter folder",
        )
    text = read_text(path, what)
    obj = parse_json(text, str(path)) if suffix == ".json" else parse_yaml(text, str(path))
    if obj is None and empty_ok:
        obj = {}
    if not isinstance(obj, dict):
        raise GradianUserError(
            f"top level is a {type(obj).__name__}, not a mapping of settings",
            where=str(path),
            fix="pass a config file whose top level is key: value settings",
        )
    bad_keys = [k for k in obj if not isinstance(k, str)]
    if bad_keys:
        raise GradianUserError(
            f"setting name {short_repr(bad_keys[0])} is not a string",
            where=str(path),
            fix="write every top-level setting as name: value (quote names YAML reads as numbers, dates or booleans)",
        )
    return obj, text


# ---------------------------------------------------------------------- typed access
class Reader:
    """Typed access to one config mapping, with errors that name the file and field."""

    def __init__(self, raw: dict[str, Any], path: str):
        """Wrap ``raw``, read from the file at ``path``."""
        self.raw = raw
        self.path = path

    def where(self, key: str) -> str:
        """The source of ``key``'s value: ``"<file name>: <key>"``."""
        return f"{Path(self.path).name}: {key}"

    def get(self, key: str, default: Any = None) -> Any:
        """The value at ``key`` (dots go into nested mappings: ``"peft_config.r"``), or ``default``."""
        cur: Any = self.raw
        for part in key.split("."):
            if not isinstance(cur, dict) or part not in cur:
                return default
            cur = cur[part]
        return cur

    def has(self, key: str) -> bool:
        """True when ``key`` is present with a non-null value."""
        sentinel = object()
        return self.get(key, sentinel) is not sentinel and self.get(key) is not None

    def has_key(self, key: str) -> bool:
        """True when ``key`` is present, even with a null value."""
        sentinel = object()
        return self.get(key, sentinel) is not sentinel

    def num(self, key: str) -> float | None:
        """``key`` as a float (YAML 1.1 strings such as ``"2e-4"`` coerced), or None when unset."""
        v = self.get(key)
        if v is None or isinstance(v, bool):
            return None if v is None else self.bad(key, v, "a number")
        if isinstance(v, (int, float)):
            try:
                return float(v)
            except OverflowError:  # an integer beyond float range
                return self.bad(key, v, "a number in float range")
        if isinstance(v, str):
            s = v.strip()
            if s.lower() in ("none", "null", ""):
                return None
            try:
                return float(s)
            except ValueError:
                return self.bad(key, v, "a number")
        return self.bad(key, v, "a number")

    def int_(self, key: str) -> int | None:
        """``key`` as a whole number, or None when unset."""
        v = self.num(key)
        if v is None:
            return None
        if not math.isfinite(v) or v != int(v):
            return self.bad(key, self.get(key), "a whole number")
        return int(v)

    def bool_(self, key: str) -> bool | None:
        """``key`` as a bool (``yes``/``on``/``1`` ... accepted; ``auto`` is None), or None when unset."""
        v = self.get(key)
        if v is None or isinstance(v, bool):
            return v
        if isinstance(v, (int, float)) and v in (0, 1):
            return bool(v)
        if isinstance(v, str):
            s = v.strip().lower()
            if s in ("true", "yes", "1", "on"):
                return True
            if s in ("false", "no", "0", "off", "none", ""):
                return False
            if s == "auto":
                return None
        return self.bad(key, v, "true or false")

    def str_(self, key: str) -> str | None:
        """``key`` as a string, or None when unset."""
        v = self.get(key)
        if v is None:
            return None
        if isinstance(v, (dict, list)):
            return self.bad(key, v, "a string")
        return str(v)

    def list_(self, key: str) -> list[str] | str | None:
        """``key`` as a list of names (a comma-separated string is split; one name stays a string)."""
        v = self.get(key)
        if v is None:
            return None
        if isinstance(v, str):
            parts = [p.strip() for p in v.split(",")] if "," in v else [v.strip()]
            return parts if len(parts) > 1 else parts[0]
        if isinstance(v, (list, tuple)):
            return [str(x) for x in v]
        return self.bad(key, v, "a list of names or a string")

    def bad(self, key: str, v: Any, want: str):
        """Raise the error for a value of ``key`` that is not ``want``."""
        raise GradianUserError(
            f"{key} is {short_repr(v)}, not {want}", where=f"{self.path}: {key}", fix=f"set {key} to {want}"
        )


#: One field-table row: ``(TrainConfig field, config key, kind)``, kind one of num/int/bool/str/list.
Row = tuple[str, str, str]


def set_many(
    cfg: TrainConfig,
    r: Reader,
    rows: Sequence[Row],
    keys: Mapping[str, str | None] | None = None,
    prefix: str = "",
) -> None:
    """Set each row's field from its key when the file has it.

    Args:
        cfg: the config being filled.
        r: the file.
        rows: the field table.
        keys: the format's own name for a row's key (``{"num_train_epochs": "num_epochs"}``); None: the format
            has no such key, the row is skipped.
        prefix: the section the keys stand in (``"peft_config."``: the row's key under ``peft_config``).

    """
    keys = keys or {}
    for name, key, kind in rows:
        key = keys.get(key, key)
        if key is None:
            continue
        key = prefix + key
        if not r.has(key):
            continue
        v = {"num": r.num, "int": r.int_, "bool": r.bool_, "str": r.str_, "list": r.list_}[kind](key)
        cfg.set(name, v, r.where(key))


# ---------------------------------------------------------------------- formats
@dataclass(frozen=True)
class Format:
    """One trainer's config files: how to recognise them, read them, and the trainer's defaults.

    Detection (:func:`detect_config_format`): formats with ``claims`` are asked in ``order``; then the format
    with the most ``votes`` keys present wins (ties to the lower ``order``); then a ``fallback`` key decides.

    Attributes:
        name: the format's name (``TrainConfig.formats``).
        title: the trainer's name in a default's source (``"default (TRL SFTConfig)"``).
        read: fills a TrainConfig from the file (``read(cfg, reader)``).
        order: detection order.
        claims: True when the mapping is certainly this format (``peft_type``, ``_component_`` entries ...).
        votes: keys only this format's files have.
        fallback: keys that make it this format when no other format is recognised.
        trainer: the value of ``TrainConfig.trainer`` its files set (None: the file does not say).
        trainer_note: why, after the file name, in the source of ``trainer``.
        defaults: the values the trainer applies when a field is left unset (see docs/diagnose.md).
        after_defaults: fix-ups once the defaults are filled (e.g. a default that depends on another field).

    """

    name: str
    title: str
    read: Callable[[TrainConfig, Reader], None]
    order: int
    claims: Callable[[dict[str, Any]], bool] | None = None
    votes: frozenset[str] = frozenset()
    fallback: frozenset[str] = frozenset()
    trainer: str | None = None
    trainer_note: str = "format"
    defaults: Mapping[str, Any] = field(default_factory=dict)
    after_defaults: Callable[[TrainConfig], None] | None = None


_FORMATS: dict[str, Format] = {}


def formats() -> dict[str, Format]:
    """Every config format, by name, in detection order: the ``FORMAT`` of each module of this package."""
    if not _FORMATS:
        # this file's folder is the config package: list its modules without importing the package (which
        # imports this reader)
        found = []
        for info in pkgutil.iter_modules([str(Path(__file__).resolve().parent)]):
            fmt = getattr(importlib.import_module(f"{__package__}.{info.name}"), "FORMAT", None)
            if isinstance(fmt, Format):
                found.append(fmt)
        _FORMATS.update((f.name, f) for f in sorted(found, key=lambda f: f.order))
    return _FORMATS


def detect_config_format(raw: dict[str, Any]) -> str | None:
    """The format of a config mapping (``trl``, ``hf``, ``axolotl``, ``llamafactory`` ...; see :func:`formats`)."""
    fs = list(formats().values())
    for f in fs:
        if f.claims is not None and f.claims(raw):
            return f.name
    keys = set(raw)
    votes = [(len(keys & f.votes), -f.order, f.name) for f in fs if f.votes]
    best = max(votes, default=(0, 0, None))
    if best[0] > 0:
        return best[2]
    return next((f.name for f in fs if keys & f.fallback), None)


# ---------------------------------------------------------------------- reading and merging
def read_config(path: str | Path) -> TrainConfig:
    """Read one config file (or PEFT adapter folder) into a :class:`TrainConfig` (no defaults applied).

    An HF Trainer's ``training_args.bin`` is read without unpickling it
    (:func:`gradian.audit.config.training_args.read_training_args`), with the library versions of the model card
    beside it.
    """
    p = Path(path)
    if not p.exists():
        raise GradianUserError("config not found", where=str(p), fix="check the path")
    versions: dict[str, str] = {}
    if p.is_dir():
        cfg_path = p / "adapter_config.json"
        if not cfg_path.exists():
            raise GradianUserError(
                "folder has no adapter_config.json",
                where=str(p),
                fix="pass a PEFT adapter folder, or the config file itself",
            )
        versions = framework_versions(p / "README.md")
        p = cfg_path
    if p.name == MODEL_CARD and p.is_file():  # an axolotl model card: the config it holds
        raw, text, card_versions = _card_config(p)
        versions.update(card_versions)
    elif is_pickle_name(p):  # HF Trainer's training_args.bin: read statically, never unpickled
        from gradian.audit.config.training_args import read_training_args

        raw, cls = read_training_args(p)
        raw[SAVED_CLASS] = cls
        text = ""
        versions = framework_versions(p.parent / MODEL_CARD)  # the card TRL / HF Trainer wrote beside it
    else:
        raw, text = read_mapping(p)
    if text.startswith(GRADIAN_TRAIN_HEADER) and "use_peft" in raw:
        # written by gradian train (older versions wrote no messages_loss field, but always this header line)
        raw[BY_GRADIAN_TRAIN] = True
    name = detect_config_format(raw)
    if name is None:
        shown = ", ".join(sorted(map(str, raw))[:8]) or "none"
        raise GradianUserError(
            f"unknown config format (keys: {shown})",
            where=str(p),
            fix="pass a TRL/HF TrainingArguments, axolotl, LLaMA-Factory or torchtune config, or a PEFT "
            "adapter_config.json",
        )
    fmt = formats()[name]
    cfg = TrainConfig()
    cfg.paths.append(str(p))
    cfg.formats.append(name)
    cfg.versions.update(versions)
    fmt.read(cfg, Reader(raw, str(p)))
    if fmt.trainer:
        cfg.set("trainer", fmt.trainer, f"{p.name} ({fmt.trainer_note})")
    for k in cfg.versions:
        beside = p.name == "adapter_config.json" or is_pickle_name(p)  # versions from the model card beside it
        cfg.version_sources[k] = str(p.parent / MODEL_CARD) if beside else str(p)
    # the config's own pins ("# pip install trl==0.19.1", a trl_version field), then a requirements.txt beside it
    for k, (v, where) in pinned_versions(text, p).items():
        if k not in cfg.versions:
            cfg.versions[k] = v
            cfg.version_sources[k] = where
    return cfg


_PIN_LIBS = ("trl", "transformers", "peft", "axolotl", "llamafactory", "torchtune", "datasets", "accelerate")
_PIN_RE = re.compile(r"(?<![\w.-])(" + "|".join(_PIN_LIBS) + r")\s*(?:\[[^\]]*\])?\s*===?\s*v?([0-9][0-9a-zA-Z.+-]*)")
_PIN_KEY_RE = re.compile(r"^\s*(" + "|".join(_PIN_LIBS) + r")_version\s*:\s*[\"']?v?([0-9][0-9a-zA-Z.+-]*)", re.M)


def pinned_versions(text: str, path: Path) -> dict[str, tuple[str, str]]:
    """Exact framework pins a config declares: ``{lib: (version, where)}``.

    Read from the config's text (``trl==0.19.1`` anywhere, a comment included, or a ``trl_version: 0.19.1`` field),
    then from a ``requirements.txt`` in the config's folder (``name==version`` lines). Only ``==`` pins count: a
    range (``trl>=0.19``) does not say which version ran.
    """
    out: dict[str, tuple[str, str]] = {}
    for rx in (_PIN_KEY_RE, _PIN_RE):
        for m in rx.finditer(text):
            out.setdefault(m.group(1).lower(), (m.group(2).rstrip(".,"), f"{path}: {m.group(0).strip()}"))
    req = path.parent / "requirements.txt"
    if req.is_file():
        try:
            rtext = read_text(req, "requirements file")
        except GradianUserError:  # an unreadable requirements file only costs the version hints
            rtext = ""
        for line in rtext.splitlines():
            m = _PIN_RE.match(line.split("#", 1)[0].strip())
            if m:
                out.setdefault(m.group(1).lower(), (m.group(2).rstrip(".,"), f"{req}: {m.group(0).strip()}"))
    return out


def load_config(paths: str | Path | list[str | Path] | tuple) -> TrainConfig:
    """Read and merge one or more configs, then fill the training stack's defaults.

    Args:
        paths: one path or several (e.g. a TRL YAML and the adapter folder).

    Returns:
        the merged :class:`TrainConfig`; ``sources`` tells, per field, the file and key
        (or ``"default (<stack>)"``).

    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    merged = TrainConfig()
    for p in paths:
        one = read_config(p)
        merge_into(merged, one)
    apply_defaults(merged)
    return merged


def merge_into(dst: TrainConfig, src: TrainConfig) -> None:
    """Merge ``src`` into ``dst``: explicit values beat defaults, the first of two explicit values is kept."""
    for f in fields(TrainConfig):
        if f.name in META_FIELDS:
            continue
        v = getattr(src, f.name)
        if v is not None:
            dst.set(f.name, v, src.sources.get(f.name, "?"))
    dst.paths += src.paths
    dst.formats += src.formats
    dst.conflicts += src.conflicts
    dst.notes += [n for n in src.notes if n not in dst.notes]
    for k, v in src.versions.items():
        if k not in dst.versions:
            dst.versions[k] = v
            dst.version_sources[k] = src.version_sources.get(k, "?")


def apply_defaults(cfg: TrainConfig) -> None:
    """Fill unset fields with the defaults of the stacks that read them (trainer, then PEFT)."""
    known = formats()
    stacks = []
    if cfg.trainer == "llamafactory" and "llamafactory_v1" in cfg.formats:
        stacks.append("llamafactory_v1")
    elif cfg.trainer:
        stacks.append(cfg.trainer)
    if "peft" in cfg.formats or cfg.is_lora:
        stacks.append("peft")
    for st in stacks:
        fmt = known.get(st)
        if fmt is None:
            continue
        for k, v in fmt.defaults.items():
            if getattr(cfg, k) is None:
                if k == "max_length" and cfg.truncation == "none":
                    continue
                if k.startswith("lora_") or k in ("use_rslora", "use_dora"):
                    if not cfg.is_lora:
                        continue
                cfg.set(k, v, f"default ({fmt.title})", default=True)
        if fmt.after_defaults is not None:
            fmt.after_defaults(cfg)


_FW_RE = re.compile(
    r"^\s*[-*]\s*(TRL|Transformers|PEFT|Pytorch|PyTorch|Datasets|Tokenizers)\s*:?\s*v?([0-9][\w.+-]*)", re.IGNORECASE
)


#: axolotl's model card: its config in a "See axolotl config" block (axolotl 0.19.0 ``train.setup_model_card``).
MODEL_CARD = "README.md"

_AXOLOTL_BLOCK = re.compile(
    r"<summary>See axolotl config</summary>\s*(?:axolotl version: `(?P<version>[^`\n]*)`\s*)?"
    r"```ya?ml\n(?P<yaml>.*?)\n```",
    re.S,
)


def axolotl_card(path: str | Path) -> tuple[str, str | None] | None:
    """``(YAML text, axolotl version or None)`` of the config an axolotl model card holds; None when it holds none.

    Raises:
        GradianUserError: the file cannot be read (not a regular file, too large, not UTF-8).
    """
    m = _AXOLOTL_BLOCK.search(read_text(path, "model card"))
    if m is None:
        return None
    return m.group("yaml"), (m.group("version") or None)


def _card_config(path: Path) -> tuple[dict[str, Any], str, dict[str, str]]:
    """``(settings, YAML text, versions)`` of the axolotl config an axolotl model card holds
    (:func:`axolotl_card`).

    Raises:
        GradianUserError: the card holds no axolotl config, or its YAML is malformed or not a mapping.
    """
    card = axolotl_card(path)
    if card is None:
        raise GradianUserError(
            "this model card holds no axolotl config block",
            where=str(path),
            fix="pass the training config file itself",
        )
    text, version = card
    obj = parse_yaml(text, f"{path} (axolotl config)")
    if not isinstance(obj, dict) or any(not isinstance(k, str) for k in obj):
        raise GradianUserError(
            "the axolotl config in this model card is not a mapping of settings",
            where=str(path),
            fix="pass the training config file itself",
        )
    return obj, text, ({"axolotl": version} if version else {})


def framework_versions(readme: Path) -> dict[str, str]:
    """Library versions from a model card's "Framework versions" list (TRL and PEFT write one)."""
    if not readme.exists():
        return {}
    out: dict[str, str] = {}
    try:
        text = read_text(readme, "model card")
    except GradianUserError:  # a model card we cannot read only costs the version hints
        return {}
    for line in text.splitlines():
        m = _FW_RE.match(line)
        if m:
            out.setdefault(m.group(1).lower().replace("pytorch", "torch"), m.group(2).rstrip("."))
    return out
