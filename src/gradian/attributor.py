r"""The Python API: one :class:`Attributor` per fine-tune, in the spirit of kronfluence's ``Analyzer``.

::

    from gradian.attributor import Attributor, Query

    att = Attributor("base/", "adapter/", "train.jsonl")          # or Attributor.from_run("gradian-run/")
    att.index()                                                   # build (or reuse) the gradient index
    ev = att.evaluate("eval.jsonl")                               # EvalResult: what regressed, beyond noise
    s = att.scores([Query.from_text("Q: capital of Aland?\\nA:", " Marven", said=" Quisto")])
    s.matrix                                                      # (m, n): queries × training rows
    run = att.attribute("eval.jsonl", out="gradian-run")          # the whole pipeline → Run (run.json)
    print(att.report("md"))

The model is loaded once, lazily, on the first call that needs it. Every knob is a spec
(:class:`gradian.attribute.AttributeSpec`, :class:`gradian.index.store.GradSpec`,
:class:`gradian.evaluate.EvalSpec`, :class:`gradian.models.load.ModelSpec`); each checks itself
when it is built, so a bad value is the same one-line :class:`gradian.errors.GradianUserError`
the CLI prints. Scores follow :mod:`gradian.sign`: positive = the row reinforced the query's
target (lowered its loss), negative = it degraded it. Docs: ``docs/api.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import numpy as np

from gradian.attribute.pipeline import AttributeSpec
from gradian.attribute.queries import Query, failing_item_query
from gradian.attribute.run import Run, RunInputs, RunSpecs
from gradian.errors import GradianUserError
from gradian.index.store import GradSpec
from gradian.models.load import ModelSpec
from gradian.sign import SIGN_CONVENTION, most_harmful_first, predicted_loss_delta_if_removed

if TYPE_CHECKING:
    from gradian.data.formats import Example
    from gradian.data.setup import TrainingSetup
    from gradian.data.tokenize import TokenizedExample
    from gradian.engines.base import EngineSpec
    from gradian.evaluate import EvalResult, EvalSpec, FailingItem
    from gradian.finetune import FineTune
    from gradian.index.store import GradientIndex

__all__ = ["Attributor", "Query", "Run", "Scores"]

REPORT_FORMATS = ("md", "html", "json", "text")


class UnknownQueryError(GradianUserError, KeyError):
    """:meth:`Scores.row` (and the top-k lists) got a query id the scores do not have."""

    def __str__(self) -> str:  # KeyError's own str() would quote the whole message
        return GradianUserError.__str__(self)


def check_k(k: Any, where: str) -> int:
    """A top-k's k: a whole number >= 1 (not a bool), as ``--top-k`` is checked (``AttributeSpec.top_k``)."""
    from gradian.validate import check_int

    return check_int(k, where, "k", lo=1, fix="ask for at least one row, e.g. k=10")


def _check_path(value: Any, name: str, what: str, *, must_exist: bool = True, optional: bool = False) -> Path | None:
    """A path argument of :class:`Attributor`: a str or Path (None when ``optional``), existing when ``must_exist``."""
    if value is None and optional:
        return None
    if not isinstance(value, (str, Path)) or not str(value).strip():
        raise GradianUserError(
            f"{name} must be a path, got {type(value).__name__} {str(value)[:60]!r}",
            where=f"Attributor.{name}",
            fix=f"pass {what} (a str or pathlib.Path)",
        )
    if must_exist and not Path(value).exists():
        raise GradianUserError(f"{name} not found", where=f"Attributor.{name} ({str(value)[:200]})", fix=f"pass {what}")
    return Path(value)


@dataclass
class Scores:
    """Per-query scores of every training row: what :meth:`Attributor.scores` returns.

    With ``w_t`` the checkpoint weights of the trajectory (row j's own ``W[t, j]`` where the run's visits are
    counted, :mod:`gradian.attribute.visits`: 0 for a row it never trained), ``r_q^t`` the engine's preconditioned
    query gradient and ``g_j^t`` row j's training gradient at checkpoint t
    (:mod:`gradian.attribute.evidence`):

        matrix[q, j] = Σ_t w_t · ⟨r_q^t, g_j^t⟩                        (influence; loss units)
        cosine[q, j] = Σ_t w_t · ⟨r_q^t, g_j^t⟩ / (‖r_q^t‖ ‖g_j^t‖)      (direction only)

    Sign (:mod:`gradian.sign`): positive = row j reinforced query q's target (lowered its loss);
    negative = it degraded it. ``matrix / n`` is the first-order change of the query loss if the row
    were removed.

    Attributes:
        matrix: (m, n) float64 influence, queries × training rows.
        cosine: (m, n) float64 direction-only scores (what the pipeline ranks by, before sentences).
        query_ids: (m,) the queries' ids (a failing item's id, or :meth:`Query.from_text`'s).
        row_ids: (n,) the training rows' ids, in data order.
        engine: the engine's spec as a dict (``name`` and its options).
        queries: the :class:`Query` objects, in ``query_ids`` order.
        checkpoints: the trajectory's checkpoints (step, weight) the scores are summed over.
        visits: how each row's visits weigh them (``rule``, ``never_trained``...; the trajectory's ``visits``).
        sign_convention: :data:`gradian.sign.SIGN_CONVENTION`.
    """

    matrix: np.ndarray
    cosine: np.ndarray
    query_ids: list[str]
    row_ids: list[str]
    engine: dict[str, Any]
    queries: list[Query]
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    visits: dict[str, Any] | None = None
    sign_convention: str = SIGN_CONVENTION

    @property
    def shape(self) -> tuple[int, int]:
        """``(m, n)``."""
        return tuple(self.matrix.shape)  # type: ignore[return-value]

    def row(self, query_id: str) -> np.ndarray:
        """(n,) the scores of every training row for one query.

        Raises:
            UnknownQueryError: (a KeyError and a GradianUserError) no query has this id.
        """
        if isinstance(query_id, str) and query_id in self.query_ids:
            return self.matrix[self.query_ids.index(query_id)]
        shown = ", ".join(map(repr, self.query_ids[:5])) + (", ..." if len(self.query_ids) > 5 else "")
        raise UnknownQueryError(
            f"no query has the id {str(query_id)[:60]!r}",
            where="Scores.row(query_id)",
            fix=f"use one of {shown} (Scores.query_ids), or None for the mean",
        )

    def predicted_loss_delta_if_removed(self) -> np.ndarray:
        """(m, n) ``matrix / n``: the first-order change of each query's loss if the row were removed."""
        return predicted_loss_delta_if_removed(self.matrix, len(self.row_ids))

    def most_harmful(self, query_id: str | None = None, k: int = 10) -> list[tuple[str, float]]:
        """The k rows that degraded ``query_id`` most (None: the mean over all queries), most harmful first.

        Returns:
            ``[(row id, score), ...]``; only rows with a negative score.
        """
        k = check_k(k, "Scores.most_harmful")
        v = self.matrix.mean(axis=0) if query_id is None else self.row(query_id)
        return [(self.row_ids[j], float(v[j])) for j in most_harmful_first(v)[:k] if v[j] < 0]

    def most_helpful(self, query_id: str | None = None, k: int = 10) -> list[tuple[str, float]]:
        """The k rows that reinforced ``query_id`` most (None: the mean), most helpful first (data selection).

        Returns:
            ``[(row id, score), ...]``; only rows with a positive score.
        """
        k = check_k(k, "Scores.most_helpful")
        v = self.matrix.mean(axis=0) if query_id is None else self.row(query_id)
        return [(self.row_ids[j], float(v[j])) for j in most_harmful_first(v)[::-1][:k] if v[j] > 0]

    def to_dict(self) -> dict[str, Any]:
        """JSON form: the matrices as nested lists."""
        return {
            "matrix": self.matrix.tolist(),
            "cosine": self.cosine.tolist(),
            "query_ids": list(self.query_ids),
            "row_ids": list(self.row_ids),
            "engine": dict(self.engine),
            "queries": [q.to_dict() for q in self.queries],
            "checkpoints": list(self.checkpoints),
            "visits": self.visits,
            "sign_convention": self.sign_convention,
        }


class Attributor:
    """One fine-tune to attribute: base + LoRA adapter + the training data it was tuned on.

    Args:
        base: the base model, a local folder or a cached HF id, or a :class:`ModelSpec` (dtype, device...).
        adapter: the PEFT LoRA adapter folder.
        data: the training data (JSONL, or a saved HF dataset folder), in training order.
        spec: the attribution knobs (engines, query kind, ranking...).
        grad: what a stored training gradient is (tokenisation, projection, storage dtype).
        eval_spec: how evaluations are run and judged (default: ``EvalSpec(seed=seed)``).
        checkpoints: the trajectory: ``"auto"`` (``checkpoint-*`` folders beside the adapter),
            ``"final"``, or a list of checkpoint folders.
        reference_adapter: compare against this adapter instead of the base.
        configs, logs: training configs and the trainer log: the configs set the tokenisation (max length, loss
            mask, template) every step uses (:attr:`setup`), and both feed the Audit lane of :meth:`attribute`.
        run_folder: when ``configs`` (``logs``) are not given, read the ones the trainer left beside the adapter
            (:func:`gradian.audit.config.runfolder.find_run_folder`), as ``gradian attribute`` does without
            ``--no-run-folder``; False: Gradian's defaults.
        index_dir: parent folder of the gradient indexes (default: the cache).
        seed, batch_size, shard_size, rows_per_forward: as ``gradian attribute --seed/--batch-size/--shard-size/
            --rows-per-forward``.
    """

    def __init__(
        self,
        base: str | Path | ModelSpec,
        adapter: str | Path,
        data: str | Path,
        spec: AttributeSpec | None = None,
        *,
        grad: GradSpec | None = None,
        eval_spec: EvalSpec | None = None,
        checkpoints: Sequence[str | Path] | str | None = "auto",
        reference_adapter: str | Path | None = None,
        configs: Sequence[str | Path] = (),
        logs: str | Path | None = None,
        run_folder: bool = True,
        index_dir: str | Path | None = None,
        seed: int = 0,
        batch_size: int = 8,
        shard_size: int = 256,
        rows_per_forward: int = 1,
    ) -> None:
        from gradian.attribute.trajectory import checkpoint_selection
        from gradian.evaluate import EvalSpec
        from gradian.validate import check_type

        # every argument is checked here, as the CLI checks its flags before loading anything
        if not isinstance(base, ModelSpec):
            _check_path(base, "base", "a local model folder or a cached HF id", must_exist=False)
        model = base if isinstance(base, ModelSpec) else ModelSpec(str(base))
        _check_path(adapter, "adapter", "the LoRA adapter folder")
        _check_path(data, "data", "the training data")
        for name, v, cls in (
            ("spec", spec, AttributeSpec),
            ("grad", grad, GradSpec),
            ("eval_spec", eval_spec, EvalSpec),
        ):
            if v is not None:
                check_type(v, cls, "Attributor", name)
        if checkpoints is None:  # as resolve_trajectory reads None: the final adapter alone
            checkpoints = "final"
        checkpoints = checkpoint_selection(checkpoints, "Attributor(checkpoints=...)")
        _check_path(reference_adapter, "reference_adapter", "the reference LoRA adapter folder, or None", optional=True)
        if isinstance(configs, (str, Path)) or not isinstance(configs, (list, tuple)):
            raise GradianUserError(
                f"configs must be a list of config files, got {type(configs).__name__}",
                where="Attributor.configs",
                fix="pass a list, e.g. configs=['train.yaml'] (or leave it out)",
            )
        for c in configs:
            _check_path(c, "configs", "training config files")
        _check_path(logs, "logs", "the trainer log (trainer_state.json), or None", optional=True)
        _check_path(
            index_dir, "index_dir", "a folder for the gradient indexes, or None", must_exist=False, optional=True
        )
        self.specs = RunSpecs(
            model=model,
            grad=grad if grad is not None else GradSpec(),
            attribute=spec if spec is not None else AttributeSpec(),
            eval=eval_spec if eval_spec is not None else EvalSpec(seed=seed),
            seed=seed,
            batch_size=batch_size,
            shard_size=shard_size,
            rows_per_forward=rows_per_forward,
        )
        self.adapter = Path(adapter)
        self.data = Path(data)
        self.checkpoints = checkpoints
        self.reference_adapter = Path(reference_adapter) if reference_adapter is not None else None
        self._card = None
        if run_folder:  # what the trainer left beside the adapter, for what was not given
            import warnings

            from gradian.audit.config.runfolder import find_run_folder
            from gradian.errors import GradianWarning

            found = find_run_folder(adapter, configs=not configs, logs=logs is None)
            configs, logs, self._card = found.inputs(configs, logs)  # the card: its trainer's defaults for the setup
            for note in [*found.notes, *([found.setup_note] if found.setup_note else [])]:
                warnings.warn(note, GradianWarning, stacklevel=2)  # a file not used; settings only in a pickle
        self.configs = tuple(Path(c) for c in configs)
        self.logs = Path(logs) if logs is not None else None
        self.index_dir = Path(index_dir) if index_dir is not None else None
        #: the last :meth:`evaluate` result, and the last :meth:`attribute` run (or the one :meth:`from_run` read)
        self.evaluation: EvalResult | None = None
        self.run: Run | None = None
        #: the eval set of the last evaluate() / attribute()
        self.eval_path: Path | None = None
        self._ft: FineTune | None = None
        self._run_ft: FineTune | None = None
        self._setup: TrainingSetup | None = None
        self._examples: list[Example] | None = None
        self._items: list[TokenizedExample] | None = None
        self._index: GradientIndex | None = None
        self.index_reused: bool | None = None

    # ------------------------------------------------------------------ the specs

    @property
    def spec(self) -> AttributeSpec:
        """The attribution spec."""
        return self.specs.attribute

    @property
    def grad(self) -> GradSpec:
        """The gradient spec of the index."""
        return self.specs.grad

    @property
    def model_spec(self) -> ModelSpec:
        """The base model's spec."""
        return self.specs.model

    @classmethod
    def from_run(
        cls,
        run_dir: str | Path,
        *,
        trust_remote_code: bool = False,
        allow_changed_inputs: bool = False,
        device: str | None = None,
    ) -> Attributor:
        """The Attributor of an existing ``gradian attribute`` / ``gradian demo`` run folder.

        Its inputs and specs are read from the manifest of ``RUN_DIR/run.json`` (the paths as the run
        resolved them, the specs as it recorded them), its trajectory and index folder from the
        attribution; :attr:`run` is the run itself, so :meth:`report` works at once and
        :meth:`index` reuses the run's index.

        A run folder is data, never code: run.json is checked against its schema
        (:func:`gradian.attribute.run.check_run`) and its recorded input hashes against the files now
        on disk (:func:`gradian.attribute.changes.check_inputs`) before anything is used, and the base
        model's own code runs only if this call asks for it, whatever run.json says.

        Args:
            trust_remote_code: let transformers run the base folder's code (never read from run.json).
            allow_changed_inputs: accept inputs (data, eval set, adapter, base, configs, checkpoints)
                whose content changed since the run; each change is a :class:`gradian.errors.GradianWarning`.
            device: where to load the model (None: the device the run recorded).

        Raises:
            GradianUserError: run.json is not a valid run, an input is gone, or one changed (unless allowed).
        """
        import warnings

        from gradian.attribute.changes import check_inputs
        from gradian.errors import GradianWarning
        from gradian.evaluate import EvalSpec
        from gradian.runfile import load_run
        from gradian.validate import check_bool

        check_bool(trust_remote_code, "Attributor.from_run", "trust_remote_code")
        check_bool(allow_changed_inputs, "Attributor.from_run", "allow_changed_inputs")
        d = load_run(run_dir, inputs=True)
        check_inputs(
            d,
            allow_changed_inputs=allow_changed_inputs,
            flag="allow_changed_inputs=True",
            say=lambda s: warnings.warn(s, GradianWarning, stacklevel=3),
            checkpoints=True,
            need_eval=False,
        )
        run = Run.from_dict(d)
        if run.manifest is None or not run.manifest.paths:
            raise GradianUserError("the run has no manifest", where=str(run_dir), fix="re-run gradian attribute")
        paths, specs = run.manifest.paths, run.manifest.specs
        ident = run.manifest.identity
        checkpoints: Any = "auto"
        index_dir = None
        if run.attribution is not None:
            traj = (run.attribution.trajectory or {}).get("checkpoints") or []
            earlier = [c["path"] for c in traj if not c.get("final")]
            checkpoints = earlier if earlier else "final"
            root = run.attribution.index.get("root")
            if root and Path(root).is_dir():  # reuse the run's index folder; never create one where run.json says
                index_dir = Path(root).parent
        # what the model is loaded with comes from this call, never from the (shareable) run.json
        model = {**specs["model"], "base": paths["base"], "trust_remote_code": trust_remote_code}
        if device is not None:
            model["device"] = device
        try:
            eval_spec = EvalSpec.from_dict(specs["eval"]) if specs.get("eval") else None
            extra = {"batch_size": eval_spec.batch_size} if eval_spec is not None else {}  # the CLI sets both alike
            att = cls(
                ModelSpec(**model),
                paths["adapter"],
                paths["data"],
                AttributeSpec.from_dict(specs["attribute"]),
                grad=GradSpec.from_dict(specs["grad"]),
                eval_spec=eval_spec,
                checkpoints=checkpoints,
                reference_adapter=ident.get("reference_adapter"),
                configs=paths.get("configs") or (),
                logs=paths.get("logs"),
                run_folder=False,  # the run's own inputs, as it recorded them
                index_dir=index_dir,
                seed=specs.get("seed", 0),
                **extra,
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise GradianUserError(
                f"the run's manifest lacks its inputs or specs ({type(e).__name__}: {e})",
                where=str(run_dir),
                fix="re-run gradian attribute with this version",
            ) from None
        run.run_dir = Path(run_dir) if Path(run_dir).is_dir() else Path(run_dir).parent
        att.run = run
        att.evaluation = run.evaluation
        att.eval_path = Path(paths["eval"]) if paths.get("eval") else None
        return att

    # ------------------------------------------------------------------ lazily loaded, once

    @property
    def finetune(self) -> FineTune:
        """The loaded base + adapter (:class:`gradian.finetune.FineTune`): loaded on first use, then cached."""
        if self._ft is None:
            from gradian.finetune import load_finetune

            self._ft = load_finetune(self.model_spec, self.adapter)
        return self._ft

    @property
    def examples(self) -> list[Example]:
        """The training rows, in data order (read once; no model needed)."""
        if self._examples is None:
            from gradian.data.formats import load_examples

            self._examples = load_examples(self.data)
        return self._examples

    @property
    def row_ids(self) -> list[str]:
        """(n,) the training rows' ids: the columns of every score matrix."""
        return [e.id for e in self.examples]

    @property
    def setup(self) -> TrainingSetup:
        """The run's training setup (:func:`gradian.attribute.run.resolve_run_setup`): from :attr:`configs` (none, and
        a TRL or LLaMA-Factory model card beside the adapter: that trainer's defaults), the chat template saved beside
        the adapter and ``grad.tokenize``'s own fields; resolved once.

        Resolving it sets :attr:`grad`'s tokenisation, so :meth:`index`, :meth:`scores`, :meth:`evaluate` and
        :meth:`attribute` all take the trainer's tokens (and share one index id with ``gradian index`` and
        ``gradian attribute`` on the same inputs).
        """
        if self._setup is None:
            from gradian.attribute.run import resolve_run_setup

            self._setup = resolve_run_setup(self.configs, self.adapter, self.specs, self.examples, card=self._card)
        return self._setup

    def _ft_as_trained(self) -> FineTune:
        """:attr:`finetune` with the run's chat template (:attr:`setup`), as every lane renders rows and prompts."""
        if self._run_ft is None:
            from gradian.attribute.run import apply_template

            self.setup  # noqa: B018 (resolving it sets grad.tokenize, which apply_template reads)
            self._run_ft = apply_template(self.finetune, self.specs)
        return self._run_ft

    def _tokenized(self) -> list[TokenizedExample]:
        if self._items is None:
            from gradian.finetune import tokenize_training_set

            ft = self._ft_as_trained()
            self._items = tokenize_training_set(self.examples, ft.tokenizer, self.grad, self.data)
        return self._items

    # ------------------------------------------------------------------ the steps

    def index(self) -> GradientIndex:
        """The final adapter's training-gradient index: built once (content-addressed), reused afterwards.

        :attr:`index_reused` says whether it was found complete (no gradient computed).
        """
        if self._index is not None:
            return self._index
        from gradian.finetune import training_index

        ft = self._ft_as_trained()
        grad = replace(self.grad, unit="row")
        idx, _, _, reused = training_index(
            ft,
            self.data,
            grad,
            seed=self.specs.seed,
            parent=self.index_dir,
            batch_size=self.specs.batch_size,
            shard_size=self.specs.shard_size,
            examples=self.examples,
            items=self._tokenized(),
        )
        self._index, self.index_reused = idx, reused
        return idx

    def evaluate(self, eval_path: str | Path) -> EvalResult:
        """Evaluate the tuned model against the reference (the base, or ``reference_adapter``) on an eval set.

        Returns:
            the :class:`gradian.evaluate.EvalResult` (also kept as :attr:`evaluation`): per capability
            the delta, its bootstrap CI and the verdict; ``failing_items()`` are what attribution queries.
        """
        from gradian.evaluate import evaluate, load_eval_set

        items = load_eval_set(eval_path)
        ft = self._ft_as_trained()
        self.evaluation = evaluate(
            ft.model, ft.tokenizer, items, reference_adapter=self.reference_adapter, spec=self.specs.eval
        )
        self.eval_path = Path(eval_path)
        return self.evaluation

    def scores(
        self,
        queries: Query | FailingItem | EvalResult | Iterable[Query | FailingItem],
        engine: str | EngineSpec | None = None,
    ) -> Scores:
        """Score every training row for every query: an (m, n) matrix, queries × rows.

        No regression gating: any :class:`Query` is scored (:meth:`Query.from_text` for an arbitrary
        prompt and completion). Failing items (:meth:`gradian.evaluate.EvalResult.failing_items`), or
        an EvalResult for all of its failing items, become the pipeline's own queries
        (contrastive unless ``spec.query`` says cross-entropy, or the metric is loglik).

        The scores are summed over the trajectory (``checkpoints``) with the learning-rate weights,
        each checkpoint with its own index, as :meth:`attribute` does; whole rows (no sentence units).

        Args:
            queries: the queries.
            engine: a registered engine's name (its defaults, or ``spec.engine``'s options when it is the
                same engine) or an engine spec; default: ``spec.engine``.

        Returns:
            :class:`Scores`, under :mod:`gradian.sign` (positive = reinforced).
        """
        from gradian.attribute.evidence import trajectory_scores
        from gradian.attribute.run import counted_trajectory

        qs = self._queries(queries)
        es = self._engine(engine)
        ft = self._ft_as_trained()
        trajectory = counted_trajectory(self.adapter, self.checkpoints, self.configs, self.spec, self._tokenized())
        ev = trajectory_scores(
            ft,
            trajectory,
            self.data,
            self.examples,
            self._tokenized(),
            self.grad,
            {"queries": qs},
            [es],
            unit="row",
            seed=self.specs.seed,
            index_root=self.index_dir,
            batch_size=self.specs.batch_size,
            query_batch_size=self.spec.query_batch_size,
            shard_size=self.specs.shard_size,
            keep_preconditioned=False,  # only the scores are returned
        )
        got = ev.scores["queries"][es.name]
        return Scores(
            matrix=got.raw,
            cosine=got.cosine,
            query_ids=[q.item_id for q in qs],
            row_ids=self.row_ids,
            engine=es.to_dict(),
            queries=qs,
            checkpoints=[{"step": c.step, "final": c.final, "weight": c.weight} for c in trajectory.checkpoints],
            visits=trajectory.to_dict().get("visits"),
        )

    def attribute(self, eval_path: str | Path, out: str | Path = "gradian-run") -> Run | None:
        """The whole pipeline, as ``gradian attribute`` runs it: Evaluate → Attribute (→ Audit).

        Writes ``out/run.json`` and ``out/report.html``. Nothing is attributed when no capability
        regressed beyond noise (``run.stopped`` says so).

        Returns:
            the :class:`Run` (also kept as :attr:`run`; :meth:`report` renders it); None on a torchrun
            rank other than 0 (rank 0 writes and returns the run).
        """
        from gradian.attribute.run import attribute_run
        from gradian.util import atomic_write_text

        inputs = RunInputs(
            self.model_spec.base,
            self.adapter,
            self.data,
            Path(eval_path),
            self.configs,
            self.logs,
            self.reference_adapter,
            checkpoints=self.checkpoints,
        )
        d = attribute_run(
            inputs,
            self.specs,
            out,
            index_root=self.index_dir,
            ft=self.finetune,
            setup=self.setup,
            examples=self.examples,
        )
        if d is None:  # a rank other than 0 under torchrun: rank 0 holds the run
            return None
        run = Run.from_dict(d)
        run.run_dir = Path(out)
        self.run, self.evaluation, self.eval_path = run, run.evaluation, Path(eval_path)
        atomic_write_text(Path(out) / "report.html", self.report("html"))
        return run

    def report(self, fmt: str = "md") -> str:
        """The report of the last :meth:`attribute` run (or of :meth:`from_run`'s).

        Args:
            fmt: ``md``, ``html``, ``json`` or ``text``.
        """
        from gradian.report import build_report, read_training_log, render

        if fmt not in REPORT_FORMATS:
            raise GradianUserError(
                f"unknown report format {fmt!r}",
                where="Attributor.report(fmt)",
                fix=f"use one of {', '.join(REPORT_FORMATS)}",
            )
        if self.run is None:
            raise GradianUserError(
                "no run to report yet",
                where="Attributor.report",
                fix="call attribute(eval_path) first, or use Attributor.from_run(run_dir)",
            )
        d = self.run.to_dict()
        return render(build_report(d, read_training_log(d, self.run.run_dir)), fmt)

    # ------------------------------------------------------------------ helpers

    def _queries(self, queries: Any) -> list[Query]:
        from gradian.evaluate import EvalResult, FailingItem

        if isinstance(queries, EvalResult):
            queries = queries.failing_items()
            if not queries:
                raise GradianUserError(
                    "the evaluation has no failing item in a regressed capability",
                    where="Attributor.scores",
                    fix="pass ev.failing_items(include_undiagnosed=True), or Query.from_text(...) queries",
                )
        elif isinstance(queries, (Query, FailingItem)):
            queries = [queries]
        elif isinstance(queries, (str, bytes, dict)) or not isinstance(queries, Iterable):
            raise GradianUserError(
                f"cannot score a {type(queries).__name__}",
                where="Attributor.scores(queries)",
                fix="pass a Query.from_text(...), a list of queries or failing items, or an EvalResult",
            )
        out: list[Query] = []
        for q in queries:
            if isinstance(q, Query):
                out.append(q)
            elif isinstance(q, FailingItem):
                out.append(failing_item_query(q, self.spec.query))  # type: ignore[arg-type]
            else:
                raise GradianUserError(
                    f"cannot score a {type(q).__name__}",
                    where="Attributor.scores(queries)",
                    fix="pass Query.from_text(...) queries, failing items or an EvalResult",
                )
        if not out:
            raise GradianUserError(
                "no queries to score",
                where="Attributor.scores(queries)",
                fix="pass at least one Query.from_text(...) or failing item",
            )
        ids = [q.item_id for q in out]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise GradianUserError(
                f"query id {dup[0]!r} appears twice",
                where="Attributor.scores(queries)",
                fix="give each query its own id (Query.from_text(..., id=...))",
            )
        return out

    def _engine(self, engine: Any) -> EngineSpec:
        from gradian.engines.base import EngineSpec
        from gradian.engines.registry import engine_names, engine_spec

        if engine is not None and not isinstance(engine, (str, EngineSpec)):
            raise GradianUserError(
                f"engine must be an engine's name or spec, got {type(engine).__name__}",
                where="Attributor.scores(engine)",
                fix=f"use one of {', '.join(engine_names())}, an engine spec, or None for spec.engine",
            )
        if engine is None:
            return self.spec.engine  # type: ignore[return-value]
        if isinstance(engine, EngineSpec):
            AttributeSpec(engine=engine)  # checks it is a registered engine's spec
            return engine
        for es in self.spec.engines:
            if es.name == engine:
                return es
        return engine_spec(engine, "Attributor.scores(engine)")
