"""Property-based fuzzing of run.json under its two readers of inputs: ``gradian verify`` (up to its first
retrain, :func:`gradian.verify.prepare_verify`) and :meth:`gradian.attributor.Attributor.from_run`, plus the
report's loader.

Random mutations of a real tiny run.json (the demo's): keys dropped, values replaced by wrong types, NaN, huge
numbers, odd strings and bad paths, unknown keys added. The only acceptable outcomes are a result or a one-line
:class:`GradianUserError`; any other exception is a bug. Derandomized, fixed example budget, no deadline.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
import time
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gradian.errors import GradianUserError  # noqa: E402
from gradian_testlib import fuzz_scalars, fuzz_settings, json_paths  # noqa: E402

#: examples per reader (about 0.01 s each: most stop at the schema, the rest read everything but the model)
N, FUZZ = fuzz_settings(300, "large_base_example")

scalars = fuzz_scalars(
    8,
    [
        "",
        "/nonexistent/run/input",
        "../../../../etc/passwd",
        "/",
        ".",
        "cuda:99",
        "t0001",
        "capitals",
        "regressed",
        "contrastive",
        1e308,
        -1,
        0,
        2**63,
        float("nan"),
        float("-inf"),
    ],
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


@pytest.fixture(scope="module")
def real_run(demo):
    """The demo's poisoned run.json (its inputs are on disk in the demo's cache) and a scratch folder."""
    os.environ["GRADIAN_CACHE"] = str(demo[0] / "cache")  # the run's index and hash memo live there
    return json.loads((demo[0] / "out" / "poisoned" / "run.json").read_text()), Path(tempfile.mkdtemp())


def _mutate(run: dict, mutations) -> dict:
    run = copy.deepcopy(run)
    for path, op, value in mutations:
        parent = run
        try:
            for k in path[:-1]:
                parent = parent[k]
            if op == "drop" and isinstance(parent, dict):
                parent.pop(path[-1], None)
            elif op == "extra" and isinstance(parent[path[-1]], dict):
                parent[path[-1]]["bogus_key"] = copy.deepcopy(value)
            else:
                parent[path[-1]] = copy.deepcopy(value)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed or replaced this path
    return run


def _only_user_errors(fn, *a, **kw):
    try:
        return fn(*a, **kw)
    except GradianUserError as e:
        line = e.one_line()
        assert line and "\n" not in line
        return e


COUNTS: dict[str, list[float]] = {}
#: per reader, how many examples got through to a result (the rest: one-line user errors)
RESULTS: dict[str, int] = {}


def _run(real_run, mutations, reader):
    from gradian.attributor import Attributor
    from gradian.report import report_for_run
    from gradian.verify import VerifySpec, prepare_verify

    run, scratch = real_run
    d = Path(tempfile.mkdtemp(dir=scratch))
    (d / "run.json").write_text(json.dumps(_mutate(run, mutations)))
    t = time.perf_counter()
    if reader == "verify":
        got = _only_user_errors(prepare_verify, d, VerifySpec(controls=1, seed_band=1), say=lambda s: None)
    elif reader == "from_run":
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = _only_user_errors(Attributor.from_run, d)
    else:
        got = _only_user_errors(report_for_run, d, read_logs=True)
    COUNTS.setdefault(reader, []).append(time.perf_counter() - t)
    RESULTS[reader] = RESULTS.get(reader, 0) + (not isinstance(got, GradianUserError))


def _draw_mutations(data, run: dict):
    """1 to 3 mutations at paths of the real run (drawn inside the test: the paths come from the demo's run)."""
    # of each list the first few items: the rest are alike
    paths = _PATHS.setdefault("all", [p for p in json_paths(run, 3) if p])
    op = st.sampled_from(["set", "set", "drop", "extra"])
    return data.draw(st.lists(st.tuples(st.sampled_from(paths), op, values), min_size=1, max_size=3))


_PATHS: dict[str, list] = {}


@FUZZ
@given(data=st.data())
def test_verify_reads_any_run_json_to_a_plan_or_one_line(real_run, data):
    _run(real_run, _draw_mutations(data, real_run[0]), "verify")


@FUZZ
@given(data=st.data())
def test_from_run_reads_any_run_json_to_an_attributor_or_one_line(real_run, data):
    _run(real_run, _draw_mutations(data, real_run[0]), "from_run")


@FUZZ
@given(data=st.data())
def test_report_reads_any_mutated_real_run_json_or_one_line(real_run, data):
    _run(real_run, _draw_mutations(data, real_run[0]), "report")


def test_zz_fuzz_budget_was_spent():
    """The three fuzz tests above ran their examples (printed with -s: count and time per reader)."""
    for reader, ts in COUNTS.items():
        print(
            f"{reader}: {len(ts)} examples ({RESULTS.get(reader, 0)} read to a result, the rest one-line errors), "
            f"{sum(ts):.1f} s, {max(ts):.2f} s the slowest"
        )
    if COUNTS:
        assert all(len(ts) >= min(N, 20) for ts in COUNTS.values())
