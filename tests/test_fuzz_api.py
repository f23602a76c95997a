"""Property-based fuzzing of the Python API's argument checks (issue 21).

Random values go into ``Scores.most_harmful`` / ``most_helpful`` (k, query id), the ``Attributor``
constructor (checkpoints, seed, batch and shard sizes, specs, paths), the engine and query arguments of
``Attributor.scores``, and ``Query.from_text`` followed by the query tokenisation that ``scores`` runs
(with a random ``max_length``, on the tiny tokenizer of ``tests/conftest.py``). The only acceptable
outcomes are a result or a :class:`GradianUserError` (raised when the object is built or called); any
other exception is a bug. No model is loaded. Derandomized, with a fixed example budget and no deadline,
as ``tests/test_fuzz_readers.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import event, example, given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gradian.errors import GradianUserError  # noqa: E402
from gradian_testlib import fuzz_settings  # noqa: E402

#: examples per property (the budget keeps the module at a few seconds)
N, FUZZ = fuzz_settings(120, "function_scoped_fixture")

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.binary(max_size=4),
)
ANY = st.recursive(SCALARS, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3))


def mostly(good: st.SearchStrategy, bad: st.SearchStrategy = ANY) -> st.SearchStrategy:
    """A good value three times in four, else anything: so that several arguments at once are often all good."""
    return st.integers(0, 3).flatmap(lambda i: bad if i == 3 else good)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    """An adapter folder with two checkpoints and a one-row data file: enough to build an Attributor."""
    root = tmp_path_factory.mktemp("fuzz-api")
    (root / "adapter").mkdir()
    for step in (1, 2):
        (root / f"checkpoint-{step}").mkdir()
    (root / "train.jsonl").write_text('{"prompt": "Q: a?\\nA:", "completion": " b"}\n')
    (root / "train.yaml").write_text("lr: 1\n")
    return {"root": root, "adapter": root / "adapter", "data": root / "train.jsonl"}


def _ok_or_user_error(f, what: str = "call"):
    """``f()``, or None after a one-line GradianUserError (outcomes counted: ``--hypothesis-show-statistics``)."""
    try:
        got = f()
    except GradianUserError as e:
        assert "\n" not in e.one_line()
        event(f"{what}: GradianUserError")
        return None
    event(f"{what}: result")
    return got


# ---------------------------------------------------------------------- Scores


@FUZZ
@given(
    k=mostly(st.integers(min_value=-2, max_value=12), SCALARS),
    query_id=mostly(st.sampled_from([None, "q0", "q1"]), SCALARS),
    m=st.integers(min_value=1, max_value=3),
    n=st.integers(min_value=1, max_value=8),
)
@example(k=-1, query_id=None, m=1, n=5)  # listed every row
@example(k=True, query_id=None, m=1, n=5)
def test_top_k_lists(k, query_id, m, n):
    from gradian.attributor import Scores

    rng = np.random.default_rng(m * 31 + n)
    mat = rng.normal(size=(m, n))
    s = Scores(mat, mat, [f"q{i}" for i in range(m)], [f"r{j}" for j in range(n)], {"name": "x"}, [])
    for method, sign in (("most_harmful", -1), ("most_helpful", 1)):
        got = _ok_or_user_error(lambda method=method: getattr(s, method)(query_id, k=k), method)
        if got is not None:
            assert isinstance(k, int) and not isinstance(k, bool) and k >= 1
            assert len(got) <= min(k, n) and all(sign * v > 0 for _, v in got)


# ---------------------------------------------------------------------- Attributor


CHECKPOINTS = st.one_of(
    st.sampled_from(["auto", "final", None, "banana", "", [], ["auto"], ["final"], ["auto", "final"]]),
    st.lists(st.sampled_from(["checkpoint-1", "checkpoint-2", "missing", "auto", ""]), max_size=3),
    st.tuples(st.sampled_from(["checkpoint-1", "checkpoint-2"])),
    ANY,
)


@FUZZ
@given(
    checkpoints=mostly(CHECKPOINTS.filter(lambda v: not isinstance(v, (bytes, float, int)) or v is None), CHECKPOINTS),
    as_path=st.booleans(),
    seed=mostly(st.integers(0, 2**32 - 1), SCALARS),
    batch_size=mostly(st.integers(1, 64), SCALARS),
    shard_size=mostly(st.integers(1, 1024), SCALARS),
    other=st.sampled_from(["spec", "grad", "eval_spec", "reference_adapter", "configs", "logs", "index_dir", "base"]),
    value=mostly(st.none(), st.one_of(st.sampled_from(["adapter", "train.yaml", "missing"]), ANY)),
)
@example(checkpoints="banana", as_path=False, seed=0, batch_size=8, shard_size=256, other="spec", value=None)
def test_attributor_constructor(world, checkpoints, as_path, seed, batch_size, shard_size, other, value):
    from gradian.attributor import Attributor

    root = world["root"]

    def under(v):
        return (root / v if as_path else str(root / v)) if isinstance(v, str) and v.startswith("checkpoint") else v

    ck = [under(v) for v in checkpoints] if isinstance(checkpoints, list) else checkpoints
    ck = tuple(under(v) for v in ck) if isinstance(ck, tuple) else ck
    if other != "base" and isinstance(value, str) and value in ("adapter", "train.yaml", "missing"):
        value = root / value if other != "configs" else [root / value]
    kw = {} if other == "base" else {other: value}
    base = value if other == "base" else "base"
    att = _ok_or_user_error(
        lambda: Attributor(
            base,
            world["adapter"],
            world["data"],
            checkpoints=ck,
            seed=seed,
            batch_size=batch_size,
            shard_size=shard_size,
            **kw,
        ),
        "Attributor()",
    )
    if att is not None:  # what was accepted is what the trajectory resolver reads
        assert att.checkpoints in ("auto", "final") or (
            isinstance(att.checkpoints, list) and all(isinstance(c, Path) and c.is_dir() for c in att.checkpoints)
        )
        assert att._ft is None


def _query(correct, qid):
    from gradian.attributor import Query

    return Query.from_text("Q: a?\nA:", correct, id=qid)


@FUZZ
@given(
    engine=mostly(st.sampled_from([None, "datainf", "graddot", "ekfac", "nope", ""])),
    queries=mostly(
        st.lists(
            st.builds(lambda c, i: _query(c, i), st.sampled_from([" a", " b"]), st.sampled_from(["x", "y", None])),
            max_size=3,
        )
    ),
)
def test_scores_arguments(world, engine, queries):
    """``scores(queries, engine)`` checks both before it loads the model (called here up to that point)."""
    from gradian.attributor import Attributor

    att = Attributor("base", world["adapter"], world["data"])
    _ok_or_user_error(lambda: att._engine(engine), "engine")
    _ok_or_user_error(lambda: att._queries(queries), "queries")
    assert att._ft is None


# ---------------------------------------------------------------------- Query.from_text → the query's tokens

TEXT = st.lists(st.sampled_from(list("ab Q?:.\n\t é") + ["word ", "capital "]), max_size=200).map("".join)
PROMPT = st.one_of(
    TEXT,
    st.builds(lambda t, n: "Q: " + " ".join(["word"] * n) + t, TEXT, st.integers(0, 3000)),
    st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "x"]), "content": TEXT}), max_size=3),
    ANY,
)


@FUZZ
@given(
    prompt=PROMPT,
    correct=mostly(TEXT.map(lambda t: " ans" + t)),
    said=mostly(st.one_of(st.none(), TEXT.map(lambda t: " other" + t))),
    qid=mostly(st.one_of(st.none(), TEXT.map(lambda t: "q" + t))),
    capability=mostly(st.just("query")),
    max_length=mostly(st.integers(min_value=1, max_value=600), SCALARS),
)
@example(prompt="Q: " + " ".join(["word"] * 50_000) + "\nA:", correct=" a", said=None, qid=None, capability="q",
         max_length=1024)  # fmt: skip
def test_query_from_text_and_its_tokens(tok, prompt, correct, said, qid, capability, max_length):
    from gradian.attribute.queries import Query, query_rows
    from gradian.data.tokenize import IGNORE_INDEX, TokenizeSpec

    q = _ok_or_user_error(lambda: Query.from_text(prompt, correct, said, id=qid, capability=capability), "from_text")
    spec = _ok_or_user_error(lambda: TokenizeSpec(max_length=max_length), "TokenizeSpec")
    if q is None or spec is None:
        return
    rows = _ok_or_user_error(lambda: query_rows(tok, [q], spec), "query_rows")
    if rows is not None:  # every sequence a gradient is taken of has an answer token to learn
        assert len(rows) == (2 if q.said is not None else 1)
        assert all(any(x != IGNORE_INDEX for x in it.labels) for _, _, it in rows)
