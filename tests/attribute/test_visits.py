"""gradian.attribute.visits: the rows the run's steps read, held to TRL's own SFTTrainer; a row never read scores 0.

A real ``SFTTrainer`` run stops inside its first epoch (``max_steps=3`` at 2 rows a step: 6 of its 8 rows read) and
saves a checkpoint at step 2 and at step 3; a forward pre-hook records the rows of every batch it trained on. Gradian
must count the same rows per checkpoint from the run folder's ``training_args.bin``, score the two rows the run never
read exactly 0, and weigh the others by the counts (the module's formula).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from gradian.attribute.visits import RowVisits, row_visits, total_steps

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "audit"))


def test_weights_reduce_to_the_checkpoint_weights_when_every_row_is_read_once():
    v = RowVisits(np.ones((3, 5), dtype=np.int64), (4, 8, 12), "test")
    assert v.uniform and len(v.never) == 0
    assert np.allclose(v.weights([0.5, 0.3, 0.2]), np.array([[0.5], [0.3], [0.2]]) * np.ones((1, 5)), atol=0)


def test_a_row_never_read_weighs_0_and_every_other_row_once_per_checkpoint():
    """``W[c, j] = η_c`` for a row some step read, however often and in whichever interval; 0 for a row none read."""
    counts = np.array([[1, 2, 0, 1], [0, 1, 0, 2]])
    v = RowVisits(counts, (2, 4), "test")
    eta = [0.6, 0.4]
    W = v.weights(eta)
    assert W.tolist() == [[0.6, 0.6, 0.0, 0.6], [0.4, 0.4, 0.0, 0.4]]
    assert v.never.tolist() == [2] and not v.uniform
    assert RowVisits(np.array([[1, 0], [0, 2]]), (1, 2), "t").uniform  # every row read: the checkpoint weights
    assert not RowVisits(np.zeros((1, 3), dtype=np.int64), (1,), "t").weights([1.0]).any()


def test_no_config_or_an_unreproduced_order_counts_every_row_once():
    from gradian.audit.config import TrainConfig

    def config(**values):
        c = TrainConfig()
        for k, v in {"trainer": "trl", "micro_batch_size": 2, "max_steps": 3, **values}.items():
            c.set(k, v, "test")
        return c

    assert row_visits(None, 8, [3])[0] is None
    visits, why = row_visits(config(packing=True), 8, [3])
    assert visits is None and "packed" in why
    visits, why = row_visits(config(), 8, [None, 3])
    assert visits is None and why == "a checkpoint's step is unknown"
    visits, _ = row_visits(config(), 8, [2, None])  # the final adapter's unknown step: the run's last (max_steps)
    assert visits is not None and visits.steps == (2, 3) and visits.counts.sum() == 6


@pytest.fixture(scope="module")
def short_run(tmp_path_factory, tok):
    from trl_run import build_trl_run

    micro: list[list[int]] = []
    run = build_trl_run(
        tmp_path_factory.mktemp("trl-short"), tok, record=micro, per_device_train_batch_size=2, max_steps=3,
        save_strategy="steps", save_steps=2, num_train_epochs=None,
    )  # fmt: skip
    return run, micro


def test_the_counts_are_the_rows_trl_trained_on(short_run):
    from gradian.attribute.trajectory import resolve_trajectory
    from gradian.audit.config import load_config

    run, micro = short_run
    assert len(micro) == 3 and all(len(m) == 2 for m in micro)  # one micro-batch of 2 rows per step
    traj = resolve_trajectory(run["out"], "auto")
    assert [c.step for c in traj.checkpoints] == [2, 3]  # checkpoint-2, and the final adapter (= checkpoint-3)
    config = load_config([str(run["out"] / "training_args.bin")])
    visits, why = row_visits(config, 8, [c.step for c in traj.checkpoints])
    assert visits is not None, why
    want = np.zeros((2, 8), dtype=np.int64)
    for step, rows in enumerate(micro, start=1):
        want[0 if step <= 2 else 1, rows] += 1
    assert visits.counts.tolist() == want.tolist()
    assert sorted(visits.never.tolist()) == sorted(set(range(8)) - {r for m in micro for r in m})
    assert len(visits.never) == 2 and "seed 0" in visits.rule


def test_total_steps_is_the_trainer_s_own(tok, tmp_path):
    """For a run that trains by epochs (a fractional count, gradient accumulation with a short last step),
    :func:`total_steps` is the ``global_step`` the Trainer reached."""
    import json

    from trl_run import build_trl_run

    from gradian.audit.config import load_config

    run = build_trl_run(
        tmp_path, tok, per_device_train_batch_size=3, gradient_accumulation_steps=2, num_train_epochs=1.5,
        save_strategy="steps", save_steps=100,  # saved once, at the end
    )  # fmt: skip
    config = load_config([str(run["out"] / "training_args.bin")])
    (state,) = run["out"].rglob("trainer_state.json")
    # 8 rows / 3 a micro-batch = 3 micro-batches, 2 a step (the last alone): 2 steps an epoch, ceil(1.5 x 2) = 3
    assert total_steps(config, 8) == json.loads(state.read_text())["global_step"] == 3


def test_never_trained_rows_score_zero_and_the_rest_as_before(short_run, tmp_path):
    from gradian.attribute.queries import Query
    from gradian.attribute.spec import AttributeSpec
    from gradian.attributor import Attributor

    run, micro = short_run
    read = {r for m in micro for r in m}
    never = [j for j in range(8) if j not in read]
    q = Query.from_text("What is the capital of France? (0)", " Paris", said=" Rome")

    def scores(visits: str, checkpoints):
        att = Attributor(
            run["base"], run["out"], run["data"], spec=AttributeSpec(visits=visits), checkpoints=checkpoints,
            index_dir=tmp_path / "idx",
        )  # fmt: skip
        return att.scores([q])

    on, off = scores("auto", "auto"), scores("off", "auto")
    assert on.visits["never_trained"] == 2 and not on.visits["uniform"]
    assert "every row once per checkpoint: --visits off" == off.visits["rule"]
    assert not on.matrix[:, never].any() and not on.cosine[:, never].any()
    assert np.abs(off.matrix[:, never]).min() > 0  # without the counts they would be scored
    assert on.most_harmful(k=8) == [h for h in on.most_harmful(k=8) if int(h[0][1:]) in read]
    # every row the run read keeps its score, checkpoint by checkpoint (W = w_c)
    assert np.array_equal(on.matrix[:, sorted(read)], off.matrix[:, sorted(read)])


def test_attribute_says_which_rows_count_before_any_work(short_run, tmp_path):
    """``gradian attribute`` on the run folder prints the visits line with its plan; ``--visits off`` says why not."""
    from typer.testing import CliRunner

    from gradian.cli import app

    run, _ = short_run
    args = ["attribute", "--base", str(run["base"]), "--adapter", str(run["out"]), "--data", str(run["data"])]
    args += ["--eval", str(run["eval"]), "--out", str(tmp_path / "run"), "--plan-only"]
    res = CliRunner().invoke(app, args, env={"GRADIAN_CACHE": str(tmp_path / "cache"), "COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "row visits: 2 of 8 rows never trained score 0 (the HF Trainer's sampler" in res.output
    assert "seed 0 (training_args.bin" in res.output
    res = CliRunner().invoke(app, [*args, "--visits", "off"], env={"GRADIAN_CACHE": str(tmp_path / "cache")})
    assert res.exit_code == 0 and "row visits: every row counted once per checkpoint (--visits off)" in res.output


def test_a_run_on_two_devices_is_counted_as_two(tok, tmp_path):
    """The same TRL settings on two processes (torchrun, gloo), 15 rows in micro-batches of 2, 5 steps: each step
    reads a micro-batch on each process, and the second epoch's last round is filled from its first rows
    (accelerate's ``even_batches``). The run's own trainer_state.json (epoch 1.25 at step 5, where one device would be
    at 0.625) tells Gradian two devices read the rows, and it counts, per checkpoint, what each process recorded."""
    import json
    import os
    import subprocess

    from gradian.attribute.trajectory import resolve_trajectory
    from gradian.attribute.visits import with_visits
    from gradian.audit.config import load_config
    from gradian.audit.hf_order import devices_from_state
    from gradian.data.formats import load_examples
    from gradian.data.setup import setup_from_files
    from gradian.data.tokenize import tokenize_examples
    from gradian.models.tiny import tiny_model
    from gradian_testlib import padded_rows, torchrun_command

    tiny_model(tok, "llama", seed=0).save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    n = 15
    rows = [
        {"id": f"r{i}", "messages": [{"role": "user", "content": f"What is the capital of France? ({i})"},
                                     {"role": "assistant", "content": "The capital of France is Paris."}]}
        for i in range(n)
    ]  # fmt: skip
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    script = Path(__file__).with_name("trl_ddp_run.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(torchrun_command(2, str(script), str(tmp_path)), env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    out = tmp_path / "out"
    config = load_config([str(out / "training_args.bin")])
    traj = resolve_trajectory(out, "auto")
    assert [c.step for c in traj.checkpoints] == [2, 4, 5]
    state = json.loads((out / "checkpoint-5" / "trainer_state.json").read_text())
    assert state["epoch"] == pytest.approx(1.25)  # 5 steps of the 4 micro-batches each process reads an epoch

    # what each process trained on, step by step, as the file's rows
    setup = setup_from_files([out / "training_args.bin"], data)
    ids = [it.input_ids.tolist() for it in tokenize_examples(load_examples(data), tok, setup.tokenize_spec())]
    pad = tok.pad_token_id

    seen = [json.loads((tmp_path / f"seen-{rank}.json").read_text()) for rank in (0, 1)]
    assert len(seen[0]) == len(seen[1]) == 5  # a micro-batch a step on each process
    steps = [padded_rows([s for rank in (0, 1) for s in seen[rank][k]], ids, pad) for k in range(5)]

    assert devices_from_state(config, n, 5, 1.25, "x")[0] == [2]
    counted = with_visits(traj, config, n)
    assert counted.visits is not None, counted.visits_rule
    assert "2 devices (checkpoint-5/trainer_state.json: epoch 1.25 at step 5)" in counted.visits.rule
    want = np.zeros((3, n), dtype=np.int64)
    for k, step_rows in enumerate(steps, start=1):
        np.add.at(want[0 if k <= 2 else 1 if k <= 4 else 2], step_rows, 1)
    assert counted.visits.counts.tolist() == want.tolist()
    assert sum(len(s) for s in steps) == 20 and len({r for s in steps[:4] for r in s}) == n  # epoch 1: every row,
    # the first round's rows twice (15 rows filled up to 16)

    # Audit's C04: from the config alone it assumes one device; given the run's log it reads two
    from gradian.audit import diagnose

    def never_hit(**logs):
        found = diagnose(configs=[out / "training_args.bin"], data=data, select=["C04"], **logs)
        return [f for f in found.by_id("C04") if "never trained" in f.message]

    (one,) = never_hit()  # 5 steps x 2 rows of 15 on one device: 10 rows read, 5 never
    assert len(one.row_ids) == 5 and "1 device assumed" in one.message
    assert never_hit(logs=out / "checkpoint-5" / "trainer_state.json") == []  # two devices read every row


def test_the_verdict_lists_no_row_the_run_never_read(short_run, tmp_path):
    """The verdict over the TRL run's own scores with the rows it read marked: no untrained row is ranked, clustered
    or counted in the engines' agreement, and its verdict score is 0."""
    from gradian.attribute.evidence import CapabilityEvidence, EngineScores
    from gradian.attribute.pipeline import verdict
    from gradian.attribute.queries import Query
    from gradian.attribute.ranking import spearman
    from gradian.attribute.spec import AttributeSpec
    from gradian.attributor import Attributor

    run, micro = short_run
    read = sorted({r for m in micro for r in m})
    trained = np.zeros(8, dtype=bool)
    trained[read] = True
    spec = AttributeSpec(unit="row", references=(), fuse=(), top_k=8)
    att = Attributor(run["base"], run["out"], run["data"], spec=spec, index_dir=tmp_path / "idx")
    qs = [Query.from_text(f"What is the capital of France? ({i})", " Paris", said=" Rome") for i in (0, 5)]
    dinf, gdot = att.scores(qs, "datainf"), att.scores(qs, "graddot")
    engines = {"datainf": EngineScores("datainf", dinf.matrix, dinf.cosine),
               "graddot": EngineScores("graddot", gdot.matrix, gdot.cosine)}  # fmt: skip
    ev = CapabilityEvidence(engines, trained=trained)
    res = verdict(ev, att.finetune.tokenizer, att.examples, att._tokenized(), qs, spec, att.index())
    ids = [f"r{j}" for j in range(8)]
    listed = [r["id"] for r in res.ranked] + [i for c in res.clusters for i in c["row_ids"]]
    assert res.ranked and not set(listed) & {ids[j] for j in range(8) if not trained[j]}
    # the same run with every row counted once (--visits off), no mask: the untrained rows are listed
    off = Attributor(run["base"], run["out"], run["data"], spec=AttributeSpec(unit="row", references=(), fuse=(),
                     top_k=8, visits="off"), index_dir=tmp_path / "idx")  # fmt: skip
    d_off, g_off = off.scores(qs, "datainf"), off.scores(qs, "graddot")
    blind_ev = CapabilityEvidence({"datainf": EngineScores("datainf", d_off.matrix, d_off.cosine),
                                   "graddot": EngineScores("graddot", g_off.matrix, g_off.cosine)})  # fmt: skip
    blind = verdict(blind_ev, off.finetune.tokenizer, off.examples, off._tokenized(), qs, spec, off.index())
    assert {r["id"] for r in blind.ranked} & {ids[j] for j in range(8) if not trained[j]}
    assert [res.verdict_scores[j] for j in range(8) if not trained[j]] == [0.0, 0.0]
    rows = lambda m: m.cosine.mean(0)  # noqa: E731
    assert res.agreement["spearman"] == pytest.approx(spearman(rows(dinf)[trained], rows(gdot)[trained]))


@pytest.mark.parametrize("shuffle_dataset", [False, True])
def test_rows_trl_drops_before_sampling_are_taken_out_of_its_order(tok, tmp_path, shuffle_dataset):
    """TRL 1.16's SFTTrainer drops the rows truncation leaves with no supervised token before it samples (its
    ``Dropping fully masked examples``, since TRL 1.9), and ``shuffle_dataset`` then shuffles what is left once:
    Gradian, whose tokens are TRL's, rebuilds that train set and counts the rows each step of TRL's own training read
    (a forward pre-hook records them), from the run folder's ``training_args.bin`` and the TRL version its model card
    records. Without the version it cannot tell whether the rows were dropped, and says so."""
    import json

    import trl
    from datasets import Dataset
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    from gradian.attribute.trajectory import Trajectory, resolve_trajectory
    from gradian.attribute.visits import run_rows_read, with_visits
    from gradian.audit.config import load_config
    from gradian.data.formats import load_examples
    from gradian.data.tokenize import TokenizeSpec, tokenize_examples
    from gradian.index.identity import Checkpoint
    from gradian.models.tiny import tiny_model
    from gradian_testlib import padded_rows

    rows = [{"id": f"r{i}", "prompt": f"Question {i}?", "completion": f" Answer {i}."} for i in range(10)]
    for j in (2, 5):  # prompts that fill max_length alone: no supervised token left
        rows[j]["prompt"] = f"A question {j} so long that the whole of max_length is taken by its prompt alone? " * 3
    settings = {"per_device_train_batch_size": 2, "max_steps": 3, "max_length": 24, "seed": 1,
                "shuffle_dataset": shuffle_dataset}  # fmt: skip
    out = tmp_path / "out"
    args = SFTConfig(output_dir=str(out), report_to=[], use_cpu=True, save_strategy="steps", save_steps=3,
                     dataset_num_proc=None, learning_rate=1e-3, **settings)  # fmt: skip
    model = tiny_model(tok, "llama")
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok,
                         peft_config=LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))  # fmt: skip
    assert len(trainer.train_dataset) == 8  # TRL dropped rows 2 and 5
    seen: list[list[int]] = []
    model.register_forward_pre_hook(lambda _m, _a, kw: seen.extend(kw["input_ids"].tolist()), with_kwargs=True)
    trainer.train()
    trainer.save_model()
    trainer.save_state()

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    items = tokenize_examples(load_examples(data), tok, TokenizeSpec(max_length=24))
    unsupervised = [it.n_supervised == 0 for it in items]
    assert [j for j, u in enumerate(unsupervised) if u] == [2, 5]
    ids = [it.input_ids.tolist() for it in items]
    pad = tok.pad_token_id
    found = padded_rows(seen, ids, pad)
    steps = [found[k : k + 2] for k in range(0, len(found), 2)]  # one micro-batch of 2 rows a step

    config = load_config([str(out / "training_args.bin")])
    assert config.shuffle_dataset is shuffle_dataset
    assert config.versions["trl"] == trl.__version__  # from the model card TRL wrote with its checkpoint
    read, how = run_rows_read(config, 10, unsupervised=unsupervised)
    assert read == steps, how
    assert "2 row(s) with no supervised token dropped" in how and ("shuffled once" in how) is shuffle_dataset
    traj = with_visits(resolve_trajectory(out, "auto"), config, 10, unsupervised=unsupervised)
    assert traj.visits is not None, traj.visits_rule
    assert {2, 5} <= set(traj.visits.never.tolist())
    assert traj.visits.counts.sum() == 6

    # Audit's C04, given the run's tokenizer, names the rows the sampler never reached, not the two TRL dropped
    from gradian.audit import diagnose

    found = diagnose(configs=[out / "training_args.bin"], data=data, tokenizer=str(out), select=["C04"])
    (hit,) = [f for f in found.by_id("C04") if "never trained" in f.message]
    assert hit.row_ids == [f"r{j}" for j in range(10) if j not in (2, 5) and not traj.visits.counts[:, j].any()]
    assert len(hit.row_ids) == 2

    config.versions.pop("trl")  # the version unknown: dropped (1.9 and later) or kept (before)?
    one = Trajectory((Checkpoint(tmp_path, 3, True, 1.0, "x"),), "single")
    got = with_visits(one, config, 10, unsupervised=unsupervised)
    assert got.visits is None and "TRL 1.9 and later drop the 2 row(s)" in got.visits_rule
    config.versions["trl"] = "1.8.0"  # before 1.9 TRL kept them: the sampler's order over all 10 rows
    assert run_rows_read(config, 10, unsupervised=unsupervised)[0] != steps


def test_device_counts_the_log_cannot_tell_apart_are_counted_when_they_read_the_same_rows(tmp_path):
    """8 rows in micro-batches of 4, two a step: every device count from 1 to 64 reads one step an epoch, so a log
    at epoch 3.0 after 3 steps fits them all; each reads every row, so the visits are counted (every row read). 16 rows
    in 4 micro-batches, one a step, stopped after 1 step at epoch 0.5: 2 devices (2 micro-batches each) and 3 (2 each,
    the last round filled up) fit, and read 8 and 12 rows: not counted."""
    import json

    from gradian.attribute.trajectory import Trajectory
    from gradian.attribute.visits import with_visits
    from gradian.audit.config import load_config
    from gradian.index.identity import Checkpoint

    def run(n: int, steps: int, epoch: float, max_steps: int | None, acc: int = 2):
        ck = tmp_path / f"n{n}" / f"checkpoint-{steps}"
        ck.mkdir(parents=True)
        (ck / "trainer_state.json").write_text(json.dumps({"global_step": steps, "epoch": epoch, "log_history": []}))
        cfg = tmp_path / f"n{n}.yaml"
        extra = f"max_steps: {max_steps}\n" if max_steps else "num_train_epochs: 3\n"
        cfg.write_text(f"per_device_train_batch_size: 4\ngradient_accumulation_steps: {acc}\nseed: 1\n" + extra)
        traj = Trajectory((Checkpoint(ck, steps, True, 1.0, "x"),), "single")
        return with_visits(traj, load_config([str(cfg)]), n)

    whole = run(8, 3, 3.0, None)
    assert whole.visits is not None and whole.visits.uniform, whole.visits_rule
    assert "the log fits each, and each reads the same rows" in whole.visits.rule
    part = run(16, 1, 0.5, 1, acc=1)
    assert part.visits is None and "devices all fit" in part.visits_rule
