"""Which checkpoints need sentence units? The default verdict with its unit scores from a subset of the trajectory.

The default verdict ranks a row by its most harmful sentence unit, with each unit's score summed over the
training trajectory (``U = Σ_t w_t U_t``, ``w`` the trajectory's learning-rate weights). Units are most of the
verdict's compute: at every checkpoint a row costs one forward and ``K_j + 1`` backward vectors (its K_j units and
its residual) instead of one. This benchmark asks, per world of a family, what the verdict loses when the units
are scored at some checkpoints only, the weights of the others dropped (the scores renormalised to the same
total weight, which no rank depends on):

* ``trajectory``: every checkpoint (today's default);
* ``first``, ``last``: one checkpoint;
* ``first+last``: two.

It runs Gradian's own pipeline functions once per world (``bench_peers.py``'s ``trajectory`` and
``references`` methods, every per-checkpoint matrix kept) and rebuilds the default ranking
(``bench_peers.default_ranking``) from each subset, so the rankings differ in the units' checkpoints only
(BM25/RepSim fusion as the default does it). The cost column counts backward vectors over the trajectory:
units and one residual per row at a checkpoint with units, one per row at a checkpoint without
(``n_units + n`` per unit checkpoint; that count is the SmolLM2 worked world's measured 1,356 per checkpoint).

    python benchmarks/bench_unit_checkpoints.py --family DIR --out OUT.json [--variants a,b] [--project-dim D]
    python benchmarks/bench_unit_checkpoints.py --world W --adapter A --out OUT.json [--project-dim D] \
        [--index-root DIR]    # one world; reuse a built index root (GRADIAN_CACHE/index of its attribute run)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_family import _f, family_variants  # noqa: E402  (the family table's number format, --variants)

SCHEMES = ("trajectory", "first", "last", "first+last")


def scheme_weights(w: np.ndarray, scheme: str) -> np.ndarray:
    """The unit weights of ``scheme`` over a trajectory with weights ``w`` (K,), scaled to ``w``'s total."""
    K = len(w)
    keep = {"trajectory": range(K), "first": [0], "last": [K - 1], "first+last": sorted({0, K - 1})}[scheme]
    out = np.zeros(K)
    for t in keep:
        out[t] = w[t]
    return out * (w.sum() / out.sum())


def with_unit_weights(A: dict[str, np.ndarray], uw: np.ndarray) -> dict[str, np.ndarray]:
    """``A`` with every per-checkpoint unit matrix rescaled so ``Σ_t w_t U'_t = Σ_t uw_t U_t`` (rows untouched)."""
    w = A["weights"]
    out = dict(A)
    for k in A:
        if ".ck" in k and ".unit_" in k:
            t = int(k.split(".ck")[1].split(".")[0])
            out[k] = A[k] * (uw[t] / w[t] if w[t] > 0 else 0.0)  # a zero-weight checkpoint adds nothing either way
    return out


def backward_vectors(n: int, n_units: int, K: int, scheme: str) -> int:
    """Backward vectors over the trajectory: ``n_units + n`` at a unit checkpoint, ``n`` at any other."""
    kept = {"trajectory": K, "first": 1, "last": 1, "first+last": min(K, 2)}[scheme]
    return kept * (n_units + n) + (K - kept) * n


def study(world: Path, adapter: Path, work: Path, project_dim: int, index_root: Path | None) -> dict[str, Any]:
    from bench_peers import _task, default_ranking, metrics, run_method

    work.mkdir(parents=True, exist_ok=True)
    task = _task(world, adapter, work / "evaluation.json", project_dim)
    truth = json.loads((world / "ground_truth.json").read_text())
    ids = [json.loads(x)["id"] for x in (world / "train.jsonl").read_text().splitlines() if x.strip()]
    n = len(ids)
    lost = {q["item_id"] for q in task["queries"]}
    refs, rmeta = run_method("references", task, work)
    A, ameta = run_method("trajectory", task, work, index_root)
    if refs is None or A is None:
        raise SystemExit(f"{world}: a run failed: {rmeta.get('error') or ameta.get('error')}")
    w = np.asarray(A["weights"], dtype=float)
    out: dict[str, Any] = {
        "rows": n,
        "units": int(len(A["unit_rows"])),
        "checkpoints": len(w),
        "weights": w.tolist(),
        "n_failing": len(task["queries"]),
        "schemes": {},
    }
    for s in SCHEMES:
        d = default_ranking(with_unit_weights(A, scheme_weights(w, s)), refs, n)
        out["schemes"][s] = metrics(d["rows"], ids, truth, lost, d["best_span"]) | {
            "backward_vectors": backward_vectors(n, out["units"], len(w), s),
            "fuse_weights": d["fuse_weights"],
        }
    return out


def table(report: dict[str, Any]) -> str:
    head = "| variant | rows | units | ckpts | " + " | ".join(f"AUC {s}" for s in SCHEMES)
    head += " | " + " | ".join(f"buried {s}" for s in SCHEMES) + " | backward vectors (" + " / ".join(SCHEMES) + ") |"
    lines = [head, "|---|" + "---:|" * (3 + 2 * len(SCHEMES) + 1)]
    for v in report["variants"]:
        if "schemes" not in v:
            lines.append(f"| {v['name']} | {v.get('skipped', '')} |")
            continue
        sc = v["schemes"]
        lines.append(
            f"| {v['name']} | {v['rows']} | {v['units']} | {v['checkpoints']} | "
            + " | ".join(_f(sc[s]["auc"]) for s in SCHEMES)
            + " | "
            + " | ".join(_f(sc[s]["auc_by_kind"].get("buried")) for s in SCHEMES)
            + " | "
            + " / ".join(str(sc[s]["backward_vectors"]) for s in SCHEMES)
            + " |"
        )
    done = [v for v in report["variants"] if "schemes" in v]
    if done:
        worst = {s: min(v["schemes"][s]["auc"] for v in done) for s in SCHEMES}
        lines.append("| **worst** | | | | " + " | ".join(f"**{_f(worst[s])}**" for s in SCHEMES) + " |" * 6)
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", type=Path, help="a folder written by gradian world --family, trained")
    ap.add_argument("--world", type=Path, help="one world instead of a family (with --adapter)")
    ap.add_argument("--adapter", type=Path, help="the world's trained adapter (its checkpoint-* trajectory)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--variants", default=None, help="comma-separated subset of the family's variant names")
    ap.add_argument("--project-dim", type=int, default=0, help="JL numbers per LoRA block (0: exact, as tiny plans)")
    ap.add_argument("--index-root", type=Path, default=None, help="a built index root to reuse (one world only)")
    args = ap.parse_args()
    if args.world is not None:
        if args.adapter is None:
            ap.error("--world needs --adapter")
        worlds = [(args.world.name, args.world, args.adapter)]
        report: dict[str, Any] = {"world": str(args.world), "variants": []}
    elif args.family is not None:
        fam, variants = family_variants(args.family, args.variants)
        worlds = [(v["name"], args.family / v["name"], args.family / v["name"] / "adapter") for v in variants]
        report = {"family": str(args.family), "kind": fam["kind"], "variants": []}
    else:
        ap.error("give --family DIR or --world W --adapter A")
    for name, world, adapter in worlds:
        print(f"[{name}] ...", flush=True)
        if not (adapter / "adapter_model.safetensors").exists():
            report["variants"].append({"name": name, "skipped": "not trained"})
            continue
        try:
            entry = {"name": name} | study(
                world, adapter, args.out.parent / f"{args.out.stem}-work" / name, args.project_dim, args.index_root
            )
        except SystemExit as e:  # nothing regressed: nothing to rank
            entry = {"name": name, "skipped": str(e).split(": ", 1)[-1]}
        report["variants"].append(entry)
        args.out.write_text(json.dumps(report, indent=1, default=float))
    print(table(report))


if __name__ == "__main__":
    main()
