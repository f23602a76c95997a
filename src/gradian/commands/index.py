"""``gradian index``: compute and store per-example training gradients (content-addressed)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from gradian.commands import _options as O
from gradian.commands._common import console, print_line, progress_bar, run_folder_inputs, user_errors


def register(app: typer.Typer) -> None:
    """Add ``gradian index`` (build or reuse the content-addressed gradient index) to ``app``."""

    @app.command("index")
    @user_errors
    def index_cmd(
        ctx: typer.Context,
        base: str = O.BASE,
        adapter: Path = O.ADAPTER,
        data: Path = O.DATA,
        config: list[Path] | None = O.configs("the tokenisation (max length, loss mask) the gradients use"),
        run_folder: bool = O.RUN_FOLDER,
        base_quant: str = O.BASE_QUANT,
        max_length: int = O.MAX_LENGTH,
        loss_on: str = O.LOSS_ON,
        modules: str | None = O.MODULES,
        project_dim: int = O.PROJECT_DIM,
        storage_dtype: str = O.STORAGE_DTYPE,
        batch_size: int = typer.Option(8, help="Examples per backward pass.", rich_help_panel=O.DEVICES),
        shard_size: int = O.SHARD_SIZE,
        rows_per_forward: int = O.ROWS_PER_FORWARD,
        dtype: str = O.DTYPE,
        device: str = O.DEVICE,
        trust_remote_code: bool = O.TRUST_REMOTE_CODE,
        out: Path | None = typer.Option(
            None,
            help="The index folder it writes: the gradient indexes, one sub-folder per checkpoint and unit by content "
            "id (default: the cache, GRADIAN_CACHE/index); what gradian attribute --index takes.",
            rich_help_panel=O.STORAGE,
        ),
        checkpoints: list[str] | None = O.CHECKPOINTS,
        unit: str = O.UNIT,
        optimizer: str = O.OPTIMIZER,
        max_units_per_row: int = O.MAX_UNITS_PER_ROW,
        unit_grads: str = O.UNIT_GRADS,
        seed: int = typer.Option(0, help="Seed (projection).", rich_help_panel=O.ENGINES),
        max_index_gb: float | None = O.MAX_INDEX_GB,
        plan_only: bool = O.PLAN_ONLY,
        one_pass: bool = O.ONE_PASS,
    ) -> None:
        """Build (or resume) the per-example LoRA gradient index of a training set.

        Under torchrun (`torchrun --nproc-per-node N -m gradian index ...`) the ranks share the
        work; the index folder must be on a filesystem every rank sees (docs/distributed.md).
        """
        import dataclasses

        from gradian import distributed
        from gradian.attribute.trajectory import checkpoint_weights, resolve_trajectory
        from gradian.commands._common import distributed_job, grad_spec_from_options
        from gradian.commands.attribute import checkpoint_selection
        from gradian.data.formats import load_examples
        from gradian.data.tokenize import row_values
        from gradian.finetune import load_finetune, tokenize_training_set, training_index
        from gradian.index.build import check_build_args, check_unit_grads
        from gradian.index.store import select_blocks

        tokenize, setup = None, None
        config, _, card = run_folder_inputs(adapter, config, None, read=run_folder, want_logs=False)
        if config or card is not None:  # the run's own tokenisation (flags given on the command line still win)
            from gradian.commands.attribute import training_setup

            setup = training_setup(ctx, config, data, max_length, loss_on, adapter=adapter, card=card)
            tokenize = setup.tokenize_spec()
            max_length, loss_on = tokenize.max_length, tokenize.loss_on
        # every flag and the data are checked before the model is loaded
        spec = grad_spec_from_options(
            max_length,
            loss_on,
            modules,
            project_dim,
            storage_dtype,
            seed,
            optimizer,
            unit,
            max_units_per_row,
            unit_grads,
        )
        if spec.unit == "sentence":
            check_unit_grads(spec, one_pass)
        if tokenize is None:  # no config: the chat template saved beside the adapter still renders chat rows
            from gradian.data.setup import adapter_template

            saved = adapter_template(adapter)
            tokenize = dataclasses.replace(spec.tokenize, chat_template=saved[0] if saved else None)
        spec = dataclasses.replace(spec, tokenize=tokenize)
        check_build_args(batch_size, shard_size, rows_per_forward)
        from gradian.commands.attribute import index_budget

        budget = index_budget(ctx, max_index_gb)
        from gradian.commands._common import base_model_spec
        from gradian.data.setup import trained_quant

        mspec = base_model_spec(base, dtype, device, trust_remote_code, base_quant, trained_quant(setup, adapter))
        examples = load_examples(data)

        def same_on_every_rank() -> dict:  # beside the base, adapter and data (computed only under torchrun)
            return {
                "the flags": {
                    **spec.to_dict(),
                    "dtype": dtype,
                    "batch_size": batch_size,
                    "shard_size": shard_size,
                    "rows_per_forward": rows_per_forward,
                    "checkpoints": checkpoints,
                    "out": str(out) if out else None,
                }
            }

        with distributed_job(device, base, adapter, data, same_on_every_rank):
            ft = load_finetune(mspec, adapter)
            # the saved template dropped when it is the tokenizer's own (the same tokens, the same index id)
            spec = dataclasses.replace(spec, tokenize=spec.tokenize.for_tokenizer(ft.tokenizer))
            select_blocks(ft.model, spec)  # --modules must select a layer (checked before the progress bar starts)
            for note in ft.notes:
                console.print(f"[yellow]note:[/] {escape(note)}")
            trajectory = resolve_trajectory(adapter, checkpoint_selection(checkpoints))
            items = tokenize_training_set(examples, ft.tokenizer, spec, data, lazy=True)  # a few numbers a row
            from gradian.attribute.datacheck import check_data_matches_adapter
            from gradian.index.plan import run_plan, with_dim

            if spec.optimizer == "adam":  # a bad optimizer.pt is named before the plan is printed
                from gradian.finetune import _optimizer_file
                from gradian.gradients.adam import read_adam_state

                for ck in trajectory.checkpoints:
                    read_adam_state(_optimizer_file(ft, ck), ft.model)

            plan, spec = run_plan(  # before any gradient: the indexes, their sizes, the budget, the time
                ft,
                data,
                examples,
                items,
                spec,
                trajectory.checkpoints,
                ("row", "sentence") if spec.unit == "sentence" else ("row",),  # what the loop below builds
                seed=seed,
                parent=out,
                budget=budget,
                joint=one_pass and spec.unit == "sentence",
                per_forward=rows_per_forward,
            )
            spec = with_dim(spec, distributed.broadcast_object(spec.projection.dim))  # every rank stores rank 0's
            for line in plan.lines():
                print_line(line)
            if plan_only:
                return
            check = check_data_matches_adapter(ft, data, items, batch_size=rows_per_forward)  # warns on a mismatch
            if check is not None:
                print_line(check.line())
            # what `attribute --unit` reads: the row index, and with "sentence" the sentence-unit index too
            from dataclasses import replace

            specs = [replace(spec, unit="row")] + ([spec] if spec.unit == "sentence" else [])
            units = None
            from gradian.index.shards import hashed_once  # a shard written here is hashed once, as it is finished

            if one_pass and spec.unit == "sentence":  # both indexes: one pass per row (gradian.index.joint)
                from gradian.data.spans import sentence_units
                from gradian.index.joint import maybe_build_jointly

                units = sentence_units(examples, items, spec.max_units_per_row)
            with hashed_once():  # a shard written or hashed here is not hashed again in this command
                for ck, spec in ((c, sp) for c in trajectory.checkpoints for sp in specs):
                    with checkpoint_weights(ft.model, ck), progress_bar() as pb:
                        if units is not None and spec.unit == "row":
                            maybe_build_jointly(
                                ft,
                                data,
                                items,
                                units,
                                spec,
                                seed=seed,
                                parent=out,
                                checkpoint=ck,
                                batch_size=batch_size,
                                shard_size=shard_size,
                                progress_factory=lambda n, lab=ck.label: pb.task(
                                    f"row + sentence gradients ({lab})", n
                                ),
                                announce=lambda line, lab=ck.label: console.print(
                                    f"{lab}: {escape(line)}", highlight=False, soft_wrap=True
                                ),
                                per_forward=rows_per_forward,
                            )
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
                            progress_factory=lambda n, lab=ck.label, u=spec.unit: pb.task(
                                f"per-{u} gradients ({lab})", n
                            ),
                            announce=lambda line, lab=ck.label: console.print(
                                f"{lab}: {escape(line)}", highlight=False, soft_wrap=True
                            ),
                        )
                    state = "reused (no pass over the training set)" if reused else "built"
                    console.print(
                        f"{ck.label}: index [bold]{idx.id}[/] {state}: {idx.n} {spec.unit}s, "
                        f"{len(idx.blocks)} LoRA blocks → {escape(str(idx.root))}"
                    )
            trunc = sum(row_values(items, "truncated"))
            if trunc and spec.tokenize.drop_long:  # axolotl's default: a longer row was never trained
                console.print(
                    f"[yellow]{trunc} rows are longer than {max_length} tokens: the trainer dropped them, so they are "
                    "scored with no supervised token (a zero gradient)[/]"
                )
            elif trunc:
                console.print(f"[yellow]{trunc} rows were truncated at {max_length} tokens[/]")
            folder = idx.root.parent  # --out, or the cache's index folder
            console.print(
                f"index folder: {escape(str(folder))} (gradian attribute --index {escape(str(folder))} reads it)",
                highlight=False,
                soft_wrap=True,
            )
            distributed.barrier()  # every rank done before the group goes (no rank exits under a live peer)
