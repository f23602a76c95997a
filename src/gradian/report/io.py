"""Reading what a report needs from disk, and writing reports (atomically).

:func:`report_for_run` is what ``gradian report RUN_DIR`` calls: read
``RUN_DIR/run.json`` (:func:`gradian.runfile.load_run`), read the training
log the run was given if it still exists (:func:`read_training_log`), and
:func:`gradian.report.builders.build_report`. Nothing is recomputed and no model
is loaded.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from gradian.report.builders import build_report
from gradian.report.views import Report
from gradian.runfile import load_run


def read_training_log(run: dict[str, Any], run_dir: str | Path | None = None) -> dict[str, Any] | None:
    """The run's training log history, when the manifest names a log file that can still be read.

    The manifest keeps the path as it was given to ``gradian attribute`` (possibly relative to the
    folder it ran in), so a relative path is tried as given, then against ``run_dir`` and its parent;
    a candidate whose sha256 matches the manifest's wins.

    Returns:
        None when the run was given no logs; else ``{"path", "status", "note", "train", "eval"}``
        with ``status`` one of ``plotted`` (same sha256 as at run time), ``changed`` (the file's
        sha256 differs from the manifest's: plotted, with a note), ``missing`` or ``unreadable``
        (``train``/``eval`` empty, ``note`` says why).
    """
    from gradian.errors import GradianUserError
    from gradian.util import sha256_file

    manifest = run.get("manifest") or {}
    path = (manifest.get("paths") or {}).get("logs")
    if not path:
        return None
    want = (manifest.get("identity") or {}).get("logs")
    cands = [Path(path)]
    if not Path(path).is_absolute() and run_dir is not None:
        rd = Path(run_dir) if Path(run_dir).is_dir() else Path(run_dir).parent
        cands += [rd / path, rd.parent / path]
    existing = [c for c in cands if c.exists()]
    if not existing:
        return {
            "path": path,
            "status": "missing",
            "note": "the log file no longer exists; the loss curve is not shown",
            "train": [],
            "eval": [],
        }
    p = existing[0]
    if want:
        for c in existing:
            if c.is_file() and sha256_file(c) == want:
                p = c
                break
    from gradian.audit.logs import load_logs

    try:
        log = load_logs(p)
    except GradianUserError as e:
        return {
            "path": str(p),
            "status": "unreadable",
            "note": f"the log file could not be read: {e.one_line()}",
            "train": [],
            "eval": [],
        }
    status, note = "plotted", None
    if want and p.is_file() and sha256_file(p) != want:
        status, note = "changed", "the log file changed since the run (its sha256 differs from the manifest's)"
    return {"path": str(p), "status": status, "note": note, "train": log.train, "eval": log.eval}


def _shape_problem(run: dict[str, Any]) -> str | None:
    """The first field of a run dict that is missing or of the wrong type for :func:`build_report`, or None.

    A structural check of what the report reads with ``[...]`` (valid JSON of another shape must be a
    one-line user error, not a traceback); :func:`report_for_run` also turns any shape error
    :func:`build_report` still meets into one.
    """

    def is_num(x: Any, null: bool = True) -> bool:
        return (x is None and null) or (isinstance(x, (int, float)) and not isinstance(x, bool))

    def dicts(x: Any) -> bool:
        return isinstance(x, list) and all(isinstance(e, dict) for e in x)

    for key, kind in (("evaluation", dict), ("manifest", dict), ("timing", dict)):
        if key in run and run[key] is not None and not isinstance(run[key], kind):
            return f"{key} is not an object"
    ev = run.get("evaluation") or {}
    if not dicts(ev.get("capabilities") or []):
        return "evaluation.capabilities is not a list of objects"
    for i, c in enumerate(ev.get("capabilities") or []):
        where = f"evaluation.capabilities[{i}]"
        for k in ("name", "metric", "verdict"):
            if not isinstance(c.get(k), str):
                return f"{where}.{k} is not a string"
        if c["verdict"] not in ("regressed", "improved", "within_noise"):
            return f"{where}.verdict is {c['verdict'][:40]!r}"
        if not isinstance(c.get("n"), int) or isinstance(c.get("n"), bool):
            return f"{where}.n is not a whole number"
        for k in ("reference_score", "tuned_score", "delta", "ci_low", "ci_high"):
            if k not in c or not is_num(c[k]):
                return f"{where}.{k} is not a number"
        for k in ("confidence", "sign_test_p"):
            if not is_num(c.get(k)):
                return f"{where}.{k} is not a number"
        for k in ("n_kept", "n_lost", "n_gained", "n_both_fail"):
            if k in c and (not isinstance(c[k], int) or isinstance(c[k], bool)):
                return f"{where}.{k} is not a whole number"
        if c.get("base_bounds") is not None and not isinstance(c["base_bounds"], dict):
            return f"{where}.base_bounds is not an object"
    att = run.get("attribution")
    if att is not None:
        if not isinstance(att, dict):
            return "attribution is not an object"
        if not isinstance(att.get("train_ids") or [], list) or not dicts(att.get("capabilities") or []):
            return "attribution.train_ids / capabilities are not lists"
        for i, a in enumerate(att.get("capabilities") or []):
            where = f"attribution.capabilities[{i}]"
            if not isinstance(a.get("capability"), str):
                return f"{where}.capability is not a string"
            if not isinstance(a.get("scores"), list) or not all(is_num(x, null=False) for x in a["scores"]):
                return f"{where}.scores is not a list of numbers"
            for k in ("clusters", "ranked", "drilldown", "queries", "failing_items", "drill_queries", "drill_items"):
                if not dicts(a.get(k) or []):
                    return f"{where}.{k} is not a list of objects"
            for j, c in enumerate(a.get("clusters") or []):
                if (
                    not all(is_num(c.get(k), null=False) for k in ("label", "size", "harmful_share", "score"))
                    or not isinstance(c.get("row_ids"), list)
                    or not dicts(c.get("exemplars") or [])
                ):
                    return f"{where}.clusters[{j}] lacks label/size/harmful_share/score/row_ids"
            for j, r in enumerate(a.get("ranked") or []):
                if "id" not in r:
                    return f"{where}.ranked[{j}] has no id"
            for j, d in enumerate(a.get("drilldown") or []):
                sents = d.get("sentences") or []
                if (
                    "id" not in d
                    or not dicts(sents)
                    or not all(
                        isinstance(x.get("char_start"), int)
                        and isinstance(x.get("char_end"), int)
                        and isinstance(x.get("text"), str)
                        for x in sents
                    )
                ):
                    return f"{where}.drilldown[{j}] lacks id or sentences with char_start/char_end/text"
            ag = a.get("agreement")
            if ag is not None and (not isinstance(ag, dict) or not isinstance(ag.get("engines"), list)):
                return f"{where}.agreement has no engines list"
    audit = run.get("audit")
    if audit is not None:
        if not isinstance(audit, dict) or not dicts(audit.get("findings") or []):
            return "audit.findings is not a list of objects"
        for j, f in enumerate(audit.get("findings") or []):
            steps = f.get("steps") or []
            if not isinstance(steps, list) or not all(isinstance(x, int) for x in steps):
                return f"audit.findings[{j}].steps is not a list of whole numbers"
            for k in ("row_ids", "reads"):
                if not isinstance(f.get(k) or [], list):
                    return f"audit.findings[{j}].{k} is not a list"
    return None


def report_for_run(run_dir: str | Path, read_logs: bool = True) -> Report:
    """Load ``RUN_DIR/run.json`` and build its report (no model, no recomputation).

    Raises:
        GradianUserError: no run.json, malformed JSON, or JSON of another shape (naming the field).
    """
    from gradian.errors import GradianUserError

    run = load_run(run_dir)
    where = str(Path(run_dir) / "run.json" if Path(run_dir).is_dir() else run_dir)
    problem = _shape_problem(run)
    fix = "pass a run folder written by `gradian attribute` (re-run it to write run.json again)"
    if problem:
        raise GradianUserError(f"not a valid gradian.run/1 file: {problem}", where=where, fix=fix)
    try:
        return build_report(run, read_training_log(run, run_dir) if read_logs else None)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as e:
        # build_report is a pure function of the run dict: what it cannot read is the file's shape
        raise GradianUserError(
            f"not a valid gradian.run/1 file ({type(e).__name__}: {str(e)[:120]})", where=where, fix=fix
        ) from None


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


# characters JSON may carry raw but a terminal or editor would act on: DEL, C1 controls, bidi controls,
# line/paragraph separators (JSON itself escapes C0 controls)
_JSON_RAW_UNSAFE = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def report_json(report: Report) -> str:
    r"""The ``gradian.report/1`` JSON.

    Strict JSON: a number that is NaN or infinite is ``null``. Strings are kept verbatim (it is
    data); characters a terminal would act on (DEL, C1 and bidi controls, U+2028/9) are written
    as ``\u`` escapes (four hex digits), so ``cat report.json`` is safe and ``json.loads`` returns them unchanged.
    """
    text = json.dumps(_json_safe(report.to_dict()), indent=2, ensure_ascii=False, allow_nan=False)
    return _JSON_RAW_UNSAFE.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text) + "\n"


def load_report_json(text: str) -> Report:
    """Read a ``report.json`` text back into a :class:`Report`."""
    return Report.from_dict(json.loads(text))
