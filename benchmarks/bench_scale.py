"""Scale: wall time, peak RSS per process and index bytes, with 1 and 2 processes (torchrun, gloo).

On a tiny from-config Llama (hidden 64, 2 layers, LoRA r=8 on attention and MLP: 16,384 numbers a
row, 65.5 kB in float32) and synthetic prompt/completion rows of 10-60 tokens, for every size in
``--rows`` and every process count in ``--procs``:

* **index**: ``gradian index`` (``python -m gradian`` for 1 process, ``torchrun --standalone
  --nproc-per-node P -m gradian`` for P), timed from the launch to the exit (``wall``) and inside
  each process around the command (``cmd``: model load + build; the slowest rank is shown);
* **score**: DataInf (fit + precondition) and gradient-dot over the finished index for 8 random
  queries, then ``score_index`` and the row norms: what ``gradian attribute`` does per index;
* the peak RSS of every process (``ru_maxrss``), the bytes of the index's shards, and whether
  the shards are byte-identical to the 1-process index.

    python benchmarks/bench_scale.py --rows 1000,4000,16000 --procs 1,2 --workdir /tmp/bench-scale

Every process runs one thread (``OMP_NUM_THREADS=1``), so P processes use P cores. The load
average of the machine is printed beside each row: other jobs on the cores slow everything.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kB


def _dump(out_dir: Path, record: dict) -> None:
    rank = int(os.environ.get("RANK", "0"))
    ru = resource.getrusage(resource.RUSAGE_SELF)
    record.update(rank=rank, peak_rss_mb=round(_peak_rss_mb(), 1), cpu_s=round(ru.ru_utime + ru.ru_stime, 1))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"rank{rank}.json").write_text(json.dumps(record))


def worker_index(out_dir: Path, argv: list[str]) -> None:
    """One rank of ``gradian index``: the CLI in this process, then its peak RSS. The libraries are
    imported before the clock starts, so ``cmd_s`` is the model load, tokenisation and build.
    """
    import peft  # noqa: F401
    import transformers  # noqa: F401

    import gradian.attribute.trajectory  # noqa: F401
    import gradian.finetune  # noqa: F401
    from gradian.cli import app

    t = time.perf_counter()
    try:
        app(argv, standalone_mode=False)
    finally:
        _dump(out_dir, {"cmd_s": round(time.perf_counter() - t, 2)})


def worker_score(out_dir: Path, root: Path) -> None:
    """One rank of the scoring pass over a finished index."""
    import torch

    from gradian import distributed
    from gradian.attribute.evidence import row_norms
    from gradian.engines import score_index
    from gradian.engines.registry import engine_spec, fit_engine
    from gradian.index.store import GradientIndex

    distributed.init_from_env("cpu")
    t = time.perf_counter()
    idx = GradientIndex(root)
    g = torch.Generator().manual_seed(0)
    Q = {b["name"]: torch.randn(8, int(b["dim"]), generator=g, dtype=torch.float64) for b in idx.blocks}
    R = []
    for name in ("datainf", "graddot"):
        eng = fit_engine(engine_spec(name), idx)
        R.append(eng.precondition(idx, Q))
    scores = score_index(idx, R)
    norms = row_norms(idx)
    assert scores[0].shape == (8, idx.n) and norms.shape == (idx.n,)
    distributed.shutdown()
    _dump(out_dir, {"cmd_s": round(time.perf_counter() - t, 2)})


def worker_ekfac(out_dir: Path, root: Path, base: Path, adapter: Path, data: Path) -> None:
    """One rank of EK-FAC's fit over a finished index (``--ekfac``): pass 1 over the model (its share
    of the batches), Λ from its share of the shards, the sums all-reduced; timed without the model load.
    """
    from gradian import distributed
    from gradian.data.formats import load_examples
    from gradian.engines.base import ModelPass
    from gradian.engines.registry import engine_spec, fit_engine
    from gradian.finetune import load_finetune, tokenize_training_set
    from gradian.index.store import GradientIndex, GradSpec
    from gradian.models.load import ModelSpec

    distributed.init_from_env("cpu")
    idx = GradientIndex(root)
    ft = load_finetune(ModelSpec(str(base)), adapter)
    spec = GradSpec.from_dict(idx.grad_spec)
    items = tokenize_training_set(load_examples(data), ft.tokenizer, spec, data, lazy=True)
    t = time.perf_counter()
    eng = fit_engine(engine_spec("ekfac"), idx, ModelPass(ft.model, items, ft.tokenizer.pad_token_id, 8))
    took = time.perf_counter() - t
    distributed.shutdown()
    _dump(out_dir, {"cmd_s": round(took, 2), "rows_per_rank": eng.meta["rows_per_rank"], "file": str(eng.path)})


# --------------------------------------------------------------------------- setup


WORDS = (
    "the capital of france is paris japan tokyo water boils at one hundred degrees iron is a metal with "
    "symbol fe and atomic number twenty six hello world this test model tokenizer river mountain city "
    "north south east west large small old new first last green blue red"
).split()


def setup(work: Path) -> tuple[Path, Path]:
    """A tiny base + tokenizer and a LoRA adapter on disk (once)."""
    base, adapter = work / "base", work / "adapter"
    if (adapter / "adapter_config.json").exists():
        return base, adapter
    import torch
    from peft import LoraConfig, get_peft_model

    from gradian.models.tiny import default_targets, tiny_model, train_tokenizer

    corpus = [" ".join(random.Random(i).choices(WORDS, k=12)) for i in range(300)]
    tok = train_tokenizer(corpus, vocab_size=320)
    tiny_model(tok, "llama", seed=0).save_pretrained(base)
    tok.save_pretrained(base)
    torch.manual_seed(1)
    pm = get_peft_model(
        tiny_model(tok, "llama", seed=0),
        LoraConfig(r=8, lora_alpha=16, target_modules=default_targets("llama"), init_lora_weights=False),
    )
    pm.save_pretrained(adapter)
    return base, adapter


def dataset(work: Path, n: int) -> Path:
    p = work / f"train-{n}.jsonl"
    if not p.exists():
        rng = random.Random(n)
        with p.open("w") as f:
            for i in range(n):
                q = " ".join(rng.choices(WORDS, k=rng.randint(3, 12)))
                a = " ".join(rng.choices(WORDS, k=rng.randint(4, 40)))
                f.write(json.dumps({"id": f"r{i}", "prompt": f"Q: {q}?\nA:", "completion": f" {a}."}) + "\n")
    return p


def launch(procs: int, args: list[str], env: dict) -> tuple[float, subprocess.CompletedProcess]:
    if procs == 1:
        cmd = [sys.executable, str(HERE), *args]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={procs}",
            str(HERE),
            *args,
        ]
    t = time.perf_counter()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if res.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return wall, res


def _ekfac_lambda(path: Path) -> dict:
    """The corrected eigenvalues Λ of a factors file, per block (compared with the 1-process fit)."""
    from safetensors.torch import load_file

    return {k: v for k, v in load_file(str(path)).items() if k.endswith("::lam")}


def _ranks(d: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(d.glob("rank*.json"))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1000,4000,16000")
    ap.add_argument("--procs", default="1,2")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/gradian-bench-scale"))
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    ap.add_argument("--ekfac", action="store_true", help="also time EK-FAC's fit (a model pass) per row count and P")
    ap.add_argument("--worker", choices=("index", "score", "ekfac"), help=argparse.SUPPRESS)
    ap.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker == "index":
        return worker_index(Path(args.rest[0]), args.rest[2:] if args.rest[1:2] == ["--"] else args.rest[1:])
    if args.worker == "score":
        return worker_score(Path(args.rest[0]), Path(args.rest[1]))
    if args.worker == "ekfac":
        return worker_ekfac(*(Path(a) for a in args.rest[:5]))

    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    base, adapter = setup(work)
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        GRADIAN_CACHE=str(work / "cache"),
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    import gradian

    env["PYTHONPATH"] = str(Path(gradian.__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    rows_out = []
    print(
        "| rows | procs | index wall (s) | index cmd, slowest rank (s) | CPU s per process, index "
        "| peak RSS per process, index (MB) | score (s) | peak RSS per process, score (MB) | index (MB) "
        "| shards = 1 proc | load avg |"
    )
    print("|---:|---:|---:|---:|---|---|---:|---|---:|:---:|---:|")
    ref_shards: dict[int, list[str]] = {}
    ref_lam: dict[int, dict] = {}
    for n in [int(x) for x in args.rows.split(",")]:
        data = dataset(work, n)
        for p in [int(x) for x in args.procs.split(",")]:
            tag = f"n{n}-p{p}"
            out = work / "index" / tag
            stats = work / "stats" / tag
            for d in (out, stats):
                if d.exists():
                    import shutil

                    shutil.rmtree(d)
            load0 = os.getloadavg()[0]
            wall, _ = launch(
                p,
                [
                    "--worker",
                    "index",
                    str(stats / "index"),
                    "--",
                    "index",
                    "--base",
                    str(base),
                    "--adapter",
                    str(adapter),
                    "--data",
                    str(data),
                    "--out",
                    str(out),
                    "--checkpoints",
                    "final",
                    "--max-length",
                    "128",
                    "--batch-size",
                    str(args.batch_size),
                ],
                env,
            )
            (root,) = [q for q in out.iterdir() if q.is_dir()]
            manifest = json.loads((root / "manifest.json").read_text())
            shards = [s["sha256"] for s in manifest["shards"]]
            ref_shards.setdefault(n, shards)
            size = sum((root / s["file"]).stat().st_size for s in manifest["shards"])
            swall, _ = launch(p, ["--worker", "score", str(stats / "score"), str(root)], env)
            ix, sc = _ranks(stats / "index"), _ranks(stats / "score")
            ek = None
            if args.ekfac:
                launch(
                    p, ["--worker", "ekfac", str(stats / "ekfac"), str(root), str(base), str(adapter), str(data)], env
                )
                ek = _ranks(stats / "ekfac")
                lam = _ekfac_lambda(Path(ek[0]["file"]))
                ref_lam.setdefault(n, lam)
                ek_diff = max(float((lam[k] - ref_lam[n][k]).abs().max() / ref_lam[n][k].abs().max()) for k in lam)
            load1 = os.getloadavg()[0]
            row = {
                "rows": n,
                "procs": p,
                "index_wall_s": round(wall, 1),
                "index_cmd_s": max(r["cmd_s"] for r in ix),
                "index_rss_mb": [r["peak_rss_mb"] for r in ix],
                "index_cpu_s": [r["cpu_s"] for r in ix],
                "index_cmd_s_per_rank": [r["cmd_s"] for r in ix],
                "score_s": max(r["cmd_s"] for r in sc),
                "score_wall_s": round(swall, 1),
                "score_rss_mb": [r["peak_rss_mb"] for r in sc],
                "index_bytes": size,
                "numbers_per_row": sum(int(b["dim"]) for b in manifest["blocks"]),
                "shards": len(shards),
                "same_shards_as_1_proc": shards == ref_shards[n],
                "load_avg": [round(load0, 2), round(load1, 2)],
            }
            if ek is not None:
                row.update(
                    ekfac_fit_s=max(r["cmd_s"] for r in ek),
                    ekfac_rss_mb=[r["peak_rss_mb"] for r in ek],
                    ekfac_rows_per_rank=ek[0]["rows_per_rank"],
                    ekfac_lambda_rel_diff_vs_1_proc=ek_diff,
                )
            rows_out.append(row)
            print(
                f"| {n:,} | {p} | {wall:.1f} | {row['index_cmd_s']:.1f} | "
                f"{', '.join(f'{x:.0f}' for x in row['index_cpu_s'])} "
                f"| {', '.join(f'{x:.0f}' for x in row['index_rss_mb'])} "
                f"| {row['score_s']:.1f} | {', '.join(f'{x:.0f}' for x in row['score_rss_mb'])} | {size / 1e6:.0f} "
                f"| {'yes' if row['same_shards_as_1_proc'] else 'NO'} | {load0:.1f}→{load1:.1f} |"
                + (
                    f" EK-FAC fit {row['ekfac_fit_s']:.1f} s,"
                    f" RSS {', '.join(f'{x:.0f}' for x in row['ekfac_rss_mb'])} MB,"
                    f" rows {row['ekfac_rows_per_rank']}, Λ vs 1 proc {row['ekfac_lambda_rel_diff_vs_1_proc']:.1e} |"
                    if ek is not None
                    else ""
                ),
                flush=True,
            )
            import shutil

            shutil.rmtree(out)  # the disk holds one index at a time
    if args.json:
        args.json.write_text(json.dumps(rows_out, indent=2))


if __name__ == "__main__":
    main()
