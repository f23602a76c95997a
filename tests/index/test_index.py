"""The gradient index: exact stored gradients, content ids, reuse, resume, corruption."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gradian.data.tokenize import TokenizeSpec, collate
from gradian.finetune import training_index
from gradian.gradients import per_example_grads
from gradian.gradients.projection import ProjectionSpec
from gradian.index.shards import CorruptShardError
from gradian.index.store import GradientIndex, GradSpec
from gradian_testlib import forward_calls, index_matrix

SPEC = GradSpec(tokenize=TokenizeSpec(max_length=64))


def test_stored_gradients_are_the_per_example_gradients(ft, saved_finetune, tmp_path):
    idx, exs, items, reused = training_index(
        ft, saved_finetune["data"], SPEC, root=tmp_path / "i", batch_size=4, shard_size=5
    )
    assert not reused and idx.complete and idx.n == len(exs) == 12
    assert idx.ids == [e.id for e in exs]
    assert [s["n"] for s in idx.manifest["shards"]] == [8, 4]  # shard size 5 rounds up to 2 batches of 4
    ref = per_example_grads(ft.model, collate(items, ft.tokenizer.pad_token_id), "loop")
    want = torch.cat([ref[b["name"]].reshape(len(items), -1).double() for b in idx.blocks], dim=1)
    got = index_matrix(idx)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()  # float32 storage


def test_same_inputs_same_id_and_free_requery(ft, saved_finetune, tmp_path):
    a, *_ = training_index(ft, saved_finetune["data"], SPEC, root=tmp_path / "a")
    with forward_calls(ft.model) as calls:
        b, _, _, reused = training_index(ft, saved_finetune["data"], SPEC, root=tmp_path / "a")
    assert reused and a.id == b.id and calls == []
    c, *_ = training_index(
        ft, saved_finetune["data"], GradSpec(tokenize=TokenizeSpec(max_length=32)), root=tmp_path / "c"
    )
    assert c.id != a.id


def test_resume_after_interruption_is_identical(ft, saved_finetune, tmp_path):
    from gradian.data.formats import load_examples
    from gradian.finetune import index_identity, tokenize_training_set
    from gradian.index.build import build_index

    items = tokenize_training_set(load_examples(saved_finetune["data"]), ft.tokenizer, SPEC, saved_finetune["data"])
    ident = index_identity(ft, saved_finetune["data"], SPEC)
    kw = dict(pad_token_id=ft.tokenizer.pad_token_id, batch_size=2, shard_size=4)
    part = build_index(ft.model, items, ident, SPEC, root=tmp_path / "r", stop_after_shards=1, **kw)
    assert not part.complete and len(part.manifest["shards"]) == 1
    with forward_calls(ft.model) as calls:
        done = build_index(ft.model, items, ident, SPEC, root=tmp_path / "r", **kw)
    assert done.complete and len(calls) == 4  # only the 8 missing examples, 2 per batch
    full = build_index(ft.model, items, ident, SPEC, root=tmp_path / "f", **kw)
    assert torch.equal(index_matrix(done), index_matrix(full))


def test_corrupt_shard_is_detected_and_rebuilt(ft, saved_finetune, tmp_path):
    idx, *_ = training_index(ft, saved_finetune["data"], SPEC, root=tmp_path / "x", shard_size=8)
    before = index_matrix(idx)
    shard = idx.root / idx.manifest["shards"][0]["file"]
    raw = bytearray(shard.read_bytes())
    raw[-5] ^= 0xFF
    shard.write_bytes(bytes(raw))
    assert GradientIndex(idx.root).verify() == [0]
    with pytest.raises(CorruptShardError):
        GradientIndex(idx.root).load_shard(0)
    from gradian.index.shards import IndexRepairWarning

    with pytest.warns(IndexRepairWarning, match=r"shard-00000\.safetensors is corrupt \(sha256 mismatch"):
        again, _, _, reused = training_index(ft, saved_finetune["data"], SPEC, root=tmp_path / "x", shard_size=8)
    assert not reused and again.verify() == []
    assert torch.equal(index_matrix(again), before)


def test_inside_hashed_once_a_shard_is_hashed_and_scanned_once_and_a_changed_one_again(
    ft, saved_finetune, tmp_path, monkeypatch
):
    """What `gradian attribute` and `gradian index` run in: a shard a build writes is hashed once, as it is
    finished (streamed to disk row by row, it is read back once from the page cache), one already hashed is not
    hashed again, and a file replaced in between is; outside it every open hashes."""
    import gradian.util as util
    from gradian.index.shards import hashed_once

    seen: list[str] = []
    real = util.sha256_file
    monkeypatch.setattr(util, "sha256_file", lambda p, chunk=1 << 20: seen.append(Path(p).name) or real(p, chunk))
    import gradian.index.shards as shards

    scans: list[str] = []
    real_block = shards._block_problem
    monkeypatch.setattr(shards, "_block_problem", lambda b, t, n: scans.append(b["name"]) or real_block(b, t, n))
    with hashed_once():
        idx, *_ = training_index(ft, saved_finetune["data"], SPEC, root=tmp_path / "h", shard_size=8)
        scans.clear()
        for _ in range(3):
            assert GradientIndex(idx.root).verify() == []
        assert scans == []  # their numbers were checked when this process wrote them
        index_matrix(GradientIndex(idx.root))
        assert len(scans) == len(idx.blocks) * len(idx.manifest["shards"])  # a block read to be used: checked
        written = [f for f in seen if f.startswith("shard-")]
        assert sorted(written) == sorted(s["file"] for s in idx.manifest["shards"])  # once each, when written
        shard = idx.root / idx.manifest["shards"][0]["file"]
        raw = bytearray(shard.read_bytes())
        raw[-5] ^= 0xFF
        tmp = shard.with_suffix(".tmp")
        tmp.write_bytes(bytes(raw))
        tmp.replace(shard)  # a new file (new inode) in its place
        assert GradientIndex(idx.root).verify() == [0]  # hashed again, and found corrupt
    seen.clear()
    assert GradientIndex(idx.root).verify() == [0] and GradientIndex(idx.root).verify() == [0]
    assert seen.count(shard.name) == 2  # outside: every open hashes
    scans.clear()
    assert GradientIndex(idx.root).verify() == [0] and scans  # and every check reads the numbers


def test_projection_preserves_inner_products_in_expectation(ft, saved_finetune, tmp_path):
    exact, *_ = training_index(ft, saved_finetune["data"], SPEC, root=tmp_path / "e")
    proj_spec = GradSpec(tokenize=TokenizeSpec(max_length=64), projection=ProjectionSpec(dim=64, seed=1))
    proj, *_ = training_index(ft, saved_finetune["data"], proj_spec, root=tmp_path / "p")
    ge, gp = index_matrix(exact), index_matrix(proj)
    assert gp.shape[1] < ge.shape[1]
    ke, kp = ge @ ge.T, gp @ gp.T
    # the Gram matrices agree up to JL noise: high correlation of off-diagonal entries
    iu = torch.triu_indices(ke.shape[0], ke.shape[0], 1)
    corr = torch.corrcoef(torch.stack([ke[iu[0], iu[1]], kp[iu[0], iu[1]]]))[0, 1]
    assert corr > 0.8
    meta = json.loads((proj.root / "manifest.json").read_text())
    assert meta["identity"]["grad_spec"]["projection"] == {"dim": 64, "seed": 1, "compute": "float32"}


# ---------------------------------------------------------------------- integrity (issue 12)
def _poison_shard(idx, k: int = 0, value: float = float("nan")) -> None:
    """Rewrite shard k with garbage under a matching sha256, as an older build with a bad batch size left it
    (uninitialised memory: NaNs, or finite values near float32's maximum)."""
    from safetensors.torch import save

    from gradian.util import atomic_write_json, sha256_bytes

    s = idx.manifest["shards"][k]
    tensors = {b["name"]: torch.full((s["n"], b["dim"]), value) for b in idx.blocks}
    data = save(tensors)
    (idx.root / s["file"]).write_bytes(data)
    m = json.loads((idx.root / "manifest.json").read_text())
    m["shards"][k]["sha256"] = sha256_bytes(data)
    atomic_write_json(idx.root / "manifest.json", m)


def test_non_finite_shard_is_refused_reported_and_rebuilt(ft, saved_finetune, tmp_path):
    from gradian.index.shards import IndexRepairWarning

    idx, *_ = training_index(ft, saved_finetune["data"], SPEC, root=tmp_path / "n", shard_size=8)
    clean = index_matrix(idx)
    _poison_shard(idx, 0)
    again = GradientIndex(idx.root)
    assert again.complete and again.verify() == [0] and "non-finite" in again.problems[0]
    with pytest.raises(CorruptShardError, match="shard-00000.safetensors is corrupt"):
        dict(again.load_shard(0))  # a block is read, checked and refused when it is used
    with pytest.warns(IndexRepairWarning, match=r"shard-00000\.safetensors is corrupt \(block .* non-finite"):
        rebuilt, _, _, reused = training_index(ft, saved_finetune["data"], SPEC, root=tmp_path / "n", shard_size=8)
    assert not reused and rebuilt.verify() == [] and torch.equal(index_matrix(rebuilt), clean)
    assert "non-finite" in rebuilt.manifest["repairs"][0]["what"]


def test_truncated_manifest_is_rebuilt(ft, saved_finetune, tmp_path):
    from gradian.index.shards import CorruptIndexError, IndexRepairWarning

    idx, *_ = training_index(ft, saved_finetune["data"], SPEC, root=tmp_path / "t")
    clean = index_matrix(idx)
    m = idx.root / "manifest.json"
    m.write_text(m.read_text()[: len(m.read_text()) // 2])
    with pytest.raises(CorruptIndexError):
        GradientIndex(idx.root)
    with pytest.warns(IndexRepairWarning, match="manifest.json cannot be read"):
        again, _, _, reused = training_index(ft, saved_finetune["data"], SPEC, root=tmp_path / "t")
    assert not reused and torch.equal(index_matrix(again), clean)


def test_a_bad_batch_size_never_writes_an_index(ft, saved_finetune, tmp_path):
    from gradian.errors import GradianUserError

    for bs in (-3, 0):
        with pytest.raises(GradianUserError, match="--batch-size"):
            training_index(ft, saved_finetune["data"], SPEC, root=tmp_path / "b", batch_size=bs)
    assert not (tmp_path / "b" / "manifest.json").exists()


def test_non_finite_gradients_are_not_written(ft, saved_finetune, tmp_path):
    from gradian.errors import GradianUserError

    p = next(p for n, p in ft.model.named_parameters() if ".lora_A." in n)
    keep = p.detach().clone()
    try:
        with torch.no_grad():
            p[0, 0] = float("nan")
        with pytest.raises(GradianUserError, match=r"not finite \(NaN/inf.*the shard is not written"):
            training_index(ft, saved_finetune["data"], SPEC, root=tmp_path / "f")
    finally:
        with torch.no_grad():
            p.copy_(keep)
    assert not list((tmp_path / "f").glob("shard-*.safetensors"))


def test_finite_garbage_is_refused_too(ft, saved_finetune, tmp_path):
    idx, *_ = training_index(ft, saved_finetune["data"], SPEC, root=tmp_path / "g", shard_size=8)
    _poison_shard(idx, 1, value=3.0e38)
    again = GradientIndex(idx.root)
    assert again.verify() == [1] and "beyond 1e+30" in again.problems[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_the_plausibility_check_flags_what_the_elementwise_rule_flags(dtype):
    """The check reads a block once (its min and max) and falls back to the element-wise rule, NaN or ±inf
    anywhere or |x| > GRAD_ABS_MAX, only when an end is not plausible: the same rows and counts either way."""
    from gradian.index.shards import GRAD_ABS_MAX, _implausible_rows

    def rule(t):
        bad = ~torch.isfinite(t) | (t.abs() > GRAD_ABS_MAX)
        return sorted({int(r) for r in bad.nonzero()[:, 0].tolist()}), int(bad.sum())

    big = torch.finfo(dtype).max  # beyond 1e30 where the dtype can hold it (float16 cannot)
    for put in (None, float("nan"), float("inf"), -float("inf"), big, -big, 1e30, -1e30):
        t = torch.randn(5, 7, dtype=torch.float64).to(dtype)
        if put is not None:
            t[3, 2] = put
            t[1, 6] = put
        assert _implausible_rows(t) == rule(t), (dtype, put)
        if put is not None and (put != put or abs(put) > GRAD_ABS_MAX):
            assert _implausible_rows(t) == ([1, 3], 2)
    assert _implausible_rows(torch.zeros(0, 4, dtype=dtype)) == ([], 0)


def test_a_shard_is_read_a_block_at_a_time_and_released_when_the_next_is_read(ft, saved_finetune, tmp_path):
    from safetensors.torch import load_file

    idx, *_ = training_index(ft, saved_finetune["data"], SPEC, root=tmp_path / "b", shard_size=5)
    assert len(idx.manifest["shards"]) >= 2
    shards = idx.iter_shards(torch.float64)
    start, first = next(shards)
    raw = load_file(idx.root / idx.manifest["shards"][0]["file"])
    assert start == 0 and set(first) == set(raw) == {b["name"] for b in idx.blocks}
    for name, t in first.items():
        assert t.dtype == torch.float64 and torch.equal(t, raw[name].double())
    next(shards)  # the first shard is released: nothing of it is held or readable any more
    assert len(first) == 0 and list(first) == []
    with pytest.raises(KeyError):
        first[idx.blocks[0]["name"]]


def test_wide_gradients_get_fewer_rows_per_shard_and_the_same_numbers(ft, saved_finetune, tmp_path, monkeypatch):
    import gradian.index.size as size
    from gradian.index.size import effective_shard_size

    assert effective_shard_size(256, 8, 860_160 * 4) == 72  # SmolLM2 all-linear r=16, --project-dim 2048: 248 MB
    assert effective_shard_size(256, 8, 1_000) == 256 and effective_shard_size(5, 4, 1_000) == 8
    assert effective_shard_size(256, 8, 10**9) == 8  # never below one batch
    whole, *_ = training_index(ft, saved_finetune["data"], SPEC, root=tmp_path / "w", batch_size=2)
    assert len(whole.manifest["shards"]) == 1
    width = next(iter(whole.load_shard(0, torch.float32).values())).element_size()
    row_bytes = sum(int(b["dim"]) for b in whole.blocks) * width
    monkeypatch.setattr(size, "SHARD_BYTES_MAX", 2 * row_bytes + 1)  # two rows a shard
    cut, *_ = training_index(ft, saved_finetune["data"], SPEC, root=tmp_path / "c", batch_size=2)
    assert cut.id == whole.id and cut.n == whole.n
    assert [s["n"] for s in cut.manifest["shards"]] == [2] * (whole.n // 2) + [whole.n % 2] * (whole.n % 2)
    a, b = index_matrix(cut), index_matrix(whole)  # other batches (length-sorted within a shard): float rounding apart
    assert float((a - b).abs().max() / b.abs().max()) <= 1e-5


def test_rows_axolotl_dropped_have_zero_gradients(saved_finetune, tmp_path, monkeypatch):
    """`gradian index --config` an axolotl config whose sequence_len is shorter than some rows: axolotl drops those
    rows (its default excess_length_strategy), so their stored gradient is zero and their record has no supervised
    token; every other row keeps a gradient. `excess_length_strategy: truncate` keeps the start of every row."""
    from typer.testing import CliRunner

    from gradian.cli import app
    from gradian.data.formats import load_examples
    from gradian.data.tokenize import tokenize_example

    monkeypatch.setenv("GRADIAN_CACHE", str(tmp_path / "cache"))
    ft = saved_finetune
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ft["base"])
    lens = [len(tokenize_example(ex, tok, TokenizeSpec()).input_ids) for ex in load_examples(ft["data"])]
    cut = sorted(lens)[len(lens) // 2]
    longer = [n > cut for n in lens]
    assert 0 < sum(longer) < len(lens)
    norms = {}
    for strategy in ("drop", "truncate"):
        cfg = tmp_path / f"{strategy}.yaml"
        cfg.write_text(f"base_model: x\nsequence_len: {cut}\nexcess_length_strategy: {strategy}\nadapter: lora\n")
        out = tmp_path / strategy
        res = CliRunner().invoke(
            app,
            ["index", "--base", str(ft["base"]), "--adapter", str(ft["adapter"]), "--data", str(ft["data"])]
            + ["--config", str(cfg), "--checkpoints", "final", "--unit", "row", "--out", str(out)],
        )
        assert res.exit_code == 0, res.output
        (manifest,) = out.rglob("manifest.json")
        idx = GradientIndex(manifest.parent)
        norms[strategy] = index_matrix(idx).norm(dim=1).tolist()
        sup = [e["n_supervised"] for e in idx.examples()]
        if strategy == "drop":
            assert [n == 0 for n in norms["drop"]] == longer and [s == 0 for s in sup] == longer
            assert "scored with no supervised token" in " ".join(res.output.split())
    assert all(n > 0 for n in norms["truncate"])  # the start of a long row is trained under truncate


def test_a_qlora_run_is_indexed_at_its_4bit_base(saved_finetune, tmp_path, monkeypatch):
    """`gradian index --config` an axolotl QLoRA config (adapter: qlora, load_in_4bit: its nf4 with double
    quantisation): the gradients are taken at the base quantised as trained (the same numbers as a model loaded with
    that scheme by hand), the index's identity says so, and `--base-quant none` builds another index at the base
    as stored."""
    pytest.importorskip("bitsandbytes")
    from typer.testing import CliRunner

    from gradian.cli import app
    from gradian.finetune import load_finetune
    from gradian.models.spec import ModelSpec

    monkeypatch.setenv("GRADIAN_CACHE", str(tmp_path / "cache"))
    ft = saved_finetune
    cfg = tmp_path / "qlora.yaml"
    cfg.write_text("base_model: x\nadapter: qlora\nload_in_4bit: true\nsequence_len: 512\n")
    mats = {}
    for quant in ("auto", "none"):
        out = tmp_path / quant
        res = CliRunner().invoke(
            app,
            ["index", "--base", str(ft["base"]), "--adapter", str(ft["adapter"]), "--data", str(ft["data"])]
            + ["--config", str(cfg), "--checkpoints", "final", "--unit", "row", "--out", str(out)]
            + ["--base-quant", quant],
        )
        assert res.exit_code == 0, res.output
        (manifest,) = out.rglob("manifest.json")
        idx = GradientIndex(manifest.parent)
        mats[quant] = (idx, index_matrix(idx))
        said = " ".join(res.output.split())
        assert ("base: quantised nf4-dq as trained" in said) is (quant == "auto")
    (q_idx, q), (p_idx, p) = mats["auto"], mats["none"]
    assert q_idx.id != p_idx.id and not torch.allclose(q, p)
    # each row's recorded loss is the adapter's on the base loaded with that scheme
    from gradian.data.formats import load_examples
    from gradian.data.tokenize import collate, tokenize_example
    from gradian.gradients.loss import per_example_loss

    model = load_finetune(ModelSpec(str(ft["base"]), quantize="nf4-dq", quantize_from="float32"), ft["adapter"])
    plain = load_finetune(ModelSpec(str(ft["base"])), ft["adapter"])
    examples = {e.id: e for e in load_examples(ft["data"])}
    recs = q_idx.examples()[:4]
    tokenize = TokenizeSpec(
        **{k: v for k, v in q_idx.grad_spec["tokenize"].items() if k in TokenizeSpec.__dataclass_fields__}
    )
    batch = collate(
        [tokenize_example(examples[r["id"]], model.tokenizer, tokenize) for r in recs], model.tokenizer.pad_token_id
    )
    with torch.no_grad():
        ours = per_example_loss(
            model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits, batch["labels"]
        )
        full = per_example_loss(
            plain.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits, batch["labels"]
        )
    recorded = torch.tensor([r["loss"] for r in recs], dtype=ours.dtype)
    torch.testing.assert_close(ours, recorded, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(full, recorded, rtol=1e-5, atol=1e-6)


def test_gradian_evaluate_of_a_qlora_run_loads_its_4bit_base(saved_finetune, tmp_path):
    """`gradian evaluate` reads a QLoRA run's config as attribute's Evaluate lane does: with `--config` (or the
    config beside the adapter) its base is quantised as trained, recorded in the result, and `--base-quant none`
    evaluates the base as stored."""
    pytest.importorskip("bitsandbytes")
    import json

    from typer.testing import CliRunner

    from gradian.cli import app

    ft = saved_finetune
    cfg = tmp_path / "qlora.yaml"
    cfg.write_text("base_model: x\nadapter: qlora\nload_in_4bit: true\nsequence_len: 512\n")
    ev = tmp_path / "eval.jsonl"
    ev.write_text(
        "".join(
            json.dumps({"id": f"e{i}", "capability": "capitals", "prompt": f"Q: capital {i}?\\nA:", "answer": "Paris"})
            + "\n"
            for i in range(4)
        )
    )
    models = {}
    for quant in ("auto", "none"):
        out = tmp_path / f"eval-{quant}.json"
        res = CliRunner().invoke(
            app,
            ["evaluate", "--base", str(ft["base"]), "--adapter", str(ft["adapter"]), "--eval", str(ev)]
            + ["--config", str(cfg), "--max-new-tokens", "4", "--resamples", "1000", "--out", str(out)]
            + ["--base-quant", quant],
        )
        assert res.exit_code == 0, res.output
        assert ("base: quantised nf4-dq as trained" in " ".join(res.output.split())) is (quant == "auto")
        models[quant] = json.loads(out.read_text())["meta"]["model"]
    assert models["auto"]["quantize"] == "nf4-dq" and "quantize" not in models["none"]
