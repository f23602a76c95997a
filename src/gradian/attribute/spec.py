"""Attribute's spec (:class:`AttributeSpec`), torch-free: what a run.json records and :mod:`gradian.runfile` checks.

The attribution it configures is :mod:`gradian.attribute.pipeline`'s (which imports torch); the engines'
own specs live in their files (:mod:`gradian.engines`), each importable without torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gradian.attribute.clusters import ClusterSpec
from gradian.engines.base import EngineSpec
from gradian.engines.datainf import DataInfSpec
from gradian.engines.graddot import GradDotSpec
from gradian.engines.lexical import BM25Spec
from gradian.engines.repsim import RepSimSpec
from gradian.errors import GradianUserError

STATISTICS = ("cosine", "raw")
UNITS = ("sentence", "row")
REFERENCES = ("bm25", "repsim")
FUSE_GATES = ("tail", "global")
VISITS = ("auto", "off")


@dataclass(frozen=True)
class AttributeSpec:
    """Attribution knobs (all land in the run manifest).

    Attributes:
        engine: the primary gradient engine's spec (its own typed spec, e.g. ``DataInfSpec()``, or a
            registered engine name for its defaults; :mod:`gradian.engines.registry`).
        second_engine: a second gradient engine run in the same passes for the agreement check, with its
            own spec (nothing is inherited from the primary); a name for its defaults; None: off.
        query: ``"contrastive"`` or ``"cross_entropy"``.
        top_k: rows listed per capability; also the k of the top-k overlaps.
        drilldown_rows: how many of the most harmful rows get sentence scores.
        query_batch_size: sequences per backward pass for query gradients (2: a pass keeps every LoRA layer's
            inputs and output gradients and the model's activations for its batch, 1.9 GB for 8 sequences of 62
            tokens on an all-linear r=16 SmolLM2 adapter, the peak of a whole `gradian attribute` there; 2 keeps
            0.8 GB less for 7% more query time, docs/benchmarks.md "Memory: the query batch").
        clusters: harmful-tail clustering knobs.
        weighting: checkpoint weights over the trajectory, ``"lr"`` (mean learning rate since the
            previous checkpoint) or ``"equal"``.
        visits: ``"auto"``: where the run's row order is reproduced (an HF Trainer, TRL SFT, LLaMA-Factory or
            axolotl run's seeded sampler, or torchtune's LoRA recipe, read from its config), a row the run never
            read scores exactly 0 and the verdict is taken over the rows it read (:mod:`gradian.attribute.visits`);
            ``"off"``: every row once per checkpoint (rows reordered before training).
        statistic: the rank score of a gradient engine, ``"cosine"`` (direction only, LESS's unit
            normalisation of the training and query gradients) or ``"raw"`` (the influence itself).
        unit: ``"sentence"`` (rank a row by its most harmful sentence for each failing item, averaged over
            the items) or ``"row"`` (whole rows).
        row_weight: with ``unit="sentence"``, the weight of the whole row's score beside that sentence statistic,
            each divided by its robust scale (:func:`gradian.attribute.ranking.rank_statistic`); 0: the sentence
            statistic alone (the rule until 2026-12-06). The most harmful of a row's sentences favours rows with
            many sentences (more chances to look harmful); the whole row does not, but dilutes a buried sentence.
            0.5 was chosen by the worst of the tiny family and the quick and full SmolLM2 worked examples, then
            checked on four SmolLM2 worlds (docs/benchmarks.md "The whole row beside its worst sentence").
        references: reference engines run beside the gradient engines (``"bm25"``, ``"repsim"``).
        fuse: references folded into the rank score, each weighted by its agreement with the
            gradient ranking (:func:`gradian.attribute.ranking.fuse_scores`); empty: the ranking is the
            gradient engine's alone.
        fuse_gate: how that agreement is measured: ``"global"`` (Spearman over all rows, the default) or
            ``"tail"`` (the gradient's verdict on the rows the reference ranks most harmful,
            :func:`gradian.attribute.ranking.tail_agreement`; not the default until measured on the SmolLM2
            family and the behaviour world, docs/benchmarks.md "Fusion gate").
        bm25, repsim: the reference engines' settings.
        weakened_nats: also query, beside the lost items, every item the tuned model still passes but whose
            answer's log-probability fell by more than this many nats against the reference (Evaluate's
            :class:`~gradian.evaluate.result.Shift`) and has a rival answer (:mod:`gradian.attribute.rival`), each
            as the contrastive query ``∇ℓ(correct) − ∇ℓ(rival)``; None: the lost items only.
        drill_weakened_nats: the same items (answer log-probability fallen by more than this many nats, with a
            rival answer), queried for the sentence drill-down only: the sentence a row blames is its most harmful
            one for any lost *or* such weakened item (:func:`gradian.attribute.drilldown.blamed_units`), while the
            ranking, the references and verify keep the lost items. None: the lost items only. Items already
            queried by ``weakened_nats`` are not repeated. The default 0.25 was measured on the tiny family (all
            buried culprits localised 34 → 52 of 73, no world lower) and on the full and quick SmolLM2 worked
            examples (level: 41 of 45 and 15 of 15); docs/benchmarks.md "The drill-down asks the weakened items
            too".
    """

    engine: EngineSpec | str = field(default_factory=DataInfSpec)
    second_engine: EngineSpec | str | None = field(default_factory=GradDotSpec)
    query: str = "contrastive"
    top_k: int = 20
    drilldown_rows: int = 10
    query_batch_size: int = 2
    clusters: ClusterSpec = field(default_factory=ClusterSpec)
    weighting: str = "lr"
    visits: str = "auto"
    statistic: str = "cosine"
    unit: str = "sentence"
    row_weight: float = 0.5
    references: tuple[str, ...] = REFERENCES
    fuse: tuple[str, ...] = ("bm25", "repsim")
    fuse_gate: str = "global"
    bm25: BM25Spec = field(default_factory=BM25Spec)
    repsim: RepSimSpec = field(default_factory=RepSimSpec)
    weakened_nats: float | None = None
    drill_weakened_nats: float | None = 0.25

    def __post_init__(self) -> None:
        from gradian.engines.registry import engine_names, engine_spec
        from gradian.validate import check_choice, check_int, check_type

        if isinstance(self.engine, str):  # a registered name: that engine's defaults
            object.__setattr__(self, "engine", engine_spec(self.engine, "--engine (AttributeSpec.engine)"))
        check_type(self.engine, EngineSpec, "AttributeSpec", "engine")
        if isinstance(self.second_engine, str):
            if self.second_engine not in engine_names():
                raise GradianUserError(
                    f"unknown engine {self.second_engine!r}",
                    where="--second-engine (AttributeSpec.second_engine)",
                    fix=f"use one of {', '.join(engine_names())} (or none)",
                )
            object.__setattr__(self, "second_engine", engine_spec(self.second_engine, "--second-engine"))
        if self.second_engine is not None:
            check_type(self.second_engine, EngineSpec, "AttributeSpec", "second_engine")
        for es in (self.engine, self.second_engine):
            if es is not None and es.name not in engine_names():
                raise GradianUserError(
                    f"{type(es).__name__} is not a registered engine's spec",
                    where="AttributeSpec",
                    fix=f"use the spec of one of {', '.join(engine_names())}",
                )
        check_choice(self.query, ("contrastive", "cross_entropy"), "AttributeSpec", "query", flag="--query")
        check_int(
            self.top_k,
            "AttributeSpec",
            "top_k",
            flag="--top-k",
            lo=1,
            hi=1_000_000,
            fix="list at least one row, e.g. --top-k 20",
        )
        check_int(self.drilldown_rows, "AttributeSpec", "drilldown_rows", lo=0, hi=10_000)
        check_int(self.query_batch_size, "AttributeSpec", "query_batch_size", lo=1, hi=65_536)
        check_type(self.clusters, ClusterSpec, "AttributeSpec", "clusters")
        check_type(self.bm25, BM25Spec, "AttributeSpec", "bm25")
        check_type(self.repsim, RepSimSpec, "AttributeSpec", "repsim")
        for name in ("references", "fuse"):
            if isinstance(getattr(self, name), str) or not isinstance(getattr(self, name), (tuple, list)):
                raise GradianUserError(
                    f"{name} must be a tuple of names, got {getattr(self, name)!r}",
                    where=f"--{name} (AttributeSpec.{name})",
                    fix=f"e.g. {name}=('bm25',)",
                )
            object.__setattr__(self, name, tuple(getattr(self, name)))
        check_choice(self.weighting, ("lr", "equal"), "AttributeSpec", "weighting", flag="--weighting")
        check_choice(self.visits, VISITS, "AttributeSpec", "visits", flag="--visits")
        check_choice(self.statistic, STATISTICS, "AttributeSpec", "statistic", flag="--statistic")
        check_choice(self.unit, UNITS, "AttributeSpec", "unit", flag="--unit")
        check_choice(self.fuse_gate, FUSE_GATES, "AttributeSpec", "fuse_gate", flag="--fuse-gate")
        from gradian.validate import check_float

        check_float(
            self.row_weight,
            "AttributeSpec",
            "row_weight",
            flag="--row-weight",
            lo=0.0,
            hi=100.0,
            fix="e.g. --row-weight 0.5 (0: the sentence statistic alone)",
        )
        for name, flag in (("weakened_nats", "--weakened"), ("drill_weakened_nats", "--drill-weakened")):
            if getattr(self, name) is not None:
                check_float(
                    getattr(self, name),
                    "AttributeSpec",
                    name,
                    flag=flag,
                    lo=0.0,
                    hi=1e6,
                    fix=f"give a drop in nats, e.g. {flag} 1",
                )
        for r in self.references:
            check_choice(
                r,
                REFERENCES,
                "AttributeSpec",
                "references",
                flag="--references",
                fix=f"use any of {', '.join(REFERENCES)}, or none",
            )
        for r in self.fuse:
            if r not in self.references:
                raise GradianUserError(
                    f"{r!r} is fused but not run",
                    where="--fuse (AttributeSpec.fuse)",
                    fix="add it to --references, or drop it from --fuse",
                )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["engine"] = self.engine.to_dict()  # type: ignore[union-attr]
        d["second_engine"] = self.second_engine.to_dict() if isinstance(self.second_engine, EngineSpec) else None
        d["references"] = list(self.references)
        d["fuse"] = list(self.fuse)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AttributeSpec:
        """The inverse of :meth:`to_dict` (a run manifest's ``specs.attribute``); unknown keys are ignored. A manifest
        written before ``row_weight`` existed ranked by the sentence statistic alone: it reads as ``row_weight=0``.
        """
        from gradian.engines.registry import engine_spec
        from gradian.validate import spec_kwargs

        def engine(**e: Any) -> EngineSpec:
            opts = {k: v for k, v in e.items() if k != "name"}
            return engine_spec(e.get("name"), "AttributeSpec.engine", **opts)

        nested = {
            "engine": engine,
            "second_engine": engine,
            "clusters": ClusterSpec,
            "bm25": BM25Spec,
            "repsim": RepSimSpec,
        }
        return cls(**spec_kwargs(cls, {"row_weight": 0.0, **d}, nested, ("references", "fuse")))

    @property
    def engines(self) -> list[EngineSpec]:
        """The gradient engines to run: primary first."""
        out = [self.engine]
        if isinstance(self.second_engine, EngineSpec) and self.second_engine.name != self.engine.name:  # type: ignore[union-attr]
            out.append(self.second_engine)
        return out  # type: ignore[return-value]
