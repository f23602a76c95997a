"""EK-FAC (George et al., 2018; Grosse et al., 2023): eigenvalue-corrected Kronecker factors per LoRA block.

Every ``lora_A`` and ``lora_B`` matrix ``W`` (o × i) is its own block, as in DataInf. It is a
Linear applied at every token t with input ``x_t`` (i) and output gradient ``g_t = ∂L/∂y_t`` (o),
so a row's gradient is ``G_n = Σ_t g_t x_tᵀ`` and its Fisher block is approximated by

    F ≈ (Q_S ⊗ Q_A) diag(vec Λ) (Q_S ⊗ Q_A)ᵀ

**Pass 1** (one forward/backward over the rows, :class:`gradian.gradients.hooks.LoraHooks`, the
hooks of the per-example gradients): the input and output-gradient covariances over the real
(non-padding) tokens,

    A = (1/T) Σ_t x_t x_tᵀ,    S = (1/T) Σ_t g_t g_tᵀ,     T = number of non-padding tokens,

and their eigenvectors ``A = Q_A diag(·) Q_Aᵀ``, ``S = Q_S diag(·) Q_Sᵀ`` (float64 ``eigh``).

**Pass 2**, the eigenvalue correction, from the per-example gradients of the same loss:

    Λ = (1/n) Σ_n (Q_Sᵀ G_n Q_A)²          (elementwise square; o × i)

**Query**: ``r = Q_S [ (Q_Sᵀ G_q Q_A) / (Λ + λ) ] Q_Aᵀ``, with ``λ = damping_scale · mean(Λ)``,
and ``score_j = Σ_l ⟨r_l, G_j,l⟩`` like every engine.

These are kronfluence's conventions (``FactorArguments(strategy="ekfac")``, checked against it in
the tests): covariances summed over tokens with the attention mask and divided by the token count;
Λ from per-example gradients of the per-example loss (here Gradian's mean supervised-token
cross-entropy) divided by the number of rows; damping 0.1 × the mean corrected eigenvalue. Because
the rotation keeps norms, ``mean(Λ) = mean_n ‖G_n‖² / d``: EK-FAC's default damping is exactly
DataInf's (``λ_l = 0.1 · mean_i ‖g_il‖² / d_l``).

``fisher``: ``"empirical"`` (the default) uses the rows' own labels, the same gradients the index
stores (then Λ is read from the index when it holds plain float32/float64 gradients: no second
model pass); ``"true"`` samples each supervised label from the model (kronfluence's default, the
true Fisher), seeded, in both passes.

**Projection.** With a Kronecker JL index (:mod:`gradian.gradients.projection`), the stored
gradient is ``G̃ = P_o G P_iᵀ = Σ_t (P_o g_t)(P_i x_t)ᵀ``: exactly the gradient of a Linear whose
inputs are ``P_i x_t`` and output gradients ``P_o g_t``. The factors are fitted in that projected
space (``Ã = P_i A P_iᵀ``, ``S̃ = P_o S P_oᵀ``, Λ̃ from projected per-example gradients), so ``r̃``
preconditions the projected query with the EK-FAC of the projected gradients and is scored against
the projected index. With ``--project-dim 0`` the projections are identities and this is EK-FAC
exactly.

**Exact limit.** With one row whose gradient is rank one and whose A and S are rank one along it
(``G = g xᵀ``, ``A ∝ x xᵀ``, ``S ∝ g gᵀ``), F is diagonal in the Kronecker eigenbasis and EK-FAC
equals the exact damped inverse ``(F + λI)⁻¹`` (tested against :mod:`gradian.engines.exact`).

**Factors** are stored beside the index, ``<index>/factors/ekfac-<key>.safetensors`` (atomic
write), ``key`` = sha256 over the index id and what changes the factors (``fisher``, ``seed``),
so a re-query with the same index fits nothing; the damping is applied at query time and changing
it reuses the factors. A damaged factors file is refitted, never trusted.

**Under torchrun** (:mod:`gradian.distributed`) the fit is sharded: each rank runs its share of
the batches (or reads its own shards for Λ), A, S, the token count and Λ are all-reduced, rank 0's
eigenvectors are broadcast and rank 0 alone writes the factors file. The true Fisher's labels are
seeded per batch, so the factors equal a single process's up to the order of float64 additions.

Memory: per LoRA layer ``in² + out²`` float64 numbers unprojected (small blocks after projection).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gradian.engines.base import Blocks, Engine, EngineSpec, ModelPass, check_damping_scale, positive_damping
from gradian.engines.registry import register
from gradian.errors import GradianWarning

if TYPE_CHECKING:  # torch comes where the engine computes: its spec is read without it
    import torch

    from gradian.index.store import GradientIndex

FACTORS_FORMAT = 2  # 2: the true Fisher's labels are seeded per batch (world-size independent)
FISHER = ("empirical", "true")


@dataclass(frozen=True)
class EkfacSpec(EngineSpec):
    """EK-FAC's knobs.

    Attributes:
        damping_scale: ``λ_l = damping_scale · mean(Λ_l)`` (kronfluence's heuristic: 0.1).
        fisher: ``"empirical"`` (the rows' labels) or ``"true"`` (labels sampled from the model).
        seed: the label-sampling seed (``fisher="true"`` only).
    """

    damping_scale: float = 0.1
    fisher: str = "empirical"
    seed: int = 0

    def __post_init__(self) -> None:
        from gradian.validate import check_choice, check_seed

        check_damping_scale(self.damping_scale, "EkfacSpec")
        check_choice(self.fisher, FISHER, "EkfacSpec", "fisher", flag="--engine-option fisher=")
        check_seed(self.seed, "EkfacSpec", flag="--engine-option seed=")


@dataclass
class BlockFactors:
    """One block's fitted factors (float64, CPU), in the index's (projected) space.

    Attributes:
        QA: (k_i, k_i) eigenvectors of the input covariance A; eigA: its eigenvalues (k_i,).
        QS: (k_o, k_o) eigenvectors of the output-gradient covariance S; eigS: (k_o,).
        lam: (k_o, k_i) the corrected eigenvalues Λ.
    """

    QA: torch.Tensor
    eigA: torch.Tensor
    QS: torch.Tensor
    eigS: torch.Tensor
    lam: torch.Tensor


def _projector(index: GradientIndex):
    from gradian.gradients.projection import KroneckerProjector, ProjectionSpec

    spec = ProjectionSpec(**index.grad_spec.get("projection", {"dim": 0, "seed": 0}))
    return KroneckerProjector([tuple(b["shape"]) for b in index.blocks], [b["kind"] for b in index.blocks], spec)


def _geometry(index: GradientIndex, proj) -> dict[str, tuple[int, int]]:
    """Per block, the (k_o, k_i) matrix shape of its stored (projected) gradient."""
    out = {}
    for k, b in enumerate(index.blocks):
        o, i = (int(x) for x in b["shape"])
        Po, Pi = proj.mats[k]
        ko, ki = (Po.shape[0] if Po is not None else o), (Pi.shape[0] if Pi is not None else i)
        if ko * ki != int(b["dim"]):
            raise ValueError(f"block {b['name']}: projected shape {ko}×{ki} does not match its dim {b['dim']}")
        out[b["name"]] = (ko, ki)
    return out


def factors_key(index: GradientIndex, spec: EkfacSpec) -> str:
    """What the fitted factors depend on beyond the index: the Fisher and its sampling seed (not the damping)."""
    from gradian.util import sha256_json

    ident = {
        "ekfac_factors": FACTORS_FORMAT,
        "index_id": index.id,
        "fisher": spec.fisher,
        "seed": spec.seed if spec.fisher == "true" else None,
    }
    return sha256_json(ident)[:16]


def factors_path(index: GradientIndex, spec: EkfacSpec) -> Path:
    """Where this index's factors for ``spec`` are stored: ``<index>/factors/ekfac-<factors_key>.safetensors``."""
    return Path(index.root) / "factors" / f"ekfac-{factors_key(index, spec)}.safetensors"


def _lambda_from_index(index: GradientIndex, spec: EkfacSpec) -> bool:
    """Λ can be read off the index when it stores this Fisher's per-example gradients at full precision."""
    gs = index.grad_spec
    return (
        spec.fisher == "empirical"
        and gs.get("optimizer", "none") == "none"
        and gs.get("unit", "row") == "row"
        and gs.get("storage_dtype", "float32") in ("float32", "float64")
    )


def _batch_rows(mp: ModelPass) -> list[list[int]]:
    """The rows of every batch, length-sorted (less padding; the sums do not depend on the order).

    The batches are the same for every world size; under torchrun rank r fits batches
    r, r + W, r + 2W, ... (:func:`_local_batches`), which balances the work (neighbouring batches
    have similar lengths) and makes every rank's share a fixed set of whole batches.
    """
    from gradian.data.tokenize import row_values

    lengths = row_values(mp.items, "length")  # lazily tokenised rows are not tokenised to sort them
    order = sorted(range(len(mp.items)), key=lambda r: (lengths[r], r))
    return [order[s : s + mp.batch_size] for s in range(0, len(order), mp.batch_size)]


def _local_batches(mp: ModelPass, mine: dict[int, list[int]], device):
    """Yields ``(batch_number, rows, batch)`` for this rank's batches ``{number: rows}``, collated."""
    from gradian.data.tokenize import collate

    for i, rows in mine.items():
        batch = collate([mp.items[r] for r in rows], mp.pad_token_id)
        yield i, len(rows), {k: v.to(device) for k, v in batch.items()}


def _batch_generator(spec: EkfacSpec, fit_pass: int, batch: int) -> torch.Generator | None:
    """The label-sampling generator of one batch (true Fisher only; None for the empirical Fisher).

    Seeded from ``(seed, pass, batch number)``, not drawn from one running stream, so the labels a
    batch gets do not depend on which rank fits it or on how many ranks there are.
    """
    import torch

    if spec.fisher != "true":
        return None
    from gradian.util import sha256_json

    return torch.Generator().manual_seed(int(sha256_json([spec.seed, fit_pass, batch])[:15], 16))


def _loss(logits, batch, gen: torch.Generator | None):
    from gradian.gradients.hooks import sample_labels
    from gradian.gradients.loss import per_example_loss

    labels = sample_labels(logits, batch["labels"], gen) if gen is not None else batch["labels"]
    return per_example_loss(logits, labels).sum()


def _eigen(M: torch.Tensor, count: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues and eigenvectors of the covariance ``M / count`` (float64, CPU, symmetrised)."""
    import torch

    M = M.cpu() / max(count, 1.0)
    w, V = torch.linalg.eigh((M + M.T) / 2)
    return w.contiguous(), V.contiguous()


def _fit_factors(
    index: GradientIndex, mp: ModelPass, spec: EkfacSpec
) -> tuple[dict[str, BlockFactors], dict[str, Any]]:
    """Pass 1 (covariances, eigenvectors) and pass 2 (Λ) over the model; Λ from the index when it can.

    Collective under torchrun (:mod:`gradian.distributed`): each rank runs its own batches
    (:func:`_local_batches`) or reads its own shards, the sums A, S, the token count and Λ are
    all-reduced, and rank 0's eigenvectors are broadcast, so every rank returns the same factors.
    They equal a single process's up to the order of float64 additions.
    """
    import torch

    from gradian import distributed
    from gradian.data.tokenize import row_values
    from gradian.gradients.hooks import LoraHooks, token_mask
    from gradian.index.store import GradSpec, select_blocks

    if list(row_values(mp.items, "id")) != index.ids:
        raise ValueError(f"the model pass has {len(mp.items)} rows that are not the index's {index.n} rows (in order)")
    names = [b["name"] for b in index.blocks]
    blocks = select_blocks(mp.model, GradSpec(modules=tuple(index.modules) if index.modules else None))
    if [b.name for b in blocks] != names:
        raise ValueError("the model's LoRA blocks are not the index's blocks")
    proj = _projector(index)
    geom = _geometry(index, proj)
    device = blocks[0].module.weight.device
    P = [tuple(None if p is None else p.to(device) for p in proj.mats[k]) for k in range(len(blocks))]
    n = len(mp.items)
    d = distributed.current()
    # this rank's batches, numbered as in one process (the true Fisher seeds its labels by that number)
    mine = {i: rows for i, rows in enumerate(_batch_rows(mp)) if i % d.world_size == d.rank}
    my_rows = sum(len(rows) for rows in mine.values())
    prog = mp.progress

    def project_tokens(k: int, X: torch.Tensor, G: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        Po, Pi = P[k]
        return (X if Pi is None else X @ Pi.T), (G if Po is None else G @ Po.T)

    # pass 1: A and S over the non-padding tokens
    A = [torch.zeros(geom[nm][1], geom[nm][1], dtype=torch.float64, device=device) for nm in names]
    S = [torch.zeros(geom[nm][0], geom[nm][0], dtype=torch.float64, device=device) for nm in names]
    count = torch.zeros(len(names), dtype=torch.float64)
    for i, b, batch in _local_batches(mp, mine, device):
        hooks = LoraHooks(blocks)
        logits = hooks.forward(mp.model, batch)
        loss = _loss(logits, batch, _batch_generator(spec, 1, i))
        mask = token_mask(batch).unsqueeze(-1)
        for c in hooks.backward(loss):
            X, G = project_tokens(c.block, c.X.double() * mask, c.G.double() * mask)
            X, G = X.reshape(-1, X.shape[-1]), G.reshape(-1, G.shape[-1])
            A[c.block] += X.T @ X
            S[c.block] += G.T @ G
            count[c.block] += float(mask.sum())
        if prog:
            prog("EK-FAC covariances", b, my_rows)
    A = [distributed.all_reduce_sum(M) for M in A]
    S = [distributed.all_reduce_sum(M) for M in S]
    count = distributed.all_reduce_sum(count).tolist()
    eig: dict[str, torch.Tensor] | None = None
    if d.is_main:  # one eigendecomposition, broadcast: every rank rotates by the same vectors
        eig = {}
        for k, nm in enumerate(names):
            eig[f"{nm}::eigA"], eig[f"{nm}::QA"] = _eigen(A[k], count[k])
            eig[f"{nm}::eigS"], eig[f"{nm}::QS"] = _eigen(S[k], count[k])
    del A, S
    eig = distributed.broadcast_tensors(eig)
    QA, eigA = {nm: eig[f"{nm}::QA"] for nm in names}, {nm: eig[f"{nm}::eigA"] for nm in names}
    QS, eigS = {nm: eig[f"{nm}::QS"] for nm in names}, {nm: eig[f"{nm}::eigS"] for nm in names}

    # pass 2: the eigenvalue correction Λ = mean_n (Q_Sᵀ G_n Q_A)²
    from_index = _lambda_from_index(index, spec)
    if from_index:
        lam_d = [torch.zeros(geom[nm], dtype=torch.float64) for nm in names]
        local = sum(index.manifest["shards"][k]["n"] for k in index.local_shards())
        for _, shard in index.iter_shards(torch.float64, local=True):
            for k, nm in enumerate(names):
                blk = shard[nm]  # read once (a shard reads its blocks on access)
                g = blk.reshape(blk.shape[0], *geom[nm])
                lam_d[k] += ((QS[nm].T @ g @ QA[nm]) ** 2).sum(0)
            if prog:
                prog("EK-FAC eigenvalue correction", blk.shape[0], local)
    else:
        QAd = [QA[nm].to(device) for nm in names]
        QSd = [QS[nm].to(device) for nm in names]
        lam_d = [torch.zeros(geom[nm], dtype=torch.float64, device=device) for nm in names]
        for i, b, batch in _local_batches(mp, mine, device):
            hooks = LoraHooks(blocks)
            logits = hooks.forward(mp.model, batch)
            loss = _loss(logits, batch, _batch_generator(spec, 2, i))
            per: dict[int, torch.Tensor] = {}
            for c in hooks.backward(loss):
                X, G = project_tokens(c.block, c.X.double(), c.G.double())
                g = torch.einsum("bto,bti->boi", G, X)
                per[c.block] = g if c.block not in per else per[c.block] + g
            for k, g in per.items():
                lam_d[k] += ((QSd[k].T @ g @ QAd[k]) ** 2).sum(0)
            if prog:
                prog("EK-FAC eigenvalue correction", b, my_rows)
    lam = {nm: distributed.all_reduce_sum(lam_d[k]).cpu() for k, nm in enumerate(names)}
    factors = {nm: BlockFactors(QA[nm], eigA[nm], QS[nm], eigS[nm], lam[nm] / max(n, 1)) for nm in names}
    info = {
        "rows": n,
        "tokens": count[0] if count else 0.0,
        "lambda_source": "index" if from_index else "model",
        "rows_per_rank": distributed.all_gather_objects(my_rows),  # [n] in one process
    }
    return factors, info


_PARTS = ("QA", "eigA", "QS", "eigS", "lam")


def _flat(factors: dict[str, BlockFactors]) -> dict[str, torch.Tensor]:
    """``{"<block>::<part>": tensor}``: how the factors are stored and broadcast."""
    return {f"{nm}::{p}": getattr(f, p).contiguous() for nm, f in factors.items() for p in _PARTS}


def _unflat(flat: dict[str, torch.Tensor]) -> dict[str, BlockFactors]:
    """The inverse of :func:`_flat` (blocks in their stored order)."""
    names = dict.fromkeys(k.rsplit("::", 1)[0] for k in flat)
    return {nm: BlockFactors(**{p: flat[f"{nm}::{p}"] for p in _PARTS}) for nm in names}


def save_factors(path: Path, factors: dict[str, BlockFactors], meta: dict[str, Any]) -> None:
    """Write every block's factors to one safetensors file, atomically.

    Args:
        path: the file (:func:`factors_path`).
        factors: per block name, its ``QA``, ``eigA``, ``QS``, ``eigS`` and ``lam``, stored as ``<block>::<part>``.
        meta: JSON-able metadata (must hold the ``key`` :func:`load_factors` checks), kept in the header.
    """
    from safetensors.torch import save

    from gradian.util import atomic_write_bytes

    atomic_write_bytes(path, save(_flat(factors), metadata={"gradian": json.dumps(meta, sort_keys=True)}))


def load_factors(path: Path, index: GradientIndex, key: str) -> tuple[dict[str, BlockFactors], dict[str, Any]] | None:
    """The stored factors if they are whole and belong to this index and key; None to refit."""
    import torch

    if not path.exists():
        return None
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get("gradian", "{}"))
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # a damaged file is refitted, never trusted
        warnings.warn(
            f"EK-FAC factors {path} cannot be read ({type(e).__name__}); refitting", GradianWarning, stacklevel=3
        )
        return None
    geom = _geometry(index, _projector(index))
    problem = None if meta.get("key") == key else "they belong to another index or spec"
    out = {}
    for nm, (ko, ki) in geom.items():
        if problem:
            break
        shapes = {"QA": (ki, ki), "eigA": (ki,), "QS": (ko, ko), "eigS": (ko,), "lam": (ko, ki)}
        parts = {}
        for p, shp in shapes.items():
            t = tensors.get(f"{nm}::{p}")
            if t is None or tuple(t.shape) != shp or t.dtype != torch.float64 or not bool(torch.isfinite(t).all()):
                problem = f"{nm}::{p} is missing, misshapen or not finite"
                break
            parts[p] = t
        if not problem:
            out[nm] = BlockFactors(**parts)
    if problem:
        warnings.warn(f"EK-FAC factors {path}: {problem}; refitting", GradianWarning, stacklevel=3)
        return None
    return out, meta


@register
class Ekfac(Engine):
    """EK-FAC per LoRA block (module docstring); needs a model pass to fit, reuses stored factors."""

    name = "ekfac"
    spec_class = EkfacSpec
    needs = "model"
    summary = "eigenvalue-corrected Kronecker-factored curvature, as kronfluence; fits on a model pass"

    spec: EkfacSpec

    def fit(self, index: GradientIndex, model_pass: ModelPass | None = None) -> None:
        """Load this index's stored factors, or fit them on ``model_pass`` and store them.

        Collective under torchrun: rank 0 reads the factors file and decides; stored factors are
        broadcast from it, a fit is shared by all ranks (:func:`_fit_factors`) and written by rank 0.
        """
        from gradian import distributed

        d = distributed.current()
        key = factors_key(index, self.spec)
        self.path = factors_path(index, self.spec)
        got = load_factors(self.path, index, key) if d.is_main else None
        self.reused = bool(distributed.broadcast_object(got is not None))
        if self.reused:
            if d.enabled:
                factors = _unflat(distributed.broadcast_tensors(None if got is None else _flat(got[0])))
                meta = distributed.broadcast_object(None if got is None else got[1])
            else:
                factors, meta = got  # type: ignore[misc]
        else:
            if model_pass is None:
                raise ValueError("EK-FAC has no stored factors for this index and needs a model pass to fit them")
            factors, info = _fit_factors(index, model_pass, self.spec)
            meta = {
                "key": key,
                "index_id": index.id,
                "format": FACTORS_FORMAT,
                "fisher": self.spec.fisher,
                "seed": self.spec.seed,
                **info,
            }
            if d.is_main:
                save_factors(self.path, factors, meta)
        self.factors, self.meta = factors, meta
        self.geom = _geometry(index, _projector(index))
        self.damping = {}
        for nm, f in factors.items():
            self.damping[nm] = positive_damping(self.spec.damping_scale * float(f.lam.mean()))
        self.fitted = True

    def precondition(self, index: GradientIndex, queries: Blocks) -> Blocks:
        """``r = Q_S [(Q_Sᵀ G_q Q_A) / (Λ + λ)] Q_Aᵀ`` per block, in the index's (projected) space."""
        if not self.fitted:
            self.fit(index)
        out = {}
        for nm, q in queries.items():
            f = self.factors[nm]
            ko, ki = self.geom[nm]
            g = q.double().reshape(q.shape[0], ko, ki)
            rot = (f.QS.T @ g @ f.QA) / (f.lam + self.damping[nm])
            out[nm] = (f.QS @ rot @ f.QA.T).reshape(q.shape[0], ko * ki)
        return out

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["damping_rule"] = "lambda_l = damping_scale * mean(Lambda_l)"
        if self.fitted:
            d["factors"] = {
                "file": str(self.path),
                "reused": self.reused,
                "lambda_source": self.meta.get("lambda_source"),
                "rows_per_rank": self.meta.get("rows_per_rank"),
            }
        return d
