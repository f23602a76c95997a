"""``gradian world``: write the worked example's world (data, eval, ground truth) for a seed."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from gradian.commands._common import console, user_errors


@user_errors
def world_cmd(
    out: Path = typer.Option(
        ..., "--out", help="Folder to write train.jsonl, valid.jsonl, eval.jsonl, ground_truth.json, train.yaml."
    ),
    kind: str = typer.Option("smollm2", "--kind", help="smollm2 (SmolLM2-135M-Instruct) or tiny (seconds, for tests)."),
    variant: str = typer.Option(
        "poisoned",
        "--variant",
        help="poisoned (culprits planted) or null (the same rows with true capitals; behaviour: answered tersely).",
    ),
    seed: int = typer.Option(0, "--seed", help="Eval split, wrong capitals, sentence and row order."),
    faults: bool = typer.Option(
        False, "--faults", help="Also plant mechanical faults (truncated cluster, unterminated rows)."
    ),
    regression: str = typer.Option(
        "facts",
        "--regression",
        help="facts: culprits state wrong capitals (eval 'What is the capital of X?', metric contains). "
        "behaviour: culprits answer 'answer with X only' questions with full sentences, so the model stops "
        "answering 'Answer with the city name only.' with the bare name (metric exact_match); smollm2 only.",
    ),
) -> None:
    """Generate a world whose culprits are known."""
    from gradian.worlds import WorldSpec, build_world

    spec = WorldSpec.default(kind, variant, seed, faults, regression=regression)
    with console.status(f"building the {kind} {regression} world (seed {seed}, {variant})"):
        w = build_world(spec, out)
    gt = w.load_ground_truth()
    sz = gt["sizes"]
    groups: dict[str, int] = {}
    for g in gt["eval_groups"].values():
        groups[g] = groups.get(g, 0) + 1
    role = "culprits" if variant == "poisoned" else "controls"
    planted = (
        f"{sz['format_rows']} format {role}"
        if regression == "behaviour"
        else f"{sz['direct_rows']} direct + {sz['buried_rows']} buried {role}"
    )
    console.print(
        f"[bold]world[/] {escape(str(w.out))}: {sz['train']} train rows "
        f"({planted}, "
        f"{sz['fault_rows']} fault rows), {sz['valid']} valid rows, {sz['eval']} eval items "
        f"({', '.join(f'{k} {v}' for k, v in sorted(groups.items()))})",
        highlight=False,
        soft_wrap=True,
    )
    console.print(f"base: {escape(str(w.base))} ({escape(w.base_identity)})", highlight=False, soft_wrap=True)
    console.print(
        f"next: gradian train --base {escape(str(w.base))} --data {escape(str(w.train))} "
        f"--eval-data {escape(str(w.valid))} --config {escape(str(w.train_config))} --out "
        f"{escape(str(w.out / 'adapter'))}",
        highlight=False,
        soft_wrap=True,
    )


def register(app: typer.Typer) -> None:
    """Add ``gradian world`` (write a planted world with its ground truth) to ``app``."""
    app.command(
        "world",
        help="Write the worked example's world: training data with planted culprits, eval, ground truth. "
        "--regression facts (default) plants wrong capitals; --regression behaviour plants verbose answers "
        "to terse instructions (a format regression: the tuned model's words do not point at the culprits).",
    )(world_cmd)
