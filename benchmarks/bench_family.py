"""The default verdict on every world of a family, run as a user runs it (issue 23).

For each variant folder of ``gradian world --family DIR`` (``DIR/family.json``), in order:

1. ``gradian train --base B --data train.jsonl --eval-data valid.jsonl --config train.yaml --out adapter``;
2. ``gradian attribute --base B --adapter adapter --data train.jsonl --eval eval.jsonl --config train.yaml
   --out run`` with every other flag at its default;
3. the ground-truth scorecard of ``run/run.json`` (:func:`gradian.worlds.scorecard.scorecard`, with the
   buried-sentence localisation of :func:`gradian.worlds.demo.localise_buried`): the default verdict's
   AUC (all, direct, buried), P@10, P@n, localisation; and the AUC of each ranking the run carries on its
   own: BM25, RepSim, gradient-dot (the second engine) and the unfused primary gradient engine.

Each command runs in its own process (``sys.executable -m gradian``), timed end to end.

``--units`` also measures the unit-count hypothesis: the Spearman correlation, over benign rows, of the
rank score with the row's number of sentence units, and the two opt-in corrections of
:mod:`gradian.attribute.unit_null` against the default's row minimum. For that it recomputes the
per-unit scores with ``benchmarks/bench_peers.py``'s ``trajectory`` and ``references`` methods (the
pipeline's functions, same rows and queries) and rebuilds the default from them
(``bench_peers.default_ranking``), so the corrected rankings differ from the default in the unit rule only.

    python benchmarks/bench_family.py --family DIR --out family.json [--variants a,b] [--units] [--table]
    python benchmarks/bench_family.py --table-from family.json      # the Markdown tables only
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent


def _run(cmd: list[str], log: Path) -> float:
    t = time.perf_counter()
    with log.open("w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=os.environ.copy())
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed (exit {r.returncode}); see {log}")
    return time.perf_counter() - t


def train_and_attribute(
    world: Path, retrain: bool = False, extra: list[str] | None = None, run_name: str = "run"
) -> dict[str, float]:
    """``gradian train`` (unless ``world/adapter`` exists) then ``gradian attribute`` into ``world/run_name`` with
    defaults and ``extra``; their wall times (s).
    """
    base = json.loads((world / "world.json").read_text())["base"]
    g = [sys.executable, "-m", "gradian"]
    times: dict[str, float] = {}
    if retrain or not (world / "adapter" / "adapter_model.safetensors").exists():
        times["train_s"] = _run(
            g
            + ["train", "--base", base, "--data", str(world / "train.jsonl"), "--eval-data", str(world / "valid.jsonl")]
            + ["--config", str(world / "train.yaml"), "--out", str(world / "adapter"), "--overwrite"],
            world / "train.log",
        )
    times["attribute_s"] = _run(
        g
        + ["attribute", "--base", base, "--adapter", str(world / "adapter"), "--data", str(world / "train.jsonl")]
        + ["--eval", str(world / "eval.jsonl"), "--config", str(world / "train.yaml"), "--out", str(world / run_name)]
        + list(extra or []),
        world / f"attribute{'' if run_name == 'run' else '-' + run_name}.log",
    )
    return times


def score_run(world: Path, run_name: str = "run") -> dict[str, Any]:
    """The scorecard of ``world/run_name/run.json`` flattened to the table's numbers (``None`` when nothing
    regressed).
    """
    from gradian.worlds.demo import localise_buried
    from gradian.worlds.scorecard import score_ranking, scorecard

    run = json.loads((world / run_name / "run.json").read_text())
    truth = json.loads((world / "ground_truth.json").read_text())
    att = run.get("attribution")
    if not att or not att.get("capabilities"):
        return {"regressed": False, "stopped": run.get("stopped")}
    card = scorecard(run, truth, localise_buried(run, truth))
    cap = att["capabilities"][0]
    entry = card["capabilities"][cap["capability"]]
    d = entry[cap["engine"]]
    out: dict[str, Any] = {
        "regressed": True,
        "n_failing": len(cap["queries"]),
        "auc": d["auc"],
        "direct": d["auc_by_kind"].get("direct"),
        "buried": d["auc_by_kind"].get("buried"),
        "p_at_10": d["precision_at_10"],
        "p_at_n": d["precision_at_n_culprits"],
        "localisation": entry["localisation"],
        "localisation_all": scorecard(run, truth, localise_buried(run, truth, every=True))["capabilities"][
            cap["capability"]
        ]["localisation"],
        "queried_auc": d["queried_culprits"]["auc"],
        "fuse_weights": cap["ranking"].get("fuse_weights"),
    }
    for name, key in (("bm25", "bm25"), ("repsim", "repsim"), ("graddot", "graddot")):
        if key in entry:
            out[f"{name}_auc"] = entry[key]["auc"]
            out[f"{name}_by_kind"] = entry[key]["auc_by_kind"]
    grad = (cap.get("evidence") or {}).get("gradient")
    if grad is not None:
        r = score_ranking(grad["scores"], att["train_ids"], truth.get("culprits", []))
        out["gradient_unfused_auc"] = r["auc"]
    return out


def unit_study(world: Path, work: Path) -> dict[str, Any]:
    """The unit-count hypothesis on one world (module docstring): correlations and the two corrections."""
    sys.path.insert(0, str(HERE))
    from scipy.stats import spearmanr

    from bench_peers import _task, default_ranking, metrics, run_method
    from gradian.attribute.pipeline import AttributeSpec
    from gradian.attribute.ranking import fuse_scores
    from gradian.attribute.unit_null import METHODS, corrected_rows, units_per_row

    work.mkdir(parents=True, exist_ok=True)
    task = _task(world, world / "adapter", work / "evaluation.json", 0)
    truth = json.loads((world / "ground_truth.json").read_text())
    ids = [json.loads(x)["id"] for x in (world / "train.jsonl").read_text().splitlines() if x.strip()]
    n = len(ids)
    lost = {q["item_id"] for q in task["queries"]}
    refs, _ = run_method("references", task, work)
    A, _ = run_method("trajectory", task, work)
    if refs is None or A is None:
        raise SystemExit(f"{world}: the per-unit runs failed (see {work})")
    d = default_ranking(A, refs, n)
    spec = AttributeSpec()
    e = spec.engine.name
    w = A["weights"]
    U = sum(wt * A[f"{e}.ck{t}.unit_{spec.statistic}"] for t, wt in enumerate(w))
    u = U.mean(0)
    k = units_per_row(A["unit_rows"], n)
    culprit = {c["id"] for c in truth["culprits"]}
    benign = np.array([i not in culprit for i in ids])
    ref = {r: refs[f"{r}.{getattr(spec, r).mode}"].mean(0) for r in spec.fuse}

    def rho(x: np.ndarray) -> float:
        return float(spearmanr(x[benign], k[benign]).statistic) if len(set(k[benign])) > 1 else float("nan")

    # the row minimum of the items' mean unit score (the default before 2026-12-02), which unit_null corrects
    gmin = np.full(n, np.inf)
    np.minimum.at(gmin, A["unit_rows"].astype(int), u)
    out: dict[str, Any] = {
        "units_per_row": {"min": int(k.min()), "max": int(k.max()), "benign_mean": float(k[benign].mean())},
        "rho_benign_units": {"default": rho(d["rows"]), "gradient_min": rho(gmin)},
        "rankings": {"default (rebuilt)": metrics(d["rows"], ids, truth, lost, d["best_span"])},
    }
    for method in METHODS:
        g = corrected_rows(u, A["unit_rows"], n, method)
        fused, wts = fuse_scores(g, ref) if spec.fuse else (g, {})
        out["rho_benign_units"][method] = rho(fused)
        out["rho_benign_units"][f"{method} gradient"] = rho(g)
        out["rankings"][method] = metrics(fused, ids, truth, lost, d["best_span"]) | {"fuse_weights": wts}
    return out


def _f(x, spec=".3f") -> str:
    return "—" if x is None or (isinstance(x, float) and x != x) else format(x, spec)


def _weights(w: dict | None) -> str:
    """``"0.08 / 0.23"``: the BM25 and RepSim fusion weights (``—`` for a reference the run did not fuse)."""
    w = w or {}
    return " / ".join(_f(w.get(r), ".2f") for r in ("bm25", "repsim"))


def tables(report: dict[str, Any]) -> str:
    """The Markdown tables of a report (the default per variant; the unit study when it was run)."""
    lines = [
        "| variant | rows | culprits (direct/buried) | failing | AUC | direct | buried | P@10 | P@n | buried loc. "
        "| BM25 | RepSim | gradient-dot | gradient (unfused) | fusion weights (BM25 / RepSim) "
        "| train s | attribute s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for v in report["variants"]:
        s, sz = v["score"], v["sizes"]
        name = v["name"] + (" (held out)" if v["held_out"] else "")
        head = f"| {name} | {sz['train']} | {sz['culprits']} ({sz['direct_rows']}/{sz['buried_rows']}) | "
        if not s.get("regressed"):
            lines.append(head + "— | nothing regressed |" + " |" * 12)
            continue
        loc = s["localisation"]
        locs = f"{loc['hits']}/{loc['buried_rows_drilled']}" if loc["buried_rows_drilled"] else "—"
        lines.append(
            head + f"{s['n_failing']} | {_f(s['auc'])} | {_f(s['direct'])} | {_f(s['buried'])} | "
            f"{_f(s['p_at_10'], '.2f')} | {_f(s['p_at_n'], '.2f')} | {locs} | {_f(s.get('bm25_auc'))} | "
            f"{_f(s.get('repsim_auc'))} | {_f(s.get('graddot_auc'))} | {_f(s.get('gradient_unfused_auc'))} | "
            f"{_weights(s.get('fuse_weights'))} | {_f(v['times'].get('train_s'), '.0f')} | "
            f"{_f(v['times']['attribute_s'], '.0f')} |"
        )
    studied = [v for v in report["variants"] if v.get("units")]
    if studied:
        lines += [
            "",
            "| variant | units/row (benign mean, max) | ρ(benign rank, units): default | gradient min | "
            "expected-min | bottom-2 | AUC default | expected-min | bottom-2 | direct: default / exp-min / bottom-2 "
            "| buried: default / exp-min / bottom-2 |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for v in studied:
            u = v["units"]
            r, rk = u["rho_benign_units"], u["rankings"]
            a, b, c = rk["default (rebuilt)"], rk["expected-min"], rk["bottom-m"]

            def kinds(kind: str, abc: tuple = (a, b, c)) -> str:
                return " / ".join(_f(x["auc_by_kind"].get(kind)) for x in abc)

            lines.append(
                f"| {v['name']} | {u['units_per_row']['benign_mean']:.1f}, {u['units_per_row']['max']} | "
                f"{_f(r['default'], '+.2f')} | {_f(r['gradient_min'], '+.2f')} | {_f(r['expected-min'], '+.2f')} | "
                f"{_f(r['bottom-m'], '+.2f')} | {_f(a['auc'])} | {_f(b['auc'])} | {_f(c['auc'])} | {kinds('direct')} "
                f"| {kinds('buried')} |"
            )
    return "\n".join(lines)


def family_variants(family: Path, names: str | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A family's ``family.json`` and its variants in order: those named in ``names`` (comma-separated) or all."""
    fam = json.loads((family / "family.json").read_text())
    pick = set(names.split(",")) if names else None
    return fam, [v for v in fam["variants"] if pick is None or v["name"] in pick]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", type=Path, help="a folder written by gradian world --family")
    ap.add_argument("--out", type=Path, help="the report (JSON), rewritten after each variant")
    ap.add_argument("--variants", default=None, help="comma-separated subset of the family's variant names")
    ap.add_argument("--units", action="store_true", help="also the unit-count study (per-unit scores recomputed)")
    ap.add_argument("--retrain", action="store_true", help="train again even where an adapter exists")
    ap.add_argument(
        "--attribute-args",
        default="",
        help="extra flags for every gradian attribute, one string; give it with '=' so a lone flag is not read as "
        "an option of this script (e.g. --attribute-args=--save-evidence, or --attribute-args='--fuse-gate tail')",
    )
    ap.add_argument(
        "--run-name",
        default="run",
        help="the attribute run's folder inside each world (default run); another name keeps earlier runs, e.g. to "
        "compare flags on the same adapters and cached indexes",
    )
    ap.add_argument("--table-from", type=Path, default=None, help="print the tables of an earlier report and stop")
    args = ap.parse_args()
    if args.table_from is not None:
        print(tables(json.loads(args.table_from.read_text())))
        return
    if args.family is None or args.out is None:
        ap.error("give --family DIR and --out FILE (or --table-from FILE)")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    fam, variants = family_variants(args.family, args.variants)
    report: dict[str, Any] = {"family": str(args.family), "kind": fam["kind"], "seed": fam["seed"], "variants": []}
    for v in variants:
        world = args.family / v["name"]
        print(f"[{v['name']}] train + attribute ...", flush=True)
        times = train_and_attribute(world, args.retrain, shlex.split(args.attribute_args), args.run_name)
        entry = {k: v[k] for k in ("name", "held_out", "knobs", "resolved", "sizes")} | {"times": times}
        entry["score"] = score_run(world, args.run_name)
        if args.units and entry["score"].get("regressed"):
            print(f"[{v['name']}] unit study ...", flush=True)
            entry["units"] = unit_study(world, args.out.parent / f"{args.out.stem}-work" / v["name"])
        report["variants"].append(entry)
        s = entry["score"]
        print(
            f"  AUC {_f(s.get('auc'))} direct {_f(s.get('direct'))} buried {_f(s.get('buried'))} "
            f"BM25 {_f(s.get('bm25_auc'))} RepSim {_f(s.get('repsim_auc'))} graddot {_f(s.get('graddot_auc'))} "
            f"times {times}",
            flush=True,
        )
        args.out.write_text(json.dumps(report, indent=1, default=float))
    print(tables(report))


if __name__ == "__main__":
    main()
