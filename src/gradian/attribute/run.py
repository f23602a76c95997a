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
from gradian.attribute.queries import make_query
from gradian.errors import GradianUserError
from gradian.index.identity import dataset_identity, file_hash, library_versions
from gradian.index.store import GradSpec
from gradian.models.load import ModelSpec
from gradian.sign import SIGN_CONVENTION
from gradian.util import atomic_write_json, sha256_json

RUN_SCHEMA = "gradian.run/1"

Progress = Callable[[str, int, int], None]  # (task, advance, total)


@dataclass
class RunInputs:
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
    model: ModelSpec
    grad: GradSpec = field(default_factory=GradSpec)
    attribute: AttributeSpec = field(default_factory=AttributeSpec)
    eval: Any = None  # gradian.evaluate.EvalSpec
    seed: int = 0
    batch_size: int = 8
    shard_size: int = 256


def _manifest(ft, inputs: RunInputs, specs: RunSpecs, index_identity: dict | None, index_id: str | None,
              trajectory: dict | None = None) -> dict[str, Any]:
    ident = {
        "base": (index_identity or {}).get("base"),
        "adapter": (index_identity or {}).get("adapter"),
        "dataset": dataset_identity(inputs.data),
        "eval": {"name": Path(inputs.eval).name, "sha256": file_hash(inputs.eval) if Path(inputs.eval).is_file() else dataset_identity(inputs.eval)["sha256"]},
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
    }


def run_audit(inputs: RunInputs, tokenizer_path: str | None) -> dict[str, Any]:
    """The Audit lane on the same inputs: the data (and eval) checks always run; config and
    log checks run when ``--config`` / ``--logs`` were given (the adapter's own
    ``adapter_config.json`` always counts as a config). Checks without their input are skipped."""
    from gradian.audit import diagnose

    configs = list(inputs.configs) + [inputs.adapter]
    return diagnose(
        data=inputs.data, eval=None, configs=configs, logs=inputs.logs, tokenizer=tokenizer_path
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
) -> dict[str, Any] | None:
    """Run the lanes and write ``out_dir/run.json``. Returns the run dict.

    Under torchrun (:mod:`gradian.distributed`) every rank calls it: rank 0 runs the Audit and
    Evaluate lanes and broadcasts the evaluation; all ranks build and score the gradient indexes
    and share RepSim's pass; rank 0 alone forms the verdict, writes ``run.json`` and returns the
    run, the other ranks return None.

    Args:
        ft: an already loaded :class:`gradian.api.FineTune` (else it is loaded here).
        say: called with one line per index build (its size estimate), before it starts.
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
    examples = load_examples(inputs.data)
    eval_items = load_eval_set(inputs.eval)
    audit = run_audit(inputs, inputs.base if Path(inputs.base).is_dir() else None) if main else None
    timing["audit"] = time.perf_counter() - t0

    t = time.perf_counter()
    if ft is None:
        ft = load_finetune(specs.model, inputs.adapter)
    timing["load"] = time.perf_counter() - t

    t = time.perf_counter()
    ev = evaluate(ft.model, ft.tokenizer, eval_items, reference_adapter=inputs.reference_adapter, spec=specs.eval,
                  progress=progress) if main else None
    ev = distributed.broadcast_object(ev)  # the other ranks wait for rank 0's evaluation
    timing["evaluate"] = time.perf_counter() - t

    run: dict[str, Any] = {"schema": RUN_SCHEMA, "evaluation": ev.to_dict(), "audit": audit, "attribution": None}
    regressed = [c.name for c in ev.regressed]
    index_ident = None
    index_id = None
    if not regressed:
        run["stopped"] = (
            "no capability regressed outside the noise band: nothing to attribute "
            "(a delta whose CI includes zero is reported, not diagnosed)"
        )
    else:
        from gradian.api import tokenize_training_set
        from gradian.attribute.evidence import trajectory_scores
        from gradian.attribute.references import reference_scores
        from gradian.attribute.trajectory import resolve_trajectory

        t = time.perf_counter()
        spec = specs.attribute
        trajectory = resolve_trajectory(inputs.adapter, inputs.checkpoints, weighting=spec.weighting)
        items = tokenize_training_set(examples, ft.tokenizer, specs.grad, inputs.data)
        queries = {}
        failing_by_cap = {}
        for cap in regressed:
            failing = ev.failing_items(cap)
            qs = [
                make_query(
                    f.id, f.capability, f.prompt, f.answer, f.tuned_answer, f.reference_answer,
                    kind="contrastive" if (f.query == "contrastive" and spec.query == "contrastive") else "cross_entropy",
                    fallback=f.correct_completion,
                )
                for f in failing
            ]
            if qs:
                queries[cap] = qs
                failing_by_cap[cap] = failing
        evidence = trajectory_scores(
            ft, trajectory, inputs.data, examples, items, specs.grad, queries, spec.engines, unit=spec.unit,
            seed=specs.seed, index_root=index_root, batch_size=specs.batch_size, query_batch_size=spec.query_batch_size,
            progress=progress, say=say, shard_size=specs.shard_size,
        )
        timing.update({f"attribute.{k}": v for k, v in evidence.timing.items()})
        idx = evidence.final_index
        index_ident = idx.manifest["identity"]
        index_id = idx.id
        timing["index"] = time.perf_counter() - t
        t = time.perf_counter()
        refs = reference_scores(
            spec.references, ft, examples, items, queries, specs.grad.tokenize, spec,
            {"adapter": index_ident["adapter"], "base": index_ident["base"], "dataset": index_ident["dataset"],
             "tokenize": specs.grad.tokenize.to_dict(), "model_dtype": specs.model.dtype},
            batch_size=specs.batch_size, progress=progress,
        )
        timing["references"] = time.perf_counter() - t
        if not main:
            return None  # the collective steps are done; rank 0 forms the verdict
        t = time.perf_counter()
        caps = []
        for cap, qs in queries.items():
            cev = CapabilityEvidence(evidence.scores[cap], refs[cap], evidence.units)
            drill = None if evidence.units is not None else _trajectory_drill(ft, trajectory, evidence, cap, examples, items, spec)
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
            "index": {"id": idx.id, "root": str(idx.root), "reused": all(i["row"]["reused"] for i in evidence.indexes),
                      "n": idx.n, "blocks": len(idx.blocks), "dims": sum(int(b["dim"]) for b in idx.blocks)},
            "trajectory": traj_info,
            "train_ids": [e.id for e in examples],
            "train_meta": [
                {"format": e.format, "tokens": it.full_length, "truncated": it.truncated, "n_supervised": it.n_supervised}
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
    traj_ident = None if traj is None else {  # content only: no paths, no reuse flags
        "weight_rule": traj["weight_rule"],
        "checkpoints": [{"step": c["step"], "final": c["final"], "weight": c["weight"], "adapter_sha256": c["adapter_sha256"],
                         "index_ids": {u: v["id"] for u, v in c.get("index", {}).items()}} for c in traj["checkpoints"]],
    }
    run["manifest"] = _manifest(ft, inputs, specs, index_ident, index_id, traj_ident)
    run["manifest"]["notes"] = list(ft.notes)
    run["timing"] = {k: round(v, 3) for k, v in timing.items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out_dir / "run.json", run)
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
        return sorted(total.values(), key=lambda s: s.score)

    return drill


def load_run(run_dir: str | Path) -> dict[str, Any]:
    """Read ``RUN_DIR/run.json`` (a user error if missing or not a Gradian run)."""
    p = Path(run_dir) / "run.json" if Path(run_dir).is_dir() else Path(run_dir)
    if not p.exists():
        raise GradianUserError("no run.json here", where=str(run_dir), fix="pass the folder `gradian attribute --out` wrote")
    from gradian.safeio import load_json_file

    run = load_json_file(p, "run file", fix="re-run gradian attribute")
    if not isinstance(run, dict) or run.get("schema") != RUN_SCHEMA:
        raise GradianUserError(f"not a {RUN_SCHEMA} file", where=str(p), fix="re-run gradian attribute with this version")
    return run
