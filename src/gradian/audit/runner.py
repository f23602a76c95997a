"""Run the registered checks over what was given, and order the findings by what to fix first."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from gradian.audit.config import TrainConfig, load_config
from gradian.audit.config.axolotl import apply_mapping, custom_mapping, preference_fields, rename_fields
from gradian.audit.config.lf_dataset_info import apply_columns, dataset_entry
from gradian.audit.context import AuditContext, load_tokenizer_folder
from gradian.audit.logs import TrainLog, load_logs
from gradian.audit.model import SEVERITY_RANK, AuditResult, Finding, SkippedCheck
from gradian.audit.registry import NotApplicable, _id_key, all_checks, stage_words
from gradian.audit.versions import parse_versions
from gradian.data.formats import Example, examples_from_records, load_examples, read_records, to_example
from gradian.data.preference import PreferenceExample, preference_rows
from gradian.errors import GradianUserError
from gradian.util import attrs

_FLAG = {"data": "--data", "eval": "--eval", "config": "--config", "logs": "--logs", "tokenizer": "--tokenizer"}


def _a(stage: str | None) -> str:
    """The article before a stage name read aloud: "an orpo run", "an sft run" (S-F-T), "a dpo run"."""
    s = str(stage or "")
    return "an" if (s[:1] and s[:1] in "aeiou") or s in ("sft", "rm", "rlhf") else "a"


def eval_examples(path: str | Path) -> list[Example]:
    """The eval set as :class:`Example` rows, read with Evaluate's reader when it is in that format.

    A file whose first row has an ``answer`` field is the eval set ``gradian attribute --eval``
    takes: it is read by :func:`gradian.evaluate.items.load_eval_set` (same checks, same
    messages), each item becoming an Example whose prompt is the question and whose completion
    is the answer. Any other file is read as training-format rows (:func:`load_examples`).
    """
    from gradian.data.formats import read_records
    from gradian.evaluate.items import load_eval_set

    records = read_records(path)
    if records and isinstance(records[0], dict) and "answer" in records[0]:
        return [_item_example(it) for it in load_eval_set(path)]
    pref = preference_rows(records, path)
    if pref is not None:  # preference eval rows: the prompt and the chosen response
        return [Example(e.id, e.row, "prompt_completion", e.prompt, e.chosen, e.raw) for e in pref]
    return examples_from_records(records, path)


def _item_example(it: Any) -> Example:
    """An eval item (:class:`gradian.evaluate.items.EvalItem`) as an Example: question -> answer."""
    return Example(id=it.id, row=it.row, format="prompt_completion", prompt=it.prompt, completion=it.answer, raw={})


def _training_rows(x: Any) -> tuple[list[Example] | None, list[PreferenceExample] | None, str | None]:
    """The training rows: SFT rows (:class:`Example`) or preference rows (:class:`PreferenceExample`)."""
    if isinstance(x, (str, Path)):
        records = read_records(x)
        pref = preference_rows(records, x)
        return (None, pref, str(x)) if pref is not None else (examples_from_records(records, x), None, str(x))
    if x is not None:
        xs = list(x)
        if xs and all(isinstance(e, PreferenceExample) for e in xs):
            return None, xs, None
        x = xs
    examples, path = _examples(x, "data")
    return examples, None, path


def _examples(x: Any, what: str) -> tuple[list[Example] | None, str | None]:
    if x is None:
        return None, None
    if isinstance(x, (str, Path)):
        return (eval_examples(x) if what == "eval" else load_examples(x)), str(x)
    xs = list(x)
    from gradian.evaluate.items import EvalItem

    if xs and all(isinstance(e, EvalItem) for e in xs):
        return [_item_example(e) for e in xs], None
    if xs and not all(isinstance(e, Example) for e in xs):
        raise GradianUserError(
            f"{what} must be a path or a list of Example",
            where=what,
            fix="pass a dataset path or gradian.data.formats.load_examples(...)",
        )
    return xs, None


def diagnose(
    data: str | Path | Sequence[Example] | None = None,
    eval: str | Path | Sequence[Example] | None = None,
    configs: str | Path | TrainConfig | Iterable[str | Path] = (),
    logs: str | Path | TrainLog | None = None,
    tokenizer: Any = None,
    versions: dict[str, str] | Iterable[str] | str | None = None,
    *,
    select: Iterable[str] | None = None,
    on_check: Callable[[str], None] | None = None,
) -> Any:
    """Run every Audit check on what is given; skip (with the reason) those whose input is missing.

    Args:
        data: training rows: a file (JSONL/JSON/Parquet/save_to_disk folder) or ``load_examples`` output.
        eval: eval rows: the eval set ``gradian attribute --eval`` takes (``prompt``/``messages`` +
            ``answer``, read by Evaluate's reader), training-format rows, or a list of Example / EvalItem.
        configs: config files (TRL/HF JSON or YAML, axolotl, LLaMA-Factory, torchtune YAML, PEFT
            ``adapter_config.json`` or adapter folder), or one :class:`TrainConfig`.
        logs: ``trainer_state.json`` / its folder / a JSONL of logged dicts, or a :class:`TrainLog`.
        tokenizer: a local tokenizer/model folder, or a tokenizer object.
        versions: library versions, e.g. ``{"trl": "0.19.0"}`` or ``["trl=0.19.0"]``; these beat
            versions read from the adapter folder.
        select: run only these check ids (others are reported as skipped: "not selected").
        on_check: called with each check id before it runs (progress).

    Returns:
        :class:`gradian.audit.model.AuditResult`.
    """
    import gc

    # Many small lists are built (tokens, n-grams); the cyclic GC has nothing to find in them.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _diagnose(data, eval, configs, logs, tokenizer, versions, select, on_check)
    finally:
        if was_enabled:
            gc.enable()


def _diagnose(data, eval, configs, logs, tokenizer, versions, select, on_check) -> AuditResult:
    if isinstance(configs, (str, Path)):
        configs = [configs]
    if isinstance(configs, TrainConfig):
        cfg: TrainConfig | None = configs
    else:
        paths = list(configs or [])
        cfg = load_config(paths) if paths else None
    mapping = custom_mapping(cfg, str(data)) if cfg is not None and isinstance(data, (str, Path)) else None
    pref: list[PreferenceExample] | None = None
    if mapping is not None:  # axolotl datasets[].type: {field_instruction, field_output, format ...}
        ps = str(data)
        rows = apply_mapping(read_records(data), mapping[0])
        examples, data_path = [to_example(r, i, f"{ps}:{i + 1}") for i, r in enumerate(rows)], ps
    elif (lf := dataset_entry(cfg, str(data)) if isinstance(data, (str, Path)) else None) is not None or (
        ax := preference_fields(cfg, str(data)) if isinstance(data, (str, Path)) else None
    ) is not None:
        # LLaMA-Factory dataset_info.json columns / tags, or an axolotl preference entry's field names, renamed to
        # the names the row readers know
        rows = apply_columns(read_records(data), lf[0]) if lf is not None else rename_fields(read_records(data), ax[0])
        pref = preference_rows(rows, data)
        examples = None if pref is not None else examples_from_records(rows, data)
        data_path = str(data)
    else:
        examples, pref, data_path = _training_rows(data)
    eval_examples, eval_path = _examples(eval, "eval")
    log = logs if isinstance(logs, TrainLog) or logs is None else load_logs(logs)
    tok, tok_folder = None, None
    if tokenizer is not None:
        if isinstance(tokenizer, (str, Path)):
            tok_folder = str(tokenizer)
            tok = load_tokenizer_folder(tokenizer)
        else:
            tok = tokenizer
    vers: dict[str, str] = {}
    vsrc: dict[str, str] = {}
    if cfg is not None:
        vers.update(cfg.versions)
        vsrc.update(cfg.version_sources)
    for k, v in parse_versions(versions).items():
        vers[k] = v
        vsrc[k] = "--versions"

    ctx = AuditContext(examples, eval_examples, cfg, log, tok, tok_folder, vers, vsrc, data_path, eval_path, pref)
    wanted = {s.upper() for s in select} if select is not None else None
    if wanted:
        unknown = sorted(wanted - {c.id for c in all_checks()})
        if unknown:
            raise GradianUserError(
                f"unknown check id(s) {', '.join(unknown)}",
                where="--check",
                fix="see `gradian diagnose --list` for the ids",
            )
    findings: list[Finding] = []
    skipped: list[SkippedCheck] = []
    passed: list[str] = []
    checks = all_checks()
    ranks = {c.id: c.rank for c in checks}
    # Checks that read no tokenizer run first, while the token view is computed in a thread.
    order = [c for c in checks if "tokenizer" not in c.reads] + [c for c in checks if "tokenizer" in c.reads]
    if (
        ctx.has("data")
        and ctx.has("tokenizer")
        and any("tokenizer" in c.reads and (wanted is None or c.id in wanted) for c in checks)
    ):
        ctx.prefetch_token_rows()
    outcome: dict[str, tuple[str, Any]] = {}
    for spec in order:
        if on_check is not None:
            on_check(spec.id)
        if wanted is not None and spec.id not in wanted:
            outcome[spec.id] = ("skipped", "not selected")
            continue
        missing = [i for i in spec.requires if not ctx.has(i) and not (i == "data" and pref is not None)]
        if missing:
            outcome[spec.id] = ("skipped", "needs " + " and ".join(_FLAG[i] for i in missing))
            continue
        if pref is not None and "data" in spec.requires and not spec.preference:
            outcome[spec.id] = (
                "skipped",
                f"not applicable: the training rows are preference rows ({pref[0].kind}); the rule is for SFT rows",
            )
            continue
        kind = cfg.stage_kind if cfg is not None else "sft"
        if kind not in spec.stages:
            outcome[spec.id] = (
                "skipped",
                f"not applicable: {_a(cfg.stage)} {cfg.stage} run ({cfg.source('stage')}); the rule is "
                f"for {stage_words(spec.stages)}",
            )
            continue
        try:
            hits = spec.fn(ctx) or []
        except NotApplicable as e:
            why = str(e)
            if pref is not None and "data" in spec.reads and not spec.preference:  # it looked for SFT rows
                why = f"the training rows are preference rows ({pref[0].kind}); the rule is for SFT rows"
            outcome[spec.id] = ("skipped", f"not applicable: {why}")
            continue
        outcome[spec.id] = ("hits", hits) if hits else ("passed", None)
    ctx.finish_prefetch()  # never leave the thread running
    for spec in checks:
        kind, val = outcome[spec.id]
        if kind == "skipped":
            skipped.append(SkippedCheck(spec.id, spec.name, spec.title, list(spec.reads), val))
        elif kind == "passed":
            passed.append(spec.id)
        else:
            for h in val:
                n_rows = ctx.n or len(pref or [])
                frac = round(len(h.row_ids) / n_rows, 4) if h.row_ids and n_rows else None
                findings.append(
                    Finding(
                        **attrs(spec, "id", "name", "title"),  # the check's
                        **attrs(h, "severity", "message", "evidence"),  # the hit's
                        reads=list(spec.reads),
                        fix=h.fix or spec.fix,
                        row_ids=list(h.row_ids),
                        eval_row_ids=list(h.eval_row_ids),
                        steps=list(h.steps),
                        fraction=frac,
                    )
                )
    findings.sort(key=lambda f: (SEVERITY_RANK[f.severity], ranks[f.id], -(f.fraction or 0.0), _id_key(f.id)))

    inputs: dict[str, Any] = {}
    if examples is not None:
        inputs["data"] = {
            "path": data_path,
            "n_rows": len(examples),
            "formats": dict(Counter(e.format for e in examples)),
        }
    if pref is not None:
        inputs["data"] = {"path": data_path, "n_rows": len(pref), "formats": dict(Counter(e.kind for e in pref))}
    if eval_examples is not None:
        inputs["eval"] = {"path": eval_path, "n_rows": len(eval_examples)}
    if cfg is not None:
        inputs["config"] = {"paths": cfg.paths, "formats": cfg.formats, "trainer": cfg.trainer}
    if log is not None:
        inputs["logs"] = log.to_dict()
    if tok is not None:
        ti = ctx.tok_info
        inputs["tokenizer"] = {
            "name": ti.name,
            "eos_token": ti.eos_token,
            "pad_token": ti.pad_token,
            "bos_token": ti.bos_token,
            "has_chat_template": ti.chat_template is not None,
        }
    if examples is not None and tok is not None:
        L, src = ctx.max_length()
        inputs["token_view"] = {
            "max_length": L,
            "max_length_from": src,
            **ctx.token_spec.to_dict(),
            "render_failures": sum(1 for t in ctx.token_rows if t.tx is None),
        }
        inputs["token_view"]["max_length"] = L
    notes = (list(cfg.conflicts) + list(cfg.notes) if cfg is not None else []) + ctx.notes
    if log is not None:
        notes.extend(log.notes)
    if log is not None and log.steps_inferred:
        notes.append(f"{log.path}: some log entries have no step; their order was used as the step")
    return AuditResult(
        findings=findings,
        skipped=skipped,
        passed=passed,
        inputs=inputs,
        config=cfg.to_dict() if cfg is not None else None,
        versions={k: {"version": v, "from": vsrc.get(k)} for k, v in sorted(vers.items())},
        notes=notes,
        n_checks=len(checks),
    )
