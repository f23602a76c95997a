"""Seeded Johnson-Lindenstrauss projection of per-example LoRA gradients.

A LoRA gradient block is a matrix ``g ∈ R^{o×i}`` (``lora_A``: r×in,
``lora_B``: out×r). Projecting it with a dense ``R ∈ R^{k×(o·i)}`` would need
a matrix as large as the model. Gradian uses a Kronecker-structured projection
instead, so the projection matrices stay small:

    g̃ = P_o · g · P_iᵀ,      P_o ∈ R^{k_o×o},  P_i ∈ R^{k_i×i},
    entries ~ N(0, 1) / √k,   so  E⟨g̃, h̃⟩ = ⟨g, h⟩.

The side of size r is never projected (``k = r``, ``P = I``); the wide side
(``in`` for ``lora_A``, ``out`` for ``lora_B``) is projected to
``k_wide = max(1, dim // r)`` so a block keeps about ``dim`` numbers.
Matrices are drawn from ``torch.Generator`` seeded by ``(seed, block index)``
and are identical for train and query gradients.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where the matrices are drawn: the spec is read without it
    import torch


@dataclass(frozen=True)
class ProjectionSpec:
    """``dim`` numbers kept per LoRA block (0 = no projection) and the seed."""

    dim: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        from gradian.validate import check_int, check_seed

        check_int(
            self.dim,
            "ProjectionSpec",
            "dim",
            flag="--project-dim",
            lo=0,
            hi=10**8,
            fix="0 disables projection; e.g. --project-dim 4096",
        )
        check_seed(self.seed, "ProjectionSpec")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: The precision an index build projects in when it stores float32 or a 2-byte dtype: ``P_o · g · P_iᵀ`` in float32
#: is 2.8x faster on a CPU than in float64 (SmolLM2-135M, all seven projections, r=16, dim 2048: 0.070 against
#: 0.197 s for a row and four units, one thread) and differs by float32 rounding over the k-long sums (~1e-6
#: relative), under what the float32 store keeps of a float64 result. An index stored in float64 projects in
#: float64. Part of a projected index's identity (:meth:`gradian.index.spec.GradSpec.identity`).
PROJECT_IN = "float32"


def projection_dtype(storage_dtype: str) -> str:
    """The dtype an index stored as ``storage_dtype`` is projected in: ``float64`` for a float64 store, else
    :data:`PROJECT_IN`.
    """
    return "float64" if storage_dtype == "float64" else PROJECT_IN


def projected_numbers(shape: tuple[int, int], kind: str, dim: int) -> int:
    """Numbers one block of ``shape`` keeps under ``--project-dim dim`` (what
    :meth:`KroneckerProjector.out_dim` returns, without drawing the matrices).
    """
    o, i = shape
    if dim <= 0:
        return o * i
    r = o if kind == "A" else i
    wide = i if kind == "A" else o
    return r * max(1, min(wide, dim // max(r, 1)))


class KroneckerProjector:
    """Projects per-example block gradients (b, o, i) → (b, k_o·k_i)."""

    def __init__(self, shapes: list[tuple[int, int]], kinds: list[str], spec: ProjectionSpec, keep: str = "float64"):
        """Draw each block's matrix (float64, seeded by ``(spec.seed, block index)``) and keep it in ``keep``: an
        index build keeps only the dtype it projects in (:func:`projection_dtype`), not a float64 copy beside it
        (156 MB of float32 against 312 MB of float64 for SmolLM2-135M all-linear r=16 at dim 2048).
        """
        import torch

        self.spec = spec
        self.keep = getattr(torch, keep)
        self.mats: list[tuple[torch.Tensor | None, torch.Tensor | None]] = []  # in ``keep``, on the CPU
        self._moved: dict[tuple[str, torch.dtype], dict[int, tuple]] = {}  # (device, dtype) → block → copies
        for idx, ((o, i), kind) in enumerate(zip(shapes, kinds)):
            if spec.dim <= 0:
                self.mats.append((None, None))
                continue
            gen = torch.Generator().manual_seed(spec.seed * 1_000_003 + idx)
            r = o if kind == "A" else i
            wide = i if kind == "A" else o
            k = max(1, min(wide, spec.dim // max(r, 1)))
            P = (torch.randn(k, wide, generator=gen, dtype=torch.float64) / k**0.5).to(self.keep)
            self.mats.append((None, P) if kind == "A" else (P, None))

    def out_dim(self, idx: int, shape: tuple[int, int]) -> int:
        Po, Pi = self.mats[idx]
        o = Po.shape[0] if Po is not None else shape[0]
        i = Pi.shape[0] if Pi is not None else shape[1]
        return o * i

    def matrices(self, idx: int, device, dtype) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Block ``idx``'s ``(P_o, P_i)`` on ``device`` in ``dtype`` (the same numbers, converted). The kept dtype on a
        CPU is the matrices themselves; any other device or dtype is converted once per block and kept, not again
        for every row or batch.
        """
        import torch

        Po, Pi = self.mats[idx]
        if torch.device(device).type == "cpu" and dtype == self.keep:
            return Po, Pi
        key = (str(device), dtype)
        moved = self._moved.setdefault(key, {})
        if idx not in moved:
            moved[idx] = tuple(None if P is None else P.to(device=device, dtype=dtype) for P in (Po, Pi))
        return moved[idx]  # type: ignore[return-value]

    def stored(self, idx: int, g: torch.Tensor, storage_dtype: str) -> torch.Tensor:
        """``self(idx, g)`` as an index of ``storage_dtype`` stores it: a projected block is projected in
        :func:`projection_dtype` (g converted first), then every block is cast to the storage dtype.

        Args:
            g: (b, o, i), float64 or float32 (the builds' sums).
            storage_dtype: the index's ``--storage-dtype`` name.

        Returns:
            (b, k_o·k_i) in the storage dtype.
        """
        import torch

        if any(P is not None for P in self.mats[idx]):
            g = g.to(getattr(torch, projection_dtype(storage_dtype)))
        return self(idx, g).to(getattr(torch, storage_dtype))

    def __call__(self, idx: int, g: torch.Tensor) -> torch.Tensor:
        """Args: g (b, o, i). Returns (b, k_o·k_i), ``P_o · g · P_iᵀ`` per example (flattened; g when dim = 0)."""
        Po, Pi = self.matrices(idx, g.device, g.dtype)
        if Pi is not None:
            g = g @ Pi.T
        if Po is not None:
            g = Po @ g
        return g.reshape(g.shape[0], -1)
