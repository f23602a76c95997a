"""One attribution run: Evaluate → Attribute (→ Audit), written as ``RUN_DIR/run.json``.

``run.json`` (schema ``gradian.run/1``) holds the manifest, the evaluation,
the attribution per regressed capability, and the audit when a config or logs
were given. ``gradian report RUN_DIR`` re-renders it without recomputing.

The manifest records every input's content hash and every spec; ``run_id`` is
a hash of those identity fields (timings and paths excluded), so the same
inputs and specs give the same run id, index id and scores.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from gradian.attribute.pipeline import AttributeSpec, CapabilityEvidence, verdict
from gradian.attribute.queries import failing_item_query
from gradian.errors import GradianUserError
from gradian.index.identity import dataset_identity, file_hash, library_versions
from gradian.index.store import GradSpec
from gradian.models.load import ModelSpec
from gradian.sign import SIGN_CONVENTION, sort_most_harmful_first
from gradian.util import atomic_write_json, sha256_json

RUN_SCHEMA = "gradian.run/1"

Progress = Callable[[str, int, int], None]  # (task, advance, total)


@dataclass
class RunInputs:
    """What one run reads.

    The base, the adapter, its training data and the eval set (and, for the Audit lane, training
    configs and logs); ``checkpoints`` selects the trajectory
    (:func:`gradian.attribute.trajectory.resolve_trajectory`).
    """

    base: str
    adapter: Path
    data: Path
    eval: Path
    configs: Sequence[Path] = ()
    logs: Path | None = None
    reference_adapter: Path | None = None
    checkpoints: Sequence[Path] | str | None = "auto"


@dataclass
class RunSpecs:
    """Every spec of one run (the CLI's defaults are these; ``tests/test_api.py`` checks it).

    Attributes:
        model: the base model and how to load it.
        grad: what a stored training gradient is.
        attribute: the attribution knobs.
        eval: the evaluation spec (None: ``EvalSpec(seed=seed)``).
        seed: bootstrap and projection seed.
        batch_size: rows per backward pass when building the index.
        shard_size: rows per index shard.
    """

    model: ModelSpec
    grad: GradSpec = field(default_factory=GradSpec)
    attribute: AttributeSpec = field(default_factory=AttributeSpec)
    eval: Any = None  # gradian.evaluate.EvalSpec
    seed: int = 0
    batch_size: int = 8
    shard_size: int = 256

    def __post_init__(self) -> None:
        from gradian.index.store import check_build_args
        from gradian.validate import check_seed, check_type

        check_type(self.model, ModelSpec, "RunSpecs", "model")
        check_type(self.grad, GradSpec, "RunSpecs", "grad")
        check_type(self.attribute, AttributeSpec, "RunSpecs", "attribute")
        if self.eval is not None:
            from gradian.evaluate import EvalSpec

            check_type(self.eval, EvalSpec, "RunSpecs", "eval")
        check_seed(self.seed, "RunSpecs")
        check_build_args(self.batch_size, self.shard_size)


def _manifest(
    ft,
    inputs: RunInputs,
    specs: RunSpecs,
    index_identity: dict | None,
    index_id: str | None,
    trajectory: dict | None = None,
    setup=None,
) -> dict[str, Any]:
    ident = {
        "base": (index_identity or {}).get("base"),
        "adapter": (index_identity or {}).get("adapter"),
        "dataset": dataset_identity(inputs.data),
        "eval": {
            "name": Path(inputs.eval).name,
            # a file's sha256; a folder's (or an lm-eval samples file's) over its files, lm-eval's samples included
            "sha256": dataset_identity(inputs.eval)["sha256"],
        },
        "configs": {Path(c).name: (file_hash(c) if Path(c).is_file() else None) for c in inputs.configs},
        "logs": file_hash(inputs.logs) if inputs.logs and Path(inputs.logs).is_file() else None,
        "reference_adapter": str(inputs.reference_adapter) if inputs.reference_adapter else None,
        "specs": {
            "model": specs.model.to_dict(),
            "grad": specs.grad.to_dict(),
            "attribute": specs.attribute.to_dict(),
            "eval": specs.eval.to_dict() if specs.eval is not None else None,
            "seed": specs.seed,
        },
        "index_id": index_id,
        "trajectory": trajectory,
        "versions": library_versions(),
    }
    return {
        "run_id": sha256_json(ident)[:16],
        "identity": ident,
        "paths": {
            "base": str(Path(inputs.base).resolve()) if Path(inputs.base).exists() else inputs.base,
            "adapter": str(Path(inputs.adapter).resolve()),
            "data": str(Path(inputs.data).resolve()),
            "eval": str(Path(inputs.eval).resolve()),
            "configs": [str(Path(c).resolve()) for c in inputs.configs],
            "logs": str(Path(inputs.logs).resolve()) if inputs.logs else None,
        },
        "sign_convention": SIGN_CONVENTION,
        # how the trainer turned rows into tokens, each field with its source (not identity: what changes the
        # gradients is already in specs.grad); gradian.data.setup.TrainingSetup.to_dict()
        "training_setup": setup.to_dict() if setup is not None else None,
    }


def resolve_run_setup(inputs: RunInputs, specs: RunSpecs, examples) -> Any:
    """The run's :class:`~gradian.data.setup.TrainingSetup` when the caller did not resolve one (the Python API).

    Resolved as ``gradian attribute --config`` does: from ``inputs.configs`` (none: Gradian's defaults), the
    rows' most common format and the chat template saved beside the adapter. A ``specs.grad.tokenize`` field that
    differs from :class:`TokenizeSpec`'s default counts as given explicitly (it beats the config and is named as the
    source); the others take the config's value. ``specs.grad`` is then set to the setup's tokenisation, so the
    gradients follow the setup.
    """
    import dataclasses

    from gradian.data.setup import adapter_template, examples_format, resolve_setup
    from gradian.data.tokenize import TokenizeSpec

    tok, default = specs.grad.tokenize, TokenizeSpec()
    flags = {k: getattr(tok, k) for k in ("max_length", "loss_on", "add_eos") if getattr(tok, k) != getattr(default, k)}
    fmt, chat = examples_format(examples)
    config = None
    if inputs.configs:
        from gradian.audit.config import load_config

        config = load_config([str(c) for c in inputs.configs])
    setup = resolve_setup(config, fmt, chat=chat, flags=flags, saved_template=adapter_template(inputs.adapter))
    sources = {k: (f"given: GradSpec.tokenize.{k}" if k in flags else v) for k, v in setup.sources.items()}
    setup = dataclasses.replace(setup, sources=sources)
    if tok.chat_template is not None:  # a template given in the spec beats the run's
        setup = dataclasses.replace(
            setup,
            chat_template=tok.chat_template,
            sources={**setup.sources, "chat_template": "given: GradSpec.tokenize.chat_template"},
            unreproduced=tuple(u for u in setup.unreproduced if u != "chat_template"),
            notes=tuple(n for n in setup.notes if not n.startswith("chat_template:")),
        )
    if setup.tokenize_spec() != tok:
        specs.grad = dataclasses.replace(specs.grad, tokenize=setup.tokenize_spec())
    return setup


def _apply_template(ft, specs: RunSpecs):
    """The run's training template (``specs.grad.tokenize.chat_template``) in every lane.

    Dropped from the spec when it is the tokenizer's own (the same tokens, so the index id is the one a run without
    it gets); otherwise kept (it is part of the index's content identity) and ``ft`` gets a tokenizer rendering with
    it, so Evaluate's prompts and the queries are rendered as the run trained (the caller's ``ft`` is not changed).
    """
    import dataclasses

    from gradian.data.tokenize import with_chat_template

    tok = specs.grad.tokenize.for_tokenizer(ft.tokenizer)
    if tok != specs.grad.tokenize:
        specs.grad = dataclasses.replace(specs.grad, tokenize=tok)
    if tok.chat_template is not None:
        ft = dataclasses.replace(ft, tokenizer=with_chat_template(ft.tokenizer, tok.chat_template))
    return ft


def run_audit(inputs: RunInputs, tokenizer_path: str | None) -> dict[str, Any]:
    """The Audit lane on the same inputs: the data and eval checks (contamination D14/D15/D21 read the
    same eval set Evaluate scores) always run; config and
    log checks run when ``--config`` / ``--logs`` were given (the adapter's own
    ``adapter_config.json`` always counts as a config). Checks without their input are skipped.
    """
    from gradian.audit import diagnose

    configs = list(inputs.configs) + [inputs.adapter]
    return diagnose(
        data=inputs.data, eval=inputs.eval, configs=configs, logs=inputs.logs, tokenizer=tokenizer_path
    ).to_dict()


def attribute_run(
    inputs: RunInputs,
    specs: RunSpecs,
    out_dir: str | Path,
    *,
    progress: Progress | None = None,
    index_root: str | Path | None = None,
    ft=None,
    say: Callable[[str], None] | None = None,
    setup=None,
    examples=None,
    budget=None,
    plan_only: bool = False,
    one_pass: bool = False,
) -> dict[str, Any] | None:
    """Run the lanes and write ``out_dir/run.json``. Returns the run dict.

    Under torchrun (:mod:`gradian.distributed`) every rank calls it: rank 0 runs the Audit and
    Evaluate lanes and broadcasts the evaluation; all ranks build and score the gradient indexes
    and share RepSim's pass; rank 0 alone forms the verdict, writes ``run.json`` and returns the
    run, the other ranks return None.

    Args:
        ft: an already loaded :class:`gradian.api.FineTune` (else it is loaded here).
        say: called with one line per index build (its size estimate), before it starts.
        setup: the resolved :class:`gradian.data.setup.TrainingSetup` (the CLI's, flags included), written into
            the manifest; None: resolved here (:func:`resolve_run_setup`, which may set ``specs.grad``'s
            tokenisation from ``inputs.configs``).
        examples: the rows of ``inputs.data`` already loaded (:func:`gradian.data.formats.load_examples`; the CLI
            reads the file once for the setup and the run); None: loaded here.
        budget: the index storage budget (:class:`gradian.index.plan.IndexBudget`; None: the default, with the
            projection chosen by the plan when exact storage does not fit). The plan (:mod:`gradian.index.plan`)
            is made before Evaluate, printed through ``say`` and recorded in ``manifest.plan``.
        plan_only: stop after the plan: return ``{"plan": ...}``, compute and write nothing.
        one_pass: with sentence units, build each fresh checkpoint's row and sentence indexes in one pass per row
            (:mod:`gradian.index.joint`; one process only). Equal to the separate builds to float rounding.
    """
    from gradian import distributed
    from gradian.api import load_finetune
    from gradian.data.formats import load_examples
    from gradian.evaluate import EvalSpec, evaluate, load_eval_set

    main = distributed.current().is_main
    out_dir = Path(out_dir)
    t0 = time.perf_counter()
    timing: dict[str, float] = {}
    specs.eval = specs.eval or EvalSpec(seed=specs.seed)
    # cheap validation first: bad data or eval files fail before a model is loaded
    examples = load_examples(inputs.data) if examples is None else examples
    eval_items = load_eval_set(inputs.eval)
    if setup is None:
        setup = resolve_run_setup(inputs, specs, examples)
    audit = run_audit(inputs, inputs.base if Path(inputs.base).is_dir() else None) if main else None
    timing["audit"] = time.perf_counter() - t0

    t = time.perf_counter()
    if ft is None:
        ft = load_finetune(specs.model, inputs.adapter)
    ft = _apply_template(ft, specs)
    timing["load"] = time.perf_counter() - t

    # the run plan, before any work: every index, its size, the budget (it may choose the projection), the time
    from gradian.api import tokenize_training_set
    from gradian.attribute.trajectory import resolve_trajectory
    from gradian.index.plan import IndexBudget, run_plan

    t = time.perf_counter()
    trajectory = resolve_trajectory(inputs.adapter, inputs.checkpoints, weighting=specs.attribute.weighting)
    items = tokenize_training_set(examples, ft.tokenizer, specs.grad, inputs.data)
    unit_kinds = ("row", "sentence") if specs.attribute.unit == "sentence" else ("row",)
    plan, chosen = run_plan(
        ft,
        inputs.data,
        examples,
        items,
        specs.grad,
        trajectory.checkpoints,
        unit_kinds,
        seed=specs.seed,
        parent=index_root,
        budget=budget if budget is not None else IndexBudget(),
        joint=one_pass and specs.attribute.unit == "sentence" and not distributed.current().enabled,
    )
    dim = distributed.broadcast_object(chosen.projection.dim)  # every rank stores what rank 0 planned
    if dim != specs.grad.projection.dim:
        import dataclasses

        specs.grad = dataclasses.replace(specs.grad, projection=dataclasses.replace(specs.grad.projection, dim=dim))
    if say and main:
        for line in plan.lines():
            say(line)
    timing["plan"] = time.perf_counter() - t
    if plan_only:
        return {"plan": plan.to_dict()} if main else None

    t = time.perf_counter()
    ev = (
        evaluate(
            ft.model,
            ft.tokenizer,
            eval_items,
            reference_adapter=inputs.reference_adapter,
            spec=specs.eval,
            progress=progress,
        )
        if main
        else None
    )
    ev = distributed.broadcast_object(ev)  # the other ranks wait for rank 0's evaluation
    timing["evaluate"] = time.perf_counter() - t

    run: dict[str, Any] = {"schema": RUN_SCHEMA, "evaluation": ev.to_dict(), "audit": audit, "attribution": None}
    regressed = [c.name for c in ev.regressed]
    index_ident = None
    index_id = None
    data_check = None
    if not regressed:
        run["stopped"] = (
            "no capability regressed outside the noise band: nothing to attribute "
            "(a delta whose CI includes zero is reported, not diagnosed)"
        )
    else:
        from gradian.attribute.evidence import trajectory_scores
        from gradian.attribute.references import reference_scores

        t = time.perf_counter()
        spec = specs.attribute
        from gradian.attribute.datacheck import check_data_matches_adapter

        tc = time.perf_counter()  # is this the adapter's training data? (a warning, before the long build)
        data_check = check_data_matches_adapter(ft, inputs.data, items, batch_size=specs.batch_size)
        timing["data_check"] = time.perf_counter() - tc
        queries = {}
        failing_by_cap = {}
        for cap in regressed:
            failing = ev.failing_items(cap)
            qs = [failing_item_query(f, spec.query) for f in failing]
            if qs:
                queries[cap] = qs
                failing_by_cap[cap] = failing
        evidence = trajectory_scores(
            ft,
            trajectory,
            inputs.data,
            examples,
            items,
            specs.grad,
            queries,
            spec.engines,
            unit=spec.unit,
            seed=specs.seed,
            index_root=index_root,
            batch_size=specs.batch_size,
            query_batch_size=spec.query_batch_size,
            progress=progress,
            say=say,
            shard_size=specs.shard_size,
            joint=one_pass,
        )
        timing.update({f"attribute.{k}": v for k, v in evidence.timing.items()})
        idx = evidence.final_index
        index_ident = idx.manifest["identity"]
        index_id = idx.id
        timing["index"] = time.perf_counter() - t
        t = time.perf_counter()
        refs = reference_scores(
            spec.references,
            ft,
            examples,
            items,
            queries,
            specs.grad.tokenize,
            spec,
            {
                "adapter": index_ident["adapter"],
                "base": index_ident["base"],
                "dataset": index_ident["dataset"],
                "tokenize": specs.grad.tokenize.to_dict(),
                "model_dtype": specs.model.dtype,
            },
            batch_size=specs.batch_size,
            progress=progress,
        )
        timing["references"] = time.perf_counter() - t
        if not main:
            return None  # the collective steps are done; rank 0 forms the verdict
        t = time.perf_counter()
        caps = []
        for cap, qs in queries.items():
            cev = CapabilityEvidence(evidence.scores[cap], refs[cap], evidence.units)
            drill = (
                None
                if evidence.units is not None
                else _trajectory_drill(ft, trajectory, evidence, cap, examples, items, spec)
            )
            res = verdict(cev, ft.tokenizer, examples, items, qs, spec, idx, drill)
            d = res.to_dict()
            d["failing_items"] = [f.to_dict() for f in failing_by_cap[cap]]
            caps.append(d)
            if progress:
                progress(f"attribute {cap}", 1, 1)
        timing["attribute"] = time.perf_counter() - t
        traj_info = trajectory.to_dict()
        for c, ix in zip(traj_info["checkpoints"], evidence.indexes):
            c["index"] = {u: v for u, v in ix.items() if u in ("row", "sentence")}
            if ix.get("engines"):  # engines fitted on a model pass (EK-FAC): their factors file and reuse
                c["engines"] = ix["engines"]
        run["attribution"] = {
            "index": {
                "id": idx.id,
                "root": str(idx.root),
                "reused": all(i["row"]["reused"] for i in evidence.indexes),
                "n": idx.n,
                "blocks": len(idx.blocks),
                "dims": sum(int(b["dim"]) for b in idx.blocks),
            },
            "trajectory": traj_info,
            "train_ids": [e.id for e in examples],
            "train_meta": [
                {
                    "format": e.format,
                    "tokens": it.full_length,
                    "truncated": it.truncated,
                    "n_supervised": it.n_supervised,
                }
                for e, it in zip(examples, items)
            ],
            "capabilities": caps,
        }
    if not main:
        return None
    timing["total"] = time.perf_counter() - t0
    if distributed.current().enabled:
        run["distributed"] = {"world_size": distributed.current().world_size, "backend": distributed.current().backend}
    traj = (run.get("attribution") or {}).get("trajectory")
    traj_ident = (
        None
        if traj is None
        else {  # content only: no paths, no reuse flags
            "weight_rule": traj["weight_rule"],
            "checkpoints": [
                {
                    "step": c["step"],
                    "final": c["final"],
                    "weight": c["weight"],
                    "adapter_sha256": c["adapter_sha256"],
                    "index_ids": {u: v["id"] for u, v in c.get("index", {}).items()},
                }
                for c in traj["checkpoints"]
            ],
        }
    )
    run["manifest"] = _manifest(ft, inputs, specs, index_ident, index_id, traj_ident, setup)
    run["manifest"]["notes"] = list(ft.notes)
    if data_check is not None:
        run["manifest"]["data_check"] = data_check.to_dict()
    run["manifest"]["plan"] = plan.to_dict()
    run["timing"] = {k: round(v, 3) for k, v in timing.items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out_dir / "run.json", run)
    from gradian.cache import record_index_use

    record_index_use(run, out_dir)  # `gradian cache` lists each index's source run
    return run


def _trajectory_drill(ft, trajectory, evidence, cap, examples, items, spec):
    """Sentence drill-down over the trajectory when rows are ranked whole: Σ_t w_t · sentence scores at t."""
    from gradian.attribute.drilldown import SentenceScore, drill_down
    from gradian.attribute.queries import projector_for
    from gradian.attribute.trajectory import checkpoint_weights

    idx = evidence.final_index
    proj = projector_for(idx)
    block_names = [b["name"] for b in idx.blocks]

    def drill(j: int, qi: int) -> list[SentenceScore]:
        total: dict[tuple[int, int], SentenceScore] = {}
        for ck, pre in zip(trajectory.checkpoints, evidence.preconditioned):
            r_q = {k: v[qi] for k, v in pre[spec.engine.name][cap].items()}
            with checkpoint_weights(ft.model, ck):
                sents = drill_down(ft.model, ft.tokenizer, examples[j], items[j], r_q, proj, block_names, idx.modules)
            for s in sents:
                key = (s.char_start, s.char_end)
                acc = total.setdefault(key, SentenceScore(s.char_start, s.char_end, s.text, 0.0, 0.0, s.n_tokens))
                acc.score += ck.weight * s.score
                acc.share += ck.weight * s.share
        return sort_most_harmful_first(total.values(), lambda s: s.score)

    return drill


# ----------------------------------------------------------------------------- run.json's schema


def _run_json_schema() -> dict[str, Any]:
    """:data:`RUN_JSON_SCHEMA`, built once (the evaluation's part is Evaluate's own schema)."""
    from gradian.evaluate.result import RESULT_JSON_SCHEMA
    from gradian.schema import BOOLEAN, INTEGER, NUMBER, OBJECT, STRING, arr, closed, finite, nullable, obj

    def some(props: dict[str, Any], *required: str, null: bool = False) -> dict[str, Any]:
        """An object with these properties, of which only ``required`` must be there (others may be)."""
        return {"type": ["object", "null"] if null else "object", "required": list(required), "properties": props}

    def mapping(values: dict[str, Any]) -> dict[str, Any]:
        return {"type": "object", "additionalProperties": values}

    scores = finite(arr(NUMBER))
    sha = nullable(STRING)
    row = some({"id": STRING, "score": NUMBER}, "id")
    span = {"type": ["array", "null"], "items": INTEGER}
    identity = obj(
        {
            "base": some({"name": STRING, "sha256": STRING, "files": {"type": "null"}}, "name", null=True),
            "adapter": some({"sha256": STRING}, "sha256", null=True),
            "dataset": obj({"name": STRING, "sha256": STRING}),
            "eval": obj({"name": STRING, "sha256": STRING}),
            "configs": mapping(sha),
            "logs": sha,
            "reference_adapter": nullable(STRING),
            "specs": obj(
                {
                    "model": OBJECT,  # each spec is checked against its dataclass (_spec_problem)
                    "grad": OBJECT,
                    "attribute": OBJECT,
                    "eval": nullable(OBJECT),
                    "seed": INTEGER,
                }
            ),
            "index_id": nullable(STRING),
            "trajectory": nullable(OBJECT),
            "versions": mapping(STRING),
        }
    )
    paths = obj(
        {
            "base": STRING,
            "adapter": STRING,
            "data": STRING,
            "eval": STRING,
            "configs": arr(STRING),
            "logs": nullable(STRING),
        }
    )
    checkpoint = some(
        {
            "step": nullable(INTEGER),
            "final": BOOLEAN,
            "weight": finite(NUMBER),
            "adapter_sha256": STRING,
            "path": STRING,
            "optimizer": nullable(STRING),
            "index": OBJECT,
            "engines": OBJECT,
        },
        "final",
        "weight",
        "path",
    )
    capability = some(
        {
            "capability": STRING,
            "engine": STRING,
            "n_train": {"type": "integer", "minimum": 0},
            "scores": scores,
            "rank_scores": scores,
            "verdict_scores": {**scores, "type": ["array", "null"]},
            "second_scores": {**scores, "type": ["array", "null"]},
            "queries": arr(  # and each against Query's fields (_record_problem)
                some(
                    {
                        "item_id": STRING,
                        "capability": STRING,
                        "prompt": RESULT_JSON_SCHEMA["properties"]["items"]["items"]["properties"]["prompt"],
                        "correct": STRING,
                        "said": nullable(STRING),
                        "kind": {"enum": ["contrastive", "cross_entropy"]},
                        "correct_rule": STRING,
                    }
                )
            ),
            "ranked": arr(some({"id": STRING, "rank": INTEGER, "score": NUMBER}, "id")),
            "ranking": OBJECT,
            "agreement": some({"engines": arr(STRING)}, "engines", null=True),
            "evidence": mapping(some({"engine": STRING, "scores": scores}, "scores")),
            "clusters": arr(
                some(
                    {
                        "label": INTEGER,
                        "size": INTEGER,
                        "harmful_share": finite(NUMBER),
                        "score": finite(NUMBER),
                        "row_ids": arr(STRING),
                        "exemplars": arr(OBJECT),
                        "common": OBJECT,
                    },
                    "label",
                    "row_ids",
                )
            ),
            "drilldown": arr(
                some(
                    {
                        "id": STRING,
                        "sentences": arr(
                            some(
                                {
                                    "char_start": INTEGER,
                                    "char_end": INTEGER,
                                    "text": STRING,
                                    "score": finite(NUMBER),
                                    "share": finite(NUMBER),
                                    "n_tokens": INTEGER,
                                },
                                "char_start",
                                "char_end",
                                "text",
                                "score",
                            )
                        ),
                    },
                    "id",
                )
            ),
            "per_item_top": mapping(arr(row)),
            "row_sentences": {"type": ["array", "null"], "items": span},
            "failing_items": closed(RESULT_JSON_SCHEMA["properties"]["failing_items"]),
        },
        "capability",
        "engine",
        "n_train",
        "scores",
        "rank_scores",
        "queries",
        "ranked",
        "clusters",
        "failing_items",
    )
    attribution = some(
        {
            "index": some(
                {"id": STRING, "root": STRING, "reused": BOOLEAN, "n": INTEGER, "blocks": INTEGER, "dims": INTEGER}
            ),
            "trajectory": some({"weight_rule": STRING, "checkpoints": arr(checkpoint)}, "checkpoints", null=True),
            "train_ids": arr(STRING),
            "train_meta": arr(OBJECT),
            "capabilities": arr(capability),
        },
        "index",
        "train_ids",
        "capabilities",
        null=True,
    )
    audit = some(
        {
            "counts": mapping(INTEGER),
            "findings": arr(some({"id": STRING, "steps": arr(INTEGER), "row_ids": arr(STRING)})),
            "skipped": arr(OBJECT),
            "passed": arr(STRING),
        },
        null=True,
    )
    setup_value = {"type": ["string", "integer", "boolean", "null"]}
    training_setup = obj(
        {
            "values": mapping(obj({"value": setup_value, "from": nullable(STRING)})),
            "unreproduced": arr(STRING),
            "warnings": arr(STRING),
            "notes": arr(STRING),
        },
        nullable=True,
    )
    verification = some(
        {
            "capabilities": mapping(some({"verified": BOOLEAN, "line": STRING, "retrains": OBJECT})),
            "retrains": mapping(OBJECT),
            "spec": OBJECT,
        },
        null=True,
    )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": RUN_SCHEMA,
        **some(
            {
                "schema": {"const": RUN_SCHEMA},
                "evaluation": closed(RESULT_JSON_SCHEMA),  # EvalResult.from_dict builds each part with cls(**d)
                "attribution": attribution,
                "audit": audit,
                "manifest": some(
                    {
                        "run_id": STRING,
                        "identity": identity,
                        "paths": paths,
                        "sign_convention": STRING,
                        "notes": arr(STRING),
                        "training_setup": training_setup,  # absent in runs written before it was recorded
                    },
                    "run_id",
                    "identity",
                    "paths",
                    "sign_convention",
                    "notes",
                ),
                "timing": mapping(NUMBER),
                "stopped": nullable(STRING),
                "verification": verification,
                "distributed": OBJECT,
            },
            "schema",
            "evaluation",
            "manifest",
        ),
    }


_SCHEMA_CACHE: dict[str, Any] = {}


def run_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12 subset, :mod:`gradian.schema`) of ``run.json`` (``gradian.run/1``).

    Every section the writer (:func:`attribute_run`, ``gradian verify``) always writes is required;
    keys it does not know are allowed in the records (:class:`Run` keeps them in ``extra``), never in
    a spec (a spec is checked against its dataclass). Score lists must hold finite numbers.
    """
    if not _SCHEMA_CACHE:
        from gradian.attribute.datacheck import DATA_CHECK_SCHEMA

        schema = _run_json_schema()
        schema["properties"]["manifest"]["properties"]["data_check"] = DATA_CHECK_SCHEMA  # optional: not required
        _SCHEMA_CACHE["run"] = schema
    return _SCHEMA_CACHE["run"]


def _spec_readers() -> dict[str, tuple[type, Callable[[dict], Any]]]:
    from gradian.attribute.pipeline import AttributeSpec
    from gradian.evaluate import EvalSpec

    return {
        "model": (ModelSpec, lambda d: ModelSpec(**d)),
        "grad": (GradSpec, GradSpec.from_dict),
        "attribute": (AttributeSpec, AttributeSpec.from_dict),
        "eval": (EvalSpec, EvalSpec.from_dict),
    }


def _unknown_key(d: Any, cls: type, path: str) -> str | None:
    """The first key of ``d`` that is not a field of the dataclass ``cls`` (nested spec dataclasses too)."""
    import dataclasses
    import typing

    if not isinstance(d, dict) or not dataclasses.is_dataclass(cls):
        return None
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # an annotation this Python cannot resolve: check the names only
        hints = {}
    names = {f.name for f in dataclasses.fields(cls)}
    for k, v in d.items():
        if k not in names:
            return f"{path}.{k}: unknown field"
        sub = hints.get(k)
        if isinstance(sub, type) and dataclasses.is_dataclass(sub):
            p = _unknown_key(v, sub, f"{path}.{k}")
            if p:
                return p
    return None


def _round_trip_unknown(d: Any, rt: Any, path: str) -> str | None:
    """A key of ``d`` that reading it as a spec dropped (``rt``: the spec's ``to_dict()``)."""
    if not isinstance(d, dict) or not isinstance(rt, dict):
        return None
    for k, v in d.items():
        if k not in rt:
            return f"{path}.{k}: unknown field"
        p = _round_trip_unknown(v, rt[k], f"{path}.{k}")
        if p:
            return p
    return None


def _spec_problem(name: str, d: Any, path: str) -> str | None:
    """Whether ``d`` reads as the ``name`` spec: no unknown field, every value accepted by the spec's own checks."""
    cls, read = _spec_readers()[name]
    p = _unknown_key(d, cls, path)
    if p:
        return p
    try:
        spec = read(d)
    except GradianUserError as e:  # the spec's own check, e.g. "ModelSpec.dtype: must be one of ..."
        return f"{path}: {e.what}" + (f" ({e.where})" if e.where else "")
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        return f"{path}: cannot be read ({type(e).__name__}: {str(e)[:120]})"
    p = _round_trip_unknown(d, spec.to_dict(), path)
    if p:
        return p
    if name == "model" and spec.gguf_file is not None and Path(spec.gguf_file).name != spec.gguf_file:
        return f"{path}.gguf_file: is {spec.gguf_file[:40]!r}, expected a file name inside the base folder"
    return None


def _record_problem(
    d: dict[str, Any], cls: type, path: str, derived: tuple[str, ...] = (), missing: bool = True
) -> str | None:
    """A key of ``d`` that the dataclass ``cls`` (which verify builds from it) has no field for, or a missing one."""
    import dataclasses

    fields = dataclasses.fields(cls)
    names = {f.name for f in fields}
    for k in d:
        if k not in names and k not in derived:
            return f"{path}.{k}: unknown field"
    for f in fields if missing else ():
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in d:
            return f"{path}.{f.name}: missing"
    return None


def _finite(x: Any) -> bool:
    import math

    return not isinstance(x, float) or math.isfinite(x)


def _cross_problem(run: dict[str, Any], inputs: bool) -> str | None:
    """What the schema cannot say: lengths that must agree, ids that must point into lists, specs that must read."""
    from gradian.attribute.queries import Query
    from gradian.evaluate import FailingItem

    man = run.get("manifest") or {}
    specs = (man.get("identity") or {}).get("specs") or {}
    for name in ("model", "grad", "attribute", "eval"):
        if specs.get(name) is not None:
            p = _spec_problem(name, specs[name], f"manifest.identity.specs.{name}")
            if p:
                return p
    ev = run.get("evaluation") or {}
    if isinstance(ev.get("spec"), dict):
        p = _spec_problem("eval", ev["spec"], "evaluation.spec")
        if p:
            return p
    items = ev.get("items")
    item_ids = [it.get("id") for it in items or []]
    if len(set(item_ids)) != len(item_ids):
        return "evaluation.items: an item id appears twice"
    for i, c in enumerate(ev.get("capabilities") or []):
        for k in ("reference_score", "tuned_score", "delta", "ci_low", "ci_high"):
            if not _finite(c.get(k)):
                return f"evaluation.capabilities[{i}].{k}: is {c.get(k)}, expected a finite number"
    for i, it in enumerate(items or []):
        for side in ("reference", "tuned"):
            if not _finite((it.get(side) or {}).get("score")):
                return f"evaluation.items[{i}].{side}.score: is {it[side]['score']}, expected a finite number"
    if items is not None:
        known = set(item_ids)
        for i, f in enumerate(ev.get("failing_items") or []):
            if f.get("id") not in known:
                return f"evaluation.failing_items[{i}].id: {str(f.get('id'))[:40]!r} is not an item of evaluation.items"
    att = run.get("attribution")
    if not att:
        return None
    ids = att.get("train_ids") or []
    if len(set(ids)) != len(ids):
        return "attribution.train_ids: a row id appears twice"
    n, known = len(ids), set(ids)
    meta = att.get("train_meta")
    if meta and len(meta) != n:
        return f"attribution.train_meta: has {len(meta)} entries for {n} train_ids"
    ev_caps = {c.get("name") for c in ev.get("capabilities") or []}
    seen: set[str] = set()
    for i, cap in enumerate(att.get("capabilities") or []):
        at = f"attribution.capabilities[{i}]"
        name = cap.get("capability")
        if name in seen:
            return f"{at}.capability: {name!r} appears twice"
        seen.add(name)
        if ev.get("capabilities") is not None and name not in ev_caps:
            return f"{at}.capability: {str(name)[:40]!r} is not a capability of evaluation.capabilities"
        if "n_train" in cap and cap["n_train"] != n:
            return f"{at}.n_train: is {cap['n_train']}, but attribution.train_ids has {n} rows"
        lists = [(k, cap.get(k)) for k in ("scores", "rank_scores", "verdict_scores", "second_scores", "row_sentences")]
        lists += [(f"evidence.{k}.scores", (v or {}).get("scores")) for k, v in (cap.get("evidence") or {}).items()]
        for k, v in lists:
            if v is not None and len(v) != n and not (k == "rank_scores" and not v):
                return f"{at}.{k}: has {len(v)} entries for {n} train_ids"
        for j, r in enumerate(cap.get("ranked") or []):
            if r.get("id") not in known:
                return f"{at}.ranked[{j}].id: {str(r.get('id'))[:40]!r} is not a row of attribution.train_ids"
        labels = set()
        for j, c in enumerate(cap.get("clusters") or []):
            if c.get("label") in labels:
                return f"{at}.clusters[{j}].label: {c.get('label')} appears twice"
            labels.add(c.get("label"))
            for r in c.get("row_ids") or []:
                if r not in known:
                    return f"{at}.clusters[{j}].row_ids: {str(r)[:40]!r} is not a row of attribution.train_ids"
        for j, d in enumerate(cap.get("drilldown") or []):
            if d.get("id") not in known:
                return f"{at}.drilldown[{j}].id: {str(d.get('id'))[:40]!r} is not a row of attribution.train_ids"
        for q, rows in (cap.get("per_item_top") or {}).items():
            for r in rows:
                if r.get("id") not in known:
                    return f"{at}.per_item_top.{q}: {str(r.get('id'))[:40]!r} is not a row of attribution.train_ids"
        for j, q in enumerate(cap.get("queries") or []):
            p = _record_problem(q, Query, f"{at}.queries[{j}]", missing=inputs)
            if p:
                return p
        for j, f in enumerate(cap.get("failing_items") or []):
            p = _record_problem(f, FailingItem, f"{at}.failing_items[{j}]", derived=("chat",), missing=inputs)
            if p:
                return p
    return None


def _whole_evaluation(ev: Any) -> Any:
    """``ev`` if it is a whole ``gradian.evaluate/1`` result (what :class:`gradian.evaluate.EvalResult` reads)."""
    from gradian.schema import problem

    p = problem(ev, run_json_schema()["properties"]["evaluation"], "evaluation")
    if p:
        raise GradianUserError(
            p, where="run.json", fix="restore the run.json `gradian attribute` wrote (or re-run gradian attribute)"
        )
    return ev


def check_run(run: Any, where: str = "run.json", *, inputs: bool = False) -> None:
    """Check a run dict against :func:`run_json_schema` and its cross-references; a one-line user error if not.

    Every reader of a run.json calls this first (:func:`load_run`, :meth:`Run.from_dict`, ``gradian report``,
    ``gradian verify``, :meth:`gradian.attributor.Attributor.from_run`), so a tampered or damaged file is one
    line naming the field (``run.json: manifest.identity.specs.model.bogus: unknown field (fix: ...)``),
    never a traceback, a NaN verdict or a row outside the run.

    Args:
        where: the file, for the message.
        inputs: also require every section the run's inputs are read back from (the manifest's paths,
            identity and specs, the full evaluation): what ``verify`` and ``from_run`` need. Without it
            (the report), only what is there is checked.
    """
    from gradian.schema import problem

    if not isinstance(run, dict) or run.get("schema") != RUN_SCHEMA:
        raise GradianUserError(
            f"not a {RUN_SCHEMA} file", where=where, fix="pass a run folder written by `gradian attribute`"
        )
    p = problem(run, run_json_schema(), partial=not inputs) or _cross_problem(run, inputs)
    if p:
        raise GradianUserError(
            p,
            where=where,
            fix="restore the run.json `gradian attribute` wrote (or re-run gradian attribute); never edit it by hand",
        )


def load_run(run_dir: str | Path, *, inputs: bool = False) -> dict[str, Any]:
    """Read ``RUN_DIR/run.json`` and check it (:func:`check_run`): a user error if missing, malformed or tampered.

    Args:
        inputs: also require what the run's inputs are read back from (``verify``, ``from_run``).
    """
    p = Path(run_dir) / "run.json" if Path(run_dir).is_dir() else Path(run_dir)
    if not p.exists():
        raise GradianUserError(
            "no run.json here", where=str(run_dir), fix="pass the folder `gradian attribute --out` wrote"
        )
    from gradian.safeio import load_json_file

    run = load_json_file(p, "run file", fix="re-run gradian attribute")
    check_run(run, str(p), inputs=inputs)
    return run


# ----------------------------------------------------------------------------- the typed run


def _record_fields(cls: type) -> list[str]:
    from dataclasses import fields

    return [f.name for f in fields(cls) if f.name not in ("extra", "keys", "run_dir")]


def _read_record(cls: type, d: dict[str, Any], convert: dict[str, Callable[[Any], Any]] | None = None):
    """``cls(**typed fields of d, extra=the other keys, keys=d's key order)``; a missing key keeps its default."""
    if not isinstance(d, dict):
        raise GradianUserError(
            f"{cls.__name__} must be read from a JSON object, got {type(d).__name__}",
            where="run.json",
            fix="pass a run folder written by `gradian attribute`",
        )
    names = _record_fields(cls)
    convert = convert or {}
    kw = {k: (convert[k](d[k]) if k in convert and d[k] is not None else d[k]) for k in names if k in d}
    return cls(**kw, extra={k: v for k, v in d.items() if k not in names}, keys=tuple(d))


def _write_record(obj: Any, convert: dict[str, Callable[[Any], Any]] | None = None) -> dict[str, Any]:
    """The inverse of :func:`_read_record`: the keys it was read with, in their order (all fields when built here)."""
    convert = convert or {}
    names = _record_fields(type(obj))
    keys = obj.keys if obj.keys is not None else (*names, *obj.extra)
    out: dict[str, Any] = {}
    for k in keys:
        if k in names:
            v = getattr(obj, k)
            out[k] = convert[k](v) if k in convert and v is not None else v
        else:
            out[k] = obj.extra[k]
    return out


@dataclass
class Manifest:
    """``run.json`` ``manifest``: what the run was computed from (module docstring).

    Attributes:
        run_id: hash of ``identity`` (the same inputs and specs give the same id).
        identity: every input's content hash and every spec (``identity["specs"]``: model, grad,
            attribute, eval, seed), the index id and the trajectory.
        paths: where the inputs were (base, adapter, data, eval, configs, logs).
        sign_convention: :data:`gradian.sign.SIGN_CONVENTION`.
        notes: remarks made while loading the model and adapter.
        extra: any other key, kept as read.
        keys: the key order it was read with (None: built here).
    """

    run_id: str = ""
    identity: dict[str, Any] = field(default_factory=dict)
    paths: dict[str, Any] = field(default_factory=dict)
    sign_convention: str = SIGN_CONVENTION
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] | None = None

    @property
    def specs(self) -> dict[str, Any]:
        """``identity["specs"]``: the model, grad, attribute and eval specs as dicts, and the seed."""
        return dict(self.identity.get("specs") or {})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Manifest:
        """Read this part of run.json (keys not typed here are kept in ``extra``)."""
        return _read_record(cls, d)

    def to_dict(self) -> dict[str, Any]:
        """This part of run.json, as it was read (:meth:`from_dict` inverts it)."""
        return _write_record(self)


@dataclass
class CapabilityRun:
    """``run.json`` ``attribution.capabilities[*]``: one regressed capability's verdict.

    The fields are :class:`gradian.attribute.pipeline.CapabilityAttribution`'s (as JSON), plus the
    failing items it was computed from. Scores follow :mod:`gradian.sign` (negative = degraded).

    Attributes:
        capability: the capability's name.
        engine: the primary gradient engine.
        n_train: n, the training rows.
        scores: (n,) the primary engine's influence per row (``predicted_loss_delta_if_removed = score / n``).
        rank_scores: (n,) the verdict's rank score per row (what orders ``ranked``).
        verdict_scores: (n,) the rank scores on the verdict's one scale (:func:`gradian.sign.verdict_scores`),
            or None (a run written before it was recorded).
        second_scores: (n,) the second engine's rank score, or None.
        queries: the queries, one per failing item (:class:`gradian.attribute.queries.Query` as dicts).
        ranked: the top-k most harmful rows, most harmful first.
        ranking: how ``rank_scores`` was formed.
        agreement: the two gradient engines' agreement, or None.
        evidence: per evidence kind, its (n,) scores and agreement with the verdict.
        clusters: the harmful tail's clusters.
        drilldown: sentence scores of the most harmful rows.
        per_item_top: per failing item, its 5 most harmful rows.
        row_sentences: per row, the ``[char_start, char_end]`` its verdict blames, or None.
        failing_items: the evaluation's failing items of this capability.
    """

    capability: str = ""
    engine: str = ""
    n_train: int = 0
    scores: list[float] = field(default_factory=list)
    rank_scores: list[float] = field(default_factory=list)
    verdict_scores: list[float] | None = None
    second_scores: list[float] | None = None
    queries: list[dict[str, Any]] = field(default_factory=list)
    ranked: list[dict[str, Any]] = field(default_factory=list)
    ranking: dict[str, Any] = field(default_factory=dict)
    agreement: dict[str, Any] | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    clusters: list[dict[str, Any]] = field(default_factory=list)
    drilldown: list[dict[str, Any]] = field(default_factory=list)
    per_item_top: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    row_sentences: list[list[int] | None] | None = None
    failing_items: list[Any] = field(default_factory=list)  # list[gradian.evaluate.FailingItem]
    extra: dict[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CapabilityRun:
        """Read this part of run.json (keys not typed here are kept in ``extra``)."""
        return _read_record(cls, d, {"failing_items": lambda fs: [_failing_item(f) for f in fs]})

    def to_dict(self) -> dict[str, Any]:
        """This part of run.json, as it was read (:meth:`from_dict` inverts it)."""
        return _write_record(self, {"failing_items": lambda fs: [f.to_dict() for f in fs]})


def _failing_item(d: dict[str, Any]):
    from gradian.evaluate import FailingItem

    return FailingItem(**{k: v for k, v in d.items() if k != "chat"})  # ``chat`` is derived from the prompt


@dataclass
class Attribution:
    """``run.json`` ``attribution``: the index, the trajectory and every regressed capability's verdict.

    Attributes:
        index: the final checkpoint's row index: ``id``, ``root``, ``reused``, ``n``, ``blocks``, ``dims``.
        trajectory: the checkpoints scored over, their weights and indexes.
        train_ids: (n,) the training rows' ids, in index order (the columns of every score list).
        train_meta: (n,) per row its format, tokens, truncation and supervised tokens.
        capabilities: per regressed capability, its verdict.
    """

    index: dict[str, Any] = field(default_factory=dict)
    trajectory: dict[str, Any] | None = None
    train_ids: list[str] = field(default_factory=list)
    train_meta: list[dict[str, Any]] = field(default_factory=list)
    capabilities: list[CapabilityRun] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] | None = None

    def capability(self, name: str) -> CapabilityRun:
        """The verdict of capability ``name`` (KeyError if it was not attributed)."""
        for c in self.capabilities:
            if c.capability == name:
                return c
        raise KeyError(name)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Attribution:
        """Read this part of run.json (keys not typed here are kept in ``extra``)."""
        return _read_record(cls, d, {"capabilities": lambda cs: [CapabilityRun.from_dict(c) for c in cs]})

    def to_dict(self) -> dict[str, Any]:
        """This part of run.json, as it was read (:meth:`from_dict` inverts it)."""
        return _write_record(self, {"capabilities": lambda cs: [c.to_dict() for c in cs]})


@dataclass
class AuditSummary:
    """``run.json`` ``audit``: the Audit lane's report (``gradian.audit.Report.to_dict()``).

    Attributes:
        counts: findings per severity, and checks skipped / passed / registered.
        findings: the findings, what to fix first first (each: ``id``, ``severity``, ``message``, ``row_ids`` ...).
        skipped: checks that did not run, with the reason.
        passed: ids of the checks that ran and found nothing.
    """

    counts: dict[str, int] = field(default_factory=dict)
    findings: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AuditSummary:
        """Read this part of run.json (keys not typed here are kept in ``extra``)."""
        return _read_record(cls, d)

    def to_dict(self) -> dict[str, Any]:
        """This part of run.json, as it was read (:meth:`from_dict` inverts it)."""
        return _write_record(self)


@dataclass
class Verification:
    """``run.json`` ``verification`` (written by ``gradian verify``): the retrains and what they measured.

    Attributes:
        capabilities: per capability, ``verified``, its one-line summary and the retrains' numbers.
        retrains: per retrain, its adapter and whether it was reused.
        spec: the :class:`gradian.verify.run.VerifySpec` as a dict.
    """

    capabilities: dict[str, dict[str, Any]] = field(default_factory=dict)
    retrains: dict[str, dict[str, Any]] = field(default_factory=dict)
    spec: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Verification:
        """Read this part of run.json (keys not typed here are kept in ``extra``)."""
        return _read_record(cls, d)

    def to_dict(self) -> dict[str, Any]:
        """This part of run.json, as it was read (:meth:`from_dict` inverts it)."""
        return _write_record(self)


@dataclass
class Run:
    """One attribution run, typed: ``run.json`` (schema ``gradian.run/1``) read back.

    ``Run.from_dict(d).to_dict() == d`` for every run.json: keys this class does not type are
    kept in ``extra`` (and in each part's own ``extra``), in their order. The report reads the dict
    (:meth:`to_dict`).

    Attributes:
        evaluation: the Evaluate lane's :class:`gradian.evaluate.EvalResult`.
        attribution: the verdict per regressed capability, or None (nothing regressed).
        audit: the Audit lane's report, or None.
        manifest: inputs, specs and the run id.
        timing: seconds per stage.
        stopped: why the run stopped after Evaluate, or None.
        verification: the retrain check, once ``gradian verify`` has run; else None.
        run_dir: the folder it was read from or written to (not part of run.json).
    """

    evaluation: Any = None  # gradian.evaluate.EvalResult
    attribution: Attribution | None = None
    audit: AuditSummary | None = None
    manifest: Manifest | None = None
    timing: dict[str, float] = field(default_factory=dict)
    stopped: str | None = None
    verification: Verification | None = None
    schema: str = RUN_SCHEMA
    extra: dict[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] | None = None
    run_dir: Path | None = field(default=None, compare=False)

    @property
    def run_id(self) -> str | None:
        """The manifest's run id."""
        return self.manifest.run_id if self.manifest is not None else None

    @property
    def capabilities(self) -> list[CapabilityRun]:
        """The attributed capabilities (empty when nothing regressed)."""
        return list(self.attribution.capabilities) if self.attribution is not None else []

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Run:
        """Read a run dict (``json.load`` of run.json); a user error if it is not a valid ``gradian.run/1`` run
        (:func:`check_run`).
        """
        from gradian.evaluate import EvalResult

        check_run(d)
        return _read_record(
            cls,
            d,
            {
                "evaluation": lambda e: EvalResult.from_dict(_whole_evaluation(e)),
                "attribution": Attribution.from_dict,
                "audit": AuditSummary.from_dict,
                "manifest": Manifest.from_dict,
                "verification": Verification.from_dict,
            },
        )

    def to_dict(self) -> dict[str, Any]:
        """The run.json dict (what the report reads)."""
        return _write_record(
            self,
            {k: (lambda v: v.to_dict()) for k in ("evaluation", "attribution", "audit", "manifest", "verification")},
        )

    @classmethod
    def load(cls, run_dir: str | Path) -> Run:
        """Read ``RUN_DIR/run.json`` (:func:`load_run`)."""
        run = cls.from_dict(load_run(run_dir))
        run.run_dir = Path(run_dir) if Path(run_dir).is_dir() else Path(run_dir).parent
        return run


# ----------------------------------------------------------------------------- the inputs, read back


def _eval_sha(path: Path) -> str:
    return dataset_identity(path)["sha256"]  # the hash the run recorded (lm-eval's samples files included)


def changed_inputs(run: dict[str, Any], *, checkpoints: bool = False, need_eval: bool = True) -> list[tuple[str, str]]:
    """The run's inputs whose content on disk is not what the run recorded: ``[(what, path), ...]``.

    Compares ``manifest.identity`` (the hashes :func:`attribute_run` recorded: the training data, the eval
    set, the adapter, the base model, the training configs and, with ``checkpoints``, every trajectory
    checkpoint) with the files now at ``manifest.paths``, hashed the way the index hashes them
    (:mod:`gradian.index.identity`, memoised by path, size and mtime: an unchanged file is read once).
    An input the run did not record a hash for is not compared.

    Raises:
        GradianUserError: an input the run needs is gone (``need_eval``: the eval set counts).
    """
    from gradian.index.identity import adapter_identity, model_identity

    man = run["manifest"]
    ident, paths = man["identity"], man["paths"]
    gone = [("training data", paths["data"]), ("adapter", paths["adapter"])]
    if need_eval:
        gone.append(("eval set", paths["eval"]))
    for what, p in gone:
        if not Path(p).exists():
            raise GradianUserError(
                f"the run's {what} is gone", where=str(p), fix="restore it, or re-run gradian attribute"
            )
    out: list[tuple[str, str]] = []
    if dataset_identity(paths["data"])["sha256"] != ident["dataset"]["sha256"]:
        out.append(("training data", paths["data"]))
    if Path(paths["eval"]).exists() and _eval_sha(Path(paths["eval"])) != ident["eval"]["sha256"]:
        out.append(("eval set", paths["eval"]))
    if ident.get("adapter") and adapter_identity(paths["adapter"])["sha256"] != ident["adapter"]["sha256"]:
        out.append(("adapter", paths["adapter"]))
    if (ident.get("base") or {}).get("sha256") and model_identity(paths["base"]).get("sha256") != ident["base"][
        "sha256"
    ]:
        out.append(("base model", paths["base"]))
    for c in paths.get("configs") or []:
        want = (ident.get("configs") or {}).get(Path(c).name)
        if want and Path(c).is_file() and file_hash(c) != want:
            out.append(("training config", c))
    traj = (run.get("attribution") or {}).get("trajectory") or {}
    for c in traj.get("checkpoints") or [] if checkpoints else []:
        if c.get("adapter_sha256") and not c.get("final"):
            if not Path(c["path"]).is_dir() or adapter_identity(c["path"])["sha256"] != c["adapter_sha256"]:
                out.append((f"checkpoint (step {c.get('step')})", c["path"]))
    return out


def check_inputs(
    run: dict[str, Any],
    *,
    allow_changed_inputs: bool = False,
    flag: str = "--allow-changed-inputs",
    say: Callable[[str], None] | None = None,
    **kw: Any,
) -> list[tuple[str, str]]:
    """:func:`changed_inputs`, as a one-line user error naming the first changed file (unless allowed).

    Args:
        allow_changed_inputs: go on with the files as they are now; each change is said (``say``).
        flag: how the caller spells the permission, for the fix.
        kw: passed to :func:`changed_inputs`.

    Returns:
        the changed inputs (empty when none changed).
    """
    changed = changed_inputs(run, **kw)
    if changed and not allow_changed_inputs:
        what, path = changed[0]
        more = f" (and {len(changed) - 1} more: {', '.join(w for w, _ in changed[1:])})" if len(changed) > 1 else ""
        raise GradianUserError(
            f"the run's {what} changed since the run (its sha256 differs from run.json's){more}",
            where=str(path),
            fix=f"restore the file the run used, re-run gradian attribute, or pass {flag} to use it as it is now",
        )
    for what, path in changed:
        if say is not None:
            say(f"note: the run's {what} changed since the run ({path}); using it as it is now ({flag})")
    return changed
