"""Reading what a report needs from disk, and writing reports (atomically).

:func:`report_for_run` is what ``gradian report RUN_DIR`` calls: read
``RUN_DIR/run.json`` (:func:`gradian.attribute.run.load_run`), read the training
log the run was given if it still exists (:func:`read_training_log`), and
:func:`gradian.report.model.build_report`. Nothing is recomputed and no model
is loaded.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from gradian.report.model import Report, build_report


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
        return {"path": path, "status": "missing", "note": "the log file no longer exists; the loss curve is not shown",
                "train": [], "eval": []}
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
        return {"path": str(p), "status": "unreadable", "note": f"the log file could not be read: {e.one_line()}",
                "train": [], "eval": []}
    status, note = "plotted", None
    if want and p.is_file() and sha256_file(p) != want:
        status, note = "changed", "the log file changed since the run (its sha256 differs from the manifest's)"
    return {"path": str(p), "status": status, "note": note, "train": log.train, "eval": log.eval}


def report_for_run(run_dir: str | Path, read_logs: bool = True) -> Report:
    """Load ``RUN_DIR/run.json`` and build its report (no model, no recomputation)."""
    from gradian.attribute.run import load_run

    run = load_run(run_dir)
    return build_report(run, read_training_log(run, run_dir) if read_logs else None)


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
    """The ``gradian.report/1`` JSON.

    Strict JSON: a number that is NaN or infinite is ``null``. Strings are kept verbatim (it is
    data); characters a terminal would act on (DEL, C1 and bidi controls, U+2028/9) are written
    as ``\\u`` escapes (four hex digits), so ``cat report.json`` is safe and ``json.loads`` returns them unchanged.
    """
    text = json.dumps(_json_safe(report.to_dict()), indent=2, ensure_ascii=False, allow_nan=False)
    return _JSON_RAW_UNSAFE.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text) + "\n"


def load_report_json(text: str) -> Report:
    return Report.from_dict(json.loads(text))
