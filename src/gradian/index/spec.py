"""The gradient index's spec (:class:`GradSpec`), torch-free: what a run.json records and :mod:`gradian.runfile` checks.

The index it describes (building, opening, scoring) is :mod:`gradian.index.store`'s (which imports torch).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gradian.data.spans import UNIT_RULE
from gradian.data.tokenize import TokenizeSpec
from gradian.errors import GradianUserError
from gradian.gradients.projection import ProjectionSpec, projection_dtype

#: How a sentence unit's gradient is formed (:data:`gradian.gradients.units.SPLITS`; that module imports torch).
UNIT_GRADS = ("exact", "positions")

#: The dtypes a gradient index can store (:data:`gradian.index.store.STORAGE_DTYPES` maps them to torch's).
STORAGE_DTYPE_NAMES = ("float32", "float16", "bfloat16", "float64")


@dataclass(frozen=True)
class GradSpec:
    """What a stored training gradient is. Every field changes the numbers, so all are identity.

    Attributes:
        tokenize: how rows become tokens and loss masks.
        modules: layer-name substrings to restrict the LoRA blocks (None: all).
        projection: the Kronecker JL projection (dim 0: exact).
        storage_dtype: ``float32`` (default), ``bfloat16``, ``float16`` or ``float64``. The 2-byte types
            halve the index; their ranking cost is measured in docs/benchmarks.md (float16 also
            cannot hold a gradient entry above 65504, and flushes entries below ~6e-8 to zero).
        optimizer: ``"none"`` (plain gradients) or ``"adam"``: each per-example gradient is
            replaced by Adam's update direction from the checkpoint's ``optimizer.pt``
            (:mod:`gradian.gradients.adam`), before projection. The file's hash is identity.
        unit: ``"row"`` (one gradient per training row) or ``"sentence"`` (one per sentence of
            each row's completion, the loss mask restricted to that sentence;
            :func:`gradian.data.spans.sentence_units`).
        max_units_per_row: a sentence index's budget of units per row (``--max-units-per-row``): a row
            with more supervised sentences has this many units of consecutive sentences
            (:mod:`gradian.data.spans`). Identity of sentence indexes only (:meth:`identity`).
        unit_grads: how a sentence unit's gradient is formed (``--unit-grads``): ``"positions"`` (the default since
            2026-12-06), the row's gradient split by the positions that predict the unit's tokens (one backward per
            row; an approximation, :mod:`gradian.gradients.units`), or ``"exact"``, the gradient of the unit's own
            loss (one backward vector per unit). Identity of sentence indexes only, and only when not exact (the
            ids of exact indexes are those from before the choice existed).
    """

    tokenize: TokenizeSpec = field(default_factory=TokenizeSpec)
    modules: tuple[str, ...] | None = None
    projection: ProjectionSpec = field(default_factory=ProjectionSpec)
    storage_dtype: str = "float32"
    optimizer: str = "none"
    unit: str = "row"
    max_units_per_row: int = 32  # gradian.data.spans.MAX_UNITS_PER_ROW (tests hold them equal)
    unit_grads: str = "positions"  # one of gradian.gradients.units.SPLITS (tests hold them equal)

    def __post_init__(self) -> None:
        from gradian.validate import check_choice, check_int, check_type, where

        check_type(self.tokenize, TokenizeSpec, "GradSpec", "tokenize")
        check_type(self.projection, ProjectionSpec, "GradSpec", "projection")
        if self.modules is not None:
            mods = self.modules
            if (
                isinstance(mods, str)
                or not isinstance(mods, (tuple, list))
                or not all(isinstance(m, str) and m.strip() for m in mods)
            ):
                raise GradianUserError(
                    "modules must be a list of non-empty layer-name substrings",
                    where=where("--modules", "GradSpec", "modules"),
                    fix="e.g. --modules q_proj,v_proj (or leave it unset for every LoRA layer)",
                )
        check_choice(self.storage_dtype, STORAGE_DTYPE_NAMES, "GradSpec", "storage_dtype", flag="--storage-dtype")
        check_choice(self.optimizer, ("none", "adam"), "GradSpec", "optimizer", flag="--optimizer")
        check_choice(self.unit, ("row", "sentence"), "GradSpec", "unit", flag="--unit")
        check_choice(self.unit_grads, UNIT_GRADS, "GradSpec", "unit_grads", flag="--unit-grads")
        check_int(
            self.max_units_per_row,
            "GradSpec",
            "max_units_per_row",
            flag="--max-units-per-row",
            lo=1,
            hi=1_000_000,
            fix="use e.g. --max-units-per-row 32",
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tokenize"] = self.tokenize.to_dict()  # its chat_template only when set (index ids without one unchanged)
        d["modules"] = list(self.modules) if self.modules else None
        return d

    def identity(self) -> dict[str, Any]:
        """What of the spec decides an index's numbers (hashed into its id).

        :meth:`to_dict` with, for a projected index, the precision its projection is computed in
        (:func:`gradian.gradients.projection.projection_dtype`; an exact index keeps its id), less the unit budget
        and the unit gradients' form for a row index (it has no sentence units, so a row index's id does not depend
        on them: row indexes built before they existed keep their ids) and the form when it is exact; a sentence
        index adds the rule that cuts rows into units (:data:`gradian.data.spans.UNIT_RULE`).
        """
        d = self.to_dict()
        if self.projection.dim > 0:  # the precision it is projected in (an exact index is not: its id is unchanged)
            d["projection"]["compute"] = projection_dtype(self.storage_dtype)
        if self.unit == "row" or self.unit_grads == "exact":
            del d["unit_grads"]
        if self.unit == "row":
            del d["max_units_per_row"]
        else:  # how rows are cut into units (a one-sentence row is its own unit since rule 2)
            d["unit_rule"] = UNIT_RULE
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GradSpec:
        """The inverse of :meth:`to_dict` (an index manifest's or a run manifest's ``grad`` spec)."""
        from gradian.validate import spec_kwargs

        return cls(**spec_kwargs(cls, d, {"tokenize": TokenizeSpec, "projection": ProjectionSpec}, ("modules",)))
