"""A shard streamed to disk row by row (index.shards.ShardStream) is the file safetensors writes for the whole
blocks, byte for byte; a bad row refuses the shard as check_shard_finite does; nothing half-written is left."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save

from gradian.errors import GradianUserError
from gradian.index.shards import ShardStream, check_shard_finite, safetensors_layout
from gradian.util import sha256_bytes

NAMES = ["model.layers.1.mlp.up_proj.lora_B", "model.layers.0.self_attn.q_proj.lora_A", "z.lora_A", "a.lora_B"]
DIMS = [7, 16, 1, 33]
LAYOUT = {"index_id": "test", "shard_size": 8, "blocks": []}


def _rows(n: int) -> list[dict]:
    return [{"id": f"r{j}", "loss": 0.5, "n_supervised": 3, "truncated": False, "full_length": 9} for j in range(n)]


def _blocks(n: int, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, d, generator=g, dtype=torch.float64) * 10).to(dtype) for d in DIMS]


def _temps(folder: Path) -> list[Path]:
    return sorted(folder.glob(".*.tmp"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_streamed_shard_is_safetensors_own_bytes(tmp_path, dtype):
    """Rows put in any order give the bytes ``safetensors.torch.save`` writes for the blocks; the entry and record
    carry their sha256 and the rows' metadata."""
    n = 6
    blocks = _blocks(n, dtype)
    want = save({name: b for name, b in zip(NAMES, blocks)})
    a = tmp_path / "stream"
    stream = ShardStream(a, 3, NAMES, DIMS, n, dtype)
    order = list(range(n))
    random.Random(0).shuffle(order)
    for r in order:
        done = stream.put(r, [blk[r] for blk in blocks])
        assert done == (r == order[-1])
    entry = stream.finish(40, _rows(n), LAYOUT, "row", written_by="joint")
    assert (a / "shard-00003.safetensors").read_bytes() == want
    assert entry["sha256"] == sha256_bytes(want) and (entry["file"], entry["start"], entry["n"]) == (
        "shard-00003.safetensors",
        40,
        n,
    )
    assert entry["pass"] == "joint" and entry["examples"]["id"] == [r["id"] for r in _rows(n)]
    assert json.loads((a / "shard-00003.json").read_text()) == {"layout": LAYOUT, "entry": entry}
    back = load_file(a / "shard-00003.safetensors")
    assert all(torch.equal(back[name], blk) for name, blk in zip(NAMES, blocks))
    assert _temps(a) == []


def test_the_header_is_safetensors_own():
    for n in (1, 5, 72):
        blocks = _blocks(n, torch.float32, seed=n)
        head, begin = safetensors_layout(NAMES, [tuple(b.shape) for b in blocks], torch.float32)
        data = save({name: b for name, b in zip(NAMES, blocks)})
        assert data[: len(head)] == head
        for name, b, at in zip(NAMES, blocks, begin):  # each block's bytes start where the layout says
            raw = b.contiguous().view(torch.uint8).numpy().tobytes()
            assert data[at : at + len(raw)] == raw, name


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 1e31])
def test_a_bad_row_refuses_the_shard_with_the_whole_shards_message(tmp_path, bad):
    n = 5
    blocks = _blocks(n, torch.float32)
    blocks[1][2, 3] = bad
    blocks[3][4, 0] = bad
    with pytest.raises(GradianUserError) as want:
        check_shard_finite(dict(zip(NAMES, blocks)), [r["id"] for r in _rows(n)], "sentence unit", tmp_path)
    stream = ShardStream(tmp_path, 0, NAMES, DIMS, n, torch.float32)
    for r in range(n):
        stream.put(r, [blk[r] for blk in blocks])
    with pytest.raises(GradianUserError) as got:
        stream.finish(0, _rows(n), LAYOUT, "sentence unit")
    assert str(got.value) == str(want.value)
    assert "2 sentence unit(s)" in str(got.value) and "r2, r4" in str(got.value)
    assert list(tmp_path.iterdir()) == []  # no shard, no record, no temp file


def test_an_unfinished_shard_is_never_committed(tmp_path):
    n = 4
    blocks = _blocks(n, torch.float32)
    stream = ShardStream(tmp_path, 0, NAMES, DIMS, n, torch.float32)
    for r in range(n - 1):
        assert not stream.put(r, [blk[r] for blk in blocks])
    assert len(_temps(tmp_path)) == 1  # being written
    with pytest.raises(RuntimeError, match="1 rows were not computed"):
        stream.finish(0, _rows(n), LAYOUT, "row")
    assert list(tmp_path.iterdir()) == []
    stream2 = ShardStream(tmp_path, 1, NAMES, DIMS, n, torch.float32)
    stream2.put(0, [blk[0] for blk in blocks])
    stream2.abort()
    assert list(tmp_path.iterdir()) == []
