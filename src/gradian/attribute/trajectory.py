"""The training trajectory: checkpoints as first-class inputs to attribution.

Influence at the final adapter alone misses rows the fine-tune has memorised:
their loss is near zero there, so their gradient is near zero and they look
harmless, although they did their damage earlier. TracIn (Pruthi et al., 2020)
sums the first-order effect over the checkpoints of the run:

    score_j = Σ_t w_t · score_t(j),      w_t = η_t / Σ_s η_s

where ``score_t(j)`` is any engine's score of row j computed entirely at
checkpoint t (its own training gradients, its own query gradients, its own
fitted curvature) and ``η_t`` is the learning rate the optimizer used for the
steps that checkpoint t stands for: the mean logged ``learning_rate`` over the
steps after the previous checkpoint, up to and including t's step (LESS's
choice), read from ``trainer_state.json``'s ``log_history``. Without a log the
weights are equal. The weights are normalised to sum to 1, so the combined score
keeps the units of a single-checkpoint influence and ``score / n`` stays a
first-order loss change (:mod:`gradian.sign`).

The queries are always the *final* model's failing items and its wrong
answers; their gradients are re-evaluated at every checkpoint.

Layout (HF Trainer): ``output_dir/checkpoint-<step>/`` with
``adapter_config.json``, ``adapter_model.safetensors``, ``optimizer.pt`` and
``trainer_state.json``; torchtune 0.6.1: ``output_dir/epoch_<N>/`` (N from 0)
with the adapter in PEFT's format, and its log in ``output_dir/logs/``
(:func:`torchtune_steps_per_epoch` turns an epoch into its last step).
:func:`discover_checkpoints` finds the checkpoints that are children or
siblings of the adapter folder; when the adapter is itself ``checkpoint-S``
(``epoch_N``), later checkpoints are excluded (they are the future).
Checkpoints with the same adapter weights as another (the last checkpoint is
usually the final adapter) are counted once. A checkpoint trained on another
base or with another LoRA shape is refused.

Cost is linear in the number of checkpoints: one gradient index per checkpoint
(content-addressed, so each is built once) and one query pass per checkpoint.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from gradian.attribute.visits import RowVisits
from gradian.errors import GradianUserError
from gradian.index.identity import Checkpoint, adapter_identity
from gradian.paths import checkpoint_folders, checkpoint_number
from gradian.safeio import file_number, load_json_file, load_yaml_file

# LoRA settings that must agree between the final adapter and every checkpoint.
_MUST_MATCH = ("peft_type", "r", "lora_alpha", "use_rslora", "use_dora", "fan_in_fan_out")


@dataclass(frozen=True)
class Trajectory:
    """The checkpoints to score over and how their scores combine.

    Attributes:
        checkpoints: in training order; the final adapter last.
        weight_rule: how the weights were set (``"lr"`` or ``"equal"``) and why.
    """

    checkpoints: tuple[Checkpoint, ...]
    weight_rule: str
    visits: RowVisits | None = None
    visits_rule: str = ""

    @property
    def weights(self) -> list[float]:
        return [c.weight for c in self.checkpoints]

    def row_weights(self) -> np.ndarray | None:
        """(T, n) ``W[c, j]``, each checkpoint's weight row by row (:mod:`gradian.attribute.visits`); None: every row
        takes its checkpoint's weight ``w_c`` (no visits counted, or every row read, where ``W[c, j] = w_c``).
        """
        return None if self.visits is None or self.visits.uniform else self.visits.weights(self.weights)

    def saved_state(self) -> TrainerState | None:
        """The newest ``trainer_state.json`` among the checkpoints (and their ``also`` folders) that holds both
        ``global_step`` and ``epoch`` (:func:`gradian.attribute.visits.run_devices` reads the device count from it),
        or None.
        """
        for c in reversed(self.checkpoints):
            for folder in (c.path, *c.also):
                st = read_trainer_state(folder)
                if st is not None and st.global_step and st.epoch is not None:
                    return st
        return None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"weight_rule": self.weight_rule, "checkpoints": [c.to_dict() for c in self.checkpoints]}
        if self.visits is not None:
            out["visits"] = self.visits.to_dict()
        elif self.visits_rule:
            out["visits"] = {"rule": f"every row once per checkpoint: {self.visits_rule}"}
        return out


_STATE_FIX = (
    "pass the trainer_state.json the Trainer wrote, unedited; or remove it (or pass --weighting equal) "
    "to weigh the checkpoints equally"
)
#: numbers of a ``log_history`` entry the trajectory computes with: (key, what it is, bounds)
_ENTRY_NUMBERS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("step", "step", {"lo": 0, "whole": True}),
    ("learning_rate", "learning rate", {"lo": 0}),
    ("epoch", "epoch", {"lo": 0}),
)


@dataclass(frozen=True)
class TrainerState:
    """The numbers of one ``trainer_state.json`` that weigh the trajectory, each checked on reading.

    Attributes:
        path: the file.
        global_step: its ``global_step`` (a whole number >= 0), or None when absent.
        history: its ``log_history`` entries, each reduced to the checked ``step`` (int >= 0),
            ``learning_rate`` (finite, >= 0) and ``epoch`` (finite, >= 0) it holds.
        epoch: its ``epoch`` (finite, >= 0: epochs done plus the share of the current one's micro-batches), or None.
    """

    path: Path
    global_step: int | None
    history: list[dict[str, float]]
    epoch: float | None = None


def read_trainer_state(folder: Path) -> TrainerState | None:
    """``folder/trainer_state.json`` with every number the trajectory uses checked; None when absent.

    Raises:
        GradianUserError: the file is unreadable or not an object, ``log_history`` is not a list of
            objects, or a step, learning rate or epoch is not a finite, possible value (one line naming
            the file and key, e.g. ``log_history[3].learning_rate = inf: not a finite learning rate``).
    """
    p = Path(folder) / "trainer_state.json"
    if not p.exists():
        return None
    obj = load_json_file(p, "trainer state", fix="re-save it, or remove it (the checkpoints are then weighted equally)")
    where = str(p)
    if not isinstance(obj, dict):
        raise GradianUserError(
            f"top level is a JSON {type(obj).__name__}, not an object (the Trainer writes an object with log_history)",
            where=where,
            fix=_STATE_FIX,
        )
    gs = obj.get("global_step")
    step = None if gs is None else int(file_number(gs, where, "global_step", "step", lo=0, whole=True, fix=_STATE_FIX))
    epoch = None
    if obj.get("epoch") is not None:
        epoch = float(file_number(obj["epoch"], where, "epoch", "epoch", lo=0, fix=_STATE_FIX))
    hist = obj.get("log_history")
    if hist is None:
        hist = []
    if not isinstance(hist, list):
        raise GradianUserError(f"log_history is a JSON {type(hist).__name__}, not a list", where=where, fix=_STATE_FIX)
    out: list[dict[str, float]] = []
    for i, e in enumerate(hist):
        if not isinstance(e, dict):
            raise GradianUserError(
                f"log_history[{i}] is a JSON {type(e).__name__}, not an object", where=where, fix=_STATE_FIX
            )
        out.append(
            {
                k: file_number(e[k], where, f"log_history[{i}].{k}", what, fix=_STATE_FIX, **kw)
                for k, what, kw in _ENTRY_NUMBERS
                if e.get(k) is not None
            }
        )
    return TrainerState(p, step, out, epoch)


def _step_of(folder: Path, per_epoch: int | None = None) -> int | None:
    """The global step a checkpoint stands at: ``checkpoint-N``'s N; torchtune's ``epoch_N`` ends at step
    ``(N + 1) · per_epoch`` (None without ``per_epoch``); else ``trainer_state.json``'s ``global_step``.
    """
    num = checkpoint_number(folder)
    if num is not None and num[0] == "step":
        return num[1]
    if num is not None:
        return (num[1] + 1) * per_epoch if per_epoch else None
    st = read_trainer_state(folder)
    return st.global_step if st is not None else None


def discover_checkpoints(adapter: str | Path) -> list[Path]:
    """Checkpoint folders (``checkpoint-N``, torchtune's ``epoch_N``) that are children or siblings of ``adapter``,
    in training order.

    When ``adapter`` is itself a checkpoint, only those of its kind up to it are kept.
    """
    a = Path(adapter)
    found = {p.resolve() for p in checkpoint_folders(a)}
    if a.parent != a:
        found |= {p.resolve() for p in checkpoint_folders(a.parent)}
    found.discard(a.resolve())
    own = checkpoint_number(a)
    if own:
        found = {p for p in found if (n := checkpoint_number(p)) and n[0] == own[0] and n[1] <= own[1]}
    return sorted(found, key=checkpoint_number)  # type: ignore[arg-type]


def torchtune_steps_per_epoch(run_dir: Path) -> tuple[int | None, str, list[dict[str, float]]]:
    """``(steps per epoch, how it was found, the log's train entries)`` of a torchtune run, or ``(None, why not,
    entries)``.

    torchtune 0.6.1's LoRA recipes save ``epoch_N/`` at the end of epoch N and log ``Step <global step> | loss:..
    lr:..`` every ``log_every_n_steps`` optimizer steps (``logs/log_<time>.txt``); an epoch is
    ``len(dataloader) // gradient_accumulation_steps`` steps (or ``max_steps_per_epoch``), the same for every epoch.
    So when the log holds every step ``1..T`` and the run finished its ``E`` epochs (``epochs`` in its
    ``torchtune_config.yaml`` equals the epoch folders there), an epoch is ``T / E`` steps. A log with gaps
    (``log_every_n_steps`` above 1), a resumed run (a new log from a later step) or an unfinished run gives None:
    its checkpoints are then weighted equally, and the rule says why. The entries (``step``, ``learning_rate``
    from its ``lr``) weigh the epochs otherwise; the log is read once.
    """
    from gradian.audit.config.runfolder import TORCHTUNE_CONFIG
    from gradian.audit.logs import load_logs, torchtune_log

    log = torchtune_log(run_dir)
    if log is None:
        return None, f"no torchtune log in {run_dir / 'logs'}", []
    entries = load_logs(log).train
    epochs = [n[1] + 1 for c in checkpoint_folders(run_dir) if (n := checkpoint_number(c)) and n[0] == "epoch"]
    saved = max(epochs, default=0)
    cfg_path = run_dir / TORCHTUNE_CONFIG
    cfg = load_yaml_file(cfg_path, "torchtune config") if cfg_path.is_file() else None
    planned = cfg.get("epochs") if isinstance(cfg, dict) else None
    if not isinstance(planned, int) or isinstance(planned, bool) or planned != saved:
        why = f"{cfg_path.name} plans {planned!r} epochs, {saved} are saved: the run's steps per epoch are unknown"
        return None, why, entries
    steps = sorted(int(e["step"]) for e in entries if "step" in e)
    if not steps or steps != list(range(1, len(steps) + 1)) or len(steps) % saved:
        return None, f"{log.name} does not log every step of {saved} whole epochs (log_every_n_steps 1)", entries
    return len(steps) // saved, f"{log.name}: {len(steps)} steps over {saved} epochs", entries


def _read_cfg(folder: Path) -> dict[str, Any]:
    from gradian.models.load import read_adapter_config

    return read_adapter_config(folder)


def check_compatible(final: Path, ckpt: Path) -> None:
    """Refuse a checkpoint that is not the same LoRA adapter on the same base at another step.

    Checks the LoRA settings (:data:`_MUST_MATCH`, the target modules), the
    declared base, and that every stored tensor has the final adapter's name and shape.
    """
    from gradian.models.load import read_adapter_weights

    a, b = _read_cfg(final), _read_cfg(ckpt)
    where = str(ckpt / "adapter_config.json")
    for k in _MUST_MATCH:
        if a.get(k) != b.get(k):
            raise GradianUserError(
                f"checkpoint has {k}={b.get(k)!r} but the adapter has {a.get(k)!r}: not the same fine-tune",
                where=f"{where}: {k}",
                fix="pass only checkpoints of this adapter's training run (--checkpoints)",
            )
    ta, tb = a.get("target_modules"), b.get("target_modules")
    if (sorted(ta) if isinstance(ta, list) else ta) != (sorted(tb) if isinstance(tb, list) else tb):
        raise GradianUserError(
            f"checkpoint targets {tb!r} but the adapter targets {ta!r}",
            where=f"{where}: target_modules",
            fix="pass only checkpoints of this adapter's training run (--checkpoints)",
        )
    ba, bb = a.get("base_model_name_or_path"), b.get("base_model_name_or_path")
    if ba and bb and Path(str(ba).rstrip("/")).name != Path(str(bb).rstrip("/")).name:
        raise GradianUserError(
            f"checkpoint was trained on base {bb!r}, the adapter on {ba!r}",
            where=f"{where}: base_model_name_or_path",
            fix="pass only checkpoints of this adapter's training run (--checkpoints)",
        )
    wa, wb = read_adapter_weights(final), read_adapter_weights(ckpt)
    sa = {k: tuple(v.shape) for k, v in wa.items()}
    sb = {k: tuple(v.shape) for k, v in wb.items()}
    if sa != sb:
        diff = sorted(set(sa.items()) ^ set(sb.items()))[:1]
        raise GradianUserError(
            f"checkpoint's LoRA tensors differ from the adapter's (first difference: {diff[0][0]} {diff[0][1]})",
            where=str(ckpt),
            fix="pass only checkpoints of this adapter's training run (--checkpoints)",
        )


def _log_history(folders: Sequence[Path]) -> list[dict[str, float]]:
    """The longest ``log_history`` among the folders' ``trainer_state.json`` files (the final one usually).

    Every folder's file is read and checked (:func:`read_trainer_state`), not only the longest.
    """
    best: list[dict[str, float]] = []
    for f in folders:
        st = read_trainer_state(f)
        if st is not None and len(st.history) > len(best):
            best = st.history
    return best


def learning_rate_weights(steps: Sequence[int | None], history: list[dict[str, Any]]) -> tuple[list[float], str]:
    """``η_t`` per checkpoint: the mean logged learning rate over (previous step, step].

    Falls back to the last logged rate at or before the step when none was
    logged inside the interval, and to equal weights when there is no log or a
    step is unknown. Returns ``(normalised weights, rule)``: every weight finite, >= 0, summing to 1.

    Raises:
        GradianUserError: a logged step or learning rate is not finite, or negative (the readers
            check them first; this guards direct callers).
    """
    n = len(steps)
    lr_log = []
    for i, e in enumerate(history):
        s, lr = e.get("step"), e.get("learning_rate")
        if s is None or lr is None:
            continue
        at = f"log_history[{i}]"
        s = file_number(s, "trainer_state.json", f"{at}.step", "step", lo=0, whole=True, fix=_STATE_FIX)
        lr = file_number(lr, "trainer_state.json", f"{at}.learning_rate", "learning rate", lo=0, fix=_STATE_FIX)
        lr_log.append((int(s), lr))
    lr_log.sort()
    if not lr_log or any(s is None for s in steps):
        why = "no learning_rate in trainer_state.json" if not lr_log else "a checkpoint's step is unknown"
        return [1.0 / n] * n, f"equal ({why})"
    eta = []
    prev = 0
    for s in steps:
        inside = [lr for st, lr in lr_log if prev < st <= s]  # type: ignore[operator]
        if inside:
            total = sum(inside)  # the mean; taken term by term where the sum overflows
            eta.append(total / len(inside) if math.isfinite(total) else sum(lr / len(inside) for lr in inside))
        else:
            before = [lr for st, lr in lr_log if st <= s]  # type: ignore[operator]
            eta.append(before[-1] if before else lr_log[0][1])
        prev = s  # type: ignore[assignment]
    rule = "lr (mean logged learning_rate since the previous checkpoint)"
    if not max(eta) > 0:
        return [1.0 / n] * n, "equal (logged learning rates sum to 0)"
    total = sum(eta)
    if not math.isfinite(total):  # rates near the float limit: scale them into [0, 1] first, so the sum is finite
        top = max(eta)
        eta = [e / top for e in eta]
        total = sum(eta)
    return [e / total for e in eta], rule


def checkpoint_selection(values: Any, where: str = "--checkpoints") -> str | list[Path]:
    """The trajectory selection, one rule for ``--checkpoints`` and ``Attributor(checkpoints=...)``.

    Args:
        values: ``"auto"`` or ``"final"``, or a list/tuple of checkpoint folders (str or Path); the CLI
            passes its repeated values (``["auto"]``, ``["final"]``, folders, or None/empty for auto).
        where: the flag or argument named in an error.

    Returns:
        ``"auto"``, ``"final"`` or the list of folders (for :func:`resolve_trajectory`).

    Raises:
        GradianUserError: another string, a list mixing ``auto``/``final`` with folders, an entry that is
            not a path, or a folder that does not exist.
    """
    if isinstance(values, str):
        if values in ("auto", "final"):
            return values
        raise GradianUserError(
            f"checkpoints must be 'auto', 'final' or a list of checkpoint folders, got {values[:60]!r}",
            where=where,
            fix=f"pass 'auto', 'final' or [{values[:40]!r}] (a list, even of one folder)",
        )
    if values is None:
        return "auto"
    if not isinstance(values, (list, tuple)):
        raise GradianUserError(
            f"checkpoints must be 'auto', 'final' or a list of checkpoint folders, got a {type(values).__name__}",
            where=where,
            fix="pass 'auto', 'final' or a list of checkpoint-*/ folders",
        )
    values = list(values)
    for v in values:
        if not isinstance(v, (str, Path)) or not str(v).strip():
            raise GradianUserError(
                f"a checkpoint must be a folder path, got {str(v)[:60]!r}",
                where=where,
                fix="pass checkpoint-*/ folders (str or Path)",
            )
    if not values or values == ["auto"]:
        return "auto"
    if values == ["final"]:
        return "final"
    if any(v in ("auto", "final") for v in values):
        raise GradianUserError(
            "'auto' and 'final' cannot be mixed with folders", where=where, fix="pass auto, final, or only folders"
        )
    for v in values:
        if not Path(v).is_dir():
            raise GradianUserError(
                f"checkpoint folder not found: {str(v)[:200]}",
                where=where,
                fix="pass existing checkpoint-*/ folders (PEFT save_pretrained), or 'auto'",
            )
    return [Path(v) for v in values]


def resolve_trajectory(
    adapter: str | Path, checkpoints: Sequence[str | Path] | str | None = "auto", weighting: str = "lr"
) -> Trajectory:
    """The trajectory to attribute over.

    Args:
        adapter: the final adapter (the one being debugged).
        checkpoints: ``"auto"`` (discover ``checkpoint-*`` / ``epoch_*`` children/siblings; the
            final adapter alone when there are none), ``"final"`` / None (final
            adapter only), or explicit adapter folders (a subset; the final adapter is
            added when it is not among them).
        weighting: ``"lr"`` (learning-rate weights, equal without a log) or ``"equal"``.

    Raises:
        GradianUserError: a folder is not an adapter, or is not a checkpoint of this run.
    """
    final = Path(adapter)
    _read_cfg(final)
    if checkpoints in (None, "final"):
        folders: list[Path] = []
    elif checkpoints == "auto":
        folders = discover_checkpoints(final)
    else:
        folders = [Path(c) for c in checkpoints]  # type: ignore[union-attr]
        for c in folders:
            _read_cfg(c)
    for c in folders:
        check_compatible(final, c)
    # torchtune's epoch_N folders: their steps, and the learning rates, from the run's own log
    epoch_runs = {p.resolve().parent for p in [final, *folders] if (n := checkpoint_number(p)) and n[0] == "epoch"}
    per_epoch, tt_why, tt_run, tt_log = None, "", None, []
    if len(epoch_runs) == 1:
        tt_run = next(iter(epoch_runs))
        per_epoch, tt_why, tt_log = torchtune_steps_per_epoch(tt_run)
    entries: list[tuple[Path, int | None, bool, str]] = []
    same: dict[str, list[Path]] = {}  # sha -> other folders with these weights
    final_sha = adapter_identity(final)["sha256"]
    for c in folders:
        sha = adapter_identity(c)["sha256"]
        if sha in same or sha == final_sha:
            same.setdefault(sha, []).append(
                c
            )  # the same weights as another point (the last checkpoint is the final adapter)
            continue
        same[sha] = []
        entries.append((c, _step_of(c, per_epoch), False, sha))
    dup_steps = [_step_of(c, per_epoch) for c in same.get(final_sha, [])]
    entries.sort(key=lambda e: (e[1] is None, e[1] or 0))
    fstep = _step_of(final, per_epoch)
    if fstep is None and dup_steps and dup_steps[0] is not None:
        fstep = dup_steps[0]
    if fstep is None and entries and entries[-1][1] is not None:
        # the final adapter comes after every checkpoint; without its own step it stands for the rest of the run
        hist = _log_history([final] + [e[0] for e in entries])
        logged = [int(e["step"]) for e in hist if "step" in e]
        last = max(e[1] for e in entries if e[1] is not None)
        fstep = max(logged) if logged and max(logged) > last else None  # else unknown: equal weights
    entries.append((final, fstep, True, final_sha))
    if len(entries) > 1:
        steps = [e[1] for e in entries]
        if all(s is not None for s in steps) and len(set(steps)) < len(steps):
            raise GradianUserError(
                f"two checkpoints have the same step {sorted(s for s in steps if steps.count(s) > 1)[0]} "
                "but different weights",
                where=str(final),
                fix="pass the checkpoints of one training run (--checkpoints)",
            )
        if weighting == "equal":
            weights, rule = [1.0 / len(entries)] * len(entries), "equal (asked for)"
        elif tt_run is not None and per_epoch is None:
            weights, rule = [1.0 / len(entries)] * len(entries), f"equal (torchtune epochs: {tt_why})"
        elif tt_run is not None:
            weights, rule = learning_rate_weights(steps, tt_log)
            rule += f"; torchtune epochs of {per_epoch} steps ({tt_why})"
        else:
            weights, rule = learning_rate_weights(steps, _log_history([e[0] for e in entries]))
    else:
        weights, rule = [1.0], "single (final adapter only)"
    return Trajectory(
        tuple(Checkpoint(p, s, f, w, sha, tuple(same.get(sha, ()))) for (p, s, f, sha), w in zip(entries, weights)),
        rule,
    )


# --------------------------------------------------------------------------- weights in and out of a loaded model


def lora_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of every LoRA parameter (``name -> tensor``, DoRA magnitudes included) of the loaded PEFT model."""
    from gradian.models.load import is_adapter_param

    return {n: p.detach().clone() for n, p in model.named_parameters() if is_adapter_param(n)}


@contextmanager
def checkpoint_weights(model: torch.nn.Module, ckpt: Checkpoint | Path) -> Iterator[None]:
    """Load a checkpoint's LoRA weights into ``model`` for the block; restore the previous ones after.

    The base weights are shared; only the LoRA matrices are swapped (in place, so
    hooks and module references stay valid).
    """
    from gradian.models.load import clear_dora_cache, read_adapter_weights, set_lora_weights
    from gradian.models.torchtune_export import torchtune_fix

    path = ckpt.path if isinstance(ckpt, Checkpoint) else Path(ckpt)
    saved = lora_state(model)
    # the model is already loaded as DoRA or not (use_dora=True: no second look at the config's word for it)
    weights = torchtune_fix(read_adapter_weights(path), path, getattr(model, "config", None), use_dora=True).weights
    try:
        set_lora_weights(model, weights, path)
        yield
    finally:
        params = dict(model.named_parameters())
        with torch.no_grad():
            for n, t in saved.items():
                params[n].copy_(t)
        clear_dora_cache(model)
