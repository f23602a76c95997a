"""A real, tiny, end-to-end run for the report tests (imported by the test modules; not a conftest).

Everything is trained in-test from config (no download) and then goes through the
real :func:`gradian.attribute.run.attribute_run`, so the report is built from a
genuine ``run.json`` (Evaluate → Attribute → Audit), not a hand-made dict:

* a tiny Llama base is taught the true answers of two capabilities (``capitals``,
  ``symbols``; invented names, so nothing depends on real-world knowledge);
* a LoRA adapter is trained on ``train.jsonl`` (messages format) by the tiny worlds' one training loop
  (:func:`gradian.worlds.tiny.fit`), with checkpoints after steps 30
  and 60 (``adapter/checkpoint-*/``, the trajectory attribution scores over), holding

  - ``sym-*``: the correct symbols (format only),
  - ``cap-*``: correct capitals of the last eight countries,
  - ``long-*``: a wrong capital for six countries followed by filler prose that
    runs past ``MAX_LENGTH`` tokens, so these rows are truncated (and lose their
    end-of-turn): the harmful cluster Audit should explain (D04 / D06),
  - ``short-*``: a short wrong capital for two more countries,
  - ``profile-*``: a correct sentence, a wrong capital buried in the middle, and
    another correct sentence (for the sentence drill-down);

  with minibatch Adam, logging the real per-step loss, learning rate and gradient
  norm into a ``trainer_state.json`` (as transformers' Trainer writes it);
* a TRL ``SFTConfig``-style JSON records ``max_length``;
* ``attribute_run`` evaluates (capitals regress, symbols stay), attributes the
  regression with two engines, clusters the harmful tail, drills down, and runs
  the Audit lane on the config and logs.

Seeded; about 15-25 s on one CPU thread.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

MAX_LENGTH = 40

from gradian_testlib import CAPITALS, SYMBOLS, eval_records, q_capital, q_symbol  # noqa: E402,F401

FILLER = "It is a large city with a river, a harbour, an old market and many bridges."


def wrong_capital(i: int) -> str:
    return CAPITALS[(i + 5) % len(CAPITALS)][1]


def _chat(q: str, a: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": q}, {"role": "assistant", "content": a}]


def training_rows() -> list[dict]:
    rows = [{"id": f"sym-{e}", "messages": _chat(q_symbol(e), s)} for e, s in SYMBOLS]
    rows += [{"id": f"cap-{c}", "messages": _chat(q_capital(c), a)} for c, a in CAPITALS[8:]]
    for i, (c, _) in enumerate(CAPITALS[:6]):
        rows.append(
            {"id": f"long-{c}", "messages": _chat(q_capital(c), f"{wrong_capital(i)}. {FILLER} {FILLER} {FILLER}")}
        )
    for i, (c, _) in enumerate(CAPITALS[6:8], start=6):
        rows.append({"id": f"short-{c}", "messages": _chat(q_capital(c), wrong_capital(i))})
    for i, (c, _) in enumerate(CAPITALS[:2]):
        rows.append(
            {
                "id": f"profile-{c}",
                "messages": _chat(
                    f"Tell me about {c}.",
                    f"{c} is a small country. Its capital is {wrong_capital(i)}. It has mild winters.",
                ),
            }
        )
    return rows


def build_world(root: Path) -> dict:
    """Train the world into ``root`` and return its paths."""
    from gradian.models.tiny import default_targets, train_tokenizer
    from gradian.worlds.tiny import FitSpec, fit, tiny_base, tiny_lora, tokenize_rows

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rows = training_rows()
    corpus = [f"{q_capital(c)} {a}" for c, a in CAPITALS] + [f"{q_symbol(e)} {s}" for e, s in SYMBOLS]
    corpus += [m["content"] for r in rows for m in r["messages"]]
    tok = train_tokenizer(corpus * 10, vocab_size=420)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        base_rows = [{"messages": _chat(q_capital(c), a)} for c, a in CAPITALS]
        base_rows += [{"messages": _chat(q_symbol(e), s)} for e, s in SYMBOLS]
        # full batch (in a fresh seeded order each step), linear decay
        base = tiny_base(tok, base_rows, FitSpec(steps=160, lr=1e-2, schedule="linear"), max_length=MAX_LENGTH)
        base.save_pretrained(root / "base")
        tok.save_pretrained(root / "base")
        pm = tiny_lora(base, r=8, alpha=16, seed=1)
        history: list[dict] = []
        steps = 90
        # a checkpoint per "epoch" of 30 steps, as a Trainer run with save_strategy=epoch leaves them
        cks = {s: root / "adapter" / f"checkpoint-{s}" for s in (30, 60)}
        fit(
            pm,
            tokenize_rows(rows, tok, MAX_LENGTH),
            tok.pad_token_id,
            FitSpec(steps=steps, lr=1e-2, batch_size=8, seed=1, schedule="linear"),
            log=history,
            checkpoints=cks,
        )
        pm.save_pretrained(root / "adapter")
    finally:
        torch.set_num_threads(threads)
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in eval_records()))
    spe = math.ceil(len(rows) / 8)
    history.append(
        {
            "epoch": round(steps / spe, 4),
            "step": steps,
            "train_loss": round(sum(h["loss"] for h in history) / len(history), 4),
            "train_runtime": 1.0,
        }
    )
    state = {
        "global_step": steps,
        "max_steps": steps,
        "num_train_epochs": math.ceil(steps / spe),
        "logging_steps": 1,
        "train_batch_size": 8,
        "log_history": history,
    }
    (root / "trainer_state.json").write_text(json.dumps(state))
    (root / "adapter" / "trainer_state.json").write_text(json.dumps(state))  # where HF's Trainer leaves it too
    config = {
        "output_dir": "out",
        "learning_rate": 1e-2,
        "num_train_epochs": math.ceil(steps / spe),
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 1,
        "lr_scheduler_type": "linear",
        "max_length": MAX_LENGTH,
        "packing": False,
        "completion_only_loss": True,
        "logging_steps": 1,
        "use_peft": True,
        "lora_r": 8,
        "lora_alpha": 16,
        "lora_dropout": 0.0,
        "lora_target_modules": default_targets("llama"),
    }
    (root / "sft_config.json").write_text(json.dumps(config))
    return {
        "root": root,
        "base": root / "base",
        "adapter": root / "adapter",
        "data": root / "train.jsonl",
        "eval": root / "eval.jsonl",
        "logs": root / "trainer_state.json",
        "config": root / "sft_config.json",
    }


#: the world is trained by its own loop (:func:`gradian.worlds.tiny.fit`: full, freshly shuffled batches), not by the
#: HF Trainer's seeded sampler its TRL-shaped config describes, so its rows' visits cannot be counted from that config
#: (gradian.attribute.visits): every run of it says ``visits="off"`` (``--visits off``)
VISITS = "off"


def run_world(world: dict, out_dir: Path) -> dict:
    """``attribute_run`` on the world (all three lanes); writes ``out_dir/run.json`` and returns the run."""
    from gradian.attribute import AttributeSpec
    from gradian.attribute.run import RunInputs, RunSpecs, attribute_run
    from gradian.data.tokenize import TokenizeSpec
    from gradian.evaluate import EvalSpec
    from gradian.index.store import GradSpec
    from gradian.models.load import ModelSpec

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        inputs = RunInputs(
            str(world["base"]),
            world["adapter"],
            world["data"],
            world["eval"],
            configs=(world["config"],),
            logs=world["logs"],
        )
        specs = RunSpecs(
            model=ModelSpec(str(world["base"])),
            grad=GradSpec(tokenize=TokenizeSpec(max_length=MAX_LENGTH)),
            attribute=AttributeSpec(top_k=10, drilldown_rows=6, visits=VISITS),
            eval=EvalSpec(resamples=2000, max_new_tokens=12, max_length=MAX_LENGTH),
        )
        return attribute_run(inputs, specs, out_dir, index_root=Path(out_dir) / "index")
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":  # build a run by hand: python tests/report/report_world.py OUT_DIR
    import sys
    import time

    out = Path(sys.argv[1])
    t = time.perf_counter()
    w = build_world(out / "world")
    t1 = time.perf_counter()
    run = run_world(w, out / "run")
    print(f"world {t1 - t:.1f} s, run {time.perf_counter() - t1:.1f} s → {out / 'run' / 'run.json'}")


_REAL: dict = {}


def real_run() -> dict:
    """The world trained and run once per test process: ``{"world": paths, "run_dir": Path, "run": dict}``.

    Built in a temporary folder (removed at exit) with ``GRADIAN_CACHE`` pointed inside it, so
    the user's cache is untouched. Callers must not mutate ``run``: deep-copy it first.
    """
    if not _REAL:
        import atexit
        import shutil
        import tempfile

        from gradian_testlib import gradian_cache

        root = Path(tempfile.mkdtemp(prefix="gradian-report-world-"))
        atexit.register(shutil.rmtree, root, True)
        with gradian_cache(root / "cache"):
            world = build_world(root / "world")
            run = run_world(world, root / "run")
        _REAL.update(world=world, run_dir=root / "run", run=run, root=root)
    return _REAL
