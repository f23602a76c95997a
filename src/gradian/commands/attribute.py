"""``gradian attribute``: Evaluate, then Attribute (and Audit when a config or logs are given)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from gradian.commands import _options as O
from gradian.commands._common import (
    base_model_spec,
    console,
    grad_spec_from_options,
    print_line,
    progress_bar,
    run_folder_inputs,
    user_errors,
    write_report_html,
)
from gradian.errors import GradianUserError
from gradian.report.svg import fmt_verdict
from gradian.tables import FitTable


def print_attribution(run: dict) -> None:
    """Terminal summary of the attribution part of a run."""
    att = run.get("attribution")
    if not att:
        return
    ix = att["index"]
    console.print(
        f"index [bold]{ix['id']}[/] ({ix['n']} rows, {ix['blocks']} LoRA blocks, {ix['dims']:,} numbers/row"
        f"{', reused: no pass over the training set' if ix['reused'] else ''})"
    )
    tr = att.get("trajectory")
    if tr:
        pts = ", ".join(
            f"{'final' if c['final'] else 'step ' + str(c['step'])} ×{c['weight']:.2f}" for c in tr["checkpoints"]
        )
        console.print(
            f"trajectory: {len(tr['checkpoints'])} checkpoint(s) {escape('[' + pts + ']')}; weights: "
            f"{escape(tr['weight_rule'])}"
        )
    for cap in att["capabilities"]:
        ag = cap.get("agreement")
        head = f"[bold]{escape(cap['capability'])}[/]: {len(cap['queries'])} failing item(s), engine {cap['engine']}"
        if ag:
            head += (
                f"; agreement with {ag['engines'][1]}: Spearman {ag['spearman']:.2f}, top-{ag['k']} overlap "
                f"{ag['topk_overlap']:.0%} → confidence [bold]{ag['confidence']}[/]"
            )
        console.print(head)
        rk = cap.get("ranking") or {}
        if rk:
            console.print(f"  ranked by: {escape(rk.get('rank_score', ''))}", highlight=False)
        for src, e in (cap.get("evidence") or {}).items():
            if src != "gradient":
                console.print(
                    f"  {src} evidence ({e['engine']}): Spearman with the verdict {e['spearman_with_verdict']:.2f}, "
                    f"top-{min(len(cap['ranked']), 20)} overlap {e['topk_overlap_with_verdict']:.0%}",
                    highlight=False,
                )
        t = FitTable(
            title=f"most harmful training rows for {escape(cap['capability'])}", show_lines=False, heading_columns=2
        )
        for col in ("rank", "id", "score (% of harm)", "Δloss if removed", "support", "tokens", "completion"):
            t.add_column(col, overflow="fold")
        for r in cap["ranked"][:10]:
            sup = "".join(k[0].upper() for k, v in (r.get("support") or {}).items() if v["supports"]) or "-"
            t.add_row(
                str(r["rank"]),
                escape(r["id"]),
                fmt_verdict(r["verdict_score"]) if "verdict_score" in r else f"{r.get('rank_score', r['score']):.4g}",
                f"{r['predicted_loss_delta_if_removed']:.3g}",
                sup,
                str(r["tokens"]) + (" (truncated)" if r["truncated"] else ""),
                escape((r.get("sentence") or {}).get("text") or r["completion"][:80]),
            )
        console.print(t)
        console.print(
            "  support: G gradient, L lexical (BM25), R representation (RepSim): the row is in that evidence's top 10%",
            style="dim",
        )
        for c in cap["clusters"][:5]:
            common = c["common"]
            words = ", ".join(w["word"] for w in common["distinctive_words"][:5])
            extra = []
            if common["truncated_share"]:
                extra.append(f"{common['truncated_share']:.0%} truncated")
            if common["missing_eos_share"]:
                extra.append(f"{common['missing_eos_share']:.0%} missing EOS")
            console.print(
                f"  cluster {c['label']}: {c['size']} rows, {c['harmful_share']:.0%} of the harmful score"
                + (f"; shared words: {escape(words)}" if words else "")
                + (f"; {', '.join(extra)}" if extra else "")
                + f"; e.g. {escape(c['exemplars'][0]['id'])}"
            )
        for d in cap["drilldown"][:5]:
            s = d["top_sentence"]
            console.print(
                f"  row {escape(d['id'])}: most harmful sentence [{s['char_start']}:{s['char_end']}] "
                f"“{escape(s['text'][:100])}”"
            )


def print_next_steps(run: dict, out: Path) -> None:
    """The commands to run next, filled in: ``gradian verify RUN`` and ``gradian export RUN --drop blamed``.

    Printed only when the run blames rows (a run that stopped after Evaluate has nothing to verify).
    """
    import shlex

    from gradian.attribute.selection import select

    if not (run.get("attribution") or {}).get("capabilities"):
        return
    try:
        blamed = select(run, "blamed")
    except GradianUserError:  # e.g. an empty harmful tail: nothing to act on
        return
    q = shlex.quote(str(out))
    clean = shlex.quote(str(out / "clean.jsonl"))
    shown = ", ".join(blamed[:5]) + (f", … (+{len(blamed) - 5})" if len(blamed) > 5 else "")
    console.print(f"blamed: {len(blamed)} row(s): {escape(shown)}", highlight=False, soft_wrap=True)
    console.print("next:", highlight=False)
    console.print(
        f"  gradian verify {escape(q)}    [dim]# retrain without them: does the capability come back?[/]",
        highlight=False,
        soft_wrap=True,
    )
    console.print(
        f"  gradian export {escape(q)} --drop blamed --out {escape(clean)}    [dim]# the training set without "
        "them, and their ids[/]",
        highlight=False,
        soft_wrap=True,
    )


#: ``--drill-weakened``'s default (AttributeSpec.drill_weakened_nats; tests/test_api.py holds them equal)
DRILL_WEAKENED = "0.25"


def _nats_or_none(value: str, flag: str) -> float | None:
    """``"0.25"`` → 0.25; ``"none"`` / ``"off"`` → None; anything else a one-line user error naming ``flag``."""
    if value.strip().lower() in ("none", "off"):
        return None
    try:
        return float(value)
    except ValueError:
        raise GradianUserError(
            f"{flag} takes a number of nats or 'none', not {value!r}", where=flag, fix=f"e.g. {flag} 0.25"
        ) from None


def _names(value: str) -> tuple[str, ...]:
    """``"bm25,repsim"`` → ("bm25", "repsim"); ``"none"`` or empty → ()."""
    parts = tuple(p.strip() for p in value.split(",") if p.strip())
    return () if parts in ((), ("none",)) else parts


def implied_fuse(ctx: typer.Context, references: str, fuse: str) -> tuple[str, ...]:
    """``--fuse`` as names; left at its default, only the references that run (``--references none``: no fusion).

    An explicit ``--fuse`` naming a reference that does not run stays an error (the spec names it).
    """
    names = _names(fuse)
    if getattr(ctx.get_parameter_source("fuse"), "name", None) == "COMMANDLINE":
        return names
    run = set(_names(references))
    return tuple(n for n in names if n in run)


def checkpoint_selection(values: list[str] | None):
    """``--checkpoints`` values → ``"auto"``, ``"final"`` or a list of folders (for RunInputs / resolve_trajectory).

    The rule is :func:`gradian.attribute.trajectory.checkpoint_selection`, which ``Attributor`` also uses.
    """
    from gradian.attribute.trajectory import checkpoint_selection as select

    return select(values, "--checkpoints")


def engine_spec_from_options(name: str, damping_scale: float | None, options: list[str] | None):
    """``--engine``, ``--damping-scale`` and ``--engine-option KEY=VALUE`` → the engine's own typed spec.

    Values are read as the spec field's type (float, int, str, bool); the spec validates them.
    """
    from dataclasses import fields

    from gradian.engines.registry import engine_class, engine_spec

    cls = engine_class(name, "--engine")
    types = {f.name: str(f.type) for f in fields(cls.spec_class)}
    opts: dict = {}
    for raw in options or []:
        key, sep, value = raw.partition("=")
        key = key.strip()
        if not sep or not key:
            raise GradianUserError(
                f"{raw!r} is not KEY=VALUE", where="--engine-option", fix="e.g. --engine-option fisher=true"
            )
        if key not in types:
            raise GradianUserError(
                f"engine {name} has no option {key!r}",
                where="--engine-option",
                fix=f"its options are: {', '.join(sorted(types)) or 'none'}",
            )
        t = types[key]
        try:
            if t == "bool":
                if value.lower() not in ("true", "false"):
                    raise ValueError(value)
                opts[key] = value.lower() == "true"
            elif t == "int":
                opts[key] = int(value)
            elif t == "float":
                opts[key] = float(value)
            else:
                opts[key] = value
        except ValueError:
            raise GradianUserError(
                f"{key}={value!r} is not a {t}", where="--engine-option", fix=f"give {key} a {t}"
            ) from None
    if damping_scale is not None:
        if "damping_scale" not in types:
            raise GradianUserError(
                f"engine {name} has no damping",
                where="--damping-scale",
                fix="drop --damping-scale, or pick an engine with damping",
            )
        opts["damping_scale"] = damping_scale
    return engine_spec(name, "--engine", **opts)


_ENGINE_HELP = O.engine_help()  # read from the engine files: importing them (torch) is not needed for --help


def _setup_flags(ctx: typer.Context, max_length: int, loss_on: str) -> dict:
    """The setup flags given on the command line (not left at their defaults)."""
    given = {"max_length": max_length, "loss_on": loss_on}
    # by name: typer may ship its own copy of click, whose ParameterSource is another enum class
    return {k: v for k, v in given.items() if getattr(ctx.get_parameter_source(k), "name", None) == "COMMANDLINE"}


def default_training_setup(ctx: typer.Context, data: Path, max_length: int, loss_on: str, adapter=None, examples=None):
    """The setup of a run without ``--config``: Gradian's defaults, the explicit flags named and the chat template
    saved beside the adapter (for the manifest and the gradients). ``examples``: ``data``'s rows, already loaded.
    """
    from gradian.data.setup import setup_from_files

    return setup_from_files([], data, _setup_flags(ctx, max_length, loss_on), adapter=adapter, examples=examples)


def training_setup(
    ctx: typer.Context,
    config: list[Path],
    data: Path,
    max_length: int,
    loss_on: str,
    adapter=None,
    examples=None,
    card=None,
):
    """The resolved :class:`~gradian.data.setup.TrainingSetup` (:func:`gradian.data.setup.setup_from_files`).

    A flag given on the command line beats the config; one that contradicts it is one ``warning:`` line.
    Prints the setup, one line, and what it cannot reproduce. ``examples``: ``data``'s rows, already loaded.
    """
    import warnings

    from gradian.data.setup import setup_from_files
    from gradian.errors import GradianWarning

    flags = _setup_flags(ctx, max_length, loss_on)
    setup = setup_from_files(config, data, flags, adapter=adapter, examples=examples, card=card)
    for w in setup.warnings:
        warnings.warn(w, GradianWarning, stacklevel=2)
    tpl = ""
    if setup.tokenize_spec().chat_template is not None:
        tpl = f", chat template ({escape(setup.sources['chat_template'])})"
    if setup.chat_rule is not None:  # the trainer's own chat rendering (torchtune) builds the chat rows
        tpl += f", chat rule {setup.chat_rule} ({escape(setup.sources['chat_rule'])})"
    console.print(
        f"training setup: max_length {setup.max_length} ({escape(setup.sources['max_length'])}), "
        f"loss_on {setup.loss_on} ({escape(setup.sources['loss_on'])}){tpl}",
        highlight=False,
        soft_wrap=True,
    )
    for n in setup.notes:
        console.print(f"[yellow]not reproduced:[/] {escape(n)}", highlight=False, soft_wrap=True)
    return setup


def index_budget(ctx: typer.Context, max_index_gb: float | None):
    """The :class:`~gradian.index.plan.IndexBudget` of the flags (``--project-dim`` given counts as explicit)."""
    from gradian.index.plan import budget_from_gb

    explicit = getattr(ctx.get_parameter_source("project_dim"), "name", None) in ("COMMANDLINE", "ENVIRONMENT")
    return budget_from_gb(max_index_gb, explicit)


def print_audit_errors(audit: dict) -> None:
    """The audit's counts, then one line per error-level finding (id and title), escaped."""
    from gradian.report.safe import one_line

    c = audit.get("counts") or {}
    console.print(
        f"audit: {c.get('error', 0)} errors, {c.get('warning', 0)} warnings, {c.get('info', 0)} info (details "
        "in run.json and report.html)"
    )
    for f in audit.get("findings") or []:
        if f.get("severity") == "error":
            n = len(f.get("row_ids") or [])
            rows = f" ({n} row{'s' if n != 1 else ''})" if n else ""
            line = f"{f.get('id', '?')} {f.get('title') or f.get('name') or ''}{rows}"
            console.print(f"  [red]error[/] {escape(one_line(line, 200))}", highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add ``gradian attribute`` (Evaluate → Attribute → Audit, one run folder) to ``app``."""

    @app.command("attribute")
    @user_errors
    def attribute_cmd(
        ctx: typer.Context,
        base: str = O.BASE,
        adapter: Path = O.ADAPTER,
        data: Path = O.DATA,
        eval_path: Path = O.EVAL,
        config: list[Path] | None = O.configs(
            "what the Audit lane checks, and the tokenisation (max length, loss mask) the gradients use"
        ),
        logs: Path | None = typer.Option(
            None, help="trainer_state.json (or JSONL logs) for the Audit lane.", rich_help_panel=O.SETUP
        ),
        run_folder: bool = O.RUN_FOLDER,
        base_quant: str = O.BASE_QUANT,
        reference_adapter: Path | None = O.REFERENCE_ADAPTER,
        out: Path = typer.Option(
            Path("gradian-run"),
            help="The run folder it writes: run.json, report.html (and later verify's and export's files); what "
            "gradian report, verify and export take.",
            rich_help_panel=O.STORAGE,
        ),
        engine: str = typer.Option("datainf", help=f"Primary engine: {_ENGINE_HELP}.", rich_help_panel=O.ENGINES),
        second_engine: str = typer.Option(
            "graddot",
            help="Second engine for the agreement check (any of the engines, with its own defaults), or 'none'.",
            rich_help_panel=O.ENGINES,
        ),
        query: str = typer.Option(
            "contrastive", help="contrastive (default) | cross_entropy.", rich_help_panel=O.VERDICT
        ),
        damping_scale: float | None = typer.Option(
            None,
            help="The primary engine's damping scale (default: its own, 0.1). datainf: λ_l = scale · mean‖g_l‖² / "
            "d_l; ekfac: λ_l = scale · mean Λ_l.",
            rich_help_panel=O.ENGINES,
        ),
        engine_option: list[str] | None = typer.Option(
            None,
            "--engine-option",
            help="KEY=VALUE for the primary engine's spec (repeatable), e.g. fisher=true for ekfac.",
            rich_help_panel=O.ENGINES,
        ),
        top_k: int = typer.Option(
            20, help="Rows listed per capability (and the k of the top-k overlap).", rich_help_panel=O.VERDICT
        ),
        max_length: int = O.MAX_LENGTH,
        loss_on: str = O.LOSS_ON,
        modules: str | None = O.MODULES,
        project_dim: int = O.PROJECT_DIM,
        batch_size: int = typer.Option(
            8, help="Rows per backward pass / prompts per generation batch.", rich_help_panel=O.DEVICES
        ),
        storage_dtype: str = O.STORAGE_DTYPE,
        shard_size: int = O.SHARD_SIZE,
        rows_per_forward: int = O.ROWS_PER_FORWARD,
        max_new_tokens: int = O.MAX_NEW_TOKENS,
        dtype: str = O.DTYPE,
        device: str = O.DEVICE,
        trust_remote_code: bool = O.TRUST_REMOTE_CODE,
        index_dir: Path | None = O.INDEX,
        index_dir_old: Path | None = O.INDEX_DIR_OLD,
        checkpoints: list[str] | None = O.CHECKPOINTS,
        weighting: str = typer.Option(
            "lr",
            help="Checkpoint weights: lr (mean learning rate since the previous "
            "checkpoint, from trainer_state.json) | equal.",
            rich_help_panel=O.SETUP,
        ),
        visits: str = typer.Option(
            "auto",
            help="auto: where the trainer's row order is reproduced (HF Trainer / TRL SFT / LLaMA-Factory / axolotl / "
            "torchtune, from its config; the device count from its trainer_state.json), a row the run never read "
            "scores 0 and the verdict is taken over the rows it read | off: every row once per checkpoint.",
            rich_help_panel=O.SETUP,
        ),
        statistic: str = typer.Option(
            "cosine",
            help="Rank score of the gradient engines: cosine (direction only) | raw.",
            rich_help_panel=O.ENGINES,
        ),
        unit: str = O.UNIT,
        optimizer: str = O.OPTIMIZER,
        max_units_per_row: int = O.MAX_UNITS_PER_ROW,
        unit_grads: str = O.UNIT_GRADS,
        references: str = typer.Option(
            "bm25,repsim",
            help="Reference engines run beside the gradient engines: comma-separated bm25, repsim, or none.",
            rich_help_panel=O.ENGINES,
        ),
        fuse: str = typer.Option(
            "bm25,repsim",
            help="References folded into the ranking, each weighted by its agreement "
            "with the gradient ranking (comma-separated), or none.",
            rich_help_panel=O.ENGINES,
        ),
        fuse_gate: str = typer.Option(
            "global",
            help="How a reference's fusion weight is measured: global (Spearman over all rows) or tail (the "
            "gradient's verdict on the rows the reference ranks most harmful; docs/benchmarks.md 'Fusion gate').",
            rich_help_panel=O.ENGINES,
        ),
        row_weight: float = typer.Option(
            0.5,
            "--row-weight",
            help="With --unit sentence: the weight of each row's whole-row score beside its most harmful sentence's, "
            "on one scale (0: the sentence alone; docs/benchmarks.md 'The whole row beside its worst sentence').",
            rich_help_panel=O.VERDICT,
        ),
        weakened: float | None = typer.Option(
            None,
            "--weakened",
            metavar="NATS",
            help="Also query the items the tuned model still passes but holds more than NATS nats less firmly than "
            "the reference (its answer's log-probability fell; each contrasted with its nearest wrong answer), beside "
            "the lost items, in the ranking (default: the lost items only; docs/benchmarks.md 'Weakened items').",
            rich_help_panel=O.VERDICT,
        ),
        drill_weakened: str = typer.Option(
            DRILL_WEAKENED,
            "--drill-weakened",
            metavar="NATS",
            help="The same weakened items, asked about by the sentence drill-down only: a row's highlighted sentence "
            "is its most harmful one for any lost item or item weakened by more than NATS nats; the ranking keeps "
            "the lost items ('none': the lost items only; docs/benchmarks.md 'The drill-down asks the weakened "
            "items too').",
            rich_help_panel=O.VERDICT,
        ),
        save_evidence: bool = typer.Option(
            False,
            "--save-evidence",
            help="Also write RUN/evidence.safetensors: the per-item score matrices the verdict was formed from "
            "(rows and sentence units, each engine and reference), to re-rank without recomputing.",
            rich_help_panel=O.VERDICT,
        ),
        seed: int = typer.Option(0, help="Seed (bootstrap, projection).", rich_help_panel=O.VERDICT),
        max_index_gb: float | None = O.MAX_INDEX_GB,
        plan_only: bool = O.PLAN_ONLY,
        one_pass: bool = O.ONE_PASS,
    ) -> None:
        """Which training rows degraded the regressed capabilities? Evaluate → Attribute (→ Audit).

        Under torchrun (`torchrun --nproc-per-node N -m gradian attribute ...`) the ranks share the
        index builds and the scoring; rank 0 evaluates and writes the run (docs/distributed.md).
        """
        import dataclasses

        from gradian.attribute import AttributeSpec
        from gradian.attribute.run import RunInputs, RunSpecs, attribute_run
        from gradian.commands.evaluate import print_result
        from gradian.evaluate import EvalResult, EvalSpec
        from gradian.index.build import check_build_args, check_unit_grads
        from gradian.models.load import ModelSpec

        index_dir = O.one_of_alias(index_dir, index_dir_old, "--index", "--index-dir")
        # every flag is checked by the specs (one-line errors naming the flag) before anything is loaded
        grad = grad_spec_from_options(
            max_length,
            loss_on,
            modules,
            project_dim,
            storage_dtype,
            seed,
            optimizer=optimizer,
            max_units_per_row=max_units_per_row,
            unit_grads=unit_grads,
        )
        check_build_args(batch_size, shard_size, rows_per_forward)
        if unit == "sentence":
            check_unit_grads(grad, one_pass)
        budget = index_budget(ctx, max_index_gb)
        specs = RunSpecs(
            model=ModelSpec(base, dtype, device, trust_remote_code),
            grad=grad,
            attribute=AttributeSpec(
                engine=engine_spec_from_options(engine, damping_scale, engine_option),
                second_engine=None if second_engine == "none" else second_engine,
                query=query,
                top_k=top_k,
                weighting=weighting,
                visits=visits,
                statistic=statistic,
                unit=unit,
                row_weight=row_weight,
                references=_names(references),
                fuse=implied_fuse(ctx, references, fuse),
                fuse_gate=fuse_gate,
                weakened_nats=weakened,
                drill_weakened_nats=_nats_or_none(drill_weakened, "--drill-weakened"),
            ),
            eval=EvalSpec(max_new_tokens=max_new_tokens, batch_size=batch_size, seed=seed),
            seed=seed,
            batch_size=batch_size,
            shard_size=shard_size,
            rows_per_forward=rows_per_forward,
        )
        # the trainer's own config and log beside the adapter, unless --config / --logs name others
        config, logs, card = run_folder_inputs(adapter, config, logs, read=run_folder)
        inputs = RunInputs(
            base,
            adapter,
            data,
            eval_path,
            tuple(config or ()),
            logs,
            reference_adapter,
            checkpoints=checkpoint_selection(checkpoints),
        )
        # the run's own tokenisation, after every flag is checked (a flag error first): --config sets max_length and
        # the loss mask (flags still win), the template saved beside the adapter renders chat rows; --data is read
        # once, here, for the setup's row format and the run
        from gradian.data.formats import load_examples
        from gradian.data.setup import trained_quant

        examples = load_examples(data)
        if config or card is not None:
            setup = training_setup(
                ctx, config, data, max_length, loss_on, adapter=adapter, examples=examples, card=card
            )
        else:  # Gradian's defaults and the flags given (recorded in the manifest)
            setup = default_training_setup(ctx, data, max_length, loss_on, adapter=adapter, examples=examples)
        grad = dataclasses.replace(grad, tokenize=setup.tokenize_spec())
        specs.grad = grad
        specs.model = base_model_spec(base, dtype, device, trust_remote_code, base_quant, trained_quant(setup))
        from gradian import distributed
        from gradian.commands._common import distributed_job
        from gradian.index.identity import dataset_identity

        def same_on_every_rank() -> dict:  # beside the base, adapter and data (computed only under torchrun)
            return {
                "the eval set": dataset_identity(eval_path).get("sha256")
                if (eval_path.is_file() or eval_path.is_dir())
                else f"missing: {eval_path}",
                "the flags": {
                    "grad": grad.to_dict(),
                    "attribute": specs.attribute.to_dict(),
                    "dtype": dtype,
                    "eval": specs.eval.to_dict(),
                    "batch_size": batch_size,
                    "shard_size": shard_size,
                    "rows_per_forward": rows_per_forward,
                    "checkpoints": checkpoints,
                    "reference_adapter": str(reference_adapter),
                    "index_dir": str(index_dir) if index_dir else None,
                },
            }

        with distributed_job(device, base, adapter, data, same_on_every_rank):
            with progress_bar() as pb:
                run = attribute_run(
                    inputs,
                    specs,
                    out,
                    progress=pb.callback(),
                    index_root=index_dir,
                    say=print_line,
                    setup=setup,
                    examples=examples,
                    budget=budget,
                    plan_only=plan_only,
                    one_pass=one_pass,
                    save_evidence=save_evidence,
                )
            distributed.barrier()  # every rank done before the group goes (no rank exits under a live peer)
        if run is None or plan_only:  # a rank other than 0: its share is done, rank 0 reports; or the plan alone
            return
        print_result(EvalResult.from_dict(run["evaluation"]))
        if run.get("stopped"):
            console.print(f"[bold yellow]stopped after Evaluate:[/] {run['stopped']}")
        print_attribution(run)
        if run.get("audit"):
            print_audit_errors(run["audit"])
        html = write_report_html(out)
        tm = run["timing"]
        console.print(
            f"[dim]run {run['manifest']['run_id']} in {tm['total']:.1f} s → {escape(str(out / 'run.json'))}, "
            f"{escape(str(html))}[/]"
        )
        print_next_steps(run, out)
