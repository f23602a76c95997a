"""Render the JSON of ``bench_peers.py`` as the Markdown tables in docs/benchmarks.md.

    python benchmarks/peers_table.py peers-caps.json [peers-beh.json ...] [--all]

One table per world: the default verdict first, then every peer and reference engine, then
(``--all``) every Gradian variant (engine × final/first/trajectory × raw/cosine × row/sentence).
Wall time is end to end for the method (its own process). The ratio is over Gradian's default: the
``cli`` method's wall where it ran (the real ``gradian attribute``, Evaluate included, which the peers'
rows are not: they reuse the bench's one evaluation), else its two runs ``trajectory`` + ``references``; ``*`` marks
Gradian rows whose gradient indexes were reused, so their wall time excludes the index builds. Several JSON
files for one world (methods run separately) are merged.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

CLI = "gradian attribute (CLI, end to end)"

PEERS = (
    CLI,
    "bm25 said",
    "bm25 contrast",
    "repsim said",
    "repsim contrast",
    "kronfluence ekfac final",
    "bergson trackstar final",
)


def _fmt(x, spec=".3f") -> str:
    return "—" if x is None or x != x else format(x, spec)


def rows_of(world: dict, all_variants: bool) -> list[tuple[str, dict, dict]]:
    """``[(label, ranking metrics, method entry)]``: default, then peers and references, then variants."""
    out = []
    methods = world["methods"]
    if "default" in methods:
        out.append(("**gradian default**", methods["default"]["rankings"]["gradian default"], methods["default"]))
    for name, m in methods.items():
        if name == "default":
            continue
        for label, r in m["rankings"].items():
            if label in PEERS:
                out.append((label, r, m))
        if m.get("error"):
            out.append((f"{name} (failed: {m['error']})", {}, m))
    if all_variants:
        for name, m in methods.items():
            if name in ("default", "references", "kronfluence", "bergson"):
                continue
            for label, r in m["rankings"].items():
                out.append((f"gradian {label}", r, m))
    return out


def default_wall(world: dict) -> tuple[float | None, bool]:
    """End to end: the ``cli`` method's process where it ran (the real ``gradian attribute``, Evaluate included),
    else the processes of the two runs the default is made of (trajectory + references); and whether the
    gradient indexes were reused (then the index builds are not in it).
    """
    m = world["methods"]
    if m.get("cli", {}).get("wall_s"):
        return m["cli"]["wall_s"], False
    if "default" not in m or not m.get("trajectory", {}).get("wall_s") or not m.get("references", {}).get("wall_s"):
        return None, False
    return m["trajectory"]["wall_s"] + m["references"]["wall_s"], bool(m["trajectory"].get("indexes_reused"))


def table(world: dict, all_variants: bool) -> str:
    dwall, dreused = default_wall(world)
    lines = [
        f"**{Path(world['world']).name}** ({world['n_rows']} rows, {world['n_culprits']} culprits, "
        f"{world['n_failing']} failing items)",
        "",
        "| method | AUC | direct | buried | P@n | P@10 | buried loc. | wall s | × default | peak RSS MB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, r, m in rows_of(world, all_variants):
        kinds = r.get("auc_by_kind", {})
        loc = r.get("localisation")
        wall, reused = (
            (dwall, dreused) if m is world["methods"].get("default") else (m.get("wall_s"), m.get("indexes_reused"))
        )
        star = "*" if reused else ""
        ratio = wall / dwall if wall and dwall else None
        locs = f"{loc['hits']}/{loc['n']}" if loc and loc.get("n") else "—"
        lines.append(
            f"| {label} | {_fmt(r.get('auc'))} | {_fmt(kinds.get('direct'))} | {_fmt(kinds.get('buried'))} | "
            f"{_fmt(r.get('p_at_n'), '.2f')} | {_fmt(r.get('p_at_10'), '.2f')} | "
            f"{locs} | {_fmt(wall, '.0f')}{star} | {_fmt(ratio, '.2f')} | "
            f"{_fmt(m.get('peak_rss_mb'), '.0f')} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", type=Path, nargs="+")
    ap.add_argument("--all", action="store_true", help="also every Gradian variant")
    args = ap.parse_args()
    worlds: dict[str, dict] = {}  # one world's methods may come from several runs (files)
    for p in args.json:
        for w in json.loads(p.read_text())["worlds"]:
            if w["world"] in worlds:
                worlds[w["world"]]["methods"].update(w["methods"])
            else:
                worlds[w["world"]] = w
    for w in worlds.values():
        print(table(w, args.all))
        print()


if __name__ == "__main__":
    main()
