"""Benchmarks only: the ``RUN WORLD [RUN WORLD ...]`` arguments of the scripts that re-read saved runs.

``bench_rank_rule.py``, ``bench_checkpoint_weights.py`` and ``bench_drilldown_rule.py`` each take pairs of a
``gradian attribute ... --save-evidence`` run folder and the world it was made on (``ground_truth.json``).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def run_world_pairs(description: str, extra=None) -> tuple[argparse.Namespace, list[tuple[Path, dict, str]]]:
    """Parse ``RUN WORLD ...`` (and ``--json``, plus what ``extra(parser)`` adds).

    Returns:
        ``(args, [(run, truth, name)])``: the run folder, the world's ``ground_truth.json``, and ``name`` the
        world's folder name, or ``parent/name`` where two worlds share a name (each column of a table is then told
        apart).
    """
    import json

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("pairs", nargs="+", help="RUN WORLD [RUN WORLD ...]")
    ap.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    if extra is not None:
        extra(ap)
    args = ap.parse_args()
    if len(args.pairs) % 2:
        ap.error("give RUN WORLD pairs")
    out: list[tuple[Path, dict, str]] = []
    for run_dir, world in zip(args.pairs[::2], args.pairs[1::2]):
        run_dir, world = Path(run_dir), Path(world)
        names = [n for _, _, n in out]
        name = world.name if world.name not in names else f"{world.parent.name}/{world.name}"
        if name in names:
            name = f"{run_dir.name}@{name}"
        out.append((run_dir, json.loads((world / "ground_truth.json").read_text()), name))
    return args, out


def auc_cell(scores, ids: list[str], culprits: list[dict]) -> dict:
    """``{auc, direct, buried, p_at_n, p_at_10}``: one ranking against the planted culprits (the scorecard's)."""
    from gradian.worlds.scorecard import score_ranking

    r = score_ranking(scores, ids, culprits)
    k = r["auc_by_kind"]
    return {
        "auc": r["auc"],
        "direct": k.get("direct"),
        "buried": k.get("buried"),
        "p_at_n": r["precision_at_n_culprits"],
        "p_at_10": r["precision_at_10"],
    }


def print_worst(first: str, table: dict[str, dict[str, dict]], names: list[str], out: Path | None) -> None:
    """The last table: one row per rule, one column per world, and the worst world's AUC ("—" where a rule does
    not apply to a world); also written to ``out`` as JSON.
    """
    import json

    print(f"\n| {first} | " + " | ".join(names) + " | worst |\n|---|" + "---:|" * (len(names) + 1))
    for rule, per in table.items():
        aucs = [per[w]["auc"] if w in per else None for w in names]
        cells = ["—" if x is None else f"{x:.3f}" for x in aucs]
        print(f"| {rule} | " + " | ".join(cells) + f" | {min(x for x in aucs if x is not None):.3f} |")
    if out:
        out.write_text(json.dumps(table, indent=1))


def load_saved(run_dir: Path) -> tuple[dict, str, str, list[str], dict]:
    """``(capability record, capability, primary engine, train_ids, evidence tensors)`` of a saved run's first
    capability (``RUN/run.json`` and ``RUN/evidence.safetensors``).
    """
    import json

    from safetensors.numpy import load_file

    att = json.loads((Path(run_dir) / "run.json").read_text())["attribution"]
    cap = att["capabilities"][0]
    return (
        cap,
        cap["capability"],
        cap["engine"],
        att["train_ids"],
        load_file(str(Path(run_dir) / "evidence.safetensors")),
    )


def run_spec(run_dir: Path):
    """The :class:`~gradian.attribute.pipeline.AttributeSpec` a saved run was made with (its manifest's), so a
    re-formed verdict is that run's own rule, whatever the default is today.
    """
    import json

    from gradian.attribute.pipeline import AttributeSpec

    run = json.loads((Path(run_dir) / "run.json").read_text())
    return AttributeSpec.from_dict(run["manifest"]["identity"]["specs"]["attribute"])


def default_fusion(gradient, T: dict, capability: str, items=None, spec=None, trained=None):
    """``(fused (n,), {reference: weight})``: the references the spec fuses (the default's unless ``spec``) folded
    into a row ranking, as the verdict does (:func:`gradian.attribute.ranking.fuse_scores` with the spec's gate).

    Args:
        gradient: (n,) the gradient engine's row scores.
        T: a saved run's evidence tensors; ``T[f"{capability}/{reference}"]`` is (m, n), one row per failing item.
        items: (m,) bool, the items to average (default: all); a run's own reference scores average the items
            with a wrong answer (``pipeline.reference_items``), which are all of them in a facts world.
        trained: (n,) bool, the rows the run read (None: all): the references score the others 0, and the fusion's
            scales are the trained rows', as the verdict's are.
    """
    import numpy as np

    from gradian.attribute.pipeline import AttributeSpec
    from gradian.attribute.ranking import fuse_scores

    spec = spec or AttributeSpec()
    if not spec.fuse:
        return np.asarray(gradient), {}
    refs = {r: (T[f"{capability}/{r}"] if items is None else T[f"{capability}/{r}"][items]).mean(0) for r in spec.fuse}
    if trained is not None:
        refs = {r: np.where(trained, v, 0.0) for r, v in refs.items()}
    return fuse_scores(gradient, refs, spec.fuse_gate, trained)
