"""Issue 25 (audit round 3), before and after: every case's command on two source trees, side by side.

    python benchmarks/bench_round3_cases.py --before BEFORE_SRC [--after src] [--work DIR] [--md FILE]
                                            [--worlds DIR ...]

The fixtures are written by ``tests/audit/round3_cases.py WORK`` (with the AFTER tree on the path; every one comes
from the test fixtures). Each case's command (``gradian diagnose ...`` / ``attribute`` / ``index``, run from WORK in
a fresh process as ``python -m gradian ARGS --format json --fail-on never``) is run once with ``PYTHONPATH``
= BEFORE_SRC and once with AFTER_SRC; the table gives, for each side, the finding line of each check the case
names (``ID severity: message``), ``ID passed``, ``ID skipped: reason``, or the refusal line of a user error
(exit 2), and, for AFTER, what Audit read (``inputs.data.formats`` and the named ``config.values``, with the file
and field each came from; a BEFORE cell adds ``read: ...`` where BEFORE read a value differently). A check id the
tree does not know is shown as ``ID (no such check)``.

A second table counts D15 findings (and the eval rows they flag) on the template fixtures, the paraphrase
fixtures (planted light edits: caught / planted), the audit tests' clean world, and each world folder given by
``--worlds`` (a ``gradian world --out DIR`` folder: its train.jsonl against its eval.jsonl and valid.jsonl).

The markdown (``--md``, else stdout) is what docs/diagnose.md "Round 3: before and after" holds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_MSG = 260


def _env(src: Path) -> dict:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(src), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", CI="true", NO_COLOR="1", COLUMNS="400"
    )
    return env


def run(src: Path, work: Path, args: list[str]) -> tuple[int, dict | None, str]:
    """``(exit code, the JSON report or None, the last stderr/stdout line)`` of ``python -m gradian ARGS``."""
    extra = ["--format", "json", "--fail-on", "never"] if args[0] == "diagnose" else []
    p = subprocess.run(
        [sys.executable, "-m", "gradian", *args, *extra], cwd=work, env=_env(src), capture_output=True, text=True
    )
    report = None
    if args[0] == "diagnose" and p.returncode in (0, 1):
        try:
            report = json.loads(p.stdout)
        except json.JSONDecodeError:
            report = None
    lines = [ln.strip() for ln in (p.stderr + "\n" + p.stdout).splitlines() if ln.strip()]
    return p.returncode, report, (lines[-1] if lines else "")


def _short(s: str, n: int = MAX_MSG) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 1] + "…"


def check_lines(report: dict, ids: list[str]) -> list[str]:
    out = []
    skipped = {s["id"]: s["reason"] for s in report["skipped"]}
    for cid in ids:
        found = [f for f in report["findings"] if f["id"] == cid]
        if found:
            out += [f"{cid} {f['severity']}: {_short(f['message'])}" for f in found]
        elif cid in report["passed"]:
            out.append(f"{cid} passed")
        elif cid in skipped:
            out.append(f"{cid} skipped: {_short(skipped[cid], 120)}")
        else:
            out.append(f"{cid} (no such check)")
    return out


def reads_lines(report: dict, keys: list[str]) -> list[str]:
    out = []
    values = (report.get("config") or {}).get("values", {})
    for k in keys:
        if k == "formats":
            out.append(f"formats {report['inputs'].get('data', {}).get('formats')}")
        elif k == "versions":
            out += [f"{lib} {v['version']} ({v['from']})" for lib, v in report.get("versions", {}).items()]
        elif k in values:
            v = values[k]
            out.append(f"{k}={_short(repr(v['value']), 70)} ({v['from']})")
        else:
            out.append(f"{k} not read")
    return out


def side(src: Path, work: Path, c: dict) -> tuple[list[str], list[str]]:
    """(the lines of the case's checks or its refusal, what Audit read)."""
    code, report, last = run(src, work, c["args"])
    if report is None:
        return [f"exit {code}: {_short(last)}"], []
    return check_lines(report, c["show"]) or [f"exit {code}"], reads_lines(report, c["reads"])


def _differs(before: list[str], after: list[str]) -> list[str]:
    """What the BEFORE tree read differently (its lines that the AFTER tree's reads do not hold)."""
    return [f"read: {x}" for x in before if x not in after]


def _cell(lines: list[str]) -> str:
    return "<br>".join(ln.replace("|", "\\|") for ln in lines) or "—"


def case_table(cases: list[dict], before: Path, after: Path, work: Path) -> str:
    rows = ["| case | command (from the fixture folder) | before | after | Audit now reads |", "|---|---|---|---|---|"]
    for c in cases:
        b, b_reads = side(before, work, c)
        a, reads = side(after, work, c)
        b += _differs(b_reads, reads)
        cmd = "`gradian " + " ".join(c["args"]) + "`"
        rows.append(f"| **{c['id']}** {c['case']} | {cmd} | {_cell(b)} | {_cell(a)} | {_cell(reads)} |")
        print(f"  {c['id']}: done", file=sys.stderr)
    return "\n".join(rows)


def d15_count(src: Path, work: Path, data: str, ev: str) -> tuple[int, list[str], str]:
    """``(D15 findings, flagged eval row ids, status)`` of one data/eval pair."""
    code, report, last = run(src, work, ["diagnose", "--data", data, "--eval", ev, "--check", "D15"])
    if report is None:
        return 0, [], f"exit {code}: {_short(last, 120)}"
    found = [f for f in report["findings"] if f["id"] == "D15"]
    flagged = sorted({e for f in found for e in f["eval_row_ids"]})
    reasons = {s["id"]: s["reason"] for s in report["skipped"]}
    status = "passed" if "D15" in report["passed"] else ("finding" if found else f"skipped: {reasons.get('D15')}")
    return len(found), flagged, status


def d15_table(pairs: list[tuple[str, str, str]], before: Path, after: Path, work: Path) -> str:
    rows = [
        "| fixture | eval rows | before: D15 findings (eval rows flagged) | after: D15 findings (eval rows flagged) |"
        " planted light edits caught (after) |",
        "|---|---|---|---|---|",
    ]
    for name, data, ev in pairs:
        ids = [json.loads(ln).get("id", "") for ln in (work / ev).read_text().splitlines() if ln.strip()]
        planted = {i for i in ids if str(i).startswith("para-")}
        cells, flagged_after = [], []
        for src in (before, after):
            n, flagged_after, status = d15_count(src, work, data, ev)
            cells.append(f"{n} ({len(flagged_after)})" if status in ("passed", "finding") else status)
        caught = f"{len(planted & set(flagged_after))} of {len(planted)}" if planted else "—"
        false = len(set(flagged_after) - planted)
        if planted:
            caught += f", {false} other rows flagged"
        rows.append(f"| {name} | {len(ids)} | {cells[0]} | {cells[1]} | {caught} |")
        print(f"  D15 {name}: done", file=sys.stderr)
    return "\n".join(rows)


def d15_pairs(work: Path, cases: list[dict], worlds: list[Path]) -> list[tuple[str, str, str]]:
    pairs = []
    for c in cases:  # the template fixtures and their light edits
        if "D15" in c["show"]:
            a = c["args"]
            pairs.append((f"template_world.{c['id'][2:]}", a[a.index("--data") + 1], a[a.index("--eval") + 1]))
    for p in sorted((work / "d15").iterdir()):
        pairs.append((p.name, str((p / "train.jsonl").relative_to(work)), str((p / "eval.jsonl").relative_to(work))))
    for w in worlds:
        for ev in ("eval.jsonl", "valid.jsonl"):
            if (w / ev).is_file():
                pairs.append((f"gradian world {w.name}: train vs {ev}", str(w / "train.jsonl"), str(w / ev)))
    return pairs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="the BEFORE tree's src folder")
    ap.add_argument("--after", type=Path, default=ROOT / "src", help="the AFTER tree's src folder (this one)")
    ap.add_argument("--work", type=Path, default=None, help="where the fixtures are written (default: a temp folder)")
    ap.add_argument("--md", type=Path, default=None, help="write the markdown tables here (default: stdout)")
    ap.add_argument("--worlds", type=Path, nargs="*", default=[], help="gradian world folders to count D15 on")
    a = ap.parse_args()
    work = (a.work or Path(tempfile.mkdtemp(prefix="round3-"))).resolve()
    before, after = a.before.resolve(), a.after.resolve()
    env = _env(after)
    env["PYTHONPATH"] = f"{after}{os.pathsep}{ROOT / 'tests'}"
    subprocess.run([sys.executable, str(ROOT / "tests/audit/round3_cases.py"), str(work)], env=env, check=True)
    cases = json.loads((work / "cases.json").read_text())
    pref = json.loads((work / "pref_cases.json").read_text())
    out = ["### Every case", "", case_table(cases, before, after, work), "", "### D15 counts", ""]
    out += [d15_table(d15_pairs(work, cases, [w.resolve() for w in a.worlds]), before, after, work), ""]
    out += ["### Preference checks (D22-D27)", "", case_table(pref, before, after, work), ""]
    text = "\n".join(out)
    if a.md:
        a.md.write_text(text)
        print(f"wrote {a.md} (fixtures in {work})", file=sys.stderr)
    else:
        print(text)


if __name__ == "__main__":
    main()
