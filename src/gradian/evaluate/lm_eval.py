r"""lm-evaluation-harness ``--log_samples`` output read as a Gradian eval set.

lm-eval (:data:`LM_EVAL_FORMAT_VERSION`, the pinned lm-eval format version: the
format was read from ``lm_eval/evaluator.py`` ``evaluate()`` (the ``example``
dict of each logged sample) and ``lm_eval/loggers/evaluation_tracker.py``
``EvaluationTracker.save_results_samples`` / ``save_results_aggregated``)
writes, per run, into one folder:

* ``samples_<task>_<date>.jsonl``: one JSON object a line per (document,
  filter) with ``doc_id``, ``doc``, ``target`` (``str(doc_to_target(doc))``),
  ``arguments`` (``{"gen_args_<i>": {"arg_<j>": ...}}``, one entry per request:
  for ``generate_until`` ``arg_0`` is the rendered prompt and ``arg_1`` the
  generation kwargs; for ``loglikelihood`` / ``multiple_choice`` ``arg_0`` is the
  context and ``arg_1`` the continuation, one request per choice), ``resps``,
  ``filtered_resps``, ``filter``, ``metrics`` and the hashes;
* ``results_<date>.json`` (or ``<stem>_<date>.json`` when ``--output_path``
  named a ``.json`` file), the same ``<date>``: ``configs.<task>`` with
  ``output_type`` and ``metric_list``, and at top level ``chat_template``,
  ``chat_template_sha``, ``system_instruction``, ``fewshot_as_multiturn``.

Mapping, per samples file (one capability = the task name):

* ``generate_until`` with ``exact_match`` in ``metric_list``: prompt = ``arg_0``, its
  generation kwargs' ``until`` strings end the answer (the generated text is cut at
  the first, as lm-eval cuts it),
  answer = ``target`` with the metric's ``regexes_to_ignore`` removed (what
  lm-eval compares against, e.g. gsm8k's "... #### 72" becomes "72"), stripped;
  metric ``exact_match``. lm-eval's ``ignore_case`` / ``ignore_punctuation`` are
  not applied per task: Gradian's run-wide normalisation decides (casefold and
  punctuation stripping are on by default). Any other generation metric
  (``bleu``, ``f1``, ...) is refused.
* ``multiple_choice`` and ``loglikelihood``: metric ``loglik``; prompt = the gold
  choice's ``arg_0``, answer = its ``arg_1`` (the continuation, with lm-eval's
  target delimiter, e.g. ``" Paris"``), scored by lm-eval's own rule
  (:func:`gradian.evaluate.likelihood.score_continuations`: the continuation's
  tokens alone, no end token, so the number is the sample's logged
  loglikelihood). Distractors are not scored (Gradian's ``loglik`` is
  log p(answer | prompt), not lm-eval's arg-max over choices).
  ``loglikelihood_rolling`` is refused.
* The prompt: with no chat template in the results file it is ``arg_0`` kept as
  already rendered (``raw``: never wrapped in the tuned model's chat template).
  With one, the rendered string is split into ``messages`` by the ChatML
  (``<|im_start|>role\n...<|im_end|>\n``) or Llama-3 markers when the whole string
  is such a conversation ending in the assistant generation prompt, and the
  split is kept only if rendering it through the results file's
  ``chat_template`` gives back the string byte for byte; otherwise the rendered
  string stays a raw prompt.
* What lm-eval's model said (``resps``) is not used: Evaluate regenerates the
  tuned and reference answers itself (an eval item has no field for a given
  answer).
* Several filters (gsm8k logs ``strict-match`` and ``flexible-extract``) log a
  line each per document; the first line of a ``doc_id`` is used and later ones
  must carry the same prompt and target.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from gradian.errors import GradianUserError

#: The lm-eval release whose output format this reader follows (the pinned lm-eval format version).
LM_EVAL_FORMAT_VERSION = "0.4.13"

_SAMPLES = re.compile(r"^samples_(?P<task>.+)_(?P<date>\d{4}-\d{2}-\d{2}T[0-9.\-]+)\.jsonl$")
#: Fields every logged sample has (evaluator.py's ``example`` dict).
SAMPLE_FIELDS = ("doc_id", "target", "arguments", "resps", "filtered_resps")
GENERATE_METRICS = ("exact_match",)
#: (turn, first marker, generation prompt) of the chat markups a rendered prompt is split by.
_CHAT_MARKUPS = (
    (
        re.compile(r"<\|im_start\|>(system|user|assistant)\n(.*?)<\|im_end\|>\n", re.S),
        "<|im_start|>",
        "<|im_start|>assistant\n",
    ),
    (
        re.compile(r"<\|start_header_id\|>(system|user|assistant)<\|end_header_id\|>\n\n(.*?)<\|eot_id\|>", re.S),
        "<|start_header_id|>",
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
    ),
)


def is_lm_eval_record(rec: Any) -> bool:
    """Whether a record is an lm-eval logged sample (has its fields, and no ``prompt``/``messages``)."""
    return (
        isinstance(rec, dict) and all(k in rec for k in SAMPLE_FIELDS) and "prompt" not in rec and "messages" not in rec
    )


def samples_files(path: Path) -> list[Path]:
    """The lm-eval samples files ``path`` names: itself, or the ``samples_*.jsonl`` in a folder.

    A folder is lm-eval output when it (or, failing that, exactly one of its
    sub-folders: lm-eval writes into ``<output_path>/<model_name_sanitized>/``)
    holds ``samples_<task>_<date>.jsonl`` files. Returns [] when it is not.
    """
    if path.is_file():
        return [path] if _SAMPLES.match(path.name) or _first_is_sample(path) else []
    if not path.is_dir():
        return []
    found = sorted(p for p in path.glob("samples_*.jsonl") if _SAMPLES.match(p.name))
    if found:
        return found
    subs = [d for d in sorted(path.iterdir()) if d.is_dir() and any(_SAMPLES.match(p.name) for p in d.iterdir())]
    if len(subs) > 1:
        raise GradianUserError(
            f"folder holds lm-eval samples for {len(subs)} models ({', '.join(d.name for d in subs)})",
            where=str(path),
            fix=f"give --eval one of them, e.g. {subs[0]}",
        )
    return sorted(p for p in subs[0].glob("samples_*.jsonl") if _SAMPLES.match(p.name)) if subs else []


def lm_eval_files(path: Path) -> list[Path]:
    """Every file of an lm-eval run that decides the eval set ``path`` names: the samples files
    (:func:`samples_files`) and the ``results_<date>.json`` beside each (its task configs, metric lists and chat
    template). [] when ``path`` is not lm-eval output. For the run's content identity (never raises for a missing
    results file: reading the eval set reports that).
    """
    found: dict[Path, None] = {}
    for sp in samples_files(path):
        found[sp] = None
        m = _SAMPLES.match(sp.name)
        if m:
            for r in sorted(sp.parent.glob(f"*_{m.group('date')}.json")):
                if r.is_file():
                    found[r] = None
    return sorted(found)


def _first_is_sample(path: Path) -> bool:
    if path.suffix.lower() != ".jsonl":
        return False
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.strip():
                    try:
                        return is_lm_eval_record(json.loads(line))
                    except json.JSONDecodeError:
                        return False
    except OSError:
        return False  # the ordinary reader reports an unreadable file
    return False


def _results_for(samples: Path) -> tuple[Path, dict[str, Any]]:
    m = _SAMPLES.match(samples.name)
    if not m:
        raise GradianUserError(
            "lm-eval samples file is not named samples_<task>_<date>.jsonl",
            where=str(samples),
            fix="keep the name lm-eval gave it (the task and date find its results_<date>.json)",
        )
    date = m.group("date")
    cands = sorted(p for p in samples.parent.glob(f"*_{date}.json") if p.is_file())
    if not cands:
        raise GradianUserError(
            f"no lm-eval results file (results_{date}.json) beside the samples",
            where=str(samples),
            fix="keep the results_<date>.json lm-eval wrote in the same folder",
        )
    if len(cands) > 1:
        raise GradianUserError(
            f"{len(cands)} results files end in _{date}.json", where=str(samples.parent), fix="keep only lm-eval's one"
        )
    try:
        results = json.loads(cands[0].read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise GradianUserError(
            f"cannot read lm-eval results: {e}", where=str(cands[0]), fix="give the file lm-eval wrote"
        ) from None
    if not isinstance(results, dict) or not isinstance(results.get("configs"), dict):
        raise GradianUserError(
            "lm-eval results file has no 'configs' object", where=str(cands[0]), fix="give the file lm-eval wrote"
        )
    return cands[0], results


def _task_config(samples: Path) -> tuple[str, dict[str, Any], dict[str, Any], Path]:
    res_path, results = _results_for(samples)
    task = _SAMPLES.match(samples.name).group("task")  # type: ignore[union-attr]
    cfg = results["configs"].get(task)
    if not isinstance(cfg, dict):
        raise GradianUserError(
            f"lm-eval results have no configs.{task}", where=str(res_path), fix="give the results of the same run"
        )
    return task, cfg, results, res_path


def _arguments(rec: dict[str, Any], where: str) -> list[dict[str, Any]]:
    args = rec.get("arguments")
    if not isinstance(args, dict) or not args:
        raise GradianUserError(
            "field 'arguments' is not a non-empty object of gen_args_<i>", where=where, fix="give lm-eval's line"
        )
    out = []
    for i in range(len(args)):
        a = args.get(f"gen_args_{i}")
        if not isinstance(a, dict) or not isinstance(a.get("arg_0"), str):
            raise GradianUserError(
                f"field 'arguments.gen_args_{i}.arg_0' is missing or not a string",
                where=where,
                fix="give lm-eval's line unchanged",
            )
        out.append(a)
    return out


def _exact_match_cfg(task: str, cfg: dict[str, Any], where: str) -> dict[str, Any]:
    mlist = cfg.get("metric_list")
    if not isinstance(mlist, list) or not mlist:
        raise GradianUserError(
            f"configs.{task}.metric_list is missing", where=where, fix="give the results file lm-eval wrote"
        )
    names = [m.get("metric") if isinstance(m, dict) else m for m in mlist]
    for m in mlist:
        if isinstance(m, dict) and m.get("metric") == "exact_match":
            return m
    raise GradianUserError(
        f"lm-eval metric {', '.join(map(str, names))} of task {task!r} is not supported for generation",
        where=where,
        fix=f"Gradian maps generate_until tasks scored by {', '.join(GENERATE_METRICS)}; "
        "use a task with exact_match, or write a Gradian eval file",
    )


def _strip_regexes(target: str, m: dict[str, Any], where: str) -> str:
    regs = m.get("regexes_to_ignore") or []
    if not isinstance(regs, list):
        raise GradianUserError(
            "metric_list exact_match 'regexes_to_ignore' is not a list", where=where, fix="give lm-eval's results"
        )
    for r in regs:
        try:
            target = re.sub(str(r), "", target)
        except re.error as e:
            raise GradianUserError(
                f"regexes_to_ignore {r!r} is not a regex: {e}", where=where, fix="give lm-eval's results"
            ) from None
    return target.strip()


def _split_chat(text: str, results: dict[str, Any]) -> list[dict[str, str]] | None:
    """Messages whose rendering through the results' chat template is ``text`` exactly; None if not sound."""
    template = results.get("chat_template")
    if not isinstance(template, str) or not template:
        return None
    for pat, opener, gen in _CHAT_MARKUPS:
        pos = text.find(opener)
        if pos < 0:
            continue
        prefix, msgs = text[:pos], []
        while (m := pat.match(text, pos)) is not None:
            msgs.append({"role": m.group(1), "content": m.group(2)})
            pos = m.end()
        if text[pos:] != gen or not msgs or msgs[-1]["role"] == "assistant":
            return None
        try:
            from transformers.utils.chat_template_utils import _compile_jinja_template

            again = _compile_jinja_template(template).render(
                messages=msgs, add_generation_prompt=True, bos_token=prefix, eos_token=""
            )
        except Exception:  # noqa: BLE001 - any failure to re-render means the split is not verified
            return None
        return msgs if again == text else None
    return None


def _prompt(text: str, results: dict[str, Any]) -> tuple[str | list[dict[str, str]], bool]:
    """(prompt, raw): messages when the rendered chat splits soundly, else the string kept as rendered."""
    msgs = _split_chat(text, results)
    if msgs is not None:
        return msgs, False
    return text, True


def _gold(target: str, choices: list[str], where: str) -> list[int]:
    as_text = [i for i, c in enumerate(choices) if c == target]
    idx: list[int] | None = None
    s = target.strip()
    if re.fullmatch(r"-?\d+", s):
        idx = [int(s)]
    elif s.startswith("[") and s.endswith("]"):
        try:
            v = json.loads(s)
            if isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
                idx = v
        except json.JSONDecodeError:
            idx = None
    if idx is not None and as_text and as_text != idx:
        raise GradianUserError(
            f"field 'target' {target!r} is both a choice index and a choice's text",
            where=where,
            fix="write a Gradian eval file for this task",
        )
    gold = idx if idx is not None else as_text
    if not gold or any(not 0 <= g < len(choices) for g in gold):
        raise GradianUserError(
            f"field 'target' {target!r} is neither a choice index (0..{len(choices) - 1}) nor a choice's text",
            where=where,
            fix="give lm-eval's line unchanged",
        )
    return gold


def _record(
    rec: dict[str, Any], task: str, cfg: dict[str, Any], results: dict[str, Any], where: str, res_where: str
) -> dict[str, Any]:
    for k in SAMPLE_FIELDS:
        if k not in rec:
            raise GradianUserError(f"missing field {k!r}", where=where, fix="give lm-eval's --log_samples line")
    if not isinstance(rec["target"], str):
        raise GradianUserError(
            f"field 'target' is a {type(rec['target']).__name__}, not a string", where=where, fix="give lm-eval's line"
        )
    args = _arguments(rec, where)
    otype = cfg.get("output_type")
    base = {"id": f"{task}/{rec['doc_id']}", "capability": task}
    if otype == "generate_until":
        m = _exact_match_cfg(task, cfg, res_where)
        prompt, raw = _prompt(args[0]["arg_0"], results)
        answer = _strip_regexes(rec["target"], m, where)
        gen = args[0].get("arg_1")
        until = gen.get("until") if isinstance(gen, dict) else None
        until = [until] if isinstance(until, str) else [u for u in until or [] if isinstance(u, str) and u]
        return {**base, "prompt": prompt, "answer": answer, "metric": "exact_match", "_raw": raw, "_stop": until}
    if otype in ("multiple_choice", "loglikelihood"):
        n = len(args)
        names = [m.get("metric") if isinstance(m, dict) else m for m in cfg.get("metric_list") or []]
        if otype == "multiple_choice" and "acc_mutual_info" in names and n % 2 == 0:
            n //= 2  # the second half are the unconditional ("", choice) requests
        if any(not isinstance(a.get("arg_1"), str) for a in args[:n]):
            raise GradianUserError(
                "field 'arguments.gen_args_<i>.arg_1' (the continuation) is not a string",
                where=where,
                fix="give lm-eval's line unchanged",
            )
        if otype == "loglikelihood":
            gold = [0]
        else:
            delim = cfg.get("target_delimiter", " ")
            delim = delim if isinstance(delim, str) else " "
            choices = [a["arg_1"][len(delim) :] if a["arg_1"].startswith(delim) else a["arg_1"] for a in args[:n]]
            gold = _gold(rec["target"], choices, where)
        ctxs = {args[g]["arg_0"] for g in gold}
        if len(ctxs) > 1:
            raise GradianUserError(
                "the gold choices have different contexts", where=where, fix="write a Gradian eval file for this task"
            )
        prompt, raw = _prompt(args[gold[0]]["arg_0"], results)
        conts = [args[g]["arg_1"] for g in gold]
        return {
            **base,
            "prompt": prompt,
            "answer": conts[0],
            "aliases": conts[1:],
            "metric": "loglik",
            "_raw": raw,
            "_ends": False,  # scored as lm-eval scores it: the continuation alone
        }
    raise GradianUserError(
        f"lm-eval output_type {otype!r} of task {task!r} is not supported",
        where=res_where,
        fix="Gradian reads generate_until (exact_match), multiple_choice and loglikelihood tasks",
    )


def read_lm_eval(files: list[Path]) -> list[tuple[dict[str, Any], str]]:
    """Gradian eval records (with a private ``_raw`` flag) and their ``file:line``, from lm-eval samples files.

    One capability per file (the task name); ids are ``<task>/<doc_id>``.

    Raises:
        GradianUserError: one line naming ``file:line`` and the field for a malformed
            sample, or the results file and the metric / output type for a refused task.
    """
    out: list[tuple[dict[str, Any], str]] = []
    for f in files:
        task, cfg, results, res_path = _task_config(f)
        res_where = f"{res_path} (configs.{task})"
        seen: dict[str, tuple[dict[str, Any], str]] = {}
        with f.open(encoding="utf-8") as fh:
            for i, line in enumerate(fh):
                where = f"{f}:{i + 1}"
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise GradianUserError(
                        f"not JSON: {e.msg}", where=where, fix="give lm-eval's samples file unchanged"
                    ) from None
                if not isinstance(rec, dict):
                    raise GradianUserError("line is not a JSON object", where=where, fix="give lm-eval's line")
                item = _record(rec, task, cfg, results, where, res_where)
                prev = seen.get(item["id"])
                if prev is not None:
                    if prev[0] != item:
                        raise GradianUserError(
                            f"doc_id {rec['doc_id']!r} is logged again (filter {rec.get('filter')!r}) with a "
                            f"different prompt or target (first at {prev[1]})",
                            where=where,
                            fix="give one lm-eval run's samples file",
                        )
                    continue
                seen[item["id"]] = (item, where)
                out.append((item, where))
        if not seen:
            raise GradianUserError("lm-eval samples file is empty", where=str(f), fix="give a file with samples")
    return out
