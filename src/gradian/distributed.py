"""torch.distributed support: ``torchrun`` launches N copies of one ``gradian`` command.

    torchrun --nproc-per-node 2 -m gradian index --base B --adapter A --data train.jsonl
    torchrun --nproc-per-node 8 -m gradian attribute --device cuda --dtype bfloat16 ...

Gradian has no launcher of its own. Under ``torchrun`` (``WORLD_SIZE`` > 1 and ``RANK`` in the
environment) :func:`init_from_env` initialises the default process group, **nccl** when the
model runs on CUDA (each rank on ``cuda:LOCAL_RANK``) and **gloo** on CPU. Every other function
here is a no-op in a single process, so the library code calls them unconditionally; a Python
caller who initialised a process group itself gets the same behaviour.

What runs where (docs/distributed.md):

* the index build: every rank computes whole shards (rows ``[k·S, (k+1)·S)``, so the index id and
  every shard's bytes do not depend on the world size), assigned length-balanced by
  :func:`partition`; rank 0 writes the manifest after a barrier;
* Evaluate and the query gradients: rank 0, broadcast;
* engine fitting and scoring: each rank reads a contiguous block of shards
  (:func:`contiguous_blocks`); statistics are all-reduced (sums) or all-gathered (per-row
  numbers, scores, in row order);
* the verdict, ``run.json``, the report and the progress bars: rank 0.

The collectives :func:`gather_cat` and :func:`all_reduce_sum` return the full result on every
rank. A collective must be reached by every rank in the same order; the functions that contain one
say so in their docstring ("collective").
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Sequence

import torch

from gradian.errors import GradianUserError

#: minutes a rank waits at a collective before giving up (rank 0 may evaluate for a long time
#: while the others wait for its answers)
ENV_TIMEOUT = "GRADIAN_DIST_TIMEOUT_MIN"
DEFAULT_TIMEOUT_MIN = 180


@dataclass(frozen=True)
class Dist:
    """This process's place in the job.

    Attributes:
        rank, world_size: as torch.distributed numbers them (0 and 1 in a single process).
        local_rank: the rank on this node (the CUDA device index under nccl).
        backend: ``"gloo"``, ``"nccl"`` or None (single process).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def label(self) -> str:
        return f"rank {self.rank} of {self.world_size}" if self.enabled else "single process"


def _td():
    import torch.distributed as td

    return td


def current() -> Dist:
    """The running job: from the initialised default process group, else a single process."""
    td = _td()
    if td.is_available() and td.is_initialized():
        ws = td.get_world_size()
        return Dist(td.get_rank(), ws, int(os.environ.get("LOCAL_RANK", "0")), str(td.get_backend()))
    return Dist()


def launched_world_size() -> int:
    """``WORLD_SIZE`` from the environment (1 when not launched by torchrun)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        raise GradianUserError(
            f"WORLD_SIZE={os.environ.get('WORLD_SIZE')!r} is not a number",
            where="environment",
            fix="launch with torchrun, which sets it",
        ) from None


def _timeout() -> timedelta:
    raw = os.environ.get(ENV_TIMEOUT, str(DEFAULT_TIMEOUT_MIN))
    try:
        minutes = float(raw)
        if not minutes > 0:
            raise ValueError
    except ValueError:
        raise GradianUserError(
            f"{ENV_TIMEOUT}={raw!r} is not a positive number of minutes",
            where=ENV_TIMEOUT,
            fix=f"unset it (default {DEFAULT_TIMEOUT_MIN}) or give minutes, e.g. 240",
        ) from None
    return timedelta(minutes=minutes)


def init_from_env(device: str = "cpu") -> Dist:
    """Initialise the default process group when launched by torchrun; a no-op otherwise.

    Args:
        device: the ``--device`` flag. ``cuda`` (or ``auto`` with CUDA present) selects nccl and
            pins this rank to ``cuda:LOCAL_RANK`` (so ``--device cuda`` means "my GPU" on every rank);
            anything else selects gloo.

    Raises:
        GradianUserError: ``--device cuda:N`` under torchrun, or fewer GPUs than local ranks.
    """
    td = _td()
    if td.is_available() and td.is_initialized():
        return current()
    ws = launched_world_size()
    if ws <= 1:
        return Dist()
    for var in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            raise GradianUserError(
                f"WORLD_SIZE={ws} but {var} is not set",
                where="environment",
                fix="launch with torchrun (or srun torchrun), which sets RANK, MASTER_ADDR and MASTER_PORT",
            )
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if cuda:
        if device.startswith("cuda:"):
            raise GradianUserError(
                f"--device {device} under torchrun: every rank would use the same GPU",
                where="--device",
                fix="pass --device cuda; rank r uses cuda:LOCAL_RANK (restrict GPUs with CUDA_VISIBLE_DEVICES)",
            )
        if not torch.cuda.is_available():
            raise GradianUserError("CUDA is not available on this machine", where="--device", fix="use --device cpu")
        if local >= torch.cuda.device_count():
            raise GradianUserError(
                f"local rank {local} has no GPU (this node has {torch.cuda.device_count()})",
                where="torchrun --nproc-per-node",
                fix="start at most one process per GPU",
            )
        torch.cuda.set_device(local)
        backend = "nccl"
    else:
        backend = "gloo"
    if not td.is_available():
        raise GradianUserError(
            "this torch build has no torch.distributed",
            where="torchrun",
            fix="install a torch build with distributed support, or run one process",
        )
    td.init_process_group(backend=backend, timeout=_timeout())
    return current()


def shutdown() -> None:
    """Tear the process group down (after the last collective of a command)."""
    td = _td()
    if td.is_available() and td.is_initialized():
        td.destroy_process_group()


# --------------------------------------------------------------------------- collectives


def barrier() -> None:
    """Wait for every rank (collective)."""
    d = current()
    if d.enabled:
        if d.backend == "nccl":
            _td().barrier(device_ids=[torch.cuda.current_device()])
        else:
            _td().barrier()


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """``obj`` as rank ``src`` has it, on every rank (collective; pickled)."""
    d = current()
    if not d.enabled:
        return obj
    box = [obj if d.rank == src else None]
    _td().broadcast_object_list(box, src=src)
    return box[0]


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank (collective; pickled)."""
    d = current()
    if not d.enabled:
        return [obj]
    out: list[Any] = [None] * d.world_size
    _td().all_gather_object(out, obj)
    return out


def gather_objects_to_main(obj: Any) -> list[Any] | None:
    """Every rank's ``obj`` in rank order on rank 0, None elsewhere (collective; pickled)."""
    d = current()
    if not d.enabled:
        return [obj]
    out: list[Any] | None = [None] * d.world_size if d.is_main else None
    _td().gather_object(obj, out, dst=0)
    return out


def _comm_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if current().backend == "nccl" else torch.device("cpu")


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """The elementwise sum of ``t`` over ranks, on every rank, on ``t``'s device (collective)."""
    d = current()
    if not d.enabled:
        return t
    dev = t.device
    buf = t.detach().to(_comm_device()).contiguous().clone()
    _td().all_reduce(buf)
    return buf.to(dev)


def gather_cat(t: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Every rank's ``t`` concatenated along ``dim`` in rank order, on every rank (collective).

    The ranks' sizes along ``dim`` may differ (a rank with no shards passes a size-0 tensor).
    """
    d = current()
    if not d.enabled:
        return t
    parts = all_gather_objects(t.detach().cpu())
    return torch.cat(parts, dim=dim).to(t.device)


def broadcast_tensors(tensors: dict[str, torch.Tensor] | None, src: int = 0) -> dict[str, torch.Tensor]:
    """A dict of tensors as rank ``src`` has it (other ranks pass None), on every rank (collective).

    Shapes and dtypes travel as one small object; the numbers as tensor broadcasts (no pickling
    of large query gradients).
    """
    d = current()
    if not d.enabled:
        assert tensors is not None
        return tensors
    meta = broadcast_object(
        None
        if d.rank != src
        else [(k, tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in tensors.items()],
        src,
    )
    dev = _comm_device()
    out = {}
    for k, shape, dt in meta:
        buf = (
            tensors[k].detach().to(dev).contiguous()
            if d.rank == src
            else torch.empty(shape, dtype=getattr(torch, dt), device=dev)
        )  # type: ignore[index]
        _td().broadcast(buf, src=src)
        out[k] = buf.cpu()
    return out


# --------------------------------------------------------------------------- work division


def partition(costs: Sequence[float], world_size: int) -> list[list[int]]:
    """Items (shards) to ranks, longest first to the least loaded rank (LPT); deterministic.

    Args:
        costs: per item, its work (padded tokens of its batches).

    Returns:
        per rank, its item indices in ascending order. Every rank computes the same answer.
    """
    loads = [0.0] * world_size
    out: list[list[int]] = [[] for _ in range(world_size)]
    for k in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        r = min(range(world_size), key=lambda j: (loads[j], j))
        out[r].append(k)
        loads[r] += costs[k]
    return [sorted(o) for o in out]


def contiguous_blocks(sizes: Sequence[int], world_size: int) -> list[range]:
    """Consecutive items (shards of ``sizes`` rows) per rank, balanced by rows; in rank order the
    blocks cover every item once, so a rank-ordered concatenation is in index order.
    """
    total = sum(sizes)
    out = []
    start = 0
    acc = 0
    for r in range(world_size):
        stop_rows = total * (r + 1) / world_size
        end = start
        while end < len(sizes) and (acc + sizes[end] / 2) < stop_rows:
            acc += sizes[end]
            end += 1
        if r == world_size - 1:
            end = len(sizes)
        out.append(range(start, end))
        start = end
    return out


def check_same_inputs(fields: dict[str, Any]) -> None:
    """Refuse to start when the ranks do not see the same inputs (collective).

    Args:
        fields: ``{what: content identity}`` (the data's and adapter's sha256, the flags, ...).

    Raises:
        GradianUserError: on every rank, naming the first field that differs and the ranks' values.
    """
    d = current()
    if not d.enabled:
        return
    everyone = all_gather_objects(fields)
    for what in fields:
        values = [e.get(what) for e in everyone]
        if any(v != values[0] for v in values):
            r = next(i for i, v in enumerate(values) if v != values[0])
            err = GradianUserError(
                f"the ranks disagree on {what}: rank 0 has {_short(values[0])}, rank {r} has {_short(values[r])}",
                where=f"torchrun (rank {r} of {d.world_size})",
                fix="every rank must read the same files (a shared filesystem or identical copies) with the same flags",
            )
            err.every_rank = True  # type: ignore[attr-defined]  # raised by all ranks alike: printed once, by rank 0
            raise err


def _short(v: Any) -> str:
    s = v if isinstance(v, str) else repr(v)
    if isinstance(v, str) and len(v) >= 40 and all(c in "0123456789abcdef" for c in v):
        return f"sha256 {v[:12]}…"
    return s if len(s) <= 60 else s[:59] + "…"


def fault_point(event: str, count: int) -> None:
    """Test hook: ``GRADIAN_TEST_KILL="RANK:EVENT:COUNT"`` makes that rank SIGKILL itself when
    ``event`` has happened ``count`` times (the dead-rank tests kill a rank mid-build this way).
    """
    spec = os.environ.get("GRADIAN_TEST_KILL")
    if not spec:
        return
    try:
        rank, ev, n = spec.split(":")
    except ValueError:
        return
    if ev == event and int(n) == count and int(rank) == current().rank:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
