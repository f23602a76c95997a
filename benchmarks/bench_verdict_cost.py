"""The default verdict's cost against the fine-tune's own, per stage, in one run on the same threads.

    python benchmarks/bench_verdict_cost.py --world W --out OUT [--src SRC --label NAME --args FLAGS ...]

1. ``gradian train`` on the world (``W/train.jsonl``, ``W/train.yaml``; the base from ``W/world.json``), or with
   ``--reuse-train`` the adapter and training figures an earlier run left in OUT;
2. the default ``gradian attribute`` on the result, once per ``--src`` (a ``src`` folder of Gradian: e.g. main's
   and a branch's, so before and after run side by side on the same adapter).

Each runs in a child process (``PYTHONPATH=SRC``, ``OMP_NUM_THREADS=1``) that wraps Gradian's stage functions
and counts, per stage (train, plan, evaluate, data check, row index, sentence index, joint row+sentence index,
scoring = queries + engines + scores, references): wall seconds, **forward passes** and **backward passes**
over a sequence in a gradient pass (a unit's backward vector counts as one), **tokens** forwarded in those
passes, **no-grad tokens**: tokens the model forwarded without gradients (Evaluate's generation and scoring, the
data check, RepSim's states; every call of the token embedding under ``torch.no_grad``, so a generated token
counts once), and **peak RSS** (a thread samples ``/proc/self/status`` VmRSS every 20 ms while the stage runs, so
a peak shorter than that can be missed).
Training's passes are rows × epochs (HF Trainer: one forward+backward per row per epoch, the valid set's
evaluation not counted) and its tokens the rows' token counts × epochs.

Writes ``OUT/verdict_cost.json`` and prints a Markdown table (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()


# --------------------------------------------------------------------------- child: one measured command


def _glibc_heap():
    """A function giving glibc's heap figures in bytes (``mallinfo2``, every arena): ``heap_free``, freed memory
    malloc keeps in its arenas (the part of the RSS that is neither live data nor returned to the OS, when its
    pages were touched), and ``mmapped``, the live allocations malloc made with mmap. Empty where there is none.
    """
    import ctypes

    names = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in names]

    try:
        lib = ctypes.CDLL("libc.so.6")
        fn = lib.mallinfo2
    except (OSError, AttributeError):
        return dict
    fn.restype = MallInfo2

    def heap() -> dict[str, int]:
        m = fn()
        return {"heap_free": int(m.fordblks), "mmapped": int(m.hblkhd)}

    return heap


def _child(kind: str, args: list[str], report: Path) -> None:
    import threading

    import gradian  # noqa: F401  (the SRC on PYTHONPATH)

    stats: dict[str, dict[str, float]] = {}
    stage = ["other"]

    def status() -> dict[str, int]:
        """VmRSS and its anonymous / file-backed parts, in bytes (/proc/self/status)."""
        got = {}
        with open("/proc/self/status") as f:
            for ln in f:
                key = ln.split(":")[0]
                if key in ("VmRSS", "RssAnon", "RssFile"):
                    got[key] = int(ln.split()[1]) * 1024
        return got

    heap = _glibc_heap()

    def rec(name: str) -> dict[str, float]:
        return stats.setdefault(
            name, {"wall_s": 0.0, "forward": 0, "backward": 0, "tokens": 0, "nograd_tokens": 0, "peak_rss": 0}
        )

    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            r = rec(stage[0])
            st = status()
            if st.get("VmRSS", 0) > r["peak_rss"]:  # the peak, and what it was made of
                r["peak_rss"] = st["VmRSS"]
                r["peak_parts"] = {"anon": st.get("RssAnon", 0), "file": st.get("RssFile", 0), **heap()}
            stop.wait(0.02)

    threading.Thread(target=sample, daemon=True).start()

    import torch

    def count_nograd(module, inputs):
        """Tokens the model forwards without gradients: each token-embedding call under no_grad."""
        if isinstance(module, torch.nn.Embedding) and not torch.is_grad_enabled() and inputs:
            x = inputs[0]
            if isinstance(x, torch.Tensor) and not x.is_floating_point():
                rec(stage[0])["nograd_tokens"] += int(x.numel())

    torch.nn.modules.module.register_module_forward_pre_hook(count_nograd)

    def staged(name_of, fn):
        def wrapper(*a, **k):
            name = name_of(*a, **k) if callable(name_of) else name_of
            if stage[0] != "other":  # nested: counted in the outer stage
                return fn(*a, **k)
            prev, stage[0] = stage[0], name
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                rec(name)["wall_s"] += time.perf_counter() - t
                stage[0] = prev

        return wrapper

    def patch(module: str, attr: str, wrap) -> None:
        import importlib

        try:
            m = importlib.import_module(module)
        except ImportError:
            return
        if hasattr(m, attr):
            orig = getattr(m, attr)
            new = wrap(orig)
            for mod in list(sys.modules.values()):  # every module that imported it by name
                if (
                    mod is not None
                    and getattr(mod, "__name__", "").startswith("gradian")
                    and getattr(mod, attr, None) is orig
                ):
                    setattr(mod, attr, new)

    def count_grads(fn):
        def wrapper(model, batch, *a, **k):
            r = rec(stage[0])
            r["forward"] += int(batch["input_ids"].shape[0])
            r["backward"] += int(batch["input_ids"].shape[0])
            r["tokens"] += int(batch["attention_mask"].sum())
            return fn(model, batch, *a, **k)

        return wrapper

    def count_units(fn):  # rows_unit_grads: b rows per forward (the build, the plan's warm-up)
        def wrapper(model, batch, unit_labels, *a, **k):
            out = fn(model, batch, unit_labels, *a, **k)
            r = rec(stage[0])
            r["forward"] += len(out)  # sequences forwarded, as count_grads counts them
            r["backward"] += sum(int(o.passes) for o in out)  # backward vectors, one per unit (and residual)
            r["tokens"] += int(batch["attention_mask"].sum())
            return out

        return wrapper

    # load the modules whose functions are wrapped (so every by-name import is patched)
    for m in (
        "gradian.index.build",
        "gradian.finetune",
        "gradian.attribute.evidence",
        "gradian.attribute.queries",
        "gradian.attribute.run",
        "gradian.index.joint",
        "gradian.index.plan",
        "gradian.attribute.references",
        "gradian.attribute.datacheck",
        "gradian.evaluate",
        "gradian.engines.base",
        "gradian.engines.registry",
    ):
        try:
            __import__(m)
        except ImportError:
            pass
    patch("gradian.gradients.per_example", "per_example_grads", count_grads)
    patch("gradian.gradients.units", "rows_unit_grads", count_units)  # row_unit_grads calls it too

    def index_stage(model, items, identity, spec, *a, **k):
        return "sentence index" if getattr(spec, "unit", "row") == "sentence" else "row index"

    patch("gradian.index.build", "build_index", lambda f: staged(index_stage, f))
    patch("gradian.index.joint", "build_jointly", lambda f: staged("row+sentence index (joint)", f))
    patch("gradian.index.plan", "run_plan", lambda f: staged("plan", f))
    patch("gradian.evaluate", "evaluate", lambda f: staged("evaluate", f))
    patch("gradian.attribute.datacheck", "check_data_matches_adapter", lambda f: staged("data check", f))
    patch("gradian.attribute.references", "reference_scores", lambda f: staged("references", f))
    for name in ("query_gradients", "score_index", "fit_engine"):
        for mod in ("gradian.attribute.queries", "gradian.engines.base", "gradian.engines.registry"):
            patch(mod, name, lambda f: staged("scoring", f))
    if kind == "train":
        patch("gradian.train", "train_lora", lambda f: staged("train", f))

    from typer.testing import CliRunner

    from gradian.cli import app

    t = time.perf_counter()
    res = CliRunner().invoke(app, args)
    total = time.perf_counter() - t
    stop.set()
    import resource

    out = {
        "exit_code": res.exit_code,
        "output_tail": res.output[-3000:],
        "wall_s": total,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "stages": {k: v for k, v in stats.items() if v["wall_s"] or k != "other"},
    }
    report.write_text(json.dumps(out, indent=1))


# --------------------------------------------------------------------------- parent


def _run_child(src: Path, kind: str, args: list[str], report: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    cmd = [sys.executable, str(HERE), "--child", kind, "--report", str(report), "--", *args]
    subprocess.run(cmd, env=env, check=True)
    got = json.loads(report.read_text())
    if got["exit_code"] != 0:
        raise SystemExit(f"{kind} failed (exit {got['exit_code']}):\n{got['output_tail']}")
    return got


def _training_counts(src: Path, world: Path) -> tuple[int, int, float]:
    """(rows, tokens per epoch, epochs) of the world's training run, tokenised as the trainer does."""
    code = (
        "import json,sys,yaml;from gradian.data.formats import load_examples;"
        "from gradian.finetune import tokenize_training_set;from gradian.data.tokenize import TokenizeSpec,row_values;"
        "from transformers import AutoTokenizer;w=sys.argv[1];cfg=yaml.safe_load(open(w+'/train.yaml'));"
        "base=json.load(open(w+'/world.json'))['base'];tok=AutoTokenizer.from_pretrained(base);"
        "ex=load_examples(w+'/train.jsonl');"
        "from gradian.index.store import GradSpec;"
        "it=tokenize_training_set(ex,tok,GradSpec(tokenize=TokenizeSpec(max_length=cfg.get('max_length',1024))),"
        "w+'/train.jsonl');print(json.dumps([len(ex),int(sum(row_values(it,'length'))),"
        "float(cfg.get('num_train_epochs',3))]))"
    )
    env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", code, str(world)], env=env, capture_output=True, text=True, check=True)
    rows, tokens, epochs = json.loads(out.stdout.strip().splitlines()[-1])
    return rows, tokens, epochs


ORDER = [
    "train",
    "plan",
    "evaluate",
    "data check",
    "row index",
    "sentence index",
    "row+sentence index (joint)",
    "scoring",
    "references",
    "other",
]


def table(result: dict) -> str:
    """The Markdown table of one result (train, then each labelled attribute run)."""
    lines = [
        "| run | stage | wall s | share of the run | forward | backward | tokens | no-grad tokens | peak RSS MB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, run in result["runs"].items():
        st = run["stages"]
        total = run["wall_s"]
        for name in ORDER:
            if name not in st:
                continue
            v = st[name]
            lines.append(
                f"| {label} | {name} | {v['wall_s']:.1f} | {v['wall_s'] / total:.0%} | {int(v['forward']):,} | "
                f"{int(v['backward']):,} | {int(v['tokens']):,} | {int(v.get('nograd_tokens', 0)):,} | "
                f"{v['peak_rss'] / 2**20:.0f} |"
            )
        f = sum(v["forward"] for v in st.values())
        b = sum(v["backward"] for v in st.values())
        tk = sum(v["tokens"] for v in st.values())
        ng = sum(v.get("nograd_tokens", 0) for v in st.values())
        lines.append(
            f"| {label} | **total** | **{total:.1f}** | | **{int(f):,}** | **{int(b):,}** | **{int(tk):,}** | "
            f"**{int(ng):,}** | **{run['peak_rss'] / 2**20:.0f}** |"
        )
    parts = [
        (label, name, v["peak_parts"])
        for label, run in result["runs"].items()
        for name in ORDER
        if (v := run["stages"].get(name)) and v.get("peak_parts")
    ]
    if parts:  # what each stage's peak RSS was made of
        lines += [
            "",
            "| run | stage | peak RSS MB | anonymous | file-backed | glibc free chunks (at most) | malloc mmapped |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for label, name, p in parts:
            rss = result["runs"][label]["stages"][name]["peak_rss"]
            lines.append(
                f"| {label} | {name} | {rss / 2**20:.0f} | {p['anon'] / 2**20:.0f} | {p['file'] / 2**20:.0f} | "
                f"{p.get('heap_free', 0) / 2**20:.0f} | {p.get('mmapped', 0) / 2**20:.0f} |"
            )
    tr = result["runs"].get("train")
    if tr:
        tb = tr["stages"]["train"]["backward"]
        for label, run in result["runs"].items():
            if label == "train":
                continue
            b = sum(v["backward"] for k, v in run["stages"].items() if k != "train")
            lines.append(
                f"\n{label}: {int(b):,} backward passes = {b / tb:.2f}× training's {int(tb):,}; wall "
                f"{run['wall_s']:.1f} s = {run['wall_s'] / tr['wall_s']:.2f}× training's {tr['wall_s']:.1f} s"
            )
            proj = run.get("plan", {}).get("projection")
            if proj:  # the storage the run plan chose: arms compare only at the same
                lines.append(f"{label}: storage {proj.get('why', proj)}; {run['plan'].get('budget_source', '')}")
    return "\n".join(lines)


def main() -> None:
    """Parse the flags; a child run (``--child``) or the whole benchmark."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--src", type=Path, action="append", help="Gradian src folder(s) to attribute with")
    ap.add_argument("--label", action="append", help="a name per --src (default: the folder)")
    ap.add_argument(
        "--args", action="append", help="extra attribute flags per --src, written --args=--one-pass (--args= for none)"
    )
    ap.add_argument(
        "--reuse-train",
        action="store_true",
        help="keep OUT/adapter and OUT/train.report.json from an earlier run instead of training again (the "
        "report says so)",
    )
    ap.add_argument(
        "--keep-caches",
        action="store_true",
        help="keep each arm's index cache (OUT/cache-N); by default it is removed once the arm is done, so every "
        "arm's run plan sees the same free disk and chooses the same storage",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--report", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        _child(a.child, a.rest, a.report)
        return
    if a.world is None or a.out is None:
        ap.error("--world and --out are required")
    srcs = a.src or [HERE.parent.parent / "src"]
    labels = a.label or [str(s) for s in srcs]
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    world = a.world.resolve()
    base = json.loads((world / "world.json").read_text())["base"]
    adapter = out / "adapter"
    runs: dict[str, dict] = {}
    train_args = ["train", "--base", base, "--data", str(world / "train.jsonl"), "--config", str(world / "train.yaml")]
    train_args += ["--eval-data", str(world / "valid.jsonl"), "--out", str(adapter), "--overwrite"]
    if a.reuse_train:  # the training of an earlier run of this benchmark, same OUT (its adapter and its stages)
        if not (adapter / "adapter_config.json").is_file() or not (out / "train.report.json").is_file():
            ap.error(f"--reuse-train needs {adapter} and {out / 'train.report.json'} from an earlier run")
        runs["train"] = json.loads((out / "train.report.json").read_text())
        runs["train"]["reused"] = True
    else:
        runs["train"] = _run_child(srcs[-1], "train", train_args, out / "train.report.json")
    rows, tokens, epochs = _training_counts(srcs[-1], world)
    st = runs["train"]["stages"].setdefault("train", {"wall_s": runs["train"]["wall_s"], "peak_rss": 0})
    st.update(forward=round(rows * epochs), backward=round(rows * epochs), tokens=round(tokens * epochs))
    extras = a.args or [""] * len(srcs)
    for src, label, extra in zip(srcs, labels, extras):
        cache = out / f"cache-{len(runs)}"  # a fresh cache each: every index is built
        os.environ["GRADIAN_CACHE"] = str(cache)
        args = ["attribute", "--base", base, "--adapter", str(adapter), "--data", str(world / "train.jsonl")]
        args += ["--eval", str(world / "eval.jsonl"), "--out", str(out / f"run-{len(runs)}"), *extra.split()]
        runs[label] = _run_child(src.resolve(), "attribute", args, out / f"attribute-{len(runs)}.report.json")
        run = json.loads((out / f"run-{len(runs) - 1}" / "run.json").read_text())
        runs[label]["index_ids"] = [
            {u: v["id"] for u, v in c.get("index", {}).items()} for c in run["attribution"]["trajectory"]["checkpoints"]
        ]
        runs[label]["plan"] = {k: v for k, v in run["manifest"].get("plan", {}).items() if k != "indexes"}
        if not a.keep_caches:  # the next arm's plan must see the same free disk as this one did
            shutil.rmtree(cache, ignore_errors=True)
    result = {"world": str(world), "runs": runs, "threads": 1}
    (out / "verdict_cost.json").write_text(json.dumps(result, indent=1))
    print(table(result))
    ids = [r["index_ids"] for k, r in runs.items() if k != "train"]
    if len(ids) > 1:
        print("\nindex ids identical across the attribute runs:", all(i == ids[0] for i in ids))


if __name__ == "__main__":
    main()
