"""Work division, shard records, 2-byte storage and the size estimate (issue 14)."""

from __future__ import annotations

import json

import numpy as np
import torch

from gradian.data.formats import load_examples
from gradian.data.tokenize import TokenizeSpec
from gradian.distributed import contiguous_blocks, partition
from gradian.finetune import index_identity, tokenize_training_set, training_index
from gradian.index.build import build_index
from gradian.index.store import GradientIndex, GradSpec
from gradian_testlib import cli_args, forward_calls, ft_inputs, index_matrix

SPEC = GradSpec(tokenize=TokenizeSpec(max_length=64))


def test_partition_is_deterministic_length_balanced_and_complete():
    rng = np.random.default_rng(0)
    costs = rng.integers(100, 5000, size=37).tolist()
    for w in (1, 2, 3, 8):
        parts = partition(costs, w)
        assert parts == partition(costs, w)  # every rank computes the same answer
        assert sorted(k for p in parts for k in p) == list(range(37))
        loads = [sum(costs[k] for k in p) for p in parts]
        assert max(loads) - min(loads) <= max(costs)  # LPT: within one item of balanced
    assert partition([5, 5], 4) == [[0], [1], [], []]  # more ranks than shards: some idle


def test_contiguous_blocks_cover_every_shard_once_in_order():
    sizes = [256] * 10 + [37]
    for w in (1, 2, 3, 4, 16):
        blocks = contiguous_blocks(sizes, w)
        assert len(blocks) == w
        assert [k for b in blocks for k in b] == list(range(len(sizes)))
        rows = [sum(sizes[k] for k in b) for b in blocks]
        if w <= len(sizes):
            assert max(rows) - min(rows) <= 2 * 256


def test_a_build_without_its_manifest_resumes_from_the_shard_records(ft, saved_finetune, tmp_path):
    """The manifest is written once, at the end; a build that died before it (a killed rank) left
    each finished shard with its own record, and the next build computes only the rest."""
    data = saved_finetune["data"]
    items = tokenize_training_set(load_examples(data), ft.tokenizer, SPEC, data)
    ident = index_identity(ft, data, SPEC)
    kw = dict(pad_token_id=ft.tokenizer.pad_token_id, batch_size=2, shard_size=4)
    build_index(ft.model, items, ident, SPEC, root=tmp_path / "r", stop_after_shards=2, **kw)
    (tmp_path / "r" / "manifest.json").unlink()  # as if it died before rank 0 published it
    records = sorted(p.name for p in (tmp_path / "r").glob("shard-*.json"))
    assert records == ["shard-00000.json", "shard-00001.json"]
    with forward_calls(ft.model) as calls:
        done = build_index(ft.model, items, ident, SPEC, root=tmp_path / "r", **kw)
    assert done.complete and len(calls) == 2  # only the last shard (4 rows, 2 per batch)
    full = build_index(ft.model, items, ident, SPEC, root=tmp_path / "f", **kw)
    assert torch.equal(index_matrix(done), index_matrix(full))
    assert [s["sha256"] for s in done.manifest["shards"]] == [s["sha256"] for s in full.manifest["shards"]]


def test_a_record_for_another_layout_is_not_trusted(ft, saved_finetune, tmp_path):
    data = saved_finetune["data"]
    items = tokenize_training_set(load_examples(data), ft.tokenizer, SPEC, data)
    ident = index_identity(ft, data, SPEC)
    kw = dict(root=tmp_path / "r", pad_token_id=ft.tokenizer.pad_token_id, batch_size=2)
    build_index(ft.model, items, ident, SPEC, shard_size=4, **kw)
    rec = json.loads((tmp_path / "r" / "shard-00000.json").read_text())
    assert rec["layout"]["shard_size"] == 4 and rec["entry"]["start"] == 0
    # another shard size: every shard is computed again, none taken from the old records
    with forward_calls(ft.model) as calls:
        other = build_index(ft.model, items, ident, SPEC, shard_size=6, **kw)
    assert other.complete and len(calls) == 6 and [s["n"] for s in other.manifest["shards"]] == [6, 6]


def test_bfloat16_storage_halves_the_index_and_ranks_like_float32(ft, saved_finetune, tmp_path):
    from scipy.stats import spearmanr

    data = saved_finetune["data"]
    f32, *_ = training_index(ft, data, SPEC, root=tmp_path / "f32")
    bf16, *_ = training_index(
        ft, data, GradSpec(tokenize=TokenizeSpec(max_length=64), storage_dtype="bfloat16"), root=tmp_path / "bf16"
    )
    assert f32.id != bf16.id  # the storage dtype is identity
    size = {
        k: sum((i.root / s["file"]).stat().st_size for s in i.manifest["shards"])
        for k, i in (("f32", f32), ("bf16", bf16))
    }
    assert size["bf16"] < 0.55 * size["f32"]
    a, b = index_matrix(f32), index_matrix(bf16)
    assert ((a - b).abs() <= 2**-8 * a.abs()).all()  # round to nearest with 8 significant bits
    q = a[0] - a[1]  # any query direction
    err = (a @ q - b @ q).abs()
    assert (err <= 2**-8 * a.norm(dim=1) * q.norm()).all()  # |Δg·q| ≤ ‖Δg‖‖q‖
    # 12 rows only; the ranking cost over a real index is measured in docs/benchmarks.md
    assert spearmanr((a @ q).numpy(), (b @ q).numpy()).statistic > 0.95


def test_the_size_estimate_reads_like_the_issue_asks():
    from gradian.index.size import size_estimate
    from gradian.util import human_bytes

    assert size_estimate(403, 215_040, "bfloat16") == (
        403 * 215_040 * 2,
        "403 rows × 215,040 numbers × 2 bytes = 173 MB",
    )
    assert size_estimate(100_000, 460_800, "float32")[1].endswith("= 184 GB")
    assert human_bytes(999) == "999 B" and human_bytes(1500) == "1.5 kB"


def test_a_large_index_is_warned_about_with_a_project_dim_that_fits(ft, tmp_path, monkeypatch):
    import shutil
    from types import SimpleNamespace

    from gradian.gradients.projection import KroneckerProjector, ProjectionSpec, projected_numbers
    from gradian.index.size import size_advice
    from gradian.index.store import select_blocks

    small = select_blocks(ft.model, SPEC)
    assert size_advice(12, small, SPEC, tmp_path) is None
    for dim in (0, 3, 16, 100, 4096):  # the estimate's arithmetic is the projector's
        pj = KroneckerProjector([b.shape for b in small], [b.kind for b in small], ProjectionSpec(dim=dim))
        assert [projected_numbers(b.shape, b.kind, dim) for b in small] == [
            pj.out_dim(i, b.shape) for i, b in enumerate(small)
        ]
    # a 7B-like adapter: r=8 on q_proj and v_proj of 32 layers of width 4096 (16.8 MB a row in float32)
    blocks = [SimpleNamespace(shape=(8, 4096), kind="A"), SimpleNamespace(shape=(4096, 8), kind="B")] * 64
    monkeypatch.setattr(shutil, "disk_usage", lambda p: SimpleNamespace(total=10**13, used=0, free=10**13))
    advice = size_advice(100_000, blocks, SPEC, tmp_path)
    assert advice == (
        "the gradient index will take est. 1.7 TB for 100,000 rows; --project-dim 256 would make it "
        "13.1 GB; --storage-dtype bfloat16 halves it"
    )
    monkeypatch.setattr(shutil, "disk_usage", lambda p: SimpleNamespace(total=10**12, used=0, free=4 * 10**11))
    assert "but 400 GB is free at " in size_advice(100_000, blocks, SPEC, tmp_path)
    assert "even --project-dim 128 needs" in size_advice(10**9, blocks, SPEC, tmp_path)


def test_index_prints_the_size_before_it_builds(saved_finetune, tmp_path):
    from typer.testing import CliRunner

    from gradian.cli import app

    args = cli_args(
        "index",
        **ft_inputs(saved_finetune),
        max_length=64,
        out=tmp_path,
        shard_size=4,
        batch_size=2,
        storage_dtype="bfloat16",
    )
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.output.splitlines() if "rows ×" in ln)
    assert "12 rows × " in line and " numbers × 2 bytes = " in line
    again = CliRunner().invoke(app, args)
    assert "reused" in again.output and "rows ×" not in again.output  # nothing to build, nothing announced
    idx = GradientIndex(next(p for p in tmp_path.iterdir() if p.is_dir()))
    assert idx.grad_spec["storage_dtype"] == "bfloat16" and idx.manifest["shard_size"] == 4


def test_a_build_from_lazily_tokenised_rows_writes_the_same_shards(ft, saved_finetune, tmp_path):
    """``gradian index`` keeps a few numbers a row (TokenizedRows) and tokenises each row again when its
    shard is built: the shards and records are byte-identical to a build from the tokenised list, and
    the build reads every row exactly once (planning uses the stored lengths)."""
    from gradian.data.tokenize import TokenizedRows

    data = saved_finetune["data"]
    examples = load_examples(data)
    eager = tokenize_training_set(examples, ft.tokenizer, SPEC, data)
    lazy = tokenize_training_set(examples, ft.tokenizer, SPEC, data, lazy=True)
    assert isinstance(lazy, TokenizedRows) and len(lazy) == len(eager)
    reads = []
    tokenize = lazy._tokenize
    lazy._tokenize = lambda ex: reads.append(ex.id) or tokenize(ex)
    ident = index_identity(ft, data, SPEC)
    kw = dict(pad_token_id=ft.tokenizer.pad_token_id, batch_size=2, shard_size=4)
    a = build_index(ft.model, eager, ident, SPEC, root=tmp_path / "eager", **kw)
    b = build_index(ft.model, lazy, ident, SPEC, root=tmp_path / "lazy", **kw)
    assert sorted(reads) == sorted(lazy.ids) and len(reads) == len(lazy)  # each row once, none twice
    assert a.id == b.id and a.manifest["shards"] == b.manifest["shards"]
    for s in a.manifest["shards"]:
        assert (a.root / s["file"]).read_bytes() == (b.root / s["file"]).read_bytes()
