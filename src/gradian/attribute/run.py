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

import numpy as np

from gradian.attribute.evidence import CapabilityEvidence, save_evidence_file, split_items
from gradian.attribute.pipeline import AttributeSpec, verdict
from gradian.attribute.queries import failing_item_query
from gradian.index.identity import dataset_identity, file_hash, library_versions
from gradian.index.shards import hashed_once
from gradian.index.store import GradSpec
from gradian.models.load import ModelSpec
from gradian.runfile import (  # noqa: F401  (re-exported: run.json's schema and checks live in gradian.runfile)
    RUN_SCHEMA,
    check_run,
    load_run,
    run_json_schema,
)
from gradian.runtypes import (  # noqa: F401  (re-exported: the typed run lives in gradian.runtypes)
    Attribution,
    AuditSummary,
    CapabilityRun,
    Manifest,
    Run,
    Verification,
)
from gradian.sign import SIGN_CONVENTION, sort_most_harmful_first
from gradian.util import atomic_write_json, sha256_json

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
        rows_per_forward: rows per forward pass of the one-pass row + sentence build
            (:func:`gradian.index.joint.build_jointly`) and of the data check
            (:func:`gradian.attribute.datacheck.check_data_matches_adapter`); 1: each row alone, since batching is no
            faster on a CPU, where padding is work (docs/benchmarks.md "The data check one row a forward").
    """

    model: ModelSpec
    grad: GradSpec = field(default_factory=GradSpec)
    attribute: AttributeSpec = field(default_factory=AttributeSpec)
    eval: Any = None  # gradian.evaluate.EvalSpec
    seed: int = 0
    batch_size: int = 8
    shard_size: int = 256
    rows_per_forward: int = 1

    def __post_init__(self) -> None:
        from gradian.index.build import check_build_args
        from gradian.validate import check_seed, check_type

        check_type(self.model, ModelSpec, "RunSpecs", "model")
        check_type(self.grad, GradSpec, "RunSpecs", "grad")
        check_type(self.attribute, AttributeSpec, "RunSpecs", "attribute")
        if self.eval is not None:
            from gradian.evaluate import EvalSpec

            check_type(self.eval, EvalSpec, "RunSpecs", "eval")
        check_seed(self.seed, "RunSpecs")
        check_build_args(self.batch_size, self.shard_size, self.rows_per_forward)


def _weakened_rivals(ft, ev, regressed: list[str], specs: RunSpecs) -> tuple[dict[str, list], dict[str, list]]:
    """Per regressed capability, the weakened items that have a rival answer, with it set: ``(ranked, drill)``.

    ``ranked``: those past ``--weakened`` (queried beside the lost items); ``drill``: those past
    ``--drill-weakened`` and not already ranked (queried by the sentence drill-down only). A weakened item without a
    rival (its answer does not contain an accepted answer, or every nearby continuation still passes) is not
    queried: a cross-entropy query keeps the format direction, which on the tiny family ranked the culprits as
    helpful (docs/benchmarks.md "Weakened items").
    """
    import dataclasses

    from gradian.attribute.rival import rival_answers

    a = specs.attribute
    drill_tau = a.drill_weakened_nats if a.unit == "sentence" else None  # whole-row runs have no sentences to pick
    taus = [t for t in (a.weakened_nats, drill_tau) if t is not None]
    if not taus:
        return {}, {}
    ranked: dict[str, list] = {}
    drill: dict[str, list] = {}
    for cap in regressed:
        weak = [f for f in ev.failing_items(cap, weakened_nats=min(taus)) if f.kind == "weakened"]
        rivals = rival_answers(
            ft.model,
            ft.tokenizer,
            weak,
            max_new_tokens=specs.eval.max_new_tokens,
            batch_size=specs.batch_size,
            normalize=specs.eval.normalize,
        )
        for f, r in zip(weak, rivals):
            if not r:
                continue
            f = dataclasses.replace(f, rival=r, query="contrastive")
            if a.weakened_nats is not None and f.shift_nats < -a.weakened_nats:
                ranked.setdefault(cap, []).append(f)
            elif drill_tau is not None and f.shift_nats < -drill_tau:
                drill.setdefault(cap, []).append(f)
    return ranked, drill


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


def resolve_run_setup(configs: Sequence[Path], adapter: Path, specs: RunSpecs, examples, *, card=None) -> Any:
    """The run's :class:`~gradian.data.setup.TrainingSetup` when the caller did not resolve one (the Python API).

    Resolved as ``gradian attribute --config`` does: from ``configs`` (none: the defaults of the trainer whose
    model card ``card`` is beside the adapter (:func:`gradian.data.setup.card_config`), else Gradian's), the
    rows' most common format and the chat template saved beside the adapter. A ``specs.grad.tokenize`` field that
    differs from :class:`TokenizeSpec`'s default counts as given explicitly (it beats the config and is named as the
    source); the others take the config's value. ``specs.grad`` is then set to the setup's tokenisation, so the
    gradients follow the setup, and a QLoRA run's ``specs.model`` its 4-bit base (unless the spec names a scheme).
    """
    import dataclasses

    from gradian.data.setup import adapter_template, card_config, examples_format, resolve_setup, with_card_quant
    from gradian.data.tokenize import TokenizeSpec

    tok, default = specs.grad.tokenize, TokenizeSpec()
    flags = {k: getattr(tok, k) for k in ("max_length", "loss_on", "add_eos") if getattr(tok, k) != getattr(default, k)}
    fmt, chat = examples_format(examples)
    config = card_config(card)
    if configs:
        from gradian.audit.config import load_config

        config = load_config([str(c) for c in configs])
    setup = resolve_setup(config, fmt, chat=chat, flags=flags, saved_template=adapter_template(adapter))
    setup = with_card_quant(setup, adapter)
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
    if setup.base_quant and specs.model.quantize is None:  # a QLoRA run: its base as trained (--base-quant auto)
        specs.model = dataclasses.replace(specs.model, quantize=setup.base_quant, quantize_from=setup.base_quant_from)
    return setup


def counted_trajectory(adapter: Path, checkpoints, configs: Sequence[Path], spec: AttributeSpec, items):
    """The run's trajectory (:func:`gradian.attribute.trajectory.resolve_trajectory`) with the visits of each of its
    rows (``items``, tokenised as the run trained) counted from the run's own ``configs``
    (:func:`gradian.attribute.visits.with_visits`; ``spec.visits``).
    """
    from gradian.attribute.trajectory import resolve_trajectory
    from gradian.attribute.visits import with_visits

    trajectory = resolve_trajectory(adapter, checkpoints, weighting=spec.weighting)
    config = None
    if configs and spec.visits != "off":
        from gradian.audit.config import load_config

        config = load_config([str(c) for c in configs])
    unsupervised = [it.n_supervised == 0 for it in items]
    lengths = [it.full_length for it in items]
    return with_visits(trajectory, config, len(items), spec.visits, unsupervised=unsupervised, lengths=lengths)


def visits_line(trajectory) -> str:
    """One line: whether each row's visits weigh the trajectory, and how many rows the run never trained."""
    v = trajectory.visits
    if v is None:
        return f"row visits: every row counted once per checkpoint ({trajectory.visits_rule})"
    n, k = v.counts.shape[1], len(v.never)
    never = f"{k} of {n} rows never trained score 0" if k else "every row was trained"
    return f"row visits: {never} ({v.rule})"


def apply_template(ft, specs: RunSpecs):
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


@hashed_once()  # each index shard is hashed once per run, not at every read (gradian.index.shards)
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
    one_pass: bool = True,
    save_evidence: bool = False,
) -> dict[str, Any] | None:
    """Run the lanes and write ``out_dir/run.json``. Returns the run dict.

    Under torchrun (:mod:`gradian.distributed`) every rank calls it: rank 0 runs the Audit and
    Evaluate lanes and broadcasts the evaluation; all ranks build and score the gradient indexes
    and share RepSim's pass; rank 0 alone forms the verdict, writes ``run.json`` and returns the
    run, the other ranks return None.

    Args:
        ft: an already loaded :class:`gradian.finetune.FineTune` (else it is loaded here).
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
        one_pass: with sentence units, build each checkpoint's row and sentence indexes in one pass per row
            (:mod:`gradian.index.joint`; the default, also under torchrun); False: separate builds. The two agree
            to float rounding and share the index ids.
        save_evidence: also write ``out_dir/evidence.safetensors`` (:func:`save_evidence_file`).
    """
    from gradian import distributed
    from gradian.data.formats import load_examples
    from gradian.evaluate import EvalSpec, evaluate, load_eval_set
    from gradian.finetune import load_finetune

    main = distributed.current().is_main
    out_dir = Path(out_dir)
    t0 = time.perf_counter()
    timing: dict[str, float] = {}
    specs.eval = specs.eval or EvalSpec(seed=specs.seed)
    from gradian.models.load import resolve_device

    device = resolve_device(specs.model.device)  # auto: cuda, else mps, else cpu; manifest.device records it
    # cheap validation first: bad flags, data or eval files fail before a model is loaded
    if specs.attribute.unit == "sentence":
        from gradian.index.build import check_unit_grads

        check_unit_grads(specs.grad, one_pass)
    examples = load_examples(inputs.data) if examples is None else examples
    eval_items = load_eval_set(inputs.eval)
    if setup is None:
        setup = resolve_run_setup(inputs.configs, inputs.adapter, specs, examples)
    audit = run_audit(inputs, inputs.base if Path(inputs.base).is_dir() else None) if main else None
    timing["audit"] = time.perf_counter() - t0

    t = time.perf_counter()
    if ft is None:
        ft = load_finetune(specs.model, inputs.adapter)
    ft = apply_template(ft, specs)
    timing["load"] = time.perf_counter() - t
    if say and main:  # what loading the fine-tune found (e.g. torchtune's Qwen2 export put right), as `index` says
        for note in ft.notes:
            say(f"note: {note}")

    # the run plan, before any work: every index, its size, the budget (it may choose the projection), the time
    from gradian.finetune import tokenize_training_set
    from gradian.index.plan import IndexBudget, run_plan

    t = time.perf_counter()
    items = tokenize_training_set(examples, ft.tokenizer, specs.grad, inputs.data)
    trajectory = counted_trajectory(inputs.adapter, inputs.checkpoints, inputs.configs, specs.attribute, items)
    if say and main:
        say(visits_line(trajectory))
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
        joint=one_pass and specs.attribute.unit == "sentence",
        per_forward=specs.rows_per_forward,
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
        from gradian.util import release_free_memory

        tc = time.perf_counter()  # is this the adapter's training data? (a warning, before the long build)
        data_check = check_data_matches_adapter(
            ft, inputs.data, items, batch_size=specs.rows_per_forward, progress=progress
        )
        timing["data_check"] = time.perf_counter() - tc
        # the freed heap of Evaluate's and the data check's forward passes (760 MB kept on the quick SmolLM2 world)
        # goes back to the OS before the long build, which holds its own peak (gradian.util.release_free_memory)
        release_free_memory()
        queries = {}
        failing_by_cap = {}
        drill_items: dict[str, list] = {}
        weak = _weakened_rivals(ft, ev, regressed, specs) if main else None
        weak_rivals, drill_rivals = distributed.broadcast_object(weak)
        for cap in regressed:
            failing = ev.failing_items(cap)
            failing += weak_rivals.get(cap, [])
            qs = [failing_item_query(f, spec.query) for f in failing]
            if qs:
                queries[cap] = qs
                failing_by_cap[cap] = failing
                drill_items[cap] = drill_rivals.get(cap, [])  # (none in a whole-row run: no sentences to pick)
        drill_qs = {c: [failing_item_query(f, spec.query) for f in fs] for c, fs in drill_items.items()}
        evidence = trajectory_scores(
            ft,
            trajectory,
            inputs.data,
            examples,
            items,
            specs.grad,
            {c: qs + drill_qs.get(c, []) for c, qs in queries.items()},  # one pass scores both
            spec.engines,
            unit=spec.unit,
            seed=specs.seed,
            index_root=index_root,
            batch_size=specs.batch_size,
            query_batch_size=spec.query_batch_size,
            progress=progress,
            say=say,
            shard_size=specs.shard_size,
            rows_per_forward=specs.rows_per_forward,
            joint=one_pass,
            keep_per_checkpoint=save_evidence,  # the evidence file carries each checkpoint's matrices too
            row_states="repsim" in spec.references,  # the final build's forward gives RepSim its row states
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
            known_states=evidence.final_states,
        )
        evidence.final_states = {}  # (n, d) float64 numbers, read once
        timing["references"] = time.perf_counter() - t
        if not main:
            return None  # the collective steps are done; rank 0 forms the verdict
        t = time.perf_counter()
        caps = []
        kept: dict[str, CapabilityEvidence] = {}
        never = trajectory.visits.never if trajectory.visits is not None else np.zeros(0, dtype=np.int64)
        trained = None
        if len(never):
            trained = np.ones(len(examples), dtype=bool)
            trained[never] = False
        for cap, qs in queries.items():
            ranked_scores, drill_scores = {}, {}
            for e, es in evidence.scores[cap].items():  # the ranked items, then the drill-only ones
                ranked_scores[e], drill_scores[e] = split_items(es, len(qs))
            dq = drill_qs.get(cap, [])
            cev = CapabilityEvidence(
                ranked_scores, refs[cap], evidence.units, drill_scores if dq else None, trained=trained
            )
            kept[cap] = cev
            drill = (
                None
                if evidence.units is not None
                else _trajectory_drill(ft, trajectory, evidence, cap, examples, items, spec)
            )
            res = verdict(cev, ft.tokenizer, examples, items, qs, spec, idx, drill, drill_queries=dq)
            d = res.to_dict()
            d["failing_items"] = [f.to_dict() for f in failing_by_cap[cap]]
            d["drill_items"] = [f.to_dict() for f in drill_items.get(cap, [])]
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
            "visits": traj.get("visits"),
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
    run["manifest"]["device"] = device  # what specs.model.device (the flag, e.g. auto) resolved to on this machine
    if data_check is not None:
        run["manifest"]["data_check"] = data_check.to_dict()
    run["manifest"]["plan"] = plan.to_dict()
    run["timing"] = {k: round(v, 3) for k, v in timing.items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    if save_evidence and run.get("attribution"):
        save_evidence_file(out_dir / "evidence.safetensors", kept, trajectory.weights, trajectory.row_weights())
    else:  # an earlier run's matrices would not match this run.json
        (out_dir / "evidence.safetensors").unlink(missing_ok=True)
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

    W = trajectory.row_weights()  # (T, n), computed once for every drilled row; None: the checkpoint weights

    def drill(j: int, qi: int) -> list[SentenceScore]:
        total: dict[tuple[int, int], SentenceScore] = {}
        for t, (ck, pre) in enumerate(zip(trajectory.checkpoints, evidence.preconditioned)):
            w = ck.weight if W is None else float(W[t, j])
            r_q = {k: v[qi] for k, v in pre[spec.engine.name][cap].items()}
            with checkpoint_weights(ft.model, ck):
                sents = drill_down(ft.model, ft.tokenizer, examples[j], items[j], r_q, proj, block_names, idx.modules)
            for s in sents:
                key = (s.char_start, s.char_end)
                acc = total.setdefault(key, SentenceScore(s.char_start, s.char_end, s.text, 0.0, 0.0, s.n_tokens))
                acc.score += w * s.score
                acc.share += w * s.share
        return sort_most_harmful_first(total.values(), lambda s: s.score)

    return drill
