"""Gradian against every variant, reference engine and peer, on planted worlds, in one benchmark run.

For each ``--world WORLD --adapter ADAPTER`` pair (a world from ``gradian world`` and an adapter
``gradian train`` made on it, with its ``checkpoint-*`` trajectory), on the SAME adapter, rows,
loss masks and failing items (the final adapter's contrastive queries):

* Gradian's gradient engines {datainf, graddot} × {final adapter, trajectory} × {raw, cosine, adam}
  × {whole row, span-aware (most harmful sentence)}, and the verdict's default configuration;
* Gradian's EK-FAC engine alone ({final adapter, trajectory}), in its own process;
* the reference engines BM25 and RepSim, and fusions;
* kronfluence EK-FAC (final adapter; installed by ``make bench-install``);
* bergson TrackStar (final adapter, its own tokenisation, mean-aggregated contrastive query).

Every method runs in its own spawned process from an empty index root, so the wall time is
end to end (index builds included) and the peak RSS is that process's own. The table gives,
per method: culprit AUC (all, direct, buried), P@n (n = number of culprits), P@10,
buried-sentence localisation over every buried culprit whose target item was lost (span-aware
methods only), wall time, peak RSS, and the wall time relative to Gradian's default.

    python benchmarks/bench_peers.py --world W1 --adapter A1 [--world W2 --adapter A2 ...] --out OUT.json

Evaluation (which items failed, what the model said) runs once per world and is cached next to
``--out``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent


# --------------------------------------------------------------------------- the task, shared by every method


def _task(world: Path, adapter: Path, cache: Path, project_dim: int) -> dict[str, Any]:
    """Failing items and queries of the final adapter (evaluated once, cached)."""
    import yaml

    from gradian.attribute.queries import make_query
    from gradian.evaluate import EvalResult, EvalSpec, evaluate, load_eval_set
    from gradian.finetune import load_finetune
    from gradian.models.load import ModelSpec

    base = json.loads((world / "world.json").read_text())["base"]
    cfg = yaml.safe_load((world / "train.yaml").read_text())
    if cache.exists():
        ev = EvalResult.from_dict(json.loads(cache.read_text()))
    else:
        ft = load_finetune(ModelSpec(base), adapter)
        ev = evaluate(ft.model, ft.tokenizer, load_eval_set(world / "eval.jsonl"), spec=EvalSpec(seed=0))
        cache.write_text(json.dumps(ev.to_dict()))
    if not ev.regressed:
        raise SystemExit(f"{world}: nothing regressed; nothing to attribute")
    cap = ev.regressed[0].name
    queries = [
        make_query(
            f.id, f.capability, f.prompt, f.answer, f.tuned_answer, f.reference_answer, fallback=f.correct_completion
        )
        for f in ev.failing_items(cap)
    ]
    return {
        "world": str(world),
        "adapter": str(adapter),
        "base": base,
        "capability": cap,
        "max_length": int(cfg.get("max_length", 1024)),
        "add_eos": bool(cfg.get("add_eos", True)),
        "project_dim": project_dim,
        "queries": [q.to_dict() for q in queries],
        "evaluation": {
            c.name: {
                "reference": c.reference_score,
                "tuned": c.tuned_score,
                "delta": c.delta,
                "ci": [c.ci_low, c.ci_high],
            }
            for c in ev.capabilities
        },
    }


def _setup(task: dict[str, Any]):
    import torch

    from gradian.attribute.queries import Query
    from gradian.data.formats import load_examples
    from gradian.data.tokenize import TokenizeSpec
    from gradian.finetune import load_finetune, tokenize_training_set
    from gradian.gradients.projection import ProjectionSpec
    from gradian.index.store import GradSpec
    from gradian.models.load import ModelSpec

    torch.manual_seed(0)
    tspec = TokenizeSpec(max_length=task["max_length"], add_eos=task["add_eos"])
    grad = GradSpec(tokenize=tspec, projection=ProjectionSpec(dim=task["project_dim"], seed=0))
    ft = load_finetune(ModelSpec(task["base"]), task["adapter"])
    data = Path(task["world"]) / "train.jsonl"
    examples = load_examples(data)
    items = tokenize_training_set(examples, ft.tokenizer, grad, data)
    queries = [Query(**q) for q in task["queries"]]
    return ft, grad, data, examples, items, queries


# --------------------------------------------------------------------------- methods (each in its own process)


def m_gradient(
    task, root, *, trajectory: bool, unit: str, optimizer: str = "none", engines: tuple[str, ...] | None = None
):
    """Gradian's gradient engines (default: datainf and graddot; graddot alone with Adam); returns every
    per-checkpoint matrix (variants are derived in the parent).
    """
    from gradian.attribute.evidence import trajectory_scores
    from gradian.attribute.trajectory import resolve_trajectory
    from gradian.engines import engine_spec

    ft, grad, data, examples, items, queries = _setup(task)
    traj = resolve_trajectory(task["adapter"], "auto" if trajectory else "final")
    names = engines or (("datainf", "graddot") if optimizer == "none" else ("graddot",))
    engines = [engine_spec(e) for e in names]
    ev = trajectory_scores(
        ft,
        traj,
        data,
        examples,
        items,
        replace(grad, optimizer=optimizer),
        {"c": queries},
        engines,
        unit=unit,
        index_root=root,
        keep_per_checkpoint=True,
    )
    out: dict[str, np.ndarray] = {"weights": np.array(traj.weights)}
    for e, es in ev.scores["c"].items():
        for t, part in enumerate(es.per_checkpoint or []):
            for k, v in part.items():
                out[f"{e}.ck{t}.{k}"] = v
    if ev.units is not None:
        out["unit_rows"] = np.array([u.row for u in ev.units])
        out["unit_spans"] = np.array(
            [
                [u.char_start if u.char_start is not None else -1, u.char_end if u.char_end is not None else -1]
                for u in ev.units
            ]
        )
    return out, {"timing": ev.timing, "indexes": ev.indexes}


def m_references(task, root):
    from gradian.attribute.pipeline import AttributeSpec
    from gradian.attribute.references import reference_scores
    from gradian.engines.lexical import BM25Spec
    from gradian.engines.repsim import RepSimSpec

    ft, grad, data, examples, items, queries = _setup(task)
    out = {}
    t = {}
    for name, mode in (("bm25", "said"), ("bm25", "contrast"), ("repsim", "said"), ("repsim", "contrast")):
        spec = AttributeSpec(bm25=BM25Spec(mode), repsim=RepSimSpec(mode))
        t0 = time.perf_counter()
        r = reference_scores(
            [name], ft, examples, items, {"c": queries}, grad.tokenize, spec, {"bench": str(root), "mode": mode}
        )
        t[f"{name}.{mode}"] = time.perf_counter() - t0
        out[f"{name}.{mode}"] = r["c"][name]
    return out, {"timing": t}


def m_kronfluence(task, root):
    sys.path.insert(0, str(HERE))
    from gradian.attribute.queries import _example
    from gradian.data.tokenize import tokenize_example
    from peers import kronfluence_scores

    ft, grad, data, examples, items, queries = _setup(task)
    C = [tokenize_example(_example(q.prompt, q.correct, q.item_id), ft.tokenizer, grad.tokenize) for q in queries]
    W = [tokenize_example(_example(q.prompt, q.said, q.item_id), ft.tokenizer, grad.tokenize) for q in queries]
    S, t = kronfluence_scores(ft, items, C, W, workdir=root)
    return {"ekfac": S}, {"timing": t}


def m_bergson(task, root):
    sys.path.insert(0, str(HERE))
    from gradian.attribute.queries import Query
    from peers import bergson_trackstar_scores

    queries = [Query(**q) for q in task["queries"]]
    s, t = bergson_trackstar_scores(Path(task["world"]), task["adapter"], task["base"], queries, root)
    return {"trackstar": s[None, :]}, {"timing": t}


def m_cli(task, root):
    """The default verdict as a user runs it: ``gradian attribute`` with every flag at its default, in its own
    process, from an empty cache (``GRADIAN_CACHE=root``), end to end: model load, Evaluate, the run plan, every
    index of the trajectory (one pass per row), references, scoring and the report. Its wall time and peak RSS
    are that process's own; ``timing`` is the run's own stage times (``run.json`` ``timing``).
    """
    import subprocess

    world = Path(task["world"])
    out = Path(root) / "run"
    cmd = [sys.executable, "-m", "gradian", "attribute", "--base", task["base"], "--adapter", task["adapter"]]
    cmd += ["--data", str(world / "train.jsonl"), "--eval", str(world / "eval.jsonl")]
    cmd += ["--config", str(world / "train.yaml"), "--out", str(out)]
    env = {**os.environ, "GRADIAN_CACHE": str(Path(root) / "cache")}
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"gradian attribute exited {p.returncode}: {p.stderr.strip().splitlines()[-1:]}")
    run = json.loads((out / "run.json").read_text())
    cap = run["attribution"]["capabilities"][0]
    spans = [(-1, -1) if s is None else tuple(s) for s in (cap.get("row_sentences") or [])]
    timing = dict(run.get("timing") or {})
    timing["process"] = wall
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    arrays = {"rank_scores": np.asarray(cap["rank_scores"]), "row_sentences": np.asarray(spans, dtype=np.int64)}
    return arrays, {"timing": timing, "cli_peak_rss_mb": rss, "cli_wall_s": wall}


METHODS = {
    "cli": (m_cli, {}),
    "final-row": (m_gradient, {"trajectory": False, "unit": "row"}),
    "trajectory": (m_gradient, {"trajectory": True, "unit": "sentence"}),
    "trajectory-adam": (m_gradient, {"trajectory": True, "unit": "row", "optimizer": "adam"}),
    # EK-FAC alone in its own process, so its wall time and RSS (index + two model passes per checkpoint) are its own
    "final-row-ekfac": (m_gradient, {"trajectory": False, "unit": "row", "engines": ("ekfac",)}),
    "trajectory-ekfac": (m_gradient, {"trajectory": True, "unit": "sentence", "engines": ("ekfac",)}),
    "references": (m_references, {}),
    "kronfluence": (m_kronfluence, {}),
    "bergson": (m_bergson, {}),
}


GRADIENT_METHODS = tuple(k for k, (fn, _) in METHODS.items() if fn is m_gradient)


def _child(name: str, task: dict, root: str, out: str, q) -> None:
    fn, kw = METHODS[name]
    t0 = time.perf_counter()
    try:
        arrays, meta = fn(task, Path(root), **kw)
        np.savez(out, **arrays)
        meta["wall_s"] = time.perf_counter() - t0
        meta["peak_rss_mb"] = max(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, meta.pop("cli_peak_rss_mb", 0.0)
        )
        q.put({"ok": True, **meta})
    except BaseException as e:  # report, never hang the parent
        q.put(
            {
                "ok": False,
                "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}",
                "trace": traceback.format_exc()[-2000:],
            }
        )


def run_method(
    name: str, task: dict, workdir: Path, index_root: Path | None = None
) -> tuple[dict[str, np.ndarray] | None, dict[str, Any]]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    root = index_root if index_root is not None else Path(tempfile.mkdtemp(prefix=f"idx-{name}-", dir=workdir))
    out = workdir / f"{name}.npz"
    p = ctx.Process(target=_child, args=(name, task, str(root), str(out), q))
    t0 = time.perf_counter()
    p.start()
    meta = q.get()
    p.join()
    meta["process_wall_s"] = time.perf_counter() - t0
    if not meta.get("ok"):
        return None, meta
    return dict(np.load(out)), meta


# --------------------------------------------------------------------------- scoring the rankings


def _row_min(u: np.ndarray, rows: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    out = np.full(u.shape[:-1] + (n,), np.inf)
    arg = np.full(u.shape[:-1] + (n,), -1)
    for k, r in enumerate(rows):
        better = u[..., k] < out[..., r]
        out[..., r] = np.where(better, u[..., k], out[..., r])
        arg[..., r] = np.where(better, k, arg[..., r])
    return out, arg


def _blamed(U_raw: np.ndarray, rows: np.ndarray, spans: np.ndarray) -> dict[int, tuple]:
    """The product's drill-down rule (:func:`gradian.attribute.drilldown.blamed_units`): per row, the span of the
    sentence with the most negative item-scaled raw influence.
    """
    from gradian.attribute.drilldown import blamed_units

    got = blamed_units(U_raw, rows, [sp[0] >= 0 for sp in spans])
    return {j: tuple(int(x) for x in spans[k]) for j, (k, _) in got.items()}


def variants(name: str, A: dict[str, np.ndarray], n: int) -> dict[str, dict[str, Any]]:
    """Every ranking a method's arrays give: ``{label: {"rows": (n,), "best_span": {row: (a, b)} | None}}``."""
    out: dict[str, dict[str, Any]] = {}
    if name in GRADIENT_METHODS:
        w = A["weights"]
        K = len(w)
        engines = sorted({k.split(".")[0] for k in A if ".ck" in k})
        for e in engines:
            label_e = "adam" if name == "trajectory-adam" else e
            for stat in ("raw", "cosine"):
                ws = (
                    {"final": np.eye(K)[-1]}
                    if name.startswith("final-row")
                    else {"trajectory": w, "first": np.eye(K)[0]}
                )
                for wname, wv in ws.items():
                    M = sum(wt * A[f"{e}.ck{t}.{stat}"] for t, wt in enumerate(wv))
                    out[f"{label_e} {wname} {stat} row"] = {"rows": M.mean(0), "best_span": None}
                    if f"{e}.ck0.unit_{stat}" in A:
                        Ui = sum(wt * A[f"{e}.ck{t}.unit_{stat}"] for t, wt in enumerate(wv))
                        Ur = sum(wt * A[f"{e}.ck{t}.unit_raw"] for t, wt in enumerate(wv))
                        rows, _ = _row_min(Ui.mean(0), A["unit_rows"], n)
                        spans = _blamed(Ur, A["unit_rows"], A["unit_spans"])
                        out[f"{label_e} {wname} {stat} sentence"] = {"rows": rows, "best_span": spans}
    elif name == "references":
        for k, v in A.items():
            out[k.replace(".", " ")] = {"rows": v.mean(0), "best_span": None}
    elif name == "cli":
        spans = {j: (int(a), int(b)) for j, (a, b) in enumerate(A["row_sentences"]) if a >= 0}
        out["gradian attribute (CLI, end to end)"] = {"rows": A["rank_scores"], "best_span": spans or None}
    elif name == "kronfluence":
        out["kronfluence ekfac final"] = {"rows": A["ekfac"].mean(0), "best_span": None}
    elif name == "bergson":
        out["bergson trackstar final"] = {"rows": A["trackstar"].mean(0), "best_span": None}
    return out


def default_ranking(A: dict[str, np.ndarray], refs: dict[str, np.ndarray], n: int) -> dict[str, Any]:
    """Gradian's default verdict (``AttributeSpec()``), computed with the pipeline's own functions from the
    trajectory run's per-checkpoint matrices and the reference run's matrices (no second index pass).
    """
    from gradian.attribute.evidence import EngineScores
    from gradian.attribute.pipeline import AttributeSpec
    from gradian.attribute.ranking import fuse_scores, rank_statistic
    from gradian.data.spans import SentenceUnit

    spec = AttributeSpec()
    w = A["weights"]
    e = spec.engine.name

    def tr(kind):
        key = f"{e}.ck0.{kind}"
        return sum(wt * A[f"{e}.ck{t}.{kind}"] for t, wt in enumerate(w)) if key in A else None

    es = EngineScores(e, tr("raw"), tr("cosine"), tr("unit_raw"), tr("unit_cosine"))
    units = None
    if "unit_rows" in A:
        units = [
            SentenceUnit(int(r), int(a) if a >= 0 else None, int(b) if b >= 0 else None, 0, 0)  # only .row is read
            for r, (a, b) in zip(A["unit_rows"], A["unit_spans"])
        ]
    st = rank_statistic(es, spec, units, n)
    rows = st.rows
    weights = {}
    if spec.fuse:
        rows, weights = fuse_scores(st.rows, {r: refs[f"{r}.{getattr(spec, r).mode}"].mean(0) for r in spec.fuse})
    spans = None
    if units is not None:
        spans = _blamed(es.unit_raw, A["unit_rows"], A["unit_spans"])
    return {"rows": rows, "best_span": spans, "fuse_weights": weights, "spec": spec.to_dict()}


def metrics(rows: np.ndarray, ids: list[str], truth: dict, lost: set[str], best_span: dict | None) -> dict[str, Any]:
    from gradian.worlds.scorecard import score_ranking, spans_overlap

    r = score_ranking(rows, ids, truth["culprits"])
    out = {
        "auc": r["auc"],
        "auc_by_kind": r["auc_by_kind"],
        "p_at_n": r["precision_at_n_culprits"],
        "p_at_10": r["precision_at_10"],
    }
    if best_span is not None:
        pos = {i: j for j, i in enumerate(ids)}
        buried = [c for c in truth["culprits"] if c["kind"] == "buried" and c["eval_id"] in lost]
        hits = sum(
            1
            for c in buried
            if pos[c["id"]] in best_span and spans_overlap(best_span[pos[c["id"]]], (c["char_start"], c["char_end"]))
        )
        out["localisation"] = {"hits": hits, "n": len(buried)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=Path, action="append", required=True)
    ap.add_argument("--adapter", type=Path, action="append", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--project-dim", type=int, default=512, help="JL numbers per LoRA block (SmolLM2: 512, as the demo)"
    )
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {', '.join(METHODS)}")
    ap.add_argument(
        "--reuse-index",
        type=Path,
        default=None,
        help="parent folder of existing gradient indexes to reuse (e.g. ~/.cache/gradian/index): quality "
        "numbers are the same, but Gradian's wall times then exclude the index builds",
    )
    args = ap.parse_args()
    if len(args.world) != len(args.adapter):
        raise SystemExit("give one --adapter per --world")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    report: dict[str, Any] = {"worlds": []}
    for world, adapter in zip(args.world, args.adapter):
        work = args.out.parent / f"{args.out.stem}-{world.name}"
        work.mkdir(parents=True, exist_ok=True)
        task = _task(world, adapter, work / "evaluation.json", args.project_dim)
        truth = json.loads((world / "ground_truth.json").read_text())
        ids = [json.loads(line)["id"] for line in (world / "train.jsonl").read_text().splitlines() if line.strip()]
        lost = {q["item_id"] for q in task["queries"]}
        entry: dict[str, Any] = {
            "world": str(world),
            "adapter": str(adapter),
            "evaluation": task["evaluation"],
            "n_rows": len(ids),
            "n_culprits": len(truth["culprits"]),
            "n_failing": len(lost),
            "methods": {},
        }
        arrays: dict[str, dict[str, np.ndarray]] = {}
        names = args.methods.split(",")
        if "references" in names and "trajectory" in names:  # the default verdict needs both; references first
            names = ["references"] + [x for x in names if x != "references"]
        for name in names:
            print(f"[{world.name}] {name} ...", flush=True)
            reuse = args.reuse_index if name in GRADIENT_METHODS else None
            A, meta = run_method(name, task, work, reuse)
            m = {
                "wall_s": meta.get("wall_s"),
                "peak_rss_mb": meta.get("peak_rss_mb"),
                "timing": meta.get("timing"),
                "error": meta.get("error"),
                "rankings": {},
                "indexes_reused": reuse is not None,
            }
            if A is not None:
                for label, v in variants(name, A, len(ids)).items():
                    m["rankings"][label] = metrics(v["rows"], ids, truth, lost, v["best_span"])
            else:
                print(meta.get("trace", ""), file=sys.stderr)
            entry["methods"][name] = m
            if name == "references" and A is not None:
                arrays["references"] = A
            if name == "trajectory" and A is not None:
                arrays["trajectory"] = A
            if {"trajectory", "references"} <= set(arrays) and "default" not in entry["methods"]:
                d = default_ranking(arrays["trajectory"], arrays["references"], len(ids))
                tm = entry["methods"]["trajectory"]["timing"] or {}
                cost = sum(v for k, v in tm.items() if k.startswith(("index[", "queries[", "score["))) + sum(
                    (entry["methods"]["references"]["timing"] or {}).get(
                        f"{r}.contrast" if r == "bm25" else f"{r}.said", 0
                    )
                    for r in d["spec"]["references"]
                )
                entry["methods"]["default"] = {
                    "rankings": {"gradian default": metrics(d["rows"], ids, truth, lost, d["best_span"])},
                    "wall_s": cost,
                    "fuse_weights": d["fuse_weights"],
                    "spec": d["spec"],
                    "peak_rss_mb": max(entry["methods"][k]["peak_rss_mb"] or 0 for k in ("trajectory", "references")),
                    "note": "computed from the trajectory and references runs; wall = their stage times",
                }
                r = entry["methods"]["default"]["rankings"]["gradian default"]
                print(
                    f"  gradian default AUC {r['auc']:.3f} {r['auc_by_kind']} P@n {r['p_at_n']:.2f} P@10 "
                    f"{r['p_at_10']:.2f} "
                    f"loc {r.get('localisation')} fuse {d['fuse_weights']}",
                    flush=True,
                )
            for label, r in m["rankings"].items():
                loc = r.get("localisation")
                print(
                    f"  {label:38s} AUC {r['auc']:.3f} (direct {r['auc_by_kind'].get('direct', float('nan')):.3f}, "
                    f"buried {r['auc_by_kind'].get('buried', float('nan')):.3f})  P@n {r['p_at_n']:.2f}  P@10 "
                    f"{r['p_at_10']:.2f}" + (f"  loc {loc['hits']}/{loc['n']}" if loc else ""),
                    flush=True,
                )
            print(
                f"  wall {m['wall_s'] or float('nan'):.0f} s, peak RSS {m['peak_rss_mb'] or float('nan'):.0f} MB"
                + (f"; ERROR {m['error']}" if m["error"] else ""),
                flush=True,
            )
            args.out.write_text(json.dumps(report | {"worlds": report["worlds"] + [entry]}, indent=1, default=float))
        report["worlds"].append(entry)
        args.out.write_text(json.dumps(report, indent=1, default=float))


if __name__ == "__main__":
    main()
