"""One interface for influence engines.

An engine turns query gradients into *preconditioned* queries ``r = P g_q``
per LoRA block, after which every engine scores the same way:

    score[q, j] = Σ_l ⟨ r_l[q], g_l[j] ⟩          (then the sign convention, gradian.sign)

so running two engines in one pass over the index costs one extra
preconditioning, and span-level drill-down reuses ``r`` for sentence
gradients. Engines see the training gradients only through
:class:`gradian.index.store.GradientIndex` shards, one shard in memory at a time; an engine
that declares ``needs = "model"`` (EK-FAC) is also handed a :class:`ModelPass`.

The engines are listed by :mod:`gradian.engines.registry`; adding one is one new file there.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence

if TYPE_CHECKING:  # torch comes where the engine computes: its spec is read without it
    import torch

    from gradian.index.store import GradientIndex


Blocks = dict[str, "torch.Tensor"]  # block name -> (m, d_l)

#: What an engine needs to fit: the gradient index alone, or also a pass of the model over the rows.
NEEDS = ("index", "model")


def check_damping_scale(value: Any, owner: str) -> None:
    """Check a damped engine's ``damping_scale``: a positive number, at most 1e6 (``--damping-scale``)."""
    from gradian.validate import check_float

    check_float(
        value,
        owner,
        "damping_scale",
        flag="--damping-scale",
        lo=0,
        lo_open=True,
        hi=1e6,
        fix="use a positive scale such as --damping-scale 0.1",
    )


def positive_damping(lam: float) -> float:
    """A block's damping ``λ_l`` as used: a block with no signal (λ_l = 0, every training gradient zero
    there) gets 1e-12 instead, since it scores 0 whatever λ is and λ > 0 keeps the division defined.
    """
    return lam if lam > 0 else 1e-12


@dataclass(frozen=True)
class EngineSpec:
    """Base of every engine's own typed spec: the knobs that change its scores (they land in the run manifest).

    Each engine subclasses it as a frozen dataclass with its own fields (DataInf's and EK-FAC's
    damping are separate fields with separate rules; nothing is inherited from another engine),
    checks them in ``__post_init__`` with :mod:`gradian.validate`, and is registered with its
    engine (:func:`gradian.engines.registry.register`), which sets :attr:`name`.
    """

    #: the registered engine name (set by the registry)
    name: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **asdict(self)}


@dataclass
class ModelPass:
    """What an engine that declares ``needs = "model"`` is given to fit.

    Attributes:
        model: the PEFT model with the LoRA weights the index was built at (the checkpoint's).
        items: the index's rows, tokenised, in index order (the same loss masks).
        pad_token_id: the tokenizer's pad id.
        batch_size: rows per forward/backward pass.
        progress: optional ``(task, advance, total)`` callback.
    """

    model: torch.nn.Module
    items: Sequence[Any]
    pad_token_id: int
    batch_size: int = 8
    progress: Callable[[str, int, int], None] | None = None


class Engine(ABC):
    """Fit statistics over the training index (and, if it declares so, a model pass), then precondition query gradients.

    Class attributes a registered engine declares:
        name: the engine's name (CLI ``--engine``, manifest, reports).
        spec_class: its typed :class:`EngineSpec` subclass.
        needs: ``"index"`` (fits from the stored per-example gradients) or ``"model"`` (also needs
            a :class:`ModelPass` over the training rows).
        summary: one line for the CLI help.
    """

    name: ClassVar[str] = "engine"
    spec_class: ClassVar[type[EngineSpec]] = EngineSpec
    needs: ClassVar[str] = "index"
    summary: ClassVar[str] = ""

    def __init__(self, spec: EngineSpec):
        self.spec = spec
        self.fitted = False

    @abstractmethod
    def fit(self, index: GradientIndex, model_pass: ModelPass | None = None) -> None:
        """Collect whatever training-set statistics the engine needs (one pass over shards at most,
        plus model passes when ``needs == "model"``).
        """

    @abstractmethod
    def precondition(self, index: GradientIndex, queries: Blocks) -> Blocks:
        """Map query gradients ``{block: (m, d_l)}`` to ``r = P g_q`` with the same shapes."""

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name, **self.spec.to_dict()}


def score_index(index: GradientIndex, preconditioned: list[Blocks], tick=None) -> list[torch.Tensor]:
    """Raw inner products for several preconditioned query sets in ONE pass over the shards.

    Collective under torchrun: each rank scores its block of shards and the scores are gathered
    in row order (every rank gets them all). A score is one row's inner product, computed whole by
    one rank, so it does not depend on the world size.

    Args:
        preconditioned: per engine, ``{block: (m, d_l)}``.
        tick: called with 1 after each shard this process scored.

    Returns:
        per engine, a (m, n) float64 tensor ``Σ_l r_l G_lᵀ``.
    """
    import torch

    from gradian import distributed

    ms = [next(iter(R.values())).shape[0] for R in preconditioned]
    outs: list[list[torch.Tensor]] = [[torch.zeros(m, 0, dtype=torch.float64)] for m in ms]  # a rank with no shards
    for _, shard in index.iter_shards(torch.float64, local=True):
        accs = [torch.zeros(m, shard.n, dtype=torch.float64) for m in ms]
        for name, G in shard.items():  # each block is read once, for every engine
            for acc, R in zip(accs, preconditioned):
                acc += R[name].to(torch.float64) @ G.T  # (m, n_k)
        for out, acc in zip(outs, accs):
            out.append(acc)
        if tick is not None:
            tick(1)
    return [distributed.gather_cat(torch.cat(o, dim=1), dim=1) for o in outs]
