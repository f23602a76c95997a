"""The GPU path (``--device cuda --dtype bfloat16``): marked ``gpu``, skipped without CUDA.

Run with ``pytest -m gpu`` on a CUDA machine (the 2-GPU test needs two devices).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gradian_testlib import ROWS, cli_args, ft_inputs, make_lora_model, torchrun_command

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _batch(tok):
    from gradian.data.formats import to_example
    from gradian.data.tokenize import TokenizeSpec, collate, tokenize_example

    items = [tokenize_example(to_example(r, i, "t"), tok, TokenizeSpec(max_length=64)) for i, r in enumerate(ROWS)]
    return collate(items, tok.pad_token_id, "right")


def _rel(a: dict, b: dict) -> float:
    scale = max(v.abs().max().item() for v in b.values())
    return max((a[k].float().cpu() - b[k].float().cpu()).abs().max().item() for k in b) / scale


def test_hooks_equal_the_loop_in_bfloat16_on_cuda(tok):
    from gradian import per_example_grads

    bf16 = make_lora_model(tok, "llama", r=8, dtype=torch.bfloat16).cuda()
    f32 = make_lora_model(tok, "llama", r=8, dtype=torch.float32).cuda()
    batch = _batch(tok)
    hooks = per_example_grads(bf16, batch, "hooks")
    loop = per_example_grads(bf16, batch, "loop")
    ref = per_example_grads(f32, batch, "hooks")
    assert all(v.dtype == torch.float32 and v.is_cuda for v in hooks.values())  # accumulated in float32
    assert _rel(hooks, loop) <= 3e-2
    assert _rel(hooks, ref) <= 5e-2


def test_index_queries_and_drilldown_run_on_cuda_in_bfloat16(saved_finetune, tmp_path):
    """``--device cuda --dtype bfloat16`` through the index (with a projection), the query gradients,
    DataInf and the sentence drill-down: the numbers come back to the CPU, close to float32 on CPU."""
    from gradian.attribute import AttributeSpec, attribute_capability, make_query
    from gradian.data.tokenize import TokenizeSpec
    from gradian.finetune import load_finetune, training_index
    from gradian.gradients.projection import ProjectionSpec
    from gradian.index.store import GradSpec
    from gradian.models.load import ModelSpec

    spec = GradSpec(tokenize=TokenizeSpec(max_length=64), projection=ProjectionSpec(dim=16))
    gpu = load_finetune(ModelSpec(str(saved_finetune["base"]), "bfloat16", "cuda"), saved_finetune["adapter"])
    cpu = load_finetune(ModelSpec(str(saved_finetune["base"])), saved_finetune["adapter"])
    a, exs, items, _ = training_index(gpu, saved_finetune["data"], spec, root=tmp_path / "gpu")
    b, *_ = training_index(cpu, saved_finetune["data"], spec, root=tmp_path / "cpu")
    ga = torch.cat([torch.cat(list(s.values()), 1) for _, s in a.iter_shards()])
    gb = torch.cat([torch.cat(list(s.values()), 1) for _, s in b.iter_shards()])
    assert (ga - gb).norm() <= 5e-2 * gb.norm()
    q = [make_query("q0", "capitals", "Q: What is the capital of France?\nA:", "Paris", " Lyon")]
    res = attribute_capability(
        gpu.model,
        gpu.tokenizer,
        a,
        exs,
        items,
        q,
        spec.tokenize,
        AttributeSpec(references=(), fuse=(), drilldown_rows=3),
    )
    assert len(res.scores) == len(exs) and all(abs(x) < float("inf") for x in res.scores)


def test_the_joint_build_batches_rows_on_cuda_and_matches_one_row_on_the_cpu(tok, tmp_path):
    """On CUDA the one-pass row + sentence build with 4 rows a forward (the shard entries say so), float32 with
    TF32 off, equals the CPU's one-row build to float rounding."""
    import copy

    from safetensors.torch import load_file

    from gradian.gradients.projection import ProjectionSpec
    from gradian.index.joint import JOINT_PASS, build_jointly
    from gradian.index.store import GradSpec
    from gradian_testlib import sentence_rows

    items, units = sentence_rows(tok)
    spec = GradSpec(projection=ProjectionSpec(dim=8, seed=1))
    ids = {u: {"test": "joint-cuda", "unit": u} for u in ("row", "sentence")}
    cpu = make_lora_model(tok, "llama")
    gpu = copy.deepcopy(cpu).cuda()
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        roots = {}
        for name, model, b in (("cpu", cpu, 1), ("cuda", gpu, 4)):
            roots[name] = {u: tmp_path / f"{name}-{u}" for u in ("row", "sentence")}
            build_jointly(model, items, units, ids["row"], ids["sentence"], spec, row_root=roots[name]["row"],
                          sentence_root=roots[name]["sentence"], pad_token_id=tok.pad_token_id, batch_size=4,
                          shard_size=8, per_forward=b)  # fmt: skip
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    for u in ("row", "sentence"):
        entries = [json.loads(p.read_text())["entry"] for p in sorted(roots["cuda"][u].glob("shard-*.json"))]
        assert entries and {e["pass"] for e in entries} == {f"{JOINT_PASS}, 4 rows a forward"}
        for p in sorted(roots["cpu"][u].glob("shard-*.safetensors")):
            a, b = load_file(str(p)), load_file(str(roots["cuda"][u] / p.name))
            for key in a:
                assert float((a[key] - b[key]).abs().max() / a[key].abs().max().clamp(min=1e-30)) < 1e-4, (u, key)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_two_gpus_under_torchrun_equal_one(saved_finetune, tmp_path):
    """``torchrun --nproc-per-node 2 -m gradian index --device cuda --dtype bfloat16`` gives the index of one GPU."""
    import gradian

    env = dict(
        os.environ,
        PYTHONPATH=str(Path(gradian.__file__).resolve().parents[1]),
        GRADIAN_CACHE=str(tmp_path / "c"),
        HF_HUB_OFFLINE="1",
        TMPDIR=str(tmp_path),  # torchrun's agent leaves a torchelastic_* folder in the temp dir at every launch
    )
    args = cli_args(
        "index",
        **ft_inputs(saved_finetune),
        max_length=64,
        device="cuda",
        dtype="bfloat16",
        batch_size=2,
        shard_size=2,
    )
    one = subprocess.run(
        [sys.executable, "-m", "gradian", *args, "--out", str(tmp_path / "one")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run(
        torchrun_command(2, "-m", "gradian", *args, "--out", str(tmp_path / "two")),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert two.returncode == 0, two.stderr[-2000:]
    from gradian.index.store import GradientIndex

    (a,) = [GradientIndex(p) for p in (tmp_path / "one").iterdir() if p.is_dir()]
    (b,) = [GradientIndex(p) for p in (tmp_path / "two").iterdir() if p.is_dir()]
    assert a.id == b.id and a.complete and b.complete
    same_bytes = [s["sha256"] for s in a.manifest["shards"]] == [s["sha256"] for s in b.manifest["shards"]]
    for (_, sa), (_, sb) in zip(a.iter_shards(), b.iter_shards()):
        for k in sa:  # identical unless a CUDA kernel is non-deterministic; then within bfloat16 noise
            torch.testing.assert_close(sa[k], sb[k], rtol=1e-2, atol=1e-6 * float(sa[k].abs().max()))
    print(json.dumps({"byte_identical_shards": same_bytes}))
