"""``gradian demo``: the worked example end to end, with a ground-truth scorecard."""

from __future__ import annotations

import math
from pathlib import Path

import typer
from rich.markup import escape

from gradian.commands._common import console, print_step, user_errors
from gradian.tables import FitTable


def _f(x, fmt="{:.3f}") -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def print_summary(summary: dict) -> None:
    """Print each demo variant's report path, its per-capability verdicts and its culprit scorecard."""
    for variant, r in summary["runs"].items():
        console.print(f"\n[bold]{variant}[/]: report → {escape(r['report'])}")
        for c in r["evaluation"]:
            console.print(
                f"  {escape(c['name'])}: {c['reference_score']:.3f} → {c['tuned_score']:.3f} "
                f"(Δ {c['delta']:+.3f}, 95% CI [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}]) → {c['verdict']}"
            )
        g = FitTable(title=f"{variant}: accuracy per eval group", show_lines=False)
        for col in ("group", "n", "reference", "tuned"):
            g.add_column(col)
        for name, v in r["groups"].items():
            g.add_row(name, str(v["n"]), f"{v['reference']:.2f}", f"{v['tuned']:.2f}")
        console.print(g)
        if r.get("stopped"):
            console.print(f"  [yellow]{escape(r['stopped'])}[/]")
        card = r["scorecard"]
        for cap, entry in card.get("capabilities", {}).items():
            t = FitTable(title=f"ground-truth scorecard: {cap} ({card['n_culprits']} planted culprits)")
            found = {k for eng, s0 in entry.items() if eng != "localisation" for k in s0["recall_by_kind"]}
            kinds = [k for k in ("direct", "buried") if k in found or not found] + sorted(found - {"direct", "buried"})
            for col in ("engine", "culprits", "n", "AUC", "P@n", "P@10", *(f"recall {k}" for k in kinds)):
                t.add_column(col)
            for eng, s0 in entry.items():
                if eng == "localisation":
                    continue
                for label, s in (("all planted", s0), ("target lost", s0["queried_culprits"])):
                    rk = s["recall_by_kind"]
                    t.add_row(
                        f"{eng} ({s0['role']})",
                        label,
                        str(s["n_culprits"]),
                        _f(s["auc"]),
                        _f(s["precision_at_n_culprits"], "{:.2f}"),
                        _f(s["precision_at_10"], "{:.2f}"),
                        *(_f(rk.get(k), "{:.2f}") for k in kinds),
                    )
            console.print(t)
            loc = entry["localisation"]
            if not loc["buried_rows_drilled"] and "buried" not in found:
                continue  # no buried culprits in this world (behaviour regression): nothing to localise
            console.print(
                f"  buried-sentence localisation: {loc['hits']}/{loc['buried_rows_drilled']} "
                f"({_f(loc['rate'], '{:.0%}')}) of the buried culprits whose target item was lost"
            )
    tm = summary["timing"]
    console.print(f"\n[dim]timing (s): {', '.join(f'{k} {v}' for k, v in tm.items())}[/]")


def register(app: typer.Typer) -> None:
    """Add ``gradian demo`` (world → train → attribute → report, poisoned and null) to ``app``."""

    @app.command("demo")
    @user_errors
    def demo_cmd(
        out: Path = typer.Option(
            Path("demo-run"),
            help="The folder it writes: one run folder per variant (OUT/poisoned, OUT/null: run.json, report.html, "
            "scorecard.json), what gradian report/verify/export take; the worlds and adapters stay in the cache.",
        ),
        kind: str = typer.Option("smollm2", help="smollm2 (the real worked example) or tiny (seconds)."),
        seed: int = typer.Option(0, help="World seed."),
        project_dim: int = typer.Option(512, help="JL numbers per LoRA block in the gradient index (0 = exact)."),
        null: bool = typer.Option(False, "--null/--no-null", help="Also train and evaluate the null variant."),
        faults: bool = typer.Option(
            False,
            "--faults/--no-faults",
            help="Also plant mechanical faults (truncated cluster, unterminated rows) for the Audit lane.",
        ),
        regression: str = typer.Option(
            "facts",
            "--regression",
            "--world",
            help="Which world: facts (wrong capitals, the worked example) or behaviour (verbose answers to "
            "terse instructions; smollm2 only).",
        ),
        quick: bool | None = typer.Option(
            None,
            "--quick/--full",
            help="quick: a smaller SmolLM2 world of its own, 2 epochs (a first run in about 15 min on 2 cores; "
            "the default for --kind smollm2 --regression facts). full: the worked example of "
            "docs/worked-example.md (about half an hour). The tiny and behaviour worlds have one size.",
        ),
    ) -> None:
        """Run the worked example end to end: world → train → evaluate/attribute/audit → report → scorecard."""
        from gradian.errors import GradianUserError
        from gradian.worlds.demo import DemoSpec, run_demo
        from gradian.worlds.profiles import check_profile

        if kind not in ("smollm2", "tiny"):
            raise GradianUserError(f"unknown kind {kind!r}", where="--kind", fix="use smollm2 or tiny")
        if regression not in ("facts", "behaviour"):
            raise GradianUserError(
                f"unknown regression {regression!r}", where="--regression", fix="use facts or behaviour"
            )
        profile = None if quick is None else ("quick" if quick else "full")
        spec = DemoSpec(
            kind=kind,
            seed=seed,
            project_dim=project_dim,
            null=null,
            faults=faults,
            regression=regression,
            profile=profile,
        )
        check_profile(spec.resolved_profile(), kind, regression)
        from gradian.commands._common import progress_bar

        summary = run_demo(spec, out, say=print_step, progress=True, progress_bar=progress_bar)
        print_summary(summary)
        if spec.resolved_profile() == "quick":
            console.print(
                "[dim]quick profile (a smaller world of its own); the worked example of docs/worked-example.md "
                "is `gradian demo --full` (make demo-full, about half an hour)[/]"
            )
        # the last line names the folder it wrote (as every command's does)
        console.print(f"\nreports: {escape(str(out))}/*/report.html · scorecard: {escape(str(out))}/*/scorecard.json")
