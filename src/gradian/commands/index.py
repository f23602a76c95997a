"""``gradian index``: compute and store per-example training gradients (content-addressed)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from gradian.commands._common import console, progress_bar, user_errors


def register(app: typer.Typer) -> None:
    @app.command("index")
    @user_errors
    def index_cmd(
        base: str = typer.Option(..., help="Base model: HF id (local cache) or folder."),
        adapter: Path = typer.Option(..., help="PEFT LoRA adapter folder."),
        data: Path = typer.Option(..., help="Training data: .jsonl/.json/.parquet or save_to_disk folder."),
        max_length: int = typer.Option(1024, help="Truncate rendered rows to this many tokens (as in training)."),
        loss_on: str = typer.Option("completion", help="'completion' (completion-only loss) or 'all'."),
        modules: Optional[str] = typer.Option(None, help="Comma-separated layer-name filters, e.g. q_proj,v_proj."),
        project_dim: int = typer.Option(0, help="JL projection: numbers kept per LoRA block (0 = exact)."),
        storage_dtype: str = typer.Option("float32", help="float32 | float16 | float64."),
        batch_size: int = typer.Option(8, help="Examples per backward pass."),
        dtype: str = typer.Option("float32", help="Model dtype."),
        device: str = typer.Option("cpu", help="cpu | cuda | mps | auto."),
        trust_remote_code: bool = typer.Option(False, help="Allow model repos' custom code (off by default)."),
        out: Optional[Path] = typer.Option(None, help="Index folder (default: the cache, by content id)."),
        seed: int = typer.Option(0, help="Seed (projection)."),
    ) -> None:
        """Build (or resume) the per-example LoRA gradient index of a training set."""
        from gradian.api import load_finetune, training_index
        from gradian.commands._common import grad_spec_from_options
        from gradian.models.load import ModelSpec

        from gradian.data.formats import load_examples

        from gradian.index.store import check_build_args, select_blocks

        # every flag and the data are checked before the model is loaded
        spec = grad_spec_from_options(max_length, loss_on, modules, project_dim, storage_dtype, seed)
        check_build_args(batch_size)
        mspec = ModelSpec(base, dtype, device, trust_remote_code)
        examples = load_examples(data)
        ft = load_finetune(mspec, adapter)
        select_blocks(ft.model, spec)  # --modules must select a layer (checked before the progress bar starts)
        for note in ft.notes:
            console.print(f"[yellow]note:[/] {note}")
        with progress_bar() as pb:
            idx, examples, items, reused = training_index(
                ft, data, spec, seed=seed, root=out, batch_size=batch_size,
                progress_factory=lambda n: pb.task("per-example gradients", n), examples=examples,
            )
        state = "reused (no pass over the training set)" if reused else "built"
        console.print(f"index [bold]{idx.id}[/] {state}: {idx.n} examples, {len(idx.blocks)} LoRA blocks → {idx.root}")
        trunc = sum(it.truncated for it in items)
        if trunc:
            console.print(f"[yellow]{trunc} rows were truncated at {max_length} tokens[/]")
