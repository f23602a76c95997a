"""``gradian verify``: test a verdict by retraining without the blamed rows.

A verdict is a prediction: removing row j changes the failing items' query loss by
``score_j / n`` (:mod:`gradian.sign`) and, if the verdict is right, brings the lost
capability back. Verify retrains the adapter with the run's own settings on edited
training sets and re-evaluates every retrained adapter on the run's eval set:

* **fix**: without the K most harmful rows of each regressed capability (K: ``--remove``,
  default the harmful tail the report's clusters cover; ``--remove-cluster N``: the rows of
  cluster N of each capability);
* **controls**: without K random rows (``--controls``, seeded), what removing *any* K rows does;
* **seed band**: the unchanged data with other training seeds, the noise of retraining itself;
* **LDS** (``--lds M``): M random half-subsets; the Spearman correlation over subsets between
  the predicted and the measured change of the query loss (the linear datamodeling score).

Per regressed capability it reports (all against the ORIGINAL tuned adapter, paired over the
same eval items, with the run's bootstrap settings):

* each retrained adapter's score and ``Δ = score − tuned score`` with its paired-bootstrap CI;
* the **recovery share** ``Σ_i (retrained_i − tuned_i) / Σ_i (reference_i − tuned_i)`` over the
  capability's items, with a bootstrap CI from the same resampled items (1 = everything lost is back);
* the **predicted** change of the mean query loss over its failing items, ``Σ_{j removed} score_j / n``,
  beside the **measured** one, ``mean_q ℓ_q(retrained) − mean_q ℓ_q(tuned)``
  (:func:`gradian.attribute.queries.query_losses`);
* a verdict line: **verified** when the fix's recovery CI lies above 0 and its Δ exceeds every
  control's Δ by more than the seed band's spread (max |Δ| of the seed retrains), else
  **not verified**, with the numbers.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypedDict

import numpy as np

from gradian.errors import GradianUserError
from gradian.util import atomic_write_json, sha256_bytes

if TYPE_CHECKING:  # pragma: no cover
    from typing_extensions import Unpack

Say = Callable[[str], None]


@dataclass(frozen=True)
class VerifySpec:
    """What ``gradian verify`` retrains (all land in the verification record).

    Attributes:
        remove: K rows removed per regressed capability (None: the rows of the report's clusters).
        remove_cluster: remove only the rows of this cluster (1 = most harmful) of each capability.
        controls: retrains without K random rows each.
        seed_band: retrains of the unchanged data with other training seeds.
        lds: random half-subset retrains for the linear datamodeling score (0: off).
        seed: draws of the control rows and LDS subsets; the seed band uses training seeds
            ``train_seed + 1 .. train_seed + seed_band``.
    """

    remove: int | None = None
    remove_cluster: int | None = None
    controls: int = 2
    seed_band: int = 1
    lds: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        from gradian.validate import check_int

        if self.remove is not None:
            check_int(self.remove, "VerifySpec", "remove", flag="--remove", lo=1, hi=10_000_000)
        if self.remove_cluster is not None:
            check_int(self.remove_cluster, "VerifySpec", "remove_cluster", flag="--remove-cluster", lo=1, hi=10_000)
        if self.remove is not None and self.remove_cluster is not None:
            raise GradianUserError(
                "--remove and --remove-cluster cannot be combined", where="--remove", fix="pass one of them"
            )
        check_int(self.controls, "VerifySpec", "controls", flag="--controls", lo=0, hi=100)
        check_int(self.seed_band, "VerifySpec", "seed_band", flag="--seed-band", lo=0, hi=100)
        check_int(self.lds, "VerifySpec", "lds", flag="--lds", lo=0, hi=10_000)
        check_int(self.seed, "VerifySpec", "seed", flag="--seed", lo=0, hi=2**31 - 1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Retrain:
    """One edited training set: its name, the row ids it leaves out, its training seed."""

    name: str
    kind: str  # fix | control | seed | lds
    removed: list[str]
    seed: int


def blamed_rows(cap: dict[str, Any], spec: VerifySpec) -> list[str]:
    """The rows a capability's verdict blames, most harmful first: :func:`gradian.attribute.selection.select`'s rule.

    ``--remove K``: ``"top K"``; ``--remove-cluster N``: ``"cluster N"``; neither: ``"blamed"`` (the rows
    of the report's clusters, the ones its summary blames).
    """
    from gradian.attribute.selection import select_capability

    if spec.remove_cluster is not None:
        drop, where = f"cluster {spec.remove_cluster}", "--remove-cluster"
    elif spec.remove is not None:
        drop, where = f"top {spec.remove}", "--remove"
    else:
        drop, where = "blamed", "--remove"
    rows = select_capability(cap, _ids_of(cap), drop, where)
    if not rows:
        raise GradianUserError(
            f"capability {cap['capability']!r} has no harmful row to remove", where="run.json", fix="nothing to verify"
        )
    return rows


def _ids_of(cap: dict[str, Any]) -> list[str]:
    return cap["_train_ids"]


def plan(run: dict[str, Any], spec: VerifySpec, train_seed: int) -> list[Retrain]:
    """The retrains: one fix (all regressed capabilities' blamed rows), the controls, the seed band, LDS."""
    att = run.get("attribution")
    if not att or not att.get("capabilities"):
        raise GradianUserError(
            "this run attributed nothing (no capability regressed), so there is no verdict to verify",
            where="run.json",
            fix="verify a run whose report ranks training rows",
        )
    ids = att["train_ids"]
    removed: list[str] = []
    for cap in att["capabilities"]:
        for r in blamed_rows({**cap, "_train_ids": ids}, spec):
            if r not in removed:
                removed.append(r)
    k = len(removed)
    if k >= len(ids):
        raise GradianUserError(f"the fix would remove all {len(ids)} rows", where="--remove", fix="remove fewer rows")
    rng = np.random.default_rng(spec.seed)
    out = [Retrain("fix", "fix", removed, train_seed)]
    for c in range(spec.controls):
        pick = rng.choice(len(ids), size=k, replace=False)
        out.append(Retrain(f"control-{c + 1}", "control", [ids[j] for j in sorted(pick)], train_seed))
    for s in range(spec.seed_band):
        out.append(Retrain(f"seed-{s + 1}", "seed", [], train_seed + s + 1))
    for m in range(spec.lds):
        pick = rng.choice(len(ids), size=len(ids) // 2, replace=False)
        out.append(Retrain(f"lds-{m + 1}", "lds", [ids[j] for j in sorted(pick)], train_seed))
    return out


def _edited_data(records: list[dict], examples, removed: set[str], folder: Path, name: str) -> tuple[Path, str]:
    lines = "".join(
        json.dumps(rec, ensure_ascii=False, default=str) + "\n"
        for rec, ex in zip(records, examples)
        if ex.id not in removed
    )
    data = lines.encode("utf-8")
    path = folder / f"{name}.jsonl"
    path.write_bytes(data)
    return path, sha256_bytes(data)


def _share_ci(ref: np.ndarray, tuned: np.ndarray, new: np.ndarray, resamples: int, confidence: float, seed: int):
    """Recovery share Σ(new − tuned)/Σ(ref − tuned) and its paired-bootstrap percentile CI.

    All three are NaN when nothing was lost (Σ(ref − tuned) ≤ 0).
    """
    lost = float((ref - tuned).sum())
    if lost <= 0:
        return float("nan"), float("nan"), float("nan")
    share = float((new - tuned).sum()) / lost
    rng = np.random.default_rng(seed)
    n = len(ref)
    reps = []
    for _ in range(resamples // 10 or 1):  # 1/10 of Evaluate's resamples: a ratio of two paired sums
        idx = rng.integers(0, n, size=n)
        d = float((ref[idx] - tuned[idx]).sum())
        if d > 0:
            reps.append(float((new[idx] - tuned[idx]).sum()) / d)
    a = (1 - confidence) / 2
    lo, hi = np.quantile(reps, [a, 1 - a]) if reps else (float("nan"), float("nan"))
    return share, float(lo), float(hi)


@dataclass
class Prepared:
    """Everything ``gradian verify`` reads and checks before its first retrain (:func:`prepare_verify`)."""

    run_dir: Path
    run: dict[str, Any]
    model: Any  # gradian.models.load.ModelSpec: what the tuned model is loaded with
    adapter: str
    trainer: Any  # GradianTrainer | CommandTrainer
    retrains: list[Retrain]
    eval_spec: Any  # gradian.evaluate.EvalSpec
    items: list[Any]  # the eval set's items, as loaded now
    by_id: dict[str, Any]  # the run's per-item results, by item id
    records: list[dict]
    examples: list[Any]
    base_identity: Any
    tokenize: Any  # gradian.data.tokenize.TokenizeSpec
    n: int
    queries: dict[str, list[Any]]


class VerifyInputs(TypedDict, total=False):
    """What a verify takes beside the run folder and its :class:`VerifySpec` (``gradian verify``'s flags).

    Attributes:
        config: the training config to retrain with (None: the adapter's ``training_config.yaml``, else the run's).
        train_command: the user's own trainer, a command line with ``{data}``, ``{out}``, ``{seed}``, ``{base}``.
        trust_remote_code: let transformers run the base folder's own code (``--trust-remote-code``).
        allow_changed_inputs: retrain on inputs whose content changed since the run (``--allow-changed-inputs``).
        device: where to load the model (None: the device the run recorded).
    """

    config: str | Path | None
    train_command: str | None
    trust_remote_code: bool
    allow_changed_inputs: bool
    device: str | None


def prepare_verify(
    run_dir: str | Path,
    spec: VerifySpec = VerifySpec(),
    *,
    config: str | Path | None = None,
    train_command: str | None = None,
    trust_remote_code: bool = False,
    allow_changed_inputs: bool = False,
    device: str | None = None,
    say: Say = print,
) -> Prepared:
    """Read and check everything a verify needs, load no model and train nothing (:func:`verify_run`'s first half).

    Raises:
        GradianUserError: run.json is not a valid run (:func:`gradian.attribute.run.check_run`), an input is
            gone or changed (:func:`gradian.attribute.changes.check_inputs`), or the verdict cannot be verified.
    """
    from gradian.attribute.changes import check_inputs
    from gradian.attribute.queries import Query
    from gradian.data.formats import load_examples, read_records
    from gradian.evaluate import EvalResult, load_eval_set
    from gradian.index.store import GradSpec
    from gradian.models.load import ModelSpec
    from gradian.runfile import load_run
    from gradian.validate import check_bool
    from gradian.verify.retrain import trainer_for, with_run_tokenize

    check_bool(trust_remote_code, "verify_run", "trust_remote_code", flag="--trust-remote-code")
    check_bool(allow_changed_inputs, "verify_run", "allow_changed_inputs", flag="--allow-changed-inputs")
    run_dir = Path(run_dir)
    run = load_run(run_dir, inputs=True)
    paths = run["manifest"]["paths"]
    specs = run["manifest"]["identity"]["specs"]
    data, eval_path = Path(paths["data"]), Path(paths["eval"])
    # what the model is loaded with comes from this call, never from the (shareable) run.json
    model = {**specs["model"], "base": paths["base"], "trust_remote_code": trust_remote_code}
    if device is not None:
        model["device"] = device
    mspec = ModelSpec(**model)
    if specs["model"].get("trust_remote_code") is True and not trust_remote_code:
        say("note: the run was made with --trust-remote-code; verify runs the base folder's code only if you pass it")
    check_inputs(run, allow_changed_inputs=allow_changed_inputs, say=say)
    plan(run, spec, 0)  # the run's verdict must be verifiable before any trainer is set up
    tokenize = GradSpec.from_dict(specs["grad"]).tokenize  # its defaults for what the spec leaves out
    # the retrains render and mask rows as the run did (its chat template, max length and loss mask)
    trainer = with_run_tokenize(trainer_for(run, config, train_command, trust_remote_code=trust_remote_code), tokenize)
    train_seed = int(getattr(getattr(trainer, "spec", None), "seed", 0) or 0)
    retrains = plan(run, spec, train_seed)
    ev = EvalResult.from_dict(run["evaluation"])
    items = load_eval_set(eval_path)
    if [it.id for it in items] != [it.id for it in ev.items]:
        raise GradianUserError(
            "the eval set changed since the run", where=str(eval_path), fix="re-run gradian attribute"
        )
    att = run["attribution"]
    caps = {c["capability"]: c for c in att["capabilities"]}
    return Prepared(
        run_dir=run_dir,
        run=run,
        model=mspec,
        adapter=paths["adapter"],
        trainer=trainer,
        retrains=retrains,
        eval_spec=ev.spec,
        items=items,
        by_id={it.id: it for it in ev.items},
        records=read_records(data),
        examples=load_examples(data),
        base_identity=run["manifest"]["identity"].get("base"),
        tokenize=tokenize,
        n=len(att["train_ids"]),
        queries={c: [Query(**q) for q in cap["queries"]] for c, cap in caps.items()},
    )


def flagged_setup(run: dict[str, Any], config: str | Path | None = None) -> dict[str, Any] | None:
    """Audit's error-level setup findings on the run (:func:`gradian.report.join.setup_errors`), or None.

    The retrains inherit the run's training setup (unless ``config`` replaces it), so a setup problem Audit
    flagged (learning rate, epochs, loss mask, truncation of the blamed rows) is in every retrain too.

    Returns:
        ``{"findings": [{"id", "title", "severity", "rows"}], "config": the verify config or None, "line": str}``.
    """
    from gradian.report.join import setup_error_names, setup_errors

    att = run.get("attribution") or {}
    blamed = {r.get("id") for c in att.get("capabilities") or [] for r in c.get("ranked") or []}
    blamed |= {
        r for c in att.get("capabilities") or [] for cl in c.get("clusters") or [] for r in cl.get("row_ids") or []
    }
    errors = setup_errors((run.get("audit") or {}).get("findings") or [], blamed)
    if not errors:
        return None
    names = setup_error_names(errors)
    if config is None:
        line = (
            f"warning: retraining with the setup Audit flagged ({names}): every retrain inherits it, so a capability "
            "that does not come back may be the setup, not the data"
        )
    else:
        line = (
            f"warning: Audit flagged the run's setup ({names}); these retrains use {Path(config).name}, "
            "which Audit did not check"
        )
    return {"findings": errors, "config": str(config) if config is not None else None, "line": line}


def verify_run(
    run_dir: str | Path,
    spec: VerifySpec = VerifySpec(),
    *,
    say: Say = print,
    **inputs: Unpack[VerifyInputs],
) -> dict[str, Any]:
    """Retrain, re-evaluate and compare (module docstring); add ``verification`` to ``RUN_DIR/run.json``.

    A run folder is data, never code: run.json is checked against its schema first
    (:func:`gradian.attribute.run.check_run`), its recorded input hashes against the files now on disk
    (:func:`gradian.attribute.changes.check_inputs`), and the base model's code runs only when the caller
    asks for it here (``trust_remote_code``), whatever run.json says.

    Args:
        inputs: what :func:`prepare_verify` takes beside the run (:class:`VerifyInputs`).

    Returns:
        the verification record (also written into run.json, atomically, with the rest unchanged).
    """
    import torch

    from gradian.attribute.queries import query_losses
    from gradian.evaluate.run import adapter_active, answer_items
    from gradian.finetune import load_finetune
    from gradian.verify.retrain import retrain_cached

    t0 = time.perf_counter()
    p = prepare_verify(run_dir, spec, say=say, **inputs)
    run_dir, run, retrains, trainer, items, tokenize = p.run_dir, p.run, p.retrains, p.trainer, p.items, p.tokenize
    records, examples, base_ident, queries, eval_spec = p.records, p.examples, p.base_identity, p.queries, p.eval_spec
    by_id, n = p.by_id, p.n
    say(
        f"verify: {len(retrains)} retrains ({', '.join(r.name for r in retrains)}) with {trainer.describe()['trainer']}"
    )
    flagged = flagged_setup(run, inputs.get("config"))
    if flagged:  # before the first retrain: the retrains inherit what Audit flagged
        say(flagged["line"])

    import shutil

    work = run_dir / ".verify"
    work.mkdir(exist_ok=True)
    results: dict[str, Any] = {}
    ft = None
    try:
        # the original tuned adapter's query losses (the baseline every measured change is against)
        ft = load_finetune(p.model, p.adapter)
        if tokenize.chat_template is not None:  # the run's training template: the eval prompts as the run rendered them
            from gradian.data.tokenize import with_chat_template

            ft = replace(ft, tokenizer=with_chat_template(ft.tokenizer, tokenize.chat_template))
        base_q = {c: query_losses(ft.model, ft.tokenizer, qs, tokenize).numpy() for c, qs in queries.items()}
        for r in retrains:
            t = time.perf_counter()
            path, sha = _edited_data(records, examples, set(r.removed), work, r.name)
            adapter, reused = retrain_cached(trainer, base_ident, path, sha, r.seed)
            path.unlink(missing_ok=True)
            say(f"  {r.name}: {'cached' if reused else 'trained'} ({len(r.removed)} rows removed, seed {r.seed})")
            with torch.no_grad(), adapter_active(ft.model, adapter):  # the same base, the retrained LoRA
                answers = answer_items(ft.model, ft.tokenizer, items, eval_spec, label=r.name)
                q = {c: query_losses(ft.model, ft.tokenizer, qs, tokenize).numpy() for c, qs in queries.items()}
            results[r.name] = {
                "retrain": asdict(r),
                "adapter": str(adapter),
                "reused": reused,
                "scores": {a_id.id: ans.score for a_id, ans in zip(items, answers)},
                "query_loss": {c: v.tolist() for c, v in q.items()},
                "seconds": round(time.perf_counter() - t, 1),
            }
    finally:
        del ft
        shutil.rmtree(work, ignore_errors=True)  # the edited data files; nothing half-written stays
    record = summarise(run, results, retrains, by_id, base_q, eval_spec, spec, n)
    record.update(
        {
            "spec": spec.to_dict(),
            "trainer": trainer.describe(),
            "audit_setup": flagged,  # None: Audit found no error-level setup problem
            "seconds": round(time.perf_counter() - t0, 1),
        }
    )
    run["verification"] = record
    atomic_write_json(run_dir / "run.json", run)
    return record


def summarise(
    run, results, retrains: Sequence[Retrain], by_id, base_q, eval_spec, spec: VerifySpec, n: int
) -> dict[str, Any]:
    """The verification record per regressed capability (module docstring)."""
    from scipy.stats import spearmanr

    from gradian.evaluate.bootstrap import paired_bootstrap

    att = run["attribution"]
    pos = {rid: j for j, rid in enumerate(att["train_ids"])}
    out: dict[str, Any] = {
        "capabilities": {},
        "retrains": {k: {kk: v[kk] for kk in ("retrain", "adapter", "reused", "seconds")} for k, v in results.items()},
    }
    for cap in att["capabilities"]:
        name = cap["capability"]
        ids = [i for i, it in by_id.items() if it.capability == name]
        ref = np.array([by_id[i].reference.score for i in ids])
        tuned = np.array([by_id[i].tuned.score for i in ids])
        influence = np.asarray(cap["scores"], dtype=float)
        rows = {}
        for r in retrains:
            res = results[r.name]
            new = np.array([res["scores"][i] for i in ids])
            ci = paired_bootstrap(
                tuned, new, resamples=eval_spec.resamples, confidence=eval_spec.confidence, seed=eval_spec.seed
            )
            share, slo, shi = _share_ci(ref, tuned, new, eval_spec.resamples, eval_spec.confidence, eval_spec.seed)
            predicted = float(sum(influence[pos[j]] for j in r.removed) / n)
            measured = float(np.mean(res["query_loss"][name]) - np.mean(base_q[name]))
            rows[r.name] = {
                "kind": r.kind,
                "removed": len(r.removed),
                "score": float(new.mean()),
                "delta": ci.delta,
                "ci_low": ci.low,
                "ci_high": ci.high,
                "recovery": share,
                "recovery_ci": [slo, shi],
                "predicted_query_loss_change": predicted,
                "measured_query_loss_change": measured,
            }
        fix = rows["fix"]
        controls = [v for v in rows.values() if v["kind"] == "control"]
        seeds = [v for v in rows.values() if v["kind"] == "seed"]
        band = max((abs(v["delta"]) for v in seeds), default=0.0)
        beats = all(fix["delta"] > c["delta"] + band for c in controls)
        ok = bool(np.isfinite(fix["recovery_ci"][0]) and fix["recovery_ci"][0] > 0 and beats)
        entry_line = verdict_line(name, fix, controls, seeds, band, ok, ref, tuned)
        line = entry_line
        entry: dict[str, Any] = {
            "verified": ok,
            "line": line,
            "seed_retrains": len(seeds),
            "controls": len(controls),
            "reference": float(ref.mean()),
            "tuned": float(tuned.mean()),
            "seed_band": band,
            "retrains": rows,
        }
        lds = [v for v in rows.values() if v["kind"] == "lds"]
        if len(lds) >= 3:
            rho = spearmanr(
                [v["predicted_query_loss_change"] for v in lds], [v["measured_query_loss_change"] for v in lds]
            ).statistic
            entry["lds"] = {"subsets": len(lds), "spearman": float(rho)}
        out["capabilities"][name] = entry
    return out


def _pct_range(lo: float, hi: float) -> tuple[str, str]:
    """A recovery CI as shown: each end clipped to [0%, 100%] (what removing rows can bring back), with a note
    when the bootstrap reached outside (a resample whose retrain gained more than its tuned model lost, or lost
    more).
    """
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "[n/a]", ""
    clo, chi = min(max(lo, 0.0), 1.0), min(max(hi, 0.0), 1.0)
    note = ""
    if (clo, chi) != (lo, hi):
        note = f" (bootstrap range {lo:.0%}..{hi:.0%}, clipped: recovery runs from 0% to 100%)"
    return f"[{clo:.0%}, {chi:.0%}]", note


def verdict_line(name: str, fix: dict, controls: list, seeds: list, band: float, ok: bool, ref, tuned) -> str:
    """The one-line result of a capability's verify (module docstring), honest about what ran.

    No seed retrain (``--seed-band 0``): the line says the retrain noise was not measured, and "verified"
    becomes "verified without a seed band". No control: it says so too. The recovery share is shown as
    measured, its CI clipped to [0%, 100%] with the raw bootstrap range beside it when it was clipped.
    """
    k = fix["removed"]
    ci, ci_note = _pct_range(*fix["recovery_ci"])
    caveats = []
    if not seeds:
        caveats.append("no seed retrain ran (--seed-band 0), so the noise of retraining is not measured")
    if not controls:
        caveats.append("no control retrain ran (--controls 0), so random removals were not compared")
    word = "verified" if ok else "not verified"
    if ok and not seeds:
        word = "verified without a seed band"
    ctrl = (
        (f"; removing {k} random rows recovers " + ", ".join(f"{c['recovery']:.0%}" for c in controls))
        if controls
        else ""
    )
    seed_txt = (
        f"; retraining with another seed ({len(seeds)} retrain{'s' if len(seeds) != 1 else ''}) moves it by up to "
        f"{band:+.2f}"
        if seeds
        else ""
    )
    rec = f"{fix['recovery']:.0%}" if np.isfinite(fix["recovery"]) else "n/a"
    return (
        f"{word}: removing the {k} blamed rows recovers {rec} of the lost {name} score {ci}{ci_note} "
        f"({cap_score(ref)} → {tuned.mean():.2f} → {fix['score']:.2f}){ctrl}{seed_txt}"
        + "".join(f"; {c}" for c in caveats)
    )


def cap_score(ref: np.ndarray) -> str:
    """The reference model's mean item score on a capability, to two decimals (as the verdict line shows it)."""
    return f"{ref.mean():.2f}"
