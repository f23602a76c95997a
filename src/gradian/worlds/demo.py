"""The worked example end to end: world → train → Evaluate/Attribute/Audit → report → scorecard.

:func:`run_demo` is what ``gradian demo`` (and ``make demo``) runs: by default the quick SmolLM2
profile, ``--full`` the worked example (:mod:`gradian.worlds.profiles`). Every
expensive step is cached under ``<cache>/demo/<kind>-seed<seed>/`` (``<kind>-behaviour-seed<seed>/``
for the behaviour world, ``<kind>-quick-seed<seed>/`` for the quick profile, :meth:`DemoSpec.cache_folder`): the
world's base probe, the trained adapter (keyed by the training data and
config), and the gradient index (content-addressed). A second run recomputes
only evaluation, scoring and rendering.

The scorecard is computed honestly from the run's own output and the world's
ground truth (:mod:`gradian.worlds.scorecard`). Sentence localisation is
measured on *every* buried culprit whose target item the tuned model lost, with
the query of that single item (the drill-down of
:mod:`gradian.attribute.drilldown`), not only on the rows that happened to rank
in the top few.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from gradian.paths import cache_dir
from gradian.util import atomic_write_json, sha256_json


@dataclass(frozen=True)
class DemoSpec:
    """The demo's knobs (they land in ``demo.json``).

    Attributes:
        kind: ``"smollm2"`` (the real worked example) or ``"tiny"`` (seconds; tests).
        seed: the world seed.
        project_dim: JL numbers kept per LoRA block in the index (0 = exact). The
            SmolLM2 adapter (r=16 on all 7 linears of 30 layers) has 4.9 M LoRA
            numbers per row; 512 per block keeps 215 k.
        null: also train and evaluate the null variant (same rows, true capitals).
        faults: plant the mechanical faults, so Audit has something to join.
        regression: the world's regression (:class:`gradian.worlds.WorldSpec`): ``"facts"`` (wrong
            capitals, the default) or ``"behaviour"`` (verbose answers to terse instructions; smollm2).
        profile: ``"quick"`` (``make demo``: a smaller SmolLM2 facts world, 2 epochs) or ``"full"``
            (the worked example); ``None``: quick for the SmolLM2 facts world, full otherwise
            (:mod:`gradian.worlds.profiles`).
    """

    kind: str = "smollm2"
    seed: int = 0
    project_dim: int = 512
    null: bool = False
    faults: bool = False
    regression: str = "facts"
    profile: str | None = None

    def resolved_profile(self) -> str:
        """``profile``, or the world's default one (:func:`gradian.worlds.profiles.default_profile`)."""
        from gradian.worlds.profiles import default_profile

        return self.profile if self.profile is not None else default_profile(self.kind, self.regression)

    def cache_folder(self) -> Path:
        """Where this demo's worlds and adapters are cached:
        ``<cache>/demo/<kind>[-<regression>][-quick]-seed<seed>/`` (the full facts world keeps its
        historical folder name).
        """
        tag = self.kind if self.regression == "facts" else f"{self.kind}-{self.regression}"
        if self.resolved_profile() == "quick":
            tag += "-quick"
        return cache_dir() / "demo" / f"{tag}-seed{self.seed}"

    def to_dict(self) -> dict[str, Any]:
        """The spec as written to ``demo.json`` (the profile resolved)."""
        return {**self.__dict__, "profile": self.resolved_profile()}


Say = Callable[[str], None]


def _train_cached(world, folder: Path, say: Say, progress: bool) -> Path:
    """Train the world's adapter once per (data, config); reuse it afterwards."""
    from gradian.train import train_lora
    from gradian.trainconfig import spec_from_config

    key = sha256_json(
        {"train": world.train.read_text(), "config": world.train_config.read_text(), "base": world.base_identity}
    )[:16]
    adapter = folder / f"adapter-{key}"
    if (adapter / "adapter_model.safetensors").exists() and (adapter / "trainer_state.json").exists():
        say(f"adapter: cached ({adapter})")
        return adapter
    say(f"training the LoRA adapter on {world.train.name} (cached afterwards)")
    t = time.perf_counter()
    train_lora(
        str(world.base),
        world.train,
        adapter,
        spec_from_config(world.train_config),
        eval_data=world.valid,
        overwrite=True,
        progress=progress,
    )
    say(f"trained in {time.perf_counter() - t:.0f} s")
    return adapter


def localise_buried(run: dict[str, Any], truth: dict[str, Any], every: bool = False) -> list[dict[str, Any]]:
    """Every buried culprit whose target item was queried (lost), with the sentence the verdict blames in it.

    Read off the run itself: with span-aware ranking (the default) every row's most harmful sentence
    is in ``row_sentences``, so no extra pass is needed and every culprit is judged, not only the
    rows that ranked near the top. Empty when the run ranked whole rows. ``every``: all buried culprits,
    queried or not (a benchmark's denominator that does not move with the query set).
    """
    att = run.get("attribution")
    if not att:
        return []
    pos = {rid: j for j, rid in enumerate(att["train_ids"])}
    out = []
    for cap in att["capabilities"]:
        sents = cap.get("row_sentences")
        if not sents:
            continue
        lost = {q["item_id"] for q in cap["queries"]}
        for c in truth.get("culprits", []):
            if c["kind"] != "buried" or (c.get("eval_id") not in lost and not every) or sents[pos[c["id"]]] is None:
                continue
            a, b = sents[pos[c["id"]]]
            out.append(
                {
                    "id": c["id"],
                    "item_id": c["eval_id"],
                    "capability": cap["capability"],
                    "top_sentence": {"char_start": a, "char_end": b},
                    "truth": {"char_start": c["char_start"], "char_end": c["char_end"]},
                }
            )
    return out


def run_demo(
    spec: DemoSpec,
    out: str | Path,
    say: Say = print,
    progress: bool = False,
    progress_bar: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """Run the worked example; write ``out/{poisoned,null}/run.json``, reports and ``out/scorecard.json``.

    Args:
        say: one line per step (and per index build, from ``attribute_run``).
        progress: training's progress bar or lines.
        progress_bar: makes the attribute stage's progress display (a context manager with ``callback()``,
            :func:`gradian.commands._common.progress_bar`: a bar in a terminal, a line per stage in a log);
            None: no progress for that stage.

    Returns:
        the demo summary (also written as ``out/demo.json``).
    """
    from gradian.attribute.run import RunInputs, RunSpecs, attribute_run
    from gradian.data.tokenize import TokenizeSpec
    from gradian.finetune import load_finetune
    from gradian.gradients.projection import ProjectionSpec
    from gradian.index.store import GradSpec
    from gradian.models.load import ModelSpec
    from gradian.report import render, report_for_run
    from gradian.trainconfig import load_train_config
    from gradian.util import atomic_write_text
    from gradian.worlds import build_world
    from gradian.worlds.profiles import check_profile, demo_world
    from gradian.worlds.scorecard import scorecard

    profile = spec.resolved_profile()
    check_profile(profile, spec.kind, spec.regression)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    folder = spec.cache_folder()
    t0 = time.perf_counter()
    timing: dict[str, float] = {}
    summary: dict[str, Any] = {"spec": spec.to_dict(), "runs": {}}
    variants = ["poisoned"] + (["null"] if spec.null else [])
    for variant in variants:
        t = time.perf_counter()
        what = spec.kind if spec.regression == "facts" else f"{spec.kind} {spec.regression}"
        say(f"[{variant}] building the {what} world ({profile} profile, seed {spec.seed})")
        wspec, tspec = demo_world(
            profile, spec.kind, variant, spec.seed, faults=spec.faults, regression=spec.regression
        )
        world = build_world(wspec, folder / f"world-{variant}", train_spec=tspec)
        timing[f"{variant}.world"] = time.perf_counter() - t
        t = time.perf_counter()
        adapter = _train_cached(world, folder, say, progress)
        timing[f"{variant}.train"] = time.perf_counter() - t

        cfg = load_train_config(world.train_config)
        grad = GradSpec(
            tokenize=TokenizeSpec(max_length=int(cfg.get("max_length", 1024)), add_eos=bool(cfg.get("add_eos", True))),
            projection=ProjectionSpec(dim=spec.project_dim, seed=spec.seed),
        )
        specs = RunSpecs(model=ModelSpec(str(world.base)), grad=grad, seed=spec.seed)
        configs = [p for p in (adapter / "training_config.yaml", world.train_config) if p.exists()][:1]
        inputs = RunInputs(
            str(world.base),
            adapter,
            world.train,
            world.eval,
            configs=tuple(configs),
            logs=adapter / "trainer_state.json",
        )
        run_dir = out / variant
        t = time.perf_counter()
        say(f"[{variant}] gradian attribute: Evaluate → Attribute → Audit")
        ft = load_finetune(specs.model, adapter)
        with progress_bar() if progress_bar else contextlib.nullcontext() as pb:
            run = attribute_run(inputs, specs, run_dir, ft=ft, progress=pb.callback() if pb else None, say=say)
        timing[f"{variant}.attribute"] = time.perf_counter() - t
        truth = world.load_ground_truth()
        shutil.copyfile(world.ground_truth, run_dir / "ground_truth.json")
        loc = None
        if variant == "poisoned" and run.get("attribution"):
            t = time.perf_counter()
            say(f"[{variant}] sentence localisation of every buried culprit (read off the run)")
            loc = localise_buried(run, truth)
            atomic_write_json(run_dir / "localisation.json", loc)
            timing[f"{variant}.localise"] = time.perf_counter() - t
        card = scorecard(run, truth, loc)
        atomic_write_json(run_dir / "scorecard.json", card)
        report = report_for_run(run_dir)
        atomic_write_text(run_dir / "report.html", render(report, "html"))
        atomic_write_text(run_dir / "report.md", render(report, "md"))
        summary["runs"][variant] = {
            "run_dir": str(run_dir),
            "report": str(run_dir / "report.html"),
            "evaluation": [
                {
                    k: c[k]
                    for k in ("name", "verdict", "reference_score", "tuned_score", "delta", "ci_low", "ci_high")
                    if k in c
                }
                for c in run["evaluation"]["capabilities"]
            ],
            "groups": group_accuracy(run, truth),
            "scorecard": card,
            "stopped": run.get("stopped"),
        }
        del ft
    timing["total"] = time.perf_counter() - t0
    summary["timing"] = {k: round(v, 1) for k, v in timing.items()}
    atomic_write_json(out / "demo.json", summary)
    return summary


def group_accuracy(run: dict[str, Any], truth: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Reference and tuned accuracy per eval group (direct, buried, untouched, base_fail)."""
    groups = truth.get("eval_groups", {})
    acc: dict[str, dict[str, list[float]]] = {}
    for it in run["evaluation"]["items"]:
        g = groups.get(it["id"])
        if g is None:
            continue
        a = acc.setdefault(g, {"reference": [], "tuned": []})
        a["reference"].append(float(it["reference"]["score"]))
        a["tuned"].append(float(it["tuned"]["score"]))
    return {
        g: {
            "n": len(v["tuned"]),
            "reference": sum(v["reference"]) / len(v["reference"]),
            "tuned": sum(v["tuned"]) / len(v["tuned"]),
        }
        for g, v in sorted(acc.items())
    }
