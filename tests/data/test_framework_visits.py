"""Which rows each step of torchtune 0.6.1's LoRA recipe, LLaMA-Factory 0.9.5 and axolotl 0.19 trained, held against
their own loops.

``framework_run.py``'s ``torchtune_steps`` runs ``lora_finetune_single_device`` as ``tune run`` builds it (its
sampler, DataLoader, gradient accumulation and epoch loop unchanged) and records the rows of every micro-batch, grouped
by the optimizer step that took them, and when each epoch's checkpoint is saved. Gradian must read the same from the
config alone (:func:`gradian.audit.hf_order.torchtune_rows_read`) and count the same visits per ``epoch_N`` checkpoint
(:mod:`gradian.attribute.visits`): the rows its DataLoader drops (``drop_last``), the micro-batches an epoch leaves
that join the next epoch's first step, and the last epoch's that are never stepped. ``llamafactory_steps`` and
``axolotl_steps`` train with LLaMA-Factory's and axolotl's own trainers and record the same; for axolotl Gradian also
rebuilds the train set it sampled from (its seeded shuffle, the rows it drops for their length, its ``val_set_size``
split: :func:`gradian.audit.hf_order.axolotl_train_rows`). Needs ``make frameworks``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gradian_testlib import padded_rows

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_frameworks_real import (  # noqa: E402
    FW,
    RUNNER,
    _tiny_qwen2,
    _torchtune_run_config,
    framework_env,
    make_world,
    torchtune_tokenizer,
)

if not (FW / "torchtune").is_dir():
    pytest.skip(f"{FW / 'torchtune'} is not installed (make frameworks)", allow_module_level=True)

N = 15
CASES = {
    # 7 micro-batches an epoch, a step every 2: one micro-batch carried into epoch 1's first step, one never stepped;
    # the row the DataLoader drops each epoch differs by epoch
    "shuffled, accumulation 2": {"shuffle": True, "batch_size": 2, "gradient_accumulation_steps": 2},
    # in order, batches of 4: the same last 3 rows dropped in both epochs, never trained
    "in order, drop_last": {"shuffle": False, "batch_size": 4},
    # max_steps_per_epoch ends each epoch after 3 of its 7 steps
    "shuffled, max_steps_per_epoch 3": {"shuffle": True, "batch_size": 2, "max_steps_per_epoch": 3},
}


def _chat_rows(path: Path) -> Path:
    """``N`` chat rows, each with its own number in both turns, written to ``path``."""
    rows = [
        {"id": f"r{i}", "messages": [{"role": "user", "content": f"Which city is number {i}?"},
                                     {"role": "assistant", "content": f"City {i} is Paris {i}."}]}
        for i in range(N)
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _run_steps(
    framework: str, configs: dict[str, tuple[Path, dict]], run_key: str, data: Path, path: str | None = None
) -> dict:
    """Run ``framework_run.py``'s ``<framework>-steps`` on each ``{name: (case folder, config)}`` at once (one process
    each) and return ``{name: {"config", "run", "data", "recorded"}}``; ``run_key``: the config's output folder key;
    ``path``: the framework's ``PYTHONPATH`` (its folder under ``.venv/frameworks`` by default)."""
    out, procs = {}, []
    for name, (case_dir, cfg) in configs.items():
        config = case_dir / f"{framework}.yaml"
        config.write_text(yaml.safe_dump(cfg))
        job = {"name": name, "framework": f"{framework}-steps", "config": str(config),
               "steps_out": str(case_dir / "steps.json")}  # fmt: skip
        (case_dir / "case.json").write_text(json.dumps([job]))
        cmd = [sys.executable, str(RUNNER), str(case_dir / "case.json"), str(case_dir / "result.json")]
        env = {**framework_env(path or str(FW / framework)), "OMP_NUM_THREADS": "1"}
        procs.append((name, case_dir, subprocess.Popen(cmd, env=env, cwd=case_dir, stdout=subprocess.PIPE,
                                                       stderr=subprocess.STDOUT)))  # fmt: skip
        out[name] = {"config": config, "run": Path(cfg[run_key]), "data": data, "base": cfg.get("base_model")}
    for name, case_dir, p in procs:
        log = p.communicate(timeout=900)[0].decode(errors="replace")
        result = json.loads((case_dir / "result.json").read_text()).get(name, {})
        assert "rows" in result, f"{framework} did not run {name!r}: {result.get('error') or log[-3000:]}"
        out[name]["recorded"] = json.loads((case_dir / "steps.json").read_text())
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tok) -> dict:
    root = tmp_path_factory.mktemp("framework_visits")
    world = make_world(root / "world", tok)
    base = _tiny_qwen2(world, tok)
    data = _chat_rows(root / "chat.jsonl")
    configs = {}
    for i, (name, extra) in enumerate(CASES.items()):
        case_dir = root / f"case{i}"
        case_dir.mkdir()
        cfg = _torchtune_run_config(world, case_dir / "run", "qwen2", epochs=2, base=base.name)
        cfg.update(extra)
        cfg["tokenizer"] = torchtune_tokenizer(world, "qwen2", base, 256)
        cfg["dataset"] = {
            "_component_": "torchtune.datasets.chat_dataset", "source": "json", "data_files": str(data),
            "split": "train", "conversation_column": "messages", "conversation_style": "openai", "packed": False,
        }  # fmt: skip
        configs[name] = (case_dir, cfg)
    return _run_steps("torchtune", configs, "output_dir", data)


def _as_rows(rec: dict, padded: list[list[int]]) -> list[int]:
    """The dataset rows of padded token sequences (each row's tokens, then only padding)."""
    return padded_rows(padded, rec["rows"], rec["pad"])


@pytest.mark.parametrize("name", list(CASES))
def test_gradian_reads_the_rows_each_torchtune_step_took(runs, name):
    import numpy as np

    from gradian.attribute.trajectory import resolve_trajectory
    from gradian.attribute.visits import with_visits
    from gradian.audit.config import load_config
    from gradian.audit.hf_order import torchtune_rows_read

    run = runs[name]
    rec = run["recorded"]
    assert len(rec["rows"]) == N
    steps = [_as_rows(rec, s) for s in rec["steps"]]
    config = load_config([str(run["config"])])
    extra = CASES[name]
    acc = extra.get("gradient_accumulation_steps", 1)
    ours = torchtune_rows_read(
        N, shuffle=extra["shuffle"], batch=extra["batch_size"], accumulation=acc, epochs=2,
        max_steps_per_epoch=extra.get("max_steps_per_epoch"),
    )  # fmt: skip
    assert ours == steps  # the same rows, in the same order, step by step
    assert (config.shuffle, config.micro_batch_size) == (extra["shuffle"], extra["batch_size"])

    # the visits per epoch checkpoint, from the run folder's epoch_1 adapter and the config, as Attribute counts them
    traj = with_visits(resolve_trajectory(run["run"] / "epoch_1", "auto"), config, N)
    assert traj.visits is not None, traj.visits_rule
    want = np.zeros((2, N), dtype=np.int64)
    for k, step_rows in enumerate(steps):
        np.add.at(want[0 if k < rec["saves"][0] else 1], step_rows, 1)
    assert traj.visits.counts.tolist() == want.tolist()
    never = sorted(set(range(N)) - {r for s in steps for r in s})
    assert traj.visits.never.tolist() == never
    if name == "in order, drop_last":
        assert never == [12, 13, 14] and _as_rows(rec, rec["left"]) == []
    # Audit's C04 names the same rows from the config and the data file
    from gradian.audit import diagnose

    hits = [f for f in diagnose(configs=[run["config"]], data=run["data"], select=["C04"]).by_id("C04")
            if "torchtune's recipe never trained" in f.message]  # fmt: skip
    assert [h.row_ids for h in hits] == ([[f"r{j}" for j in never]] if never else [])
    if name == "shuffled, accumulation 2":  # the last epoch's leftover micro-batch: read, never stepped
        assert len(_as_rows(rec, rec["left"])) == 2 and len(steps[rec["saves"][0]]) == 6


LF_CASES = {
    # the sampler over the first 11 rows (max_samples), seeded 3; rows 11-14 never given to the trainer
    "LLaMA-Factory shuffled, max_samples 11": {
        "max_samples": 11, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "num_train_epochs": 2,
        "seed": 3,
    },
    # disable_shuffling: the rows in order, and max_steps 2 of 3 rows stops inside the first epoch
    "LLaMA-Factory in order, max_steps 2": {
        "disable_shuffling": True, "per_device_train_batch_size": 3, "max_steps": 2,
    },
}  # fmt: skip


def _tiny_base_and_rows(tmp_path_factory, tok, framework: str, name: str) -> tuple[Path, Path]:
    """``(root, data)``: a folder holding a tiny Llama base (``root / "base"``, with ``tok``) and the ``N`` chat rows;
    skips when ``.venv/frameworks/<framework>`` is not installed."""
    from gradian.models.tiny import tiny_model

    if not (FW / framework).is_dir():
        pytest.skip(f"{FW / framework} is not installed (make frameworks)")
    root = tmp_path_factory.mktemp(name)
    tiny_model(tok, "llama").save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    return root, _chat_rows(root / "chat.jsonl")


@pytest.fixture(scope="module")
def lf_runs(tmp_path_factory, tok) -> dict:
    root, data = _tiny_base_and_rows(tmp_path_factory, tok, "llamafactory", "framework_visits_lf")
    tags = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
    info = {"file_name": str(data), "formatting": "sharegpt", "columns": {"messages": "messages"}, "tags": tags}
    (root / "dataset_info.json").write_text(json.dumps({"visits": info}))
    configs = {}
    for i, (name, extra) in enumerate(LF_CASES.items()):
        case_dir = root / f"case{i}"
        case_dir.mkdir()
        configs[name] = (case_dir, {
            "model_name_or_path": str(root / "base"), "stage": "sft", "do_train": True, "finetuning_type": "lora",
            "lora_target": "all", "lora_rank": 4, "lora_alpha": 8, "dataset": "visits", "dataset_dir": str(root),
            "template": "qwen", "cutoff_len": 256, "output_dir": str(case_dir / "out"), "overwrite_cache": True,
            "report_to": "none", "save_strategy": "no", "logging_steps": 1, "learning_rate": 1e-3,
            "disable_gradient_checkpointing": True, **extra,
        })  # fmt: skip
    return _run_steps("llamafactory", configs, "output_dir", data)


def _one_checkpoint_counts(traj, steps: list[list[int]]) -> list[int]:
    """Assert that ``traj``'s one checkpoint counts each row as often as the recorded ``steps`` read it; return the
    rows never read."""
    want = [0] * N
    for step_rows in steps:
        for r in step_rows:
            want[r] += 1
    assert traj.visits.counts.tolist() == [want]
    return [j for j in range(N) if want[j] == 0]


@pytest.mark.parametrize("name", list(LF_CASES))
def test_gradian_reads_the_rows_each_llamafactory_step_took(lf_runs, name):
    from gradian.attribute.trajectory import resolve_trajectory
    from gradian.attribute.visits import run_rows_read, with_visits
    from gradian.audit import diagnose
    from gradian.audit.config import load_config

    run = lf_runs[name]
    rec = run["recorded"]
    given = LF_CASES[name].get("max_samples", N)
    assert len(rec["rows"]) == given  # LLaMA-Factory's train set: the file's first max_samples rows
    steps = [_as_rows(rec, s) for s in rec["steps"]]
    config = load_config([str(run["config"])])
    assert run_rows_read(config, N)[0] == steps  # the same rows, in the same order, step by step
    traj = with_visits(resolve_trajectory(run["run"], "auto"), config, N)
    assert traj.visits is not None, traj.visits_rule
    assert [c.step for c in traj.checkpoints] == [len(steps)]  # the final adapter, at the trainer's global_step
    never = _one_checkpoint_counts(traj, steps)
    assert traj.visits.never.tolist() == never and set(range(given, N)) <= set(never)
    if name.endswith("max_steps 2"):
        assert steps == [[0, 1, 2], [3, 4, 5]]  # in order
    # Audit's C04 names the same rows: max_samples' cut, and the rows max_steps never reached
    found = diagnose(configs=[run["config"]], data=run["data"], select=["C04"]).by_id("C04")
    named = sorted({i for f in found if "never trained" in f.message for i in f.row_ids}, key=lambda x: int(x[1:]))
    assert named == [f"r{j}" for j in never]


#: axolotl 0.19 unpacked: its train set is the file's rows shuffled (``shuffle_merged_datasets``, seeded ``seed``),
#: less the rows out of ``[min_sample_len, sequence_len]`` (row 1 is too long) and the last ``val_set_size`` rows;
#: its trainer then samples that set with the HF Trainer's seeded sampler (``seed``, else 42)
AX_CASES = {
    # shuffled with seed 7, then sampled with seed 7; max_steps 3 of 2 x 2 rows stops inside the first epoch
    "axolotl shuffled, seed 7, max_steps 3": {
        "seed": 7, "micro_batch_size": 2, "gradient_accumulation_steps": 2, "max_steps": 3,
    },
    # the file's order, no seed (the sampler's is TrainingArguments' 42), 3 of the 14 kept rows held out, 2 epochs
    "axolotl in order, val_set_size 0.2, 2 epochs": {
        "shuffle_merged_datasets": False, "val_set_size": 0.2, "micro_batch_size": 3, "num_epochs": 2,
    },
    # curriculum_sampling: no shuffle and a sequential sampler (the long row 1 skipped)
    "axolotl curriculum_sampling, max_steps 2": {"curriculum_sampling": True, "micro_batch_size": 2, "max_steps": 2},
}  # fmt: skip
AX_LONG = 1  # the row axolotl drops for its length


@pytest.fixture(scope="module")
def ax_runs(tmp_path_factory, tok) -> dict:
    root, data = _tiny_base_and_rows(tmp_path_factory, tok, "axolotl-train", "framework_visits_axolotl")
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    rows[AX_LONG]["messages"][1]["content"] = " ".join(f"Paris {k}." for k in range(60))  # far over sequence_len
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    configs = {}
    for i, (name, extra) in enumerate(AX_CASES.items()):
        case_dir = root / f"case{i}"
        case_dir.mkdir()
        configs[name] = (case_dir, {
            "base_model": str(root / "base"), "adapter": "lora", "lora_r": 4, "lora_alpha": 8,
            "lora_target_linear": True, "sequence_len": 96, "sample_packing": False, "num_epochs": 1,
            "learning_rate": 1e-3, "optimizer": "adamw_torch", "val_set_size": 0, "bf16": False, "fp16": False,
            "tf32": False, "dataset_num_proc": 1, "lora_mlp_kernel": False, "lora_qkv_kernel": False,
            "lora_o_kernel": False, "save_strategy": "no", "logging_steps": 1, "output_dir": str(case_dir / "out"),
            "dataset_prepared_path": str(case_dir / "prepared"),
            "datasets": [{"path": str(data), "ds_type": "json", "type": "chat_template"}], **extra,
        })  # fmt: skip
    return _run_steps(
        "axolotl", configs, "output_dir", data, path=f"{FW / 'axolotl'}{os.pathsep}{FW / 'axolotl-train'}"
    )


def _pipeline_items(run: dict) -> list:
    """The training rows as ``gradian attribute`` tokenises them for this run (its setup read from the run's config:
    axolotl's rule, ``sequence_len``, its drop of long rows)."""
    from transformers import AutoTokenizer

    from gradian.data.formats import load_examples
    from gradian.data.setup import setup_from_files
    from gradian.finetune import tokenize_training_set
    from gradian.index.spec import GradSpec

    setup = setup_from_files([run["config"]], run["data"])
    tok = AutoTokenizer.from_pretrained(run["base"])
    return list(tokenize_training_set(load_examples(run["data"]), tok, GradSpec(tokenize=setup.tokenize_spec()),
                                      run["data"]))  # fmt: skip


@pytest.mark.parametrize("name", list(AX_CASES))
def test_gradian_reads_the_rows_each_axolotl_step_took(ax_runs, name):
    from gradian.attribute.run import counted_trajectory
    from gradian.attribute.spec import AttributeSpec
    from gradian.attribute.trajectory import resolve_trajectory
    from gradian.attribute.visits import run_rows_read, with_visits
    from gradian.audit import diagnose
    from gradian.audit.config import load_config

    run = ax_runs[name]
    rec = run["recorded"]
    items = _pipeline_items(run)
    lengths = [it.full_length for it in items]
    ids = [it.input_ids.tolist() for it in items]
    file_row = [ids.index(r) for r in rec["rows"]]  # axolotl's train set, row by row, as the file's rows
    assert AX_LONG not in file_row and len(file_row) == (11 if "val_set_size" in name else N - 1)
    steps = [[file_row[k] for k in _as_rows(rec, s)] for s in rec["steps"]]  # the file's rows, step by step
    config = load_config([str(run["config"])])
    read, how = run_rows_read(config, N, lengths)
    assert read == steps, how  # the same rows, in the same order, step by step
    if "curriculum" in name:
        assert steps == [[0, 2], [3, 4]]  # in the file's order, the long row skipped
    # as gradian attribute counts them: the run folder's trajectory, the config, the rows as it tokenised them
    traj = counted_trajectory(run["run"], "auto", [run["config"]], AttributeSpec(), items)
    assert traj.visits is not None, traj.visits_rule
    never = _one_checkpoint_counts(traj, steps)
    assert traj.visits.never.tolist() == never and AX_LONG in never
    # without its token counts the train set cannot be rebuilt, and nothing is counted
    assert with_visits(resolve_trajectory(run["run"], "auto"), config, N).visits is None
    # Audit's C04, given the tokenizer, names the rows the sampler never reached (not the one dropped for length)
    found = diagnose(configs=[run["config"]], data=run["data"], tokenizer=str(run["base"]), select=["C04"])
    named = sorted({i for f in found.by_id("C04") if "never trained" in f.message for i in f.row_ids},
                   key=lambda x: int(x[1:]))  # fmt: skip
    assert named == ([f"r{j}" for j in never if j in file_row] if "max_steps" in name else [])
