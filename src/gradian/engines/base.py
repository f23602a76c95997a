"""One interface for influence engines.

An engine turns query gradients into *preconditioned* queries ``r = P g_q``
per LoRA block, after which every engine scores the same way:

    score[q, j] = Σ_l ⟨ r_l[q], g_l[j] ⟩          (then the sign convention, gradian.sign)

so running two engines in one pass over the index costs one extra
preconditioning, and span-level drill-down reuses ``r`` for sentence
gradients. Engines see the training gradients only through
:class:`gradian.index.store.GradientIndex` shards, one shard in memory at a time.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import Any

import torch

from gradian.index.store import GradientIndex

Blocks = dict[str, torch.Tensor]  # block name -> (m, d_l)
#: The engines :func:`make_engine` builds.
ENGINES = ("datainf", "graddot")


@dataclass(frozen=True)
class EngineSpec:
    """Engine knobs that change scores (they land in the run manifest).

    Attributes:
        name: ``"datainf"`` or ``"graddot"``.
        damping_scale: DataInf's per-block damping ``λ_l = damping_scale · mean_i ‖g_il‖² / d_l``.
    """

    name: str = "datainf"
    damping_scale: float = 0.1

    def __post_init__(self) -> None:
        from gradian.validate import check_choice, check_float

        check_choice(self.name, ENGINES, "EngineSpec", "name", flag="--engine")
        check_float(self.damping_scale, "EngineSpec", "damping_scale", flag="--damping-scale", lo=0, lo_open=True,
                    hi=1e6, fix="use a positive scale such as --damping-scale 0.1")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Engine(ABC):
    """Fit statistics over the training index, then precondition query gradients."""

    name: str = "engine"

    def __init__(self, spec: EngineSpec):
        self.spec = spec
        self.fitted = False

    @abstractmethod
    def fit(self, index: GradientIndex) -> None:
        """Collect whatever training-set statistics the engine needs (one pass over shards at most)."""

    @abstractmethod
    def precondition(self, index: GradientIndex, queries: Blocks) -> Blocks:
        """Map query gradients ``{block: (m, d_l)}`` to ``r = P g_q`` with the same shapes."""

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name, **self.spec.to_dict()}


def score_index(index: GradientIndex, preconditioned: list[Blocks]) -> list[torch.Tensor]:
    """Raw inner products for several preconditioned query sets in ONE pass over the shards.

    Collective under torchrun: each rank scores its block of shards and the scores are gathered
    in row order (every rank gets them all). A score is one row's inner product, computed whole by
    one rank, so it does not depend on the world size.

    Args:
        preconditioned: per engine, ``{block: (m, d_l)}``.
    Returns:
        per engine, a (m, n) float64 tensor ``Σ_l r_l G_lᵀ``.
    """
    from gradian import distributed

    outs: list[list[torch.Tensor]] = [
        [torch.zeros(next(iter(R.values())).shape[0], 0, dtype=torch.float64)] for R in preconditioned]
    for _, shard in index.iter_shards(torch.float64, local=True):
        for e, R in enumerate(preconditioned):
            m = next(iter(R.values())).shape[0]
            acc = torch.zeros(m, next(iter(shard.values())).shape[0], dtype=torch.float64)
            for name, G in shard.items():
                acc += R[name].to(torch.float64) @ G.T
            outs[e].append(acc)
    return [distributed.gather_cat(torch.cat(o, dim=1), dim=1) for o in outs]


def make_engine(spec: EngineSpec) -> Engine:
    from gradian.engines.datainf import DataInf
    from gradian.engines.graddot import GradDot

    engines = {"datainf": DataInf, "graddot": GradDot}
    if spec.name not in engines:
        from gradian.errors import GradianUserError

        raise GradianUserError(f"unknown engine {spec.name!r}", where="--engine", fix=f"use one of {', '.join(engines)}")
    return engines[spec.name](spec)
