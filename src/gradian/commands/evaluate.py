"""``gradian evaluate``: did a capability really regress, on which items, and how much can the base be blamed."""

from __future__ import annotations

import platform
import time
from pathlib import Path

import typer
from rich.markup import escape

from gradian.commands import _options as O
from gradian.commands._common import console, user_errors
from gradian.errors import GradianUserError
from gradian.tables import FitTable

VERDICT_STYLE = {"regressed": "bold red", "improved": "bold green", "within_noise": "yellow"}


def _fmt_score(x: float, unit: str) -> str:
    return f"{x:.3f}" if unit == "accuracy" else f"{x:.2f} nats"


def _bounds_cell(c) -> str:
    b = c.base_bounds
    parts = []
    if b.base_fails:
        parts.append(f"base fails {b.base_fails}/{c.n}")
    if b.low_base:  # loglik: the share of items whose answer is the greedy one (the score itself is in nats)
        parts.append(f"low base {b.base_score:.2f}" if b.margins_available else f"low greedy rate {b.base_score:.2f}")
    if b.margins_available and b.failing:
        parts.append(f"thin margin {b.thin_margin}/{b.failing}")
    if not b.margins_available:
        parts.append("loglik: CE query")
    return ", ".join(parts) or "-"


def capability_table(result) -> FitTable:
    """The per-capability terminal table of an :class:`~gradian.evaluate.EvalResult`."""
    ref = "base" if result.reference.get("kind") == "base" else "reference"
    pct = f"{result.spec.confidence * 100:g}% CI"
    t = FitTable(title="Evaluate: tuned vs " + ("base (adapter disabled)" if ref == "base" else "reference adapter"))
    t.add_column("capability", style="bold")
    t.add_column("metric")
    t.add_column("n", justify="right")
    t.add_column(ref, justify="right")
    t.add_column("tuned", justify="right")
    t.add_column("Δ", justify="right")
    t.add_column(pct, justify="center")
    t.add_column("verdict")
    t.add_column("lost/gained", justify="right")
    t.add_column("base bounds")
    for c in result.capabilities:
        verdict = c.verdict.replace("_", " ")
        if c.verdict == "within_noise":
            verdict += " (not diagnosed)"
        t.add_row(
            escape(c.name),
            c.metric,
            str(c.n),
            _fmt_score(c.reference_score, c.unit),
            _fmt_score(c.tuned_score, c.unit),
            f"{c.delta:+.3f}",
            f"[{c.ci_low:+.3f}, {c.ci_high:+.3f}]",
            f"[{VERDICT_STYLE[c.verdict]}]{verdict}[/]",
            f"{c.n_lost}/{c.n_gained}",
            escape(_bounds_cell(c)),
        )
    return t


def failing_table(result, capability: str, limit: int = 10) -> FitTable:
    """The lost items of one capability: what the tuned model says instead, and the base margin."""
    fails = result.failing_items(capability)
    t = FitTable(
        title=f"{escape(capability)}: items lost ({len(fails)}; showing {min(limit, len(fails))})", title_justify="left"
    )
    t.add_column("id")
    t.add_column("prompt", overflow="fold", max_width=48)
    t.add_column("answer")
    t.add_column("tuned says")
    t.add_column("base margin", justify="right")
    for f in fails[:limit]:
        prompt = f.prompt if isinstance(f.prompt, str) else f.prompt[-1]["content"]
        margin = "-" if f.margin is None else f"{f.margin:+.2f} nats" + (" (thin)" if f.thin_margin else "")
        t.add_row(
            escape(f.id),
            escape(prompt[:200]),
            escape(f.answer),
            escape(f.tuned_answer if f.tuned_answer is not None else "(loglik)"),
            margin,
        )
    return t


def print_result(result) -> None:
    """Print an ``EvalResult``: the per-capability table, then each verdict's reason and sign-test p."""
    console.print(capability_table(result))
    for c in result.capabilities:
        console.print(f"[bold]{escape(c.name)}[/]: {escape(c.reason)} (sign test p={c.sign_test_p:.3g})")
        for q in c.base_bounds.qualifiers:
            if c.metric != "loglik" or not q.startswith("loglik"):
                console.print(f"  · {escape(q)}")
    for c in result.regressed:
        if c.n_lost:
            console.print(failing_table(result, c.name))
    for n in result.notes:
        console.print(f"[dim]note: {escape(n)}[/]")
    tm = result.timing
    load = f", loading {tm['load']:.1f} s, wall {tm['wall']:.1f} s" if "wall" in tm else ""
    console.print(
        f"[dim]evaluate took {tm.get('total', 0):.1f} s (generation {tm.get('generate', 0):.1f} s, "
        f"scoring {tm.get('score', 0):.1f} s){load}[/]"
    )


@user_errors
def evaluate_cmd(
    base: str = O.BASE,
    adapter: Path = O.ADAPTER,
    eval_path: Path = O.EVAL,
    reference_adapter: Path | None = O.REFERENCE_ADAPTER,
    out: Path | None = typer.Option(
        None, "--out", help="Write the result JSON here (schema gradian.evaluate/1).", rich_help_panel=O.STORAGE
    ),
    max_new_tokens: int = O.MAX_NEW_TOKENS,
    batch_size: int = typer.Option(
        8, "--batch-size", help="Prompts per batch (results do not depend on it).", rich_help_panel=O.DEVICES
    ),
    dtype: str = O.DTYPE,
    device: str = O.DEVICE,
    trust_remote_code: bool = O.TRUST_REMOTE_CODE,
    seed: int = typer.Option(0, "--seed", help="Bootstrap seed.", rich_help_panel=O.VERDICT),
    resamples: int = typer.Option(
        10_000, "--resamples", help="Bootstrap resamples (at least 1000).", rich_help_panel=O.VERDICT
    ),
    chat_template: bool = typer.Option(
        True,
        "--chat-template/--no-chat-template",
        help="Run string prompts through the tokenizer's chat template.",
        rich_help_panel=O.VERDICT,
    ),
    config: list[Path] | None = O.configs("evaluate reads a QLoRA run's 4-bit base from them, as attribute does"),
    run_folder: bool = O.RUN_FOLDER,
    base_quant: str = O.BASE_QUANT,
) -> None:
    """Measure what the adapter changed per capability; refuse to diagnose noise; bound the blame on the base."""
    from gradian.evaluate import EvalSpec, evaluate, load_eval_set
    from gradian.index.identity import library_versions
    from gradian.models.load import load_adapter, load_base, read_adapter_config
    from gradian.util import atomic_write_json, sha256_file

    t_start = time.perf_counter()
    # Everything cheap is checked before the model is loaded.
    spec = EvalSpec(
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        seed=seed,
        resamples=resamples,
        use_chat_template=chat_template,
    )
    items = load_eval_set(eval_path)
    read_adapter_config(adapter)
    if reference_adapter is not None:
        read_adapter_config(reference_adapter)
    if out is not None and out.is_dir():
        raise GradianUserError("--out is a folder", where=str(out), fix="give a file path such as result.json")
    from gradian.commands._common import base_model_spec, run_folder_inputs
    from gradian.data.setup import trained_quant
    from gradian.models.load import resolve_device

    # the base the run trained on (a QLoRA run's 4-bit base), from its config as attribute's Evaluate lane takes it
    configs, _, _ = run_folder_inputs(adapter, config, None, read=run_folder and base_quant == "auto", want_logs=False)
    trained = trained_quant(None, adapter, configs) if base_quant == "auto" else None
    mspec = base_model_spec(base, dtype, device, trust_remote_code, base_quant, trained)
    used = resolve_device(device)  # auto: cuda, else mps, else cpu (load_base resolves it the same way)

    with console.status("loading the base model and adapter"):
        model, tokenizer = load_base(mspec)
        peft_model, _cfg, notes = load_adapter(model, adapter, base)
    for n in notes:
        console.print(f"[yellow]note:[/] {escape(n)}")
    tokenizer = run_template(tokenizer, adapter)
    t_loaded = time.perf_counter()

    from gradian.commands._common import rich_progress

    with rich_progress(console) as bar:  # a bar on a terminal, a line per step in a log
        tasks: dict[str, int] = {}

        def progress(task: str, advance: int, total: int) -> None:
            if task not in tasks:
                tasks[task] = bar.add_task(task, total=total)
            bar.advance(tasks[task], advance)

        meta = {
            "base": base,
            "adapter": str(adapter),
            "reference_adapter": str(reference_adapter) if reference_adapter else None,
            "eval": str(eval_path),
            "eval_sha256": sha256_file(eval_path) if eval_path.is_file() else None,
            "model": mspec.to_dict(),
            "device": used,  # what --device resolved to on this machine
            "adapter_notes": notes,
            "versions": {**library_versions(), "python": platform.python_version()},
        }
        result = evaluate(
            peft_model,
            tokenizer,
            items,
            reference_adapter=reference_adapter,
            spec=spec,
            progress=progress,
            meta=meta,
        )
    result.timing["load"] = round(t_loaded - t_start, 3)
    result.timing["wall"] = round(time.perf_counter() - t_start, 3)
    print_result(result)
    if out is not None:
        atomic_write_json(out, result.to_dict())
        console.print(f"wrote {escape(str(out))}")


def run_template(tokenizer, adapter: Path):
    """``tokenizer`` rendering prompts with the chat template the run saved beside its adapter (printed, with its
    source), as ``gradian attribute``'s Evaluate lane renders them; ``tokenizer`` itself when the run saved none or
    the tokenizer's own (:func:`gradian.data.setup.adapter_template`).
    """
    from gradian.data.setup import adapter_template
    from gradian.data.tokenize import with_chat_template

    saved = adapter_template(adapter)
    if saved is None or saved[0] == getattr(tokenizer, "chat_template", None):
        return tokenizer
    console.print(f"chat template: the run's ({escape(saved[1])})", highlight=False, soft_wrap=True)
    return with_chat_template(tokenizer, saved[0])


def register(app: typer.Typer) -> None:
    """Add ``gradian evaluate`` (tuned vs reference per capability, paired bootstrap) to ``app``."""
    app.command(
        "evaluate",
        help="Did a capability really regress? Per-capability deltas with paired-bootstrap CIs, "
        "verdicts, failing items and base bounds.",
    )(evaluate_cmd)
