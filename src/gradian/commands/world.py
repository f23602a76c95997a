"""``gradian world``: write the worked example's world (data, eval, ground truth) for a seed."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from gradian.commands._common import console, print_line, user_errors


@user_errors
def world_cmd(
    out: Path | None = typer.Option(
        None,
        "--out",
        help="The world folder it writes: train.jsonl, valid.jsonl, eval.jsonl, ground_truth.json, train.yaml (what "
        "gradian train --data/--config and attribute --data/--eval take).",
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
    family: Path | None = typer.Option(
        None,
        "--family",
        help="Write the whole family of worlds (docs/worked-example.md, 'The family') into this folder, one "
        "subfolder per variant with its knobs in variant.json; --kind and --seed apply, the knobs below do not.",
    ),
    culprit_share: float | None = typer.Option(None, "--culprit-share", help="Culprit rows / training rows."),
    buried_share: float | None = typer.Option(None, "--buried-share", help="Buried culprit rows / culprit rows."),
    benign_rows: int | None = typer.Option(None, "--benign-rows", help="Benign training rows (before de-dup)."),
    long_share: float | None = typer.Option(
        None, "--long-share", help="Long benign rows (country profiles, element prose) / benign rows."
    ),
    sentences: int | None = typer.Option(None, "--sentences", help="Sentences per long profile (4-11)."),
    targets: str | None = typer.Option(
        None, "--targets", help="LoRA targets written to train.yaml: all-linear or e.g. q,v (q_proj,v_proj)."
    ),
    rank: int | None = typer.Option(None, "--rank", help="LoRA rank written to train.yaml (alpha = 2 x rank)."),
    alpha: int | None = typer.Option(None, "--alpha", help="lora_alpha written to train.yaml."),
    epochs: float | None = typer.Option(None, "--epochs", help="Training epochs written to train.yaml."),
    learning_rate: float | None = typer.Option(None, "--learning-rate", help="Learning rate for train.yaml."),
) -> None:
    """Generate a world whose culprits are known (or, with --family, a family of them)."""
    from gradian.errors import GradianUserError
    from gradian.worlds import WorldSpec, build_world, default_train_spec
    from gradian.worlds.knobs import WorldKnobs, apply_knobs, apply_train_knobs

    knobs = WorldKnobs(
        culprit_share=culprit_share,
        buried_share=buried_share,
        benign_rows=benign_rows,
        long_share=long_share,
        sentences=sentences,
        targets=targets,
        rank=rank,
        alpha=alpha,
        epochs=epochs,
        learning_rate=learning_rate,
    )
    if family is not None:
        if out is not None or knobs.to_dict() or variant != "poisoned" or faults or regression != "facts":
            raise GradianUserError(
                "--family writes its own variants",
                where="--family",
                fix="give only --family DIR with --kind and --seed "
                "(no --out, knobs, --variant, --faults or --regression)",
            )
        _family(family, kind, seed)
        return
    if out is None:
        raise GradianUserError("no output folder", where="--out", fix="give --out DIR (or --family DIR)")
    knobs.check()
    spec = apply_knobs(WorldSpec.default(kind, variant, seed, faults, regression=regression), knobs)
    tspec = apply_train_knobs(default_train_spec(spec.kind, seed), knobs)
    with console.status(f"building the {kind} {regression} world (seed {seed}, {variant})"):
        w = build_world(spec, out, train_spec=tspec)
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
    # attribute reads the training_config.yaml and trainer_state.json train leaves in the adapter folder
    console.print(
        f"then: gradian attribute --base {escape(str(w.base))} --adapter {escape(str(w.out / 'adapter'))} "
        f"--data {escape(str(w.train))} --eval {escape(str(w.eval))} --out {escape(str(w.out / 'run'))}",
        highlight=False,
        soft_wrap=True,
    )


def _family(out: Path, kind: str, seed: int) -> None:
    from gradian.worlds import WorldSpec
    from gradian.worlds.family import FAMILY, build_family

    WorldSpec.default(kind)  # a bad --kind is named before anything is written
    with console.status(f"building the {kind} family ({len(FAMILY)} worlds, seed {seed})"):
        fam = build_family(out, kind, seed, say=print_line)
    console.print(
        f"[bold]family[/] {escape(str(out))}: {len(fam['variants'])} worlds "
        f"({sum(v['held_out'] for v in fam['variants'])} held out), family.json",
        highlight=False,
        soft_wrap=True,
    )


def register(app: typer.Typer) -> None:
    """Add ``gradian world`` (write a planted world with its ground truth) to ``app``."""
    app.command(
        "world",
        help="Write the worked example's world: training data with planted culprits, eval, ground truth. "
        "--regression facts (default) plants wrong capitals; --regression behaviour plants verbose answers "
        "to terse instructions (a format regression: the tuned model's words do not point at the culprits). "
        "Knobs (--culprit-share, --buried-share, --benign-rows, --long-share, --sentences, --targets, --rank, "
        "--epochs, --learning-rate) vary the world; --family DIR writes the whole family of variants.",
    )(world_cmd)
