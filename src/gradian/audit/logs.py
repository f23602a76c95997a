"""Trainer logs: ``trainer_state.json`` (``log_history``), JSONL of logged dicts, or torchtune's text log.

torchtune 0.6.1's default ``DiskLogger`` (``training/metric_logging.py``) writes ``{output_dir}/logs/log_<unix
time>.txt``, one line per ``log_dict`` call: ``Step <global step> | name:value name:value``; its LoRA recipes log
``loss``, ``lr`` and ``tokens_per_second_per_gpu``, and ``grad_norm`` (a tensor, written as its repr
``tensor(0.52, device='cuda:0')``) when ``clip_grad_norm`` is set.

Each becomes a :class:`TrainLog`: train entries (``loss``, ``grad_norm``,
``learning_rate``, ``epoch``, ``mean_token_accuracy``), eval entries
(``eval_loss``), the final summary (``train_runtime``, ``train_loss``), and the
state fields of ``trainer_state.json`` (``global_step``, ``max_steps``,
``num_train_epochs``, ...). Keys logged by W&B-style loggers (``train/loss``,
``eval/loss``, ``train/global_step``) are accepted too. NaN and inf in logged values survive as
floats (``NaN``/``Infinity`` in JSON, or the strings ``"nan"``/``"inf"``): the NaN/inf check
reports them. Positions are checked on reading: a ``step`` is a whole number >= 0, an ``epoch``
a finite number in [0, :data:`MAX_EPOCH`]; anything else is a one-line user error naming the entry.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradian.errors import GradianUserError
from gradian.safeio import file_number, iter_lines, load_json_file, parse_json

_ALIASES = {
    "train/loss": "loss",
    "train_loss_step": "loss",
    "train/grad_norm": "grad_norm",
    "train/learning_rate": "learning_rate",
    "lr": "learning_rate",
    "train/epoch": "epoch",
    "train/global_step": "step",
    "global_step": "step",
    "eval/loss": "eval_loss",
    "train/mean_token_accuracy": "mean_token_accuracy",
}
#: a torchtune DiskLogger line, and one ``name:value`` of it (a tensor's repr: its first number)
_DISK_LINE = re.compile(r"Step (\d+) \| (.*)")
_DISK_ITEM = re.compile(r"([A-Za-z_][\w/.-]*):(?:tensor\(\s*([^,)\s]+)[^)]*\)|(\S+))")
#: where torchtune's DiskLogger writes in an output folder (its recipes' ``log_dir: ${output_dir}/logs``)
TORCHTUNE_LOGS = "logs/log_*.txt"
#: trainer_state.json fields the checks compute with: whole, finite, non-negative counts
_STATE_NUMBERS = (
    "global_step",
    "max_steps",
    "num_train_epochs",
    "epoch",
    "logging_steps",
    "eval_steps",
    "save_steps",
    "train_batch_size",
)
#: the largest ``epoch`` a log entry may give (the epoch checks walk the epochs one by one)
MAX_EPOCH = 100_000
_NUMERIC = (
    "loss",
    "grad_norm",
    "learning_rate",
    "epoch",
    "step",
    "eval_loss",
    "mean_token_accuracy",
    "train_loss",
    "train_runtime",
)


@dataclass
class LogPoint:
    """One logged value at a step."""

    step: int
    epoch: float | None
    value: float


@dataclass
class TrainLog:
    """A run's logged history.

    Attributes:
        train: train entries as dicts with ``step`` (int), ``epoch``, ``loss``, ``grad_norm``,
            ``learning_rate``, ``mean_token_accuracy`` (missing keys absent).
        eval: eval entries with ``step``, ``epoch``, ``eval_loss``.
        summary: the final entry (``train_runtime``, ``train_loss``, ...), or None.
        state: top-level ``trainer_state.json`` fields (``global_step``, ``max_steps``, ...).
        path: the file read; ``kind``: ``"trainer_state"``, ``"jsonl"`` or ``"torchtune"``.
        steps_inferred: True when entries had no step and their order was used.
    """

    train: list[dict[str, float]]
    eval: list[dict[str, float]]
    summary: dict[str, Any] | None
    state: dict[str, Any]
    path: str
    kind: str
    steps_inferred: bool = False
    notes: list[str] = field(default_factory=list)

    def series(self, key: str, source: str = "train") -> list[LogPoint]:
        """(step, epoch, value) of ``key`` over train (or eval) entries that log it."""
        rows = self.train if source == "train" else self.eval
        return [LogPoint(int(e["step"]), e.get("epoch"), float(e[key])) for e in rows if key in e]

    @property
    def completed(self) -> bool:
        """Whether the run reached its end: ``global_step >= max_steps``, or ``epoch`` reached
        ``num_train_epochs`` (both from ``trainer_state.json``), or the log has the final summary.
        """
        if self.summary is not None:
            return True
        gs, ms = self.global_step, self.state.get("max_steps")
        if gs is not None and isinstance(ms, (int, float)) and ms > 0 and gs >= ms:
            return True
        ep, ne = self.state.get("epoch"), self.state.get("num_train_epochs")
        if isinstance(ep, (int, float)) and isinstance(ne, (int, float)) and ne > 0:
            return ep >= ne - 1e-6
        return False

    @property
    def global_step(self) -> int | None:
        gs = self.state.get("global_step")
        if isinstance(gs, (int, float)) and not isinstance(gs, bool):
            return int(gs)
        steps = [int(e["step"]) for e in self.train + self.eval]
        return max(steps) if steps else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "kind": self.kind,
            "n_train": len(self.train),
            "n_eval": len(self.eval),
            "has_summary": self.summary is not None,
            "global_step": self.global_step,
            "max_steps": self.state.get("max_steps"),
        }


def _num(v: Any, where: str, key: str) -> float:
    if isinstance(v, bool):
        raise GradianUserError(f"{key} is a boolean, not a number", where=where, fix="log numbers")
    if isinstance(v, (int, float)):
        try:
            return float(v)
        except OverflowError:  # an integer beyond float range
            raise GradianUserError(
                f"{key} is an integer too large for a number", where=where, fix=f"log {key} as a number"
            ) from None
    if isinstance(v, str):
        try:
            return float(v.strip())  # "nan", "inf", "1e-4"
        except ValueError:
            pass
    raise GradianUserError(f"{key} is {v!r}, not a number", where=where, fix=f"log {key} as a number")


def _normalise(entries: list[Any], path: Path, kind: str) -> TrainLog:
    train: list[dict[str, float]] = []
    evals: list[dict[str, float]] = []
    summary = None
    inferred = False
    for i, raw in enumerate(entries):
        where = f"{path}: log_history[{i}]" if kind == "trainer_state" else f"{path}:{i + 1}"
        if not isinstance(raw, dict):
            raise GradianUserError(
                f"log entry is a JSON {type(raw).__name__}, not an object",
                where=where,
                fix='log one JSON object per entry, e.g. {"step": 10, "loss": 1.2}',
            )
        e = {_ALIASES.get(k, k): v for k, v in raw.items()}
        out: dict[str, float] = {}
        for k in _NUMERIC:
            if k in e and e[k] is not None:
                out[k] = _num(e[k], where, k)
        if "train_runtime" in out or ("train_loss" in out and "loss" not in out):
            summary = {k: v for k, v in e.items() if not isinstance(v, (dict, list))}
            continue
        if "step" not in out:
            inferred = True
            out["step"] = float(i)
        if not math.isfinite(out["step"]) or out["step"] < 0 or abs(out["step"]) > 1e15:
            raise GradianUserError(
                f"step is {out['step']!r}, not a step number", where=where, fix="log step as a whole number >= 0"
            )
        out["step"] = int(out["step"])
        if "epoch" in out:  # a position, not a measurement: NaN/inf (or a count no run reaches) is not an epoch
            file_number(
                out["epoch"],
                where,
                "epoch",
                "epoch",
                lo=0,
                hi=MAX_EPOCH,
                fix=f"log epoch as the passes over the data so far (0 to {MAX_EPOCH:,})",
            )
        if "eval_loss" in out:
            evals.append({k: out[k] for k in ("step", "epoch", "eval_loss") if k in out})
        elif "loss" in out:
            train.append(
                {
                    k: out[k]
                    for k in ("step", "epoch", "loss", "grad_norm", "learning_rate", "mean_token_accuracy")
                    if k in out
                }
            )
    train.sort(key=lambda d: d["step"])
    evals.sort(key=lambda d: d["step"])
    return TrainLog(
        train=train, eval=evals, summary=summary, state={}, path=str(path), kind=kind, steps_inferred=inferred
    )


def checkpoints(folder: str | Path) -> list[Path]:
    """The ``checkpoint-N`` folders of an HF/TRL output folder, by global step N (ascending)."""
    out = []
    for c in Path(folder).glob("checkpoint-*"):
        tail = c.name[len("checkpoint-") :]
        if c.is_dir() and tail.isdigit():
            out.append((int(tail), c))
    return [c for _, c in sorted(out)]


def find_trainer_state(path: str | Path) -> tuple[Path, str | None]:
    """The log file to read for ``path``, and a one-line note when it was found somewhere else.

    HF ``Trainer`` (and TRL) write ``trainer_state.json`` only inside ``OUT/checkpoint-N/``;
    ``save_model`` writes none at the top. So for an output folder, or an
    ``OUT/trainer_state.json`` that does not exist while ``OUT`` has checkpoints, the last
    checkpoint's (the highest global step N) is read.
    """
    p = Path(path)
    if p.is_dir():
        if (p / "trainer_state.json").exists():
            return p / "trainer_state.json", None
        found = [c / "trainer_state.json" for c in checkpoints(p) if (c / "trainer_state.json").exists()]
        tt = None if found else torchtune_log(p)
        if tt is not None:
            return tt, f"logs: read {tt} (torchtune's log in {p})"
        if not found:
            raise GradianUserError(
                "folder has no trainer_state.json, no checkpoint-N/trainer_state.json and no torchtune logs/log_*.txt",
                where=str(p),
                fix="pass the training output folder (with its checkpoint-N folders), a checkpoint folder, "
                "trainer_state.json or a JSONL of logged dicts",
            )
        return found[-1], f"logs: read {found[-1]} (the last checkpoint of {p})"
    if not p.exists():
        if p.name == "trainer_state.json" and p.parent.is_dir():
            found = [c / "trainer_state.json" for c in checkpoints(p.parent) if (c / "trainer_state.json").exists()]
            if found:
                return found[-1], (
                    f"logs: {p} does not exist (Trainer writes it only in checkpoint folders); "
                    f"read the last checkpoint's, {found[-1]}"
                )
        raise GradianUserError("log file not found", where=str(p), fix="check the path")
    return p, None


def load_logs(path: str | Path) -> TrainLog:
    """Read ``trainer_state.json`` (or an output/checkpoint folder holding one) or a JSONL of logged dicts.

    An output folder (or its missing top-level ``trainer_state.json``) reads its last checkpoint's
    state (see :func:`find_trainer_state`); the note saying so is in ``TrainLog.notes``.
    """
    p, note = find_trainer_state(path)
    log = _load_file(p)
    if note:
        log.notes.append(note)
    return log


def _load_file(p: Path) -> TrainLog:
    if p.suffix.lower() == ".jsonl":
        entries = []
        for i, line in iter_lines(p, "log file"):
            if not line.strip():
                continue
            entries.append(parse_json(line, str(p), line=i, fix="make every line one JSON object of logged values"))
        if not entries:
            raise GradianUserError("log file is empty", where=str(p), fix="pass a log with at least one entry")
        log = _normalise(entries, p, "jsonl")
    elif p.suffix.lower() == ".json":
        obj = load_json_file(p, "log file", fix="fix the JSON (trainer_state.json is written by transformers' Trainer)")
        if isinstance(obj, list):
            log = _normalise(obj, p, "jsonl")
        elif isinstance(obj, dict):
            if not isinstance(obj.get("log_history"), list):
                raise GradianUserError(
                    "no log_history list (is this trainer_state.json?)",
                    where=f"{p}: log_history",
                    fix="pass the trainer_state.json that Trainer writes to the output/checkpoint folder, "
                    "or a JSONL with one logged dict per line",
                )
            log = _normalise(obj["log_history"], p, "trainer_state")
            log.state = {k: v for k, v in obj.items() if k != "log_history" and not isinstance(v, (list,))}
            for k in _STATE_NUMBERS:
                v = log.state.get(k)
                if v is None:
                    continue
                if (
                    isinstance(v, bool)
                    or not isinstance(v, (int, float))
                    or not 0 <= v <= 1e15
                    or (isinstance(v, float) and math.isnan(v))
                ):
                    raise GradianUserError(
                        f"{k} is {str(v)[:40]!r}, not a count",
                        where=f"{p}: {k}",
                        fix="pass the trainer_state.json that Trainer wrote, unedited",
                    )
        else:
            raise GradianUserError(
                "top level is not an object or a list",
                where=str(p),
                fix="pass trainer_state.json or a JSONL of logged dicts",
            )
    elif p.suffix.lower() == ".txt":
        log = _normalise(_disk_logger_entries(p), p, "torchtune")
    else:
        raise GradianUserError(
            f"unknown log file type {p.suffix or '(no extension)'!r}",
            where=str(p),
            fix="pass trainer_state.json, a .jsonl of logged dicts or torchtune's logs/log_*.txt",
        )
    if not log.train and not log.eval:
        raise GradianUserError(
            "no loss or eval_loss in any log entry",
            where=str(p),
            fix="log 'loss' (and 'eval_loss'): set logging_steps, or pass the full trainer_state.json",
        )
    return log


def _disk_logger_entries(p: Path) -> list[dict[str, Any]]:
    """The entries of a torchtune ``DiskLogger`` file (module docstring): ``{"step": N, name: value, ...}``."""
    entries: list[dict[str, Any]] = []
    for i, line in iter_lines(p, "log file"):
        if not line.strip():
            continue
        m = _DISK_LINE.fullmatch(line.strip())
        if m is None:
            raise GradianUserError(
                "not a torchtune DiskLogger line ('Step N | name:value ...')",
                where=f"{p}:{i}",
                fix="pass torchtune's logs/log_*.txt unedited, trainer_state.json or a JSONL of logged dicts",
            )
        entry: dict[str, Any] = {"step": m.group(1)}
        for name, tensor, value in _DISK_ITEM.findall(m.group(2)):
            entry[name] = tensor or value
        entries.append(entry)
    if not entries:
        raise GradianUserError("log file is empty", where=str(p), fix="pass a log with at least one entry")
    return entries


def torchtune_log(folder: Path) -> Path | None:
    """The newest torchtune ``DiskLogger`` file in an output folder (``logs/log_<unix time>.txt``), or None."""
    found = [f for f in Path(folder).glob(TORCHTUNE_LOGS) if f.is_file() and f.stem[4:].isdigit()]
    return max(found, key=lambda f: int(f.stem[4:])) if found else None


def is_finite(x: float) -> bool:
    """Whether ``x`` is a finite number (not NaN or infinite)."""
    return not (math.isnan(x) or math.isinf(x))
