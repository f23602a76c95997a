"""Render the JSON of ``bench_peers.py`` as the Markdown tables in docs/benchmarks.md.

    python benchmarks/peers_table.py peers-caps.json [peers-beh.json ...] [--all]

One table per world: the default verdict first, then every peer and reference engine, then
(``--all``) every Gradian variant (engine × final/first/trajectory × raw/cosine × row/sentence).
Wall time is end to end for the method (its own process), and the ratio is over Gradian's
default; ``*`` marks Gradian rows whose indexes were reused (their wall time is then the stage
times recorded in the run, which exclude the index builds: see the note under the table).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PEERS = ("bm25 said", "bm25 contrast", "repsim said", "repsim contrast", "kronfluence ekfac final",
         "bergson trackstar final")


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


def table(world: dict, all_variants: bool) -> str:
    default_wall = (world["methods"].get("default") or {}).get("wall_s")
    lines = [f"**{Path(world['world']).name}** ({world['n_rows']} rows, {world['n_culprits']} culprits, "
             f"{world['n_failing']} failing items)", "",
             "| method | AUC | direct | buried | P@n | P@10 | buried loc. | wall s | × default | peak RSS MB |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, r, m in rows_of(world, all_variants):
        kinds = r.get("auc_by_kind", {})
        loc = r.get("localisation")
        wall = m.get("wall_s")
        star = "*" if m.get("indexes_reused") or "note" in m else ""
        ratio = wall / default_wall if wall and default_wall else None
        locs = f"{loc['hits']}/{loc['n']}" if loc else "—"
        lines.append(
            f"| {label} | {_fmt(r.get('auc'))} | {_fmt(kinds.get('direct'))} | {_fmt(kinds.get('buried'))} | "
            f"{_fmt(r.get('p_at_n'), '.2f')} | {_fmt(r.get('p_at_10'), '.2f')} | "
            f"{locs} | {_fmt(wall, '.0f')}{star} | {_fmt(ratio, '.2f')} | "
            f"{_fmt(m.get('peak_rss_mb'), '.0f')} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", type=Path, nargs="+")
    ap.add_argument("--all", action="store_true", help="also every Gradian variant")
    args = ap.parse_args()
    for p in args.json:
        for w in json.loads(p.read_text())["worlds"]:
            print(table(w, args.all))
            print()


if __name__ == "__main__":
    main()
