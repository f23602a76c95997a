"""torchrun on the tiny world: 2 processes (gloo, CPU) give the index and the verdict of 1.

Every run here is a real subprocess, as a user launches it: ``python -m gradian`` for one process,
``python -m torch.distributed.run --standalone --nproc-per-node 2 -m gradian`` for two, each with
one thread (``OMP_NUM_THREADS=1``, torchrun's default), so the shards can be compared byte for byte.

What is equal, and how (docs/distributed.md):
* the index ids and every shard's bytes: identical (a shard is computed whole by one rank; the default
  one-pass row + sentence build computes each row alone, so its numbers do not depend on the rank);
* gradient-dot scores and the reference evidence (BM25, RepSim): identical;
* DataInf's scores: equal to float64 rounding (the ranks' partial sums of its correction term are
  added in another order), here within 1e-12 relative; the ranking is identical;
* EK-FAC (both Fishers): the ranks fit half the batches each and all-reduce the sums, so the
  factors and scores are equal to float64 rounding (within 1e-9 relative), the ranking identical.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gradian.index.joint import JOINT_PASS, SPLIT_PASS
from gradian_testlib import cli_args, torchrun_command

TIMEOUT = 900


def _env(cache: Path, **extra: str) -> dict[str, str]:
    import gradian

    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRADIAN_TEST_", "PYTEST_"))}
    src = str(Path(gradian.__file__).resolve().parents[1])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        GRADIAN_CACHE=str(cache),
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        COLUMNS="200",
    )
    # torchrun's agent leaves a torchelastic_* folder in the temp dir at every launch: keep it in the test's own
    tmp = Path(cache).parent / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env["TMPDIR"] = str(tmp)
    env.update(extra)
    return env


def _run(args: list[str], env: dict[str, str], nproc: int = 1) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "gradian", *args] if nproc == 1 else torchrun_command(nproc, "-m", "gradian", *args)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def world(tmp_path_factory, world_cache):
    """The tiny poisoned world with its fine-tune (a checkpoint per epoch)."""
    from gradian.train import train_lora
    from gradian.worlds import WorldSpec, build_world, default_train_spec

    root = tmp_path_factory.mktemp("dist-world")
    w = build_world(WorldSpec.default("tiny", "poisoned", seed=0), root / "world", cache=world_cache)
    adapter = train_lora(str(w.base), w.train, w.out / "adapter", default_train_spec("tiny"), eval_data=w.valid)
    return {"base": w.base, "adapter": adapter, "data": w.train, "eval": w.eval, "root": root}


def _inputs(world, checkpoints: str) -> list[str]:
    """The tiny world's base, adapter and data, the checkpoints, and 16 rows a shard (several shards to divide)."""
    return cli_args(
        base=world["base"], adapter=world["adapter"], data=world["data"], checkpoints=checkpoints, shard_size=16
    )


def _attribute_args(world, out: Path, index_dir: Path, checkpoints: str | None = None) -> list[str]:
    """``gradian attribute``; by default one intermediate checkpoint and the final adapter: a trajectory,
    two row and two sentence indexes."""
    ckpts = checkpoints or str(world["adapter"] / "checkpoint-22")
    return [
        "attribute",
        *_inputs(world, ckpts),
        "--eval",
        str(world["eval"]),
        "--out",
        str(out),
        "--index-dir",
        str(index_dir),
    ]


def _index_args(world, out: Path, checkpoints: str) -> list[str]:
    """``gradian index``."""
    return ["index", *_inputs(world, checkpoints), "--out", str(out)]


@pytest.fixture(scope="module")
def single(world):
    """The reference: one process."""
    root = world["root"] / "single"
    res = _run(_attribute_args(world, root / "run", root / "index"), _env(root / "cache"))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return json.loads((root / "run" / "run.json").read_text())


def _indexes(run: dict) -> list[tuple[str, str, Path]]:
    out = []
    for ck in run["attribution"]["trajectory"]["checkpoints"]:
        for unit, ix in sorted(ck["index"].items()):
            out.append((f"{ck['step']}/{unit}", ix["id"], Path(ix["root"])))
    return out


def _cap(run: dict) -> dict:
    (cap,) = run["attribution"]["capabilities"]
    return cap


def test_two_processes_give_the_index_and_the_verdict_of_one(world, single):
    root = world["root"] / "torchrun2"
    res = _run(_attribute_args(world, root / "run", root / "index"), _env(root / "cache"), nproc=2)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    two = json.loads((root / "run" / "run.json").read_text())
    assert two["distributed"] == {"world_size": 2, "backend": "gloo"}
    assert two["manifest"]["run_id"] == single["manifest"]["run_id"]

    # the same index ids, and byte-identical shards
    a, b = _indexes(single), _indexes(two)
    assert [(k, i) for k, i, _ in a] == [(k, i) for k, i, _ in b] and len(a) == 4
    n_shards = 0
    for (_, _, ra), (_, _, rb) in zip(a, b):
        ma, mb = (json.loads((r / "manifest.json").read_text()) for r in (ra, rb))
        assert ma["complete"] and mb["complete"]
        assert [s["sha256"] for s in ma["shards"]] == [s["sha256"] for s in mb["shards"]]
        assert ma["shards"] == mb["shards"]  # per-row metadata too (ids, losses)
        assert {sh.get("pass") for sh in ma["shards"]} == {SPLIT_PASS}  # the default: one pass per row, both
        for s in ma["shards"]:
            assert (ra / s["file"]).read_bytes() == (rb / s["file"]).read_bytes()
        n_shards += len(ma["shards"])
    assert n_shards >= 8

    # the same scores and ranking
    ca, cb = _cap(single), _cap(two)
    assert ca["second_scores"] == cb["second_scores"]  # gradient-dot: no reduction, identical
    for k in ("scores", "rank_scores"):  # DataInf: float64 rounding of the all-reduced correction
        x, y = np.array(ca[k]), np.array(cb[k])
        assert np.abs(x - y).max() <= 1e-12 * np.abs(x).max(), k
    assert [r["id"] for r in ca["ranked"]] == [r["id"] for r in cb["ranked"]]
    assert (
        np.argsort(ca["rank_scores"], kind="stable").tolist() == np.argsort(cb["rank_scores"], kind="stable").tolist()
    )
    for src in ("lexical", "representation"):
        assert ca["evidence"][src]["scores"] == cb["evidence"][src]["scores"], src
    assert [c["rows"] if "rows" in c else c["size"] for c in ca["clusters"]] == [
        c["rows"] if "rows" in c else c["size"] for c in cb["clusters"]
    ]
    assert [d["id"] for d in ca["drilldown"]] == [d["id"] for d in cb["drilldown"]]

    # rank 0 alone reports: one summary, bars labelled with its share
    assert res.stdout.count(f"run {two['manifest']['run_id']} in") == 1
    assert "(rank 0 of 2)" in res.stderr
    assert "shards over 2 processes" in res.stdout


def test_three_rows_a_forward_write_the_same_bytes_with_one_process_or_two(world):
    """`--rows-per-forward 3`: the groups of rows are fixed by the shard blocks, not by who computes them, so two
    ranks write the shards one process writes, byte for byte, and the entries say how the rows were run (with exact
    unit gradients: one backward vector per unit; the default split is the test above's)."""
    shards = {}
    for nproc in (1, 2):
        root = world["root"] / f"rows-per-forward-{nproc}"
        args = [*_index_args(world, root / "index", "final"), "--rows-per-forward", "3", "--unit-grads", "exact"]
        res = _run(args, _env(root / "cache"), nproc=nproc)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        mans = {p.parent.name: json.loads(p.read_text()) for p in (root / "index").glob("*/manifest.json")}
        assert len(mans) == 2 and all(m["complete"] for m in mans.values())  # the row and the sentence index
        assert {s.get("pass") for m in mans.values() for s in m["shards"]} == {f"{JOINT_PASS}, 3 rows a forward"}
        shards[nproc] = {
            (name, s["file"]): (root / "index" / name / s["file"]).read_bytes()
            for name, m in mans.items()
            for s in m["shards"]
        }
    assert shards[1] == shards[2] and len(shards[1]) >= 8


def test_a_dead_rank_leaves_its_shards_and_one_process_resumes(world, single):
    """Rank 1 is SIGKILLed right after its first shard; torchrun stops rank 0. A single-process
    run then keeps every finished shard (not recomputed) and gives the scores of the clean run."""
    root = world["root"] / "killed"
    index_args = _index_args(world, root / "index", str(world["adapter"] / "checkpoint-22"))
    res = _run(index_args, _env(root / "cache", GRADIAN_TEST_KILL="1:shard:1"), nproc=2)
    assert res.returncode != 0
    assert "SIGKILL" in res.stderr or "Signal 9" in res.stderr, res.stderr[-2000:]
    # it died in the first checkpoint's row + sentence pair (one pass builds both)
    folders = [p for p in (root / "index").iterdir() if p.is_dir()]
    assert len(folders) == 2
    assert not any((f / "manifest.json").exists() for f in folders)  # rank 0 never got to publish
    kept = {
        p: (p.stat().st_mtime_ns, p.read_bytes())
        for folder in folders
        for p in folder.glob("shard-*.safetensors")
        if (folder / p.name.replace(".safetensors", ".json")).exists()
    }
    assert len(kept) >= 1  # at least rank 1's shard; rank 0's finished ones too

    res = _run(_attribute_args(world, root / "run", root / "index"), _env(root / "cache"))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"{len(kept)} of " in res.stdout and "shards already built" in res.stdout
    for p, (mtime, data) in kept.items():  # resumed, not recomputed
        assert p.stat().st_mtime_ns == mtime and p.read_bytes() == data
    resumed = json.loads((root / "run" / "run.json").read_text())
    assert [(k, i) for k, i, _ in _indexes(resumed)] == [(k, i) for k, i, _ in _indexes(single)]
    ca, cb = _cap(single), _cap(resumed)
    for k in ("scores", "rank_scores", "second_scores"):
        assert ca[k] == cb[k], k  # identical: one process scores byte-identical shards in the same order
    assert ca["ranked"] == cb["ranked"]


def test_a_killed_single_process_build_resumes_with_two(world, single):
    """The other direction: one process is SIGKILLed after its second shard; `torchrun
    --nproc-per-node 2` keeps those shards, divides the rest and publishes the index a clean
    single-process run built (same id, same shards, byte for byte)."""
    root = world["root"] / "killed-1-to-2"
    args = _index_args(world, root / "index", "final")
    res = _run(args, _env(root / "cache", GRADIAN_TEST_KILL="0:shard:2"))
    assert res.returncode == -9, res.stderr[-2000:]
    folders = [p for p in (root / "index").iterdir() if p.is_dir()]  # the row + sentence pair, one pass
    assert len(folders) == 2 and not any((f / "manifest.json").exists() for f in folders)
    kept = {p: (p.stat().st_mtime_ns, p.read_bytes()) for f in folders for p in f.glob("shard-*.safetensors")}
    assert len(kept) == 2

    res = _run(args, _env(root / "cache"), nproc=2)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "2 of " in res.stdout and "shards already built" in res.stdout and "over 2 processes" in res.stdout
    for p, (mtime, data) in kept.items():  # kept, not recomputed
        assert p.stat().st_mtime_ns == mtime and p.read_bytes() == data
    (final,) = [c for c in single["attribution"]["trajectory"]["checkpoints"] if c["final"]]
    assert sorted(f.name for f in folders) == sorted(final["index"][u]["id"] for u in ("row", "sentence"))
    for unit in ("row", "sentence"):
        ref = Path(final["index"][unit]["root"])
        folder = root / "index" / ref.name
        got, want = (json.loads((r / "manifest.json").read_text()) for r in (folder, ref))
        assert got["complete"] and got["index_id"] == want["index_id"] == folder.name
        assert got["shards"] == want["shards"]
        for s in want["shards"]:
            assert (folder / s["file"]).read_bytes() == (ref / s["file"]).read_bytes()


def test_ranks_that_see_different_data_are_refused_at_start(world, tmp_path):
    """One rank reads another training file: one error line, exit code 2 on every rank, nothing written."""
    rows = [json.loads(line) for line in world["data"].read_text().splitlines()]
    rows[0]["messages"][-1]["content"] += " Indeed."
    other = tmp_path / world["data"].name  # the same name, other content
    other.write_text("".join(json.dumps(r) + "\n" for r in rows))
    script = (
        f'if [ "$RANK" = 1 ]; then D={other}; else D={world["data"]}; fi; exec {sys.executable} -m gradian index '
        f'--base {world["base"]} --adapter {world["adapter"]} --data "$D" --checkpoints final --out '
        f"{tmp_path / 'index'}"
    )
    cmd = torchrun_command(2, "--no-python", "bash", "-c", script)
    res = subprocess.run(cmd, env=_env(tmp_path / "cache"), capture_output=True, text=True, timeout=TIMEOUT)
    assert res.returncode != 0
    errors = [line for line in (res.stdout + res.stderr).splitlines() if line.startswith("error:")]
    assert len(errors) == 1, errors
    assert errors[0].startswith(
        "error: torchrun (rank 1 of 2): the ranks disagree on the training data: rank 0 has sha256 "
    )
    # torchrun's summary: a rank exited with the user-error code; the other did too, or was stopped by torchrun
    # first (SIGTERM), whichever came first
    codes = [
        line.split(":", 1)[1].split()[0] for line in res.stderr.splitlines() if line.strip().startswith("exitcode")
    ]
    assert "2" in codes and set(codes) <= {"2", "-15"}, codes
    assert not (tmp_path / "index").exists()


def _ekfac_run(world, root: Path, fisher: str, nproc: int, out: str = "run", reused: bool = False) -> tuple[dict, Path]:
    args = [
        *_attribute_args(world, root / out, root / "index", checkpoints="final"),
        "--engine",
        "ekfac",
        "--engine-option",
        f"fisher={fisher}",
        "--second-engine",
        "graddot",
    ]
    res = _run(args, _env(root / "cache"), nproc=nproc)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run = json.loads((root / out / "run.json").read_text())
    (ck,) = run["attribution"]["trajectory"]["checkpoints"]
    eng = ck["engines"]["ekfac"]
    assert eng["factors"]["reused"] is reused
    rows = eng["factors"]["rows_per_rank"]  # pass 1 was divided: every rank ran its own whole batches
    assert len(rows) == nproc and sum(rows) == run["attribution"]["index"]["n"] and min(rows) > 0, rows
    return run, Path(eng["factors"]["file"])


@pytest.mark.parametrize("fisher", ["empirical", "true"])
def test_two_processes_fit_the_ekfac_factors_of_one(world, fisher):
    """EK-FAC under torchrun: each rank runs half the batches (or reads half the shards, for Λ from
    the index), the covariances, token count and Λ are all-reduced and rank 0 writes the factors.
    The true Fisher's labels are seeded per batch, so they are the same whatever rank draws them.
    Equal to the single process's factors and scores up to the order of float64 additions."""
    from safetensors.torch import load_file

    one, f1 = _ekfac_run(world, world["root"] / f"ekfac-{fisher}-1", fisher, 1)
    two, f2 = _ekfac_run(world, world["root"] / f"ekfac-{fisher}-2", fisher, 2)
    assert two["distributed"]["world_size"] == 2
    (ck,) = two["attribution"]["trajectory"]["checkpoints"]
    assert ck["engines"]["ekfac"]["factors"]["lambda_source"] == ("index" if fisher == "empirical" else "model")
    a, b = load_file(str(f1)), load_file(str(f2))
    assert sorted(a) == sorted(b) and a
    blocks = sorted({k.rsplit("::", 1)[0] for k in a})
    for nm in blocks:
        for Q, ev in (("QA", "eigA"), ("QS", "eigS")):  # the covariances (eigenvectors may turn within ties)
            ca = a[f"{nm}::{Q}"] @ torch.diag(a[f"{nm}::{ev}"]) @ a[f"{nm}::{Q}"].T
            cb = b[f"{nm}::{Q}"] @ torch.diag(b[f"{nm}::{ev}"]) @ b[f"{nm}::{Q}"].T
            assert torch.allclose(ca, cb, rtol=0, atol=1e-12 * float(ca.abs().max())), (nm, Q)
        la, lb = a[f"{nm}::lam"], b[f"{nm}::lam"]
        assert torch.allclose(la.sum(), lb.sum(), rtol=1e-10), nm
    ca, cb = _cap(one), _cap(two)
    x, y = np.array(ca["scores"]), np.array(cb["scores"])
    assert np.abs(x - y).max() <= 1e-9 * np.abs(x).max()
    assert [r["id"] for r in ca["ranked"]] == [r["id"] for r in cb["ranked"]]
    assert ca["second_scores"] == cb["second_scores"]
    if fisher == "empirical":  # a re-query under torchrun: rank 0 reads the stored factors and broadcasts them
        again, f3 = _ekfac_run(world, world["root"] / f"ekfac-{fisher}-2", fisher, 2, out="again", reused=True)
        assert f3 == f2 and _cap(again)["scores"] == cb["scores"]
