"""DataInf (Kwon et al., 2023): closed-form inverse-curvature-vector products per LoRA block.

For each LoRA block l (every ``lora_A`` and ``lora_B`` matrix is its own
block), with training gradients ``g_il`` (i = 1..n), query gradient ``g_q``
and damping ``λ_l``, DataInf swaps inversion and averaging,

    (1/n Σ_i g_il g_ilᵀ + λ_l I)⁻¹ ≈ 1/n Σ_i (g_il g_ilᵀ + λ_l I)⁻¹,

and applies Sherman-Morrison to each rank-one term exactly:

    r_l = (1/λ_l) · [ g_q − (1/n) Σ_i (g_il·g_q) / (λ_l + ‖g_il‖²) · g_il ]
    score_j = Σ_l ⟨ r_l, g_jl ⟩

Damping: ``λ_l = c · mean_i ‖g_il‖² / d_l`` with ``c = 0.1`` by default, i.e.
0.1 × the mean squared gradient *entry* of the block, as in the reference
implementation (``lambda_const = mean(g**2) / 10``). It adapts to each block's
gradient scale (``lora_A`` and ``lora_B`` blocks differ by orders of
magnitude), is tiny next to ``‖g_il‖²`` (so the Sherman-Morrison correction
dominates and the approximation stays close to the damped inverse), and needs
no tuning. ``d_l`` is the block's stored dimension (after projection, if any).

Cost: one pass over the index for ``‖g_il‖²`` (fit), one per query set for the
correction term; matrix form handles m queries at once:

    C = G_l Q_lᵀ / (λ_l + s_l)        (n, m),  s_l = ‖g_il‖² per row
    R_l = (Q_l − (1/n) Cᵀ G_l) / λ_l  (m, d_l)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gradian.engines.base import Blocks, Engine, EngineSpec, ModelPass, check_damping_scale, positive_damping
from gradian.engines.registry import register

if TYPE_CHECKING:  # torch comes where the engine computes: its spec is read without it
    from gradian.index.store import GradientIndex


@dataclass(frozen=True)
class DataInfSpec(EngineSpec):
    """DataInf's knobs.

    Attributes:
        damping_scale: per-block damping ``λ_l = damping_scale · mean_i ‖g_il‖² / d_l``.
    """

    damping_scale: float = 0.1

    def __post_init__(self) -> None:
        check_damping_scale(self.damping_scale, "DataInfSpec")


@register
class DataInf(Engine):
    """DataInf per LoRA block (module docstring): the default engine; fits from the index alone.

    ``fit`` stores per block the squared row norms ``s_l = ‖g_il‖²`` (n,) and the damping ``λ_l``;
    ``precondition`` maps m query gradients ``Q_l`` (m, d_l) to ``R_l = (Q_l − (1/n) Cᵀ G_l) / λ_l``
    with ``C = G_l Q_lᵀ / (λ_l + s_l)`` (n, m), one pass over the index for all m queries.
    """

    name = "datainf"
    spec_class = DataInfSpec
    needs = "index"
    summary = "swapped-order damped inverse, Sherman-Morrison per row; the default"

    def fit(self, index: GradientIndex, model_pass: ModelPass | None = None) -> None:
        """Per-block squared norms ‖g_il‖² (n,) and damping λ_l. Collective under torchrun: each rank
        reads its block of shards, the norms are gathered in row order.
        """
        import torch

        from gradian import distributed

        sq: dict[str, list[torch.Tensor]] = {b["name"]: [torch.zeros(0, dtype=torch.float64)] for b in index.blocks}
        for _, shard in index.iter_shards(torch.float64, local=True):
            for name, G in shard.items():
                sq[name].append((G * G).sum(1))
        self.sqnorm = {k: distributed.gather_cat(torch.cat(v)) for k, v in sq.items()}
        self.dims = {b["name"]: int(b["dim"]) for b in index.blocks}
        self.damping = {}
        for k, s in self.sqnorm.items():
            self.damping[k] = positive_damping(self.spec.damping_scale * float(s.mean()) / self.dims[k])
        self.n = index.n
        self.fitted = True

    def precondition(self, index: GradientIndex, queries: Blocks) -> Blocks:
        import torch

        from gradian import distributed

        if not self.fitted:
            self.fit(index)
        Q = {k: v.double() for k, v in queries.items()}
        corr = {k: torch.zeros_like(v) for k, v in Q.items()}
        for start, shard in index.iter_shards(torch.float64, local=True):
            for name, G in shard.items():
                s = self.sqnorm[name][start : start + G.shape[0]]
                C = (G @ Q[name].T) / (self.damping[name] + s).unsqueeze(1)  # (n_k, m)
                corr[name] += C.T @ G  # (m, d_l)
        corr = {k: distributed.all_reduce_sum(v) for k, v in corr.items()}  # the ranks' partial sums
        # (Q − corr / n) / λ formed in corr's memory (negation is exact: the same bits as the out-of-place form),
        # so the result costs no third m × d_l copy of the queries
        return {k: corr[k].div_(self.n).neg_().add_(Q[k]).div_(self.damping[k]) for k in Q}

    def describe(self):
        d = super().describe()
        d["damping_rule"] = "lambda_l = damping_scale * mean_i ||g_il||^2 / d_l"
        return d
