"""Which rows each checkpoint's steps trained: the trajectory's weights, row by row.

TracIn sums a row's first-order effect over the steps whose batch held it. Its checkpoint form
(:mod:`gradian.attribute.trajectory`) lets checkpoint c stand for the steps ``(s_{c-1}, s_c]`` and counts every row
once in each. Where the run's row order is reproduced (an HF ``Trainer``, TRL SFT or LLaMA-Factory SFT run, an
unpacked axolotl run, or torchtune's unpacked LoRA recipe: :mod:`gradian.audit.hf_order`), Gradian counts, for each
checkpoint c and row j, ``m[c, j]``: how many of those steps read row j, and weighs

    score_j = Σ_c W[c, j] · score_c(j),    W[c, j] = η_c · [Σ_c m[c, j] > 0]

with ``η_c`` the checkpoint's learning-rate weight: a row the run never read (``max_steps`` ending the run inside an
epoch, LLaMA-Factory's ``max_samples``, torchtune's dropped batch, axolotl's dropped rows: Audit's C04) has
``W = 0``, so its influence is exactly 0, as it is in the run, and the verdict's statistics are taken over the rows
the run read; every row it read keeps TracIn-CP's once per checkpoint, so with every row read the scores are those of
the plain trajectory, bit for bit.

How often a row was read is not weighed. ``W[c, j] = η_c · m[c, j] / Σ_c η_c · mean_j m[c, j]`` (the rule from
2026-12-07 to 2026-12-08) ranked the planted culprits worse on 13 of the 14 tiny worlds it was measured on where
the counts vary between rows (checkpoints every few steps, inside an epoch or across two, and a run of 1.5 epochs:
AUC up to 0.13 lower, 0.001 higher on one; docs/benchmarks.md "Row visits: counted, or only whether a row was
read"): a checkpoint's gradient stands for its whole interval, and a row that interval happened to skip, or to read
twice, is no less or more the cause. The counts stay in the manifest (rows read per checkpoint).

Not counted (every row once per checkpoint, and the rule says why): a run without a config Gradian can read the
batch from, a sampler :mod:`gradian.audit.hf_order` does not reproduce (packing, ``group_by_length``, another
trainer), a checkpoint whose step is unknown, an HF run whose ``trainer_state.json`` fits no device count, or several
that read different rows (:func:`run_devices`), ``--visits off``. Where that file tells how many devices read the
rows, each reads its share (:func:`gradian.audit.hf_order.shard`); without it one device is assumed, as C04 assumes,
and the training file's
rows in the order the trainer was given them (TRL's and axolotl's own drops and shuffles are rebuilt:
:func:`gradian.audit.hf_order.given_rows`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np


@dataclass(frozen=True)
class RowVisits:
    """How often each checkpoint's steps read each row.

    Attributes:
        counts: (T, n) ints, ``m[c, j]``: the steps in ``(s_{c-1}, s_c]`` whose batch held row j (T checkpoints in
            training order, the final adapter last; n training rows in the file's order).
        steps: (T,) each checkpoint's step ``s_c``.
        rule: where the order came from (the seed and its source).
    """

    counts: np.ndarray
    steps: tuple[int, ...]
    rule: str

    @property
    def never(self) -> np.ndarray:
        """(k,) the rows no step of the run read, ascending."""
        return np.flatnonzero(self.counts.sum(axis=0) == 0)

    @property
    def uniform(self) -> bool:
        """Every row was read: then ``W[c, j] = η_c`` exactly, and the trajectory keeps its checkpoint weights
        (:meth:`gradian.attribute.trajectory.Trajectory.row_weights`).
        """
        return not len(self.never)

    def weights(self, eta: Sequence[float]) -> np.ndarray:
        """(T, n) float64 ``W[c, j] = η_c · [row j read by some step of the run]`` (the module docstring)."""
        eta_ = np.asarray(list(eta), dtype=np.float64)[:, None]
        read = (self.counts.sum(axis=0) > 0).astype(np.float64)
        return eta_ * read[None, :]

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "steps": list(self.steps),
            "rows_read_per_checkpoint": [int(x) for x in (self.counts > 0).sum(axis=1)],
            "never_trained": int(len(self.never)),
            "uniform": self.uniform,
        }


def total_steps(config: Any, n: int, world: int = 1) -> int | None:
    """The optimizer steps of a run that trains by epochs, as the HF ``Trainer`` counts them on ``world`` devices.

    ``max_steps`` when set (> 0); else ``ceil(num_epochs · per_epoch)`` with ``per_epoch = ceil(micro / accumulation)``
    and ``micro`` each process's micro-batches an epoch (one device: ``ceil(n / batch)``, ``floor`` with
    ``dataloader_drop_last``; :func:`gradian.audit.hf_order.epoch_micro_batches`). None when a number it needs is
    missing.
    """
    from gradian.audit.hf_order import epoch_micro_batches

    if config.max_steps and config.max_steps > 0:
        return int(config.max_steps)
    batch, acc = config.micro_batch_size, config.gradient_accumulation_steps or 1
    if not batch or batch <= 0 or acc <= 0 or not config.num_epochs or config.num_epochs <= 0:
        return None
    micro = epoch_micro_batches(n, batch, world, bool(config.dataloader_drop_last))
    if micro <= 0:
        return None
    return int(math.ceil(config.num_epochs * (-(-micro // acc))))


def row_visits(
    config: Any,
    n: int,
    steps: Sequence[int | None],
    lengths: Sequence[int] | None = None,
    unsupervised: Sequence[bool] | None = None,
    devices: tuple[int, str] = (1, ""),
) -> tuple[RowVisits | None, str]:
    """``(visits, rule)`` for a run's checkpoints, or ``(None, why not)`` (the module docstring).

    Args:
        config: the run's merged :class:`gradian.audit.config.TrainConfig` (None: no config was read).
        n: training rows, in the training file's order.
        steps: each checkpoint's step in training order, the final adapter last (None: unknown; the final adapter's
            unknown step is the run's last: :func:`total_steps`, or torchtune's epochs).
        lengths: each row's token count as the run tokenised it, before any cut (axolotl drops rows by length).
        unsupervised: per row, whether it has no supervised token as the run tokenised it (TRL drops such rows).
        devices: how many devices read the rows, and how that was told (:func:`run_devices`; ``(1, "")``: one,
            assumed).
    """
    if config is None:
        return None, "no training config was read (--config, or the run folder's training_args.bin)"
    read, how = run_rows_read(config, n, lengths, unsupervised, devices)
    if read is None:
        return None, how
    steps = list(steps)
    if steps and steps[-1] is None:
        steps[-1] = len(read)  # the run's last step
    if not steps or any(s is None for s in steps):
        return None, "a checkpoint's step is unknown"
    read = read[: max(steps)]  # type: ignore[type-var]
    counts = np.zeros((len(steps), n), dtype=np.int64)
    prev = 0
    for c, s in enumerate(steps):
        for step_rows in read[prev:s]:  # steps prev+1 .. s (read[k] is step k + 1)
            np.add.at(counts[c], step_rows, 1)
        prev = s  # type: ignore[assignment]
    if not counts.any():
        return None, "no step of the run read a row"
    return RowVisits(counts, tuple(int(s) for s in steps), how), ""


def run_rows_read(
    config: Any,
    n: int,
    lengths: Sequence[int] | None = None,
    unsupervised: Sequence[bool] | None = None,
    devices: tuple[int, str] = (1, ""),
) -> tuple[list[list[int]] | None, str]:
    """Every optimizer step's rows (the training file's row indices) for the whole run, and where the order came
    from; or ``(None, why not)``. ``lengths``, ``unsupervised``, ``devices``: as in :func:`row_visits`.
    """
    from gradian.audit.hf_order import given_rows, order_rule, rows_read, torchtune_order_rule, torchtune_rows_read

    batch, acc = config.micro_batch_size, config.gradient_accumulation_steps or 1
    if config.trainer == "torchtune":
        why = torchtune_order_rule(config)
        if why is not None:
            return None, why
        read = torchtune_rows_read(
            n, shuffle=bool(config.shuffle), batch=batch, accumulation=acc, epochs=int(math.ceil(config.num_epochs)),
            max_steps_per_epoch=config.max_steps_per_epoch,
        )  # fmt: skip
        return read, f"torchtune's recipe sampler, seed 0, shuffle {str(config.shuffle).lower()}, drop_last; 1 device"
    seed, how = order_rule(config, dict(config.versions))
    if seed is None:
        return None, how
    if not batch or batch <= 0:
        return None, "the run's per-device batch size is unknown"
    rows, built = given_rows(config, n, lengths, unsupervised)  # max_samples; axolotl's, TRL's drops and shuffle
    if rows is None:
        return None, built
    world, told = devices
    total = total_steps(config, len(rows), world)
    if total is None:
        return None, "the run's number of steps is unknown"
    drop = bool(config.dataloader_drop_last)
    read = rows_read(len(rows), seed=seed, batch=batch, accumulation=acc, steps=total, drop_last=drop, world=world)
    read = [[rows[k] for k in step] for step in read]  # the train set's positions -> the file's rows
    return read, f"the HF Trainer's sampler, {how}{'; ' + built if built else ''}; {told or '1 device'}"


def torchtune_steps(config: Any, n: int, epoch: int) -> int | None:
    """The global step torchtune's recipe had reached when it saved ``epoch_<epoch>`` (steps per epoch:
    ``floor((n // batch) / accumulation)``, capped by ``max_steps_per_epoch``).
    """
    batch, acc = config.micro_batch_size, config.gradient_accumulation_steps or 1
    if not batch or batch <= 0 or acc <= 0:
        return None
    per = (n // batch) // acc
    if config.max_steps_per_epoch is not None and config.max_steps_per_epoch < per:
        per = config.max_steps_per_epoch
    return (epoch + 1) * per


def with_visits(
    trajectory,
    config: Any,
    n: int,
    mode: str = "auto",
    unsupervised: Sequence[bool] | None = None,
    lengths: Sequence[int] | None = None,
):
    """``trajectory`` (:class:`gradian.attribute.trajectory.Trajectory`) with its rows' visits counted
    (:func:`row_visits`), or with the reason they are not (``mode="off"``: ``--visits off``).

    ``unsupervised``: per row, whether it has no supervised token as the run tokenised it (TRL's ``SFTTrainer``,
    1.9 and later, drops such rows before it samples: ``Dropping fully masked examples``). ``lengths``: per row, its
    token count as the run tokenised it before any cut (axolotl drops rows by length before it samples). Both build
    the train set the sampler drew from (:func:`gradian.audit.hf_order.given_rows`).
    """
    import dataclasses

    if mode == "off":
        return dataclasses.replace(trajectory, visits=None, visits_rule="--visits off")
    steps = [c.step for c in trajectory.checkpoints]
    if config is not None and config.trainer == "torchtune":  # epoch_N folders without a log: their steps from N
        from gradian.paths import checkpoint_number

        for i, c in enumerate(trajectory.checkpoints):
            num = checkpoint_number(c.path)
            if steps[i] is None and num and num[0] == "epoch":
                steps[i] = torchtune_steps(config, n, num[1])
    fits, told = [1], ""
    if config is not None and config.trainer != "torchtune":
        fits, told = run_devices(config, n, trajectory.saved_state(), lengths, unsupervised)
        if not fits or len(fits) > MAX_ALIKE:
            return dataclasses.replace(trajectory, visits=None, visits_rule=told)
    if len(fits) == 1:
        visits, why = row_visits(config, n, steps, lengths, unsupervised, (fits[0], told))
        return dataclasses.replace(trajectory, visits=visits, visits_rule=why)
    # several device counts fit the log: the verdict needs only which rows were read, which may not differ
    found = [row_visits(config, n, steps, lengths, unsupervised, (w, f"{w} device(s)")) for w in fits]
    if any(v is None for v, _ in found) or len({tuple(v.never.tolist()) for v, _ in found}) != 1:  # type: ignore[union-attr]
        return dataclasses.replace(trajectory, visits=None, visits_rule=told)
    visits = found[0][0]
    rule = f"{visits.rule}, or {', '.join(map(str, fits[1:]))}: the log fits each, and each reads the same rows"  # type: ignore[union-attr]
    return dataclasses.replace(trajectory, visits=dataclasses.replace(visits, rule=rule), visits_rule="")


#: the most device counts that may fit a run's log for :func:`with_visits` to compare the rows each reads
MAX_ALIKE = 64


def run_devices(
    config: Any,
    n: int,
    state,
    lengths: Sequence[int] | None = None,
    unsupervised: Sequence[bool] | None = None,
) -> tuple[list[int], str]:
    """The device counts that could have read the train set built from the file's ``n`` rows, told by the run's own
    ``trainer_state.json`` (:func:`gradian.audit.hf_order.devices_from_state`: the ``epoch`` it saved at
    ``global_step``), and how; none when the file contradicts every count. ``state``: the newest one the trajectory
    holds (:meth:`gradian.attribute.trajectory.Trajectory.saved_state`); None, or an order not reproduced:
    ``([1], "")``, one device assumed.
    """
    from gradian.audit.hf_order import devices_from_state, given_rows, order_rule

    seed, _ = order_rule(config, dict(config.versions))
    rows, _ = given_rows(config, n, lengths, unsupervised)
    if state is None or seed is None or rows is None:
        return [1], ""
    where = f"{state.path.parent.name}/{state.path.name}"  # no absolute path: the rule is in the manifest
    return devices_from_state(config, len(rows), state.global_step, state.epoch, where)
