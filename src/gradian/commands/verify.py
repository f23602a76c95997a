"""``gradian verify RUN_DIR``: retrain without the blamed rows and check that the capability comes back."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from gradian.commands import _options as O
from gradian.commands._common import console, print_step, user_errors, write_report_html
from gradian.defaults import DEVICE


def print_verification(record: dict) -> None:
    """Terminal summary of a verification record."""
    from gradian.report.views import VERIFY_COLUMNS, recovery_text
    from gradian.tables import FitTable

    tr = record.get("trainer", {})
    console.print(
        f"retrained with {escape(tr.get('trainer', '?'))}"
        + (f" ({escape(str(tr.get('config')))})" if tr.get("config") else "")
        + (f"; not reproduced from the config: {escape(', '.join(tr['unmapped']))}" if tr.get("unmapped") else ""),
        highlight=False,
        soft_wrap=True,
    )
    for name, cap in record["capabilities"].items():
        t = FitTable(
            title=f"{escape(name)}: reference {cap['reference']:.2f}, tuned {cap['tuned']:.2f}", heading_columns=1
        )
        for col in VERIFY_COLUMNS:
            t.add_column(col)
        for rname, r in cap["retrains"].items():
            t.add_row(
                escape(rname),
                str(r["removed"]),
                f"{r['score']:.2f}",
                f"{r['delta']:+.2f} [{r['ci_low']:+.2f}, {r['ci_high']:+.2f}]",
                recovery_text(r["recovery"], r["recovery_ci"]),
                f"{r['predicted_query_loss_change']:+.3g}",
                f"{r['measured_query_loss_change']:+.3g}",
            )
        console.print(t)
        if cap.get("lds"):
            console.print(f"  LDS over {cap['lds']['subsets']} half-subsets: Spearman {cap['lds']['spearman']:.2f}")
        style = "bold green" if cap["verified"] else "bold yellow"
        console.print(f"[{style}]{escape(cap['line'])}[/]", soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add ``gradian verify`` (retrain without the verdict's rows and measure) to ``app``."""

    @app.command("verify")
    @user_errors
    def verify_cmd(
        run_dir: Path = O.RUN_DIR,
        remove: int | None = typer.Option(
            None,
            "--remove",
            help="Rows removed per regressed capability (default: the rows of the report's clusters).",
            rich_help_panel=O.VERDICT,
        ),
        remove_cluster: int | None = typer.Option(
            None, "--remove-cluster", help="Remove the rows of cluster N of each capability.", rich_help_panel=O.VERDICT
        ),
        controls: int = typer.Option(
            2, "--controls", help="Retrains without as many random rows.", rich_help_panel=O.VERDICT
        ),
        seed_band: int = typer.Option(
            1, "--seed-band", help="Retrains of the unchanged data with other seeds.", rich_help_panel=O.VERDICT
        ),
        lds: int = typer.Option(
            0,
            "--lds",
            help="Random half-subset retrains for the linear datamodeling score (0: off).",
            rich_help_panel=O.VERDICT,
        ),
        seed: int = typer.Option(
            0, "--seed", help="Seed of the control rows and LDS subsets.", rich_help_panel=O.VERDICT
        ),
        config: Path | None = typer.Option(
            None,
            "--config",
            help="Training config to retrain with (default: the "
            "adapter's training_config.yaml, else the run's --config).",
            rich_help_panel=O.SETUP,
        ),
        train_command: str | None = typer.Option(
            None,
            "--train-command",
            help="Your own trainer: a command line with {data} (edited JSONL), {out} (adapter "
            "folder to write), {seed} and {base}.",
            rich_help_panel=O.SETUP,
        ),
        trust_remote_code: bool = typer.Option(
            False,
            "--trust-remote-code",
            help="Run the base model folder's own code (off by default; never taken from run.json).",
            rich_help_panel=O.DEVICES,
        ),
        allow_changed_inputs: bool = typer.Option(
            False,
            "--allow-changed-inputs",
            help="Retrain even if the training data, eval set, adapter, base or config changed since the run.",
            rich_help_panel=O.INPUTS,
        ),
        device: str = typer.Option(
            DEVICE,
            "--device",
            help=O.DEVICE_HELP + " Where the models are evaluated (the retrains train on their config's device; "
            "gradian train's own default is auto too).",
            rich_help_panel=O.DEVICES,
        ),
    ) -> None:
        """Retrain without the blamed rows (and random controls) and re-evaluate: does the capability come back?"""
        from gradian.verify import VerifySpec, verify_run

        spec = VerifySpec(
            remove=remove, remove_cluster=remove_cluster, controls=controls, seed_band=seed_band, lds=lds, seed=seed
        )
        record = verify_run(
            run_dir,
            spec,
            config=config,
            train_command=train_command,
            trust_remote_code=trust_remote_code,
            allow_changed_inputs=allow_changed_inputs,
            device=device,
            say=print_step,
        )
        print_verification(record)
        html = write_report_html(run_dir)
        console.print(
            f"[dim]verification added to {escape(str(run_dir / 'run.json'))} in {record['seconds']:.0f} s; "
            f"report: {escape(str(html))}[/]"
        )
