"""The one-pass row + sentence build (gradian.index.joint): resumable, byte-stable, split between ranks.

The torchrun side (2 gloo processes write the shards one process writes, byte for byte) is in
tests/distributed/test_torchrun.py; here the pieces it rests on are checked in one process.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest

from gradian.gradients.projection import ProjectionSpec
from gradian.index.store import GradSpec
from gradian_testlib import make_lora_model


@pytest.fixture(scope="module")
def setup(tok):
    from gradian_testlib import sentence_rows

    model = make_lora_model(tok, "llama")  # float32: where rounding would show if a row's numbers varied
    items, units = sentence_rows(tok)
    spec = GradSpec(projection=ProjectionSpec(dim=8, seed=1))
    ids = {u: {"test": "joint-resume", "unit": u} for u in ("row", "sentence")}
    return model, items, units, spec, ids, dict(pad_token_id=tok.pad_token_id, batch_size=2, shard_size=4)


def _shards(root):
    return {p.name: p.read_bytes() for p in sorted(root.glob("shard-*"))}


def _written_by(spec) -> str:
    from gradian.index.joint import JOINT_PASS, SPLIT_PASS

    return JOINT_PASS if spec.unit_grads == "exact" else SPLIT_PASS


@pytest.mark.parametrize("unit_grads", ["positions", "exact"])
def test_a_resumed_joint_build_writes_the_bytes_of_a_fresh_one(setup, tmp_path, unit_grads):
    """Shards deleted from a finished joint build are recomputed alone (only the rows they need), byte-identical;
    the kept ones are not rewritten; publishing keeps each entry's ``pass``; a complete pair computes nothing."""
    from gradian.data.spans import SentenceItems
    from gradian.index.build import build_index
    from gradian.index.joint import build_jointly

    model, items, units, spec, ids, kw = setup
    spec = replace(spec, unit_grads=unit_grads)
    a = {"row": tmp_path / "ar", "sentence": tmp_path / "as"}
    full = build_jointly(model, items, units, ids["row"], ids["sentence"], spec, row_root=a["row"],
                         sentence_root=a["sentence"], **kw)  # fmt: skip
    assert full["rows"] == len(items) and full["units"] == len(units) and len(units) > len(items)
    want = {u: _shards(r) for u, r in a.items()}
    assert len(want["row"]) >= 4 and len(want["sentence"]) >= 8  # shard-*.safetensors + shard-*.json each

    b = {u: tmp_path / f"b{u}" for u in a}
    for u in a:
        shutil.copytree(a[u], b[u])
    gone = [("row", 0), ("sentence", 3)]
    for u, k in gone:
        for p in b[u].glob(f"shard-{k:05d}.*"):
            p.unlink()
    kept = {(u, p.name): p.stat().st_mtime_ns for u in b for p in b[u].glob("shard-*")}
    again = build_jointly(model, items, units, ids["row"], ids["sentence"], spec, row_root=b["row"],
                          sentence_root=b["sentence"], **kw)  # fmt: skip
    assert 0 < again["rows"] < len(items)  # only the rows those two shards need
    for u in a:
        assert _shards(b[u]) == want[u], u  # byte for byte, records included
    for (u, name), mtime in kept.items():
        assert (b[u] / name).stat().st_mtime_ns == mtime, (u, name)

    got = {
        "row": build_index(model, items, ids["row"], spec, root=b["row"], **kw),
        "sentence": build_index(
            model,
            SentenceItems(units, items),
            ids["sentence"],
            replace(spec, unit="sentence"),
            root=b["sentence"],
            **kw,
        ),
    }
    for u, idx in got.items():
        assert idx.complete and not idx.manifest.get("repairs")
        assert {s["pass"] for s in idx.manifest["shards"]} == {_written_by(spec)}, u
    assert {u: _shards(r) for u, r in b.items()} == want  # publishing adds the manifest, rewrites no shard
    nothing = build_jointly(model, items, units, ids["row"], ids["sentence"], spec, row_root=b["row"],
                            sentence_root=b["sentence"], **kw)  # fmt: skip
    assert nothing["rows"] == 0 and nothing["passes"] == 0


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_assigned_jobs_cover_every_shard_once_in_row_order(setup, world_size):
    """Every pending shard goes to exactly one rank; the ranks' blocks follow the rows; only boundary rows repeat."""
    from gradian.data.tokenize import row_values
    from gradian.index.joint import assign_jobs, shard_rows

    _, items, units, _, _, _ = setup
    ranges = shard_rows(len(items), [u.row for u in units], 4)
    assert ranges["row"][-1][1] == len(items) and ranges["sentence"][-1][1] == len(items)
    jobs = [(kind, k, *ranges[kind][k]) for kind in ("row", "sentence") for k in range(len(ranges[kind]))]
    parts = assign_jobs(jobs, row_values(items, "length"), world_size)
    assert len(parts) == world_size
    assert sorted(j for p in parts for j in p) == list(range(len(jobs)))
    starts = [[jobs[j][2] for j in p] for p in parts]
    assert all(s == sorted(s) for s in starts)
    flat = [x for s in starts for x in s]
    assert flat == sorted(flat)  # rank r's shards come before rank r+1's
    rows = [set(r for j in p for r in range(jobs[j][2], jobs[j][3])) for p in parts]
    for r in range(world_size - 1):  # rows two ranks both compute: only at the boundary between them
        both = rows[r] & rows[r + 1]
        assert both == set() or max(both) - min(both) < 4, both


def test_a_joint_build_that_cannot_fit_writes_nothing(setup, tmp_path, monkeypatch):
    """The remaining shards of both indexes are sized before any pass: too little room is one error, no shard."""
    import gradian.util
    from gradian.index.joint import build_jointly
    from gradian.util import DiskFullError

    model, items, units, spec, ids, kw = setup
    monkeypatch.setattr(gradian.util, "free_bytes", lambda folder: 1000)
    r, s = tmp_path / "r", tmp_path / "s"
    with pytest.raises(DiskFullError, match="remaining shard.*row and sentence indexes.*no shard was written"):
        build_jointly(model, items, units, ids["row"], ids["sentence"], spec, row_root=r, sentence_root=s, **kw)
    assert not list(r.glob("shard-*")) and not list(s.glob("shard-*"))


def test_a_joint_build_with_non_finite_gradients_writes_no_shard(setup, tmp_path):
    """A NaN in the adapter makes every gradient NaN: the first full shard is refused with build_index's message."""
    import torch

    from gradian.errors import GradianUserError
    from gradian.index.joint import build_jointly

    model, items, units, spec, ids, kw = setup
    p = next(p for n, p in model.named_parameters() if ".lora_A." in n)
    keep = p.detach().clone()
    r, s = tmp_path / "r", tmp_path / "s"
    try:
        with torch.no_grad():
            p[0, 0] = float("nan")
        with pytest.raises(
            GradianUserError,
            match=r"gradients of \d+ (row|sentence unit)\(s\) are not finite \(NaN/inf.*e\.g\. in .*lora.*; "
            r"(rows|sentence units) .*the shard is not written",
        ):
            build_jointly(model, items, units, ids["row"], ids["sentence"], spec, row_root=r, sentence_root=s, **kw)
    finally:
        with torch.no_grad():
            p.copy_(keep)
    assert not list(r.glob("shard-*")) and not list(s.glob("shard-*"))


@pytest.mark.parametrize("per_forward", [1, 3])
def test_row_groups_batch_a_row_with_the_same_rows_whatever_is_missing(per_forward):
    """Every needed row is in exactly one group; a row's group does not depend on which rows are needed."""
    import random

    from gradian.index.joint import row_groups

    rng = random.Random(0)
    lengths = [rng.randrange(5, 60) for _ in range(23)]
    every = row_groups(list(range(23)), lengths, 8, per_forward)
    assert sorted(j for g in every for j in g) == list(range(23))
    assert all(len(g) <= per_forward and len({j // 8 for j in g}) == 1 for g in every)  # never across a shard block
    of = {j: tuple(g) for g in every for j in g}
    for need in ([3, 4, 5], [0, 22], [9, 10, 11, 12, 13, 14, 15, 16]):
        part = row_groups(need, lengths, 8, per_forward)
        assert {j for g in part for j in g} >= set(need)
        assert all(tuple(g) == of[g[0]] for g in part)  # the same groups as the whole build's
    if per_forward == 1:
        assert row_groups([5, 2, 7], lengths, 8, 1) == [[5], [2], [7]]  # alone, in the order asked


@pytest.mark.parametrize("unit_grads", ["positions", "exact"])
def test_a_batched_joint_build_equals_the_one_row_build_and_resumes_to_its_own_bytes(setup, tmp_path, unit_grads):
    """3 rows a forward (``--rows-per-forward 3``) gives the one-row numbers to float32 rounding; deleting shards
    and resuming rewrites them byte for byte; the shard entries say how many rows shared a forward."""
    from safetensors.torch import load_file

    from gradian.index.joint import build_jointly

    model, items, units, spec, ids, kw = setup
    spec = replace(spec, unit_grads=unit_grads)
    one = {"row": tmp_path / "1r", "sentence": tmp_path / "1s"}
    three = {"row": tmp_path / "3r", "sentence": tmp_path / "3s"}
    for roots, b in ((one, 1), (three, 3)):
        build_jointly(model, items, units, ids["row"], ids["sentence"], spec, row_root=roots["row"],
                      sentence_root=roots["sentence"], per_forward=b, **kw)  # fmt: skip
    for u in one:
        files = sorted(p.name for p in one[u].glob("shard-*.safetensors"))
        assert files and files == sorted(p.name for p in three[u].glob("shard-*.safetensors"))
        for name in files:
            a, b = load_file(str(one[u] / name)), load_file(str(three[u] / name))
            for key in a:
                scale = a[key].abs().max().clamp(min=1e-30)
                assert float((a[key] - b[key]).abs().max() / scale) < 1e-5, (u, name, key)
        entries = [json.loads(p.read_text()) for p in sorted(three[u].glob("shard-*.json"))]
        assert {e["entry"]["pass"] for e in entries} == {f"{_written_by(spec)}, 3 rows a forward"}
    want = {u: _shards(r) for u, r in three.items()}
    for u, k in [("row", 1), ("sentence", 2)]:
        for p in three[u].glob(f"shard-{k:05d}.*"):
            p.unlink()
    again = build_jointly(model, items, units, ids["row"], ids["sentence"], spec, row_root=three["row"],
                          sentence_root=three["sentence"], per_forward=3, **kw)  # fmt: skip
    assert 0 < again["rows"] < len(items)
    assert {u: _shards(r) for u, r in three.items()} == want


def test_a_joint_build_split_by_position_keeps_the_row_index_and_writes_its_own_units(setup, tmp_path):
    """``--unit-grads positions``: one backward a row; its row shards equal the exact build's (float32 rounding),
    its unit shards hold the row's gradient split by position (not the exact units), and its entries say so."""
    from safetensors.torch import load_file

    from gradian.index.joint import JOINT_PASS, SPLIT_PASS, build_jointly

    model, items, units, spec, ids, kw = setup
    spec = replace(spec, unit_grads="exact")
    split = replace(spec, unit_grads="positions")
    exact = {"row": tmp_path / "er", "sentence": tmp_path / "es"}
    pos = {"row": tmp_path / "pr", "sentence": tmp_path / "ps"}
    got = {}
    for roots, sp in ((exact, spec), (pos, split)):
        got[sp.unit_grads] = build_jointly(model, items, units, ids["row"], ids["sentence"], sp,
                                           row_root=roots["row"], sentence_root=roots["sentence"], **kw)  # fmt: skip
    assert got["positions"]["passes"] == len(items) < got["exact"]["passes"]
    gap = {}
    for u in exact:
        gap[u] = 0.0
        for p in sorted(exact[u].glob("shard-*.safetensors")):
            a, b = load_file(str(p)), load_file(str(pos[u] / p.name))
            for key in a:
                gap[u] = max(gap[u], float((a[key] - b[key]).abs().max() / a[key].abs().max().clamp(min=1e-30)))
        entries = [json.loads(p.read_text()) for p in sorted(pos[u].glob("shard-*.json"))]
        assert {e["entry"]["pass"] for e in entries} == {SPLIT_PASS} != {JOINT_PASS}
    assert gap["row"] < 1e-5 and gap["sentence"] > 1e-2, gap


@pytest.mark.parametrize("unit_grads", ["positions", "exact"])
def test_the_final_build_pools_repsim_states_equal_to_repsims_own_forward(setup, tmp_path, unit_grads, monkeypatch):
    """The joint build hands RepSim each row's state from the row's own forward: the bits RepSim's one-row forward
    gives, so RepSim forwards only the rows the build did not compute, and its states do not depend on which
    cache was warm. Resumed (half the shards kept), the build pools only the rows it computes."""
    import torch

    from gradian.engines import repsim
    from gradian.index.joint import build_jointly

    monkeypatch.setenv("GRADIAN_CACHE", str(tmp_path / "cache"))
    model, items, units, spec, ids, kw = setup
    spec = replace(spec, unit_grads=unit_grads)
    roots = {"row": tmp_path / "r", "sentence": tmp_path / "s"}
    states: dict = {}
    build_jointly(model, items, units, ids["row"], ids["sentence"], spec, row_root=roots["row"],
                  sentence_root=roots["sentence"], states=states, **kw)  # fmt: skip
    assert sorted(states) == list(range(len(items)))
    own = repsim.pooled_states(model, items, kw["pad_token_id"], 1)  # RepSim's own one-row forwards
    assert torch.equal(torch.stack([states[j] for j in range(len(items))]), own) and float(own.abs().max()) > 0

    forwarded = []
    real = repsim.pooled_states
    monkeypatch.setattr(repsim, "pooled_states", lambda m, its, *a: forwarded.append(len(its)) or real(m, its, *a))
    part = {j: states[j] for j in range(0, len(items), 2)}
    h = repsim.cached_train_states(model, items, kw["pad_token_id"], {"t": unit_grads}, known=part)
    assert forwarded == [len(items) - len(part)]  # only the rows the build did not pool
    assert torch.equal(h, own)
    forwarded.clear()
    assert torch.equal(repsim.cached_train_states(model, items, kw["pad_token_id"], {"t": unit_grads}), own)
    assert forwarded == []  # cached under the same key

    for p in sorted(roots["row"].glob("shard-00000*")) + sorted(roots["sentence"].glob("shard-*")):
        p.unlink()  # the first row shard and every sentence shard: their rows are computed again
    again: dict = {}
    build_jointly(model, items, units, ids["row"], ids["sentence"], spec, row_root=roots["row"],
                  sentence_root=roots["sentence"], states=again, **kw)  # fmt: skip
    assert again and all(torch.equal(v, own[j]) for j, v in again.items())


def test_no_states_are_pooled_where_they_would_not_be_repsims_bits(setup, tmp_path):
    """Several rows a forward pad them: their states are not the one-row bits, so none are handed over."""
    from gradian.index.joint import build_jointly

    model, items, units, spec, ids, kw = setup
    states: dict = {}
    build_jointly(model, items, units, ids["row"], ids["sentence"], spec, row_root=tmp_path / "r",
                  sentence_root=tmp_path / "s", states=states, per_forward=2, **kw)  # fmt: skip
    assert states == {}
