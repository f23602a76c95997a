"""Reference: the exact damped inverse per block, for testing DataInf on small blocks.

    r_l = (1/n Σ_i g_il g_ilᵀ + λ_l I)⁻¹ g_q,l        (d_l × d_l solve)

Only feasible when every block is small (d_l up to a few thousand).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gradian.engines.base import Blocks, Engine, ModelPass
from gradian.engines.datainf import DataInf, DataInfSpec

if TYPE_CHECKING:  # torch comes where the engine computes: its spec is read without it
    from gradian.index.store import GradientIndex


class ExactInverse(Engine):
    """Same damping as :class:`DataInf` (a :class:`DataInfSpec`), exact inverse instead of the
    swapped-order approximation. A test and benchmark reference, deliberately not registered
    (one ``d_l × d_l`` solve per block does not scale).
    """

    name = "exact"
    spec_class = DataInfSpec

    def fit(self, index: GradientIndex, model_pass: ModelPass | None = None) -> None:
        import torch

        di = DataInf(self.spec)
        di.fit(index)
        self.damping = di.damping
        G = {b["name"]: [] for b in index.blocks}
        for _, shard in index.iter_shards(torch.float64):
            for k, v in shard.items():
                G[k].append(v)
        self.G = {k: torch.cat(v) for k, v in G.items()}
        self.fitted = True

    def precondition(self, index: GradientIndex, queries: Blocks) -> Blocks:
        import torch

        if not self.fitted:
            self.fit(index)
        out = {}
        for k, q in queries.items():
            G = self.G[k]
            H = G.T @ G / G.shape[0] + self.damping[k] * torch.eye(G.shape[1], dtype=torch.float64)
            out[k] = torch.linalg.solve(H, q.double().T).T
        return out
