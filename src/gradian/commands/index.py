"""``gradian index``: compute and store per-example training gradients (content-addressed)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from gradian.commands import _options as O
from gradian.commands._common import console, progress_bar, user_errors


def register(app: typer.Typer) -> None:
    """Add ``gradian index`` (build or reuse the content-addressed gradient index) to ``app``."""

    @app.command("index")
    @user_errors
    def index_cmd(
        ctx: typer.Context,
        base: str = O.BASE,
        adapter: Path = O.ADAPTER,
        data: Path = O.DATA,
        config: list[Path] | None = typer.Option(
            None, "--config", help="Training config(s): the tokenisation (max length, loss mask) of the run."
        ),
        max_length: int = O.MAX_LENGTH,
        loss_on: str = O.LOSS_ON,
        modules: str | None = O.MODULES,
        project_dim: int = O.PROJECT_DIM,
        storage_dtype: str = O.STORAGE_DTYPE,
        batch_size: int = typer.Option(8, help="Examples per backward pass."),
        shard_size: int = O.SHARD_SIZE,
        dtype: str = O.DTYPE,
        device: str = O.DEVICE,
        trust_remote_code: bool = O.TRUST_REMOTE_CODE,
        out: Path | None = typer.Option(
            None, help="Parent folder of the indexes, one per checkpoint by content id (default: the cache)."
        ),
        checkpoints: list[str] | None = O.CHECKPOINTS,
        unit: str = typer.Option(
            "row", help="row (one gradient per row) | sentence (one per sentence: span-aware ranking)."
        ),
        optimizer: str = O.OPTIMIZER,
        max_units_per_row: int = O.MAX_UNITS_PER_ROW,
        seed: int = typer.Option(0, help="Seed (projection)."),
    ) -> None:
        """Build (or resume) the per-example LoRA gradient index of a training set.

        Under torchrun (`torchrun --nproc-per-node N -m gradian index ...`) the ranks share the
        work; the index folder must be on a filesystem every rank sees (docs/distributed.md).
        """
        from gradian import distributed
        from gradian.attribute.trajectory import checkpoint_weights, resolve_trajectory
        from gradian.commands._common import grad_spec_from_options, input_identity, start_distributed
        from gradian.commands.attribute import checkpoint_selection
        from gradian.data.formats import load_examples
        from gradian.data.tokenize import row_values
        from gradian.finetune import load_finetune, tokenize_training_set, training_index
        from gradian.index.store import check_build_args, select_blocks
        from gradian.models.load import ModelSpec

        if config:  # the run's own tokenisation (flags given on the command line still win)
            from gradian.commands.attribute import apply_training_setup

            max_length, loss_on = apply_training_setup(ctx, config, data, max_length, loss_on)
        # every flag and the data are checked before the model is loaded
        spec = grad_spec_from_options(
            max_length, loss_on, modules, project_dim, storage_dtype, seed, optimizer, unit, max_units_per_row
        )
        check_build_args(batch_size, shard_size)
        mspec = ModelSpec(base, dtype, device, trust_remote_code)
        examples = load_examples(data)
        try:
            start_distributed(
                device,
                lambda: input_identity(
                    base,
                    adapter,
                    data,
                    {
                        "the flags": {
                            **spec.to_dict(),
                            "dtype": dtype,
                            "batch_size": batch_size,
                            "shard_size": shard_size,
                            "checkpoints": checkpoints,
                            "out": str(out) if out else None,
                        }
                    },
                ),
            )
            ft = load_finetune(mspec, adapter)
            select_blocks(ft.model, spec)  # --modules must select a layer (checked before the progress bar starts)
            for note in ft.notes:
                console.print(f"[yellow]note:[/] {escape(note)}")
            trajectory = resolve_trajectory(adapter, checkpoint_selection(checkpoints))
            items = tokenize_training_set(examples, ft.tokenizer, spec, data, lazy=True)  # a few numbers a row
            from gradian.attribute.datacheck import check_data_matches_adapter

            check = check_data_matches_adapter(ft, data, items, batch_size=batch_size)  # warns on a mismatch
            if check is not None:
                console.print(escape(check.line()), highlight=False, soft_wrap=True)
            for ck in trajectory.checkpoints:
                with checkpoint_weights(ft.model, ck), progress_bar() as pb:
                    idx, examples, items, reused = training_index(
                        ft,
                        data,
                        spec,
                        seed=seed,
                        parent=out,
                        batch_size=batch_size,
                        shard_size=shard_size,
                        examples=examples,
                        items=items,
                        checkpoint=ck,
                        progress_factory=lambda n, lab=ck.label: pb.task(f"per-example gradients ({lab})", n),
                        announce=lambda line, lab=ck.label: console.print(
                            f"{lab}: {escape(line)}", highlight=False, soft_wrap=True
                        ),
                    )
                state = "reused (no pass over the training set)" if reused else "built"
                console.print(
                    f"{ck.label}: index [bold]{idx.id}[/] {state}: {idx.n} {spec.unit}s, {len(idx.blocks)} LoRA blocks "
                    f"→ {escape(str(idx.root))}"
                )
            trunc = sum(row_values(items, "truncated"))
            if trunc:
                console.print(f"[yellow]{trunc} rows were truncated at {max_length} tokens[/]")
        finally:
            distributed.shutdown()
